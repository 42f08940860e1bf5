"""Tables for the flash chapter's diagnostics, from committed results: the dK/dV A/B runs
(`ab_dkdv`), the one-pass kernel's ablations (`ab_onepass`) and its dQ adds alone
(`reduce_probe`), the host's time per call
(`host_overhead`) and the GPU clocks sampled during a leaderboard run (`nvidia-smi` every 250 ms
beside `device_run`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..bench.store import REPO_ROOT
from report.results import load_results, markdown_table, provenance_line

AB_BENCH = "attention/dkdv_ab"
HOST_BENCH = "attention/host_overhead"
CLOCKS_DIR = Path("results/attention/clocks")  # nvidia-h200-<start UTC>.csv, one per sampled run
# What each A/B version was. The files were made for that run (not committed as copies): `old` is
# flash_bwd_kernel.py at git 20201d038c9c, `fixeddiag` the file at d0f7cc500f96, `rtdiag` that
# file with the diagonal loop's end put back to min(end of the diagonal, n_queries).
AB_VERSIONS = {
    "old": "as timed at git 20201d038c9c (before the dP reordering and TMA)",
    "fixeddiag": "TMA option, diagonal loop with a fixed trip count (git d0f7cc500f96)",
    "rtdiag": "TMA option, diagonal loop stops at n_queries (the kernel on this page)",
}


def ab_rows() -> pd.DataFrame:
    """Median and spread over the interleaved rounds, one row per (version, tiling, loads, tail)."""
    df = load_results(AB_BENCH, status="ok")
    keys = ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma", "no_tail"]
    g = df.groupby(keys, as_index=False).agg(median_ms=("ms", "median"), min_ms=("ms", "min"),
                                             max_ms=("ms", "max"), rounds=("ms", "size"))
    return g.sort_values("median_ms")


def ab_table() -> str:
    g = ab_rows().copy()
    g["version"] = g["variant"].map(AB_VERSIONS).fillna(g["variant"])
    g["tiles (queries x keys), warps, stages"] = g.apply(
        lambda r: f"{r.block_m1}x{r.block_n1}, {r.num_warps1} w, {r.num_stages1} st", axis=1)
    g["loads"] = g["tma"].map({True: "TMA", False: "pointers"})
    g["ragged-tail loop"] = g["no_tail"].map({True: "not compiled", False: "compiled"})
    shown = g[["version", "tiles (queries x keys), warps, stages", "loads", "ragged-tail loop",
               "median_ms", "min_ms", "max_ms", "rounds"]].rename(
        columns={"median_ms": "median ms", "min_ms": "min ms", "max_ms": "max ms"})
    return (markdown_table(shown, formats={"median ms": ".3f", "min ms": ".3f", "max ms": ".3f"})
            + "\n\n" + provenance_line(load_results(AB_BENCH), f"results/{AB_BENCH}/nvidia-h200.jsonl"))


def ab_median(variant: str, tiles: tuple[int, int, int, int], tma: bool, no_tail: bool) -> float:
    m, n, w, s = tiles
    g = ab_rows()
    hit = g[(g.variant == variant) & (g.block_m1 == m) & (g.block_n1 == n) & (g.num_warps1 == w)
            & (g.num_stages1 == s) & (g.tma == tma) & (g.no_tail == no_tail)]
    if hit.empty:
        raise KeyError(f"no A/B row for {variant} {tiles} tma={tma} no_tail={no_tail}")
    return float(hit.median_ms.iloc[-1])


ONEPASS_AB_BENCH = "attention/onepass_ab"
ONEPASS_VERSIONS = {  # ab_onepass.VARIANTS, in the order they add work
    "no_dq": "dK, dV only (no dQ matmul, no add)",
    "no_add": "+ dQ's share computed (dS K), not added",
    "full": "+ the share added into dQ (the kernel)",
    "dp_first": "the kernel with dP issued before the exponentials",
}


def onepass_ab_rows() -> pd.DataFrame:
    """Median over the interleaved rounds of the latest ablation run, one row per (version, tiling, loads)."""
    df = load_results(ONEPASS_AB_BENCH, status="ok")
    df = df[df.run == df.run.max()]
    keys = ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma"]
    return df.groupby(keys, as_index=False).agg(median_ms=("ms", "median"), min_ms=("ms", "min"),
                                                max_ms=("ms", "max"), rounds=("ms", "size"))


def onepass_ab_table() -> str:
    """Rows per tiling and loads, versions in the order they add work; `step ms` is each version's
    median minus the previous one's (what that piece costs)."""
    g = onepass_ab_rows()
    order = list(ONEPASS_VERSIONS)
    g = g.assign(rank=g.variant.map(order.index)).sort_values(["tma", "block_n1", "rank"], ascending=[False, True, True])
    parts = []
    for _, part in g.groupby(["tma", "block_n1", "block_m1", "num_warps1", "num_stages1"], sort=False):
        part = part.copy()
        chain = part[part.variant != "dp_first"]
        part["step ms"] = chain.median_ms.diff()
        parts.append(part)
    g = pd.concat(parts)
    g["version"] = g["variant"].map(ONEPASS_VERSIONS)
    g["tiles (keys x queries), warps, stages"] = g.apply(
        lambda r: f"{r.block_n1}x{r.block_m1}, {r.num_warps1} w, {r.num_stages1} st", axis=1)
    g["loads, dQ add"] = g["tma"].map({True: "TMA, bulk reduction", False: "pointers, atomics"})
    shown = g[["tiles (keys x queries), warps, stages", "loads, dQ add", "version", "median_ms", "step ms",
               "rounds"]].rename(columns={"median_ms": "median ms"})
    shown = shown.astype(object).where(shown.notna(), "")
    return (markdown_table(shown, formats={"median ms": ".3f", "step ms": "+.3f"})
            + "\n\n" + provenance_line(load_results(ONEPASS_AB_BENCH), f"results/{ONEPASS_AB_BENCH}/nvidia-h200.jsonl"))


def onepass_ab_median(variant: str, tiles: tuple[int, int, int, int], tma: bool) -> float:
    m, n, w, s = tiles
    g = onepass_ab_rows()
    hit = g[(g.variant == variant) & (g.block_m1 == m) & (g.block_n1 == n) & (g.num_warps1 == w)
            & (g.num_stages1 == s) & (g.tma == tma)]
    if hit.empty:
        raise KeyError(f"no one-pass ablation row for {variant} {tiles} tma={tma}")
    return float(hit.median_ms.iloc[0])


PROBE_BENCH = "attention/reduce_probe"
PROBE_MODES = {"atomics": "per-thread atomics", "tma": "TMA bulk reductions", "store": "plain stores (no sum)"}


def probe_rows() -> pd.DataFrame:
    """The newest row of each (mode, tiles, shape) cell of `reduce_probe`."""
    df = load_results(PROBE_BENCH, status="ok")
    return df.drop_duplicates(["mode", "block_m", "block_n", "bh", "seq", "d"], keep="last")


def probe_table() -> str:
    df = probe_rows().copy()
    df["tiles (queries x keys)"] = df.apply(lambda r: f"{r.block_m}x{r.block_n}", axis=1)
    df["how"] = df["mode"].map(PROBE_MODES)
    shown = df[["tiles (queries x keys)", "how", "gbytes", "ms", "gb_per_s"]].rename(
        columns={"gbytes": "GB of fp32", "gb_per_s": "GB/s"})
    return (markdown_table(shown, formats={"GB of fp32": ".2f", "ms": ".3f", "GB/s": ".0f"})
            + "\n\n" + provenance_line(load_results(PROBE_BENCH), f"results/{PROBE_BENCH}/nvidia-h200.jsonl"))


def probe_ms(mode: str, block_m: int, block_n: int) -> float:
    df = probe_rows()
    hit = df[(df["mode"] == mode) & (df.block_m == block_m) & (df.block_n == block_n)]
    if hit.empty:
        raise KeyError(f"no reduce_probe row for {mode} {block_m}x{block_n}")
    return float(hit.ms.iloc[0])


def host_rows() -> pd.DataFrame:
    df = load_results(HOST_BENCH, status="ok")
    return df[df.run == df.run.max()]


# Piece names as the committed run wrote them -> as host_overhead.py names them now (the run at
# 7175b5e289f7 called the TMA launch "tuned config (tma=True)"; the tuned forward has since
# switched to pointer loads, so that name would mislead).
HOST_PIECE_NAMES = {"ours: launch_fwd, tuned config (tma=True)": "ours: launch_fwd, TMA loads"}


def host_table() -> str:
    df = host_rows().assign(piece=lambda d: d.piece.replace(HOST_PIECE_NAMES))
    df = df[["piece", "host_us", "host_us_min"]].rename(
        columns={"piece": "what the host issues", "host_us": "µs per call (median)", "host_us_min": "min"})
    return (markdown_table(df, formats={"µs per call (median)": ".0f", "min": ".0f"})
            + "\n\n" + provenance_line(load_results(HOST_BENCH), f"results/{HOST_BENCH}/nvidia-h200.jsonl"))


def host_us(prefix: str) -> float:
    df = host_rows()
    hit = df[df.piece.str.startswith(prefix)]
    if hit.empty:
        raise KeyError(f"no host_overhead piece starting with {prefix!r}")
    return float(hit.host_us.iloc[0])


def tma_launch_extra_us() -> float:
    """Host µs a forward launch spends on TMA descriptors (creating them, passing them through
    Triton's launcher) over the same launch with pointer loads."""
    df = host_rows()
    tma = df[df.piece.str.contains("TMA loads|tma=True", regex=True)]
    ptr = df[df.piece == "ours: launch_fwd, pointers"]
    if tma.empty or ptr.empty:
        raise KeyError("host_overhead rows lack the TMA and pointer launches")
    return float(tma.host_us.iloc[0] - ptr.host_us.iloc[0])


def clock_samples(path: Path) -> pd.DataFrame:
    """nvidia-smi's CSV as (time UTC, SM MHz, watts)."""
    raw = pd.read_csv(path, skipinitialspace=True)
    raw.columns = [c.strip() for c in raw.columns]
    return pd.DataFrame({
        "t": pd.to_datetime(raw["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True),
        "sm_mhz": raw["clocks.current.sm [MHz]"].str.replace(" MHz", "").astype(float),
        "watts": raw["power.draw [W]"].str.replace(" W", "").astype(float),
    })


def leaderboard_clock_rows() -> pd.DataFrame:
    """For each leaderboard row of a run with sampled clocks: the SM clock and power while it was
    timed (from the previous row's write to its own; the first row's window is its 12 s of timing)."""
    from .flash_tables import IMPL_NAMES, leaderboard_rows

    out = []
    lb = leaderboard_rows()
    for path in sorted((REPO_ROOT / CLOCKS_DIR).glob("nvidia-h200-*.csv")):
        s = clock_samples(path)
        start, end = s.t.min(), s.t.max()
        rows = lb.assign(t=pd.to_datetime(lb.time_utc, utc=True)).sort_values("t")
        rows = rows[(rows.t > start) & (rows.t <= end)]
        prev = None
        for r in rows.itertuples():
            lo = prev if prev is not None else r.t - pd.Timedelta(seconds=12)
            w = s[(s.t > lo) & (s.t <= r.t)]
            busy = w[w.watts > 300]  # samples while a kernel ran (idle draws ~80-130 W)
            out.append({"run": r.run, "implementation": IMPL_NAMES[r.impl],
                        "mode": {"fwd_bwd": "forward+backward", "fwd": "forward"}[r.mode],
                        "mean ms": r.mean_ms, "SM MHz (median, busy)": busy.sm_mhz.median(),
                        "SM MHz (min)": busy.sm_mhz.min(), "W (median, busy)": busy.watts.median(),
                        "samples": len(busy), "clocks file": path.name})
            prev = r.t
    return pd.DataFrame(out)


def leaderboard_clock_table() -> str:
    rows = leaderboard_clock_rows()
    files = ", ".join(f"`{CLOCKS_DIR / name}`" for name in sorted(set(rows["clocks file"])))
    df = rows.drop(columns=["clocks file"])
    return (markdown_table(df, formats={"mean ms": ".3f", "SM MHz (median, busy)": ".0f", "SM MHz (min)": ".0f",
                                        "W (median, busy)": ".0f"})
            + f"\n\n*Samples: {files} (nvidia-smi every 250 ms); rows: `results/attention/flash_leaderboard/nvidia-h200.jsonl`.*")


from .onepass_ws import BENCH as WS_BENCH  # noqa: E402 - beside the tables that read it
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

from .flash_tables import GLUON_KINDS, _at_leaderboard_shape, _src, _tile  # noqa: E402 - the chapter's helpers


def _ws_tuning_run(kernel: str = "ws") -> pd.DataFrame:
    """The rows of the newest tuning run of a Gluon kernel ("ws": the backward, "fwd_ws": the
    forward) at the leaderboard shape."""
    tune = load_results("attention/flash_tune", status="ok")
    ws = _at_leaderboard_shape(tune[tune.kernel == kernel]) if "kernel" in tune else tune.iloc[:0]
    return ws[ws.run == ws.run.max()]


def ws_tuning_rows(kernel: str = "ws") -> pd.DataFrame:
    """One row per candidate of `_ws_tuning_run`: its first timing and (the fastest few) the median
    of its confirmation rounds."""
    ws = _ws_tuning_run(kernel)
    if ws.empty:
        return ws
    ws = ws.assign(setting=lambda d: d.config.map(lambda c: _tile(kernel, c)))
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
            + "\n\n" + provenance_line(_ws_tuning_run(kernel), _src("attention/flash_tune")))
