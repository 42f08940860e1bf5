"""The tuner's measurements (`configs tune`, results/attention/flash_tune): tables, the roofline,
and the Gluon kernels (the warp-specialised one-pass backward's A/B runs, results/attention/onepass_ws,
and the tuner's runs of both Gluon kernels, kinds "ws" and "fwd_ws").

Each tuning run times every candidate tiling of every kernel once, bare launches at one shape, then
re-times the fastest four of each kernel in three interleaved rounds (`phase == "confirm"`).
"""

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
from report.results import load_results, markdown_table, where, with_source
from report.units import span

TUNE_BENCH = "attention/flash_tune"
WS_BENCH = "attention/onepass_ws"
GLUON_KINDS = {"ws": "backward", "fwd_ws": "forward"}
# NVIDIA H200 datasheet (SXM): dense bf16 tensor-core peak and HBM3e bandwidth, quoted beside the
# ceilings this repository measured (`just bench ceilings`), which the roofline below uses.
PEAK_TFLOPS, PEAK_TBPS = 989.0, 4.8
ONEPASS_ATOMICS, ONEPASS_TMA = "one pass, dQ by thread atomics", "one pass, dQ by TMA reductions"
DESIGNS = {"dkdv": "dK/dV pass", "dq": "dQ pass", "fused": "two passes, one launch",  # the backward history's columns
           "onepass_atomics": ONEPASS_ATOMICS, "onepass_tma": ONEPASS_TMA}
TILE_WORDS = {  # kernel -> its tiling in words, from its config's fields ("fused" is the fallback)
    "fwd": "{block_m}x{block_n}, {num_warps} warps, {num_stages} stages",
    "dkdv": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "dq": "{block_m2} queries x {block_n2} keys, {num_warps2} w, {num_stages2} st",
    "onepass": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "ws": "{ws_stages} stages, {ws_slots} dS slots, {ws_dq_regs} dQ regs",
    "fwd_ws": "{ws_warpgroups} x 64 queries, {ws_block_n} keys per tile, {ws_stages} stages",
    "fused": "dK/dV {block_n1}x{block_m1}, dQ {block_m2}x{block_n2}, {num_warps1} w, {num_stages1} st",
}
HEURISTIC_FIELDS = {  # kernel -> its name in the tuning-effect table, and the fields its heuristic sets
    "fwd": ("forward", ("block_m", "block_n", "num_warps", "num_stages", "tma")),
    "dkdv": ("dK/dV pass", ("block_m1", "block_n1", "num_warps1", "num_stages1", "tma1")),
    "dq": ("dQ pass", ("block_m2", "block_n2", "num_warps2", "num_stages2", "tma2")),
}


def tile(kernel: str, c: dict) -> str:
    """A candidate's tiling in words, and which passes load through TMA descriptors."""
    passes = {"fwd": ["tma"], "dkdv": ["tma1"], "dq": ["tma2"], "fused": ["tma1", "tma2"],
              "onepass": ["tma1"]}.get(kernel, [])
    on = [p for p in passes if c.get(p)]
    tma = "" if not on else ", TMA" if kernel != "fused" else ", TMA " + " + ".join(
        {"tma1": "dK/dV", "tma2": "dQ"}[p] for p in on)
    return TILE_WORDS.get(kernel, TILE_WORDS["fused"]).format(**c) + tma


def design(kernel: str, config: dict) -> str:
    """The kernel, with the one-pass backward split by how it adds dQ (tma1: TMA bulk reductions)."""
    if kernel != "onepass":
        return kernel
    return "onepass_tma" if config.get("tma1") else "onepass_atomics"


def triton_tuning() -> pd.DataFrame:
    tune = load_results(TUNE_BENCH, status="ok")
    return tune[~tune.kernel.isin(GLUON_KINDS)]


def first_timings(tune: pd.DataFrame) -> pd.DataFrame:
    """Each candidate's first timing (confirmation rounds left out, so each counts once)."""
    return tune[tune.phase != "confirm"]


def at_leaderboard_shape(tune: pd.DataFrame) -> pd.DataFrame:
    """Rows of the leaderboard's key timed at its shape (a sweep tuning run once timed that key at
    batch 1 x 65,536: those rows are not this shape's)."""
    return tune[(tune.key == LB_KEY) & (tune.Z == LB["batch"]) & (tune.seq == LB["seq"])]


def with_design(tune: pd.DataFrame) -> pd.DataFrame:
    return tune.assign(design=[design(k, c) for k, c in zip(tune.kernel, tune.config)])


def leaderboard_tuning() -> pd.DataFrame:
    """Each kernel's first timings from its latest tuning run at the leaderboard shape (as the tuner reads them)."""
    lb = at_leaderboard_shape(first_timings(triton_tuning()))
    return lb[lb.run == lb.groupby("kernel").run.transform("max")]


def _effect_row(name: str, kernel: str, sub: pd.DataFrame, heuristic: str, heuristic_ms: float) -> dict:
    best = sub.loc[sub.ms.idxmin()]
    return {"kernel": name, "candidates": len(sub), "heuristic": heuristic, "heuristic ms": heuristic_ms,
            "best": tile(kernel, best.config), "best ms": float(best.ms), "worst ms": float(sub.ms.max())}


def tuning_effect_rows() -> list[dict]:
    """Leaderboard shape: the heuristic configuration against the best measured, per kernel; and
    the fused launch against the best two launches."""
    lb = leaderboard_tuning()
    h_fwd, h_bwd = heuristic_fwd(torch.bfloat16, 64).__dict__, heuristic_bwd(torch.bfloat16, 64).__dict__
    rows = []
    for kernel, (name, fields) in HEURISTIC_FIELDS.items():
        sub, ref = lb[lb.kernel == kernel], h_fwd if kernel == "fwd" else h_bwd
        start = sub[sub.config.map(lambda c: all(c.get(f, False) == ref[f] for f in fields))].iloc[0]
        rows.append(_effect_row(name, kernel, sub, tile(kernel, start.config), float(start.ms)))
    two_launches = rows[1]["best ms"] + rows[2]["best ms"]
    rows.append(_effect_row("backward, one launch", "fused", lb[lb.kernel == "fused"],
                            "best dK/dV + best dQ, two launches", two_launches))
    return rows


def tuning_effect_table() -> str:
    return with_source(pd.DataFrame(tuning_effect_rows()), TUNE_BENCH, leaderboard_tuning(),
                       formats=dict.fromkeys(["heuristic ms", "best ms", "worst ms"], ".3f"))


def backward_history() -> pd.DataFrame:
    """Leaderboard shape, one row per tuning run (a version of the code): the fastest candidate of
    each backward design it timed, bare kernels, median ms (NaN: not built then)."""
    lb = with_design(at_leaderboard_shape(first_timings(triton_tuning())))
    best = lb.groupby(["run", "design"]).ms.min().unstack().reindex(columns=list(DESIGNS)).rename(columns=DESIGNS)
    best = best.assign(git=lb.groupby("run").git.first()).rename_axis(index="tuning run").reset_index()
    return best[["tuning run", "git", *DESIGNS.values()]]


def backward_history_table() -> str:
    df = backward_history()
    return with_source(df.astype(object).where(df.notna(), "not built"), TUNE_BENCH,
                       formats=dict.fromkeys(DESIGNS.values(), ".3f"))


def history_row(git: str) -> pd.Series:
    """The backward history's row of the tuning run at this commit (a prefix of it will do)."""
    h = backward_history()
    hit = h[h.git.str.startswith(git)]
    if hit.empty:
        raise KeyError(f"no tuning run at the leaderboard shape at git {git}")
    return hit.iloc[-1]


def runs_with(design_name: str) -> pd.DataFrame:
    """The backward history's runs that built this design (a column of it)."""
    h = backward_history()
    return h[h[design_name].notna()]


def newest_with(design_name: str) -> pd.Series:
    return runs_with(design_name).iloc[-1]


def two_pass_best(r: pd.Series) -> float:
    """A history row's best two-pass backward: one launch or two."""
    return min(r["two passes, one launch"], r["dK/dV pass"] + r["dQ pass"])


def confirm_medians() -> dict:
    """Leaderboard shape, the latest tuning run with confirmation rounds: per design, the best
    candidate's median over the rounds; "two launches" is the best dK/dV plus the best dQ pass."""
    tune = triton_tuning()
    conf = at_leaderboard_shape(tune[tune.phase == "confirm"])
    conf = with_design(conf[conf.run == conf.run.max()]).assign(cfg=lambda d: d.config.map(lambda c: tuple(sorted(c.items()))))
    out = {k: float(v) for k, v in conf.groupby(["design", "cfg"]).ms.median().groupby("design").min().items()}
    out["two launches"] = out["dkdv"] + out["dq"]
    out["run"], out["git"] = conf.run.iloc[0], conf.git.iloc[0]
    return out


def describe_fwd(f: dict | None) -> str:
    """A forward table entry in words (the Gluon forward where the entry says so)."""
    if not f:
        return "—"
    if f.get("gluon_ws"):
        return f"Gluon, warp-specialised ({tile('fwd_ws', f)}) where it applies; else " + tile("fwd", f)
    return tile("fwd", f)


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
        return f"one pass, {how}: " + TILE_WORDS["onepass"].format(**b)
    return f"dK/dV {tile('dkdv', b)}; dQ {tile('dq', b)}"


def chosen_configs_table() -> str:
    rows = [{"key (dtype-d-mask-size)": key, "forward": describe_fwd(TUNED["fwd"].get(key)),
             "backward": describe_bwd(TUNED["bwd"].get(key))} for key in sorted(set(TUNED["fwd"]) | set(TUNED["bwd"]))]
    return markdown_table(pd.DataFrame(rows))


def tuned_keys_where(kind: str, field: str) -> list[str]:
    """Keys of the tuned table whose `kind` entry sets `field` (one_pass: the Triton one-pass
    backward; gluon_ws: the Gluon kernel)."""
    return sorted(k for k, entry in TUNED[kind].items() if entry.get(field))


def roofline() -> dict[str, float]:
    """The leaderboard case against the measured ceilings, and the tuned Triton kernels' rates."""
    B, N, d = LB["batch"], LB["seq"], LB["d"]
    tflops, tbps = matmul_ceiling_tflops("bf16"), copy_ceiling_tbps()
    fwd, total, bwd = (attention_flops(B, N, N, d, True, m) for m in ("fwd", "fwd_bwd", "bwd"))
    bytes_fwd = 4 * B * N * d * 2 + B * N * 4  # q, k, v read, o written (bf16); L written (fp32)
    lb = leaderboard_tuning()
    best = {k: float(lb[lb.kernel == k].ms.min()) for k in ("fwd", "dkdv", "dq", "fused")}
    bwd_ms = min(best["fused"], best["dkdv"] + best["dq"])
    return {"fwd_tflop": fwd / 1e12, "total_tflop": total / 1e12, "fwd_mb": bytes_fwd / 1e6,
            "intensity": fwd / bytes_fwd, "ridge": tflops / tbps,
            "fwd_floor_ms": fwd / (tflops * 1e12) * 1e3, "total_floor_ms": total / (tflops * 1e12) * 1e3,
            "bytes_floor_us": bytes_fwd / (tbps * 1e12) * 1e6,
            "kernel_fwd_ms": best["fwd"], "kernel_bwd_ms": bwd_ms,
            "kernel_fwd_tflops": fwd / (best["fwd"] * 1e-3) / 1e12,
            "kernel_bwd_tflops": bwd / (bwd_ms * 1e-3) / 1e12,
            # what the tensor cores execute: 7 matmuls per score tile in the two-pass design, not the 5 counted
            "kernel_bwd_executed_tflops": bwd * 7 / 5 / (bwd_ms * 1e-3) / 1e12}


# -- the Gluon kernels ------------------------------------------------------------------------------

WS_DESIGNS = {  # impl field of the rows -> what that kernel was
    "gluon one-pass ws": "math warpgroups stage fp32 dQ shares; a reducer sums and adds them",
    "gluon one-pass ws, dQ warpgroup": "math warpgroups hand over dS^T; a dQ warpgroup does dS K and the adds",
    "gluon one-pass ws, dQ warpgroup, TMA adds": "as above, the adds by TMA bulk reductions from shared memory",
}


def ws_rows() -> pd.DataFrame:
    """Median over each run's interleaved rounds, one row per (run, kernel, version, variant)."""
    keys = ["run", "git", "impl", "version", "block_n", "stages", "slots", "reduce_warps", "reduce_regs"]
    return round_stats(load_results(WS_BENCH, status="ok"), keys)


def ws_table() -> str:
    """Every run of the Gluon kernel, each beside the tuned two-pass backward timed in the same run."""
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


def ws_best(needs: str = "full") -> dict:
    """The newest run that timed the `needs` version beside the two-pass backward: its fastest full
    kernel, that kernel's ablations (same kernel and variant) and the two-pass backward's time."""
    g = ws_rows()
    with_two_pass = set(g[g.impl.str.startswith("triton")].run)
    run = g[(g.version == needs) & g.run.isin(with_two_pass)].run.max()
    g = g[g.run == run]
    full = g[g.version == "full"].sort_values("median_ms").iloc[0]
    same = g[(g.impl == full.impl) & (g.block_n == full.block_n) & (g.stages == full.stages)
             & (g.slots == full.slots) & (g.reduce_regs == full.reduce_regs)].set_index("version").median_ms
    two = float(g[g.impl.str.startswith("triton")].median_ms.iloc[0])
    return {"run": run, "git": full.git, "impl": full.impl, "full": float(full.median_ms), "two_pass": two,
            **{v: float(ms) for v, ms in same.items() if v != "full"}}


def ws_tuning_run(kernel: str) -> pd.DataFrame:
    """The rows of the newest tuning run of a Gluon kernel ("ws": the backward, "fwd_ws": the
    forward) at the leaderboard shape."""
    tune = load_results(TUNE_BENCH, status="ok")
    ws = at_leaderboard_shape(tune[tune.kernel == kernel])
    return ws[ws.run == ws.run.max()]


def ws_tuning_rows(kernel: str) -> pd.DataFrame:
    """One row per candidate of `ws_tuning_run`: its first timing and (the fastest few) the median
    of its confirmation rounds."""
    ws = ws_tuning_run(kernel).assign(setting=lambda d: d.config.map(lambda c: tile(kernel, c)))
    conf = ws.phase == "confirm"
    first = ws[~conf].groupby("setting", as_index=False).agg(run=("run", "first"), git=("git", "first"),
                                                               first_ms=("ms", "first"))
    medians = ws[conf].groupby("setting").ms.median().rename("confirmed_ms")
    return first.join(medians, on="setting").sort_values(["confirmed_ms", "first_ms"])


def ws_tuning_table(kernel: str) -> str:
    shown = ws_tuning_rows(kernel).rename(columns={"first_ms": "first ms", "confirmed_ms": "median of 3 rounds, ms"})
    return with_source(shown.astype(object).where(shown.notna(), "—"), TUNE_BENCH, ws_tuning_run(kernel),
                       formats=dict.fromkeys(["first ms", "median of 3 rounds, ms"], ".3f"))


# -- facts ----------------------------------------------------------------------------------------

def _gain(kernel: str) -> float:
    row = next(r for r in tuning_effect_rows() if r["kernel"] == kernel)
    return row["heuristic ms"] / row["best ms"]


def _worst_over_best() -> list[float]:
    return [r["worst ms"] / r["best ms"] for r in tuning_effect_rows() if r["kernel"] != "backward, one launch"]


def _keys(keys: list[str]) -> str:
    return ", ".join(f"`{k}`" for k in keys)


_atomics_runs = lambda: runs_with(ONEPASS_ATOMICS)  # the runs that built the one-pass kernel with atomics
_tma_run = lambda: newest_with(ONEPASS_TMA)  # the newest run that built it with TMA reductions
_ws = lambda: ws_best("math_only")  # the newest Gluon backward run with its math-only ablation
_one_pass_keys = lambda: tuned_keys_where("bwd", "one_pass")
_gluon_keys = lambda kind: tuned_keys_where(kind, "gluon_ws")

FACTS = {
    **{f"peak_{k}": lambda v=v, f=f: format(v, f) for k, v, f in (("tflops", PEAK_TFLOPS, ".0f"), ("tbps", PEAK_TBPS, ".1f"))},
    **{f"roof_{k}": lambda k=k, f=f: format(roofline()[k], f) for k, f in (
        ("fwd_tflop", ".2f"), ("total_tflop", ".2f"), ("fwd_mb", ".0f"), ("intensity", ",.0f"), ("ridge", ".0f"),
        ("fwd_floor_ms", ".2f"), ("total_floor_ms", ".2f"), ("bytes_floor_us", ".0f"), ("kernel_fwd_ms", ".3f"),
        ("kernel_bwd_ms", ".3f"), ("kernel_fwd_tflops", ".0f"), ("kernel_bwd_tflops", ".0f"),
        ("kernel_bwd_executed_tflops", ".0f"))},
    "roof_executed_share": lambda: f'{roofline()["kernel_bwd_executed_tflops"] / matmul_ceiling_tflops("bf16"):.0%}',
    "tune_gain_fwd": lambda: f'{_gain("forward"):.2f}',
    "tune_gain_dkdv": lambda: f'{_gain("dK/dV pass"):.2f}',
    "tune_gain_dq": lambda: f'{_gain("dQ pass"):.2f}',
    "tune_gain_fused": lambda: f'{_gain("backward, one launch"):.2f}',
    "tune_worst_span": lambda: span(_worst_over_best(), ".1f"),
    "confirm_git": lambda: confirm_medians()["git"],
    **{f"confirm_{k.replace(' ', '_')}_ms": lambda k=k: f"{confirm_medians()[k]:.3f}"
       for k in ("two launches", "fused", "onepass_tma", "onepass_atomics")},
    "onepass_atomics_runs": lambda: len(_atomics_runs()),
    "onepass_atomics_span": lambda: span(_atomics_runs()[ONEPASS_ATOMICS], ".2f"),
    "onepass_fused_span": lambda: span(_atomics_runs()["two passes, one launch"], ".2f"),
    "onepass_atomics_extra_span": lambda: span(_atomics_runs()[ONEPASS_ATOMICS] - _atomics_runs()["dK/dV pass"], ".2f"),
    "onepass_fifth_matmul_span": lambda: span(_atomics_runs()["dK/dV pass"] / 4, ".2f"),
    "onepass_tma_run": lambda: _tma_run()["tuning run"],
    "onepass_tma_git": lambda: _tma_run()["git"],
    "onepass_tma_ms": lambda: f"{_tma_run()[ONEPASS_TMA]:.3f}",
    "onepass_tma_atomics_ms": lambda: f"{_tma_run()[ONEPASS_ATOMICS]:.3f}",
    "onepass_tma_two_pass_ms": lambda: f"{two_pass_best(_tma_run()):.3f}",
    "onepass_tma_extra_ms": lambda: f'{_tma_run()[ONEPASS_TMA] - _tma_run()["dK/dV pass"]:.2f}',
    "onepass_tma_dq_pass_ms": lambda: f'{_tma_run()["dQ pass"]:.2f}',
    "onepass_keys": lambda: _keys(_one_pass_keys()),
    "onepass_key_count": lambda: len(_one_pass_keys()),
    # dP issued before the exponentials: the version at df107f5 against the one before it (20201d0)
    **{f"dp_{when}_{col}": lambda g=g, c=c: f"{history_row(g)[c]:.3f}"
       for when, g in (("before", "20201d0"), ("after", "df107f5"))
       for col, c in (("dkdv", "dK/dV pass"), ("dq", "dQ pass"))},
    "dp_before_git": lambda: history_row("20201d0")["git"],
    "dp_after_git": lambda: history_row("df107f5")["git"],
    **{f"ws_{k}": lambda k=k, f=f: format(_ws()[k], f) for k, f in (
        ("run", "s"), ("git", "s"), ("math_only", ".3f"), ("two_pass", ".3f"), ("no_add", ".3f"), ("full", ".3f"),
        ("mask_every_tile", ".3f"))},
    "ws_math_under_two_pass": lambda: f'{1 - _ws()["math_only"] / _ws()["two_pass"]:.0%}',
    "ws_adds_ms": lambda: f'{_ws()["full"] - _ws()["no_add"]:.3f}',
    "ws_vs_two_pass": lambda: f'{_ws()["full"] / _ws()["two_pass"]:.3f}',
    "ws_mask_every_tile_cost": lambda: f'{_ws()["mask_every_tile"] / _ws()["full"] - 1:+.1%}',
    **{f"{kernel}_tuned_setting": lambda k=kernel: ws_tuning_rows(k).iloc[0].setting for kernel in GLUON_KINDS},
    **{f"{kernel}_tuned_ms": lambda k=kernel: f"{ws_tuning_rows(k).iloc[0].confirmed_ms:.3f}" for kernel in GLUON_KINDS},
    "gluon_bwd_keys": lambda: _keys(_gluon_keys("bwd")),
    "gluon_fwd_keys": lambda: _keys(_gluon_keys("fwd")),
}


def _confirmation_reverses_first() -> bool:
    """The first timings put the one-launch backward ahead of the best two launches (or behind);
    the confirmation medians say the opposite."""
    fused = next(r for r in tuning_effect_rows() if r["kernel"] == "backward, one launch")
    c = confirm_medians()
    return (fused["best ms"] < fused["heuristic ms"]) != (c["fused"] < c["two launches"])


def _bulk_reductions_not_enough() -> bool:
    r, c = _tma_run(), confirm_medians()
    return (two_pass_best(r) < r[ONEPASS_TMA] < r[ONEPASS_ATOMICS] and r[ONEPASS_TMA] - r["dK/dV pass"] > r["dQ pass"]
            and c["two launches"] < c["onepass_tma"] < c["onepass_atomics"])


def _size_classes_as_described() -> bool:
    """medium up to 32,768 rows of batch x heads x seq, large up to 2^19, huge beyond; small
    launches borrow the medium entry (none is tuned); untuned shapes warn (UntunedShapeWarning)."""
    return ([table.size_class(1, n, n) for n in (4096, 4097, 32768, 32769, 2**19, 2**19 + 1)]
            == ["small", "medium", "medium", "large", "large", "huge"] and table.SIZE_FALLBACK["small"][:2] == ("small", "medium")
            and not any(key.endswith("-small") for kind in TUNED.values() for key in kind)
            and issubclass(table.UntunedShapeWarning, UserWarning))


register("flash", facts=FACTS, tables={
    "tuning_effect": tuning_effect_table, "chosen_configs": chosen_configs_table, "backward_history": backward_history_table,
    "ws": ws_table, "ws_tuning": lambda: ws_tuning_table("ws"), "fwd_ws_tuning": lambda: ws_tuning_table("fwd_ws"),
}, claims={
    "attention_is_compute_bound": lambda: roofline()["intensity"] > 10 * roofline()["ridge"],
    "bad_tiling_costs_more_than_tuning_gains": lambda: all(_gain(r["kernel"]) >= 1 for r in tuning_effect_rows())
    and min(_worst_over_best()) > max(_gain(r["kernel"]) for r in tuning_effect_rows()),
    "confirmation_reverses_the_first_timings": _confirmation_reverses_first,
    "atomics_lost_every_run": lambda: len(_atomics_runs()) > 0
    and (_atomics_runs()[ONEPASS_ATOMICS] > _atomics_runs()["two passes, one launch"]).all(),
    "bulk_reductions_not_enough": _bulk_reductions_not_enough,
    "one_pass_keys_are_fp32": lambda: bool(_one_pass_keys()) and all(k.startswith("fp32-") for k in _one_pass_keys())
    and LB_KEY not in _one_pass_keys(),
    # within 2% per pass: the runs' noise
    "dp_first_changed_nothing": lambda: all(abs(history_row("df107f5")[c] / history_row("20201d0")[c] - 1) <= 0.02
                                            for c in ("dK/dV pass", "dQ pass")),
    "size_classes_as_described": _size_classes_as_described,
    "gluon_backward_beats_two_pass": lambda: _ws()["math_only"] < _ws()["no_add"] < _ws()["full"] < _ws()["two_pass"],
    "diagonal_split_pays": lambda: _ws()["mask_every_tile"] > _ws()["full"],
    # the tuner timed Gluon candidates at the medium key too, and kept the Triton backward there
    "gluon_at_the_leaderboard_key_only": lambda: LB_KEY in _gluon_keys("bwd") and LB_KEY in _gluon_keys("fwd")
    and "bf16-d64-causal-medium" not in _gluon_keys("bwd")
    and len(where(load_results(TUNE_BENCH, status="ok"), kernel="ws", key="bf16-d64-causal-medium")) > 0,
})
