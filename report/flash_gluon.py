"""The Gluon kernels (warp-specialised one-pass backward, FA3-style forward): their A/B runs
(`onepass_ws`, each beside the tuned two-pass Triton backward) and the tuner's runs of them, from
committed results.
"""

from __future__ import annotations

import pandas as pd

from report.flash import register
from report.flash_tuning import GLUON_KINDS, SOURCE, at_leaderboard_shape, tile, tuned_table
from report.results import load_results, markdown_table, provenance_line

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


FACTS = {
    **{f"flash.ws_{k}": (lambda k=k: ws_best("math_only")[k], f) for k, f in (
        ("run", "s"), ("git", "s"), ("math_only", ".3f"), ("two_pass", ".3f"), ("no_add", ".3f"), ("full", ".3f"),
        ("mask_every_tile", ".3f"))},
    "flash.ws_math_under_two_pass": (lambda: 1 - ws_best("math_only")["math_only"] / ws_best("math_only")["two_pass"], ".0%"),
    "flash.ws_adds_ms": (lambda: ws_best("math_only")["full"] - ws_best("math_only")["no_add"], ".3f"),
    "flash.ws_vs_two_pass": (lambda: ws_best("math_only")["full"] / ws_best("math_only")["two_pass"], ".3f"),
    "flash.ws_mask_every_tile_cost": (lambda: ws_best("math_only")["mask_every_tile"] / ws_best("math_only")["full"] - 1, "+.1%"),
    "flash.ws_tuned_setting": (lambda: _best_setting("ws").setting, "s"),
    "flash.ws_tuned_ms": (lambda: _best_setting("ws").confirmed_ms, ".3f"),
    "flash.fwd_ws_tuned_setting": (lambda: _best_setting("fwd_ws").setting, "s"),
    "flash.fwd_ws_tuned_ms": (lambda: _best_setting("fwd_ws").confirmed_ms, ".3f"),
    "flash.gluon_bwd_keys": (lambda: ", ".join(f"`{k}`" for k in gluon_keys("bwd")), "s"),
    "flash.gluon_fwd_keys": (lambda: ", ".join(f"`{k}`" for k in gluon_keys("fwd")), "s"),
}
register(FACTS)
