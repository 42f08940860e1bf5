"""The mixed-precision chapter: the accumulation loops, autocast's dtypes, bf16 against fp32 timings.

The accumulation rows and the autocast dtypes come from results/mixed-precision/; the binade walk is
computed when the page is built (it is IEEE arithmetic, the same on any machine); the timings are
the end-to-end grid's (results/end-to-end/timings/), fp32 against bf16 autocast.
"""

from __future__ import annotations

import pandas as pd
import torch

from cs336_systems.bench.device import peak_flops
from cs336_systems.profiling.mixed_precision import ADDEND, N_ADDS, binade_walk
from report.facts import register
from report.profiling import SIZES
from report.results import load_results, markdown_table, newest, ok, results_table, with_source
from report.units import pm

MODES = ("forward", "forward-backward", "train")
KEY = ["size", "mode", "dtype"]


# ---- mixed_precision_accumulation --------------------------------------------------------------------

def accumulation_table() -> str:
    return results_table("mixed-precision/accumulation",
                         columns=["device_type", "loop", "value_repr", "error", "addend_as_stored"],
                         rename={"device_type": "device", "value_repr": "result (exact float)",
                                 "error": "result - 10", "addend_as_stored": "0.01 as stored in the addend's dtype"},
                         sort=["device_type", "loop"], floatfmt=".6g")


def accumulation() -> pd.DataFrame:
    """The loops' results indexed by (device_type, loop)."""
    return load_results("mixed-precision/accumulation").set_index(["device_type", "loop"])


def _gpu(loop: str, column: str = "value") -> float:
    return float(accumulation().loc[("cuda", loop), column])


def binades(dtype: torch.dtype = torch.float16) -> pd.DataFrame:
    """The loop, binade by binade (computed now, on the CPU): ulp, 0.01 in ulps, adds, real step."""
    df = pd.DataFrame(binade_walk(dtype))
    return df.assign(addend_in_ulps=df["ulp"].map(lambda u: None if u is None else ADDEND / u)).set_index("binade")


def binade_table() -> str:
    df = binades().reset_index()
    shown = df[["binade", "ulp", "addend_in_ulps", "adds", "added_per_add"]].rename(
        columns={"addend_in_ulps": "0.01 / ulp", "added_per_add": "what one add really added"})
    return markdown_table(shown, floatfmt=".6g") + "\n\n*Computed when this page was built (CPU).*"


def _binade(name: str, column: str, dtype: torch.dtype = torch.float16) -> float:
    return float(binades(dtype).loc[name, column])


def fp32_systematic_error() -> float:
    """The fp32 loop's error rebuilt from its per-binade roundings (each the same within a binade)."""
    b = binades(torch.float32)
    return float(((b.added_per_add - ADDEND) * b.adds).sum())


# ---- benchmarking_mixed_precision (a): autocast's dtypes -----------------------------------------------

def autocast_table() -> str:
    return results_table("mixed-precision/autocast_dtypes",
                         pivot={"index": ["device_type", "tensor"], "columns": "autocast", "values": "dtype"})


def autocast_dtypes(device_type: str = "cuda", autocast: str = "fp16") -> dict[str, str]:
    df = load_results("mixed-precision/autocast_dtypes")
    df = df[(df["device_type"] == device_type) & (df["autocast"] == autocast)]
    return dict(zip(df["tensor"], df["dtype"]))


# ---- benchmarking_mixed_precision (c): bf16 against fp32 --------------------------------------------------

def speedups(rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """fp32 time / bf16 time per (size, mode), from `rows` (default: the newest row of each cell)."""
    t = (rows if rows is not None else newest(ok("end-to-end/timings"), KEY)).set_index(KEY).mean_ms
    return pd.DataFrame({m: [t[(s, m, "fp32")] / t[(s, m, "bf16")] for s in SIZES] for m in MODES}, index=SIZES)


def precision_table() -> str:
    t = newest(ok("end-to-end/timings"), KEY)
    i = t.set_index(KEY)
    rows = []
    for size in SIZES:
        for mode in MODES:
            a, b = i.loc[(size, mode, "fp32")], i.loc[(size, mode, "bf16")]
            rows.append({"size": size, "mode": mode, "fp32 ms": pm(a.mean_ms, a.std_ms),
                         "bf16 ms": pm(b.mean_ms, b.std_ms), "speed-up": a.mean_ms / b.mean_ms,
                         "fp32 TFLOP/s": a.tflops, "bf16 TFLOP/s": b.tflops,
                         "MFU fp32": f"{a.mfu:.0%}", "MFU bf16": f"{b.mfu:.0%}"})
    return with_source(pd.DataFrame(rows), "end-to-end/timings", used=t)


def spread() -> pd.DataFrame:
    """std / mean of each newest cell, indexed by (size, mode, dtype)."""
    t = newest(ok("end-to-end/timings"), KEY).set_index(KEY)
    return t.std_ms / t.mean_ms


FP16_ADDEND = float(torch.tensor(ADDEND, dtype=torch.float16))  # 0.01 as fp16 stores it
AUTOCAST_TENSORS = {"parameters": "parameters (inside autocast)", "fc1": "fc1 output", "ln": "layer-norm output",
                    "logits": "logits", "loss": "loss", "gradients": "gradients"}

register({
    # mixed_precision_accumulation
    "mixed_precision.fp32_result": lambda: f"{_gpu('fp32 += fp32'):.6f}",
    "mixed_precision.fp16_result": lambda: f"{_gpu('fp16 += fp16'):.6f}",
    "mixed_precision.fp16_error": lambda: f"{-_gpu('fp16 += fp16', 'error'):g}",
    "mixed_precision.mixed_result": lambda: f"{_gpu('fp32 += fp16'):.6f}",
    "mixed_precision.addend_fp16": lambda: repr(FP16_ADDEND),
    "mixed_precision.addend_fp16_times_n": lambda: f"{N_ADDS * FP16_ADDEND:.6f}",
    "mixed_precision.ulp_4_8": lambda: f"{_binade('[4, 8)', 'ulp'):g}",
    "mixed_precision.ulps_4_8": lambda: f"{_binade('[4, 8)', 'addend_in_ulps'):.2f}",
    "mixed_precision.step_4_8": lambda: f"{_binade('[4, 8)', 'added_per_add'):.4f}",
    "mixed_precision.ulp_8_16": lambda: f"{_binade('[8, 16)', 'ulp'):g}",
    "mixed_precision.ulps_8_16": lambda: f"{_binade('[8, 16)', 'addend_in_ulps'):.2f}",
    "mixed_precision.step_8_16": lambda: f"{_binade('[8, 16)', 'added_per_add'):.7f}",
    "mixed_precision.adds_8_16": lambda: f"{_binade('[8, 16)', 'adds'):.0f}",
    "mixed_precision.fp32_step_error_8_16": lambda: f"{_binade('[8, 16)', 'added_per_add', torch.float32) - ADDEND:+.2g}",
    "mixed_precision.fp32_systematic_error": lambda: f"{fp32_systematic_error():+.6f}",
    # benchmarking_mixed_precision (a): mixed_precision.cuda_fp16_fc1 and so on
    **{f"mixed_precision.{device}_{dtype}_{short}": (lambda d=device, a=dtype, t=tensor: f"`{autocast_dtypes(d, a)[t]}`")
       for device in ("cuda", "cpu") for dtype in ("fp16", "bf16") for short, tensor in AUTOCAST_TENSORS.items()},
    # (c)
    "mixed_precision.speedup_small_train": lambda: f"{speedups().loc['small', 'train']:.2f}",
    "mixed_precision.speedup_large_fb": lambda: f"{speedups().loc['2.7B', 'forward-backward']:.1f}",
    "mixed_precision.speedup_large_fwd": lambda: f"{speedups().loc['2.7B', 'forward']:.1f}",
    "mixed_precision.peak_ratio": lambda: f"{peak_flops('NVIDIA H200', 'bf16') / peak_flops('NVIDIA H200', 'fp32'):.0f}",
    "mixed_precision.bf16_cv_max": lambda: f"{spread().xs('bf16', level='dtype').max():.0%}",
    "mixed_precision.fp32_cv_max": lambda: f"{spread().xs('fp32', level='dtype').max():.1%}",
})
