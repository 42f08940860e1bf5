"""FusedAdamW: torch.optim.AdamW's update, one Triton kernel pass per parameter tensor.

An AdamW step is memory-bound: per element it reads p, g, m, v and writes p, m, v (14 bytes in
bf16, 28 in fp32) for about a dozen flops. Written as separate tensor ops (torch's for-loop
AdamW) it makes eight passes over memory; fused, it makes one. This module is that one pass:

    p <- p (1 - lr wd)                      decoupled weight decay, first
    m <- beta1 m + (1 - beta1) g
    v <- beta2 v + (1 - beta2) g^2
    p <- p - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

the form torch's fused AdamW evaluates (its `_single_tensor_adamw` writes the m update as a lerp and
the last line as an addcdiv: the same values up to rounding). State per parameter, as in torch:
`step` (a Python int here: the bias corrections are computed on the host, so the count must be
readable there without a device sync; loading a torch state dict turns its tensor step into one),
`exp_avg` and `exp_avg_sq` in the parameter's dtype (bf16 moments for bf16 parameters, as torch's
fused AdamW keeps them). The kernel widens every load to float32, computes in float32, and rounds
once per tensor at the store.

Launches: one per parameter tensor, the grid cached per tensor size. The alternative, one launch per
param group over a table of pointers (torch's multi_tensor_apply), saves host time but (1) the
gradients' addresses change every step (a new .grad each backward), so the table is rebuilt and
copied to the GPU every step, and (2) a pointer loaded from memory carries no alignment the
compiler can see, so the 16-byte vector loads need alignment promises that the host must check.
For the 8B model the per-tensor launches do not limit the step: 309 tensors, 7 of every 9 of them
8M+ elements at --shard 2, so the GPU spends tens of microseconds or more per launch while the host
needs ~18 us to queue one. Measured once on an H200 (`just bench fused-adamw`, 8B bf16 --shard 2,
a scratch run): ours 14.6 ms per step (3.9 TB/s effective), host 5.7 ms; torch fused 20.8 ms;
torch foreach 52.3 ms. Where tensors are small the same design is host-bound: the 'small' preset
(111 tensors, 1.2M elements each on average) took 2.9 ms, all of it the host's ~26 us per launch,
against torch fused's 0.7 ms; that regime is what a pointer table would fix. Host work per step is
a dict lookup, the launch, and the bias corrections once per group and step count (normally one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from cs336_systems.attention.triton_loader import interpreting, kernels

KERNELS = "cs336_systems.training_step.fused_adamw_kernel"
# Elements per program: 1024 x bf16 = 2 KiB of each of the four tensors; with 4 warps each thread
# moves 8 contiguous elements, a 16-byte vector in bf16.
BLOCK = 1024
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_hyperparameters(group: dict[str, Any]) -> None:
    """The checks of torch.optim.AdamW's constructor, naming the argument; run for every group."""
    def real(x: object) -> bool:
        return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)

    lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if not (real(lr) and lr >= 0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        if not (real(b) and 0 <= b < 1):
            raise ValueError(f"betas[{i}] must be a number in [0, 1), got {b!r}")
    if not (real(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if not (real(wd) and wd >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {wd!r}")


def _check_param(p: Tensor, i: int) -> None:
    """What the kernel needs of a parameter: dense, contiguous (it walks p as a flat (numel,)
    array), a dtype it computes in float32, and a device it can run on."""
    where = f"params[{i}] (shape {tuple(p.shape)}, {p.dtype}, {p.device})"
    if p.is_sparse or p.layout != torch.strided:
        raise ValueError(f"{where}: sparse parameters are not supported by FusedAdamW")
    if not p.is_contiguous():
        raise ValueError(f"{where} must be contiguous: the kernel walks it as one flat array")
    if p.dtype not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {', '.join(map(str, DTYPES))} "
                         "(the kernel computes in float32)")
    if p.device.type == "cuda":
        return
    if p.device.type != "cpu" or not interpreting():
        raise ValueError(f"{where}: the Triton kernel runs on a CUDA GPU; a CPU tensor runs it only "
                         "under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)")
    if p.dtype == torch.bfloat16:
        raise ValueError(f"{where}: the Triton interpreter has no bfloat16 (numpy keeps its raw bit "
                         "patterns): on the CPU use float32; run bfloat16 on a CUDA GPU")


def _check_grad(p: Tensor, g: Tensor) -> None:
    if g.is_sparse or g.layout != torch.strided:
        raise ValueError(f"p.grad of a parameter of shape {tuple(p.shape)} is sparse; "
                         "FusedAdamW does not support sparse gradients")
    if not g.is_contiguous():
        raise ValueError(f"p.grad of a parameter of shape {tuple(p.shape)} must be contiguous "
                         f"(strides {g.stride()}): the kernel walks it as one flat array")


class FusedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (amsgrad, maximize off) through one fused Triton kernel per parameter."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        _check_hyperparameters(defaults)
        self._kernel = None  # the @triton.jit function, imported at the first step
        self._grids: dict[int, tuple[int]] = {}  # numel -> launch grid (8B: a handful of sizes)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        _check_hyperparameters({**self.defaults, **param_group})
        for i, p in enumerate(params):
            if isinstance(p, Tensor):  # anything else: the base class says what is wrong
                _check_param(p, i)
        super().add_param_group({**param_group, "params": params})

    def __setstate__(self, state: dict[str, Any]) -> None:
        # load_state_dict ends here. A state dict of torch's AdamW holds `step` as a tensor (our int
        # comes back as an int); its moments may have been saved with any strides.
        super().__setstate__(state)
        self.__dict__.setdefault("_kernel", None)
        self.__dict__.setdefault("_grids", {})
        for s in self.state.values():
            if isinstance(s.get("step"), Tensor):
                s["step"] = int(s["step"].item())
            for key in ("exp_avg", "exp_avg_sq"):
                if isinstance(s.get(key), Tensor):
                    s[key] = s[key].contiguous()

    def _grid(self, n: int) -> tuple[int]:
        grid = self._grids.get(n)
        if grid is None:
            grid = self._grids[n] = (-(-n // BLOCK),)
        return grid

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._kernel is None:
            self._kernel = kernels(KERNELS).adamw_step
        kernel = self._kernel
        for group in self.param_groups:
            lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
            beta1, beta2 = map(float, group["betas"])  # floats: Triton compiles an int argument as int32
            decay = 1.0 - lr * wd
            # step count t -> (step_size, sqrt(1 - beta2^t)), host floats: one entry in the usual
            # case where every parameter of the group has had a gradient at every step
            corrections: dict[int, tuple[float, float]] = {}
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                _check_grad(p, g)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                t = state["step"] = state["step"] + 1
                c = corrections.get(t)
                if c is None:
                    c = corrections[t] = (lr / (1.0 - beta1**t), math.sqrt(1.0 - beta2**t))
                n = p.numel()
                kernel[self._grid(n)](
                    p, g, state["exp_avg"], state["exp_avg_sq"], n, decay,
                    beta1, 1.0 - beta1, beta2, 1.0 - beta2, c[0], c[1], eps, BLOCK=BLOCK)
        return loss
