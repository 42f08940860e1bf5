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

from cs336_systems.model import ModelConfig, TransformerLM, cross_entropy, get_config
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


def test_checkpoint_bench_measures_the_sub_block_granularities_in_a_file_of_their_own(tmp_path):
    """The sub-block cells go beside the block-size file, not into it (whose readers key rows by k
    alone); --remeasure measures cells of a resumed run again."""
    import json

    from cs336_systems.bench.store import results_path
    from cs336_systems.profiling import checkpoint_bench as cb

    argv = ["--size", "tiny", "--context", "16", "--batch", "2", "--ks", "1", "--warmup", "0",
            "--steps", "1", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert cb.main([*argv, "--sublayers", "attn,ffn,attn+ffn"]) == 0
    blocks = results_path(cb.BENCH, "cpu", tmp_path)
    inside = results_path(cb.SUBLAYER_BENCH, "cpu", tmp_path)
    assert [json.loads(line)["checkpoint_every"] for line in blocks.read_text().splitlines()] == [1]
    by = {r["sublayers"]: r for r in map(json.loads, inside.read_text().splitlines())}
    assert set(by) == {"attn", "ffn", "attn+ffn"}
    assert all(r["status"] == "ok" and r["checkpoint_every"] == 0 for r in by.values())
    saved = {g: r["saved_after_forward_gib"] for g, r in by.items()}
    assert saved["attn+ffn"] < min(saved["attn"], saved["ffn"])
    assert by["attn+ffn"]["segments"] == 2 * get_config("tiny").num_layers
    assert cb.main([*argv, "--sublayers", "attn", "--resume"]) == 0  # that run is done: nothing measured
    assert len(inside.read_text().splitlines()) == 3 and len(blocks.read_text().splitlines()) == 1
    assert cb.main([*argv, "--sublayers", "attn", "--resume", "--remeasure"]) == 0  # again, within it
    assert len(inside.read_text().splitlines()) == 4 and len(blocks.read_text().splitlines()) == 2
    assert cb.main([*argv, "--sublayers", "attn"]) == 0  # a new run measures every cell
    assert len(inside.read_text().splitlines()) == 5 and len(blocks.read_text().splitlines()) == 3


@pytest.mark.parametrize("argv, flag", [(["--ks", "0,3"], "--ks"), (["--ks", "-1"], "--ks"),
                                        (["--size", "huge"], "--size"), (["--steps", "0"], "--steps"),
                                        (["--mode", "forward"], "--mode"), (["--sublayers", "norm"], "--sublayers")])
def test_checkpoint_bench_bad_arguments_exit_2(argv, flag, capsys, tmp_path):
    from cs336_systems.profiling import checkpoint_bench as cb

    with pytest.raises(SystemExit) as info:
        cb.main(["--size", "tiny", "--device", "cpu", *argv, "--results-dir", str(tmp_path)])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# ---- finer than a block: checkpointing one branch of every block ----------------------------------

SUBLAYER_CASES = [("attn",), ("ffn",), ("attn", "ffn")]


def _sub_model(sublayers=(), cfg=CFG, k=0) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM.from_config(cfg, checkpoint_every=k)
    model.checkpoint_sublayers = sublayers
    return model


@pytest.mark.parametrize("sublayers", SUBLAYER_CASES)
def test_sublayer_checkpointing_gives_the_same_loss_and_gradients_bit_for_bit(sublayers):
    # Recomputation replays the same CPU kernels on the same inputs: the same arithmetic.
    x, y = _tokens()
    ref, ck = _model(0), _sub_model(sublayers)
    ref_loss, ck_loss = _loss(ref, x, y), _loss(ck, x, y)
    assert torch.equal(ref_loss, ck_loss)
    ref_loss.backward()
    ck_loss.backward()
    for (name, p), q in zip(ref.named_parameters(), ck.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("sublayers", [(), *SUBLAYER_CASES])
def test_only_the_checkpointed_branches_run_twice(sublayers):
    x, y = _tokens()
    model = _sub_model(sublayers)
    calls = {"attn": 0, "ffn": 0}
    for block in model.layers:
        block.attn.register_forward_pre_hook(lambda *_: calls.__setitem__("attn", calls["attn"] + 1))
        block.ffn.register_forward_pre_hook(lambda *_: calls.__setitem__("ffn", calls["ffn"] + 1))
    _loss(model, x, y).backward()
    L = CFG.num_layers
    assert calls == {b: (2 if b in sublayers else 1) * L for b in calls}


def test_each_branch_saves_what_the_accounting_counts():
    """The per-branch count (accounting.block_sublayer_bytes) against autograd's saved tensors of one
    branch called alone, and the two branches against the per-layer count of the whole model."""
    from cs336_systems.sharding.accounting import block_sublayer_bytes

    model = _model(0)
    block, s = model.layers[0], CFG.context_length
    h = torch.randn(BATCH, s, CFG.d_model, requires_grad=True)
    positions = torch.arange(s)
    with saved_activation_bytes(model.parameters()) as attn:
        block.attention_branch(h, model.causal_mask, positions)
    with saved_activation_bytes(model.parameters()) as ffn:
        block.ffn_branch(h)
    counted = block_sublayer_bytes(CFG, BATCH)
    assert (attn["bytes"], ffn["bytes"]) == (counted["attn"], counted["ffn"])
    one_fewer = ModelConfig(**{**CFG.as_dict(), "num_layers": CFG.num_layers - 1})
    per_layer = transformer_activation_bytes(CFG, BATCH) - transformer_activation_bytes(one_fewer, BATCH)
    assert counted["attn"] + counted["ffn"] == per_layer


@pytest.mark.parametrize("sublayers", [(), *SUBLAYER_CASES])
def test_saved_bytes_move_as_the_sublayer_arithmetic_predicts(sublayers):
    """Exactly: what lies outside the blocks, plus checkpoint_theory.sublayer_saved from the
    per-branch counts, plus the causal mask (s*s bools) and positions (s int64) that the attention
    checkpoints take as inputs, stored once (one storage each)."""
    from cs336_systems.profiling.checkpoint_theory import sublayer_saved
    from cs336_systems.sharding.accounting import block_sublayer_bytes

    x, y = _tokens()
    b, s, d, L = BATCH, CFG.context_length, CFG.d_model, CFG.num_layers
    A = block_sublayer_bytes(CFG, b)
    outside = transformer_activation_bytes(CFG, b) - L * (A["attn"] + A["ffn"]) + 8 * b * s  # + the targets
    shared = s * s + 8 * s if "attn" in sublayers else 0
    model = _sub_model(sublayers)
    with saved_activation_bytes(model.parameters()) as counted:
        _loss(model, x, y)
    assert counted["bytes"] == outside + shared + sublayer_saved(L, A["attn"], A["ffn"], 4 * b * s * d, sublayers)


# Two shapes on either side of the k = 1 against k = 1/2 question: in the first the feed-forward
# branch's residuals exceed the L kept inputs that halving the segments adds; in the second a long
# context makes attention's backward working set (2 b h s^2) dominate.
PEAK_CFGS = [CFG, ModelConfig(vocab_size=64, context_length=128, d_model=64, num_layers=3, num_heads=4, d_ff=128)]


@pytest.mark.parametrize("cfg", PEAK_CFGS, ids=["short", "long"])
def test_the_walked_backward_peak_is_within_20_percent_of_the_live_tensor_peak(cfg):
    """backward_peak against LiveTensorBytes for none, k = 1, 2 and the three branch granularities.
    20%: the walk leaves out what lies outside the blocks (logits, the loss) and rounds each
    branch's working set to its largest gradients; on these shapes it lands within 13%. And the two
    agree on which of k = 1 and k = 1/2 is the smaller."""
    from cs336_systems.profiling.checkpoint_theory import backward_peak
    from cs336_systems.sharding.accounting import block_sublayer_bytes, branch_backward_bytes

    b, s, L = 2, cfg.context_length, cfg.num_layers
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, cfg.vocab_size, (b, s), generator=g) for _ in range(2))
    A, W, c = block_sublayer_bytes(cfg, b), branch_backward_bytes(cfg, b), 4 * b * s * cfg.d_model
    measured, modelled = {}, {}
    for k, kept in [(0, ()), (1, ()), (2, ()), *((0, sub) for sub in SUBLAYER_CASES)]:
        model = _sub_model(kept, cfg, k)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with LiveTensorBytes() as mem:
            cross_entropy(model(x).view(-1, cfg.vocab_size), y.view(-1)).backward()
        measured[(k, kept)] = mem.peak
        modelled[(k, kept)] = backward_peak(L, A["attn"], A["ffn"], c, W["attn"], W["ffn"], k=k, checkpointed=kept)
        assert modelled[(k, kept)] == pytest.approx(mem.peak, rel=0.2), (k, kept)
    half, one = (0, ("attn", "ffn")), (1, ())
    assert (measured[half] < measured[one]) == (modelled[half] < modelled[one])
    assert (measured[half] < measured[one]) == (cfg is CFG)  # the two shapes really differ
    for kept in SUBLAYER_CASES[:2]:  # one branch checkpointed sits between none and k = 1
        assert measured[(1, ())] < measured[(0, kept)] < measured[(0, ())]


def test_sublayer_arithmetic_by_hand():
    from cs336_systems.profiling.checkpoint_theory import (
        backward_peak,
        branch_flops,
        granularity_table,
        sublayer_peak,
        sublayer_saved,
    )

    L, Aa, Af, c = 4, 10.0, 6.0, 1.0
    assert sublayer_saved(L, Aa, Af, c) == L * (Aa + Af) == single_level_peak(L, 0, Aa + Af, c)
    assert sublayer_peak(L, Aa, Af, c, "attn") == L * (c + Af) + Aa
    assert sublayer_peak(L, Aa, Af, c, ["ffn", "attn"]) == 2 * L * c + Aa
    # without working sets, the walk's peak is where it starts: everything the forward saved
    assert backward_peak(L, Aa, Af, c, 0.0, 0.0) == L * (Aa + Af)
    assert backward_peak(L, Aa, Af, c, 0.0, 0.0, k=1) == L * c + Aa + Af - c  # the input is one of A's
    fl = branch_flops(d_model=8, d_ff=32, context=4, tokens=16)
    assert fl == {"attn": 8 * 16 * 64 + 4 * 16 * 4 * 8, "ffn": 6 * 16 * 8 * 32}
    table = {r["granularity"]: r for r in granularity_table(L, Aa, Af, c, flops=fl,
                                                           working_set={"attn": 1.0, "ffn": 1.0})}
    assert table["attention branch"]["recomputed"] == pytest.approx(fl["attn"] / sum(fl.values()))
    assert table["k = 1 (a block)"]["recomputed"] == 1.0 and table["none"]["recomputed"] == 0.0
    assert all("backward_peak_bytes" in r for r in table.values())
    with pytest.raises(ValueError, match="one granularity"):
        backward_peak(L, Aa, Af, c, 0.0, 0.0, k=1, checkpointed="attn")
    with pytest.raises(ValueError, match="unknown branch"):
        sublayer_saved(L, Aa, Af, c, "norm")


def test_the_model_takes_one_granularity_at_a_time():
    model = _model(0)
    model.checkpoint_sublayers = ("ffn", "attn", "ffn")
    assert model.checkpoint_sublayers == ("attn", "ffn")  # canonical order, once each
    with pytest.raises(ValueError, match="one granularity"):
        model.checkpoint_every = 2
    model.checkpoint_sublayers = ()
    model.checkpoint_every = 2
    with pytest.raises(ValueError, match="one granularity"):
        model.checkpoint_sublayers = "attn"
    with pytest.raises(ValueError, match="unknown sub-layer"):
        model.checkpoint_sublayers = ("norm",)
