"""What every Gluon kernel asks of its inputs, in the order the reasons are reported: a Hopper GPU,
the Triton its Gluon API was written against (3.6, the GPU's; the API changes between releases),
16-bit inputs of one dtype, its head dims, contiguous memory. Each launcher adds its shape rules."""

from __future__ import annotations

import torch
from torch import Tensor

from ...device_facts import capability

GLUON_TRITON = "3.6"


def input_problem(tensors: tuple[Tensor, ...], head_dims: tuple[int, ...]) -> str | None:
    """Why a Gluon kernel written for `head_dims` cannot take these inputs (the first is q), or None."""
    import triton

    q = tensors[0]
    if not (q.is_cuda and capability(q.device)[0] == 9):
        return "needs a Hopper GPU (sm_90)"
    if not triton.__version__.startswith(GLUON_TRITON):
        return f"written against Triton {GLUON_TRITON}'s Gluon API (installed: {triton.__version__})"
    if q.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != q.dtype for t in tensors):
        return "needs bf16 or fp16 inputs of one dtype"
    if q.shape[-1] not in head_dims:
        return "written for head dim " + " or ".join(map(str, head_dims))
    if not all(t.is_contiguous() for t in tensors):
        return "needs contiguous inputs"
    return None
