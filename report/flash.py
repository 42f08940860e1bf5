"""Tables and numbers for docs/flash-attention.md, computed from the committed results at build time.

Every measured number on that page comes through here (or `report.results_table`), never typed.
"""

from __future__ import annotations

import re

import pandas as pd

from ..bench.store import REPO_ROOT
from report.results import load_results, markdown_table, provenance_line
from .flops import attention_flops
from .sweep_tables import MODE_WORDS, SWEEP_CELL

# Reference figures quoted from /work/shared/ANCHORS.md (measured there on this GPU model, or
# published): used as ceilings and milestones, never as our results.
MATMUL_CEILING_TFLOPS = 686.0  # bf16 8192^3 matmul on the H200, ANCHORS.md
COPY_CEILING_TBPS = 4.22  # device-to-device copy on the H200, ANCHORS.md
LEADERBOARD_2025_BEST_MS = 5.364  # best verified Spring 2025 course leaderboard entry (H100)
LB = dict(batch=16, seq=16384, d=64)  # the leaderboard case
LB_KEY = "bf16-d64-causal-large"  # its entry in the tuned table (the sweep's bf16, d = 64, 65,536 cells use it too)
GLUON_KINDS = {"ws": "backward", "fwd_ws": "forward"}  # the tuner's kinds for the Gluon kernels
IMPL_NAMES = {"ours": "ours (Triton FA2)", "cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2 CUDA)",
              "flex": "flex_attention", "naive": "naive, torch.compile"}


def _src(bench: str) -> str:
    return f"results/{bench}/nvidia-h200.jsonl"


# -- leaderboard ----------------------------------------------------------------------------------

def leaderboard_rows() -> pd.DataFrame:
    return load_results("attention/flash_leaderboard", status="ok")


def leaderboard_table() -> str:
    df = leaderboard_rows().copy()
    df["implementation"] = df["impl"].map(IMPL_NAMES)
    df["mode"] = df["mode"].map({"fwd_bwd": "forward+backward", "fwd": "forward"})
    df["rep s"] = df["rep_ms"] / 1000
    df = df.sort_values(["run", "mode", "mean_ms"], ascending=[True, False, True])
    shown = df[["run", "git", "mode", "implementation", "mean_ms", "median_ms", "tflops", "speed_vs_cudnn", "rep s"]]
    shown = shown.rename(columns={"mean_ms": "mean ms", "median_ms": "median ms", "tflops": "TFLOP/s",
                                  "speed_vs_cudnn": "speed vs cuDNN"})
    return (markdown_table(shown, formats={"mean ms": ".3f", "median ms": ".3f", "TFLOP/s": ".0f",
                                           "speed vs cuDNN": ".3f", "rep s": "g"})
            + "\n\n" + provenance_line(load_results("attention/flash_leaderboard"), _src("attention/flash_leaderboard")))


def headline_run(df: pd.DataFrame) -> str:
    """The latest run that timed every implementation at the course's rep (10 s), else the latest
    run that timed every implementation, else the latest run."""
    impls = set(IMPL_NAMES)
    complete = [run for run, g in df.groupby("run") if impls <= set(g.impl)]
    full_rep = [run for run in complete if (df[df.run == run].rep_ms >= 10000).all()]
    return max(full_rep or complete or list(df.run))


def leaderboard_facts() -> dict[str, float]:
    """The headline run's numbers: every implementation, both modes, mean and median, the checks."""
    df = leaderboard_rows()
    latest = df[df["run"] == headline_run(df)]
    get = lambda impl, mode, col="mean_ms": float(latest[(latest.impl == impl) & (latest["mode"] == mode)][col].iloc[0])  # noqa: E731
    facts = {f"{impl}_{mode}{'' if col == 'mean_ms' else '_median'}": get(impl, mode, col)
             for impl in set(latest.impl) for mode in ("fwd", "fwd_bwd") for col in ("mean_ms", "median_ms")}
    ours = latest[(latest.impl == "ours") & (latest["mode"] == "fwd_bwd")].iloc[0]
    facts.update({k: float(ours[k]) for k in ("rel_err_o", "rel_err_dq", "rel_err_dk", "rel_err_dv")})
    facts["runs"] = len(set(df["run"]))
    facts["run"], facts["git"], facts["rep_s"] = latest.run.iloc[0], latest.git.iloc[0], latest.rep_ms.max() / 1000
    return facts


# -- roofline -----------------------------------------------------------------------------------

def roofline_facts() -> dict[str, float]:
    B, N, d = LB["batch"], LB["seq"], LB["d"]
    fwd = attention_flops(B, N, N, d, True, "fwd")
    total = attention_flops(B, N, N, d, True, "fwd_bwd")
    bytes_fwd = 4 * B * N * d * 2 + B * N * 4  # q, k, v read, o written (bf16); L written (fp32)
    lb = _leaderboard_tuning()
    best = {k: float(lb[lb.kernel == k].ms.min()) for k in ("fwd", "dkdv", "dq", "fused")}
    bwd_ms = min(best["fused"], best["dkdv"] + best["dq"])
    bwd_flops = attention_flops(B, N, N, d, True, "bwd")
    return {
        "fwd_flops": fwd, "total_flops": total, "bytes_fwd": bytes_fwd,
        "intensity": fwd / bytes_fwd,
        "fwd_floor_ms": fwd / (MATMUL_CEILING_TFLOPS * 1e12) * 1e3,
        "total_floor_ms": total / (MATMUL_CEILING_TFLOPS * 1e12) * 1e3,
        "bytes_floor_us": bytes_fwd / (COPY_CEILING_TBPS * 1e12) * 1e6,
        "kernel_fwd_ms": best["fwd"], "kernel_bwd_ms": bwd_ms,
        "kernel_fwd_tflops": fwd / (best["fwd"] * 1e-3) / 1e12,
        "kernel_bwd_tflops": bwd_flops / (bwd_ms * 1e-3) / 1e12,
        # what the tensor cores actually execute: 7 matmuls per score tile, not the 5 counted
        "kernel_bwd_executed_tflops": bwd_flops * 7 / 5 / (bwd_ms * 1e-3) / 1e12,
    }


# -- tuning -------------------------------------------------------------------------------------

def _tile(kernel: str, c: dict) -> str:
    return _tiles(kernel, c) + _tma(kernel, c)


def _tma(kernel: str, c: dict) -> str:
    """Which passes load through TMA descriptors (rows from before the option have no such field)."""
    passes = {"fwd": ["tma"], "dkdv": ["tma1"], "dq": ["tma2"], "fused": ["tma1", "tma2"],
              "onepass": ["tma1"]}.get(kernel, [])
    on = [p for p in passes if c.get(p)]
    if not on:
        return ""
    return ", TMA" if kernel != "fused" else ", TMA " + " + ".join({"tma1": "dK/dV", "tma2": "dQ"}[p] for p in on)


TILE_WORDS = {  # kernel -> its tiling in words, from its config's fields ("fused" is the fallback)
    "fwd": "{block_m}x{block_n}, {num_warps} warps, {num_stages} stages",
    "dkdv": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "dq": "{block_m2} queries x {block_n2} keys, {num_warps2} w, {num_stages2} st",
    "onepass": "{block_n1} keys x {block_m1} queries, {num_warps1} w, {num_stages1} st",
    "ws": "{ws_stages} stages, {ws_slots} dS slots, {ws_dq_regs} dQ regs",
    "fwd_ws": "{ws_warpgroups} x 64 queries, {ws_block_n} keys per tile, {ws_stages} stages",
    "fused": "dK/dV {block_n1}x{block_m1}, dQ {block_m2}x{block_n2}, {num_warps1} w, {num_stages1} st",
}


def _tiles(kernel: str, c: dict) -> str:
    return TILE_WORDS.get(kernel, TILE_WORDS["fused"]).format(**c)


def _triton_tuning(status: str | None = "ok") -> pd.DataFrame:
    """The tuner's rows of the Triton kernels (the Gluon kernels', "ws" and "fwd_ws", have their
    own tables in the Gluon sections: `diagnostics.ws_tuning_table`)."""
    tune = load_results("attention/flash_tune", status=status)
    return tune[~tune.kernel.isin(GLUON_KINDS)] if "kernel" in tune else tune


def _tuning_rows() -> pd.DataFrame:
    """The tuner's first timing of each Triton candidate (its confirmation rounds, which re-time
    the fastest few, are left out so that each candidate counts once)."""
    tune = _triton_tuning()
    return tune[tune.phase != "confirm"] if "phase" in tune else tune


def _at_leaderboard_shape(tune: pd.DataFrame) -> pd.DataFrame:
    """Rows of the leaderboard's key timed at the leaderboard's shape (a sweep tuning run once timed
    that key at batch 1 x 65,536: those rows are not this shape's)."""
    return tune[(tune.key == LB_KEY) & (tune.Z == LB["batch"]) & (tune.seq == LB["seq"])]


def _leaderboard_tuning() -> pd.DataFrame:
    """Each kernel's rows from its latest tuning run at the leaderboard shape (as `tune.choose`
    reads them: a run may re-time some kernels only)."""
    lb = _at_leaderboard_shape(_tuning_rows())
    return lb[lb.run == lb.groupby("kernel").run.transform("max")]


def tuning_effect_rows() -> list[dict]:
    """Leaderboard shape: the configuration we started from (the heuristic) against the best one
    measured, per kernel; and the fused launch against the two launches."""
    from .configs import heuristic_bwd, heuristic_fwd
    import torch

    lb = _leaderboard_tuning()
    h_fwd, h_bwd = heuristic_fwd(torch.bfloat16, 64).__dict__, heuristic_bwd(torch.bfloat16, 64).__dict__
    rows = []
    for kernel, fields in (("fwd", ("block_m", "block_n", "num_warps", "num_stages", "tma")),
                           ("dkdv", ("block_m1", "block_n1", "num_warps1", "num_stages1", "tma1")),
                           ("dq", ("block_m2", "block_n2", "num_warps2", "num_stages2", "tma2"))):
        sub = lb[lb.kernel == kernel]
        ref = h_fwd if kernel == "fwd" else h_bwd
        start = sub[sub.config.map(lambda c: all(c.get(f, False) == ref[f] for f in fields))]
        best = sub.loc[sub.ms.idxmin()]
        rows.append({"kernel": {"fwd": "forward", "dkdv": "dK/dV pass", "dq": "dQ pass"}[kernel],
                     "candidates": len(sub), "heuristic": _tile(kernel, start.iloc[0].config) if len(start) else "—",
                     "heuristic ms": float(start.ms.iloc[0]) if len(start) else None,
                     "best": _tile(kernel, best.config), "best ms": float(best.ms),
                     "worst ms": float(sub.ms.max())})
    fused = lb[lb.kernel == "fused"]
    if len(fused):
        best = fused.loc[fused.ms.idxmin()]
        sep = rows[1]["best ms"] + rows[2]["best ms"]
        rows.append({"kernel": "backward, one launch", "candidates": len(fused),
                     "heuristic": "best dK/dV + best dQ, two launches", "heuristic ms": sep,
                     "best": _tile("fused", best.config), "best ms": float(best.ms), "worst ms": float(fused.ms.max())})
    return rows


ONEPASS_ATOMICS, ONEPASS_TMA = "one pass, dQ by thread atomics", "one pass, dQ by TMA reductions"


def _design(kernel: str, config: dict) -> str:
    """The kernel, with the one-pass backward split by how it adds dQ (tma1: TMA bulk reductions)."""
    if kernel != "onepass":
        return kernel
    return "onepass_tma" if config.get("tma1") else "onepass_atomics"


def backward_history_rows() -> list[dict]:
    """Leaderboard shape, one row per tuning run (each a version of the code): the fastest
    candidate of each backward design that run timed, bare kernels, median ms."""
    lb = _at_leaderboard_shape(_tuning_rows())
    lb = lb.assign(design=[_design(k, c) for k, c in zip(lb.kernel, lb.config)])
    rows = []
    for run, g in lb.groupby("run"):
        best = {k: float(g[g.design == k].ms.min()) if (g.design == k).any() else None
                for k in ("dkdv", "dq", "fused", "onepass_atomics", "onepass_tma")}
        rows.append({"tuning run": run, "git": g.git.iloc[0], "dK/dV pass": best["dkdv"], "dQ pass": best["dq"],
                     "two passes, one launch": best["fused"], ONEPASS_ATOMICS: best["onepass_atomics"],
                     ONEPASS_TMA: best["onepass_tma"]})
    return rows


def confirm_medians() -> dict:
    """Leaderboard shape, the latest tuning run with confirmation rounds (the fastest four candidates
    of each kernel re-timed in three interleaved rounds): per design, the best candidate's median,
    as `tune.choose` ranks them; "two launches" is the best dK/dV plus the best dQ pass."""
    tune = _triton_tuning()
    conf = _at_leaderboard_shape(tune[tune.phase == "confirm"]) if "phase" in tune else tune.iloc[:0]
    if conf.empty:
        return {}
    conf = conf[conf.run == conf.run.max()]
    conf = conf.assign(design=[_design(k, c) for k, c in zip(conf.kernel, conf.config)],
                       cfg=conf.config.map(lambda c: tuple(sorted(c.items()))))
    best = conf.groupby(["design", "cfg"]).ms.median().groupby("design").min()
    out = {k: float(v) for k, v in best.items()}
    if "dkdv" in out and "dq" in out:
        out["two launches"] = out["dkdv"] + out["dq"]
    out["run"], out["git"] = conf.run.iloc[0], conf.git.iloc[0]
    return out


def backward_history_table() -> str:
    df = pd.DataFrame(backward_history_rows())
    fmt = {c: ".3f" for c in df.columns if c not in ("tuning run", "git")}
    return (markdown_table(df.astype(object).where(df.notna(), "not built"), formats=fmt)
            + "\n\n" + provenance_line(load_results("attention/flash_tune"), _src("attention/flash_tune")))


def tuning_effect_table() -> str:
    df = pd.DataFrame(tuning_effect_rows())
    return (markdown_table(df, formats={"heuristic ms": ".3f", "best ms": ".3f", "worst ms": ".3f"})
            + "\n\n" + provenance_line(_leaderboard_tuning(), _src("attention/flash_tune")))


def describe_fwd(f: dict | None) -> str:
    """A forward table entry in words (the Gluon forward where the entry says so)."""
    if not f:
        return "—"
    if f.get("gluon_ws"):
        return f"Gluon, warp-specialised ({_tile('fwd_ws', f)}) where it applies; else " + _tile("fwd", f)
    return _tile("fwd", f)


def describe_bwd(b: dict | None) -> str:
    """A backward table entry in words: one launch, one pass (and how it adds dQ), or two launches."""
    if not b:
        return "—"
    if b.get("gluon_ws"):  # the rest of the entry is what unsupported inputs run
        return (f"Gluon one-pass (warp-specialised, dQ by TMA bulk reductions; {_tile('ws', b)}) where it "
                "applies; else " + describe_bwd({k: v for k, v in b.items() if k != "gluon_ws"}))
    if b.get("fused"):
        return "one launch: " + _tile("fused", b)
    if b.get("one_pass"):
        how = "TMA loads, dQ by TMA bulk reductions" if b.get("tma1") else "dQ by thread atomics"
        return f"one pass, {how}: " + _tiles("onepass", b)
    return f"dK/dV {_tile('dkdv', b)}; dQ {_tile('dq', b)}"


def chosen_configs_table() -> str:
    from .tuned_configs import TUNED

    rows = []
    for key in sorted(set(TUNED["fwd"]) | set(TUNED["bwd"])):
        f, b = TUNED["fwd"].get(key), TUNED["bwd"].get(key)
        rows.append({"key (dtype-d-mask-size)": key, "forward": describe_fwd(f),
                     "backward": describe_bwd(b)})
    return markdown_table(pd.DataFrame(rows))


def one_pass_keys() -> list[str]:
    """Keys of the tuned table whose backward is the one-pass kernel."""
    from .tuned_configs import TUNED

    return sorted(k for k, b in TUNED["bwd"].items() if b.get("one_pass"))


# -- the sweep cells that share the leaderboard's table entry ---------------------------------

def leaderboard_key_cells(previous: bool) -> pd.DataFrame:
    """Our Triton sweep cells that run with the leaderboard's table entry (bf16, d = 64, 65,536):
    their newest rows, or (previous) the rows each newest one replaced."""
    every = load_results("attention/flash_sweep")
    cells = every[(every.impl == "triton") & (every.dtype == "bf16") & (every.d == LB["d"]) & (every.seq == 65536)]
    if previous:
        cells = cells[cells.groupby(SWEEP_CELL).cumcount(ascending=False) == 1]  # second newest per cell
    else:
        cells = cells.drop_duplicates(SWEEP_CELL, keep="last")
    return cells[cells.status == "ok"]


def sweep_stale_leaderboard_entry(previous: bool = False) -> dict | None:
    """The sweep's bf16, d = 64, 65,536 Triton cells run with the leaderboard's table entry (LB_KEY).
    If the code that timed their newest rows (or, `previous`, the rows those replaced) had just tuned
    that key at another shape than the leaderboard's (the tuner, before its fix, let such a run
    replace the entry), return that tuning run, its shape and the entry it chose, next to the
    table's entry now, and the git of those rows; else None."""
    from .tune import choose
    from .tuned_configs import TUNED

    cells = leaderboard_key_cells(previous)
    tune = _triton_tuning()
    tune = tune[tune.key == LB_KEY]
    if cells.empty or tune.empty:
        return None
    before = tune[pd.to_datetime(tune.time_utc, utc=True) < pd.to_datetime(cells.time_utc, utc=True).min()]
    if before.empty:
        return None
    last = before[before.run == before.run.max()]
    Z, n = int(last.Z.iloc[0]), int(last.seq.iloc[0])
    if (Z, n) == (LB["batch"], LB["seq"]) or last.git.iloc[0] not in set(cells.git):
        return None
    chosen = choose(last.to_dict("records"))
    f, b = chosen["fwd"].get(LB_KEY), chosen["bwd"].get(LB_KEY)
    first = last[last.phase != "confirm"] if "phase" in last else last
    newest = leaderboard_key_cells(False)
    return {"run": last.run.iloc[0], "git": last.git.iloc[0], "Z": Z, "seq": n,
            "candidates": len(first), "leaderboard_candidates": len(_leaderboard_tuning()),
            "fwd": _tile("fwd", f) if f else "—", "bwd": describe_bwd(b),
            "table_fwd": _tile("fwd", TUNED["fwd"][LB_KEY]), "table_bwd": describe_bwd(TUNED["bwd"][LB_KEY]),
            "same_as_table": f == TUNED["fwd"][LB_KEY] and b == TUNED["bwd"][LB_KEY],
            "newest_git": ", ".join(sorted(set(newest.git)))}


# -- clocks recorded with the leaderboard rows ----------------------------------------------------

def leaderboard_clock_fields() -> pd.DataFrame:
    """Leaderboard rows that carry their own clock record (median and minimum SM clock, median board
    power, nvidia-smi once a second while the mean was timed); empty if none do."""
    df = leaderboard_rows()
    if "sm_mhz_median" not in df:
        return df.iloc[:0]
    return df[df.sm_mhz_median.notna()]


def leaderboard_clock_fields_table(run: str) -> str:
    df = leaderboard_clock_fields()
    df = df[df.run == run].copy()
    df["implementation"] = df["impl"].map(IMPL_NAMES)
    df["mode"] = df["mode"].map(MODE_WORDS)
    shown = df.sort_values(["mode", "mean_ms"], ascending=[False, True])[
        ["run", "git", "implementation", "mode", "mean_ms", "sm_mhz_median", "sm_mhz_min", "power_w_median"]]
    shown = shown.rename(columns={"mean_ms": "mean ms", "sm_mhz_median": "SM MHz (median)", "sm_mhz_min": "SM MHz (min)",
                                  "power_w_median": "W (median)"})
    return (markdown_table(shown, formats={"mean ms": ".3f", "SM MHz (median)": ".0f", "SM MHz (min)": ".0f",
                                           "W (median)": ".0f"})
            + "\n\n" + provenance_line(df, _src("attention/flash_leaderboard")))


# -- tests --------------------------------------------------------------------------------------

def gpu_test_summary() -> str:
    log = REPO_ROOT / "results" / "attention" / "flash_gpu_tests" / "nvidia-h200.log"
    text = log.read_text()
    header = " ".join(line.lstrip("# ").strip() for line in text.splitlines()[:2])
    summary = [line.strip() for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return f"`{summary[-1]}` ({header}; log: `results/attention/flash_gpu_tests/nvidia-h200.log`)"
