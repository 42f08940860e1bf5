"""The experiments behind "Going faster than cuDNN", from committed results: the dK/dV A/B runs
(`ab_dkdv`), the one-pass kernel's ablations (`ab_onepass`) and its dQ adds alone (`reduce_probe`),
the host's time per call (`host_overhead`) and the GPU clocks during the leaderboard runs
(`nvidia-smi` samples beside one run; later runs record them in their rows)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from report import flash, flash_tuning
from report.flash import first_value, in_words, leaderboard_rows, round_stats, where
from report.registry import register
from report.results import load_results, markdown_table, newest, with_source

AB_BENCH = "attention/dkdv_ab"
ONEPASS_AB_BENCH = "attention/onepass_ab"
PROBE_BENCH = "attention/reduce_probe"
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
ONEPASS_VERSIONS = {  # ab_onepass.VARIANTS, in the order they add work
    "no_dq": "dK, dV only (no dQ matmul, no add)",
    "no_add": "+ dQ's share computed (dS K), not added",
    "full": "+ the share added into dQ (the kernel)",
    "dp_first": "the kernel with dP issued before the exponentials",
}
PROBE_MODES = {"atomics": "per-thread atomics", "tma": "TMA bulk reductions", "store": "plain stores (no sum)"}
TILED = (64, 64, 4, 3)  # the tuned dK/dV tiling: 64 x 64, 4 warps, 3 stages
WIDE = (64, 128, 8, 3)  # the one-pass kernel with 128-key tiles


def _tiling(tiles: tuple[int, int, int, int]) -> dict:
    """(block_m1, block_n1, num_warps1, num_stages1) as the rows' columns."""
    return dict(zip(("block_m1", "block_n1", "num_warps1", "num_stages1"), tiles))


def ab_rows() -> pd.DataFrame:
    """Median and spread over the interleaved rounds, one row per (version, tiling, loads, tail)."""
    keys = ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma", "no_tail"]
    return round_stats(load_results(AB_BENCH, status="ok"), keys).sort_values("median_ms")


def ab_table() -> str:
    g = ab_rows()
    shown = pd.DataFrame({
        "version": g["variant"].map(AB_VERSIONS).fillna(g["variant"]),
        "tiles (queries x keys), warps, stages": [f"{r.block_m1}x{r.block_n1}, {r.num_warps1} w, {r.num_stages1} st"
                                                  for r in g.itertuples()],
        "loads": g["tma"].map({True: "TMA", False: "pointers"}),
        "ragged-tail loop": g["no_tail"].map({True: "not compiled", False: "compiled"}),
        "median ms": g.median_ms, "min ms": g.min_ms, "max ms": g.max_ms, "rounds": g.rounds})
    return with_source(shown, AB_BENCH, formats=dict.fromkeys(["median ms", "min ms", "max ms"], ".3f"))


def ab_median(variant: str, tiles: tuple[int, int, int, int], tma: bool, no_tail: bool) -> float:
    hit = where(ab_rows(), variant=variant, **_tiling(tiles), tma=tma, no_tail=no_tail)
    return first_value(hit, "median_ms", f"no A/B row for {variant} {tiles} tma={tma} no_tail={no_tail}")


def onepass_ab_rows() -> pd.DataFrame:
    """Median over the interleaved rounds of the latest ablation run, one row per (version, tiling, loads)."""
    df = load_results(ONEPASS_AB_BENCH, status="ok")
    return round_stats(df[df.run == df.run.max()], ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma"])


def onepass_ab_table() -> str:
    """Rows per tiling and loads, versions in the order they add work; `step ms` is each version's
    median minus the previous one's in the chain no_dq -> no_add -> full (what that piece costs)."""
    g = onepass_ab_rows()
    g = g.assign(rank=g.variant.map(list(ONEPASS_VERSIONS).index)).sort_values(
        ["tma", "block_n1", "rank"], ascending=[False, True, True])
    tiling = ["tma", "block_n1", "block_m1", "num_warps1", "num_stages1"]
    g = pd.concat(part for _, part in g.groupby(tiling, sort=False))
    chain = g[g.variant != "dp_first"]
    g = g.assign(step=chain.groupby(tiling, sort=False).median_ms.diff())
    shown = pd.DataFrame({
        "tiles (keys x queries), warps, stages": [f"{r.block_n1}x{r.block_m1}, {r.num_warps1} w, {r.num_stages1} st"
                                                  for r in g.itertuples()],
        "loads, dQ add": g["tma"].map({True: "TMA, bulk reduction", False: "pointers, atomics"}),
        "version": g["variant"].map(ONEPASS_VERSIONS), "median ms": g.median_ms, "step ms": g.step, "rounds": g.rounds})
    return with_source(shown.astype(object).where(shown.notna(), ""), ONEPASS_AB_BENCH,
                       load_results(ONEPASS_AB_BENCH), formats={"median ms": ".3f", "step ms": "+.3f"})


def onepass_ab_median(variant: str, tiles: tuple[int, int, int, int], tma: bool) -> float:
    return first_value(where(onepass_ab_rows(), variant=variant, **_tiling(tiles), tma=tma), "median_ms",
                       f"no one-pass ablation row for {variant} {tiles} tma={tma}")


def add_ms(tiles: tuple, tma: bool) -> float:
    """What adding dQ's shares costs inside the one-pass kernel: full minus no_add."""
    return onepass_ab_median("full", tiles, tma) - onepass_ab_median("no_add", tiles, tma)


def probe_rows() -> pd.DataFrame:
    """The newest row of each (mode, tiles, shape) cell of `reduce_probe`."""
    return newest(load_results(PROBE_BENCH, status="ok"), ["mode", "block_m", "block_n", "bh", "seq", "d"])


def probe_table() -> str:
    df = probe_rows()
    shown = pd.DataFrame({"tiles (queries x keys)": [f"{m}x{n}" for m, n in zip(df.block_m, df.block_n)],
                          "how": df["mode"].map(PROBE_MODES), "GB of fp32": df.gbytes, "ms": df.ms, "GB/s": df.gb_per_s})
    return with_source(shown, PROBE_BENCH, formats={"GB of fp32": ".2f", "ms": ".3f", "GB/s": ".0f"})


def probe_ms(mode: str, block_m: int, block_n: int) -> float:
    return first_value(where(probe_rows(), mode=mode, block_m=block_m, block_n=block_n), "ms",
                       f"no reduce_probe row for {mode} {block_m}x{block_n}")


def overlap(tiles: tuple, block_n: int) -> float:
    """The fraction of the adds' own time (the probe's TMA reductions) the one-pass kernel hides."""
    return 1 - add_ms(tiles, True) / probe_ms("tma", 64, block_n)


# Piece names as the committed run wrote them -> as host_overhead.py names them now (the run at
# 7175b5e289f7 called the TMA launch "tuned config (tma=True)"; the tuned forward has since
# switched to pointer loads, so that name would mislead).
HOST_PIECE_NAMES = {"ours: launch_fwd, tuned config (tma=True)": "ours: launch_fwd, TMA loads"}


def host_rows() -> pd.DataFrame:
    """The newest host_overhead run at the leaderboard's shape (16,384), its pieces named as now."""
    df = where(load_results(HOST_BENCH, status="ok"), seq=16384)
    return df[df.run == df.run.max()].assign(piece=lambda d: d.piece.replace(HOST_PIECE_NAMES))


def host_table() -> str:
    df = host_rows()
    shown = df[["piece", "host_us", "host_us_min"]].rename(
        columns={"piece": "what the host issues", "host_us": "µs per call (median)", "host_us_min": "min"})
    return with_source(shown, HOST_BENCH, df, formats={"µs per call (median)": ".0f", "min": ".0f"})


def host_us(prefix: str) -> float:
    df = host_rows()
    return first_value(df[df.piece.str.startswith(prefix)], "host_us", f"no host_overhead piece starting with {prefix!r}")


def tma_launch_extra_us() -> float:
    """Host µs a forward launch spends on TMA descriptors (creating them, passing them through
    Triton's launcher) over the same launch with pointer loads."""
    return host_us("ours: launch_fwd, TMA loads") - host_us("ours: launch_fwd, pointers")


def clock_samples(path: Path) -> pd.DataFrame:
    """nvidia-smi's CSV as (time UTC, SM MHz, watts)."""
    raw = pd.read_csv(path, skipinitialspace=True)
    raw.columns = [c.strip() for c in raw.columns]
    return pd.DataFrame({
        "t": pd.to_datetime(raw["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True),
        "sm_mhz": raw["clocks.current.sm [MHz]"].str.replace(" MHz", "").astype(float),
        "watts": raw["power.draw [W]"].str.replace(" W", "").astype(float),
    })


def busy(samples: pd.DataFrame) -> pd.DataFrame:
    return samples[samples.watts > 300]  # samples while a kernel ran (idle draws ~80-130 W)


def leaderboard_clock_rows() -> pd.DataFrame:
    """For each leaderboard row of a run with sampled clocks: the SM clock and power while it was
    timed (from the previous row's write to its own; the first row's window is its 12 s of timing)."""
    out = []
    lb = leaderboard_rows()
    for path in sorted((REPO_ROOT / CLOCKS_DIR).glob("nvidia-h200-*.csv")):
        s = clock_samples(path)
        rows = lb.assign(t=pd.to_datetime(lb.time_utc, utc=True)).sort_values("t")
        rows = rows[(rows.t > s.t.min()) & (rows.t <= s.t.max())]
        starts = rows.t.shift(1).fillna(rows.t - pd.Timedelta(seconds=12))
        for r, start in zip(rows.itertuples(), starts):
            w = busy(s[(s.t > start) & (s.t <= r.t)])
            out.append({"run": r.run, "implementation": flash.IMPL_NAMES[r.impl], "mode": flash.MODE_WORDS[r.mode],
                        "mean ms": r.mean_ms, "SM MHz (median, busy)": w.sm_mhz.median(),
                        "SM MHz (min)": w.sm_mhz.min(), "W (median, busy)": w.watts.median(),
                        "samples": len(w), "clocks file": path.name})
    return pd.DataFrame(out)


def leaderboard_clock_table() -> str:
    rows = leaderboard_clock_rows()
    files = ", ".join(f"`{CLOCKS_DIR / name}`" for name in sorted(set(rows["clocks file"])))
    return (markdown_table(rows.drop(columns=["clocks file"]), formats={
        "mean ms": ".3f", "SM MHz (median, busy)": ".0f", "SM MHz (min)": ".0f", "W (median, busy)": ".0f"})
            + f"\n\n*Samples: {files} (nvidia-smi every 250 ms); rows: `results/attention/flash_leaderboard/nvidia-h200.jsonl`.*")


def clock_fields() -> pd.DataFrame:
    """The headline run's rows, which carry their own clock record (nvidia-smi once a second while the
    mean was timed: median and minimum SM clock, median board power)."""
    rows = flash.headline_rows()
    return rows[rows.sm_mhz_median.notna()]


def clock_fields_table() -> str:
    df = in_words(clock_fields())
    shown = df[["run", "git", "implementation", "mode", "mean_ms", "sm_mhz_median", "sm_mhz_min", "power_w_median"]].rename(
        columns={"mean_ms": "mean ms", "sm_mhz_median": "SM MHz (median)", "sm_mhz_min": "SM MHz (min)",
                 "power_w_median": "W (median)"})
    return with_source(shown, "attention/flash_leaderboard", df, formats={
        "mean ms": ".3f", "SM MHz (median)": ".0f", "SM MHz (min)": ".0f", "W (median)": ".0f"})


def clock(impl: str, mode: str, col: str = "sm_mhz_median") -> float:
    return float(where(clock_fields(), impl=impl, mode=mode)[col].iloc[0])


def others_min_mhz() -> float:
    """The lowest median SM clock among the implementations other than ours and cuDNN."""
    return clock_fields().query("impl not in ['ours', 'cudnn']").sm_mhz_median.min()


def equal_clock_fwd_speedup() -> float:
    """cuDNN's forward time over ours scaled to cuDNN's clock: a first-order correction."""
    ours, cudnn = clock("ours", "fwd", "mean_ms"), clock("cudnn", "fwd", "mean_ms")
    return cudnn / (ours * clock("ours", "fwd") / clock("cudnn", "fwd"))


def tuner_noise() -> dict:
    """The tuner's noise: the first tuning run inside the sampled clock window, and the one before it
    (leaderboard shape, the forward): each one's best candidate with TMA loads and with pointer loads,
    and the clock range while the second one's kernels ran."""
    tune = flash_tuning.first_timings(flash_tuning.at_leaderboard_shape(flash_tuning.triton_tuning()))
    tune = tune[tune.kernel == "fwd"].assign(tma=lambda d: d.config.map(lambda c: bool(c.get("tma", False))),
                                             t=lambda d: pd.to_datetime(d.time_utc, utc=True))
    samples = clock_samples(sorted((REPO_ROOT / CLOCKS_DIR).glob("*.csv"))[-1])
    runs = sorted(tune.run.unique())
    second = sorted(tune[(tune.t >= samples.t.min()) & (tune.t <= samples.t.max())].run.unique())[0]
    first = runs[runs.index(second) - 1]
    best = tune[tune.run.isin([first, second])].pivot_table(index="run", columns="tma", values="ms", aggfunc="min")
    during = tune[tune.run == second].t
    mhz = busy(samples[(samples.t >= during.min()) & (samples.t <= during.max())]).sm_mhz
    git = tune.groupby("run").git.first()
    return {"first": first, "second": second, "first_git": git[first], "second_git": git[second],
            "first_tma": best.loc[first, True], "second_tma": best.loc[second, True],
            "first_ptr": best.loc[first, False], "second_ptr": best.loc[second, False],
            "mhz_min": mhz.min(), "mhz_max": mhz.max()}


# -- facts ----------------------------------------------------------------------------------------

def _history(git: str, col: str) -> float:
    return flash_tuning.history_row(git)[col]


def _best_two_pass() -> float:
    """The tuner's best two-pass backward at the leaderboard shape, by its confirmation medians."""
    c = flash_tuning.confirm_medians()
    return min(c["two launches"], c["fused"])


def _lb_at(git: str, col: str) -> float:
    rows = leaderboard_rows().query("mode == 'fwd_bwd' and impl == 'ours'")
    return float(rows[rows.git.str.startswith(git)][col].iloc[-1])


def _ab(variant: str, tma: bool, no_tail: bool) -> float:
    """An A/B version's median at the tuned tiling."""
    return ab_median(variant, TILED, tma, no_tail)


def _dq_total_ms() -> float:
    """dQ's share computed and added inside the one pass: full minus no_dq."""
    return onepass_ab_median("full", TILED, True) - onepass_ab_median("no_dq", TILED, True)


FACTS = {
    # the dK/dV A/B run (ab_dkdv), at the tuned tiling
    "ab_fixed_ms": lambda: f'{_ab("fixeddiag", False, True):.3f}',
    "ab_bounded_ms": lambda: f'{_ab("rtdiag", False, True):.3f}',
    "ab_fixed_slower": lambda: f'{_ab("fixeddiag", False, True) / _ab("rtdiag", False, True) - 1:.0%}',
    "ab_best_ms": lambda: f'{_ab("rtdiag", True, True):.3f}',
    "ab_old_ms": lambda: f'{_ab("old", False, False):.3f}',
    "ab_best_gain": lambda: f'{1 - _ab("rtdiag", True, True) / _ab("old", False, False):.1%}',
    "ab_no_tail_gain_tma": lambda: f'{1 - _ab("rtdiag", True, True) / _ab("rtdiag", True, False):.1%}',
    "ab_no_tail_gain_ptr": lambda: f'{1 - _ab("rtdiag", False, True) / _ab("rtdiag", False, False):.1%}',
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
    "op_add_tma_ms": lambda: f"{add_ms(TILED, True):.2f}",
    "op_add_ptr_ms": lambda: f"{add_ms(TILED, False):.2f}",
    "op_add_wide_ms": lambda: f"{add_ms(WIDE, True):.2f}",
    "op_dq_share_total_ms": lambda: f"{_dq_total_ms():.2f}",
    "op_upper_bound_gain": lambda: f'{1 - onepass_ab_median("no_add", TILED, True) / _best_two_pass():.0%}',
    "op_two_pass_ms": lambda: f"{_best_two_pass():.2f}",
    "probe_gb": lambda: f'{probe_rows().query("block_m == 64 and block_n == 64").gbytes.iloc[0]:.1f}',
    "probe_tma_ms": lambda: f'{probe_ms("tma", 64, 64):.2f}',
    "probe_tma_wide_ms": lambda: f'{probe_ms("tma", 64, 128):.2f}',
    "probe_store_ms": lambda: f'{probe_ms("store", 64, 64):.2f}',
    "probe_overlap": lambda: f"{overlap(TILED, 64):.0%}",
    "probe_overlap_wide": lambda: f"{overlap(WIDE, 128):.0%}",
    # the host (host_overhead)
    "host_fwd_compiled_us": lambda: f'{host_us("ours: forward (torch.compile"):.0f}',
    "host_dynamo_us": lambda: f'{host_us("ours: forward (torch.compile") - host_us("ours: forward (Fn.apply"):.0f}',
    "host_cudnn_fwd_us": lambda: f'{host_us("cudnn: forward"):.0f}',
    "host_fwd_gap_us": lambda: f'{host_us("ours: forward (torch.compile") - host_us("cudnn: forward"):.0f}',
    "host_step_ms": lambda: f'{host_us("ours: forward+backward") / 1e3:.2f}',
    "host_cudnn_step_ms": lambda: f'{host_us("cudnn: forward+backward") / 1e3:.2f}',
    "host_tma_extra_us": lambda: f"{tma_launch_extra_us():.0f}",
    # the clocks recorded with the headline run's rows
    "clock_w": lambda: f'{clock("ours", "fwd_bwd", "power_w_median"):.0f}',
    **{f"clock_{impl}_{mode}_mhz": lambda i=impl, m=mode: f"{clock(i, m):.0f}"
       for impl in ("ours", "cudnn") for mode in ("fwd", "fwd_bwd")},
    "clock_others_min_mhz": lambda: f"{others_min_mhz():.0f}",
    "clock_equal_fwd_speedup": lambda: f"{equal_clock_fwd_speedup():.2f}",
    # the tuner's noise
    **{f"noise_{k}": lambda k=k, f=f: format(tuner_noise()[k], f) for k, f in (
        ("first", "s"), ("second", "s"), ("first_git", "s"), ("second_git", "s"), ("first_tma", ".3f"),
        ("second_tma", ".3f"), ("first_ptr", ".3f"), ("second_ptr", ".3f"), ("mhz_min", ".0f"), ("mhz_max", ".0f"))},
}


def _adds_cost_more_than_the_dq_pass() -> bool:
    """Computing and adding dQ's shares inside one pass costs more than the whole dQ pass; 128-key
    tiles (half the shares) do not make the add cheaper; atomics cost more than bulk reductions."""
    dq_pass = flash_tuning.newest_with(flash_tuning.ONEPASS_TMA)["dQ pass"]
    return _dq_total_ms() > dq_pass and add_ms(WIDE, True) >= add_ms(TILED, True) and add_ms(TILED, False) > add_ms(TILED, True)


def _host_runs_ahead() -> bool:
    lb = flash.lb
    return (host_us("ours: forward+backward") / 1e3 < lb("ours", "fwd_bwd") and lb("ours", "fwd") <= lb("cudnn", "fwd")
            and host_us("ours: forward (torch.compile") > host_us("cudnn: forward") and tma_launch_extra_us() > 0)


def _tuner_candidates_swapped_places() -> bool:
    n = tuner_noise()
    return (n["first_tma"] < n["first_ptr"]) != (n["second_tma"] < n["second_ptr"])


register("flash", facts=FACTS, tables={
    "ab": ab_table, "onepass_ab": onepass_ab_table, "probe": probe_table, "host": host_table,
    "clock_fields": clock_fields_table, "leaderboard_clocks": leaderboard_clock_table,
}, claims={
    "fixed_trip_count_was_the_regression": lambda: _ab("fixeddiag", False, True) > _ab("rtdiag", False, True),
    "tma_and_no_tail_beat_the_old_file": lambda: _ab("rtdiag", True, True) < min(_ab("old", False, False), _ab("rtdiag", True, False)),
    # under 1% either way: below the rounds' spread
    "tail_matters_only_with_tma": lambda: abs(_ab("rtdiag", False, True) / _ab("rtdiag", False, False) - 1) < 0.01,
    "fix_gained_more_in_the_dq_pass": lambda: _history("fa87602", "dQ pass") / _history("df107f5", "dQ pass")
    < _history("fa87602", "dK/dV pass") / _history("df107f5", "dK/dV pass") < 1
    and _lb_at("fa87602", "mean_ms") < _lb_at("df107f5", "mean_ms"),
    "adds_cost_more_than_the_dq_pass": _adds_cost_more_than_the_dq_pass,
    # plain stores of the same bytes take over half the rest of the kernel's time; the adds overlap
    # the kernel partly (a fraction between 0 and 1), less with wide tiles
    "probe_traffic_is_a_cost_of_its_own": lambda: probe_ms("store", 64, 64) > 0.5 * onepass_ab_median("no_add", TILED, True)
    and 0 < overlap(WIDE, 128) < overlap(TILED, 64) < 1,
    "host_runs_ahead_of_the_gpu": _host_runs_ahead,
    "lower_clock_at_the_power_limit": lambda: all(clock("ours", m) < clock("cudnn", m) for m in ("fwd", "fwd_bwd"))
    and others_min_mhz() >= max(clock("cudnn", "fwd"), clock("cudnn", "fwd_bwd")),
    "tuner_candidates_swapped_places": _tuner_candidates_swapped_places,
    "one_pass_upper_bound_is_a_gain": lambda: onepass_ab_median("no_add", TILED, True) < _best_two_pass(),
})
