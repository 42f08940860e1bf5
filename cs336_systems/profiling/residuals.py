"""What autograd saves for the backward pass (the "residuals"), by the line of our model that saved it.

The 2026 memory_profiling (f) asks how much memory one TransformerBlock saves for its backward pass
and which operations contribute most; the course reads it off an Nsight Systems memory profile. Here
autograd itself says: `saved_tensors_hooks` sees every tensor as it is saved, and the Python stack
at that moment names the line of `cs336_systems/model` that saved it. A storage saved twice (a
tensor and a view of it) counts once, and parameters and buffers are left out: they are resident
anyway, not saved for the backward.

Run it on PyTorch's "meta" device (`block_residuals`) and no memory is touched and no arithmetic is
done: shapes, dtypes and storages are all there is to count, so the xl block at context 2,048
takes well under a second on a laptop.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from cs336_systems.model.config import ModelConfig
from cs336_systems.model.layers import RotaryEmbedding
from cs336_systems.model.transformer import TransformerBlock

PACKAGE = Path(__file__).resolve().parents[1]  # cs336_systems/
MODEL = PACKAGE / "model"


def _saving_line() -> tuple[str, str]:
    """(file:line, source text) of the innermost frame in cs336_systems/model on the stack."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if MODEL in path.parents:
            return f"{path.relative_to(PACKAGE.parent).as_posix()}:{frame.lineno}", (frame.line or "").strip()
    return "(outside cs336_systems/model)", ""


# --8<-- [start:saved_by_line]
def saved_by_line(run: Callable[[], object], resident: list[torch.Tensor]) -> list[dict]:
    """Run `run()` (a forward pass) and return what autograd saved for its backward, one row per
    saving line of our model, largest first: {"site", "code", "bytes", "tensors"}. Storages of
    `resident` tensors (parameters, buffers) are not counted."""
    skip = {t.untyped_storage()._cdata for t in resident}
    rows: dict[str, dict] = {}
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip and storage._cdata not in seen:  # one storage, counted once
            seen.add(storage._cdata)
            site, code = _saving_line()
            row = rows.setdefault(site, {"site": site, "code": code, "bytes": 0, "tensors": 0})
            row["bytes"] += storage.nbytes()
            row["tensors"] += 1
        return t.detach()  # see sharding.accounting.saved_activation_bytes: no cycle through C++

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sorted(rows.values(), key=lambda r: -r["bytes"])
# --8<-- [end:saved_by_line]


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
