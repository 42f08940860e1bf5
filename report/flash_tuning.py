"""The tuner's measurements (`configs tune`, results/attention/flash_tune): tables, the roofline,
and the Gluon kernels (the warp-specialised one-pass backward's A/B runs, results/attention/onepass_ws,
and the tuner's runs of both Gluon kernels, kinds "ws" and "fwd_ws").

Each tuning run times every candidate tiling of every kernel once, bare launches at one shape, then
re-times the fastest four of each kernel in three interleaved rounds (`phase == "confirm"`).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.attention.flops import attention_flops
from report.flash import LB, LB_KEY
from report.registry import register
from report.reproducing import copy_ceiling_tbps, matmul_ceiling_tflops
from report.results import load_results, markdown_table, provenance_line
from report.units import span

TUNE_BENCH = "attention/flash_tune"
SOURCE = f"results/{TUNE_BENCH}/nvidia-h200.jsonl"
GLUON_KINDS = {"ws": "backward", "fwd_ws": "forward"}
# NVIDIA H200 datasheet (SXM): dense bf16 tensor-core peak and HBM3e bandwidth, quoted beside the
# ceilings this repository measured (`just bench ceilings`), which the roofline below uses.
PEAK_TFLOPS, PEAK_TBPS = 989.0, 4.8
ONEPASS_ATOMICS, ONEPASS_TMA = "one pass, dQ by thread atomics", "one pass, dQ by TMA reductions"
TILE_WORDS = {  # kernel -> its tiling in words, from its config's fields ("fused" is the fallback)
    "fwd": "{block_m}x{block_n}, {num_warps} warps, {num_stages} stages",
    "dkdv": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "dq": "{block_m2} queries x {block_n2} keys, {num_warps2} w, {num_stages2} st",
    "onepass": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "ws": "{ws_stages} stages, {ws_slots} dS slots, {ws_dq_regs} dQ regs",
    "fwd_ws": "{ws_warpgroups} x 64 queries, {ws_block_n} keys per tile, {ws_stages} stages",
    "fused": "dK/dV {block_n1}x{block_m1}, dQ {block_m2}x{block_n2}, {num_warps1} w, {num_stages1} st",
}


def tile(kernel: str, c: dict) -> str:
    """A candidate's tiling in words, and which passes load through TMA descriptors."""
    passes = {"fwd": ["tma"], "dkdv": ["tma1"], "dq": ["tma2"], "fused": ["tma1", "tma2"],
              "onepass": ["tma1"]}.get(kernel, [])
    on = [p for p in passes if c.get(p)]
    tma = "" if not on else ", TMA" if kernel != "fused" else ", TMA " + " + ".join(
        {"tma1": "dK/dV", "tma2": "dQ"}[p] for p in on)
    return TILE_WORDS.get(kernel, TILE_WORDS["fused"]).format(**c) + tma


def triton_tuning(status: str | None = "ok") -> pd.DataFrame:
    tune = load_results(TUNE_BENCH, status=status)
    return tune[~tune.kernel.isin(GLUON_KINDS)]


def first_timings(tune: pd.DataFrame) -> pd.DataFrame:
    """Each candidate's first timing (confirmation rounds left out, so each counts once)."""
    return tune[tune.phase != "confirm"] if "phase" in tune else tune


def at_leaderboard_shape(tune: pd.DataFrame) -> pd.DataFrame:
    """Rows of the leaderboard's key timed at its shape (a sweep tuning run once timed that key at
    batch 1 x 65,536: those rows are not this shape's)."""
    return tune[(tune.key == LB_KEY) & (tune.Z == LB["batch"]) & (tune.seq == LB["seq"])]


def leaderboard_tuning() -> pd.DataFrame:
    """Each kernel's rows from its latest tuning run at the leaderboard shape (as the tuner reads them)."""
    lb = at_leaderboard_shape(first_timings(triton_tuning()))
    return lb[lb.run == lb.groupby("kernel").run.transform("max")]


def tuning_effect_rows() -> list[dict]:
    """Leaderboard shape: the heuristic configuration against the best measured, per kernel; and
    the fused launch against the best two launches."""
    import torch

    from cs336_systems.attention.tiles import heuristic_bwd, heuristic_fwd

    lb = leaderboard_tuning()
    h_fwd, h_bwd = heuristic_fwd(torch.bfloat16, 64).__dict__, heuristic_bwd(torch.bfloat16, 64).__dict__
    rows = []
    for kernel, name, ref, fields in (
            ("fwd", "forward", h_fwd, ("block_m", "block_n", "num_warps", "num_stages", "tma")),
            ("dkdv", "dK/dV pass", h_bwd, ("block_m1", "block_n1", "num_warps1", "num_stages1", "tma1")),
            ("dq", "dQ pass", h_bwd, ("block_m2", "block_n2", "num_warps2", "num_stages2", "tma2"))):
        sub = lb[lb.kernel == kernel]
        start = sub[sub.config.map(lambda c: all(c.get(f, False) == ref[f] for f in fields))]
        best = sub.loc[sub.ms.idxmin()]
        rows.append({"kernel": name, "candidates": len(sub),
                     "heuristic": tile(kernel, start.iloc[0].config) if len(start) else "—",
                     "heuristic ms": float(start.ms.iloc[0]) if len(start) else None,
                     "best": tile(kernel, best.config), "best ms": float(best.ms), "worst ms": float(sub.ms.max())})
    fused = lb[lb.kernel == "fused"]
    best = fused.loc[fused.ms.idxmin()]
    rows.append({"kernel": "backward, one launch", "candidates": len(fused),
                 "heuristic": "best dK/dV + best dQ, two launches", "heuristic ms": rows[1]["best ms"] + rows[2]["best ms"],
                 "best": tile("fused", best.config), "best ms": float(best.ms), "worst ms": float(fused.ms.max())})
    return rows


def tuning_effect_table() -> str:
    return (markdown_table(pd.DataFrame(tuning_effect_rows()),
                           formats={"heuristic ms": ".3f", "best ms": ".3f", "worst ms": ".3f"})
            + "\n\n" + provenance_line(leaderboard_tuning(), SOURCE))


def design(kernel: str, config: dict) -> str:
    """The kernel, with the one-pass backward split by how it adds dQ (tma1: TMA bulk reductions)."""
    if kernel != "onepass":
        return kernel
    return "onepass_tma" if config.get("tma1") else "onepass_atomics"


def backward_history_rows() -> list[dict]:
    """Leaderboard shape, one row per tuning run (a version of the code): the fastest candidate of
    each backward design it timed, bare kernels, median ms (None: not built then)."""
    lb = at_leaderboard_shape(first_timings(triton_tuning()))
    lb = lb.assign(design=[design(k, c) for k, c in zip(lb.kernel, lb.config)])
    rows = []
    for run, g in lb.groupby("run"):
        best = {k: float(g[g.design == k].ms.min()) if (g.design == k).any() else None
                for k in ("dkdv", "dq", "fused", "onepass_atomics", "onepass_tma")}
        rows.append({"tuning run": run, "git": g.git.iloc[0], "dK/dV pass": best["dkdv"], "dQ pass": best["dq"],
                     "two passes, one launch": best["fused"], ONEPASS_ATOMICS: best["onepass_atomics"],
                     ONEPASS_TMA: best["onepass_tma"]})
    return rows


def backward_history_table() -> str:
    df = pd.DataFrame(backward_history_rows())
    fmt = {c: ".3f" for c in df.columns if c not in ("tuning run", "git")}
    return (markdown_table(df.astype(object).where(df.notna(), "not built"), formats=fmt)
            + "\n\n" + provenance_line(load_results(TUNE_BENCH), SOURCE))


def history_row(git: str) -> dict:
    """The backward history's row of the tuning run at this commit (a prefix of it will do)."""
    hit = [r for r in backward_history_rows() if r["git"].startswith(git)]
    if not hit:
        raise KeyError(f"no tuning run at the leaderboard shape at git {git}")
    return hit[-1]


def newest_with(design_name: str) -> dict:
    return [r for r in backward_history_rows() if r[design_name] is not None][-1]


def confirm_medians() -> dict:
    """Leaderboard shape, the latest tuning run with confirmation rounds: per design, the best
    candidate's median over the rounds; "two launches" is the best dK/dV plus the best dQ pass."""
    tune = triton_tuning()
    conf = at_leaderboard_shape(tune[tune.phase == "confirm"])
    conf = conf[conf.run == conf.run.max()]
    conf = conf.assign(design=[design(k, c) for k, c in zip(conf.kernel, conf.config)],
                       cfg=conf.config.map(lambda c: tuple(sorted(c.items()))))
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


def tuned_table() -> dict:
    from cs336_systems.attention.fast.tuned_configs import TUNED

    return TUNED


def chosen_configs_table() -> str:
    t = tuned_table()
    rows = [{"key (dtype-d-mask-size)": key, "forward": describe_fwd(t["fwd"].get(key)),
             "backward": describe_bwd(t["bwd"].get(key))} for key in sorted(set(t["fwd"]) | set(t["bwd"]))]
    return markdown_table(pd.DataFrame(rows))


def one_pass_keys() -> list[str]:
    """Keys of the tuned table whose backward is the Triton one-pass kernel."""
    return sorted(k for k, b in tuned_table()["bwd"].items() if b.get("one_pass"))


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


# -- facts ----------------------------------------------------------------------------------------

def _gain(kernel: str) -> float:
    row = next(r for r in tuning_effect_rows() if r["kernel"] == kernel)
    return row["heuristic ms"] / row["best ms"]


def _worst_over_best() -> list[float]:
    return [r["worst ms"] / r["best ms"] for r in tuning_effect_rows() if r["kernel"] != "backward, one launch"]


def _atomics_runs() -> list[dict]:
    return [r for r in backward_history_rows() if r[ONEPASS_ATOMICS] is not None]


def _two_pass_best(r: dict) -> float:
    return min(r["two passes, one launch"], r["dK/dV pass"] + r["dQ pass"])


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
    "confirm_two_launches_ms": lambda: f'{confirm_medians()["two launches"]:.3f}',
    "confirm_fused_ms": lambda: f'{confirm_medians()["fused"]:.3f}',
    "confirm_onepass_tma_ms": lambda: f'{confirm_medians()["onepass_tma"]:.3f}',
    "confirm_onepass_atomics_ms": lambda: f'{confirm_medians()["onepass_atomics"]:.3f}',
    "onepass_atomics_runs": lambda: len(_atomics_runs()),
    "onepass_atomics_span": lambda: span([r[ONEPASS_ATOMICS] for r in _atomics_runs()], ".2f"),
    "onepass_fused_span": lambda: span([r["two passes, one launch"] for r in _atomics_runs()], ".2f"),
    "onepass_atomics_extra_span": lambda: span([r[ONEPASS_ATOMICS] - r["dK/dV pass"] for r in _atomics_runs()], ".2f"),
    "onepass_fifth_matmul_span": lambda: span([r["dK/dV pass"] / 4 for r in _atomics_runs()], ".2f"),
    "onepass_tma_run": lambda: newest_with(ONEPASS_TMA)["tuning run"],
    "onepass_tma_git": lambda: newest_with(ONEPASS_TMA)["git"],
    "onepass_tma_ms": lambda: f"{newest_with(ONEPASS_TMA)[ONEPASS_TMA]:.3f}",
    "onepass_tma_atomics_ms": lambda: f"{newest_with(ONEPASS_TMA)[ONEPASS_ATOMICS]:.3f}",
    "onepass_tma_two_pass_ms": lambda: f"{_two_pass_best(newest_with(ONEPASS_TMA)):.3f}",
    "onepass_tma_extra_ms": lambda: f'{newest_with(ONEPASS_TMA)[ONEPASS_TMA] - newest_with(ONEPASS_TMA)["dK/dV pass"]:.2f}',
    "onepass_tma_dq_pass_ms": lambda: f'{newest_with(ONEPASS_TMA)["dQ pass"]:.2f}',
    "onepass_keys": lambda: ", ".join(f"`{k}`" for k in one_pass_keys()),
    "onepass_key_count": lambda: len(one_pass_keys()),
    # dP issued before the exponentials: the version at df107f5 against the one before it (20201d0)
    **{f"dp_{when}_{col}": lambda g=g, c=c: f"{history_row(g)[c]:.3f}"
       for when, g in (("before", "20201d0"), ("after", "df107f5"))
       for col, c in (("dkdv", "dK/dV pass"), ("dq", "dQ pass"))},
    "dp_before_git": lambda: history_row("20201d0")["git"],
    "dp_after_git": lambda: history_row("df107f5")["git"],
}


# -- the Gluon kernels ------------------------------------------------------------------------------

WS_BENCH = "attention/onepass_ws"

WS_DESIGNS = {  # impl field of the rows -> what that kernel was
    "gluon one-pass ws": "math warpgroups stage fp32 dQ shares; a reducer sums and adds them",
    "gluon one-pass ws, dQ warpgroup": "math warpgroups hand over dS^T; a dQ warpgroup does dS K and the adds",
    "gluon one-pass ws, dQ warpgroup, TMA adds": "as above, the adds by TMA bulk reductions from shared memory",
}


def ws_rows() -> pd.DataFrame:
    """Median over each run's interleaved rounds, one row per (run, kernel, version, variant)."""
    df = load_results(WS_BENCH, status="ok")
    keys = ["run", "git", "impl", "version", "block_n", "stages", "slots", "reduce_warps", "reduce_regs"]
    return df.groupby(keys, as_index=False).agg(median_ms=("ms", "median"), rounds=("ms", "size"))


def ws_table() -> str:
    """Every run of the Gluon kernel, each beside the tuned two-pass backward timed in the same run."""
    g = ws_rows()
    two = g[g.impl.str.startswith("triton")].set_index("run").median_ms
    g = g[~g.impl.str.startswith("triton")].copy()
    g["vs two-pass"] = g.median_ms / g.run.map(two)
    g["design"] = g.impl.map(WS_DESIGNS)
    g["variant"] = g.apply(lambda r: f"{r.block_n} keys, {r.stages} stages, {r.slots} slots, "
                                     f"{r.reduce_warps} w x {r.reduce_regs} regs", axis=1)
    g["two-pass ms"] = g.run.map(two)
    g = g.sort_values(["run", "median_ms"])
    shown = g[["run", "git", "design", "version", "variant", "median_ms", "two-pass ms", "vs two-pass", "rounds"]]
    return (markdown_table(shown.rename(columns={"median_ms": "median ms"}),
                           formats={"median ms": ".3f", "two-pass ms": ".3f", "vs two-pass": ".3f"})
            + "\n\n" + provenance_line(load_results(WS_BENCH), f"results/{WS_BENCH}/nvidia-h200.jsonl"))


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


# -- the tuner's Gluon candidates ------------------------------------------------------------------

def _ws_tuning_run(kernel: str = "ws") -> pd.DataFrame:
    """The rows of the newest tuning run of a Gluon kernel ("ws": the backward, "fwd_ws": the
    forward) at the leaderboard shape."""
    tune = load_results("attention/flash_tune", status="ok")
    ws = at_leaderboard_shape(tune[tune.kernel == kernel]) if "kernel" in tune else tune.iloc[:0]
    return ws[ws.run == ws.run.max()]


def ws_tuning_rows(kernel: str = "ws") -> pd.DataFrame:
    """One row per candidate of `_ws_tuning_run`: its first timing and (the fastest few) the median
    of its confirmation rounds."""
    ws = _ws_tuning_run(kernel)
    if ws.empty:
        return ws
    ws = ws.assign(setting=lambda d: d.config.map(lambda c: tile(kernel, c)))
    conf = ws.phase == "confirm" if "phase" in ws else pd.Series(False, index=ws.index)
    first = ws[~conf].groupby("setting", as_index=False).agg(run=("run", "first"), git=("git", "first"),
                                                               first_ms=("ms", "first"))
    medians = ws[conf].groupby("setting").ms.median().rename("confirmed_ms")
    return first.join(medians, on="setting").sort_values(["confirmed_ms", "first_ms"])


def ws_tuning_table(kernel: str = "ws") -> str:
    df = ws_tuning_rows(kernel)
    if df.empty:
        return f"*No tuning run has timed the Gluon {GLUON_KINDS[kernel]} at the leaderboard shape yet.*"
    shown = df.rename(columns={"setting": "setting", "first_ms": "first ms",
                               "confirmed_ms": "median of 3 rounds, ms"})
    return (markdown_table(shown.astype(object).where(shown.notna(), "—"),
                           formats={"first ms": ".3f", "median of 3 rounds, ms": ".3f"})
            + "\n\n" + provenance_line(_ws_tuning_run(kernel), SOURCE))


# -- facts ----------------------------------------------------------------------------------------

def _best_setting(kernel: str) -> pd.Series:
    return ws_tuning_rows(kernel).iloc[0]


def gluon_keys(kind: str = "bwd") -> list[str]:
    """Keys of the tuned table whose entry runs the Gluon kernel."""
    return sorted(k for k, entry in tuned_table()[kind].items() if entry.get("gluon_ws"))


FACTS |= {
    **{f"ws_{k}": lambda k=k, f=f: format(ws_best("math_only")[k], f) for k, f in (
        ("run", "s"), ("git", "s"), ("math_only", ".3f"), ("two_pass", ".3f"), ("no_add", ".3f"), ("full", ".3f"),
        ("mask_every_tile", ".3f"))},
    "ws_math_under_two_pass": lambda: f'{1 - ws_best("math_only")["math_only"] / ws_best("math_only")["two_pass"]:.0%}',
    "ws_adds_ms": lambda: f'{ws_best("math_only")["full"] - ws_best("math_only")["no_add"]:.3f}',
    "ws_vs_two_pass": lambda: f'{ws_best("math_only")["full"] / ws_best("math_only")["two_pass"]:.3f}',
    "ws_mask_every_tile_cost": lambda: f'{ws_best("math_only")["mask_every_tile"] / ws_best("math_only")["full"] - 1:+.1%}',
    "ws_tuned_setting": lambda: _best_setting("ws").setting,
    "ws_tuned_ms": lambda: f'{_best_setting("ws").confirmed_ms:.3f}',
    "fwd_ws_tuned_setting": lambda: _best_setting("fwd_ws").setting,
    "fwd_ws_tuned_ms": lambda: f'{_best_setting("fwd_ws").confirmed_ms:.3f}',
    "gluon_bwd_keys": lambda: ", ".join(f"`{k}`" for k in gluon_keys("bwd")),
    "gluon_fwd_keys": lambda: ", ".join(f"`{k}`" for k in gluon_keys("fwd")),
}


def _confirmation_reverses_first() -> bool:
    """The first timings put the one-launch backward ahead of the best two launches (or behind);
    the confirmation medians say the opposite."""
    fused = next(r for r in tuning_effect_rows() if r["kernel"] == "backward, one launch")
    c = confirm_medians()
    return (fused["best ms"] < fused["heuristic ms"]) != (c["fused"] < c["two launches"])


def _bulk_reductions_not_enough() -> bool:
    r, c = newest_with(ONEPASS_TMA), confirm_medians()
    return (_two_pass_best(r) < r[ONEPASS_TMA] < r[ONEPASS_ATOMICS] and r[ONEPASS_TMA] - r["dK/dV pass"] > r["dQ pass"]
            and c["two launches"] < c["onepass_tma"] < c["onepass_atomics"])


def _size_classes_as_described() -> bool:
    """medium up to 32,768 rows of batch x heads x seq, large up to 2^19, huge beyond; small
    launches borrow the medium entry (none is tuned); untuned shapes warn (UntunedShapeWarning)."""
    from cs336_systems.attention.fast import table

    return ([table.size_class(1, n, n) for n in (4096, 4097, 32768, 32769, 2**19, 2**19 + 1)]
            == ["small", "medium", "medium", "large", "large", "huge"] and table.SIZE_FALLBACK["small"][:2] == ("small", "medium")
            and not any(key.endswith("-small") for kind in tuned_table().values() for key in kind)
            and issubclass(table.UntunedShapeWarning, UserWarning))


def _gluon_at_the_leaderboard_key_only() -> bool:
    tune = load_results(TUNE_BENCH, status="ok")
    return (LB_KEY in gluon_keys("bwd") and LB_KEY in gluon_keys("fwd") and "bf16-d64-causal-medium" not in gluon_keys("bwd")
            and len(tune[(tune.kernel == "ws") & (tune.key == "bf16-d64-causal-medium")]) > 0)


register("flash", facts=FACTS, tables={
    "tuning_effect": tuning_effect_table, "chosen_configs": chosen_configs_table, "backward_history": backward_history_table,
    "ws": ws_table, "ws_tuning": lambda: ws_tuning_table("ws"), "fwd_ws_tuning": lambda: ws_tuning_table("fwd_ws"),
}, claims={
    "attention_is_compute_bound": lambda: roofline()["intensity"] > 10 * roofline()["ridge"],
    "bad_tiling_costs_more_than_tuning_gains": lambda: all(_gain(r["kernel"]) >= 1 for r in tuning_effect_rows())
    and min(_worst_over_best()) > max(_gain(r["kernel"]) for r in tuning_effect_rows()),
    "confirmation_reverses_the_first_timings": _confirmation_reverses_first,
    "atomics_lost_every_run": lambda: bool(_atomics_runs()) and all(r[ONEPASS_ATOMICS] > r["two passes, one launch"] for r in _atomics_runs()),
    "bulk_reductions_not_enough": _bulk_reductions_not_enough,
    "one_pass_keys_are_fp32": lambda: bool(one_pass_keys()) and all(k.startswith("fp32-") for k in one_pass_keys())
    and LB_KEY not in one_pass_keys(),
    # within 2% per pass: the runs' noise
    "dp_first_changed_nothing": lambda: all(abs(history_row("df107f5")[c] / history_row("20201d0")[c] - 1) <= 0.02
                                            for c in ("dK/dV pass", "dQ pass")),
    "size_classes_as_described": _size_classes_as_described,
    "gluon_backward_beats_two_pass": lambda: (lambda w: w["math_only"] < w["no_add"] < w["full"] < w["two_pass"])(ws_best("math_only")),
    "diagonal_split_pays": lambda: ws_best("math_only")["mask_every_tile"] > ws_best("math_only")["full"],
    "gluon_at_the_leaderboard_key_only": _gluon_at_the_leaderboard_key_only,
})
