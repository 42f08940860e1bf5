"""Every DDP stage on 2 gloo ranks against single-process training of the same model.

One process group serves the whole module: a module-scoped fixture spawns 2 ranks once, runs every
case inside it (stage x bucket size x toy model x scenario) and returns what each rank saw; the
parametrized tests below then check one case each.

What a case checks: rank 1 starts from different weights, so equality after wrapping proves the
broadcast (frozen parameters and buffers included); frozen parameters got no hooks and did not
move; unused parameters keep grad None; parameters() are the module's own; and training is right,
in two checks whose tolerances are derived, not tuned (tests/tolerances.py):

1. Bit for bit against the same arithmetic in one process (`train_sharded_reference`, run inside
   each rank): each rank's shard gradient, divided by 2, summed, then the optimizer's step. For 2
   ranks the all-reduce computes exactly that (the sum of two numbers is the same in either order,
   dividing by 2 is exact), and everything else is the same operations on the same values, so the
   tolerance is 0, for SGD, AdamW and accumulation alike, on any CPU and kernel set.
2. The semantics, against full-batch single-process training: at every step, the gradient the
   ranks agreed on equals the float64 gradient of the whole batch's loss at the same weights, within
   (gamma_N(float32) + gamma_N(float64)) times the gradient's magnitude (sum of |terms|). Weights
   after several AdamW steps are *not* compared with full-batch training: Adam divides each
   gradient element by its own running RMS, so an element whose gradient nearly cancels (a sum of
   terms far larger than the result) has a sign and size set by rounding, and can move by up to
   ~2 lr per step between two float32 summation orders (its update is +-lr times a ratio of size ~1
   either way). That is the miss of 4.3e-6 an AVX-512 CPU produced against an atol tuned on AVX2.
   SGD's update is linear in the gradient, so check 2 at every step covers it too.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.distributed.ddp import STAGES
from cs336_systems.distributed.launch import Worker, spawn
from tests.tolerances import assert_within, float32_vs_float64_gradient_bound, mlp_rounding_depth
from tests.toy_models import assert_states_close, make_batches, make_model, shard, state_of, train_sharded_reference

pytestmark = pytest.mark.distributed

WORLD_SIZE = 2
STEPS = 4
BATCH = 8
MODELS = ["ToyModel", "ToyModelWithTiedWeights", "ToyModelWithUnusedParameter", "ToyModelWithBuffer"]
STAGE_CONFIGS = [("naive", {}), ("flat", {}), ("overlap", {})] + [
    ("bucketed", {"bucket_size_mb": mb}) for mb in (None, 0.0001, 0.0016, 0.01, 1.0)]
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.05, weight_decay=0.1),
}


def _case_id(stage: str, kwargs: dict, model: str, scenario: str) -> str:
    extra = "".join(f"-{v}MB" for v in kwargs.values())
    return f"{stage}{extra}-{model}-{scenario}"


# scenario: "plain" (SGD, one backward per step), "adamw", "accumulate" (2 micro-batches, no_sync)
MICRO_BATCHES = {"plain": 1, "adamw": 1, "accumulate": 2}
CASES = [(stage, kwargs, model, "plain") for stage, kwargs in STAGE_CONFIGS for model in MODELS]
CASES += [(stage, kwargs, "ToyModelWithTiedWeights", scenario)
          for stage, kwargs in STAGE_CONFIGS for scenario in ("adamw", "accumulate")]
CASE_IDS = [_case_id(*case) for case in CASES]


def _train_one(worker: Worker, stage: str, kwargs: dict, model_name: str, scenario: str) -> dict:
    module = make_model(model_name, seed=100 + worker.rank)  # ranks start different on purpose
    ddp = STAGES[stage](module, **kwargs)
    after_broadcast = state_of(ddp.module)
    optimizer = OPTIMIZERS["adamw" if scenario == "adamw" else "sgd"](
        [p for p in ddp.parameters() if p.requires_grad])
    loss_fn = nn.functional.mse_loss
    steps = []  # per step: (weights before it, the gradients the ranks agreed on)
    for x, y in make_batches(STEPS, BATCH):
        weights = state_of(ddp.module)
        ddp.on_train_batch_start()
        optimizer.zero_grad(set_to_none=True)
        x, y = shard((x, y), worker.rank, worker.world_size)
        if scenario == "accumulate":  # two micro-batches; the first only accumulates locally
            with ddp.no_sync():
                (loss_fn(ddp(x[:2]), y[:2]) / 2).backward()
            (loss_fn(ddp(x[2:]), y[2:]) / 2).backward()
        else:
            loss_fn(ddp(x), y).backward()
        ddp.finish_gradient_synchronization()
        steps.append((weights, {n: p.grad.clone() for n, p in ddp.module.named_parameters()
                                if p.grad is not None}))
        optimizer.step()
    # the same arithmetic in this process, without the wrapper (rank 0's initial weights)
    same_arithmetic = train_sharded_reference(
        make_model(model_name, seed=100), make_batches(STEPS, BATCH), worker.world_size,
        OPTIMIZERS["adamw" if scenario == "adamw" else "sgd"],
        micro_batches=MICRO_BATCHES[scenario])
    return {
        "after_broadcast": after_broadcast,
        "final": state_of(ddp.module),
        "same_arithmetic": state_of(same_arithmetic),
        "steps": steps,
        "grad_is_none": {n: p.grad is None for n, p in ddp.module.named_parameters()},
        "hooked": {n: bool(p._post_accumulate_grad_hooks) for n, p in ddp.module.named_parameters()},
        "same_parameters": [id(p) for p in ddp.parameters()] == [id(p) for p in module.parameters()],
    }


def _double_backward_error(worker: Worker, stage: str, kwargs: dict) -> str:
    """Two backward passes without finishing in between must raise, not average half a gradient."""
    ddp = STAGES[stage](make_model("ToyModel", seed=0), **kwargs)
    x, y = shard(make_batches(1, BATCH)[0], worker.rank, worker.world_size)
    nn.functional.mse_loss(ddp(x), y).backward()
    try:
        nn.functional.mse_loss(ddp(x), y).backward()
    except RuntimeError as exc:
        return str(exc)
    finally:
        ddp.finish_gradient_synchronization()  # drain the first backward's all-reduces
        dist.barrier()
    return ""


def _reentrant_checkpoint_error(worker: Worker, stage: str, kwargs: dict) -> str:
    """A reentrant checkpoint runs an inner backward: the tied weight then accumulates twice in
    one step (once inside, once outside). The overlapped stages must refuse, not send half of it."""
    from torch.utils.checkpoint import checkpoint

    ddp = STAGES[stage](make_model("ToyModelWithTiedWeights", seed=0), **kwargs)
    m = ddp.module
    x, y = shard(make_batches(1, BATCH)[0], worker.rank, worker.world_size)
    x.requires_grad_(True)
    try:
        inner = checkpoint(lambda t: m.relu(m.fc2(m.relu(m.fc1(t)))), x, use_reentrant=True)
        out = m.fc5(m.relu(m.fc4(m.relu(m.fc3(inner)))))  # fc4 shares fc2's weight
        nn.functional.mse_loss(out, y).backward()
    except RuntimeError as exc:
        return str(exc)
    finally:
        ddp.finish_gradient_synchronization()
        dist.barrier()
    return ""


def _run_all(worker: Worker) -> dict:
    out = {cid: _train_one(worker, *case) for cid, case in zip(CASE_IDS, CASES)}
    overlapped = [("overlap", {}), ("bucketed", {"bucket_size_mb": 0.01})]
    out["double_backward"] = {s: _double_backward_error(worker, s, k) for s, k in overlapped}
    out["reentrant"] = {s: _reentrant_checkpoint_error(worker, s, k) for s, k in overlapped}
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_run_all, WORLD_SIZE, timeout_s=90)


def _check_against_full_batch(model_name: str, scenario: str, steps: list, context: str) -> None:
    """Check 2 of the module docstring: each step's agreed gradient against the float64 gradient of
    the whole batch's loss at the same weights, within the derived bound."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny float64 products: a second thread only waits (5-10x slower)
    try:
        _check_steps(model_name, scenario, steps, context)
    finally:
        torch.set_num_threads(threads)


def _check_steps(model_name: str, scenario: str, steps: list, context: str) -> None:
    model = make_model(model_name, seed=0).double()
    # roundings per path: a shard's forward/backward, then the micro-batch accumulation and the
    # all-reduce's addition (dividing by 2 is exact); the full-batch float64 path is shorter
    depth = mlp_rounding_depth(model, BATCH, extra_terms=MICRO_BATCHES[scenario] + WORLD_SIZE)
    for t, ((weights, grads), (x, y)) in enumerate(zip(steps, make_batches(STEPS, BATCH))):
        model.load_state_dict({k: v.double() for k, v in weights.items()})
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x.double()), y.double()).backward()
        expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == expected.keys(), f"{context} step {t}: parameters with gradients differ"
        bound = float32_vs_float64_gradient_bound(model, x, y, depth)
        for name, g in grads.items():
            assert_within(g, expected[name], bound[name], f"{context} step {t}: {name}.grad")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_stage_matches_single_process_training(ranks, case):
    stage, kwargs, model_name, scenario = case
    cid = _case_id(*case)
    initial = state_of(make_model(model_name, seed=100))  # rank 0's initial weights
    for rank, seen in enumerate(r[cid] for r in ranks):
        # Broadcast on construction: every parameter and buffer, frozen ones included, is rank 0's.
        assert_states_close(seen["after_broadcast"], initial, rtol=0, atol=0,
                            context=f"{cid} rank {rank} after construction")
        # Check 1: bit for bit the same arithmetic without the wrapper (tolerance 0, see above).
        assert_states_close(seen["final"], seen["same_arithmetic"], rtol=0, atol=0,
                            context=f"{cid} rank {rank} after training, against the same arithmetic")
        # Check 2: every step's gradient is the full batch's, to within rounding.
        _check_against_full_batch(model_name, scenario, seen["steps"], f"{cid} rank {rank}")
        assert seen["same_parameters"], "the wrapper's parameters() must be the module's own"
    for name in ranks[0][cid]["final"]:  # the ranks apply identical updates: bit-identical
        assert torch.equal(ranks[0][cid]["final"][name], ranks[1][cid]["final"][name]), name


@pytest.mark.parametrize("stage, kwargs", STAGE_CONFIGS, ids=[_case_id(s, k, "", "")[:-2]
                                                              for s, k in STAGE_CONFIGS])
def test_frozen_and_unused_parameters(ranks, stage, kwargs):
    toy = ranks[0][_case_id(stage, kwargs, "ToyModel", "plain")]
    if stage in ("overlap", "bucketed"):
        assert toy["hooked"] == {"fc1.weight": True, "fc2.fc.weight": True, "fc2.fc.bias": False,
                                 "fc3.weight": True, "no_grad_fixed_param": False}
    assert toy["grad_is_none"]["fc2.fc.bias"] and toy["grad_is_none"]["no_grad_fixed_param"]
    unused = ranks[1][_case_id(stage, kwargs, "ToyModelWithUnusedParameter", "plain")]
    assert unused["grad_is_none"] == {"fc1.weight": False, "fc1.bias": False, "unused.weight": True,
                                      "unused.bias": True, "fc2.weight": False, "fc2.bias": False}


@pytest.mark.parametrize("stage", ["overlap", "bucketed"])
def test_second_accumulation_before_finish_raises(ranks, stage):
    for r in ranks:
        assert "no_sync" in r["double_backward"][stage]
        assert "accumulated again" in r["reentrant"][stage]


def test_tied_weight_hook_fires_once_per_backward():
    """Autograd sums a leaf's contributions before its AccumulateGrad node runs, so the tied weight's
    post-accumulate hook fires once per backward, like every other parameter's."""
    model = make_model("ToyModelWithTiedWeights", seed=0)
    fired: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p, name=name: fired.__setitem__(name, fired.get(name, 0) + 1))
    x, y = make_batches(1, BATCH)[0]
    nn.functional.mse_loss(model(x), y).backward()
    assert fired == {"fc1.weight": 1, "fc2.fc.weight": 1, "fc3.weight": 1, "fc5.weight": 1}


def test_tied_weight_appears_once():
    tied = make_model("ToyModelWithTiedWeights", seed=0)
    assert tied.fc2.fc.weight is tied.fc4.weight
    assert sum(p is tied.fc4.weight for p in tied.parameters()) == 1
