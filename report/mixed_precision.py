"""The mixed-precision chapter's numbers (docs/mixed-precision.md, mixed-precision/bf16-timings.md), from
results/mixed-precision/, the timing grid and the 2026 phases sweep; the binade walk is computed (IEEE arithmetic)."""

from __future__ import annotations

import pandas as pd
import torch

from cs336_systems.bench.device import peak_flops
from cs336_systems.profiling.mixed_precision import ADDEND, N_ADDS, binade_walk
from report.attention import compile_rows  # the compile sweep's rows live with that chapter
from report.profiling import PHASES_BENCH, SIZES, by_size, kernel_cells, phase_cells, phase_rows, pm_each, timings
from report.registry import register
from report.results import load_results, markdown_table, newest, ok, where, with_source

MODES = ("forward", "forward-backward", "train")
KEY = ["size", "mode", "dtype"]
LOW = {"fp16": "float16", "bf16": "bfloat16"}  # autocast's low-precision types, as torch names them
FP16_ADDEND = float(torch.tensor(ADDEND, dtype=torch.float16))  # 0.01 as fp16 stores it
AUTOCAST_TENSORS = {"parameters": "parameters (inside autocast)", "fc1": "fc1 output", "ln": "layer-norm output",
                    "logits": "logits", "loss": "loss", "gradients": "gradients"}


# ---- mixed_precision_accumulation --------------------------------------------------------------------

def accumulation() -> pd.DataFrame:
    """The loops' results indexed by (device_type, loop)."""
    return load_results("mixed-precision/accumulation").set_index(["device_type", "loop"])


def accumulation_table() -> str:
    df = accumulation().reset_index().sort_values(["device_type", "loop"])
    shown = df[["device_type", "loop", "value_repr", "error", "addend_as_stored"]].rename(columns={
        "device_type": "device", "value_repr": "result (exact float)", "error": "result - 10",
        "addend_as_stored": "0.01 as stored in the addend's dtype"})
    return with_source(shown, "mixed-precision/accumulation", floatfmt=".6g")


def _gpu(loop: str, column: str = "value") -> float:
    return float(accumulation().loc[("cuda", loop), column])


def binades(dtype: torch.dtype = torch.float16) -> pd.DataFrame:
    """The loop, binade by binade (computed now, on the CPU): ulp, 0.01 in ulps, adds, real step."""
    df = pd.DataFrame(binade_walk(dtype))
    return df.assign(addend_in_ulps=df["ulp"].map(lambda u: None if u is None else ADDEND / u)).set_index("binade")


def binade_table() -> str:
    shown = binades().reset_index()[["binade", "ulp", "addend_in_ulps", "adds", "added_per_add"]].rename(
        columns={"addend_in_ulps": "0.01 / ulp", "added_per_add": "what one add really added"})
    return markdown_table(shown, floatfmt=".6g") + "\n\n*Computed when this page was built (CPU).*"


def _binade(name: str, column: str) -> float:
    return float(binades().loc[name, column])


def fp32_systematic_error() -> float:
    """The fp32 loop's error rebuilt from its per-binade roundings (each the same within a binade)."""
    b = binades(torch.float32)
    return float(((b.added_per_add - ADDEND) * b.adds).sum())


def _mixed_loops_exact() -> bool:
    """Both mixed loops give the same sum, exactly N_ADDS x the fp16 addend. Exact: the fp16 addend
    has 11 significant bits, its lowest at 2^-17; every partial sum below 16 is then a multiple of
    2^-17 under 2^4, at most 21 bits, which fp32 (24) holds."""
    acc = accumulation()
    return all(acc.loc[(d, "fp32 += fp16"), "value"] == acc.loc[(d, "fp32 += fp16.type(fp32)"), "value"]
               == N_ADDS * FP16_ADDEND for d in ("cuda", "cpu"))


# ---- benchmarking_mixed_precision (a): autocast's dtypes -----------------------------------------------

def autocast_dtypes(device_type: str = "cuda", autocast: str = "fp16") -> dict[str, str]:
    df = where(load_results("mixed-precision/autocast_dtypes"), device_type=device_type, autocast=autocast)
    return dict(zip(df["tensor"], df["dtype"]))


def _autocast_as_answered(device: str) -> bool:
    """Parameters, loss and gradients fp32, fc1's output and the logits low; layer norm fp32 on the GPU only."""
    for low, name in LOW.items():
        want = dict.fromkeys(["parameters (inside autocast)", "loss", "gradients"], "float32")
        want |= {"fc1 output": name, "logits": name, "layer-norm output": "float32" if device == "cuda" else name}
        if any(autocast_dtypes(device, low)[t] != d for t, d in want.items()):
            return False
    return True


# ---- benchmarking_mixed_precision (c): bf16 against fp32 --------------------------------------------------

def precision_rows(keep: str = "last") -> pd.DataFrame:
    """Per (size, mode): the fp32 and bf16 cells side by side and fp32 over bf16 (keep="first": first runs)."""
    r = pd.concat([timings(d, keep).add_prefix(f"{d}_") for d in ("fp32", "bf16")], axis=1)
    r = r.loc[[(s, m) for s in SIZES for m in MODES]]
    return r.assign(speedup=r.fp32_mean_ms / r.bf16_mean_ms)


def speedups(keep: str = "last") -> pd.DataFrame:
    """fp32 time over bf16 time, sizes by modes."""
    return precision_rows(keep).speedup.unstack().loc[SIZES]


def precision_table() -> str:
    r = precision_rows().reset_index()
    shown = pd.DataFrame({"size": r["size"], "mode": r["mode"], "fp32 ms": pm_each(r.fp32_mean_ms, r.fp32_std_ms),
                          "bf16 ms": pm_each(r.bf16_mean_ms, r.bf16_std_ms), "speed-up": r.speedup,
                          "fp32 TFLOP/s": r.fp32_tflops, "bf16 TFLOP/s": r.bf16_tflops, "MFU fp32": r.fp32_mfu,
                          "MFU bf16": r.bf16_mfu})
    return with_source(shown, "end-to-end/timings", used=newest(ok("end-to-end/timings"), KEY),
                       formats={"MFU fp32": ".0%", "MFU bf16": ".0%"})


def spread(dtype: str) -> float:
    """The largest std / mean of the newest cells of one dtype."""
    return timings(dtype).eval("std_ms / mean_ms").max()


# ---- bf16-timings.md: the cells measured twice ----------------------------------------------------------

def remeasured_rows() -> pd.DataFrame:
    """Per cell timed more than once: its first and newest run, and the newest's clock record (--record-clocks)."""
    out = []
    for cell, g in ok("end-to-end/timings").sort_values("time_utc").groupby(KEY, sort=False):
        if len(g) < 2:
            continue
        a, b = g.iloc[0], g.iloc[-1]
        samples = b.get("clock_samples") if isinstance(b.get("clock_samples"), list) else []
        sm, top, watts = ([x[i] for x in samples if x[i] is not None] for i in (1, 2, 3))  # SM clock, its maximum, W
        top = top or sm
        out.append({**dict(zip(KEY, cell)), "first_ms": a.mean_ms, "first_std_ms": a.std_ms,
                    "new_ms": b.mean_ms, "new_std_ms": b.std_ms, "change": b.mean_ms / a.mean_ms - 1,
                    "samples": len(samples), "sm_min": min(sm, default=None), "sm_max": max(sm, default=None),
                    "sm_top": max(top, default=None), "w_min": min(watts, default=None),
                    "w_max": max(watts, default=None)})
    df = pd.DataFrame(out)
    return by_size(df) if not df.empty else df


def _range(lo, hi) -> str:
    if lo is None or pd.isna(lo):
        return "—"
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"


def remeasured_table() -> str:
    r = remeasured_rows()
    shown = pd.DataFrame({
        "size": r["size"], "mode": r["mode"], "dtype": r["dtype"],
        "first run ms": pm_each(r.first_ms, r.first_std_ms), "re-run ms (in the table)": pm_each(r.new_ms, r.new_std_ms),
        "change": r["change"].map("{:+.0%}".format),
        "SM clock MHz (re-run)": [_range(a, b) for a, b in zip(r.sm_min, r.sm_max)],
        "power W (re-run)": [_range(a, b) for a, b in zip(r.w_min, r.w_max)], "clock samples": r["samples"]})
    return with_source(shown, "end-to-end/timings", used=ok("end-to-end/timings").merge(r[KEY], on=KEY))


def fp32_repeats() -> pd.DataFrame:
    """fp32 cells timed in two processes: the timing grid and the torch.compile sweep's eager cells (same cell)."""
    t = timings("fp32").mean_ms
    c = where(compile_rows(), compile=False, dtype="fp32").set_index(["size", "mode"]).mean_ms
    return by_size(pd.DataFrame([{"size": s, "mode": m, "timing grid ms": t[(s, m)], "compile sweep (eager) ms": c[(s, m)],
                                  "difference": c[(s, m)] / t[(s, m)] - 1} for s, m in c.index if (s, m) in t.index]))


def python_us_per_launch() -> float:
    """Python µs per launch where launches set the pace: the small model's shortest fp32 forward over its launches."""
    small = where(kernel_cells(), size="small").sort_values("context").iloc[0]
    return small.fwd_python_ms * 1e3 / small.fwd_launches


def launch_estimate() -> pd.DataFrame:
    """Launching an fp32 forward's kernels at context 512, at that rate, against the bf16 forwards measured."""
    us, k512 = python_us_per_launch(), where(kernel_cells(), context=512).set_index("size")
    fwd = where(remeasured_rows(), mode="forward", dtype="bf16").set_index("size")
    return pd.DataFrame([{"size": s, "fp32 forward launches": int(k512.loc[s, "fwd_launches"]),
                          "launch time ms (estimate)": k512.loc[s, "fwd_launches"] * us / 1e3,
                          "bf16 forward, first run ms": fwd.loc[s, "first_ms"],
                          "bf16 forward, re-run ms": fwd.loc[s, "new_ms"]} for s in fwd.index])


# ---- (c), 2026: every size of the 2026 table, 10B included (the profiling chapter's phases sweep) ----

def phase_speedups() -> pd.DataFrame:
    """Per 2026 size: fp32 over bf16 for the forward+backward (its two phases) and the training step (NaN: OOM)."""
    f, b = (phase_cells().xs(d, level="dtype") for d in ("fp32", "bf16"))
    return pd.DataFrame({"size": f.index, "forward+backward fp32 ms": f.fb_ms, "bf16 ms": b.fb_ms,
                         "speed-up": f.fb_ms / b.fb_ms, "training step speed-up": f.step_mean_ms / b.step_mean_ms})


register("mixed_precision", facts={
    "fp32_result": lambda: f"{_gpu('fp32 += fp32'):.6f}",
    "fp16_result": lambda: f"{_gpu('fp16 += fp16'):.6f}",
    "mixed_result": lambda: f"{_gpu('fp32 += fp16'):.6f}",
    "addend_fp16": lambda: repr(FP16_ADDEND),
    "addend_fp16_times_n": lambda: f"{N_ADDS * FP16_ADDEND:.6f}",
    "fp32_systematic_error": lambda: f"{fp32_systematic_error():+.6f}",
    # (a): mixed_precision.cuda_fp16_fc1 and so on
    **{f"cuda_fp16_{short}": (lambda t=tensor: f"`{autocast_dtypes()[t]}`") for short, tensor in AUTOCAST_TENSORS.items()},
    # (c)
    "speedup_small_train": lambda: f"{speedups().loc['small', 'train']:.2f}",
    "speedup_large_fb": lambda: f"{speedups().loc['2.7B', 'forward-backward']:.1f}",
    "peak_ratio": lambda: f"{peak_flops('NVIDIA H200', 'bf16') / peak_flops('NVIDIA H200', 'fp32'):.0f}",
    "bf16_cv_max": lambda: f"{spread('bf16'):.0%}",
    "fp32_cv_max": lambda: f"{spread('fp32'):.1%}",
    # (c), 2026
    "phase_speedup_small": lambda: f"{phase_speedups()['speed-up']['small']:.1f}",
    "phase_speedup_10b": lambda: f"{phase_speedups()['speed-up']['10B']:.1f}",
    "phase_speedup_27b": lambda: f"{phase_speedups()['speed-up']['2.7B']:.1f}",
    "phase_speedup_27b_train": lambda: f"{phase_speedups()['training step speed-up']['2.7B']:.1f}",
    # bf16-timings.md
    "launch_us": lambda: f"{python_us_per_launch():.0f}",
}, tables={
    "accumulation": accumulation_table, "binades": binade_table, "precision": precision_table,
    "autocast": lambda: with_source(load_results("mixed-precision/autocast_dtypes").pivot_table(
        index=["device_type", "tensor"], columns="autocast", values="dtype", aggfunc="first").reset_index()
        .rename_axis(columns=None), "mixed-precision/autocast_dtypes"),
    "remeasured": remeasured_table,
    "phase_speedups": lambda: with_source(phase_speedups(), PHASES_BENCH, used=phase_rows().reset_index(), formats={
        "forward+backward fp32 ms": ",.0f", "bf16 ms": ",.0f", "speed-up": ".1f",
        "training step speed-up": lambda v: "out of memory" if pd.isna(v) else f"{v:.1f}"}),
    "fp32_repeats": lambda: markdown_table(fp32_repeats(), floatfmt=",.1f", formats={"difference": "+.1%"}),
    "launch_estimate": lambda: markdown_table(launch_estimate(), floatfmt=".0f"),
}, claims={
    "fp32_nearly_exact_fp16_not": lambda: all(
        abs(accumulation().loc[(d, "fp32 += fp32"), "error"]) < 1e-3 < abs(accumulation().loc[(d, "fp16 += fp16"), "error"])
        for d in ("cuda", "cpu")),
    "mixed_loops_err_by_the_rounded_addend": _mixed_loops_exact,
    "cpu_and_gpu_bit_identical": lambda: (accumulation().xs("cuda").value == accumulation().xs("cpu").value).all(),
    "rounds_up_to_three_ulps": lambda: abs(_binade("[4, 8)", "added_per_add") / _binade("[4, 8)", "ulp") - 3) < 0.01,
    "rounds_down_to_one_ulp": lambda: _binade("[8, 16)", "added_per_add") == _binade("[8, 16)", "ulp")
    and binades().index[-1] == "[8, 16)",
    "fp32_error_is_its_roundings": lambda: abs(fp32_systematic_error() / _gpu("fp32 += fp32", "error") - 1) < 1e-6,
    "autocast_dtypes_as_answered": lambda: _autocast_as_answered("cuda"),
    "cpu_autocast_keeps_layer_norm_low": lambda: _autocast_as_answered("cpu"),
    "speedup_grows_with_size": lambda: all(speedups()[m].is_monotonic_increasing for m in MODES)
    and speedups().loc["small", "train"] < 1.05 and speedups().loc["2.7B"].min() > 2,
    "bf16_noisier_than_fp32": lambda: spread("bf16") > spread("fp32"),
    # the big bf16 cells, measured twice, moved by more than a fifth while the SM clock held within 5% of its top
    "remeasured_moved_at_a_held_clock": lambda: (lambda r: set(r["size"]) == {"large", "xl", "2.7B"}
        and set(r["dtype"]) == {"bf16"} and r.change.abs().max() > 0.2
        and r.sm_min.min() >= 0.95 * r.sm_top.max())(remeasured_rows()),
    # with each cell's first run, the large forward's speed-up does not rise over the medium one's
    "first_runs_break_large_ordering": lambda: speedups("first").forward["large"] <= speedups("first").forward["medium"],
    "fp32_repeats_agree": lambda: (lambda d: d[["large", "xl", "2.7B"]].max() < min(0.02, d["small"].max())
                                   and set(d.index) == set(SIZES))(
        fp32_repeats().set_index("size").difference.abs()),
    # same order of magnitude: each bf16 forward, both runs, within 3x of the launch estimate either way
    "launching_takes_the_bf16_time": lambda: (lambda e: e.iloc[:, 3:].div(e["launch time ms (estimate)"], axis=0)
                                              .stack().between(1 / 3, 3).all())(launch_estimate()),
    # the forward+backward gain grows with size; 2.7B's training step gains less; only 10B has none
    "phase_speedups_as_answered": lambda: (lambda f, t: f.is_monotonic_increasing and t["2.7B"] < f["2.7B"]
                                           and list(t.index[t.isna()]) == ["10B"])(
        phase_speedups()["speed-up"], phase_speedups()["training step speed-up"]),
})
