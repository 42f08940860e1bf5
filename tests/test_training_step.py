"""The leaderboard's training step (cs336_systems/training_step/): its arithmetic against hand
numbers, the bench end to end on CPU (1 rank in-process, 2 gloo ranks), its refusals, and the key
equivalence: every variant is the plain model, as a function of the same weights on the same batch.

The equivalence (the course's comparison: same weights, same batch). Reference: the plain model in
float64 (naive attention, full logits, torch's cross-entropy, torch's AdamW), trained for STEPS
steps. Along that trajectory, at every step's weights, each variant in float32 (stock: SDPA, the
chunked loss under checkpoint; ours: FlashAttentionFast, on a CPU under the Triton interpreter, the
fused LM head + cross-entropy; both with the first block checkpointed) must give the same logits,
loss and gradients to within float32 rounding: normwise relative error at most gamma_N, N the
roundings along the longest path (tests/tolerances.py). The optimizers are held to the reference's
AdamW separately, fed the same gradients, with an elementwise bound derived below.

Why not compare two independent training runs' loss curves: Adam divides each gradient element by
its own running RMS, so an element whose gradient cancels to rounding level moves by +-lr on the
sign of that rounding, and two correct runs can part by ~lr in it; the loss then differs by an
amount no rounding analysis bounds without bounding the curvature. Held at the same weights and
fed the same gradients, each piece has a bound, and together they are the same training.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from cs336_systems.bench.device import PEAK_FLOPS
from cs336_systems.distributed.launch import Worker, spawn
from cs336_systems.model import ModelConfig, get_config, use_attention
from cs336_systems.training_step import arithmetic, bench, memory_budget
from cs336_systems.training_step.lm_loss import PlainLoss
from cs336_systems.training_step.train_step import StepOptions, init_lm, rank_batch
from cs336_systems.training_step.variants import build, recipe_of
from tests.tolerances import assert_relative_error, assert_within, gamma, transformer_rounding_depth
from tests.triton_mode import HAS_TRITON, NO_TRITON, ON_GPU, where_marks

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: bf16 (the Triton interpreter has none)")
B8 = get_config("8B")


# -- arithmetic: the numbers by hand ------------------------------------------------------------------

def test_parameter_counts_of_the_8b_model():
    emb = 151_936 * 4_096                                    # 622,329,856: embedding, and the LM head
    layer = 4 * 4_096 * 4_096 + 3 * 4_096 * 11_008           # 67,108,864 + 135,266,304
    assert arithmetic.params(B8) == 2 * emb + 34 * (layer + 2 * 4_096) + 4_096 == 8_125_698_048
    assert arithmetic.matmul_params(B8) == 34 * layer + emb == 7_503_085_568


def test_model_flops_of_the_leaderboard_step():
    tokens = 2 * 32_768
    weights = 6 * tokens * 7_503_085_568                     # 2.9505e15
    attention = 6 * 2 * 32_768**2 * 4_096 * 34               # causal, fwd + bwd: 1.7944e15
    assert arithmetic.weight_flops(B8, 2, 32_768) == weights
    assert arithmetic.attention_flops(B8, 2, 32_768) == attention
    assert arithmetic.attention_flops(B8, 2, 32_768, causal=False) == 2 * attention
    assert arithmetic.step_flops(B8, 2, 32_768) == weights + attention
    assert weights == pytest.approx(2.9505e15, rel=1e-4) and attention == pytest.approx(1.7944e15, rel=1e-4)
    assert weights + attention == pytest.approx(4.745e15, rel=1e-3)


def test_mfu_and_the_datasheet_peak():
    assert arithmetic.H200_BF16_DENSE_FLOPS == 989e12 == PEAK_FLOPS["H200"]["bf16"]
    # 4.745e15 FLOPs in 4 s on 2 GPUs of 989 TFLOP/s: 4.745e15 / 7.912e15
    assert arithmetic.mfu(4.745e15, 4.0, 2) == pytest.approx(4.745e15 / (4.0 * 2 * 989e12))
    with pytest.raises(ValueError):
        arithmetic.mfu(1.0, 0.0, 1)


def test_memory_per_block_and_what_the_plain_model_saves():
    layout = memory_budget.Layout("fused", "fused", 0, "none", param_bytes=2)
    # per token: two fp32 norms (2 x 2 x 4 d), attention's 8 bf16 (b, s, d) tensors and fp32 lse
    # (4 per head), the FFN's input (2 d) and four (b, s, d_ff) bf16 tensors
    by_hand = 2 * 2 * 4 * 4_096 + 8 * 2 * 4_096 + 4 * 32 + 2 * 4_096 + 4 * 2 * 11_008
    assert memory_budget.kept_block_bytes_per_token(B8, layout, 32_768) == by_hand == 227_456
    plain = recipe_of("plain", StepOptions(), B8, 1, "cuda").layout(torch.bfloat16)
    b = memory_budget.budget(B8, plain, world_size=1, batch_per_rank=2, context=32_768)
    # softmax's output, kept for P V's backward: 2 sequences x 32 heads x 32,768^2 x 2 B, 34 layers
    assert b.attention_probabilities == 2 * 32 * 32_768**2 * 2 * 34  # 4,352 GiB
    assert b.params == b.grads == 8_125_698_048 * 2 and b.optimizer_state == 2 * b.params
    assert b.lower_bound > 4_000 * 2**30


def test_ours_attention_is_ours_unless_asked_and_only_ours_takes_the_option():
    def attention(variant, **kw):
        return recipe_of(variant, StepOptions(**kw), B8, 1, "cuda").attention

    assert attention("ours") == "flash-triton" and attention("ours", attention="sdpa") == "sdpa"
    assert attention("stock", attention="flash-triton") == "sdpa"  # stock is stock PyTorch
    with pytest.raises(ValueError, match="ours' attention must be one of"):
        attention("ours", attention="naive")


def test_stock_and_ours_fit_two_h200s_and_sharding_halves_the_state():
    one, two = ({v: memory_budget.budget(B8, recipe_of(v, StepOptions(), B8, w, "cuda").layout(torch.bfloat16),
                                         w, 2 // w, 32_768) for v in ("stock", "ours")} for w in (1, 2))
    h200 = 141e9
    for v in ("stock", "ours"):
        assert two[v].estimate < h200 and one[v].lower_bound < h200
        assert two[v].params == one[v].params / 2 and two[v].optimizer_state == one[v].optimizer_state / 2


# -- the equivalence: every variant is the plain model ---------------------------------------------

CFG = ModelConfig(vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=2, d_ff=64)
BATCH, SEQ, STEPS, LR = 2, 20, 3, 1e-2  # seq 20: not a multiple of any tile size
OPTIONS = dict(keep_blocks=1, loss_chunk=16, lr=LR)  # block 0 checkpointed; 40 positions: 3 chunks
DEVICE = "cuda" if ON_GPU else "cpu"


@pytest.fixture(scope="module")
def trajectory():
    """Per step: (weights, tokens, targets, logits, loss, gradients) of float64 plain training."""
    plain = PlainLoss(init_lm(CFG, "cpu", torch.float64, seed=0))
    opt = torch.optim.AdamW(plain.parameters(), lr=LR)
    steps = []
    for t in range(STEPS):
        tokens, targets = rank_batch(CFG, BATCH, SEQ, 0, 1, "cpu", seed=t)
        weights = copy.deepcopy(plain.lm.state_dict())
        opt.zero_grad(set_to_none=True)
        with use_attention("naive"):
            logits = plain.logits(tokens).detach()
            loss = plain(tokens, targets)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in plain.lm.named_parameters()}
        steps.append((weights, tokens, targets, logits, loss.detach(), grads))
        opt.step()
    return steps


def _variant(name: str, dtype: torch.dtype, device: str):
    """A variant by name; "ours+sdpa" is ours with SDPA's attention (--ours-attention sdpa)."""
    name, _, attention = name.partition("+")
    options = StepOptions(dtype=dtype, attention=attention or None, **OPTIONS)
    worker = Worker(0, 1, 0, "gloo", torch.device(device))
    return build(recipe_of(name, options, CFG, 1, device), options, CFG, worker, BATCH)


def _check_against_reference(step, trajectory, tol_forward: float, tol: float) -> None:
    dtype = next(step.loss_module.parameters()).dtype
    for t, (weights, tokens, targets, ref_logits, ref_loss, ref_grads) in enumerate(trajectory):
        step.loss_module.lm.load_state_dict({n: w.to(dtype) for n, w in weights.items()})
        step.tokens, step.targets = tokens.to(step.tokens.device), targets.to(step.tokens.device)
        if t == 0:
            with torch.no_grad(), use_attention(step.attention):
                logits = step.loss_module.logits(step.tokens)
            assert_relative_error(logits.cpu(), ref_logits, tol_forward, f"{step.variant}: logits")
        loss = step.forward_backward()
        assert_relative_error(loss.cpu(), ref_loss, tol, f"{step.variant} step {t}: loss")
        for name, p in step.loss_module.lm.named_parameters():
            assert_relative_error(p.grad.cpu(), ref_grads[name], tol, f"{step.variant} step {t}: {name}")


@pytest.mark.parametrize("variant", ["stock", pytest.param("ours", marks=[needs_triton, *where_marks]),
                                     pytest.param("ours+sdpa", marks=[needs_triton, *where_marks])])
def test_fp32_variant_gives_the_plain_models_logits_loss_and_gradients(trajectory, variant):
    # float32 against float64: the weights' own rounding to float32 adds one rounding per path. On a
    # GPU, fp32 matmuls are IEEE (TF32 off, PyTorch's default) in cuBLAS and in our kernels alike.
    tol = gamma(transformer_rounding_depth(CFG, SEQ, BATCH) + 1, torch.float32)
    tol_forward = gamma(transformer_rounding_depth(CFG, SEQ, BATCH, backward=False) + 1, torch.float32)
    _check_against_reference(_variant(variant, torch.float32, DEVICE), trajectory, tol_forward, tol)


def bf16_roundings(cfg: ModelConfig, backward: bool) -> int:
    """bf16 roundings along the longest path of the bf16 model (each a relative error <= 2^-8; the
    sums inside matmuls and the softmax statistics are fp32, counted by transformer_rounding_depth).
    Forward: the weights' rounding from the fp32 initialisation (1); per block, the first norm's
    output, a projection, RoPE's cast tables, two products and a sum, P before P V, the attention
    output, the output projection, the residual add, the second norm, W1, SiLU, the gate product,
    W2, the residual add (16); the final norm and the logits (2). The backward retraces the path,
    each gradient rounded once per op, plus the fused loss's stored dL/dh and the head's dW (2)."""
    forward = 1 + 16 * cfg.num_layers + 2
    return 2 * forward + 2 if backward else forward


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["plain", "stock", "ours"])
def test_bf16_variant_matches_the_float64_model_on_a_gpu(trajectory, variant):
    # each bf16 rounding of an intermediate adds at most 2^-8 relative; their float32 sums add gamma_N
    fp32 = torch.float32
    tol = gamma(bf16_roundings(CFG, True), torch.bfloat16) + gamma(transformer_rounding_depth(CFG, SEQ, BATCH), fp32)
    tol_forward = (gamma(bf16_roundings(CFG, False), torch.bfloat16)
                   + gamma(transformer_rounding_depth(CFG, SEQ, BATCH, backward=False), fp32))
    _check_against_reference(_variant(variant, torch.bfloat16, "cuda"), trajectory, tol_forward, tol)


def adamw_error_bound(ref_params, ref_opt, grads_seq, lr, state_dtype, on_step) -> None:
    """Run the float64 reference AdamW (torch's) on `grads_seq` and, per step, call
    on_step(t, {param index: elementwise bound on |low-precision param - reference param|}).

    The low-precision optimizer sees exactly the reference's inputs (weights and gradients
    representable in its dtype), so the whole difference is its own rounding: every stored or
    computed quantity gets a relative error <= u (its dtype's unit roundoff; the constants beta,
    1 - beta, lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr wd each rounded once too), gamma_k for
    k of them. Per element, with m, v, p the reference's values and E their error bounds:
        m  <- beta1 m + (1 - beta1) g  (or torch's lerp m + (1 - beta1)(g - m)): |terms| <= 2|m| + |g|
              E_m <- E_m (1 + g4) + g4 (2 |m_prev| + |g|)
        v  <- beta2 v + (1 - beta2) g^2, every term >= 0:  E_v <- E_v (1 + g4) + g4 (v_prev + g^2)
        den = sqrt(v) / sqrt(1 - beta2^t) + eps:  off by at most g4 den + min(E_v / sqrt(v), sqrt(E_v)) / sqrt(bc2)
        q = m / den:  off by at most (E_m + (|m| + E_m) E_den / den_lo) / den_lo + g2 |q|
        p  <- p (1 - lr wd) - lr / (1 - beta1^t) q:
              E_p <- E_p (1 - lr wd) + g3 ((|p_prev| + E_p)(1 - lr wd) + step |q|) + step (E_q + g3 |q|)
    """
    beta1, beta2 = ref_opt.defaults["betas"]
    eps, wd = ref_opt.defaults["eps"], ref_opt.defaults["weight_decay"]
    g2, g3, g4 = (gamma(k, state_dtype) for k in (2, 3, 4))
    decay = 1 - lr * wd
    E = [{"p": torch.zeros_like(p), "m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in ref_params]
    for t, grads in enumerate(grads_seq, start=1):
        before = [(p.detach().clone(), ref_opt.state[p]["exp_avg"].clone() if ref_opt.state[p] else torch.zeros_like(p),
                   ref_opt.state[p]["exp_avg_sq"].clone() if ref_opt.state[p] else torch.zeros_like(p))
                  for p in ref_params]
        for p, g in zip(ref_params, grads):
            p.grad = g.clone()
        ref_opt.step()
        bc1, bc2 = 1 - beta1**t, 1 - beta2**t
        for i, (p, g) in enumerate(zip(ref_params, grads)):
            p_prev, m_prev, v_prev = before[i]
            e = E[i]
            m, v = ref_opt.state[p]["exp_avg"], ref_opt.state[p]["exp_avg_sq"]
            e["m"] = e["m"] * (1 + g4) + g4 * (2 * m_prev.abs() + g.abs())
            e["v"] = e["v"] * (1 + g4) + g4 * (v_prev + g * g)
            den = v.sqrt() / bc2**0.5 + eps
            dv = torch.where(v > 0, torch.minimum(e["v"] / v.sqrt().clamp_min(1e-300), e["v"].sqrt()), e["v"].sqrt())
            e_den = g4 * den + dv / bc2**0.5
            den_lo = den - e_den
            assert (den_lo > 0).all(), "the bound needs the denominator's error below the denominator"
            m_hi = m.abs() + e["m"]
            q_hi = m_hi / den_lo
            e_q = (e["m"] + m_hi * e_den / den_lo) / den_lo + g2 * q_hi
            step = lr / bc1
            e["p"] = e["p"] * decay + g3 * ((p_prev.abs() + e["p"]) * decay + step * q_hi) + step * (e_q + g3 * q_hi)
        on_step(t, [e["p"] for e in E])


@pytest.mark.parametrize("name", ["torch.optim.AdamW", pytest.param("FusedAdamW", marks=[needs_triton, *where_marks])])
def test_fp32_optimizer_takes_the_float64_adamw_steps(trajectory, name):
    """Each variant's optimizer in float32, fed the trajectory's gradients (rounded to float32), from
    the first weights (rounded), against torch's AdamW in float64 on the same values."""
    weights, grads_seq = trajectory[0][0], [[g.float() for g in step[5].values()] for step in trajectory]
    names = list(trajectory[0][5])
    low = [weights[n].float().to(DEVICE).clone() for n in names]
    for p in low:
        p.requires_grad_(True)
    if name == "FusedAdamW":
        from cs336_systems.training_step.fused_adamw import FusedAdamW

        opt = FusedAdamW(low, lr=LR)
    else:
        opt = torch.optim.AdamW(low, lr=LR)
    ref = [weights[n].float().double().clone().requires_grad_(True) for n in names]
    ref_opt = torch.optim.AdamW(ref, lr=LR)

    def check(t, bounds):
        for p, g in zip(low, grads_seq[t - 1]):
            p.grad = g.to(DEVICE)
        opt.step()
        for n, p, r, bound in zip(names, low, ref, bounds):
            assert_within(p.detach().cpu(), r.detach(), bound, f"{name} step {t}: {n}")
            # teeth: a wrong bias correction or decay moves elements by a good fraction of lr
            assert bound.max() < LR / 100, f"{n}: the bound {bound.max():.3g} is too loose to catch a bug"

    adamw_error_bound(ref, ref_opt, [[g.double() for g in gs] for gs in grads_seq], LR, torch.float32, check)


def _local_shard_steps(worker: Worker) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """FusedAdamW on FSDP2's local shards (2 ranks) and on the whole parameters, the same gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    from cs336_systems.training_step.fused_adamw import FusedAdamW
    from cs336_systems.training_step.local_shards import LocalShardOptimizer

    torch.manual_seed(0)
    # rows 4, 3, 1 over 2 ranks: an even split, an uneven one, and a rank that holds no row
    sharded = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    whole = copy.deepcopy(sharded)
    mesh = init_device_mesh("cpu", (worker.world_size,))
    fully_shard(sharded, mesh=mesh)
    opt = LocalShardOptimizer(sharded.parameters(), FusedAdamW, lr=0.1)
    ref = FusedAdamW(list(whole.parameters()), lr=0.1)
    for _ in range(2):
        grads = [torch.randn_like(p) for p in whole.parameters()]  # the same on both ranks (one seed)
        opt.zero_grad()
        for p, q, g in zip(sharded.parameters(), whole.parameters(), grads):
            p.grad, q.grad = distribute_tensor(g, mesh, p.placements), g.clone()
        opt.step()
        ref.step()
    return [(p.full_tensor(), q.detach()) for p, q in zip(sharded.parameters(), whole.parameters())]


@pytest.mark.distributed
@pytest.mark.interpreter
@needs_triton
def test_fused_adamw_on_fsdp2_local_shards_is_fused_adamw_on_the_whole_parameters(monkeypatch):
    # the update is elementwise: the same inputs per element give the same bits, however the
    # tensor is split (tolerances.py: the same operations on the same values, bound 0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the gloo ranks run the kernel on the CPU
    for sharded, whole in spawn(_local_shard_steps, 2, timeout_s=120)[0]:
        assert torch.equal(sharded, whole)


# -- the bench end to end -----------------------------------------------------------------------------

TINY = ["--size", "tiny", "--device", "cpu", "--context", "16", "--warmup-ms", "1", "--rep-ms", "1"]


def _rows(root) -> list[dict]:
    return [json.loads(line) for line in (root / "training-step" / "cpu.jsonl").read_text().splitlines()]


def _check_rows(rows: list[dict], world: int) -> None:
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    assert len({r["run_id"] for r in rows}) == 1  # one run: ratios between them are fair
    cfg = get_config("tiny", 16)
    # the first step: the same weights and batch in every variant, float32: each within gamma_N of
    # the exact loss (forward only), so within twice that of each other
    tol = 2 * gamma(transformer_rounding_depth(cfg, 16, 2, backward=False) + 1, torch.float32)
    first = rows[0]["loss_first_step"]
    for r in rows:
        assert r["world_size"] == world and r["batch"] == 2 and r["context"] == 16 and r["dtype"] == "fp32"
        assert r["step_ms"] > 0 and r["step_ms_mean"] > 0 and r["n_timed"] >= 1 and r["timer"].startswith("time_steps")
        assert r["warmup_ms"] == 1 and r["rep_ms"] == 1
        assert r["steps_taken"] == 1 + r["n_warmup"] + r["n_timed"]  # the first step, then time_steps'
        assert r["model_flops"] == arithmetic.step_flops(cfg, 2, 16) and r["mfu"] is None  # no CPU peak
        assert r["peak_allocated_gib"] is None  # no allocator to ask on the CPU
        assert 0 < r["first_step_s"] <= r["wall_to_first_step_s"] <= r["wall_total_s"] <= r["since_start_s"]
        assert r["memory_estimate_gib"]["lower_bound"] <= r["memory_estimate_gib"]["estimate"]
        assert abs(r["loss_first_step"] - first) <= tol * abs(first), (r["variant"], r["loss_first_step"], first)
        assert r["git"] and r["torch"]  # provenance rides along


@pytest.mark.parametrize("variants", [["plain", "stock"], pytest.param(["ours"], marks=[needs_triton, pytest.mark.interpreter])])
def test_bench_one_rank_writes_a_row_per_variant(tmp_path, variants):
    assert bench.main([*TINY, "--variant", *variants, "--keep-blocks", "1", "--results-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path)
    assert [r["variant"] for r in rows] == variants
    _check_rows(rows, world=1)
    flags = {r["variant"]: r["flags"] for r in rows}
    if "stock" in flags:
        assert flags["stock"] == {"attention": "sdpa", "loss": "chunked", "optimizer": "torch.optim.AdamW",
                                  "checkpointed_blocks": 1, "keep_blocks": 1, "compile": False, "shard": "none",
                                  "loss_chunk": 4096, "checkpoint": "full:1,none:1",
                                  "expandable_segments": False}
        assert flags["plain"]["attention"] == "naive" and flags["plain"]["checkpointed_blocks"] == 0
    else:
        assert flags["ours"]["optimizer"] == "FusedAdamW" and flags["ours"]["loss"] == "fused"
    # the kernel SDPA chose is recorded where SDPA runs (stock), and only there
    from torch.nn.attention import SDPBackend

    backends = {r["variant"]: r["sdpa_backend"] for r in rows}
    assert all((b in SDPBackend.__members__ and b != "ERROR") if v == "stock" else b is None for v, b in backends.items())


@pytest.mark.distributed
@pytest.mark.interpreter
@needs_triton
def test_bench_two_ranks_plain_ddp_stock_fsdp2_ours_fsdp2(tmp_path):
    argv = [*TINY, "--world-size", "2", "--variant", "plain", "stock", "ours", "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = _rows(tmp_path)
    _check_rows(rows, world=2)
    assert {r["variant"]: r["flags"]["shard"] for r in rows} == {"plain": "ddp", "stock": "fsdp2", "ours": "fsdp2"}


@pytest.mark.distributed
@pytest.mark.interpreter
@needs_triton
def test_bench_two_ranks_ours_in_our_fsdp(tmp_path):
    argv = [*TINY, "--world-size", "2", "--variant", "stock", "ours", "--shard", "fsdp", "--results-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = _rows(tmp_path)
    _check_rows(rows, world=2)
    assert rows[1]["flags"]["shard"] == "fsdp"


def test_bench_a_failing_variant_writes_its_row_and_the_others_still_run(tmp_path, monkeypatch):
    from cs336_systems.training_step import variants

    real = variants.build

    def build_or_fail(recipe, *args, **kwargs):
        if recipe.variant == "plain":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB")
        return real(recipe, *args, **kwargs)

    monkeypatch.setattr(variants, "build", build_or_fail)
    assert bench.main([*TINY, "--variant", "plain", "stock", "--results-dir", str(tmp_path)]) == 1
    rows = {r["variant"]: r for r in _rows(tmp_path)}
    assert rows["plain"]["status"] == "oom" and "128.00 GiB" in rows["plain"]["error"]
    assert rows["stock"]["status"] == "ok"


# -- refusals: one line, before any process starts or any file is written --------------------------



def _refused(argv, tmp_path, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
    return err[0]


def test_the_plain_8b_model_is_refused_by_the_memory_arithmetic(tmp_path, capsys, no_new_processes):
    err = _refused(["--size", "8B", "--device", "cpu", "--variant", "plain"], tmp_path, capsys)
    assert "--variant plain cannot fit" in err and "attention probabilities" in err and "--allow-oom" in err


def test_a_memory_limit_refuses_and_allow_oom_runs_anyway(tmp_path, capsys, monkeypatch):
    limit = ["--memory-per-rank-gib", "1e-6", "--variant", "stock"]
    err = _refused([*TINY, *limit], tmp_path, capsys)
    assert "--variant stock cannot fit" in err and "--memory-per-rank-gib" in err
    assert bench.main([*TINY, *limit, "--allow-oom", "--results-dir", str(tmp_path)]) == 0  # tiny fits, really


@pytest.mark.parametrize("argv, flag", [
    (["--keep-blocks", "3"], "--keep-blocks"),          # tiny has 2 blocks
    (["--world-size", "3"], "--batch"),                 # 2 sequences over 3 ranks
    (["--dtype", "bf16", "--variant", "ours"], "--dtype"),  # the interpreter has no bf16
    (["--variant", "fastest"], "--variant"),
    (["--shard", "zero"], "--shard"),
    (["--rep-ms", "0"], "--rep-ms"),
    (["--shard", "fsdp", "--compile"], "--shard fsdp"),  # its hooks would recompile every block
    # checkpoint plans (checkpoint_plan.py): refused before anything is built or spawned
    (["--checkpoint", "full:3"], "--checkpoint full:3"),         # tiny has 2 blocks
    (["--checkpoint", "none:2", "fast:2"], "--checkpoint fast:2"),  # one bad plan of two
    (["--checkpoint", "selective+w4:2"], "--checkpoint selective+w4:2"),
    (["--checkpoint", "full,none"], "--checkpoint full,none"),
    (["--checkpoint", "full:1", "--keep-blocks", "1"], "--checkpoint and --keep-blocks"),
    (["--sweep", "2", "--checkpoint", "full:2"], "--checkpoint and --sweep"),
    (["--sweep", "0"], "--sweep"),
    (["--sweep", "2", "--memory-per-rank-gib", "1e-6"], "--sweep: no plan of stock"),
    (["--checkpoint", "selective:2", "--memory-per-rank-gib", "1e-6"], "--checkpoint selective:2 cannot fit"),
    (["--trace-dir", "traces"], "--trace-dir"),                  # only with --profile
    (["--variant", "stock", "--checkpoint", "ours=full:2"], "--checkpoint ours=full:2"),  # not in this run
    (["--variant", "stock", "ours", "--checkpoint", "ours=full:2"], "no plan for stock"),
    (["--variant", "stock", "--checkpoint", "stock=full:3"], "--checkpoint stock=full:3"),
    (["--variant", "stock", "--ours-attention", "sdpa"], "--ours-attention"),  # ours' only
    (["--variant", "ours", "--ours-attention", "sdpa", "sdpa"], "--ours-attention"),
    (["--variant", "ours", "--ours-attention", "cudnn"], "--ours-attention"),
])
def test_bad_arguments_name_the_flag(argv, flag, tmp_path, capsys, no_new_processes):
    assert flag in _refused([*TINY, *argv], tmp_path, capsys)
