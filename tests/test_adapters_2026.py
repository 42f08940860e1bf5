"""The 2026 edition's adapter names: their signatures (the course's tests call the hooks by
keyword) and the renamed DDP flow on 2 gloo ranks against single-process training. The FSDP
adapters are exercised throughout tests/test_fsdp.py."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from cs336_systems.distributed.ddp.overlap import DDPOverlapIndividual
from cs336_systems.distributed.launch import Worker, spawn
from tests import adapters
from tests.toy_models import (
    assert_states_close,
    make_batches,
    make_model,
    shard,
    state_of,
    train_sharded_reference,
)

STEPS, BATCH = 3, 8
MODELS = ["ToyModel", "ToyModelWithTiedWeights"]


@pytest.mark.parametrize("name, parameters", [
    ("get_ddp", ["module"]),
    ("ddp_on_after_backward", ["ddp_model", "optimizer"]),
    ("get_fsdp", ["module", "compute_dtype"]),
    ("fsdp_on_after_backward", ["fsdp_model", "optimizer"]),
    ("fsdp_gather_full_params", ["fsdp_model"]),
    # 2025's names stay
    ("get_ddp_individual_parameters", ["module"]),
    ("get_ddp_bucketed", ["module", "bucket_size_mb"]),
    ("get_sharded_optimizer", ["params", "optimizer_cls", "kwargs"]),
])
def test_adapter_signatures(name, parameters):
    assert list(inspect.signature(getattr(adapters, name)).parameters) == parameters
    if name == "get_fsdp":
        assert inspect.signature(adapters.get_fsdp).parameters["compute_dtype"].default is None


def test_both_triton_flash_names_give_the_same_class():
    assert adapters.get_flash_autograd_function_triton() is \
        adapters.get_flashattention_autograd_function_triton()


def _train(worker: Worker, model_name: str) -> dict:
    ddp = adapters.get_ddp(make_model(model_name, seed=7 + worker.rank))
    assert isinstance(ddp, DDPOverlapIndividual)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in make_batches(STEPS, BATCH, seed=5):
        optimizer.zero_grad(set_to_none=True)
        x, y = shard((x, y), worker.rank, worker.world_size)
        nn.functional.mse_loss(ddp(x), y).backward()
        adapters.ddp_on_after_backward(ddp_model=ddp, optimizer=optimizer)
        optimizer.step()
    # the same arithmetic without the wrapper, in this rank (tests/test_ddp_stages.py: bit for bit)
    same_arithmetic = train_sharded_reference(make_model(model_name, seed=7), make_batches(STEPS, BATCH, seed=5),
                                              worker.world_size)
    return {"final": state_of(ddp.module), "same_arithmetic": state_of(same_arithmetic)}


def _run_all(worker: Worker) -> list[dict]:
    return [_train(worker, m) for m in MODELS]


@pytest.mark.distributed
def test_get_ddp_flow_matches_single_process_training():
    ranks = spawn(_run_all, 2, timeout_s=90)
    for i, model_name in enumerate(MODELS):
        for rank, seen in enumerate(r[i] for r in ranks):
            assert_states_close(seen["final"], seen["same_arithmetic"], rtol=0, atol=0,
                                context=f"{model_name} rank {rank}")
