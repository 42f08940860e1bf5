"""The collectives and DDP benchmarks end to end on tiny grids (2 gloo ranks), and their argument
checks. The committed grids are the defaults; here everything is shrunk to seconds."""

from __future__ import annotations

import json

import pytest

from cs336_systems.distributed import collectives_bench, ddp_bench

pytestmark = pytest.mark.distributed


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_collectives_rows_and_resume(tmp_path):
    argv = ["--backend", "gloo", "--world-sizes", "2", "--sizes-mb", "0.5", "1",
            "--iters", "2", "--results-dir", str(tmp_path)]
    assert collectives_bench.main(argv) == 0
    rows = _rows(tmp_path / "collectives/all_reduce/cpu.jsonl")
    assert {(r["backend"], r["device_type"], r["size_mb"], r["status"]) for r in rows} == {
        ("gloo", "cpu", 0.5, "ok"), ("gloo", "cpu", 1, "ok")}
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2 ranks: 2(n-1)/n = 1
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_ms"] / 1e6)
    assert collectives_bench.main([*argv, "--resume"]) == 0  # that run is complete: nothing new
    assert len(_rows(tmp_path / "collectives/all_reduce/cpu.jsonl")) == len(rows)
    assert collectives_bench.main(argv) == 0  # a new run measures every cell again
    assert len(_rows(tmp_path / "collectives/all_reduce/cpu.jsonl")) == 2 * len(rows)


def test_collectives_cells_the_host_cannot_hold_leave_no_row(tmp_path, monkeypatch, capsys):
    """Not run is not measured: no 'skipped' row, a line on stderr, exit 3 (incomplete)."""
    monkeypatch.setattr(collectives_bench, "mem_available_bytes", lambda: 2 * 1024**3)  # 2 GiB free
    argv = ["--world-sizes", "2", "--sizes-mb", "0.5", "4096", "--iters", "1", "--warmup", "0",
            "--results-dir", str(tmp_path)]
    assert collectives_bench.main(argv) == 3
    assert "not running" in capsys.readouterr().err
    assert [r["size_mb"] for r in _rows(tmp_path / "collectives/all_reduce/cpu.jsonl")] == [0.5]


def test_ddp_bench_rows_and_traces(tmp_path):
    argv = ["--size", "tiny", "--stages", "compute-only", "flat", "bucketed", "torch-ddp",
            "--bucket-sizes-mb", "0.1", "--warmup", "1", "--steps", "1", "--rounds", "1",
            "--results-dir", str(tmp_path)]
    assert ddp_bench.main(argv) == 0
    rows = {r["stage"]: r for r in _rows(tmp_path / "ddp/steps/cpu.jsonl")}
    assert set(rows) == {"compute-only", "flat", "bucketed", "torch-ddp"}
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in rows.values())
    assert rows["flat"]["allreduce_calls"] == 1 and rows["bucketed"]["allreduce_calls"] > 1
    assert rows["flat"]["sync_ms"] > 0 and rows["torch-ddp"]["sync_ms"] is None
    traces = {r["stage"]: r for r in _rows(tmp_path / "ddp/trace/cpu.jsonl")}
    assert traces["flat"]["overlap_fraction"] == pytest.approx(0.0, abs=0.05)  # comm after backward
    assert traces["compute-only"]["comm"] == []
    assert set(traces["bucketed"]["phases"]) >= {"forward", "backward", "sync", "optimizer"}


@pytest.mark.parametrize("module, argv, word", [
    (collectives_bench, ["--world-sizes", "1"], "--world-sizes"),
    (collectives_bench, ["--sizes-mb", "0"], "--sizes-mb"),
    (ddp_bench, ["--backend", "nccl"], "--backend"),
    (ddp_bench, ["--size", "huge"], "--size"),
    (ddp_bench, ["--batch-size", "3"], "--batch-size"),
])
def test_bad_arguments_exit_2(module, argv, word, capsys):
    with pytest.raises(SystemExit) as info:
        module.main(argv)
    assert info.value.code == 2 and word in capsys.readouterr().err


def _event(name, start_us, end_us, gpu, annotation=False):
    from types import SimpleNamespace

    import torch

    kind = torch.autograd.DeviceType.CUDA if gpu else torch.autograd.DeviceType.CPU
    return SimpleNamespace(name=name, device_type=kind, is_user_annotation=annotation,
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def test_gpu_timeline_ignores_annotations():
    """The profiler projects record_function ranges onto the GPU timeline; they are not compute.
    A naive step: backward kernels 0-100 ms, then one NCCL kernel 110-130 ms inside the sync
    phase, whose GPU annotation spans 105-135 ms. Nothing overlaps (the first H200 traces said 1)."""
    from cs336_systems.distributed import step_trace

    events = [
        _event("ddp:backward", 0, 100_000, gpu=False),
        _event("ddp:sync", 104_000, 136_000, gpu=False),
        _event("sm90_gemm_kernel", 0, 60_000, gpu=True),
        _event("elementwise_kernel", 60_000, 100_000, gpu=True),
        _event("ddp:sync", 105_000, 135_000, gpu=True, annotation=True),
        _event("nccl:all_reduce", 110_000, 130_000, gpu=True, annotation=True),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 110_000, 130_000, gpu=True),
        _event("record_param_comms", 109_000, 131_000, gpu=True, annotation=True),
    ]
    tl = step_trace.timeline(type("Prof", (), {"events": lambda self: events})())
    assert tl["compute"] == [(0.0, 100.0)]
    assert tl["comm"] == [(110.0, 130.0)]
    assert tl["comm_busy_ms"] == pytest.approx(20.0)
    assert tl["overlap_fraction"] == 0.0
    assert set(tl["phases"]) == {"backward", "sync"}
