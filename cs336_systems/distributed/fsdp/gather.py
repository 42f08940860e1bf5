"""The full parameters of an FSDP model, gathered back into one state dict (a collective: call it
on every rank).

Keyed exactly like the wrapped module's own named_parameters() (no `module.` prefix, a tied weight
once under its first name), so it compares directly with the unsharded model's parameters. Sharded
weights are all-gathered in their master dtype (fp32: exact) and come back in their original
shape, padding cut off; replicated parameters are copied as they are.
"""

from __future__ import annotations

import torch

from .comm import Gather
from .fsdp import FSDP


# --8<-- [start:gather_full_params]
def gather_full_params(model: FSDP) -> dict[str, torch.Tensor]:
    sharded = {id(w.shard): w for w in model.weights}
    full: dict[str, torch.Tensor] = {}
    for name, p in model.module.named_parameters():
        weight = sharded.get(id(p))
        if weight is None:
            full[name] = p.detach().clone()
        else:
            gathered = Gather.start(p, weight.layout, p.dtype, name).full(weight.shape)
            full[name] = gathered.clone()  # compact: drops the (N*S,) buffer and its padding
    return full
# --8<-- [end:gather_full_params]
