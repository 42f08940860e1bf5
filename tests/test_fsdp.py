"""FSDP on 2 gloo ranks, through the course's 2026 adapters, against single-process training.

One spawn serves the module: `_run_all` trains every case on both ranks and returns what each saw;
the tests below compare with references computed here, in the parent, by plain single-process
training that shares no code with the container.

The references. Each rank computes the gradient of the mean loss over its half of the batch and
the ranks average them, so the exact single-process counterpart is: compute both halves'
gradients, average them, step. In fp32 FSDP must equal that bit for bit: the gathered weight is a
copy, the rank's arithmetic is the reference's, and the average of two fp32 numbers is
correctly rounded whichever side computes it ((a + b) / 2 = a/2 + b/2 exactly: halving is exact).
Against the plain full-batch step (the mean over 8 rows instead of the mean of two 4-row means),
only the summation order differs: checked with a bound derived below.

With compute_dtype, the reference casts the same way: the layers' weights (and biases, and their
floating inputs) in the compute dtype, a layer weight's gradients averaged in the compute dtype
then upcast, every other gradient averaged in fp32 from the upcast per-rank gradients.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.distributed.fsdp import FSDP
from cs336_systems.distributed.launch import Worker, spawn
from cs336_systems.model import TransformerLM, get_config
from cs336_systems.model import layers as our_layers
from tests import adapters, course_standins
from tests.course_standins import SEQ, VOCAB, CourseToyLM, TinyLayers
from tests.toy_models import TOY_MODELS, make_batches, shard

pytestmark = pytest.mark.distributed

WORLD_SIZE, STEPS, BATCH = 2, 3, 8
LR = {"sgd": 0.1, "adamw": 0.05}
BETAS = (0.9, 0.999)
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=LR["sgd"]),
    "adamw": lambda params: torch.optim.AdamW(params, lr=LR["adamw"], betas=BETAS,
                                              weight_decay=0.1),
}
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}  # half the gap between 1 and the next number
# The layers FSDP must shard, by class (the reference's own list; FSDP itself goes by shape).
LAYER_TYPES = (nn.Linear, nn.Embedding, course_standins.Linear, course_standins.Embedding,
               our_layers.Linear, our_layers.Embedding)
TINY_LM = get_config("tiny").with_context(SEQ)


def _token_batches(vocab: int, seed: int = 99) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(vocab, (BATCH, SEQ), generator=g) for _ in range(2))
            for _ in range(STEPS)]


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), y)


def _seeded(factory):
    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return factory()
    return make


class CheckpointedFFN(nn.Module):
    """CourseToyLM whose feed-forward is recomputed in backward (torch.utils.checkpoint): the
    recomputation calls the layers again, outside FSDP.forward, and must gather their weights."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.lm = CourseToyLM()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        lm = self.lm
        x = lm.token_embeddings(ids)
        x = x + checkpoint(lambda t: lm.ffn(lm.ln1(t)), x, use_reentrant=self.use_reentrant)
        return lm.lm_head(lm.ln_final(x))


# name -> (make(seed), batches, loss)
MODELS = {name: (_seeded(cls), make_batches(STEPS, BATCH), _mse) for name, cls in TOY_MODELS.items()}
MODELS["CourseToyLM"] = (_seeded(CourseToyLM), _token_batches(VOCAB), _lm_loss)
MODELS["CourseToyLMTied"] = (_seeded(lambda: CourseToyLM(tied=True)), _token_batches(VOCAB), _lm_loss)
MODELS["TinyLayers"] = (_seeded(TinyLayers), make_batches(STEPS, BATCH, in_features=3), _mse)
for _kind, _reentrant in [("ckpt", False), ("ckpt-reentrant", True)]:
    MODELS[f"CourseToyLM-{_kind}"] = (_seeded(functools.partial(CheckpointedFFN, _reentrant)),
                                      _token_batches(VOCAB), _lm_loss)
MODELS["TransformerLM-tiny"] = (_seeded(lambda: TransformerLM.from_config(TINY_LM)),
                                _token_batches(TINY_LM.vocab_size), _lm_loss)

CASES = [(m, opt, "fp32") for m in MODELS for opt in OPTIMIZERS]
CASES += [(m, opt, "bf16") for m in ("ToyModel", "ToyModelWithTiedWeights", "CourseToyLM",
                                     "CourseToyLMTied", "TinyLayers") for opt in OPTIMIZERS]
CASES += [("CourseToyLM", "adamw", "fp16"), ("ToyModel", "sgd", "fp16"),
          ("CourseToyLM-ckpt", "adamw", "bf16"),
          ("TransformerLM-tiny", "adamw", "bf16")]
CASE_IDS = ["-".join(c) for c in CASES]


# -- what the ranks run ----------------------------------------------------------------------------

def _cpu(tensors: dict) -> dict:
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}


def _train(worker: Worker, model_name: str, opt_name: str, dtype_name: str) -> dict:
    make, batches, loss_fn = MODELS[model_name]
    device = worker.device  # cpu under gloo, this rank's GPU under nccl (tests/test_fsdp_gpu.py)
    fsdp = adapters.get_fsdp(make(seed=100 + worker.rank).to(device),
                             compute_dtype=DTYPES[dtype_name])
    optimizer = OPTIMIZERS[opt_name]([p for p in fsdp.parameters() if p.requires_grad])
    first_grads, out_dtype = {}, None
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        x, y = shard((x.to(device), y.to(device)), worker.rank, worker.world_size)
        out = fsdp(x)
        out_dtype = out.dtype
        loss_fn(out, y).backward()
        adapters.fsdp_on_after_backward(fsdp_model=fsdp, optimizer=optimizer)
        if step == 0:
            first_grads = {n: (p.detach().cpu(), None if p.grad is None else p.grad.cpu())
                           for n, p in fsdp.module.named_parameters()}
        optimizer.step()
    return {"full": _cpu(adapters.fsdp_gather_full_params(fsdp)), "first": first_grads,
            "out_dtype": out_dtype,
            "sharded": fsdp.sharded_parameter_names(),
            "own_parameters": [id(p) for p in fsdp.parameters()] == [
                id(p) for p in fsdp.module.parameters()]}


def _traced(worker: Worker) -> list[dict]:
    """Two steps of CourseToyLMTied with every all-gather, layer call and reduce-scatter logged,
    and the gathered buffers tracked by weak reference (alive = not yet freed)."""
    make, batches, loss_fn = MODELS["CourseToyLMTied"]
    fsdp = FSDP(make(seed=100))
    optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    log, alive = [], set()
    start_gather, begin, end, reduce = (fsdp._start_gather, fsdp._begin_use, fsdp._end_use,
                                        fsdp._reduce)

    def note(kind, name, at_most=2):
        # gloo's worker thread may hold a finished collective's buffers a moment after wait()
        # returns; give it up to a second to let go before counting what we still hold
        deadline = time.monotonic() + 1.0
        while len(alive) > at_most and time.monotonic() < deadline:
            time.sleep(0.001)
        log.append({"kind": kind, "name": name, "alive": len(alive),
                    "phase": "forward" if fsdp._pass is not None else "backward"})

    def traced_gather(layer):
        gather = start_gather(layer)
        alive.add(id(gather.buffer))
        weakref.finalize(gather.buffer, alive.discard, id(gather.buffer))
        note("gather", layer.name)
        return gather

    def traced_begin(layer):
        note("begin", layer.name)
        return begin(layer)

    def traced_end(use):
        note("end", use.layer.name)  # the layer's call has returned; end() frees and prefetches
        end(use)

    def traced_reduce(weight, grad):
        reduce(weight, grad)
        note("reduce", weight.name)

    # instance attributes shadow the methods: FSDP calls these through self
    fsdp._start_gather, fsdp._begin_use = traced_gather, traced_begin
    fsdp._end_use, fsdp._reduce = traced_end, traced_reduce
    steps = []
    for x, y in batches[:2]:
        log.clear()
        optimizer.zero_grad(set_to_none=True)
        x, y = shard((x, y), worker.rank, worker.world_size)
        out = fsdp(x)
        note("forward returned", "", at_most=0)
        loss_fn(out, y).backward()
        fsdp.finish_gradient_synchronization()
        note("finished", "", at_most=0)
        optimizer.step()
        steps.append(list(log))
    return steps


def _run_all(worker: Worker) -> dict:
    out = {cid: _train(worker, *case) for cid, case in zip(CASE_IDS, CASES)}
    out["traced"] = _traced(worker)
    return out


# One intra-op thread per rank, and the same in the references: a matmul's summation order depends
# on how many threads split it, and bitwise equality needs the same order.
THREADS = 1


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_run_all, WORLD_SIZE, timeout_s=300, threads_per_rank=THREADS)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- the references (single process) -------------------------------------------------------------

def _cast_layers(model: nn.Module, dtype: torch.dtype) -> set[str]:
    """Give every layer a compute-dtype copy of its parameters (leaves, a tie kept) and cast its
    floating inputs. Returns the names of the layers' weights (reduced in the compute dtype)."""
    copies: dict[int, nn.Parameter] = {}
    layer_weights = set()
    for m in model.modules():
        if isinstance(m, LAYER_TYPES):
            for name, p in list(m.named_parameters(recurse=False)):
                if id(p) not in copies:
                    copies[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                setattr(m, name, copies[id(p)])
            layer_weights.add(id(m.weight))
            m.register_forward_pre_hook(lambda _, args: tuple(
                a.to(dtype) if a.is_floating_point() else a for a in args))
    return {n for n, p in model.named_parameters() if id(p) in layer_weights}


def _rank_gradients(master: nn.Module, x, y, loss_fn, dtype) -> tuple[dict, set[str]]:
    work = copy.deepcopy(master)
    low = _cast_layers(work, dtype) if dtype is not None else set()
    loss_fn(work(x), y).backward()
    return {n: p.grad for n, p in work.named_parameters()}, low


def reference(model_name: str, opt_name: str, dtype_name: str, device: str = "cpu") -> dict:
    """Per-half gradients averaged, then the same optimizer on fp32 weights. Returns the final
    parameters by name ("final"), the first step's averaged gradients ("first_grads") and the
    largest |gradient| seen ("g_max"), on the CPU."""
    with _threads(THREADS):
        return _reference(model_name, opt_name, dtype_name, torch.device(device))


def _reference(model_name: str, opt_name: str, dtype_name: str, device: torch.device):
    make, batches, loss_fn = MODELS[model_name]
    dtype = DTYPES[dtype_name]
    master = make(seed=100).to(device)
    params = dict(master.named_parameters())
    optimizer = OPTIMIZERS[opt_name]([p for p in params.values() if p.requires_grad])
    g_max, first_grads = 0.0, None
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        per_rank = [_rank_gradients(master, *shard((x, y), r, WORLD_SIZE), loss_fn, dtype)
                    for r in range(WORLD_SIZE)]
        low = per_rank[0][1]
        for name, p in params.items():
            grads = [g[name] for g, _ in per_rank]
            if grads[0] is None:
                p.grad = None
                continue
            if name not in low:
                grads = [g.float() for g in grads]
            p.grad = (sum(grads[1:], grads[0]) / len(grads)).float()
            g_max = max(g_max, p.grad.abs().max().item())
        if first_grads is None:
            first_grads = {n: None if p.grad is None else p.grad.cpu() for n, p in params.items()}
        optimizer.step()
    return {"final": {n: p.detach().cpu() for n, p in params.items()}, "first_grads": first_grads,
            "g_max": g_max}


def _tolerance(opt_name: str, dtype_name: str, g_max: float) -> float:
    """Largest weight difference allowed where bitwise equality is not promised.

    One rounding of unit roundoff u in a reduced gradient (the cross-rank sum, which gloo may
    compute in another precision than torch's add) perturbs that gradient by at most u*|g|. The
    next forward casts the perturbed master weights and may round one of them the other way: a
    second relative perturbation of order u, so allow 2u per step. An SGD step moves a weight by
    lr*g, so by at most 2u*lr*g_max more. An AdamW step lr*m/(sqrt(v)+eps) is at most
    lr*(1-b1)/sqrt(1-b2) in size (Kingma & Ba, section 2.1) and moves relatively by at most twice
    the gradient's relative change. Summed over the steps."""
    u = UNIT_ROUNDOFF[dtype_name]
    if opt_name == "sgd":
        per_step = 2 * u * LR["sgd"] * g_max
    else:
        per_step = 2 * (2 * u) * LR["adamw"] * (1 - BETAS[0]) / math.sqrt(1 - BETAS[1])
    return STEPS * per_step


# -- the tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_training_matches_single_process(ranks, case):
    _, opt_name, dtype_name = case
    cid = "-".join(case)
    ref = reference(*case)
    expected, g_max = ref["final"], ref["g_max"]
    for rank, seen in enumerate(r[cid] for r in ranks):
        full = seen["full"]
        assert list(full) == list(expected), "keyed exactly like named_parameters(), same order"
        for name, want in expected.items():
            assert full[name].shape == want.shape and full[name].dtype == want.dtype, name
            if dtype_name == "fp32":
                assert torch.equal(full[name], want), f"rank {rank} {name}: not bitwise equal"
            else:
                torch.testing.assert_close(full[name], want, rtol=0,
                                           atol=_tolerance(opt_name, dtype_name, g_max),
                                           msg=lambda m, name=name, rank=rank: f"rank {rank} {name}: {m}")
        assert seen["own_parameters"], "the wrapper's parameters() are the module's own"
    for name in expected:  # both ranks gathered the same weights
        assert torch.equal(ranks[0][cid]["full"][name], ranks[1][cid]["full"][name]), name


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_first_step_gradients_and_compute_dtype(ranks, case):
    """Step 0 starts from equal weights, so the only room for a difference is the one rounding of
    the cross-rank sum: |delta| <= u*|g| (allow 2u: the sum may be rounded twice, through fp32 and
    back). Computing in fp32 instead of the compute dtype would miss this by far. The pieces,
    concatenated in rank order, are the whole gradient. The model's output (a sharded layer's)
    comes out in the compute dtype."""
    _, _, dtype_name = case
    cid = "-".join(case)
    want = reference(*case)["first_grads"]
    sharded = set(ranks[0][cid]["sharded"])
    for name, expected in want.items():
        if expected is None:
            continue
        pieces = [r[cid]["first"][name][1] for r in ranks]
        got = torch.cat(pieces).view(expected.shape) if name in sharded else pieces[0]
        if dtype_name == "fp32":
            assert torch.equal(got, expected), name
        else:
            torch.testing.assert_close(got, expected, rtol=2 * UNIT_ROUNDOFF[dtype_name], atol=0,
                                       msg=lambda m, name=name: f"{name}: {m}")
    for r in ranks:
        assert r[cid]["out_dtype"] == (DTYPES[dtype_name] or torch.float32)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gradients_are_the_shards_own(ranks, case):
    """After fsdp_on_after_backward every trainable parameter's .grad has its .data's shape and
    dtype (the master's, fp32, whatever compute_dtype is); replicated ones are equal on every
    rank; the pieces of a sharded weight add up to the weight, with no padding in them."""
    cid = "-".join(case)
    make = MODELS[case[0]][0]
    full_sizes = {n: p.numel() for n, p in make(seed=0).named_parameters()}
    trainable = {n for n, p in make(seed=0).named_parameters() if p.requires_grad}
    first = [r[cid]["first"] for r in ranks]
    sharded = set(ranks[0][cid]["sharded"])
    for name, size in full_sizes.items():
        for seen in first:
            data, grad = seen[name]
            assert data.dtype == torch.float32
            if grad is not None:
                assert name in trainable
                assert grad.shape == data.shape and grad.dtype == data.dtype, name
        if name in sharded:
            assert sum(seen[name][0].numel() for seen in first) == size, name
        else:
            assert first[0][name][0].numel() == size, f"{name} is replicated"
            g0, g1 = first[0][name][1], first[1][name][1]
            assert (g0 is None) == (g1 is None), name
            assert g0 is None or torch.equal(g0, g1), f"{name}: replicated grads differ"


def test_which_weights_are_sharded(ranks):
    sharded = lambda model: set(ranks[0][f"{model}-sgd-fp32"]["sharded"])
    assert sharded("CourseToyLM") == {"token_embeddings.weight", "ffn.w1.weight", "ffn.w2.weight",
                                      "ffn.w3.weight", "lm_head.weight"}
    assert sharded("CourseToyLMTied") == {"token_embeddings.weight", "ffn.w1.weight",
                                          "ffn.w2.weight", "ffn.w3.weight"}  # lm_head's is tied
    assert sharded("ToyModelWithUnusedParameter") == {"fc1.weight", "unused.weight", "fc2.weight"}
    lm = sharded("TransformerLM-tiny")
    assert "token_embeddings.weight" in lm and "lm_head.weight" in lm
    assert not any("ln" in n for n in lm), "norms stay replicated"


def _phase(log, phase):
    return [e for e in log if e["phase"] == phase]


def test_prefetch_is_bounded_and_weights_are_freed(ranks):
    for steps in (r["traced"] for r in ranks):
        for step, log in enumerate(steps):
            forward = _phase(log, "forward")
            gathers = ends = 0
            for event in forward:
                gathers += event["kind"] == "gather"
                ends += event["kind"] == "end"
                assert event["alive"] <= 2, f"step {step}: {event['alive']} gathered weights alive"
                if step > 0:  # step 0 guessed the order (registration order) and had to correct it
                    # a gather starts no earlier than the end of the use two before the one it serves
                    assert gathers <= ends + 2, f"step {step}: {gathers} gathers after {ends} uses"
            uses = [e["name"] for e in forward if e["kind"] == "begin"]
            assert uses == ["token_embeddings", "ffn.w1", "ffn.w3", "ffn.w2", "lm_head"]
            if step > 0:  # the order seen in step 0 is used: every use was prefetched, in order
                assert [e["name"] for e in forward if e["kind"] == "gather"] == uses
            backward = _phase(log, "backward")
            assert backward[0]["kind"] == "forward returned"
            assert backward[0]["alive"] == 0, "every gathered weight is freed when forward ends"
            assert max(e["alive"] for e in backward) <= 2
            assert backward[-1]["kind"] == "finished" and backward[-1]["alive"] == 0


def test_backward_gathers_what_it_needs_and_reduces_early(ranks):
    for log in (step for r in ranks for step in r["traced"]):
        backward = _phase(log, "backward")
        gathered = [e["name"] for e in backward if e["kind"] == "gather"]
        # the linear layers, last first; never the embedding (a lookup's backward needs no weight)
        assert gathered == ["lm_head", "ffn.w2", "ffn.w3", "ffn.w1"]
        reduced = [e["name"] for e in backward if e["kind"] == "reduce"]
        # one reduce-scatter per weight; the tied embedding/lm_head weight once, after both uses
        assert sorted(reduced) == sorted(["ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight",
                                          "token_embeddings.weight"])
        kinds = [e["kind"] for e in backward]
        assert kinds.index("reduce") < len(kinds) - 1 - kinds[::-1].index("gather"), \
            "reduce-scatters start during backward, not after it"


def test_bad_arguments_are_refused_before_any_communication():
    with pytest.raises(ValueError, match="compute_dtype"):
        FSDP(nn.Linear(2, 2), compute_dtype=torch.int32)
    shared = nn.Module()
    shared.layer = nn.Linear(2, 2, bias=False)
    shared.extra = shared.layer.weight  # the same Parameter under another name
    with pytest.raises(ValueError, match="extra"):
        FSDP(shared)
    with pytest.raises(RuntimeError, match="process group"):
        FSDP(nn.Linear(2, 2))

