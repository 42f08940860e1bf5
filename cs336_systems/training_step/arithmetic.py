"""The training step's arithmetic, by formula (no model built, no torch): parameters, FLOPs, MFU.

    params(cfg)            every parameter: 8,125,698,048 for the "8B" preset
    matmul_params(cfg)     the ones that multiply a matrix: every Linear, the LM head included, the
                           embedding not (a lookup): 7,503,085,568 for "8B"
    step_flops(cfg, b, s)  model FLOPs of one training step (forward, backward; the optimizer's
                           elementwise work is not counted): 4.745e15 at the leaderboard's batch 2
                           x context 32,768
    mfu(flops, s, n, peak) model FLOPs utilisation: flops / (step seconds x GPUs x peak FLOP/s)
    recompute_flops_per_token(cfg, mode, S, compiled)   what one block recomputes in its
                           backward under a checkpoint mode (checkpoint_plan.py), per token

The FLOP count is the usual one (Kaplan et al. 2020; PaLM's appendix B), "model FLOPs": what the
model needs, not what an implementation runs (a recomputed forward under activation checkpointing
is not counted, so checkpointing shows up as a lower MFU, as it should).

    weights    6 x tokens x matmul params: each weight does one multiply-add (2 FLOPs) per token in
               the forward and two in the backward (the input's gradient and the weight's)
    attention  Q K^T and P V: 2 x S^2 x d_model FLOPs each per sequence and layer in the forward
               (over all heads: h x d_head = d_model), 4 S^2 d_model for both; the causal mask
               leaves half of the S^2 pairs, so 2 S^2 d_model, and the backward twice that:
               6 x batch x S^2 x d_model x layers for a causal training step
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the formulas read the fields only: no torch import at run time
    from cs336_systems.model.config import ModelConfig

# NVIDIA's datasheet figure for the H200 SXM: 1,979 TFLOP/s of bf16 "with sparsity", i.e. 989 dense.
# The denominator of the leaderboard's MFU. A measured matmul ceiling (results/ceilings) is lower,
# and the bench reports the MFU against it only as a second column.
H200_BF16_DENSE_FLOPS = 989e12


def params(cfg: ModelConfig) -> int:
    """Every parameter: embedding (V x d), per layer 4 d^2 (q, k, v, o) + 3 d d_ff (SwiGLU) + 2 d
    (the two RMSNorm gains), the final norm's d, the untied LM head (V x d)."""
    d, f, L, V = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
    return V * d + L * (4 * d * d + 3 * d * f + 2 * d) + d + V * d


def matmul_params(cfg: ModelConfig) -> int:
    """The parameters that multiply a matrix per token: every Linear of every layer and the LM head.
    Not the embedding (a row lookup, no FLOPs) nor the norm gains (elementwise)."""
    d, f, L, V = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
    return L * (4 * d * d + 3 * d * f) + V * d


def weight_flops(cfg: ModelConfig, batch: int, context: int) -> int:
    """6 x tokens x matmul params: forward 2, backward 4 FLOPs per weight and token."""
    return 6 * batch * context * matmul_params(cfg)


def attention_flops(cfg: ModelConfig, batch: int, context: int, causal: bool = True) -> int:
    """Q K^T and P V of a training step (forward + backward = 3 x forward), over every layer;
    causal attention counted at half (the masked half of the S^2 pairs is work nobody needs)."""
    forward = 4 * batch * context * context * cfg.d_model * cfg.num_layers
    forward = forward // 2 if causal else forward
    return 3 * forward


def step_flops(cfg: ModelConfig, batch: int, context: int, causal: bool = True) -> int:
    """Model FLOPs of one training step on `batch` sequences of `context` tokens."""
    return weight_flops(cfg, batch, context) + attention_flops(cfg, batch, context, causal)


def mfu(flops: float, step_s: float, n_gpus: int, peak_flops: float = H200_BF16_DENSE_FLOPS) -> float:
    """Model FLOPs utilisation: the fraction of `n_gpus` x `peak_flops` the step's FLOPs used."""
    if step_s <= 0 or n_gpus < 1 or peak_flops <= 0:
        raise ValueError(f"need step_s > 0, n_gpus >= 1, peak_flops > 0; got {step_s}, {n_gpus}, {peak_flops}")
    return flops / (step_s * n_gpus * peak_flops)


def recompute_flops_per_token(cfg: ModelConfig, mode: str, context: int, compiled: bool = True) -> int:
    """Matmul and attention FLOPs one block recomputes in its backward, per token, under a
    checkpoint mode (the elementwise work it recomputes is not counted). The backward needs the
    inputs of q, k, v, out, W1, W3 and W2 and the attention's O and L; a compiled backward
    recomputes only what those need, so W2's own product is never recomputed (no formula reads
    W2's output); eager, the recompute replays the forward through W2 (the last op that saves a
    tensor), so its 2 d f counts too.

        none        0
        full        q, k, v, out 8 d^2, W1 and W3 4 d f, the causal attention forward 2 S d
        selective   the same without the attention, less each kept matmul group: qkv 6 d^2,
                    out 2 d^2, w13 4 d f
    """
    from .checkpoint_plan import block_mode, saved_groups

    mode = block_mode(mode)
    if mode == "none":
        return 0
    d, f = cfg.d_model, cfg.d_ff
    w2 = 0 if compiled else 2 * d * f
    kept = {"qkv": 6 * d * d, "out": 2 * d * d, "w13": 4 * d * f}
    matmuls = 8 * d * d + 4 * d * f - sum(kept[g] for g in saved_groups(mode)) + w2
    return matmuls + (2 * context * d if mode == "full" else 0)
