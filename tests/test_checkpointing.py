"""Gradient checkpointing: the model's checkpoint_every switch, the nested sketch, and their costs.

References are independent of the code under test: the same model without checkpointing (outputs
and gradients must be bitwise equal, since recomputation replays the same CPU kernels on the same
inputs), autograd's saved tensors counted by saved_tensors_hooks, live tensor bytes counted at
dispatch, and forward calls counted by hooks on the blocks.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy
from cs336_systems.profiling.checkpoint_theory import (
    best_block_size,
    nested_forwards,
    revolve_forwards,
    revolve_forwards_dp,
    single_level_peak,
    strategy_table,
)
from cs336_systems.profiling.checkpointing import LiveTensorBytes, nested_checkpoint
from cs336_systems.sharding.accounting import saved_activation_bytes, transformer_activation_bytes

CFG = ModelConfig(vocab_size=64, context_length=16, d_model=32, num_layers=4, num_heads=2, d_ff=64)
BATCH = 3


def _model(k: int = 0) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM.from_config(CFG, checkpoint_every=k)


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, CFG.vocab_size, (BATCH, CFG.context_length), generator=g),
            torch.randint(0, CFG.vocab_size, (BATCH, CFG.context_length), generator=g))


def _loss(model, x, y):
    return cross_entropy(model(x).view(-1, CFG.vocab_size), y.view(-1))


@pytest.mark.parametrize("k", [1, 3, CFG.num_layers])
def test_outputs_and_gradients_identical_with_checkpointing(k):
    x, y = _tokens()
    ref, ck = _model(0), _model(k)
    ref_logits, ck_logits = ref(x), ck(x)
    assert torch.equal(ref_logits, ck_logits)
    _loss(ref, x, y).backward()
    _loss(ck, x, y).backward()
    for (name, p), q in zip(ref.named_parameters(), ck.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_each_block_runs_twice_with_checkpointing():
    """Checkpointing costs one extra forward of every block, whatever the segment size (counted
    as blocks entered: early stop may end a recomputation before the block returns)."""
    x, y = _tokens()
    for k, expected in [(0, 1), (1, 2), (3, 2)]:
        model = _model(k)
        calls = [0] * CFG.num_layers
        for i, block in enumerate(model.layers):
            block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        _loss(model, x, y).backward()
        assert calls == [expected] * CFG.num_layers, k


def test_saved_bytes_keep_only_segment_inputs():
    """After the forward and loss, autograd holds what lies outside the blocks, plus one (b, s, d) fp32
    input per segment, plus the causal mask (s*s bools) and positions (s int64) that every
    checkpoint saves once (one storage each)."""
    x, y = _tokens()
    b, s, d, L = BATCH, CFG.context_length, CFG.d_model, CFG.num_layers
    per_layer = transformer_activation_bytes(CFG, b) - transformer_activation_bytes(
        ModelConfig(**{**CFG.as_dict(), "num_layers": L - 1}), b)
    outside = transformer_activation_bytes(CFG, b) - L * per_layer
    saved = {}
    for k in [0, 1, 2, 3, L]:
        model = _model(k)
        with saved_activation_bytes(model.parameters()) as counted:
            _loss(model, x, y)
        saved[k] = counted["bytes"]
    outside += 8 * b * s  # the targets (int64), which the loss saves beside the token ids
    assert saved[0] == outside + L * per_layer
    for k in [1, 2, 3, L]:
        assert saved[k] == outside + s * s + 8 * s + math.ceil(L / k) * 4 * b * s * d, k
    assert saved[L] < saved[2] < saved[1] < saved[0]


def _peak_bytes(model, x, y) -> int:
    # Gradients allocated beforehand (accumulated into in place) so the peak is the activations'.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with LiveTensorBytes() as mem:
        _loss(model, x, y).backward()
    return mem.peak


def test_peak_memory_decreases_with_checkpointing():
    x, y = _tokens()
    peaks = {k: _peak_bytes(_model(k), x, y) for k in (0, 1, 2)}
    assert peaks[1] < peaks[0] and peaks[2] < peaks[0], peaks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the allocator's peak")
def test_allocator_peak_decreases_on_gpu():
    cfg = ModelConfig(vocab_size=256, context_length=256, d_model=128, num_layers=8, num_heads=4, d_ff=512)
    x = torch.randint(0, cfg.vocab_size, (8, cfg.context_length), device="cuda")
    peaks, grads = {}, {}
    for k in (0, 1, 2):
        torch.manual_seed(0)
        model = TransformerLM.from_config(cfg, device="cuda", checkpoint_every=k)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        torch.cuda.synchronize()
        peaks[k] = torch.cuda.max_memory_allocated() - base
        grads[k] = model.lm_head.weight.grad
    assert peaks[1] < peaks[0] and peaks[2] < peaks[0], peaks
    # recomputation replays the same kernels; fp32 leaves room only for a different cuBLAS
    # algorithm choice, a few ulps of sums over 2,048 tokens
    for k in (1, 2):
        torch.testing.assert_close(grads[k], grads[0], rtol=1e-5, atol=1e-6)


def test_checkpoint_every_is_validated():
    model = _model()
    for bad in (-1, CFG.num_layers + 1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="checkpoint_every"):
            model.checkpoint_every = bad
    with pytest.raises(ValueError, match="checkpoint_every"):
        TransformerLM.from_config(CFG, checkpoint_every=-1)


def test_no_checkpointing_under_no_grad():
    """Inference builds no graph, so there is nothing to checkpoint: one forward per block."""
    model = _model(1)
    calls = []
    model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        out = model(_tokens()[0])
    assert len(calls) == 1 and not out.requires_grad


# -- LiveTensorBytes ------------------------------------------------------------------------------

def test_live_bytes_counts_new_storages_once_and_frees_them():
    w = torch.randn(8, 8)
    with LiveTensorBytes() as mem:
        a = torch.ones(100)            # 400 bytes, new
        view = a[:10]                  # a view: no new memory
        t = w.t()                      # a view of a storage from before the block: not counted
        assert mem.live == 400
        b = a * 2                      # 400 more
        assert mem.live == mem.peak == 800
        del a, view, b
        assert mem.live == 0 and mem.peak == 800
    assert t.shape == (8, 8)


# -- the nested sketch ----------------------------------------------------------------------------

L_CHAIN, WIDTH = 16, 16


def _chain():
    """L blocks x -> tanh(W2 tanh(W1 x)), W1 4x wide: a block saves ~9 times its input."""
    torch.manual_seed(0)
    layers = [(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH))
              for _ in range(L_CHAIN)]
    calls = [0]

    def block(i):
        def run(x):
            calls[0] += 1
            return torch.tanh(layers[i][1](torch.tanh(layers[i][0](x))))
        return run

    params = [p for pair in layers for m in pair for p in m.parameters()]
    return [block(i) for i in range(L_CHAIN)], params, calls


def _run_chain(strategy: str):
    blocks, params, calls = _chain()
    for p in params:
        p.grad = torch.zeros_like(p)
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def forward(x):
        if strategy == "none":
            for blk in blocks:
                x = blk(x)
            return x
        if strategy == "single":
            for blk in blocks:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            return x
        return nested_checkpoint(blocks, x, strategy)

    with LiveTensorBytes() as mem:
        forward(x).sum().backward()
    return {"peak": mem.peak, "calls": calls[0], "grads": [x.grad, *(p.grad for p in params)]}


def test_nested_checkpointing_matches_and_orders_memory():
    runs = {s: _run_chain(s) for s in ("none", "single", "binary", "peel")}
    for s in ("single", "binary", "peel"):
        assert all(torch.equal(a, b) for a, b in zip(runs[s]["grads"], runs["none"]["grads"])), s
    peaks = {s: r["peak"] for s, r in runs.items()}
    assert peaks["peel"] < peaks["binary"] < peaks["single"] < peaks["none"], peaks
    assert runs["binary"]["calls"] == nested_forwards(L_CHAIN, "binary")
    assert runs["peel"]["calls"] == nested_forwards(L_CHAIN, "peel")
    assert runs["single"]["calls"] == 2 * L_CHAIN


def test_nested_forward_count_without_early_stop():
    with set_checkpoint_early_stop(False):
        calls = _run_chain("binary")["calls"]
    assert calls == nested_forwards(L_CHAIN, "binary", early_stop=False)


@pytest.mark.parametrize("L", [1, 2, 5, 8, 13])
def test_nested_forwards_closed_forms(L):
    assert nested_forwards(L, "peel") == L + (L - 1) * L // 2
    if L > 1 and L & (L - 1) == 0:  # L = 2^m: 2L + (L/2)(m - 1) with early stop, L + L m without
        m = L.bit_length() - 1
        assert nested_forwards(L, "binary") == 2 * L + L // 2 * (m - 1)
        assert nested_forwards(L, "binary", early_stop=False) == L + L * m


def test_nested_checkpoint_rejects_bad_input():
    with pytest.raises(ValueError, match="split"):
        nested_checkpoint([torch.tanh], torch.ones(1), "ternary")
    with pytest.raises(ValueError, match="blocks"):
        nested_checkpoint([], torch.ones(1))


# -- the arithmetic -------------------------------------------------------------------------------

def test_revolve_closed_form_equals_dynamic_programme():
    for L in range(1, 40):
        for s in range(1, 6):
            assert revolve_forwards(L, s) == revolve_forwards_dp(L, s), (L, s)


def test_single_level_optimum_by_brute_force_and_calculus():
    import sympy

    k, L, A, c = sympy.symbols("k L A c", positive=True)
    stationary = sympy.solve(sympy.diff(L * c / k + k * A, k), k)
    assert len(stationary) == 1 and sympy.simplify(stationary[0] - sympy.sqrt(L * c / A)) == 0
    at_optimum = sympy.simplify((L * c / k + k * A).subs(k, stationary[0]))
    assert sympy.simplify(at_optimum - 2 * sympy.sqrt(L * A * c)) == 0
    for Lv, Av, cv in [(48, 58.0, 1.0), (48, 26.0, 1.0), (100, 1.0, 1.0), (7, 3.0, 5.0)]:
        best = best_block_size(Lv, Av, cv)
        assert best["k_continuous"] == pytest.approx(float(stationary[0].subs({L: Lv, A: Av, c: cv})))
        brute = min(range(1, Lv + 1), key=lambda kk: math.ceil(Lv / kk) * cv + kk * Av)
        assert best["k_best"] == brute
        others = [best[key] for key in ("peak_smaller", "peak_larger")]
        assert all(best["peak_best"] <= p for p in others if not math.isnan(p))
        # the continuous optimum L*c/k + k*A >= 2 sqrt(L A c) bounds the integer one from below
        assert best["peak_best"] >= 2 * math.sqrt(Lv * Av * cv) - 1e-9


def test_single_level_peak_validation_and_table():
    assert single_level_peak(48, 0, 10.0, 1.0) == 480.0
    with pytest.raises(ValueError, match="k"):
        single_level_peak(4, 5, 1.0, 1.0)
    with pytest.raises(ValueError, match="A"):
        single_level_peak(4, 1, 0.0, 1.0)
    rows = strategy_table(32, 8.0, 1.0)
    peaks = [r["peak_bytes"] for r in rows]
    assert peaks == sorted(peaks, reverse=True)
    forwards = [r["block_forwards"] for r in rows]
    assert forwards == sorted(forwards)


# -- the benchmark CLI -------------------------------------------------------------------------------

def test_checkpoint_bench_on_cpu(tmp_path):
    from cs336_systems.bench.store import ResultStore
    from cs336_systems.profiling import checkpoint_bench as cb

    argv = ["--size", "tiny", "--context", "16", "--batch", "2", "--ks", "0,1,2", "--warmup", "0",
            "--steps", "1", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert cb.main(argv) == 0
    rows = {r["checkpoint_every"]: r for r in ResultStore(cb.BENCH, cb.KEY, device="cpu", root=tmp_path).rows()}
    assert set(rows) == {0, 1, 2} and all(r["status"] == "ok" and r["mean_ms"] > 0 for r in rows.values())
    saved = {k: r["saved_after_forward_gib"] for k, r in rows.items()}
    assert saved[2] < saved[1] < saved[0]
    assert rows[1]["live_peak_gib"] < rows[0]["live_peak_gib"]
    assert rows[1]["segments"] == 2 and rows[0]["segments"] == 0


@pytest.mark.parametrize("argv, flag", [(["--ks", "0,3"], "--ks"), (["--ks", "-1"], "--ks"),
                                        (["--size", "huge"], "--size"), (["--steps", "0"], "--steps"),
                                        (["--mode", "forward"], "--mode")])
def test_checkpoint_bench_bad_arguments_exit_2(argv, flag, capsys, tmp_path):
    from cs336_systems.profiling import checkpoint_bench as cb

    with pytest.raises(SystemExit) as info:
        cb.main(["--size", "tiny", "--device", "cpu", *argv, "--results-dir", str(tmp_path)])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
