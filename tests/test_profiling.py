"""Profiling instruments: kernel attribution, the memory-timeline renderer, accumulation and
autocast tables, and the attention memory accounting, each against an independent reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import DeviceType

from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory, largest_seq_that_fits
from cs336_systems.model import get_config
from cs336_systems.profiling import kernel_attribution, memory, mixed_precision, torch_profile
from cs336_systems.profiling.steps import build_model

# ---- kernel attribution ------------------------------------------------------------------------

class RawEvent:
    """A stand-in for torch's raw profiler event (torch._C._autograd._KinetoEvent): the methods
    torch's own parser and from_kineto call. Times in us here, ns on the wire."""

    def __init__(self, name, start, end, corr, linked=0, *, device=False, thread=1, stream=None,
                 user=False):
        self._v = {"name": name, "start_ns": int(start * 1000), "end_ns": int(end * 1000),
                   "correlation_id": corr, "linked_correlation_id": linked,
                   "device_type": DeviceType.CUDA if device else DeviceType.CPU,
                   "device_index": 0, "device_resource_id": stream if stream is not None else (7 if device else thread),
                   "start_thread_id": thread, "end_thread_id": thread, "fwd_thread_id": thread,
                   "is_user_annotation": user, "duration_ns": int((end - start) * 1000)}

    def __getattr__(self, attr):
        if attr.startswith("__") or attr == "_v":
            raise AttributeError(attr)
        if attr in self._v:
            return lambda: self._v[attr]
        defaults = {"is_async": False, "is_hidden_event": False, "is_python_function": False,
                    "cuda_elapsed_us": 0, "privateuse1_elapsed_us": 0, "sequence_nr": -1, "scope": 0,
                    "flops": 0, "overload_name": "", "metadata_json": "", "activity_type": "", "kwinputs": {},
                    "stack": [], "shapes": [], "dtypes": [], "concrete_inputs": [],
                    "structured_input_shapes": [], "structured_input_strides": []}
        return lambda: defaults.get(attr, 0 if attr.endswith("_id") else None)


def duplicating_trace() -> list[RawEvent]:
    """One step whose raw events hold each duplication pattern that makes torch's per-op kernel lists
    count a kernel twice, and one that must not (a kernel below two nested ops):

    - the forward's aten::mm (op id 5) is listed twice: its gemm is appended to both copies;
    - an op-less runtime call in the forward has CUPTI correlation id 7, equal to the backward op's
      id: torch appends the backward's gemm to it;
    - the optimizer's kernel is listed twice among the device events.
    Unique kernel time: forward 80 + 400 us (of a 1000 us range), backward 500, optimizer 300.
    """
    R = RawEvent
    return [
        R("forward", 0, 1000, 1, user=True), R("attn_scores", 100, 200, 2, user=True),
        R("aten::matmul", 110, 190, 3), R("aten::bmm", 120, 180, 4),
        R("cudaLaunchKernel", 130, 140, 9001, 4),
        R("aten::mm", 300, 400, 5), R("aten::mm", 300, 400, 5),  # the same op, listed twice
        R("cudaLaunchKernel", 310, 320, 9002, 5),
        R("cudaDeviceSynchronize", 950, 999, 7),  # op-less runtime call; its CUPTI id is 7
        R("backward", 1000, 2000, 6, user=True),
        R("aten::mm", 1100, 1300, 7, thread=2), R("cudaLaunchKernel", 1110, 1120, 9003, 7, thread=2),
        R("optimizer", 2000, 3000, 8, user=True), R("Optimizer.step#AdamW.step", 2010, 2990, 9, user=True),
        R("aten::add_", 2100, 2200, 10), R("cudaLaunchKernel", 2110, 2120, 9004, 10),
        R("sm90_xmma_gemm_f32_tn", 400, 480, 9001, 4, device=True),
        R("sm90_xmma_gemm_f32_tn", 500, 900, 9002, 5, device=True),
        R("sm90_xmma_gemm_f32_nt", 1400, 1900, 9003, 7, device=True),
        R("vectorized_elementwise_kernel", 2300, 2600, 9004, 10, device=True),
        R("vectorized_elementwise_kernel", 2300, 2600, 9004, 10, device=True),  # listed twice
        R("Optimizer.step#AdamW.step", 2300, 2600, 9, device=True, user=True),  # GPU copy of a range
    ]


def torch_function_events(raw: list[RawEvent]):
    """torch's own parser (the one behind prof.events()) run on the raw events."""
    parse = getattr(torch.autograd.profiler.profile, "_parse_kineto_results", None)
    if parse is None:
        pytest.skip("this torch has no profile._parse_kineto_results")

    class Result:
        def events(self):
            return raw

        def trace_start_ns(self):
            return 0

    return parse(type("Prof", (), {"use_device": "cuda"})(), Result())


class FakeProfile:
    """What torch_profile.profiled_totals reads of a finished torch.profiler.profile."""

    def __init__(self, raw):
        self.raw = raw
        self.profiler = type("P", (), {"kineto_results": type("K", (), {"events": lambda _: raw})()})()

    def events(self):
        return torch_function_events(self.raw)


def test_torchs_per_op_kernel_lists_count_the_duplicated_kernels_twice():
    """The failure our first version had: summing FunctionEvent.kernels by launch phase."""
    appended = torch_profile.appended_kernel_ms(torch_function_events(duplicating_trace()))
    assert appended["forward"] == pytest.approx((80 + 2 * 400 + 500) / 1e3)  # > the 1 ms range
    assert appended["optimizer"] == pytest.approx(2 * 300 / 1e3)


def test_each_kernel_is_counted_once_in_the_phase_and_region_of_its_launch():
    rows, totals = torch_profile.profiled_totals(FakeProfile(duplicating_trace()), torch.device("cuda"))
    got = {(r["phase"], r["region"], r["kernel"]): (r["calls"], r["total_ms"]) for r in rows}
    assert got == {("forward", "attn_scores", "sm90_xmma_gemm_f32_tn"): (1, pytest.approx(0.080)),
                   ("forward", "", "sm90_xmma_gemm_f32_tn"): (1, pytest.approx(0.400)),
                   ("backward", "", "sm90_xmma_gemm_f32_nt"): (1, pytest.approx(0.500)),
                   ("optimizer", "", "vectorized_elementwise_kernel"): (1, pytest.approx(0.300))}
    for phase, ms, wall in (("forward", 0.480, 1.0), ("backward", 0.500, 1.0), ("optimizer", 0.300, 1.0)):
        assert totals[phase]["kernel_ms"] == pytest.approx(ms)
        assert totals[phase]["wall_ms"] == pytest.approx(wall)
        assert totals[phase]["kernel_ms"] <= totals[phase]["wall_ms"]
    assert totals["forward"]["matmul_ms"] == pytest.approx(0.480)
    assert totals["forward"]["appended_ms"] == pytest.approx(1.380)  # the old sum, kept as evidence
    check = totals["(check)"]
    assert check["unique_kernel_ms"] == pytest.approx(1.280) == check["attributed_ms"]
    assert (check["repeated_device_events"], check["copied_host_events"], check["colliding_host_ids"]) == (1, 1, 1)
    assert check["launch_by_runtime_call"] == 4 and check["stream_overlap_ms"] == 0
    assert totals["(all device events)"]["kernel_ms"] == pytest.approx(1.280)  # the range copy left out


def test_kernels_without_a_runtime_record_fall_back_to_their_op_then_to_gpu_time():
    T = kernel_attribution.TraceEvent
    events = [T("forward", False, 0, 100, 1, annotation=True), T("backward", False, 100, 200, 2, annotation=True),
              T("aten::mm", False, 10, 20, 3),
              T("gemm_a", True, 30, 40, 501, 3),  # no runtime call recorded: the op's start places it
              T("gemm_b", True, 150, 170, 502, 0)]  # linked to nothing: its GPU start places it
    rows, totals = kernel_attribution.attribute_kernels(events)
    assert {r["phase"]: r["kernel"] for r in rows} == {"forward": "gemm_a", "backward": "gemm_b"}
    assert (totals["(check)"]["launch_by_op"], totals["(check)"]["placed_by_gpu_time"]) == (1, 1)


def test_stream_overlap_flags_work_listed_twice_under_two_ids():
    T = kernel_attribution.TraceEvent
    ks = [T("k", True, 0, 10, 1), T("k", True, 5, 12, 2), T("k", True, 12, 20, 3), T("k", True, 0, 10, 4, stream=1)]
    assert kernel_attribution.stream_overlap_us(ks) == pytest.approx(5.0)


def test_from_kineto_reads_a_real_cpu_profile():
    x = torch.randn(8, 8, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("forward"):
            y = (x @ x).sum()
    events = kernel_attribution.from_kineto(prof.profiler.kineto_results.events())
    fwd = [e for e in events if e.name == "forward"]
    assert len(fwd) == 1 and fwd[0].annotation and not fwd[0].on_device and fwd[0].end_us > fwd[0].start_us
    mm = [e for e in events if e.name == "aten::mm"]
    assert mm and fwd[0].start_us <= mm[0].start_us <= mm[0].end_us <= fwd[0].end_us
    assert y.item() == y.item()


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


def test_timeline_series_keeps_every_event_or_the_peak_of_each_run():
    full = memory.timeline_series(synthetic_snapshot())
    gib = [b / 2**30 for b in (1000, 1100, 1300, 1600, 1300, 1100, 1000)]  # start, then each event
    assert full["event"] == list(range(7)) and full["gib"] == pytest.approx(gib)
    assert full["phases"] == [["forward", 0], ["backward", 3]] and full["events"] == 6
    assert full["phase_gib"] == pytest.approx([1000 / 2**30, 1600 / 2**30])  # the level as each phase starts
    assert full["peak_gib"] == pytest.approx(1600 / 2**30) and full["start_gib"] == pytest.approx(1000 / 2**30)
    thin = memory.timeline_series(synthetic_snapshot(), points=3)  # runs of 3 events: their maxima
    assert thin["event"] == [0, 3, 6] and thin["gib"] == pytest.approx([1300 / 2**30, 1600 / 2**30, 1000 / 2**30])
    assert thin["phase_gib"] == full["phase_gib"]  # exact whatever the thinning


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
