"""Gradient checkpointing as arithmetic (problem gradient_checkpointing): what a strategy keeps
and how many block forwards it runs, for a chain of L identical blocks.

Symbols: L blocks; A = bytes one block saves for its backward (its residuals); c = bytes of one
checkpoint (a block's input, b*s*d elements). Compute is counted in block forwards: a step without
checkpointing runs L of them (plus the backward, the same for every strategy, so left out).

Strategies, from the most memory to the least:

    none          keeps all L blocks' residuals                  memory L*A       forwards L
    single level  segments of k blocks; keeps the L/k segment    memory ceil(L/k)*c + k*A,
                  inputs, recomputes one segment at a time       minimal at k = sqrt(L*c/A): 2*sqrt(L*A*c);
                                                                 forwards 2L (every block once more)
    binary nest   checkpoint each half, recursively              memory O(log L)*c + A, forwards O(L log L)
    peel one      checkpoint(all but the last block), recursively memory c + A (O(1)), forwards O(L^2)

Finer than a block (`sublayer_saved`, `sublayer_peak`): checkpoint a block's attention branch or its
feed-forward branch alone, or each on its own (segments of half a block). A = A_attn + A_ffn, each
branch's residuals (its norm's input among them); c as above, one per checkpointed branch:

    attention alone   keeps L (c + A_ffn), recomputes one attention: peak L (c + A_ffn) + A_attn
    feed-forward      keeps L (A_attn + c), peak L (A_attn + c) + A_ffn
    both (k = 1/2)    keeps 2 L c, peak 2 L c + max(A_attn, A_ffn): below k = 1's L c + A only when
                      min(A_attn, A_ffn) > L c

Those peaks count residuals only. `backward_peak` walks the backward branch by branch and adds each
branch's working set while it runs (the gradients of its largest intermediates: attention's two
(b, h, s, s) ones), which a fine granularity has no freed residuals to absorb.

Recomputation is a branch's forward, not a block's: the attention branch is 8 T d^2 + 4 T s d FLOPs of
a block's 8 T d^2 + 4 T s d + 6 T d d_ff (T tokens; `branch_flops`), so checkpointing attention
alone recomputes the part whose residuals grow as s^2 at a fraction of a block's work.

With a budget of s stored states (the input among them), the fewest forwards is Griewank's binomial
("revolve") schedule: with r recomputations per step one can reverse at most C(s + r, s) steps, so
s = log L slots cost O(L log L) forwards and s = 1 costs O(L^2) (Griewank & Walther 2000). `revolve_forwards`
gives the closed form, `revolve_forwards_dp` the brute-force minimum it is tested against.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def _count(name: str, value: int, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


# --8<-- [start:single_level]
def single_level_peak(L: int, k: int, A: float, c: float) -> float:
    """Peak activation bytes with segments of k blocks: ceil(L/k) kept segment inputs, plus the k
    blocks of residuals that the backward of the last segment recomputes. k = 0 means no
    checkpointing (L*A)."""
    _count("L", L)
    _count("k", k, low=0)
    _positive("A", A)
    _positive("c", c)
    if k > L:
        raise ValueError(f"k must be at most L={L}, got {k}")
    return L * A if k == 0 else math.ceil(L / k) * c + k * A


def best_block_size(L: int, A: float, c: float) -> dict[str, float]:
    """The block size minimising single_level_peak: the continuous optimum k* = sqrt(L*c/A)
    (d/dk of L*c/k + k*A is zero there) and the best integer k, with both neighbours' peaks."""
    k_cont = math.sqrt(L * c / A)
    k_best = min(range(1, L + 1), key=lambda k: (single_level_peak(L, k, A, c), k))
    return {"k_continuous": k_cont, "k_best": k_best,
            "peak_best": single_level_peak(L, k_best, A, c),
            "peak_smaller": single_level_peak(L, k_best - 1, A, c) if k_best > 1 else math.nan,
            "peak_larger": single_level_peak(L, k_best + 1, A, c) if k_best < L else math.nan,
            "peak_none": L * A}
# --8<-- [end:single_level]


# --8<-- [start:nested]
def nested_forwards(L: int, split: str = "binary", early_stop: bool = True) -> int:
    """Block forwards of one forward + backward of the nested sketch (checkpointing.nested_checkpoint).

    A checkpointed segment's backward first recomputes its forward. PyTorch's non-reentrant
    checkpoint stops that recomputation as soon as every tensor the segment saved is back
    (`early_stop`, its default): for a segment [left half | right half] whose halves are themselves
    checkpoints, that is after the left half (which produces the right half's saved input).

        binary: E(n) = r(n) + E(floor(n/2)) + E(ceil(n/2)),  r(n) = floor(n/2) (early stop) or n,
                E(1) = 1; the top level is not checkpointed: L + E(left) + E(right). For L = 2^m:
                2L + (L/2)(m - 1) with early stop, L + L m without.
        peel:   the last block is plain, the rest one checkpoint: E(n) = n + E(n-1) either way
                (the last block needs the whole prefix), E(1) = 1: L + (L-1) L / 2.
    """
    _count("L", L)
    if split not in ("binary", "peel"):
        raise ValueError(f"split must be 'binary' or 'peel', got {split!r}")

    @lru_cache(maxsize=None)
    def E(n: int) -> int:  # recomputation forwards of the backward of one checkpointed n-block segment
        if n == 1:
            return 1
        if split == "peel":
            return n + E(n - 1)
        left, right = n // 2, n - n // 2
        return (left if early_stop else n) + E(left) + E(right)

    if L == 1:
        return 1
    if split == "peel":
        return L + E(L - 1)
    return L + E(L // 2) + E(L - L // 2)
# --8<-- [end:nested]


# --8<-- [start:revolve]
def revolve_forwards(L: int, s: int) -> int:
    """Fewest recomputed forward steps to reverse a chain of L steps when at most s states are held
    at once, the input among them (Griewank's binomial schedule, s >= 1). With r the repetition
    number, the least r with C(s + r, s) >= L (with r recomputations per step one can reverse at
    most C(s + r, s) steps), the count is r*L - C(s + r, s + 1)."""
    _count("L", L)
    _count("s", s)
    r = 0
    while math.comb(s + r, s) < L:
        r += 1
    return r * L - math.comb(s + r, s + 1)


def revolve_forwards_dp(L: int, s: int) -> int:
    """The same minimum by dynamic programming over where to put the next checkpoint: from the
    state held, run m steps, store x_m, reverse the last n - m steps with one slot fewer, then the
    first m with that slot free again: T(n, s) = min_m m + T(n - m, s - 1) + T(m, s); T(1, s) = 0;
    with the input alone (s = 1) every step recomputes its prefix, T(n, 1) = n(n-1)/2."""
    _count("L", L)
    _count("s", s)

    @lru_cache(maxsize=None)
    def T(n: int, slots: int) -> int:
        if n == 1:
            return 0
        if slots == 1:
            return n * (n - 1) // 2
        return min(m + T(n - m, slots - 1) + T(m, slots) for m in range(1, n))

    return T(L, s)
# --8<-- [end:revolve]


# --8<-- [start:sublayers]
BRANCHES = ("attn", "ffn")


def _branches(checkpointed) -> tuple[str, ...]:
    names = (checkpointed,) if isinstance(checkpointed, str) else tuple(checkpointed)
    unknown = [n for n in names if n not in BRANCHES]
    if unknown:
        raise ValueError(f"checkpointed: unknown branch(es) {unknown}; expected some of {', '.join(BRANCHES)}")
    return tuple(n for n in BRANCHES if n in names)


def sublayer_saved(L: int, A_attn: float, A_ffn: float, c: float, checkpointed=()) -> float:
    """Bytes the blocks leave for the backward when the branches in `checkpointed` are checkpointed
    inside every block: each checkpointed branch keeps its input (c), each other one its residuals.
    Exact for our model (tests count autograd's saved tensors), up to what every checkpoint shares
    (the causal mask and the positions, stored once)."""
    _count("L", L)
    for name, value in (("A_attn", A_attn), ("A_ffn", A_ffn), ("c", c)):
        _positive(name, value)
    kept = _branches(checkpointed)
    residuals = {"attn": A_attn, "ffn": A_ffn}
    return L * sum(c if b in kept else residuals[b] for b in BRANCHES)


def sublayer_peak(L: int, A_attn: float, A_ffn: float, c: float, checkpointed=()) -> float:
    """sublayer_saved plus the residuals of one recomputed branch (the larger checkpointed one),
    which the backward rebuilds one branch at a time: the activation peak, transients left out."""
    kept = _branches(checkpointed)
    residuals = {"attn": A_attn, "ffn": A_ffn}
    return sublayer_saved(L, A_attn, A_ffn, c, kept) + max((residuals[b] for b in kept), default=0.0)


def backward_peak(L: int, A_attn: float, A_ffn: float, c: float, W_attn: float, W_ffn: float, *,
                  k: int = 0, checkpointed=()) -> float:
    """The activation peak of the backward, walked branch by branch, with each branch's backward
    working set (W_attn, W_ffn: the gradients of its largest intermediates, which live only while
    its backward runs; accounting.branch_backward_bytes). `k` segments of k blocks (0: none) or
    `checkpointed` branches inside every block (one granularity at a time).

    The backward starts from what the forward saved and goes down the blocks, feed-forward then
    attention in each. A checkpointed segment or branch first recomputes its residuals (its kept
    input is one of them: A counts the norm's saved input); each branch's backward holds its
    working set on top, then frees its residuals. The peak is the largest level reached. Where
    sublayer_peak and single_level_peak count residuals only, this sees that a fine granularity
    has nothing freed to hold the attention's backward (two (b, h, s, s) gradients) in.
    """
    _count("L", L)
    _count("k", k, low=0)
    kept = _branches(checkpointed)
    if k and kept:
        raise ValueError("one granularity at a time: k > 0 or checkpointed branches, not both")
    if k > L:
        raise ValueError(f"k must be at most L={L}, got {k}")
    A, W = {"attn": A_attn, "ffn": A_ffn}, {"attn": W_attn, "ffn": W_ffn}
    if k:
        segments = [min(k, L - start) for start in range(0, L, k)]
        level = len(segments) * c
    else:
        segments = [1] * L
        level = sublayer_saved(L, A_attn, A_ffn, c, kept)
    peak = level
    for size in reversed(segments):
        if k:
            level += size * (A_attn + A_ffn) - c  # the segment's residuals again, its input among them
        for _ in range(size):
            for b in ("ffn", "attn"):
                if b in kept:
                    level += A[b] - c
                peak = max(peak, level + W[b])
                level -= A[b]
    return peak


def branch_flops(d_model: int, d_ff: int, context: int, tokens: int) -> dict[str, float]:
    """Forward FLOPs of each branch of one block over `tokens` tokens (sequences of `context`):
    attention 8 T d^2 (q, k, v, output projections) + 4 T s d (Q K^T and P V, the causal half not
    discounted, as model.flops_per_token); feed-forward 6 T d d_ff (SwiGLU's three matrices)."""
    for name, value in (("d_model", d_model), ("d_ff", d_ff), ("context", context), ("tokens", tokens)):
        _count(name, value)
    return {"attn": 8.0 * tokens * d_model**2 + 4.0 * tokens * context * d_model,
            "ffn": 6.0 * tokens * d_model * d_ff}


def granularity_table(L: int, A_attn: float, A_ffn: float, c: float, *,
                      working_set: dict[str, float] | None = None,
                      flops: dict[str, float] | None = None) -> list[dict[str, object]]:
    """No checkpointing, one block per segment (k = 1) and the three sub-block granularities: the
    residual peak (sublayer_peak / single_level_peak), the walked backward peak if `working_set`
    ({"attn": W_attn, "ffn": W_ffn}) is given, and the share of the forward each recomputes if
    `flops` (branch_flops) is given."""
    A = A_attn + A_ffn
    block = sum(flops.values()) if flops else None
    choices = [("none", 0, ()), ("k = 1 (a block)", 1, ()), ("attention branch", 0, ("attn",)),
               ("feed-forward branch", 0, ("ffn",)), ("each branch (k = 1/2)", 0, ("attn", "ffn"))]
    rows = []
    for name, k, kept in choices:
        residual = sublayer_peak(L, A_attn, A_ffn, c, kept) if kept else single_level_peak(L, k, A, c)
        if k or not kept:
            share = float(k > 0)
        else:
            share = sum(flops[b] for b in kept) / block if flops else None
        row = {"granularity": name, "k": k, "checkpointed": "+".join(kept) or "none",
               "residual_peak_bytes": residual, "recomputed": share}
        if working_set is not None:
            row["backward_peak_bytes"] = backward_peak(L, A_attn, A_ffn, c, working_set["attn"],
                                                       working_set["ffn"], k=k, checkpointed=kept)
        rows.append(row)
    return rows
# --8<-- [end:sublayers]


def strategy_table(L: int, A: float, c: float) -> list[dict[str, object]]:
    """Each strategy's peak activation bytes (modelled) and block forwards for a chain of L blocks,
    for a chapter to print beside the asymptotics."""
    best = best_block_size(L, A, c)
    depth = math.ceil(math.log2(L)) if L > 1 else 0
    return [
        {"strategy": "none", "memory": "L A", "forwards": "L",
         "peak_bytes": L * A, "block_forwards": L},
        {"strategy": f"single level, k = {best['k_best']}", "memory": "2 sqrt(L A c)",
         "forwards": "2 L", "peak_bytes": best["peak_best"], "block_forwards": 2 * L},
        {"strategy": "binary nesting", "memory": "O(log L) c + A", "forwards": "O(L log L)",
         # at most two kept inputs per level of the recursion, plus the block being differentiated
         "peak_bytes": 2 * depth * c + A, "block_forwards": nested_forwards(L, "binary")},
        {"strategy": "peel one (memory-optimal)", "memory": "O(1): c + A", "forwards": "O(L^2)",
         "peak_bytes": c + A, "block_forwards": nested_forwards(L, "peel")},
    ]
