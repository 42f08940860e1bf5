"""Checkpoint plans of the training step (checkpoint_plan.py, selective.py, memory_budget.py,
plan_search.py): the plan syntax, the policies against no checkpointing, what the selective policy
keeps (the attention forward never runs in the backward), compiled blocks, the memory arithmetic
per mode against what autograd saves, and the sweep's choice.

References. A checkpointed block recomputes the same ops on the same values, and a selective one
hands back the very tensors its forward computed, so eager (CPU) every plan must give the loss and
gradients of no checkpointing bit for bit (tests/tolerances.py: the same operations on the same
values, bound 0). Compiled, Inductor fuses a checkpointed block's graph differently from a kept
one's, so each is held to the float64 plain model within its own gamma_N (N the roundings along the
longest path, tolerances.transformer_rounding_depth), as test_training_step's equivalence is.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cs336_systems.distributed.launch import Worker
from cs336_systems.model import ModelConfig, get_config, use_attention
from cs336_systems.training_step import bench
from cs336_systems.training_step.checkpoint_plan import BadPlan, parse_plan, plan_of_keep_blocks
from cs336_systems.training_step.heads import ChunkedLossHead
from cs336_systems.training_step.lm_loss import LanguageModelLoss, PlainLoss
from cs336_systems.training_step.memory_budget import GIB, Layout, block_bytes_per_token, budget
from cs336_systems.training_step.plan_search import candidates, sweep_plans
from cs336_systems.training_step.train_step import StepOptions, init_lm, rank_batch
from cs336_systems.training_step.variants import build, recipe_of, with_plan
from tests.tolerances import assert_relative_error, gamma, transformer_rounding_depth
from tests.triton_mode import HAS_TRITON, NO_TRITON, ON_GPU, where_marks

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
OURS = pytest.param("ours", marks=[needs_triton, *where_marks])
CFG = ModelConfig(vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=2, d_ff=64)
BATCH, SEQ = 2, 20  # seq 20: no tile size divides it
DEVICE = "cuda" if ON_GPU else "cpu"


# -- the plan's syntax ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, blocks, canonical", [
    ("full:22,selective:8,none:4", 34, "full:22,selective:8,none:4"),
    ("selective,none:10", 34, "selective:24,none:10"),          # the open segment takes the rest
    ("full", 34, "full:34"),
    ("none:2,none:2", 4, "none:4"),                              # equal neighbours merged
    ("selective+w13+qkv:1, full:1", 2, "selective+qkv+w13:1,full:1"),  # groups in canonical order
    ("none:1,full,none:1", 4, "none:1,full:2,none:1"),
])
def test_plans_parse_to_their_canonical_text(text, blocks, canonical):
    plan = parse_plan(text, blocks)
    assert plan.text == canonical and len(plan) == blocks
    assert parse_plan(plan.text, blocks) == plan  # the canonical text is a fixed point


def test_keep_blocks_is_the_plan_full_then_none():
    plan = plan_of_keep_blocks(34, 10)
    assert plan.text == "full:24,none:10" and plan.kept_blocks == 10 and plan.checkpointed_blocks == 24


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("full:3", "sum to 3"), ("fast:2", "unknown mode"), ("selective+w4:2", "unknown matmul group"),
    ("full+qkv:2", "only selective"), ("selective+qkv+qkv:2", "twice"), ("full,none", "at most one"),
    ("full:0,none:2", "at least 1"), ("full:x,none:1", "whole number"), ("full:2,none", "none left"),
])
def test_bad_plans_say_what_is_wrong(text, says):
    with pytest.raises(BadPlan, match=says):
        parse_plan(text, 2)


# -- every plan is no checkpointing: same loss, same gradients ---------------------------------------

PLANS = ["full:2", "selective:2", "selective+qkv:1,full:1", "selective+out+w13:1,none:1", "selective+qkv+out+w13:2"]


def _step(variant: str, plan: str, compile: bool = False):
    options = StepOptions(dtype=torch.float32, checkpoint=plan, compile=compile, loss_chunk=16)
    worker = Worker(0, 1, 0, "gloo", torch.device(DEVICE))
    return build(recipe_of(variant, options, CFG, 1, DEVICE), options, CFG, worker, BATCH)


def _with_batch(step):
    step.tokens, step.targets = (t.to(DEVICE) for t in rank_batch(CFG, BATCH, SEQ, 0, 1, "cpu", seed=1))
    return step


def _loss_and_grads(step):
    loss = step.forward_backward()
    return loss, {n: p.grad.clone() for n, p in step.loss_module.named_parameters()}


@pytest.mark.skipif(ON_GPU, reason="bit for bit needs deterministic kernels: the GPU's one-pass dQ adds by atomics")
@pytest.mark.parametrize("variant", ["stock", OURS])
def test_eager_plans_give_no_checkpointings_loss_and_gradients_bit_for_bit(variant):
    loss_ref, grads_ref = _loss_and_grads(_with_batch(_step(variant, "none:2")))
    for plan in PLANS:
        loss, grads = _loss_and_grads(_with_batch(_step(variant, plan)))
        assert torch.equal(loss, loss_ref), plan
        for name, g in grads.items():
            assert torch.equal(g, grads_ref[name]), f"{plan}: {name}"


class OpCounter(TorchDispatchMode):
    """How many times each aten / custom op was dispatched (by str(op)) while active."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _backward_calls(variant: str, plan: str) -> collections.Counter:
    """The ops dispatched during one backward (eager). A selective block's kept outputs come from
    its policy's cache, which answers before the dispatch reaches this mode: they are not counted."""
    step = _with_batch(_step(variant, plan))
    step.optimizer.zero_grad(set_to_none=True)
    with use_attention(step.attention):
        loss = step.module(step.tokens, step.targets)
        with OpCounter() as counter:
            loss.backward()
    return counter.calls


ATTENTION_FORWARD = {"stock": "aten._scaled_dot_product_flash_attention_for_cpu.default",
                     "ours": "cs336.flash_attention_fwd.default"}


@pytest.mark.skipif(ON_GPU, reason="counts the CPU's SDPA op (a GPU picks another kernel)")
@pytest.mark.parametrize("variant", ["stock", OURS])
@pytest.mark.parametrize("plan, recomputed", [("none:2", 0), ("full:2", 2), ("full:1,none:1", 1),
                                              ("selective:2", 0), ("selective:1,full:1", 1),
                                              ("selective+qkv+out+w13:2", 0)])
def test_the_attention_forward_runs_in_the_backward_only_for_fully_checkpointed_blocks(variant, plan, recomputed):
    assert _backward_calls(variant, plan)[ATTENTION_FORWARD[variant]] == recomputed


@pytest.mark.skipif(ON_GPU, reason="eager CPU op counts")
def test_matmul_groups_keep_exactly_their_matmuls():
    """Per block, selective recomputes the matmuls full does, less 3 with qkv, 1 with out, 2 with w13."""
    mm = "aten.mm.default"
    count = {p: _backward_calls("stock", p)[mm] for p in
             ("full:2", "selective:2", "selective+qkv:2", "selective+out:2", "selective+w13:2", "selective+qkv+out+w13:2")}
    assert count["selective:2"] == count["full:2"]
    assert count["selective:2"] - count["selective+qkv:2"] == 2 * 3
    assert count["selective:2"] - count["selective+out:2"] == 2 * 1
    assert count["selective:2"] - count["selective+w13:2"] == 2 * 2
    assert count["selective:2"] - count["selective+qkv+out+w13:2"] == 2 * 6


def test_the_policy_refuses_a_block_whose_matmuls_come_in_another_order():
    from cs336_systems.training_step.selective import BlockPolicy

    policy = BlockPolicy(frozenset({"q"}))
    ctx = type("Ctx", (), {"is_recompute": False})()
    mm = torch.ops.aten.mm.default
    x, square, wide = torch.empty(4, 8), torch.empty(8, 8), torch.empty(8, 16)
    for _ in range(4):  # q, k, v, out: (d, d)
        policy(ctx, mm, x, square)
    with pytest.raises(RuntimeError, match="order q, k, v, out, w1, w3, w2"):
        policy(ctx, mm, torch.empty(4, 16), torch.empty(16, 8))  # the fifth must be W1, (d, d_ff): not W2
    fresh = BlockPolicy(frozenset())
    for w in (square,) * 4 + (wide,) * 2:
        fresh(ctx, mm, x, w)
    fresh(ctx, mm, torch.empty(4, 16), torch.empty(16, 8))  # W2, (d_ff, d): the order holds


# -- compiled blocks: the checkpoint inside the compiled region ----------------------------------------

@pytest.fixture(scope="module")
def float64_reference():
    """Loss and gradients of the plain model in float64 at the same weights and batch."""
    plain = PlainLoss(init_lm(CFG, "cpu", torch.float64, seed=0))
    tokens, targets = rank_batch(CFG, BATCH, SEQ, 0, 1, "cpu", seed=1)
    with use_attention("naive"):
        loss = plain(tokens, targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in plain.lm.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("variant, plan", [("stock", "selective:1,none:1"), pytest.param("ours", "selective:1,full:1",
                                                                                       marks=[needs_triton, *where_marks])])
def test_compiled_plans_match_the_float64_model_and_compile_once_per_mode(variant, plan, float64_reference, monkeypatch):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    tol = gamma(transformer_rounding_depth(CFG, SEQ, BATCH) + 1, torch.float32)
    step = _with_batch(_step(variant, plan, compile=True))
    step.loss_module.lm.load_state_dict({n: w.float() for n, w in
                                         init_lm(CFG, "cpu", torch.float64, seed=0).state_dict().items()})
    forwards = collections.Counter()
    if variant == "ours":  # the op's forward runs eagerly inside the compiled graph: count its launches
        from cs336_systems.attention.fast import op

        real = op._forward
        monkeypatch.setattr(op, "_forward", lambda *a: forwards.update(["fwd"]) or real(*a))
    loss = step.forward_backward()  # the first call compiles
    ref_loss, ref_grads = float64_reference
    assert_relative_error(loss.cpu(), ref_loss, tol, f"{variant} {plan}: loss")
    for name, p in step.loss_module.lm.named_parameters():
        assert_relative_error(p.grad.cpu(), ref_grads[name], tol, f"{variant} {plan}: {name}")
    assert counters["stats"]["unique_graphs"] == 2  # one per mode, not one per block
    if variant == "ours":
        forwards.clear()
        step.forward_backward()
        assert forwards["fwd"] == 2 + 1  # each block's forward, then the full block's again: not the selective one's


# -- the memory arithmetic per mode, against what a compiled block saves ---------------------------------

def _compiled_block_saved_bytes(attention: str, mode: str, dtype: torch.dtype, cfg: ModelConfig) -> float:
    """Bytes per token a compiled block under `mode` keeps for its backward (parameters, buffers
    and the positions not counted; the block's input counts, as inside the model)."""
    from cs336_systems.sharding.accounting import saved_activation_bytes
    from cs336_systems.training_step.selective import install_plan

    torch._dynamo.reset()
    lm = init_lm(cfg, "cpu", dtype)
    install_plan(lm, parse_plan(f"{mode}:{cfg.num_layers}", cfg.num_layers), compile=True)
    block = lm.layers[0]
    x = torch.randn(BATCH, SEQ, cfg.d_model, dtype=dtype, requires_grad=True)
    mask, positions = torch.ones(1, 1, dtype=torch.bool), torch.arange(SEQ)
    resident = [*block.parameters(), *block.buffers(), *lm.rope.buffers(), mask, positions]
    with use_attention(attention), saved_activation_bytes(resident) as saved:
        y = block(x, mask, positions)
    y.float().sum().backward()
    return saved["bytes"] / (BATCH * SEQ)


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="counts what the CPU's compiled block saves")
@pytest.mark.parametrize("attention, dtype", [("sdpa", torch.bfloat16), pytest.param("flash-triton", torch.float32,
                                                                                      marks=needs_triton)])
@pytest.mark.parametrize("mode", ["none", "selective", "selective+qkv+out+w13", "full"])
def test_a_compiled_block_saves_what_the_arithmetic_counts(attention, dtype, mode):
    # d 48, d_ff 80, 3 heads: no coefficient of d, d_ff or h can stand in for another's
    cfg = ModelConfig(vocab_size=97, context_length=24, d_model=48, num_layers=1, num_heads=3, d_ff=80)
    layout = Layout("fused", "fused", 0 if mode == "none" else 1, "none", dtype.itemsize, compiled=True,
                    plan=(mode,))
    certain, likely = block_bytes_per_token(cfg, layout, mode, SEQ)
    saved = _compiled_block_saved_bytes(attention, mode, dtype, cfg)
    assert certain <= saved
    if not (attention == "sdpa" and mode == "full"):  # CPU SDPA's compiled full block adds a fixed
        assert saved == likely, (mode, saved, certain, likely)  # uint8 workspace: not per token


# -- the budget and the sweep --------------------------------------------------------------------------

B8 = get_config("8B")


def _layout_of(loss: str):
    return lambda plan: Layout("fused", loss, plan.checkpointed_blocks, "none", 2, plan=plan.modes, compiled=True)


def test_the_budget_of_a_plan_adds_its_blocks():
    b, d, f, h, tokens = 2, B8.d_model, B8.d_ff, B8.num_heads, 32_768
    plan = parse_plan("full:10,selective:10,selective+w13:4,none:10", 34)
    got = budget(B8, _layout_of("fused")(plan), 1, 1, tokens)
    full = budget(B8, _layout_of("fused")(parse_plan("full", 34)), 1, 1, tokens)
    by_hand = tokens * (10 * 0 + 10 * (b * d + 4 * h) + 4 * (b * d + 4 * h + 2 * b * f)  # beyond full's b d each
                        + 10 * (6 * b * d + 2 * b * f + 4 * h - b * d))
    assert got.saved_activations - full.saved_activations == by_hand
    assert got.likely_extra_saved == tokens * 10 * (3 * b * d + b * f + 8)  # compiled kept blocks' likely extra
    assert got.estimate > got.lower_bound


def test_the_sweep_tries_the_predicted_best_and_its_neighbours_and_skips_what_cannot_fit():
    capacity = 120 * GIB
    chosen, skipped = sweep_plans(B8, _layout_of("fused"), 1, 1, 32_768, capacity, 3)
    every = candidates(B8, _layout_of("fused"), 1, 1, 32_768)
    fitting = [c for c in every if c.budget.estimate <= capacity]
    assert chosen[0].key() == min(c.key() for c in fitting)  # the predicted best, by brute force
    assert all(c.budget.estimate <= capacity for c in chosen) and len(chosen) == 3
    # the order the docstring gives: k*, k* + 1, k* - 1, k* + 2, ..., where some plan of k kept blocks fits
    k_star, feasible = chosen[0].kept_blocks, {c.kept_blocks for c in fitting}
    order = [k_star] + [k for step in range(1, 35) for k in (k_star + step, k_star - step)]
    assert [c.kept_blocks for c in chosen] == [k for k in order if k in feasible][:3]
    assert skipped == []  # the walk met no number of kept blocks that cannot fit
    # fewer kept blocks always fit when more do; asked for more plans than fit, the sweep tries
    # every feasible number and names the first that is not, once
    assert feasible == set(range(max(feasible) + 1))
    chosen, skipped = sweep_plans(B8, _layout_of("fused"), 1, 1, 32_768, capacity, 35)
    assert sorted(c.kept_blocks for c in chosen) == sorted(feasible)
    assert [s.kept_blocks for s in skipped] == [max(feasible) + 1] and skipped[0].budget.estimate > capacity
    for c in chosen:  # each is the best with its number of kept blocks
        assert c.key() == min(x.key() for x in fitting if x.kept_blocks == c.kept_blocks)


def test_a_sweep_with_no_room_chooses_nothing():
    chosen, skipped = sweep_plans(B8, _layout_of("chunked"), 1, 1, 32_768, 10 * GIB, 3)
    assert chosen == [] and skipped[0].plan.text == "full:34"


def test_with_plan_keeps_the_recipe_and_changes_the_plan():
    base = recipe_of("ours", StepOptions(), B8, 1, "cuda")
    r = with_plan(base, "selective,none:10")
    assert (r.checkpoint, r.checkpointed_blocks, r.keep_blocks) == ("selective:24,none:10", 24, 10)
    assert {k: v for k, v in r.flags().items() if k not in ("checkpoint", "checkpointed_blocks", "keep_blocks")} == \
        {k: v for k, v in base.flags().items() if k not in ("checkpoint", "checkpointed_blocks", "keep_blocks")}


def test_language_model_loss_installs_the_plan_on_each_block():
    lm = init_lm(CFG, "cpu", torch.float32)
    module = LanguageModelLoss(lm, ChunkedLossHead(lm.lm_head.weight), parse_plan("selective:1,none:1", 2))
    assert [b.forward.args[1] for b in module.lm.layers] == ["selective", "none"]
    assert module.checkpointed_blocks == 1
    with pytest.raises(ValueError, match="3 blocks"):
        LanguageModelLoss(init_lm(CFG, "cpu", torch.float32), ChunkedLossHead(lm.lm_head.weight),
                          parse_plan("full:3", 3))


# -- the bench: plans in the rows, the sweep end to end -----------------------------------------------

TINY = ["--size", "tiny", "--device", "cpu", "--context", "16", "--warmup-ms", "1", "--rep-ms", "1"]


def _rows(root, bench_name="training-step") -> list[dict]:
    return [json.loads(line) for line in (root / bench_name / "cpu.jsonl").read_text().splitlines()]


def test_bench_runs_each_plan_for_each_variant_and_records_it(tmp_path):
    argv = [*TINY, "--variant", "stock", "--checkpoint", "selective:2", "full,none:1", "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = _rows(tmp_path)
    assert [(r["variant"], r["flags"]["checkpoint"]) for r in rows] == [("stock", "selective:2"),
                                                                        ("stock", "full:1,none:1")]
    assert all(r["status"] == "ok" and r["sweep"] is False for r in rows)
    assert rows[0]["loss_first_step"] == rows[1]["loss_first_step"]  # eager: bit for bit (above)
    assert [r["flags"]["keep_blocks"] for r in rows] == [0, 1]
    assert rows[0]["recompute_flops_per_rank"] > 0


@needs_triton
@pytest.mark.interpreter
def test_bench_runs_a_variants_own_plans(tmp_path):
    argv = [*TINY, "--variant", "plain", "stock", "ours", "--checkpoint", "stock=selective:2", "ours=full:2",
            "full:1,none:1", "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    assert [(r["variant"], r["flags"]["checkpoint"]) for r in _rows(tmp_path)] == [
        ("plain", "none:2"), ("stock", "selective:2"), ("stock", "full:1,none:1"), ("ours", "full:2"),
        ("ours", "full:1,none:1")]


def test_bench_sweep_writes_a_row_per_plan(tmp_path, capsys):
    cfg = get_config("tiny", 16)
    argv = [*TINY, "--variant", "stock", "--sweep", "2", "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    err = capsys.readouterr().err
    assert "stock: sweep plan 1/2: " in err and "sweep plan 2/2" in err
    base = recipe_of("stock", StepOptions(dtype=torch.float32), cfg, 1, "cpu")
    layout_of = lambda p: with_plan(base, p.text).layout(torch.float32)  # noqa: E731
    chosen, _ = sweep_plans(cfg, layout_of, 1, 2, 16, bench._capacity_bytes("cpu", 1)[0], 2)
    rows = _rows(tmp_path)
    assert [r["flags"]["checkpoint"] for r in rows] == [c.plan.text for c in chosen]
    assert all(r["sweep"] and r["status"] == "ok" for r in rows)


def test_the_sweep_says_which_plans_it_skips(capsys):
    # at 8B (no activations on a CPU run's scale), without running anything: what _sweep prints
    base = recipe_of("ours", StepOptions(compile=True), B8, 1, "cuda")
    recipes = bench._sweep(bench.build_parser(), base, B8, StepOptions(compile=True), 1, 1, 120 * GIB,
                           "--memory-per-rank-gib", 35)
    err = capsys.readouterr().err.splitlines()
    skips = [line for line in err if "sweep skips" in line]
    assert len(skips) == 1 and "more than 120.0 GiB (--memory-per-rank-gib)" in skips[0]
    assert len([line for line in err if "sweep plan " in line]) == len(recipes) == max(r.keep_blocks for r in recipes) + 1
