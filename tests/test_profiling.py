"""Profiling instruments: kernel attribution, the memory-timeline renderer, accumulation and
autocast tables, and the attention memory accounting, each against an independent reference."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.autograd import DeviceType

from cs336_systems.attention.pytorch_sweep import attention_memory, largest_seq_that_fits
from cs336_systems.model import get_config
from cs336_systems.profiling import memory, mixed_precision, torch_profile
from cs336_systems.profiling.steps import build_model

# ---- kernel attribution ------------------------------------------------------------------------

Kernel = collections.namedtuple("Kernel", "name device duration")


class Ev:
    """The few FunctionEvent fields attribute_kernels reads."""

    def __init__(self, name, start, end, device_type=DeviceType.CPU, kernels=(), self_cpu=0.0):
        self.name, self.device_type, self.kernels = name, device_type, list(kernels)
        self.time_range = type("R", (), {"start": start, "end": end})()
        self.self_cpu_time_total = self_cpu


def test_gpu_kernels_are_attributed_by_launch_time_to_phase_and_attention_region():
    events = [
        Ev("forward", 0, 100), Ev("attn_scores", 10, 20), Ev("attn_softmax", 20, 30),
        Ev("backward", 100, 200), Ev("optimizer", 200, 300),
        Ev("aten::mm", 5, 6, kernels=[Kernel("sm90_xmma_gemm_f32", 0, 40.0)]),
        Ev("aten::bmm", 11, 12, kernels=[Kernel("sm90_xmma_gemm_f32", 0, 8.0)]),
        Ev("aten::_softmax", 21, 22, kernels=[Kernel("softmax_warp_forward", 0, 12.0)]),
        # a backward op from autograd's own thread: no parent link, but launched inside `backward`
        Ev("aten::mm", 150, 151, kernels=[Kernel("sm90_xmma_gemm_f32", 0, 90.0),
                                         Kernel("cublasLt::splitKreduce_kernel", 0, 10.0)]),
        Ev("aten::add_", 250, 251, kernels=[Kernel("vectorized_elementwise_kernel", 0, 30.0)]),
        # device events (the kernels themselves, plus a GPU-side copy of a range) for the total
        Ev("sm90_xmma_gemm_f32", 0, 138, DeviceType.CUDA), Ev("softmax_warp_forward", 0, 12, DeviceType.CUDA),
        Ev("cublasLt::splitKreduce_kernel", 0, 10, DeviceType.CUDA),
        Ev("vectorized_elementwise_kernel", 0, 30, DeviceType.CUDA), Ev("forward", 0, 500, DeviceType.CUDA),
    ]
    rows, totals = torch_profile.attribute_kernels(events)
    got = {(r["phase"], r["region"], r["kernel"]): (r["calls"], r["total_ms"]) for r in rows}
    assert got[("forward", "", "sm90_xmma_gemm_f32")] == (1, 0.040)
    assert got[("forward", "attn_scores", "sm90_xmma_gemm_f32")] == (1, 0.008)
    assert got[("forward", "attn_softmax", "softmax_warp_forward")] == (1, 0.012)
    assert got[("backward", "", "sm90_xmma_gemm_f32")] == (1, 0.090)
    assert got[("optimizer", "", "vectorized_elementwise_kernel")] == (1, 0.030)
    assert totals["forward"]["kernel_ms"] == pytest.approx(0.060)
    assert totals["forward"]["matmul_ms"] == pytest.approx(0.048)
    assert totals["backward"]["matmul_ms"] == pytest.approx(0.100)  # splitK reduce is part of a GEMM
    assert totals["forward"]["wall_ms"] == pytest.approx(0.100)
    assert totals["(all device events)"]["kernel_ms"] == pytest.approx(0.190)  # the range copy left out
    shares = [r["share"] for r in rows if r["phase"] == "forward"]
    assert sum(shares) == pytest.approx(1.0)


def test_profile_step_on_cpu_gives_every_phase_and_the_attention_regions(tmp_path):
    cfg = get_config("tiny", 32)
    model = build_model(cfg, "cpu")
    rows, totals = torch_profile.profile_step(model, cfg, mode="train", batch=2, context=32,
                                              warmup=1, trace_path=tmp_path / "t.json")
    for phase in ("forward", "backward", "optimizer"):
        assert totals[phase]["kernel_ms"] > 0 and totals[phase]["python_ms"] > 0
    regions = {r["region"] for r in rows if r["phase"] == "forward"}
    assert {"attn_scores", "attn_softmax", "attn_output"} <= regions
    assert (tmp_path / "t.json").stat().st_size > 0
    text = torch_profile.format_kernel_table(rows, totals)
    assert "[optimizer]" in text


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float> >(int, F)",
     "at::native::vectorized_elementwise_kernel<…>"),
    ("sm90_xmma_gemm_f32f32_tn", "sm90_xmma_gemm_f32f32_tn"),
])
def test_short_kernel_names(name, short):
    assert torch_profile.short_name(name) == short


def test_matmul_classifier():
    for k in ("sm80_xmma_gemm_f32f32", "cutlass::Kernel2<cutlass_80_simt_sgemm>", "nvjet_tst_128x64",
              "aten::mm", "aten::bmm", "ampere_sgemm_128x64_tn"):
        assert torch_profile.is_matmul(k), k
    for k in ("softmax_warp_forward", "vectorized_elementwise_kernel", "aten::add_", "Memcpy DtoD"):
        assert not torch_profile.is_matmul(k), k


# ---- memory snapshots --------------------------------------------------------------------------

def synthetic_snapshot(live_at_end: int = 1000) -> dict:
    """Parameters (1000 B) live before recording; forward allocates 3 activations, backward frees them."""
    trace, addr = [], iter(range(1, 10**6))
    frames = [{"filename": "/torch/nn/functional.py", "line": 1, "name": "linear"},
              {"filename": "/repo/cs336_systems/model/layers.py", "line": 24, "name": "forward"},
              {"filename": "/repo/cs336_systems/profiling/steps.py", "line": 9, "name": "step"}]

    def ev(action, size, a=None):
        a = a or next(addr)
        trace.append({"action": action, "addr": a, "size": size, "frames": frames})
        return a

    m = ev("alloc", memory.MARKERS["forward"])
    ev("free_completed", memory.MARKERS["forward"], m)
    acts = [ev("alloc", s) for s in (100, 200, 300)]
    m = ev("alloc", memory.MARKERS["backward"])
    ev("free_completed", memory.MARKERS["backward"], m)
    for a, s in zip(reversed(acts), (300, 200, 100)):
        ev("free_completed", s, a)
    blocks = [{"state": "active_allocated", "size": 1024, "requested_size": live_at_end}]
    return {"device_traces": [trace], "segments": [{"blocks": blocks}]}


def test_timeline_starts_from_memory_allocated_before_recording():
    tl = memory.timeline(synthetic_snapshot())
    assert tl["start_bytes"] == 1000
    assert tl["bytes"] == [1100, 1300, 1600, 1300, 1100, 1000]  # markers removed
    assert tl["phases"] == [("forward", 0), ("backward", 3)]


def test_render_timeline_writes_a_png_and_reports_the_peak(tmp_path):
    out = memory.render_timeline(synthetic_snapshot(), tmp_path / "t.png", title="synthetic")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["peak_gib"] == pytest.approx(1600 / 2**30)


def test_largest_allocations_name_the_allocating_line_and_phase():
    rows = memory.largest_allocations(synthetic_snapshot(), top=2)
    assert [r["size_mib"] * 2**20 for r in rows] == [300, 200]
    assert rows[0]["site"] == "cs336_systems/model/layers.py:24 forward"  # not torch's, not the harness's
    assert rows[0]["phases"] == "forward"


def test_residual_stream_size_matches_the_handout_example():
    # 2.7B at context 128, batch 4, fp32: 4 x 128 x 2560 x 4 bytes = exactly 5 MiB
    assert memory.residual_stream_bytes(4, 128, get_config("2.7B").d_model, 4) == 5 * 2**20


# ---- mixed precision ---------------------------------------------------------------------------

def numpy_accumulate(acc, add, n=1000, value=0.01):
    """The same loop in numpy scalars: an independent IEEE reference."""
    s = acc(0)
    for _ in range(n):
        s = acc(s + acc(add(value)))
    return float(s)


def test_accumulation_loops_equal_an_ieee_reference():
    rows = {r["loop"]: r["value"] for r in mixed_precision.accumulation_rows("cpu")}
    assert rows["fp32 += fp32"] == numpy_accumulate(np.float32, np.float32)
    assert rows["fp16 += fp16"] == numpy_accumulate(np.float16, np.float16)
    assert rows["fp32 += fp16"] == numpy_accumulate(np.float32, np.float16)
    assert rows["fp32 += fp16.type(fp32)"] == rows["fp32 += fp16"]
    assert rows["fp16 += fp16"] < 10 < rows["fp32 += fp16"]


def test_autocast_keeps_parameters_loss_and_gradients_in_fp32():
    table = mixed_precision.autocast_dtypes("cpu", torch.bfloat16)
    assert table["parameters (inside autocast)"] == "float32"
    assert table["fc1 output"] == "bfloat16"
    assert table["logits"] == "bfloat16"
    assert table["loss"] == "float32"
    assert table["gradients"] == "float32"


# ---- attention memory accounting ---------------------------------------------------------------

def test_score_matrix_is_independent_of_head_dim_and_quadratic_in_seq():
    a, b = attention_memory(8, 1024, 16), attention_memory(8, 1024, 128)
    assert a["one_score_matrix"] == b["one_score_matrix"] == 8 * 1024 * 1024 * 4
    assert attention_memory(8, 2048, 16)["one_score_matrix"] == 4 * a["one_score_matrix"]


def test_saved_for_backward_matches_the_hand_count():
    """Autograd's saved tensors of the naive attention: Q, K, V and P, as attention_memory counts."""
    from cs336_systems.model import naive_attention

    batch, seq, d = 2, 64, 16
    q, k, v = (torch.randn(batch, seq, d, requires_grad=True) for _ in range(3))
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = naive_attention(q, k, v)
    acct = attention_memory(batch, seq, d)
    saved = sum(storages.values())
    vec = batch * seq * d * 4
    assert saved == acct["before_backward"] - vec  # everything live before backward but the output O
    assert out.numel() * 4 == vec


def test_largest_seq_that_fits_is_monotone_in_capacity():
    small, big = largest_seq_that_fits(8, 64, 40 * 2**30), largest_seq_that_fits(8, 64, 160 * 2**30)
    assert small < big
    assert attention_memory(8, small, 64)["backward_peak"] <= 40 * 2**30
