"""Claims of docs/reproducing.md ("How every number was measured") over the measured ceilings."""

from __future__ import annotations

from report import reproducing as r
from report.flash_tuning import PEAK_TBPS, PEAK_TFLOPS


def test_measured_ceilings_are_below_the_datasheet():
    # "a bf16 matmul reaches ... TFLOP/s of the datasheet's ... and a copy ... TB/s of its ..."
    assert r.matmul_ceiling_tflops("bf16") < PEAK_TFLOPS
    assert r.copy_ceiling_tbps() < PEAK_TBPS


def test_tf32_is_several_times_faster_than_ieee_fp32():
    # "TF32 (a 10-bit mantissa on the tensor cores) ran ... times as fast here": the page's point is
    # that the fp32 precision a kernel uses changes its speed several-fold.
    assert r.matmul_ceiling_tflops("tf32") > 3 * r.matmul_ceiling_tflops("fp32")


def test_bench_all_leaves_out_the_multi_process_benchmarks():
    # "`collectives`, `ddp` and `sharding` are not in `just bench-all` ... Nor are `fsdp`, `tp-ffn`
    # and `training-step`, which are written for two GPUs." The step's one-GPU pieces are in it (and
    # `training-step --batch 1 --world-size 1` runs one GPU's share: the training-step page's rows).
    from cs336_systems.bench.registry import BENCHMARKS

    for name in ("collectives", "ddp", "sharding", "fsdp", "tp-ffn", "training-step"):
        assert not BENCHMARKS[name].gpu, name
    assert BENCHMARKS["fused-ce"].gpu and BENCHMARKS["fused-adamw"].gpu
