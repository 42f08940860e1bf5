"""The experiments behind "Going faster than cuDNN", from committed results: the dK/dV A/B runs
(`ab_dkdv`), the one-pass kernel's ablations (`ab_onepass`) and its dQ adds alone (`reduce_probe`),
the host's time per call (`host_overhead`) and the GPU clocks during the leaderboard runs
(`nvidia-smi` samples beside one run; later runs record them in their rows)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from report.flash import IMPL_NAMES, MODE_WORDS, headline_run, leaderboard_rows
from report.registry import register
from report.results import load_results, markdown_table, newest, provenance_line

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
    return newest(df, ["mode", "block_m", "block_n", "bh", "seq", "d"])


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


def host_rows(seq: int = 16384) -> pd.DataFrame:
    """The newest host_overhead run at this sequence length (16,384: the leaderboard's shape, this
    page's host table; 1,024: the grid's short cells)."""
    df = load_results(HOST_BENCH, status="ok")
    df = df[df.seq == seq]
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
            + "\n\n" + provenance_line(host_rows(), f"results/{HOST_BENCH}/nvidia-h200.jsonl"))


def host_us(prefix: str, seq: int = 16384) -> float:
    df = host_rows(seq)
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
                        "mode": MODE_WORDS[r.mode],
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




def clock_fields(run: str | None = None) -> pd.DataFrame:
    """Leaderboard rows that carry their own clock record (nvidia-smi once a second while the mean
    was timed: median and minimum SM clock, median board power), of one run (the headline run)."""
    df = leaderboard_rows()
    if "sm_mhz_median" not in df:
        return df.iloc[:0]
    df = df[df.sm_mhz_median.notna()]
    return df[df.run == (run or headline_run(leaderboard_rows()))]


def clock_fields_table(run: str | None = None) -> str:
    df = clock_fields(run).assign(implementation=lambda d: d.impl.map(IMPL_NAMES),
                                  mode=lambda d: d["mode"].map(MODE_WORDS))
    shown = df.sort_values(["mode", "mean_ms"], ascending=[False, True])[
        ["run", "git", "implementation", "mode", "mean_ms", "sm_mhz_median", "sm_mhz_min", "power_w_median"]]
    shown = shown.rename(columns={"mean_ms": "mean ms", "sm_mhz_median": "SM MHz (median)",
                                  "sm_mhz_min": "SM MHz (min)", "power_w_median": "W (median)"})
    return (markdown_table(shown, formats={"mean ms": ".3f", "SM MHz (median)": ".0f", "SM MHz (min)": ".0f",
                                           "W (median)": ".0f"})
            + "\n\n" + provenance_line(df, "results/attention/flash_leaderboard/nvidia-h200.jsonl"))


def _clock(impl: str, mode: str, col: str = "sm_mhz_median") -> float:
    c = clock_fields()
    return float(c[(c.impl == impl) & (c["mode"] == mode)][col].iloc[0])


def _equal_clock_fwd_speedup() -> float:
    """cuDNN's forward time over ours scaled to cuDNN's clock: a first-order correction."""
    ours, cudnn = _clock("ours", "fwd", "mean_ms"), _clock("cudnn", "fwd", "mean_ms")
    return cudnn / (ours * _clock("ours", "fwd") / _clock("cudnn", "fwd"))


# -- the tuner's noise: the forward's best TMA and pointer candidates in two tuning runs ----------

def tuner_noise() -> dict:
    """The first tuning run inside the sampled clock window, and the one before it (leaderboard
    shape, the forward): each one's best candidate with TMA loads and with pointer loads, and the
    clock range while the second one's kernels ran."""
    from report.flash_tuning import at_leaderboard_shape, first_timings, triton_tuning

    tune = first_timings(at_leaderboard_shape(triton_tuning()))
    tune = tune[tune.kernel == "fwd"].assign(tma=lambda d: d.config.map(lambda c: bool(c.get("tma", False))),
                                             t=lambda d: pd.to_datetime(d.time_utc, utc=True))
    samples = clock_samples(sorted((REPO_ROOT / CLOCKS_DIR).glob("*.csv"))[-1])
    runs = sorted(tune.run.unique())
    second = sorted(tune[(tune.t >= samples.t.min()) & (tune.t <= samples.t.max())].run.unique())[0]
    first = runs[runs.index(second) - 1]
    best = tune[tune.run.isin([first, second])].pivot_table(index="run", columns="tma", values="ms", aggfunc="min")
    during = tune[tune.run == second].t
    busy = samples[(samples.t >= during.min()) & (samples.t <= during.max()) & (samples.watts > 300)].sm_mhz
    git = tune.groupby("run").git.first()
    return {"first": first, "second": second, "first_git": git[first], "second_git": git[second],
            "first_tma": best.loc[first, True], "second_tma": best.loc[second, True],
            "first_ptr": best.loc[first, False], "second_ptr": best.loc[second, False],
            "mhz_min": busy.min(), "mhz_max": busy.max()}


# -- facts ----------------------------------------------------------------------------------------

TILED = (64, 64, 4, 3)  # the tuned dK/dV tiling: 64 x 64, 4 warps, 3 stages
WIDE = (64, 128, 8, 3)  # the one-pass kernel with 128-key tiles


def _add(tiles: tuple, tma: bool) -> float:
    """What adding dQ's shares costs inside the one-pass kernel: full minus no_add."""
    return onepass_ab_median("full", tiles, tma) - onepass_ab_median("no_add", tiles, tma)


def _history(git: str, col: str) -> float:
    from report.flash_tuning import history_row

    return history_row(git)[col]


def _best_two_pass() -> float:
    """The tuner's best two-pass backward at the leaderboard shape, by its confirmation medians."""
    from report.flash_tuning import confirm_medians

    c = confirm_medians()
    return min(c["two launches"], c["fused"])


def _lb_at(git: str, col: str) -> float:
    rows = leaderboard_rows().query("mode == 'fwd_bwd' and impl == 'ours'")
    return float(rows[rows.git.str.startswith(git)][col].iloc[-1])


FACTS = {
    # the dK/dV A/B run (ab_dkdv), at the tuned tiling
    "ab_fixed_ms": lambda: f'{ab_median("fixeddiag", TILED, False, True):.3f}',
    "ab_bounded_ms": lambda: f'{ab_median("rtdiag", TILED, False, True):.3f}',
    "ab_fixed_slower": lambda: f'{ab_median("fixeddiag", TILED, False, True) / ab_median("rtdiag", TILED, False, True) - 1:.0%}',
    "ab_best_ms": lambda: f'{ab_median("rtdiag", TILED, True, True):.3f}',
    "ab_old_ms": lambda: f'{ab_median("old", TILED, False, False):.3f}',
    "ab_best_gain": lambda: f'{1 - ab_median("rtdiag", TILED, True, True) / ab_median("old", TILED, False, False):.1%}',
    "ab_no_tail_gain_tma": lambda: f'{1 - ab_median("rtdiag", TILED, True, True) / ab_median("rtdiag", TILED, True, False):.1%}',
    "ab_no_tail_gain_ptr": lambda: f'{1 - ab_median("rtdiag", TILED, False, True) / ab_median("rtdiag", TILED, False, False):.1%}',
    # before the three changes (df107f5) and with the fix (fa87602): tuner and leaderboard
    **{f"fix_{when}_{name}": lambda g=g, c=c: f"{_history(g, c):.3f}"
       for when, g in (("before", "df107f5"), ("after", "fa87602"))
       for name, c in (("launch", "two passes, one launch"), ("dkdv", "dK/dV pass"), ("dq", "dQ pass"))},
    **{f"fix_{when}_lb_{name}": lambda g=g, c=c: f"{_lb_at(g, c):.3f}"
       for when, g in (("before", "df107f5"), ("after", "fa87602")) for name, c in (("ms", "mean_ms"), ("speedup", "speed_vs_cudnn"))},
    # the one-pass kernel's ablations (ab_onepass) and the adds alone (reduce_probe)
    "op_base_ms": lambda: f'{onepass_ab_median("no_dq", TILED, True):.3f}',
    "op_share_ms": lambda: f'{onepass_ab_median("no_add", TILED, True) - onepass_ab_median("no_dq", TILED, True):.2f}',
    "op_no_add_ms": lambda: f'{onepass_ab_median("no_add", TILED, True):.2f}',
    "op_add_tma_ms": lambda: f"{_add(TILED, True):.2f}",
    "op_add_ptr_ms": lambda: f"{_add(TILED, False):.2f}",
    "op_add_wide_ms": lambda: f"{_add(WIDE, True):.2f}",
    "op_dq_share_total_ms": lambda: f'{onepass_ab_median("full", TILED, True) - onepass_ab_median("no_dq", TILED, True):.2f}',
    "op_upper_bound_gain": lambda: f'{1 - onepass_ab_median("no_add", TILED, True) / _best_two_pass():.0%}',
    "op_two_pass_ms": lambda: f"{_best_two_pass():.2f}",
    "probe_gb": lambda: f'{probe_rows().query("block_m == 64 and block_n == 64").gbytes.iloc[0]:.1f}',
    "probe_tma_ms": lambda: f'{probe_ms("tma", 64, 64):.2f}',
    "probe_tma_wide_ms": lambda: f'{probe_ms("tma", 64, 128):.2f}',
    "probe_store_ms": lambda: f'{probe_ms("store", 64, 64):.2f}',
    "probe_overlap": lambda: f'{1 - _add(TILED, True) / probe_ms("tma", 64, 64):.0%}',
    "probe_overlap_wide": lambda: f'{1 - _add(WIDE, True) / probe_ms("tma", 64, 128):.0%}',
    # the host (host_overhead)
    "host_fwd_compiled_us": lambda: f'{host_us("ours: forward (torch.compile"):.0f}',
    "host_dynamo_us": lambda: f'{host_us("ours: forward (torch.compile") - host_us("ours: forward (Fn.apply"):.0f}',
    "host_cudnn_fwd_us": lambda: f'{host_us("cudnn: forward"):.0f}',
    "host_fwd_gap_us": lambda: f'{host_us("ours: forward (torch.compile") - host_us("cudnn: forward"):.0f}',
    "host_step_ms": lambda: f'{host_us("ours: forward+backward") / 1e3:.2f}',
    "host_cudnn_step_ms": lambda: f'{host_us("cudnn: forward+backward") / 1e3:.2f}',
    "host_tma_extra_us": lambda: f"{tma_launch_extra_us():.0f}",
    # the clocks recorded with the headline run's rows
    "clock_w": lambda: f'{_clock("ours", "fwd_bwd", "power_w_median"):.0f}',
    **{f"clock_{impl}_{mode}_mhz": lambda i=impl, m=mode: f"{_clock(i, m):.0f}"
       for impl in ("ours", "cudnn") for mode in ("fwd", "fwd_bwd")},
    "clock_others_min_mhz": lambda: format(clock_fields().query("impl not in ['ours', 'cudnn']").sm_mhz_median.min(), ".0f"),
    "clock_equal_fwd_speedup": lambda: f"{_equal_clock_fwd_speedup():.2f}",
    # the tuner's noise
    **{f"noise_{k}": lambda k=k, f=f: format(tuner_noise()[k], f) for k, f in (
        ("first", "s"), ("second", "s"), ("first_git", "s"), ("second_git", "s"), ("first_tma", ".3f"),
        ("second_tma", ".3f"), ("first_ptr", ".3f"), ("second_ptr", ".3f"), ("mhz_min", ".0f"), ("mhz_max", ".0f"))},
}


def _adds_cost_more_than_the_dq_pass() -> bool:
    """Computing and adding dQ's shares inside one pass costs more than the whole dQ pass; 128-key
    tiles (half the shares) do not make the add cheaper; atomics cost more than bulk reductions."""
    from report.flash_tuning import ONEPASS_TMA, newest_with

    total = onepass_ab_median("full", TILED, True) - onepass_ab_median("no_dq", TILED, True)
    return (total > newest_with(ONEPASS_TMA)["dQ pass"] and _add(WIDE, True) >= _add(TILED, True)
            and _add(TILED, False) > _add(TILED, True))


def _host_runs_ahead() -> bool:
    from report.flash import lb

    return (host_us("ours: forward+backward") / 1e3 < lb("ours", "fwd_bwd") and lb("ours", "fwd") <= lb("cudnn", "fwd")
            and host_us("ours: forward (torch.compile") > host_us("cudnn: forward") and tma_launch_extra_us() > 0)


def _lower_clock_at_the_power_limit() -> bool:
    others = clock_fields().query("impl not in ['ours', 'cudnn']").sm_mhz_median
    return (all(_clock("ours", m) < _clock("cudnn", m) for m in ("fwd", "fwd_bwd"))
            and others.min() >= max(_clock("cudnn", "fwd"), _clock("cudnn", "fwd_bwd")))


def _probe_traffic_costs() -> bool:
    """Plain stores of the same bytes take over half the rest of the kernel's time; the adds overlap
    the kernel partly (a fraction between 0 and 1), less with wide tiles."""
    o = 1 - _add(TILED, True) / probe_ms("tma", 64, 64)
    wide = 1 - _add(WIDE, True) / probe_ms("tma", 64, 128)
    return probe_ms("store", 64, 64) > 0.5 * onepass_ab_median("no_add", TILED, True) and 0 < wide < o < 1


register("flash", facts=FACTS, tables={
    "ab": ab_table, "onepass_ab": onepass_ab_table, "probe": probe_table, "host": host_table,
    "clock_fields": clock_fields_table, "leaderboard_clocks": leaderboard_clock_table,
}, claims={
    "fixed_trip_count_was_the_regression": lambda: ab_median("fixeddiag", TILED, False, True) > ab_median("rtdiag", TILED, False, True),
    "tma_and_no_tail_beat_the_old_file": lambda: ab_median("rtdiag", TILED, True, True)
    < min(ab_median("old", TILED, False, False), ab_median("rtdiag", TILED, True, False)),
    # under 1% either way: below the rounds' spread
    "tail_matters_only_with_tma": lambda: abs(ab_median("rtdiag", TILED, False, True) / ab_median("rtdiag", TILED, False, False) - 1) < 0.01,
    "fix_gained_more_in_the_dq_pass": lambda: _history("fa87602", "dQ pass") / _history("df107f5", "dQ pass")
    < _history("fa87602", "dK/dV pass") / _history("df107f5", "dK/dV pass") < 1
    and _lb_at("fa87602", "mean_ms") < _lb_at("df107f5", "mean_ms"),
    "adds_cost_more_than_the_dq_pass": _adds_cost_more_than_the_dq_pass,
    "probe_traffic_is_a_cost_of_its_own": _probe_traffic_costs,
    "host_runs_ahead_of_the_gpu": _host_runs_ahead,
    "lower_clock_at_the_power_limit": _lower_clock_at_the_power_limit,
    "tuner_candidates_swapped_places": lambda: (lambda n: (n["first_tma"] < n["first_ptr"]) != (n["second_tma"] < n["second_ptr"]))(tuner_noise()),
    "one_pass_upper_bound_is_a_gain": lambda: onepass_ab_median("no_add", TILED, True) < _best_two_pass(),
})
