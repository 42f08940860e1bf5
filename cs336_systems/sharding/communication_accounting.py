"""The calculator behind problem communication_accounting (the XXL model), as pure functions.

The model (the handout's simplifications): `num_blocks` blocks of two linear layers,
d_model -> d_ff -> d_model, no attention, embeddings or output layer, no activation checkpointing.
Master weights, accumulated gradients and optimizer state (Adam: m and v) in fp32; activations and
gradient communication in bf16.

Notation of "How to Scale Your Model" (Austin et al. 2025), part 5: B tokens in the global batch,
D = d_model, F = d_ff, mesh axes X (FSDP) and Y (tensor parallel), N = X*Y chips, C FLOP/s per
chip, W_ici bytes/s of ICI bandwidth per axis (bidirectional), M_X and M_Y the number of physical
mesh axes each logical axis spans (bandwidth multiplies by it), alpha = C / W_ici.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


# --8<-- [start:config]
@dataclass(frozen=True)
class XXLConfig:
    d_model: int = 16_384
    d_ff: int = 53_248
    num_blocks: int = 126
    master_weight_bytes: int = 4   # fp32
    grad_bytes: int = 4            # fp32 accumulated gradients
    optimizer_bytes: int = 8       # fp32 Adam m and v
    activation_bytes: int = 2      # bf16
    comm_bytes: int = 2            # bf16 on the wire


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bytes: float
    flops: float = math.nan            # C, FLOP/s (bf16)
    ici_bandwidth: float = math.nan    # W_ici, bytes/s


H100_80GB = Accelerator("H100 80GB", memory_bytes=80e9)
TPU_V5P = Accelerator("TPU v5p", memory_bytes=95e9, flops=4.6e14, ici_bandwidth=2 * 9e10)


@dataclass(frozen=True)
class Mesh:
    X: int = 16     # FSDP axis
    Y: int = 4      # tensor-parallel axis
    M_X: int = 2    # physical axes the X axis spans
    M_Y: int = 1

    @property
    def N(self) -> int:
        return self.X * self.Y
# --8<-- [end:config]


# --8<-- [start:memory]
def n_params(cfg: XXLConfig) -> int:
    """Two d_model x d_ff matrices per block."""
    return 2 * cfg.d_model * cfg.d_ff * cfg.num_blocks


def state_bytes(cfg: XXLConfig) -> int:
    """Master weights + accumulated gradients + optimizer state: 4 + 4 + 8 = 16 bytes/parameter."""
    return n_params(cfg) * (cfg.master_weight_bytes + cfg.grad_bytes + cfg.optimizer_bytes)


def activation_bytes_per_token(cfg: XXLConfig) -> int:
    """Saved for backward, per token: the input of each linear layer, d_model and d_ff wide, bf16."""
    return cfg.num_blocks * (cfg.d_model + cfg.d_ff) * cfg.activation_bytes


def devices_to_hold(total_bytes: float, device: Accelerator) -> int:
    """How many devices' worth of memory `total_bytes` is (rounded up)."""
    return math.ceil(total_bytes / device.memory_bytes)


def fsdp_bytes_per_device(cfg: XXLConfig, n_fsdp: int, tokens: int = 0) -> float:
    """Weights, gradients, optimizer state and half the activations sharded over n_fsdp devices:
    S / N + A (1/2 + 1/(2N)), with A the activations of `tokens` tokens."""
    if n_fsdp < 1:
        raise ValueError(f"n_fsdp must be >= 1, got {n_fsdp}")
    A = activation_bytes_per_token(cfg) * tokens
    return state_bytes(cfg) / n_fsdp + A / 2 + A / (2 * n_fsdp)


def n_fsdp_required(cfg: XXLConfig, device: Accelerator, tokens: int = 0) -> int:
    """Smallest N with fsdp_bytes_per_device <= memory: N >= (S + A/2) / (M - A/2)."""
    S, A, M = state_bytes(cfg), activation_bytes_per_token(cfg) * tokens, device.memory_bytes
    if A / 2 >= M:
        raise ValueError(f"tokens={tokens}: the unsharded half of the activations alone "
                         f"({A / 2:.3g} bytes) exceeds the device's {M:.3g} bytes")
    n = max(1, math.ceil((S + A / 2) / (M - A / 2)))
    while fsdp_bytes_per_device(cfg, n, tokens) > M:  # guard against rounding at the boundary
        n += 1
    return n
# --8<-- [end:memory]


# --8<-- [start:compute_bound]
@dataclass(frozen=True)
class ForwardTimes:
    """Seconds per block of the forward pass at global batch B tokens."""

    math: float       # 2 matmuls x 2 B D F FLOPs, over N chips
    fsdp_comms: float  # all-gather both weight matrices over X
    tp_comms: float    # all-gather the activations over Y, reduce-scatter the output over Y


def forward_times(cfg: XXLConfig, device: Accelerator, mesh: Mesh, batch_tokens: float) -> ForwardTimes:
    """T_math = 4BDF / (N C); T_FSDP = 2 b D F / (Y W M_X); T_TP = 2 b B D / (X W M_Y), b = bytes
    per element on the wire (the book's formulas have b = 2, bf16)."""
    B, D, F, b = batch_tokens, cfg.d_model, cfg.d_ff, cfg.comm_bytes
    W, C = device.ici_bandwidth, device.flops
    return ForwardTimes(math=4 * B * D * F / (mesh.N * C),
                        fsdp_comms=2 * b * D * F / (mesh.Y * W * mesh.M_X),
                        tp_comms=2 * b * B * D / (mesh.X * W * mesh.M_Y))


def compute_bound_batch_per_device(cfg: XXLConfig, device: Accelerator, mesh: Mesh,
                                   overlap: bool = True) -> float:
    """The per-device batch B/N (tokens) above which the forward pass is compute bound.

    overlap=True (the book's assumption: FSDP and TP communication overlap each other and compute):
    T_math >= T_FSDP  <=>  B/N >= (b/2) alpha / (Y M_X); T_math >= T_TP holds at any B iff
    Y <= (2/b) F M_Y / alpha. overlap=False: T_math >= T_FSDP + T_TP, which gives
    B/N >= (b/2) alpha / (Y M_X) / (1 - (b/2) alpha Y / (F M_Y)).
    Raises ValueError when tensor-parallel communication alone outlasts the math (no batch helps).
    """
    alpha = device.flops / device.ici_bandwidth
    k = cfg.comm_bytes / 2
    tp_ratio = k * alpha * mesh.Y / (cfg.d_ff * mesh.M_Y)  # T_TP / T_math, independent of B
    if tp_ratio >= 1:
        raise ValueError(f"Y={mesh.Y}: tensor-parallel comms exceed the math at any batch "
                         f"(T_TP/T_math = {tp_ratio:.3g}); lower Y")
    threshold = k * alpha / (mesh.Y * mesh.M_X)
    return threshold if overlap else threshold / (1 - tp_ratio)
# --8<-- [end:compute_bound]


def compute_bound_summary(cfg: XXLConfig = XXLConfig(), device: Accelerator = TPU_V5P,
                          mesh: Mesh = Mesh(), overlap: bool = True) -> dict[str, float]:
    """Part (c) in one dict: alpha, the per-device threshold (exact and in whole tokens), the
    global batch it implies, and the three times at that batch."""
    per_device = compute_bound_batch_per_device(cfg, device, mesh, overlap)
    whole = math.ceil(per_device)
    t = forward_times(cfg, device, mesh, whole * mesh.N)
    return {"alpha": device.flops / device.ici_bandwidth, "per_device_exact": per_device,
            "per_device_tokens": whole, "global_batch_tokens": whole * mesh.N,
            "tokens_per_fsdp_shard": whole * mesh.Y,
            "t_math_s": t.math, "t_fsdp_s": t.fsdp_comms, "t_tp_s": t.tp_comms}
