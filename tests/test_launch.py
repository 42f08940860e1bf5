"""The launcher: results by rank, a failing rank's error surfaces (no hang), timeouts, bad input."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from cs336_systems.distributed.launch import RankFailed, Worker, spawn

pytestmark = pytest.mark.distributed


def _sum_ranks(worker: Worker, scale: float) -> tuple[int, int, list[float]]:
    t = torch.full((3,), float(worker.rank + 1) * scale)
    dist.all_reduce(t)
    return worker.rank, worker.world_size, t.tolist()


def _rank1_raises(worker: Worker) -> None:
    if worker.rank == 1:
        time.sleep(0.2)
        raise ValueError("rank one refuses")
    t = torch.ones(1)
    dist.all_reduce(t)  # the other ranks would block here forever without the launcher's care


def _rank0_stalls(worker: Worker) -> None:
    if worker.rank == 0:
        time.sleep(60)
    dist.barrier()


def test_results_come_back_by_rank():
    out = spawn(_sum_ranks, 3, 2.0)
    assert out == [(r, 3, [12.0] * 3) for r in range(3)]  # 2 * (1 + 2 + 3)


def test_failing_rank_brings_the_others_down_with_its_message():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        spawn(_rank1_raises, 3, timeout_s=30)
    assert info.value.rank == 1
    assert "rank one refuses" in str(info.value)
    assert time.monotonic() - start < 25  # torn down, not waiting out the collective timeout


def test_collective_timeout_ends_a_stalled_job():
    start = time.monotonic()
    with pytest.raises(RankFailed):
        spawn(_rank0_stalls, 2, timeout_s=3)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), "world_size"),
    (dict(world_size=2, backend="mpi"), "backend"),
    (dict(world_size=2, backend="nccl", device="cpu"), "nccl"),
    (dict(world_size=2, timeout_s=0), "timeout_s"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spawn(_sum_ranks, **kwargs)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs fewer GPUs than asked for")
def test_nccl_without_enough_gpus_is_refused_before_spawning():
    with pytest.raises(ValueError, match="GPU"):
        spawn(_sum_ranks, 64, 1.0, backend="nccl")
