"""Two gloo ranks sharing ONE GPU (the fsdp bench's --ranks-per-gpu 2), at the tiny size: the path
the one-H200 memory run takes, checked end to end before it is spent on the 2026 xl.

    python -m pytest -q -v tests/test_fsdp_shared_gpu.py      # on a machine with a GPU

What only a GPU shows: both ranks land on cuda:0 with half its memory each, each rank's
max_memory_allocated is its own, and the CUDA allocator's history (fsdp/memory_timeline.py) finds
every all-gather of our FSDP's step and at most two of them alive at once.
"""

from __future__ import annotations

import json

import pytest
import torch

from cs336_systems.distributed import fsdp_bench
from cs336_systems.distributed.launch import Worker, spawn

pytestmark = [
    pytest.mark.gpu, pytest.mark.distributed,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (two ranks share it)"),
]


def _where(worker: Worker) -> tuple[str, float | None]:
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch only
    return str(worker.device), fraction(worker.device) if fraction else None


def test_two_ranks_land_on_one_gpu_with_half_its_memory_each():
    got = spawn(_where, 2, backend="gloo", device="cuda", ranks_per_gpu=2)
    assert [device for device, _ in got] == ["cuda:0", "cuda:0"]
    assert all(fraction in (0.5, None) for _, fraction in got)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("results")
    argv = ["--device", "cuda", "--backend", "gloo", "--ranks-per-gpu", "2", "--size", "tiny",
            "--variants", "ddp", "fsdp", "fsdp-bf16", "fsdp2", "--warmup", "1", "--steps", "1",
            "--results-dir", str(root)]
    assert fsdp_bench.main(argv) == 0
    (path,) = (root / "fsdp/steps").glob("*.jsonl")
    return {r["variant"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_each_rank_reports_its_own_peak_and_no_step_time(rows):
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    for variant, r in rows.items():
        assert r["status"] == "ok" and r["ranks_per_gpu"] == 2 and r["gpus"] == 1, variant
        assert r["step_ms"] is None and "share one GPU" in r["step_times"], variant
        assert len(r["peak_allocated_gib_per_rank"]) == 2 and min(r["peak_allocated_gib_per_rank"]) > 0
        assert r["memory_cap_gib"] == pytest.approx(total_gib / 2)


def test_our_fsdp_gathers_are_freed_and_bounded_on_the_gpu_allocator(rows):
    for variant in ("fsdp", "fsdp-bf16"):
        r = rows[variant]
        assert r["gathers_seen"] == [r["gathers_expected"]] * 2, f"{variant}: every gather found"
        assert r["gathered_max_alive_forward"] <= 2 and r["gathered_max_alive_backward"] <= 2, variant
        assert r["gathered_left_at_forward_end"] == 0 and r["gathered_left_at_backward_end"] == 0
        assert r["gathered_within_bound"], variant
    assert "gathered_memory" not in rows["fsdp2"] and "gathered_memory" not in rows["ddp"]
