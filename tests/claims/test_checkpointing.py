"""Claims of docs/memory/checkpointing.md (problem gradient_checkpointing).

Both parts are arithmetic about the package's model of checkpointing, with the per-block bytes
counted from the model's code; (b)'s H200 measurement is pending (the page says so), so no claim
here reads results/memory/checkpointing yet.
"""

from __future__ import annotations

import math

import pytest

from cs336_systems.model import get_config
from cs336_systems.profiling import checkpoint_theory as theory
from report import checkpointing as rc

GIB = 2**30


def test_the_2026_xl_is_our_2_7b_preset():
    # "its "xl" is d_model = 2560, d_ff = 10240, 32 layers, 32 heads, ... our preset `2.7B`.
    # Our preset `xl` is still the 2025 xl (1600, 6400, 48 layers, 25 heads)."
    new, old = get_config("2.7B"), get_config("xl")
    assert (new.d_model, new.d_ff, new.num_layers, new.num_heads) == (2560, 10240, 32, 32)
    assert (old.d_model, old.d_ff, old.num_layers, old.num_heads) == (1600, 6400, 48, 25)
    assert rc.CFG.d_model == new.d_model and rc.L == new.num_layers


def test_a_peel_is_the_least_memory_and_the_most_forwards():
    # (a): "Peak activation memory is O(1) in N ... c + A; compute is O(N^2) block forwards,
    # N + N(N-1)/2"; binary: "O(log N) checkpoints plus one block's residuals, at O(N log N)"
    A, c, L = rc.block_bytes(), rc.checkpoint_bytes(), rc.L
    table = {r["strategy"].split(",")[0]: r for r in theory.strategy_table(L, A, c)}
    peel, binary = table["peel one (memory-optimal)"], table["binary nesting"]
    single, none = table["single level"], table["none"]
    assert peel["peak_bytes"] == c + A
    assert peel["peak_bytes"] < binary["peak_bytes"] < single["peak_bytes"] < none["peak_bytes"]
    assert peel["block_forwards"] == L + L * (L - 1) // 2 > binary["block_forwards"] > L
    # the peel count grows as N^2, the binary one as N log N: double N and compare
    for n in (64, 128):
        assert theory.nested_forwards(2 * n, "peel") / theory.nested_forwards(n, "peel") == pytest.approx(4, rel=0.05)
        assert theory.nested_forwards(2 * n, "binary") / theory.nested_forwards(n, "binary") < 2.5


def test_b_k_star_is_below_one_so_k_1_is_best():
    # (b): "A = ... GiB dwarfs c = ... MiB, so k* = ..., below 1, and the best block size is the
    # smallest, k = 1"; "The model puts its activation peak at ... GiB, against ... GiB for the next
    # larger size, k = 2."
    A, c, L = rc.block_bytes(), rc.checkpoint_bytes(), rc.L
    assert A > 10 * c
    assert math.sqrt(L * c / A) < 1
    peaks = [theory.single_level_peak(L, k, A, c) for k in range(1, L + 1)]
    assert min(range(1, L + 1), key=lambda k: peaks[k - 1]) == 1 == theory.best_block_size(L, A, c)["k_best"]
    assert peaks[0] == L * c + A < peaks[1] == 16 * c + 2 * A


def test_b_no_checkpointing_cannot_fit():
    # "parameters, gradients and every block's residuals come to about ... GiB, and the H200 has ... GiB"
    assert rc.no_checkpointing_need_gib() > rc.capacity_gib()
