"""The tuner's measurements (`flash_tune`), the roofline, and the Gluon kernels (`onepass_ws`; the tuner's
kinds "ws", "fwd_ws"). A tuning run times every candidate of every kernel once, bare launches at one shape,
then re-times the fastest four of each kernel in three interleaved rounds (`phase == "confirm"`)."""

from __future__ import annotations

import pandas as pd
import torch

from cs336_systems.attention.fast import table
from cs336_systems.attention.fast.tuned_configs import TUNED
from cs336_systems.attention.flops import attention_flops
from cs336_systems.attention.tiles import heuristic_bwd, heuristic_fwd
from report.flash import LB, LB_KEY, round_stats
from report.registry import register
from report.reproducing import copy_ceiling_tbps, matmul_ceiling_tflops
from report.results import load_results, markdown_table, with_source
from report.units import span

TUNE_BENCH = "attention/flash_tune"
WS_BENCH = "attention/onepass_ws"
GLUON_KINDS = {"ws": "backward", "fwd_ws": "forward"}
PEAK_TFLOPS, PEAK_TBPS = 989.0, 4.8  # H200 SXM datasheet (dense bf16, HBM3e), quoted beside the measured ceilings
ONEPASS_ATOMICS, ONEPASS_TMA = "one pass, dQ by thread atomics", "one pass, dQ by TMA reductions"
DESIGNS = {"dkdv": "dK/dV pass", "dq": "dQ pass", "fused": "two passes, one launch",  # the backward history's columns
           "onepass_atomics": ONEPASS_ATOMICS, "onepass_tma": ONEPASS_TMA}
TILE_WORDS = {  # kernel -> its tiling in words, from its config's fields
    "fwd": "{block_m}x{block_n}, {num_warps} warps, {num_stages} stages",
    "dkdv": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "dq": "{block_m2} queries x {block_n2} keys, {num_warps2} w, {num_stages2} st",
    "ws": "{ws_stages} stages, {ws_slots} dS slots, {ws_dq_regs} dQ regs",
    "fwd_ws": "{ws_warpgroups} x 64 queries, {ws_block_n} keys per tile, {ws_stages} stages",
    "fused": "dK/dV {block_n1}x{block_m1}, dQ {block_m2}x{block_n2}, {num_warps1} w, {num_stages1} st",
}
KERNEL_NAMES = {"fwd": "forward", "dkdv": "dK/dV pass", "dq": "dQ pass", "fused": "backward, one launch"}


def tile(kernel: str, c: dict) -> str:
    """A candidate's tiling in words, and which passes load through TMA descriptors."""
    passes = {"fwd": {"tma": ""}, "dkdv": {"tma1": ""}, "dq": {"tma2": ""}, "fused": {"tma1": " dK/dV", "tma2": " dQ"}}
    on = [words for p, words in passes.get(kernel, {}).items() if c.get(p)]
    return TILE_WORDS[kernel].format(**c) + (", TMA" + " +".join(on) if on else "")


def design(kernel: str, config: dict) -> str:
    """The kernel, with the one-pass backward split by how it adds dQ (tma1: TMA bulk reductions)."""
    if kernel != "onepass":
        return kernel
    return "onepass_tma" if config.get("tma1") else "onepass_atomics"


def at_leaderboard_shape(tune: pd.DataFrame) -> pd.DataFrame:
    """Rows of the leaderboard's key at its shape (a sweep tuning run once timed that key at 1 x 65,536)."""
    return tune[(tune.key == LB_KEY) & (tune.Z == LB["batch"]) & (tune.seq == LB["seq"])]


def tuning_rows(confirm: bool = False) -> pd.DataFrame:
    """The Triton kernels' rows with their design: first timings (each candidate once), or the confirmation rounds."""
    tune = at_leaderboard_shape(load_results(TUNE_BENCH, status="ok"))
    tune = tune[~tune.kernel.isin(GLUON_KINDS) & ((tune.phase == "confirm") == confirm)]
    return tune.assign(design=[design(k, c) for k, c in zip(tune.kernel, tune.config)])


def leaderboard_tuning() -> pd.DataFrame:
    """Each kernel's first timings from its latest tuning run at the leaderboard shape (as the tuner reads them)."""
    lb = tuning_rows()
    return lb[lb.run == lb.groupby("kernel").run.transform("max")]


def tuning_effect_rows() -> list[dict]:
    """Per kernel, the heuristic's tiling against the best and worst measured; the one launch against the best two."""
    lb = leaderboard_tuning()
    rows = []
    for kernel, name in KERNEL_NAMES.items():
        sub = lb[lb.kernel == kernel]
        if kernel == "fused":
            start, start_ms = "best dK/dV + best dQ, two launches", rows[1]["best ms"] + rows[2]["best ms"]
        else:
            start = tile(kernel, (heuristic_fwd if kernel == "fwd" else heuristic_bwd)(torch.bfloat16, 64).__dict__)
            start_ms = float(sub[sub.config.map(lambda c: tile(kernel, c)) == start].ms.iloc[0])
        best = sub.loc[sub.ms.idxmin()]
        rows.append({"kernel": name, "candidates": len(sub), "heuristic": start, "heuristic ms": start_ms,
                     "best": tile(kernel, best.config), "best ms": float(best.ms), "worst ms": float(sub.ms.max())})
    return rows


def tuning_effect_table() -> str:
    return with_source(pd.DataFrame(tuning_effect_rows()), TUNE_BENCH, leaderboard_tuning(),
                       formats=dict.fromkeys(["heuristic ms", "best ms", "worst ms"], ".3f"))


def backward_history() -> pd.DataFrame:
    """One row per tuning run (a version of the code): each backward design's fastest candidate (NaN: not built)."""
    lb = tuning_rows()
    best = lb.groupby(["run", "design"]).ms.min().unstack().reindex(columns=list(DESIGNS)).rename(columns=DESIGNS)
    best = best.assign(git=lb.groupby("run").git.first()).rename_axis(index="tuning run").reset_index()
    return best[["tuning run", "git", *DESIGNS.values()]]


def backward_history_table() -> str:
    df = backward_history()
    return with_source(df.astype(object).where(df.notna(), "not built"), TUNE_BENCH,
                       formats=dict.fromkeys(DESIGNS.values(), ".3f"))


def pass_ratios(new: str, old: str) -> pd.Series:
    """The dK/dV and dQ passes' best times in the tuning run at git `new` over those at `old` (prefixes do)."""
    h = backward_history().set_index("git")[["dK/dV pass", "dQ pass"]]
    return h[h.index.str.startswith(new)].iloc[-1] / h[h.index.str.startswith(old)].iloc[-1]


def tma_onepass_run() -> pd.Series:
    return backward_history().dropna(subset=[ONEPASS_TMA]).iloc[-1]


def confirm_medians() -> dict:
    """The latest confirmation rounds: per design, the best candidate's median; "two launches" is the best
    dK/dV plus the best dQ pass, "two-pass" the faster of that and the one launch."""
    conf = tuning_rows(confirm=True)
    conf = conf[conf.run == conf.run.max()].assign(cfg=lambda d: d.config.map(lambda c: tuple(sorted(c.items()))))
    out = {k: float(v) for k, v in conf.groupby(["design", "cfg"]).ms.median().groupby("design").min().items()}
    out["two launches"] = out["dkdv"] + out["dq"]
    return {**out, "two-pass": min(out["two launches"], out["fused"])}


def describe_fwd(f: dict | None) -> str:
    """A forward table entry in words (the Gluon forward where the entry says so)."""
    if f and f.get("gluon_ws"):
        return f"Gluon, warp-specialised ({tile('fwd_ws', f)}) where it applies; else " + tile("fwd", f)
    return tile("fwd", f) if f else "—"


def describe_bwd(b: dict | None) -> str:
    """A backward table entry in words: one launch, one pass (and how it adds dQ), or two launches."""
    if not b:
        return "—"
    if b.get("gluon_ws"):  # the rest of the entry is what unsupported inputs run
        return (f"Gluon one-pass (warp-specialised, dQ by TMA bulk reductions; {tile('ws', b)}) where it "
                "applies; else " + describe_bwd({k: v for k, v in b.items() if k != "gluon_ws"}))
    if b.get("fused"):
        return "one launch: " + tile("fused", b)
    if b.get("one_pass"):
        how = "TMA loads, dQ by TMA bulk reductions" if b.get("tma1") else "dQ by thread atomics"
        return f"one pass, {how}: " + TILE_WORDS["dkdv"].format(**b)
    return f"dK/dV {tile('dkdv', b)}; dQ {tile('dq', b)}"


def chosen_configs_table() -> str:
    rows = [{"key (dtype-d-mask-size)": key, "forward": describe_fwd(TUNED["fwd"].get(key)),
             "backward": describe_bwd(TUNED["bwd"].get(key))} for key in sorted(set(TUNED["fwd"]) | set(TUNED["bwd"]))]
    return markdown_table(pd.DataFrame(rows))


def roofline() -> dict[str, float]:
    """The leaderboard case against the measured ceilings, and the tuned Triton kernels' rates."""
    B, N, d = LB["batch"], LB["seq"], LB["d"]
    flop_s, byte_s = matmul_ceiling_tflops("bf16") * 1e12, copy_ceiling_tbps() * 1e12
    fwd, total, bwd = (attention_flops(B, N, N, d, True, m) for m in ("fwd", "fwd_bwd", "bwd"))
    nbytes = 4 * B * N * d * 2 + B * N * 4  # q, k, v read, o written (bf16); L written (fp32)
    best = leaderboard_tuning().groupby("kernel").ms.min()
    fwd_ms, bwd_ms = float(best["fwd"]), float(min(best["fused"], best["dkdv"] + best["dq"]))
    return {"fwd_tflop": fwd / 1e12, "total_tflop": total / 1e12, "fwd_mb": nbytes / 1e6, "intensity": fwd / nbytes,
            "ridge": flop_s / byte_s, "fwd_floor_ms": fwd / flop_s * 1e3, "total_floor_ms": total / flop_s * 1e3,
            "bytes_floor_us": nbytes / byte_s * 1e6, "kernel_fwd_ms": fwd_ms, "kernel_bwd_ms": bwd_ms,
            "kernel_fwd_tflops": fwd / fwd_ms / 1e9, "kernel_bwd_tflops": bwd / bwd_ms / 1e9,
            # what the tensor cores execute: 7 matmuls per score tile in the two-pass design, not the 5 counted
            "kernel_bwd_executed_tflops": bwd * 7 / 5 / bwd_ms / 1e9}


# -- the Gluon kernels ------------------------------------------------------------------------------

WS_DESIGNS = {  # impl field of the rows -> what that kernel was
    "gluon one-pass ws": "math warpgroups stage fp32 dQ shares; a reducer sums and adds them",
    "gluon one-pass ws, dQ warpgroup": "math warpgroups hand over dS^T; a dQ warpgroup does dS K and the adds",
    "gluon one-pass ws, dQ warpgroup, TMA adds": "as above, the adds by TMA bulk reductions from shared memory",
}


def ws_rows() -> pd.DataFrame:
    keys = ["run", "git", "impl", "version", "block_n", "stages", "slots", "reduce_warps", "reduce_regs"]
    return round_stats(load_results(WS_BENCH, status="ok"), keys)


def ws_table() -> str:
    g = ws_rows()
    two_pass = g[g.impl.str.startswith("triton")].set_index("run").median_ms
    g = g[~g.impl.str.startswith("triton")].sort_values(["run", "median_ms"])
    shown = pd.DataFrame({
        "run": g.run, "git": g.git, "design": g.impl.map(WS_DESIGNS), "version": g.version,
        "variant": [f"{r.block_n} keys, {r.stages} stages, {r.slots} slots, {r.reduce_warps} w x {r.reduce_regs} regs"
                    for r in g.itertuples()],
        "median ms": g.median_ms, "two-pass ms": g.run.map(two_pass), "vs two-pass": g.median_ms / g.run.map(two_pass),
        "rounds": g.rounds})
    return with_source(shown, WS_BENCH, formats=dict.fromkeys(["median ms", "two-pass ms", "vs two-pass"], ".3f"))


def ws_ablations() -> dict:
    """The newest run with the math-only ablation and the two-pass backward: its fastest full kernel's ablations."""
    g = ws_rows()
    triton = g.impl.str.startswith("triton")
    run = g[(g.version == "math_only") & g.run.isin(g[triton].run)].run.max()
    g, triton = g[g.run == run], triton[g.run == run]
    full = g[g.version == "full"].sort_values("median_ms").iloc[0]
    variant = ["impl", "block_n", "stages", "slots", "reduce_regs"]
    same = g[(g[variant] == full[variant]).all(axis=1)].set_index("version").median_ms
    return {**{v: float(ms) for v, ms in same.items()}, "full": float(full.median_ms),
            "two_pass": float(g[triton].median_ms.iloc[0])}


def ws_tuning_table(kernel: str) -> str:
    """The newest tuning run of a Gluon kernel ("ws", "fwd_ws") at the leaderboard shape: each candidate's
    first timing and, for the fastest few, the median of its confirmation rounds, the tuner's choice first."""
    ws = at_leaderboard_shape(load_results(TUNE_BENCH, status="ok")).query("kernel == @kernel")
    ws = ws[ws.run == ws.run.max()].assign(setting=lambda d: d.config.map(lambda c: tile(kernel, c)))
    conf = ws.phase == "confirm"
    shown = ws[~conf].groupby("setting", as_index=False).agg(run=("run", "first"), git=("git", "first"),
                                                               **{"first ms": ("ms", "first")})
    confirmed = ws[conf].groupby("setting").ms.median().rename("median of 3 rounds, ms")
    shown = shown.join(confirmed, on="setting").sort_values([confirmed.name, "first ms"])
    return with_source(shown, TUNE_BENCH, ws.drop(columns="setting"),
                       formats=dict.fromkeys(["first ms", confirmed.name], ".3f"))


# -- facts ----------------------------------------------------------------------------------------

_atomics_runs = lambda: backward_history().dropna(subset=[ONEPASS_ATOMICS])  # the runs that built that design
_ws = ws_ablations  # a short name for the facts and claims below

FACTS = {
    "peak_tflops": lambda: f"{PEAK_TFLOPS:.0f}",
    "peak_tbps": lambda: f"{PEAK_TBPS:.1f}",
    **{f"roof_{k}": lambda k=k, f=f: format(roofline()[k], f) for k, f in (
        ("fwd_tflop", ".2f"), ("total_tflop", ".2f"), ("fwd_mb", ".0f"), ("intensity", ",.0f"), ("ridge", ".0f"),
        ("fwd_floor_ms", ".2f"), ("total_floor_ms", ".2f"), ("bytes_floor_us", ".0f"), ("kernel_fwd_ms", ".3f"),
        ("kernel_bwd_ms", ".3f"), ("kernel_fwd_tflops", ".0f"), ("kernel_bwd_tflops", ".0f"),
        ("kernel_bwd_executed_tflops", ".0f"))},
    "roof_executed_share": lambda: f'{roofline()["kernel_bwd_executed_tflops"] / matmul_ceiling_tflops("bf16"):.0%}',
    "onepass_atomics_extra_span": lambda: span(_atomics_runs()[ONEPASS_ATOMICS] - _atomics_runs()["dK/dV pass"], ".2f"),
    "onepass_fifth_matmul_span": lambda: span(_atomics_runs()["dK/dV pass"] / 4, ".2f"),
    "onepass_tma_extra_ms": lambda: f'{tma_onepass_run()[ONEPASS_TMA] - tma_onepass_run()["dK/dV pass"]:.2f}',
    "onepass_tma_dq_pass_ms": lambda: f'{tma_onepass_run()["dQ pass"]:.2f}',
    "ws_math_under_two_pass": lambda: f'{1 - _ws()["math_only"] / _ws()["two_pass"]:.0%}',
    "ws_adds_ms": lambda: f'{_ws()["full"] - _ws()["no_add"]:.3f}',
    "ws_vs_two_pass": lambda: f'{_ws()["full"] / _ws()["two_pass"]:.3f}',
    "ws_mask_every_tile_cost": lambda: f'{_ws()["mask_every_tile"] / _ws()["full"] - 1:.1%}',
}


def _bad_tiling_costs_more() -> bool:
    """Tuning gained on every kernel, and less than the worst candidate of any kernel lost against its best."""
    gains = [r["heuristic ms"] / r["best ms"] for r in tuning_effect_rows()]
    return min(gains) >= 1 and min(r["worst ms"] / r["best ms"] for r in tuning_effect_rows()[:-1]) > max(gains)


def _confirmation_reverses_first() -> bool:
    """The first timings and the confirmation medians order the one launch and the best two launches oppositely."""
    fused, c = tuning_effect_rows()[-1], confirm_medians()
    return (fused["best ms"] < fused["heuristic ms"]) != (c["fused"] < c["two launches"])


def _bulk_reductions_not_enough() -> bool:
    """The TMA one-pass kernel beats atomics, and its dQ work costs more than the dQ pass it removes (so it loses
    to the two passes), in its newest run and by the confirmation medians."""
    r, c = tma_onepass_run(), confirm_medians()
    return (r["dK/dV pass"] + r["dQ pass"] < r[ONEPASS_TMA] < r[ONEPASS_ATOMICS]
            and c["two launches"] < c["onepass_tma"] < c["onepass_atomics"])


def _size_classes_as_described() -> bool:
    """medium up to 32,768 rows, large up to 2^19, huge beyond; small borrows medium (none tuned); untuned warns."""
    classes = [table.size_class(1, n, n) for n in (4096, 4097, 32768, 32769, 2**19, 2**19 + 1)]
    return (classes == ["small", "medium", "medium", "large", "large", "huge"]
            and table.SIZE_FALLBACK["small"][:2] == ("small", "medium")
            and issubclass(table.UntunedShapeWarning, Warning)
            and not any(key.endswith("-small") for kind in TUNED.values() for key in kind))


register("flash", facts=FACTS, tables={
    "tuning_effect": tuning_effect_table, "chosen_configs": chosen_configs_table,
    "backward_history": backward_history_table,
    "ws": ws_table, "ws_tuning": lambda: ws_tuning_table("ws"), "fwd_ws_tuning": lambda: ws_tuning_table("fwd_ws"),
}, claims={
    "attention_is_compute_bound": lambda: roofline()["intensity"] > 10 * roofline()["ridge"],
    "bad_tiling_costs_more_than_tuning_gains": _bad_tiling_costs_more,
    "confirmation_reverses_the_first_timings": _confirmation_reverses_first,
    "atomics_lost_every_run": lambda: len(_atomics_runs()) > 0
    and (_atomics_runs()[ONEPASS_ATOMICS] > _atomics_runs()["two passes, one launch"]).all(),
    "bulk_reductions_not_enough": _bulk_reductions_not_enough,
    "one_pass_keys_are_fp32": lambda: {k.split("-")[0] for k, e in TUNED["bwd"].items() if e.get("one_pass")}
    == {"fp32"},
    # within 2% per pass: the runs' noise
    "dp_first_changed_nothing": lambda: (abs(pass_ratios("df107f5", "20201d0") - 1) <= 0.02).all(),
    "size_classes_as_described": _size_classes_as_described,
    "gluon_backward_beats_two_pass": lambda: _ws()["math_only"] < _ws()["no_add"] < _ws()["full"] < _ws()["two_pass"],
    "diagonal_split_pays": lambda: _ws()["mask_every_tile"] > _ws()["full"],
})
