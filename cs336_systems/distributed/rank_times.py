"""Step times across ranks: a data-parallel step ends when its slowest rank does."""

from __future__ import annotations

import torch.distributed as dist

from .launch import Worker


def slowest_per_step(worker: Worker, times: list[float]) -> list[float]:
    """Per iteration, the slowest rank's time (ranks drift; a step ends when the last one does).
    A collective: every rank calls it with its own list of the same length."""
    gathered: list[list[float]] = [None] * worker.world_size  # type: ignore[list-item]
    dist.all_gather_object(gathered, times)
    return [max(r[i] for r in gathered) for i in range(len(times))]
