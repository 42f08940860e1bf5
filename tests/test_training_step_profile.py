"""The profiled training step (`training-step --profile`): the categoriser (breakdown.py) on a
synthetic kernel list whose answer is known by construction, the kernel-name rules on real kernel
names, and the CLI end to end on a CPU (ops' self times standing in for kernels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cs336_systems.profiling.kernel_attribution import TraceEvent
from cs336_systems.training_step import bench, breakdown
from tests.triton_mode import HAS_TRITON, NO_TRITON, where_marks

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)


def _synthetic_step() -> list[TraceEvent]:
    """One step (0 to 1000 us) with its ranges and kernels. Each kernel but two is launched by a
    runtime call (host, correlation id = the kernel's) at `launch`; a kernel's own times are when
    the GPU ran it, which may be after its range ended (launches are asynchronous)."""
    R = lambda name, start, end: TraceEvent(name, False, start, end, annotation=True)  # noqa: E731
    events = [R("step", 0, 1000), R("forward", 0, 400), R("loss", 300, 400), R("backward", 400, 800),
              R("loss_backward", 400, 450), R("optimizer", 800, 950)]
    kernels = [  # name, launch, gpu start, gpu end, stream
        ("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", 10, 20, 60, 7),       # matmul (forward)
        ("flash_fwd_kernel", 100, 100, 150, 7),                       # attention forward
        ("triton_poi_fused__to_copy_mul_0", 160, 160, 170, 7),        # elementwise
        ("ce_rows_kernel", 310, 320, 380, 7),                         # loss (launched in its range)
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 390, 405, 415, 7),        # loss: launched in it, run after
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 410, 420, 440, 7),        # loss backward
        ("flash_fwd_kernel", 500, 500, 540, 7),                       # recompute: attention forward
        ("bwd_onepass_kernel", 550, 550, 600, 7),                     # attention backward
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7", 610, 610, 620, 7),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 630, 630, 700, 7),     # matmul (backward)
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 640, 650, 680, 9),     # matmul on another stream, overlapping
        ("adamw_kernel", 810, 810, 900, 7),                           # optimizer
        ("Memset (Device)", 960, 960, 970, 7),                        # other: outside the phases
        ("triton_poi_fused_add_1", -50, -40, -30, 7),                 # before the step: not counted
    ]
    for i, (name, launch, start, end, stream) in enumerate(kernels, start=1):
        events.append(TraceEvent("cudaLaunchKernel", False, launch, launch + 1, corr=1000 + i, linked=i))
        events.append(TraceEvent(name, True, start, end, corr=1000 + i, linked=i, stream=stream))
    return events


def test_breakdown_puts_each_kernel_in_its_category():
    rows = {r["category"]: r for r in breakdown.breakdown(_synthetic_step())}
    assert list(rows) == list(breakdown.CATEGORIES)
    expected_us = {"matmul": 40 + 70 + 30, "attention forward": 50, "attention backward": 50 + 10,
                   "recompute: attention forward": 40, "elementwise and norms": 10,
                   "loss": 60 + 10 + 20, "optimizer": 90, "other": 10}
    for category, us in expected_us.items():
        assert rows[category]["ms"] == pytest.approx(us / 1e3), category
    assert rows["matmul"]["kernels"] == 3 and rows["matmul"]["by_phase_ms"] == pytest.approx(
        {"forward": 0.040, "backward": 0.100})
    assert rows["loss"]["by_phase_ms"] == pytest.approx({"forward": 0.070, "backward": 0.020})
    # busy: the union of every kernel's interval in the step (the overlapping stream counted once)
    busy = 40 + 50 + 10 + 60 + 10 + 20 + 40 + 50 + 10 + 70 + 90 + 10
    assert rows["idle"]["ms"] == pytest.approx((1000 - busy) / 1e3)
    assert all(r["step_wall_ms"] == pytest.approx(1.0) and r["busy_ms"] == pytest.approx(busy / 1e3)
               for r in rows.values())
    assert rows["matmul"]["top_kernels"][0] == {"kernel": "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "ms": pytest.approx(0.1)}


def test_breakdown_needs_one_step_range():
    events = [e for e in _synthetic_step() if e.name != "step"]
    with pytest.raises(ValueError, match="exactly one 'step' range"):
        breakdown.breakdown(events)


@pytest.mark.parametrize("name, forward, backward", [
    # ours (attention/*_kernel.py, fast/, fast/gluon/)
    ("flash_fwd_kernel", True, False), ("fwd_ws_kernel", True, False), ("bwd_preprocess_kernel", False, True),
    ("bwd_dkdv_kernel", False, True), ("bwd_dq_kernel", False, True), ("bwd_fused_kernel", False, True),
    ("bwd_onepass_kernel", False, True), ("bwd_onepass_ws_kernel", False, True),
    # SDPA's: cuDNN, FlashAttention-2, memory-efficient
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", True, False),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", False, True),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)", True, False),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>", False, True),
    ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128>>", False, True),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", True, False), ("fmha_cutlassB_bf16_aligned_128x64_k128_sm80", False, True),
    # the CPU stand-in's op names
    ("cs336::flash_attention_fwd", True, False), ("cs336::flash_attention_bwd", False, True),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", True, False),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", False, True),
    ("autograd::engine::evaluate_function: GeneratedBackwardFor_cs336_flash_attention_fwd_defaultBackward", False, True),
    # not attention
    ("triton_red_fused__to_copy_mean_pow_rsqrt_1", False, False), ("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", False, False),
    ("ce_rows_kernel", False, False), ("adamw_kernel", False, False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", False, False),
])
def test_attention_kernels_are_told_by_name(name, forward, backward):
    is_backward = bool(breakdown.ATTENTION_BACKWARD.search(name))
    assert is_backward == backward
    assert (not is_backward and bool(breakdown.ATTENTION_FORWARD.search(name))) == forward
    expected = ("attention backward" if backward else "recompute: attention forward" if forward
                else "matmul" if name.startswith("nvjet") else "elementwise and norms")
    assert breakdown.kernel_category(name, "backward", in_loss=False) == expected


def _our_attention_kernels() -> list[str]:
    """The names of the Triton and Gluon kernels the attention runs (the functions under
    @triton.jit / @gluon.jit in cs336_systems/attention, the A/B experiments left out)."""
    import ast
    root = Path(breakdown.__file__).parents[1] / "attention"
    names = []
    for path in root.rglob("*.py"):
        if "experiments" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d).endswith(".jit") for d in node.decorator_list) and node.name.endswith("_kernel"):
                names.append(node.name)
    return sorted(names)


def test_every_attention_kernel_of_ours_has_its_category():
    # a kernel the rule misses would count as elementwise work: the profile's attention row too small
    names = _our_attention_kernels()
    assert "bwd128_ws_kernel" in names and "fwd_ws_kernel" in names
    for name in names:
        expected = "attention backward" if name.startswith("bwd") else "recompute: attention forward"
        assert breakdown.kernel_category(name, "backward", in_loss=False) == expected, name


def test_compiles_fused_kernels_are_elementwise_even_when_named_after_attention():
    for name in ("triton_poi_fused__unsafe_view_add_flash_attention_bwd_index_mul_slice_view_2",
                 "triton_poi_fused__scaled_dot_product_cudnn_attention__unsafe_view_add_view_1"):
        assert breakdown.kernel_category(name, "forward", in_loss=False) == "elementwise and norms"


def test_union_of_intervals():
    assert breakdown.union_us([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert breakdown.union_us([]) == 0


TINY = ["--size", "tiny", "--device", "cpu", "--context", "16"]


@pytest.mark.parametrize("variant", ["stock", pytest.param("ours", marks=[needs_triton, *where_marks])])
def test_bench_profile_writes_a_row_per_category_and_plan(tmp_path, variant):
    argv = [*TINY, "--variant", variant, "--checkpoint", "full:2", "selective:2", "none:2", "--profile",
            "--trace-dir", str(tmp_path / "traces"), "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    assert not (tmp_path / "training-step").exists()  # a profile run writes no timing rows
    rows = [json.loads(line) for line in (tmp_path / "training-step-profile" / "cpu.jsonl").read_text().splitlines()]
    by_plan: dict[str, dict[str, dict]] = {}
    for r in rows:
        assert r["status"] == "ok" and r["variant"] == variant
        by_plan.setdefault(r["flags"]["checkpoint"], {})[r["category"]] = r
    assert list(by_plan) == ["full:2", "selective:2", "none:2"]
    for plan, cats in by_plan.items():
        assert list(cats) == list(breakdown.CATEGORIES)
        for c in ("matmul", "attention forward", "attention backward", "loss", "optimizer", "elementwise and norms"):
            assert cats[c]["ms"] > 0, (plan, c)
        wall, busy = cats["idle"]["step_wall_ms"], cats["idle"]["busy_ms"]
        assert busy <= wall and cats["idle"]["ms"] == pytest.approx(wall - busy)
        # the union of the work's intervals is at most their sum (equal where nothing overlaps)
        assert sum(r["ms"] for c, r in cats.items() if c != "idle") >= busy * (1 - 1e-9)
    # fully checkpointed blocks run the attention forward again in the backward, kept ones do not.
    # (On the CPU a selective block's cached attention still shows as an op, answered from the
    # policy's cache: no kernel on a GPU. test_training_step_checkpoint counts what really runs.)
    assert by_plan["full:2"]["recompute: attention forward"]["ms"] > 0
    assert by_plan["none:2"]["recompute: attention forward"]["kernels"] == 0
    assert len(list((tmp_path / "traces").glob("*.json"))) == 3
