"""The checkpoint plans a sweep tries for a given memory: predicted by the memory arithmetic
(memory_budget.py) and the recompute FLOPs (arithmetic.recompute_flops_per_token), then measured.

    chosen, skipped = sweep_plans(cfg, layout_of, world, batch_per_rank, context, capacity, n=3)

The plans considered give each block one of four modes, in this order from the first block (the
last blocks' activations are the first the backward needs):

    full, selective, selective+qkv+out+w13, none

(selective keeps the attention's outputs; selective+qkv+out+w13 also every matmul output the
backward reads, so it recomputes only elementwise work; none keeps what compile keeps). All
counts that sum to the number of blocks: 7,770 plans at 34 blocks. A plan is predicted to fit when
its budget's estimate is at most the capacity. Among those, the best has the fewest recomputed
FLOPs, then the fewest recomputed blocks, then the smallest estimate.

The one uncertain part of the arithmetic is what a compiled kept block ("none") saves, so the
sweep goes along that axis: with k* the kept blocks of the best plan, it tries the best plan with
k*, k* + 1, k* - 1, k* + 2, ... kept blocks, n of them; a number of kept blocks for which no plan
is predicted to fit is skipped, and `skipped` names the smallest plan it would need (the first
such number only: fewer kept blocks always fit when more do, so the rest lie beyond it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cs336_systems.model import ModelConfig

from .arithmetic import recompute_flops_per_token
from .checkpoint_plan import CheckpointPlan
from .memory_budget import Layout, MemoryBudget, budget

LEVELS = ("full", "selective", "selective+qkv+out+w13", "none")  # least memory first


@dataclass(frozen=True)
class Candidate:
    plan: CheckpointPlan
    budget: MemoryBudget
    recompute_flops: int  # matmul and attention FLOPs the backward recomputes, every block

    @property
    def kept_blocks(self) -> int:
        return self.plan.kept_blocks

    def key(self) -> tuple:
        """The predicted order, best first."""
        return (self.recompute_flops, self.plan.checkpointed_blocks, self.budget.estimate)

    def size(self) -> tuple:
        """Smallest first: the estimate, then what the forward saves (the estimate can be the end
        of the backward, the same for every plan)."""
        return (self.budget.estimate, self.budget.saved_activations + self.budget.likely_extra_saved)


def _count_vectors(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _count_vectors(total - first, parts - 1):
            yield (first, *rest)


def plan_recompute_flops(cfg: ModelConfig, plan: CheckpointPlan, tokens: int, context: int,
                         compiled: bool) -> int:
    return tokens * sum(recompute_flops_per_token(cfg, m, context, compiled) for m in plan.modes)


def candidates(cfg: ModelConfig, layout_of: Callable[[CheckpointPlan], Layout], world_size: int,
               batch_per_rank: int, context: int) -> list[Candidate]:
    """Every plan of LEVELS' modes (module docstring), with its budget and recompute FLOPs."""
    out = []
    tokens = batch_per_rank * context
    for counts in _count_vectors(cfg.num_layers, len(LEVELS)):
        plan = CheckpointPlan(tuple(m for m, n in zip(LEVELS, counts) for _ in range(n)))
        layout = layout_of(plan)
        out.append(Candidate(plan, budget(cfg, layout, world_size, batch_per_rank, context),
                             plan_recompute_flops(cfg, plan, tokens, context, layout.compiled)))
    return out


def sweep_plans(cfg: ModelConfig, layout_of: Callable[[CheckpointPlan], Layout], world_size: int,
                batch_per_rank: int, context: int, capacity: float, n: int
                ) -> tuple[list[Candidate], list[Candidate]]:
    """(the n plans to try, best first as predicted; per skipped number of kept blocks, its plan
    of the smallest estimate, which is predicted not to fit). Nothing fits: ([], [smallest plan])."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    every = candidates(cfg, layout_of, world_size, batch_per_rank, context)
    by_kept: dict[int, list[Candidate]] = {}
    for c in every:
        by_kept.setdefault(c.kept_blocks, []).append(c)
    fitting = {k: [c for c in cs if c.budget.estimate <= capacity] for k, cs in by_kept.items()}
    best = {k: min(cs, key=Candidate.key) for k, cs in fitting.items() if cs}
    smallest = {k: min(cs, key=Candidate.size) for k, cs in by_kept.items()}
    if not best:
        return [], [min(smallest.values(), key=Candidate.size)]
    k_star = min(best.values(), key=Candidate.key).kept_blocks
    order = [k_star]
    for step in range(1, cfg.num_layers + 1):
        order += [k for k in (k_star + step, k_star - step) if 0 <= k <= cfg.num_layers]
    chosen, skipped = [], []
    for k in order:
        if len(chosen) == n:
            break
        if k in best:
            chosen.append(best[k])
        elif not skipped:  # the first number of kept blocks past what fits (fewer always fit:
            skipped.append(smallest[k])  # a kept block made full needs less)
    return chosen, skipped
