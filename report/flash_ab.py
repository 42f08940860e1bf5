"""The experiments behind "Going faster than cuDNN": dK/dV A/B runs, the one-pass kernel's ablations and its
dQ adds alone, the host's time per call and the GPU clocks during the leaderboard runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.bench.store import REPO_ROOT
from report import flash, flash_tuning
from report.flash import first_value, in_words, leaderboard_rows, round_stats, where
from report.registry import register
from report.results import load_results, markdown_table, newest, source, with_source

AB_BENCH = "attention/dkdv_ab"
ONEPASS_AB_BENCH = "attention/onepass_ab"
PROBE_BENCH = "attention/reduce_probe"
HOST_BENCH = "attention/host_overhead"
CLOCKS_DIR = Path("results/attention/clocks")  # nvidia-h200-<start UTC>.csv, one per sampled run
# What each A/B version was (`rtdiag`: the file at d0f7cc500f96, diagonal loop ending at min(its end, n_queries)).
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
TILED = dict(block_m1=64, block_n1=64, num_warps1=4, num_stages1=3)  # the tuned dK/dV tiling
WIDE = dict(block_m1=64, block_n1=128, num_warps1=8, num_stages1=3)  # the one-pass kernel with 128-key tiles


def _tiles_words(g: pd.DataFrame, first: str, second: str) -> list[str]:
    return [f"{a}x{b}, {w} w, {st} st" for a, b, w, st in zip(g[first], g[second], g.num_warps1, g.num_stages1)]


def ab_rows() -> pd.DataFrame:
    keys = ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma", "no_tail"]
    return round_stats(load_results(AB_BENCH, status="ok"), keys).sort_values("median_ms")


def ab_table() -> str:
    g = ab_rows()
    shown = pd.DataFrame({
        "version": g["variant"].map(AB_VERSIONS).fillna(g["variant"]),
        "tiles (queries x keys), warps, stages": _tiles_words(g, "block_m1", "block_n1"),
        "loads": g["tma"].map({True: "TMA", False: "pointers"}),
        "ragged-tail loop": g["no_tail"].map({True: "not compiled", False: "compiled"}),
        "median ms": g.median_ms, "min ms": g.min_ms, "max ms": g.max_ms, "rounds": g.rounds})
    return with_source(shown, AB_BENCH, formats=dict.fromkeys(["median ms", "min ms", "max ms"], ".3f"))


def ab_median(variant: str, tma: bool, no_tail: bool) -> float:
    return first_value(where(ab_rows(), variant=variant, **TILED, tma=tma, no_tail=no_tail), "median_ms",
                       f"no A/B row for {variant} tma={tma} no_tail={no_tail}")


def onepass_ab_rows() -> pd.DataFrame:
    df = load_results(ONEPASS_AB_BENCH, status="ok")
    keys = ["run", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma"]
    return round_stats(df[df.run == df.run.max()], keys)


def onepass_ab_table() -> str:
    """Rows per tiling and loads (TMA first), versions in the order they add work; `step ms` is each
    version's median minus the previous one's in the chain no_dq -> no_add -> full (what that piece costs)."""
    tiling = ["tma", "block_n1", "block_m1", "num_warps1", "num_stages1"]
    g = onepass_ab_rows().assign(rank=lambda d: d.variant.map(list(ONEPASS_VERSIONS).index))
    g = g.sort_values([*tiling, "rank"], ascending=[False, True, True, True, True, True])
    g = g.assign(step=g[g.variant != "dp_first"].groupby(tiling).median_ms.diff())
    shown = pd.DataFrame({
        "tiles (keys x queries), warps, stages": _tiles_words(g, "block_n1", "block_m1"),
        "loads, dQ add": g["tma"].map({True: "TMA, bulk reduction", False: "pointers, atomics"}),
        "version": g["variant"].map(ONEPASS_VERSIONS), "median ms": g.median_ms, "step ms": g.step, "rounds": g.rounds})
    return with_source(shown.astype(object).where(shown.notna(), ""), ONEPASS_AB_BENCH,
                       load_results(ONEPASS_AB_BENCH), formats={"median ms": ".3f", "step ms": "+.3f"})


def onepass_ab_median(variant: str, tiles: dict = TILED, tma: bool = True) -> float:
    return first_value(where(onepass_ab_rows(), variant=variant, **tiles, tma=tma), "median_ms",
                       f"no one-pass ablation row for {variant} {tiles} tma={tma}")


def add_ms(tiles: dict = TILED, tma: bool = True) -> float:
    """What adding dQ's shares costs inside the one-pass kernel: full minus no_add."""
    return onepass_ab_median("full", tiles, tma) - onepass_ab_median("no_add", tiles, tma)


def probe_rows() -> pd.DataFrame:
    return newest(load_results(PROBE_BENCH, status="ok"), ["mode", "block_m", "block_n", "bh", "seq", "d"])


def probe_table() -> str:
    df = probe_rows()
    shown = pd.DataFrame({"tiles (queries x keys)": [f"{m}x{n}" for m, n in zip(df.block_m, df.block_n)],
                          "how": df["mode"].map(PROBE_MODES), "GB of fp32": df.gbytes, "ms": df.ms,
                          "GB/s": df.gb_per_s})
    return with_source(shown, PROBE_BENCH, formats={"GB of fp32": ".2f", "ms": ".3f", "GB/s": ".0f"})


def probe_ms(mode: str, block_n: int = 64) -> float:
    """The adds alone, 64-query tiles by `block_n` keys."""
    return first_value(where(probe_rows(), mode=mode, block_m=64, block_n=block_n), "ms",
                       f"no reduce_probe row for {mode} 64x{block_n}")


def overlap(tiles: dict) -> float:
    """The fraction of the adds' own time (the probe's TMA reductions) the one-pass kernel hides."""
    return 1 - add_ms(tiles) / probe_ms("tma", tiles["block_n1"])


def host_rows() -> pd.DataFrame:
    df = where(load_results(HOST_BENCH, status="ok"), seq=16384)
    return df[df.run == df.run.max()]


def host_table() -> str:
    df = host_rows()
    shown = df[["piece", "host_us", "host_us_min"]].rename(
        columns={"piece": "what the host issues", "host_us": "µs per call (median)", "host_us_min": "min"})
    return with_source(shown, HOST_BENCH, df, formats={"µs per call (median)": ".0f", "min": ".0f"})


def host_us(prefix: str) -> float:
    df = host_rows()
    return first_value(df[df.piece.str.startswith(prefix)], "host_us",
                       f"no host_overhead piece starting with {prefix!r}")


def clock_samples(path: Path) -> pd.DataFrame:
    """nvidia-smi's CSV as (time UTC, SM MHz, watts)."""
    raw = pd.read_csv(path, skipinitialspace=True).rename(columns=str.strip)
    return pd.DataFrame({"t": pd.to_datetime(raw["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True),
                         "sm_mhz": raw["clocks.current.sm [MHz]"].str.removesuffix(" MHz").astype(float),
                         "watts": raw["power.draw [W]"].str.removesuffix(" W").astype(float)})


def leaderboard_clock_rows() -> pd.DataFrame:
    """For each leaderboard row of a run with sampled clocks: the SM clock and power while it was
    timed (from the previous row's write to its own; the first row's window is its 12 s of timing)."""
    lb = leaderboard_rows()
    lb = lb.assign(t=pd.to_datetime(lb.time_utc, utc=True)).sort_values("t")
    out = []
    for path in sorted((REPO_ROOT / CLOCKS_DIR).glob("nvidia-h200-*.csv")):
        s = clock_samples(path)
        rows = lb[(lb.t > s.t.min()) & (lb.t <= s.t.max())]
        for r, start in zip(rows.itertuples(), rows.t.shift(1).fillna(rows.t - pd.Timedelta(seconds=12))):
            w = s[(s.t > start) & (s.t <= r.t) & (s.watts > 300)]  # while a kernel ran (idle draws ~80-130 W)
            out.append({"run": r.run, "implementation": flash.IMPL_NAMES[r.impl], "mode": flash.MODE_WORDS[r.mode],
                        "mean ms": r.mean_ms, "SM MHz (median, busy)": w.sm_mhz.median(),
                        "SM MHz (min)": w.sm_mhz.min(), "W (median, busy)": w.watts.median(),
                        "samples": len(w), "clocks file": path.name})
    return pd.DataFrame(out)


def leaderboard_clock_table() -> str:
    rows = leaderboard_clock_rows()
    files = ", ".join(f"`{CLOCKS_DIR / name}`" for name in sorted(set(rows["clocks file"])))
    formats = {"mean ms": ".3f", **dict.fromkeys(["SM MHz (median, busy)", "SM MHz (min)", "W (median, busy)"], ".0f")}
    return (markdown_table(rows.drop(columns=["clocks file"]), formats=formats)
            + f"\n\n*Samples: {files} (nvidia-smi every 250 ms); rows: `{source(flash.LB_BENCH)}`.*")


def clock_fields() -> pd.DataFrame:
    """The headline run's rows that carry their own clock record (nvidia-smi once a second while timed)."""
    rows = flash.headline_rows()
    return rows[rows.sm_mhz_median.notna()]


def clock_fields_table() -> str:
    df = in_words(clock_fields())
    mhz_w = {"sm_mhz_median": "SM MHz (median)", "sm_mhz_min": "SM MHz (min)", "power_w_median": "W (median)"}
    shown = df[["run", "git", "implementation", "mode", "mean_ms", *mhz_w]].rename(
        columns={"mean_ms": "mean ms", **mhz_w})
    return with_source(shown, flash.LB_BENCH, df, formats={"mean ms": ".3f", **dict.fromkeys(mhz_w.values(), ".0f")})


def clock(impl: str, mode: str, col: str = "sm_mhz_median") -> float:
    return float(where(clock_fields(), impl=impl, mode=mode)[col].iloc[0])


# -- facts ----------------------------------------------------------------------------------------

_two_pass_ms = lambda: flash_tuning.confirm_medians()["two-pass"]  # the tuner's best two-pass backward
COMPILED_FWD = "ours: forward (torch.compile"  # the host_overhead pieces the page compares
FACTS = {
    "ab_fixed_slower": lambda: f'{ab_median("fixeddiag", False, True) / ab_median("rtdiag", False, True) - 1:.0%}',
    "ab_best_gain": lambda: f'{1 - ab_median("rtdiag", True, True) / ab_median("old", False, False):.1%}',
    "ab_no_tail_gain_tma": lambda: f'{1 - ab_median("rtdiag", True, True) / ab_median("rtdiag", True, False):.1%}',
    "op_upper_bound_gain": lambda: f'{1 - onepass_ab_median("no_add") / _two_pass_ms():.0%}',
    "probe_overlap": lambda: f"{overlap(TILED):.0%}",
    "probe_overlap_wide": lambda: f"{overlap(WIDE):.0%}",
    "host_fwd_gap_us": lambda: f'{host_us(COMPILED_FWD) - host_us("cudnn: forward"):.0f}',
}


def _adds_cost_more_than_the_dq_pass() -> bool:
    """dQ's share and its add cost more than the dQ pass; 128-key tiles make the add no cheaper, atomics dearer."""
    return (onepass_ab_median("full") - onepass_ab_median("no_dq") > flash_tuning.tma_onepass_run()["dQ pass"]
            and add_ms(WIDE) >= add_ms() and add_ms(TILED, False) > add_ms())


def _fix_gained_more_in_the_dq_pass() -> bool:
    """Both passes got faster with the fix (fa87602 against df107f5), the dQ pass more."""
    dkdv, dq = flash_tuning.pass_ratios("fa87602", "df107f5")
    return dq < dkdv < 1


def _host_runs_ahead() -> bool:
    """Our forward costs the host more than cuDNN's, most of it dynamo's, and TMA adds to a launch; yet a step's
    host time is below its GPU time, and our forward leads cuDNN's on the GPU."""
    lb, compiled = flash.lb, host_us(COMPILED_FWD)
    return (host_us("ours: forward+backward") / 1e3 < lb("ours", "fwd_bwd") and lb("ours", "fwd") <= lb("cudnn", "fwd")
            and compiled > host_us("cudnn: forward") and compiled - host_us("ours: forward (Fn.apply") > compiled / 2
            and host_us("ours: launch_fwd, TMA") > host_us("ours: launch_fwd, pointers"))


def _lower_clock_at_the_power_limit() -> bool:
    """Ours runs at a lower clock than cuDNN in both modes; every other implementation at cuDNN's or higher."""
    others = clock_fields().query("impl not in ['ours', 'cudnn']").sm_mhz_median.min()
    return (all(clock("ours", m) < clock("cudnn", m) for m in ("fwd", "fwd_bwd"))
            and others >= max(clock("cudnn", "fwd"), clock("cudnn", "fwd_bwd")))


register("flash", facts=FACTS, tables={
    "ab": ab_table, "onepass_ab": onepass_ab_table, "probe": probe_table, "host": host_table,
    "clock_fields": clock_fields_table, "leaderboard_clocks": leaderboard_clock_table,
}, claims={
    "fixed_trip_count_was_the_regression": lambda: ab_median("fixeddiag", False, True)
    > ab_median("rtdiag", False, True),
    "tma_and_no_tail_beat_the_old_file": lambda: ab_median("rtdiag", True, True)
    < min(ab_median("old", False, False), ab_median("rtdiag", True, False)),
    # under 1% either way: below the rounds' spread
    "tail_matters_only_with_tma": lambda: abs(ab_median("rtdiag", False, True) / ab_median("rtdiag", False, False) - 1)
    < 0.01,
    "fix_gained_more_in_the_dq_pass": _fix_gained_more_in_the_dq_pass,
    "adds_cost_more_than_the_dq_pass": _adds_cost_more_than_the_dq_pass,
    # plain stores take over half the rest of the kernel's time; the adds overlap it partly, less with wide tiles
    "probe_traffic_is_a_cost_of_its_own": lambda: probe_ms("store") > 0.5 * onepass_ab_median("no_add")
    and 0 < overlap(WIDE) < overlap(TILED) < 1,
    "host_runs_ahead_of_the_gpu": _host_runs_ahead,
    "lower_clock_at_the_power_limit": _lower_clock_at_the_power_limit,
    "one_pass_upper_bound_is_a_gain": lambda: onepass_ab_median("no_add") < _two_pass_ms(),
})
