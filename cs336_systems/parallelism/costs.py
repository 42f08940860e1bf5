"""Closed forms for one SwiGLU FFN under DP, FSDP, TP and FSDP+TP (the handout's section 8).

The layer: x (B, D) -> x1 = x W1, x2 = x W2 (W1, W2: D x F), z = f(x1) * x2, y = z W3 (W3: F x D).
In our model's names (layers.SwiGLU): the handout's W1 is w1, its W2 is our w3, its W3 is our w2.

Symbols: B tokens in the global batch, D = d_model, F = d_ff, N devices (N_FSDP x N_TP in 2-D),
C FLOP/s per device, W egress bytes/s per device, b bytes per element (2: fp16/bf16 weights and
activations). Only matmuls count: (m, k)(k, n) is 2mkn FLOPs. Collectives are the ring ones of
ring.py: all-gather and reduce-scatter of S bytes take (N-1)/N S/W, all-reduce twice that.

FLOPs per device. Forward: 3 matmuls of 2 B D F -> 6 B D F / N for every strategy (each device does
1/N of every matmul: a slice of the batch, or of F). Backward: dz, dx (two), dW1, dW2, dW3 are 6
matmuls -> 12 B D F / N.

Every function takes numbers or sympy symbols, so tests can solve the inequalities symbolically.
"""

from __future__ import annotations

from cs336_systems.sharding.accounting import MIXED_ADAMW, Precision, memory_per_rank

BYTES = 2  # fp16 / bf16, as the handout assumes


def _positive(**values) -> None:
    for name, v in values.items():
        try:
            ok = bool(v > 0)
        except TypeError:  # a sympy symbol of unknown sign
            ok = False
        if isinstance(v, bool) or not ok:
            raise ValueError(f"{name} must be positive, got {v!r}")


# -- collectives -------------------------------------------------------------------------------

# --8<-- [start:collective_time]
def ring_collective_time(S, N, W, op: str):
    """Seconds of a ring collective of S bytes (the full tensor) over N devices at W bytes/s each."""
    _positive(S=S, N=N, W=W)
    factor = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}.get(op)
    if factor is None:
        raise ValueError(f"op must be all_gather, reduce_scatter or all_reduce, got {op!r}")
    return factor * (N - 1) * S / (N * W)


def alternate_all_reduce_time(S, N, W):
    """The alternate ring: N - 1 steps, each device sending a whole S-byte tensor: (N-1) S / W."""
    _positive(S=S, N=N, W=W)
    return (N - 1) * S / W
# --8<-- [end:collective_time]


# -- FLOPs -------------------------------------------------------------------------------------

# --8<-- [start:flops]
def ffn_flops(B, D, F, N=1, pass_: str = "forward"):
    """Matmul FLOPs per device: forward 6BDF/N, backward 12BDF/N (same for DP, FSDP, TP, 2-D)."""
    _positive(B=B, D=D, F=F, N=N)
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    return (6 if pass_ == "forward" else 12) * B * D * F / N
# --8<-- [end:flops]


# -- communication seconds per pass --------------------------------------------------------------

# --8<-- [start:comm]
# --8<-- [start:dp_comm]
def dp_comm_time(D, F, N, W, b=BYTES):
    """DP backward: all-reduce the three weight gradients, S = 3 D F b: 2(N-1)/N 3DFb/W.
    The forward communicates nothing."""
    return ring_collective_time(3 * D * F * b, N, W, "all_reduce")
# --8<-- [end:dp_comm]


# --8<-- [start:fsdp_comm]
def fsdp_comm_time(D, F, N, W, pass_: str = "backward", b=BYTES):
    """FSDP forward: all-gather the three weights, (N-1)/N 3DFb/W. Backward: all-gather them again
    and reduce-scatter their gradients: twice that, the same bytes as DP's all-reduce."""
    gather = ring_collective_time(3 * D * F * b, N, W, "all_gather")
    return gather if pass_ == "forward" else gather + ring_collective_time(3 * D * F * b, N, W, "reduce_scatter")
# --8<-- [end:fsdp_comm]


# --8<-- [start:tp_comm]
def tp_comm_time(B, D, N, W, b=BYTES):
    """TP, either pass: one all-reduce of a (B, D) activation (y forward, dx backward):
    2(N-1)/N BDb/W. W1 and W2 column-parallel, W3 row-parallel, so nothing else moves."""
    return ring_collective_time(B * D * b, N, W, "all_reduce")
# --8<-- [end:tp_comm]


# --8<-- [start:fsdp_tp_comm]
def fsdp_tp_comm_times(B, D, F, N_fsdp, N_tp, W, b=BYTES):
    """2-D forward, per device: (FSDP all-gather of a TP slice of the weights, TP all-reduce of the
    batch slice's output) = ((N_f-1)/N_f 3DFb/(N_t W), 2(N_t-1)/N_t B D b/(N_f W))."""
    _positive(N_fsdp=N_fsdp, N_tp=N_tp)
    return (ring_collective_time(3 * D * F * b / N_tp, N_fsdp, W, "all_gather"),
            ring_collective_time(B * D * b / N_fsdp, N_tp, W, "all_reduce"))
# --8<-- [end:fsdp_tp_comm]
# --8<-- [end:comm]


# -- how many devices before communication outlasts compute ------------------------------------

# --8<-- [start:max_devices]
# --8<-- [start:dp_bound]
def dp_max_devices(B, C, W):
    """12BDF/(NC) >= 12DF(N-1)/(NW)  <=>  N <= 1 + B W / C. D and F cancel: the batch alone
    pays for the gradients' bytes. FSDP's two passes give the same bound."""
    _positive(B=B, C=C, W=W)
    return 1 + B * W / C
# --8<-- [end:dp_bound]


# --8<-- [start:tp_bound]
def tp_max_devices(F, C, W, pass_: str = "backward", b=BYTES):
    """Forward: 6BDF/(NC) >= 2(N-1)BDb/(NW)  <=>  N <= 1 + 3FW/(bC) (b = 2: 1 + 3FW/(2C)).
    Backward, twice the FLOPs for the same bytes: N <= 1 + 6FW/(bC). B and D cancel: the width
    of the FFN alone pays for the activations' bytes."""
    _positive(F=F, C=C, W=W)
    return 1 + (3 if pass_ == "forward" else 6) * F * W / (b * C)
# --8<-- [end:tp_bound]


# --8<-- [start:fsdp_tp_bound]
def fsdp_tp_max_devices(B, F, C, W, overlap: bool = True, b=BYTES):
    """Forward of 2-D parallelism, N = N_FSDP N_TP devices at the best split, T = 6BDF/(NC).

    overlap (the two axes' collectives run at once): T must outlast each, and each condition is
    the 1-D one: N_FSDP <= 1 + BW/C and N_TP <= 1 + 3FW/(bC), so N <= their product, about
    3BFW^2/(2C^2) for b = 2.

    no overlap (they share the links): T >= T_FSDP + T_TP is linear in (N_FSDP, N_TP),
    p N_FSDP + q N_TP <= K (see _no_overlap_constraint); the product of two numbers with a fixed
    weighted sum is largest when p N_FSDP = q N_TP = K/2, so N <= K^2/(4pq), about 3BFW^2/(8C^2):
    a quarter of the overlapped bound.
    """
    if overlap:
        return dp_max_devices(B, C, W) * tp_max_devices(F, C, W, "forward", b)
    p, q, K = _no_overlap_constraint(B, F, C, W, b)
    return K ** 2 / (4 * p * q)


def _no_overlap_constraint(B, F, C, W, b):
    """T_FSDP + T_TP <= T, multiplied through by N W / D:
    3Fb(N_FSDP - 1) + 2Bb(N_TP - 1) <= 6BFW/C, i.e. p = 3Fb, q = 2Bb, K = 6BFW/C + p + q."""
    _positive(B=B, F=F, C=C, W=W)
    p, q = 3 * F * b, 2 * B * b
    return p, q, 6 * B * F * W / C + p + q
# --8<-- [end:fsdp_tp_bound]


def fsdp_tp_split(B, F, C, W, overlap: bool = True, b=BYTES) -> tuple:
    """(N_FSDP, N_TP) at the optimum of fsdp_tp_max_devices (real numbers, not rounded)."""
    if overlap:
        return dp_max_devices(B, C, W), tp_max_devices(F, C, W, "forward", b)
    p, q, K = _no_overlap_constraint(B, F, C, W, b)
    return K / (2 * p), K / (2 * q)
# --8<-- [end:max_devices]


# -- memory per device -----------------------------------------------------------------------------

def ffn_memory_per_device(B, D, F, strategy: str, N_fsdp=1, N_tp=1,
                          precision: Precision = MIXED_ADAMW, b=BYTES) -> dict:
    """Bytes per device of the FFN's training state and saved activations.

    State: 3DF parameters at `precision` (default the ZeRO paper's mixed-precision Adam, 16 bytes:
    bf16 weights and grads, fp32 master, m, v), divided by the devices that shard it: N_FSDP
    (FSDP), N_TP (TP), both (2-D); DP replicates it. Activations saved for backward, b bytes each:
    x (B, D), x1, x2, z (B, F): the batch is split over the data axis (DP/FSDP) and F over TP,
    while x stays whole on every TP rank.
    """
    _positive(B=B, D=D, F=F, N_fsdp=N_fsdp, N_tp=N_tp)
    if strategy not in ("dp", "fsdp", "tp", "fsdp_tp"):
        raise ValueError(f"strategy must be dp, fsdp, tp or fsdp_tp, got {strategy!r}")
    batch_split = N_fsdp if strategy != "tp" else 1
    f_split = N_tp if strategy in ("tp", "fsdp_tp") else 1
    state_split = {"dp": 1, "fsdp": N_fsdp, "tp": N_tp, "fsdp_tp": N_fsdp * N_tp}[strategy]
    # every kind of state divided by the devices that hold a slice of it: ZeRO-3's accounting
    state = memory_per_rank(3 * D * F, state_split, "zero3", precision).total
    activations = b * (B / batch_split) * (D + 3 * F / f_split)
    return {"state": state, "activations": activations, "total": state + activations}
