"""What autograd saves for the backward pass (the "residuals"), by the line of our model that saved it.

The 2026 memory_profiling (f) asks how much memory one TransformerBlock saves for its backward pass
and which operations contribute most; the course reads it off an Nsight Systems memory profile. Here
autograd itself says (`sharding.accounting.saved_activation_bytes`, with `by_line`): a
`saved_tensors_hooks` pack hook sees every tensor as it is saved, and the Python stack at that
moment names the line of `cs336_systems/model` that saved it. Parameters and buffers are left out:
they are resident anyway, not saved for the backward.

Run it on PyTorch's "meta" device (`block_residuals`) and no memory is touched and no arithmetic is
done: shapes, dtypes and storages are all there is to count, so the xl block at context 2,048
takes well under a second on a laptop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cs336_systems.model.config import ModelConfig
from cs336_systems.model.layers import RotaryEmbedding
from cs336_systems.model.transformer import TransformerBlock
from cs336_systems.sharding.accounting import saved_activation_bytes


def saved_by_line(run: Callable[[], object], resident: list[torch.Tensor]) -> list[dict]:
    """Run `run()` (a forward pass) and return what autograd saved for its backward, one row per
    saving line of our model, largest first: {"site", "code", "bytes", "tensors"}. Storages of
    `resident` tensors (parameters, buffers) are not counted."""
    with saved_activation_bytes(resident, by_line=True) as saved:
        run()
    return sorted(saved["by_line"].values(), key=lambda r: -r["bytes"])


def block_residuals(cfg: ModelConfig, batch: int, context: int, device: str = "meta") -> list[dict]:
    """`saved_by_line` over one TransformerBlock of `cfg` (fp32, naive attention, causal mask) on a
    (batch, context, d_model) input that needs its gradient, as inside the model."""
    rope = RotaryEmbedding(cfg.rope_theta, cfg.d_model // cfg.num_heads, context, device)
    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, rope, device)
    x = torch.empty(batch, context, cfg.d_model, device=device, requires_grad=True)
    mask = torch.ones(context, context, dtype=torch.bool, device=device).tril()  # (ctx, ctx), True = keep
    positions = torch.arange(context, device=device)
    # The input counts: inside the model it is the previous block's output, which that block does
    # not save (a residual add saves nothing) and this block's first RMSNorm does.
    resident = [*block.parameters(), *block.buffers(), *rope.buffers(), mask, positions]
    return saved_by_line(lambda: block(x, mask, positions), resident)


def block_parameter_bytes(cfg: ModelConfig, dtype_bytes: int = 4) -> int:
    """One block's parameters, hence the gradients its backward pass produces (same shapes)."""
    d, f = cfg.d_model, cfg.d_ff
    return dtype_bytes * (4 * d * d + 3 * d * f + 2 * d)  # q, k, v, output; w1, w2, w3; two RMSNorm gains
