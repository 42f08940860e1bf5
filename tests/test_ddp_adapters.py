"""The course's DDP flow, through tests/adapters.py exactly as the course's tests call it.

Per step: on_train_batch_start (bucketed only), zero_grad, forward on this rank's shard, backward,
on_after_backward, step -- hook adapters called by keyword. Two gloo ranks, both toy models of the
course, bucket sizes None / 0.0001 / 0.0016 / 0.01 MB. One process group runs every case.

Each rank must end bit for bit equal to the same arithmetic without the wrapper, computed in the
rank (`train_sharded_reference`: each shard's gradient / 2, summed, an SGD step): for 2 ranks that is
exactly the all-reduce's arithmetic, so the tolerance is 0 on any CPU (tests/test_ddp_stages.py
explains why, and also checks every stage's gradients against full-batch float64 training).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cs336_systems.distributed.launch import Worker, spawn
from tests import adapters
from tests.toy_models import assert_states_close, make_batches, make_model, shard, state_of, train_sharded_reference

pytestmark = pytest.mark.distributed

STEPS = 5
BATCH = 8
CASES = [("individual", None, m) for m in ("ToyModel", "ToyModelWithTiedWeights")] + [
    ("bucketed", mb, m) for mb in (None, 0.0001, 0.0016, 0.01)
    for m in ("ToyModel", "ToyModelWithTiedWeights")]
IDS = [f"{kind}-{mb}-{model}" for kind, mb, model in CASES]


def _train(worker: Worker, kind: str, bucket_size_mb: float | None, model_name: str) -> dict:
    module = make_model(model_name, seed=7 + worker.rank)
    if kind == "individual":
        ddp = adapters.get_ddp_individual_parameters(module)
        on_start, on_after_backward = None, adapters.ddp_individual_parameters_on_after_backward
    else:
        ddp = adapters.get_ddp_bucketed(module, bucket_size_mb=bucket_size_mb)
        on_start = adapters.ddp_bucketed_on_train_batch_start
        on_after_backward = adapters.ddp_bucketed_on_after_backward
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in make_batches(STEPS, BATCH, seed=3):
        if on_start is not None:
            on_start(ddp_model=ddp, optimizer=optimizer)
        optimizer.zero_grad(set_to_none=True)
        x, y = shard((x, y), worker.rank, worker.world_size)
        nn.functional.mse_loss(ddp(x), y).backward()
        on_after_backward(ddp_model=ddp, optimizer=optimizer)
        optimizer.step()
    # The course's SGD sees frozen parameters too (they have no grad, so SGD skips them).
    same_arithmetic = train_sharded_reference(make_model(model_name, seed=7), make_batches(STEPS, BATCH, seed=3),
                                              worker.world_size)
    return {"final": state_of(ddp.module), "same_arithmetic": state_of(same_arithmetic)}


def _run_all(worker: Worker) -> list[dict]:
    return [_train(worker, *case) for case in CASES]


@pytest.fixture(scope="module")
def ranks() -> list[list[dict]]:
    return spawn(_run_all, 2, timeout_s=90)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_adapter_flow_matches_single_process(ranks, index):
    for rank in range(2):
        seen = ranks[rank][index]
        assert_states_close(seen["final"], seen["same_arithmetic"], rtol=0, atol=0,
                            context=f"{IDS[index]} rank {rank}")
