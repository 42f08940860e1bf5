"""The LM against the course handout's model-size table and against an independent functional implementation.

The reference below shares no code with cs336_systems.model: RoPE by complex multiplication,
attention by torch's F.scaled_dot_product_attention, RMSNorm by its formula, SwiGLU by F.silu,
AdamW and cross-entropy by torch's own. It runs in float64, so what it is compared against is the
float32 model's rounding error, bounded in tests/tolerances.py's terms (comments at each check).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.model import (
    PRESETS,
    AdamW,
    TransformerLM,
    count_parameters,
    cross_entropy,
    get_config,
    use_attention,
)
from cs336_systems.model import attention as attention_module
from tests.tolerances import assert_relative_error, assert_within, gamma, transformer_rounding_depth, unit_roundoff

# The handout's size table, (total, non-embedding) parameters; small exact, the others to the precision shown (0.1M).
SPEC_COUNTS = {
    "small": (128_625_408, 120_945_408),
    "medium": (423.2e6, 412.9e6),
    "large": (969.4e6, 956.6e6),
    "xl": (1998.2e6, 1982.2e6),
    "2.7B": (3406.8e6, 3381.2e6),
}


@pytest.mark.parametrize("size", list(PRESETS))
def test_parameter_counts_match_spec(size):
    total, non_embedding = SPEC_COUNTS[size]
    counts = count_parameters(get_config(size))
    # the module itself, built on the meta device (no memory), must agree with the formula
    model = TransformerLM.from_config(get_config(size), device="meta")
    built = sum(p.numel() for p in model.parameters())
    assert built == counts["total"]
    if size == "small":
        assert counts == {"total": total, "non_embedding": non_embedding}
    else:
        assert round(counts["total"] / 1e6, 1) == pytest.approx(total / 1e6)
        assert round(counts["non_embedding"] / 1e6, 1) == pytest.approx(non_embedding / 1e6)


# The 2026 handout's table: (d_model, d_ff, num_layers, num_heads) by its names.
HANDOUT_2026 = {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                "xl": (2560, 10240, 32, 32), "10B": (4608, 12288, 50, 36)}


@pytest.mark.parametrize("name", list(HANDOUT_2026))
def test_the_2026_table_maps_to_presets_of_its_shapes(name):
    from cs336_systems.model.config import EDITION_SIZES, handout_name

    preset = EDITION_SIZES["2026"][name]
    cfg = get_config(preset)
    assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads) == HANDOUT_2026[name]
    assert (cfg.vocab_size, cfg.context_length) == (10_000, 512)  # the handout's vocab and default context
    assert handout_name(preset, "2026") == name


def test_the_10b_preset_counts_its_parameters_like_the_built_module():
    # 50 x (4 d^2 + 3 d f + 2 d) + 2 V d + d, d = 4608, f = 12288, V = 10,000, by hand:
    by_hand = 50 * (4 * 4608**2 + 3 * 4608 * 12288 + 2 * 4608) + 2 * 10_000 * 4608 + 4608
    model = TransformerLM.from_config(get_config("10B"), device="meta")
    assert sum(p.numel() for p in model.parameters()) == count_parameters(get_config("10B"))["total"] == by_hand


def test_the_2025_presets_are_unchanged_and_each_edition_lists_five_sizes():
    from cs336_systems.model.config import edition_presets, handout_name

    assert list(PRESETS) == edition_presets("2025") == ["small", "medium", "large", "xl", "2.7B"]
    assert edition_presets("2026") == ["small", "medium", "large", "2.7B", "10B"]
    assert handout_name("2.7B", "2025") == "2.7B" and handout_name("xl", "2025") == "xl"
    with pytest.raises(ValueError, match="no preset 'xl'"):
        handout_name("xl", "2026")  # the 1600-wide xl is not in the 2026 table
    with pytest.raises(ValueError, match="unknown edition"):
        edition_presets("2024")


# ---- an independent functional implementation of the same architecture -----------------------

def rope_complex(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by pos * theta^(-2i/d), as complex multiplication."""
    *_, seq, d = x.shape
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), freqs)  # (seq, d/2)
    rot = torch.polar(torch.ones_like(angles), angles)  # complex128
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).reshape(x.shape).to(x.dtype)


def rms_norm(x, g, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def reference_forward(params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg) -> torch.Tensor:
    h, d = cfg.num_heads, cfg.d_model
    x = F.embedding(tokens, params["token_embeddings.weight"])
    b, s, _ = x.shape
    for i in range(cfg.num_layers):
        p = lambda n: params[f"layers.{i}.{n}"]  # noqa: E731
        y = rms_norm(x, p("ln1.weight"))
        q, k, v = (F.linear(y, p(f"attn.{n}_proj.weight")).view(b, s, h, d // h).transpose(1, 2)
                   for n in "qkv")
        q, k = rope_complex(q, cfg.rope_theta), rope_complex(k, cfg.rope_theta)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(a.transpose(1, 2).reshape(b, s, d), p("attn.output_proj.weight"))
        y = rms_norm(x, p("ln2.weight"))
        x = x + F.linear(F.silu(F.linear(y, p("ffn.w1.weight"))) * F.linear(y, p("ffn.w3.weight")),
                         p("ffn.w2.weight"))
    return F.linear(rms_norm(x, params["ln_final.weight"]), params["lm_head.weight"])


def test_forward_and_backward_match_an_independent_implementation():
    torch.manual_seed(0)
    cfg = get_config("tiny", 32)
    model = TransformerLM.from_config(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 32))
    targets = torch.randint(0, cfg.vocab_size, (2, 32))
    params = {n: p.detach().double().requires_grad_(True) for n, p in model.named_parameters()}

    ours = model(tokens)
    ref = reference_forward(params, tokens, cfg)  # float64
    # Each logit is a chain of at most N roundings (N: sums along the longest path, forward only),
    # so, normwise and to first order, relative error <= gamma_N times the network's condition,
    # which is ~1 at initialisation (RMSNorm puts every block's input at unit scale). Measured:
    # ~3e-7; gamma_N here ~1e-4; a wrong RoPE pairing or scale is off by O(1).
    assert_relative_error(ours, ref, gamma(transformer_rounding_depth(cfg, 32, batch=2, backward=False),
                                           torch.float32), "logits")

    cross_entropy(ours.view(-1, cfg.vocab_size), targets.view(-1)).backward()
    F.cross_entropy(ref.view(-1, cfg.vocab_size), targets.view(-1)).backward()
    # The backward retraces the path and sums over the batch's tokens: N grows accordingly.
    tol = gamma(transformer_rounding_depth(cfg, 32, batch=2), torch.float32)
    for name, p in model.named_parameters():
        assert_relative_error(p.grad, params[name].grad, tol, name)


def test_cross_entropy_matches_torch_including_large_logits():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 17) * 30  # large enough that a naive softmax would overflow in fp16
    targets = torch.randint(0, 17, (3, 5))
    ref = F.cross_entropy(logits.double().view(-1, 17), targets.view(-1))
    # Per row, lse - l_target with |lse|, |l_target| <= max|l| + log C: the logsumexp's exp, sum of
    # C terms, log and the subtraction take <= C + 6 roundings; the mean over rows adds 15 more.
    bound = gamma(17 + 6 + 15, torch.float32) * (2 * logits.abs().max().item() + math.log(17))
    assert_within(cross_entropy(logits, targets), ref, bound, "cross-entropy")


def _run(opt_cls, w0, grads, **kw):
    w = torch.nn.Parameter(w0.clone())
    opt = opt_cls([w], **kw)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    return w.detach()


def adamw_rounding_bound(w_max: float, lr: float, steps: int, dtype=torch.float32) -> float:
    """How far an AdamW run in `dtype` can drift from exact arithmetic on the same gradients.

    No sum runs across elements, and the weights do not feed back into the given gradients, so each
    step's errors just add up. Per step t: the decay product and the subtraction round w (2 u |w|);
    the update, at most ~2 lr in size (|m_hat| / sqrt(v_hat) <= (1 - b1) / sqrt(1 - b2) times a
    geometric factor, ~1.2 for betas (0.9, 0.95)), carries m's and v's errors (3 roundings per step
    so far) and ~10 more (sqrt, eps, bias corrections, the division): gamma_{3t + 10} * 2 lr.
    """
    return sum(2 * unit_roundoff(dtype) * w_max + gamma(3 * t + 10, dtype) * 2 * lr
               for t in range(1, steps + 1))


def test_adamw_matches_torch_adamw_without_weight_decay():
    torch.manual_seed(0)
    w0, grads = torch.randn(7, 5), [torch.randn(7, 5) * (i + 1) for i in range(20)]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ours, theirs = _run(AdamW, w0, grads, **kw), _run(torch.optim.AdamW, w0, grads, **kw)
    # eps enters as sqrt(v)+eps (course) vs sqrt(v/bc2)+eps (torch): that difference is measured in
    # float64; on top, each float32 run is within its rounding bound of its own exact run.
    formulas = (_run(AdamW, w0.double(), [g.double() for g in grads], **kw)
                - _run(torch.optim.AdamW, w0.double(), [g.double() for g in grads], **kw)).abs()
    w_max = w0.abs().max().item() + 20 * 2 * kw["lr"]  # each step moves w by at most ~2 lr
    assert_within(ours, theirs, formulas + 2 * adamw_rounding_bound(w_max, kw["lr"], 20), "AdamW vs torch")


def test_adamw_with_weight_decay_matches_the_course_algorithm_in_float64():
    """torch.optim.AdamW decays before the Adam update; the course's algorithm after it. So with
    decay, check against the course's algorithm written out in float64."""
    torch.manual_seed(0)
    w0, grads = torch.randn(7, 5), [torch.randn(7, 5) * (i + 1) for i in range(20)]
    lr, (b1, b2), eps, wd = 1e-2, (0.9, 0.95), 1e-8, 0.1
    w, m, v = w0.double(), torch.zeros(7, 5, dtype=torch.float64), torch.zeros(7, 5, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        alpha_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        w = w - alpha_t * m / (v.sqrt() + eps)
        w = w - lr * wd * w
    ours = _run(AdamW, w0, grads, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    # the float64 run's own error is ~1e-9 of this bound
    w_max = w0.abs().max().item() + 20 * 2 * lr
    assert_within(ours, w, adamw_rounding_bound(w_max, lr, 20), "AdamW vs the course's algorithm")


def test_use_attention_swaps_every_layer_and_restores():
    cfg = get_config("tiny", 16)
    model = TransformerLM.from_config(cfg)
    calls = []

    def counting(Q, K, V, mask=None):
        calls.append(Q.shape)
        return attention_module.naive_attention(Q, K, V, mask)

    original = attention_module.scaled_dot_product_attention
    tokens = torch.randint(0, cfg.vocab_size, (1, 16))
    with use_attention(counting):
        model(tokens)
    assert len(calls) == cfg.num_layers
    assert attention_module.scaled_dot_product_attention is original
    with pytest.raises(RuntimeError), use_attention(counting):
        raise RuntimeError("boom")
    assert attention_module.scaled_dot_product_attention is original  # restored after an error too
    model(tokens)
    assert len(calls) == cfg.num_layers  # no longer called


def test_flops_per_token_counts_matmuls():
    from cs336_systems.model import flops_per_token

    cfg = get_config("small", 512)
    n = count_parameters(cfg)["non_embedding"]
    assert flops_per_token(cfg, training=False) == 2 * n + 4 * cfg.num_layers * cfg.d_model * 512
    assert flops_per_token(cfg) == 3 * flops_per_token(cfg, training=False)
    assert math.isclose(flops_per_token(cfg, 1024, training=False) - flops_per_token(cfg, 512, training=False),
                        4 * cfg.num_layers * cfg.d_model * 512)
