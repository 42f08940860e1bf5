"""One training-loop step of the LM in three flavours, with optional ranges around each phase.

The benchmark CLI, the sweeps, the profiler and the memory snapshots all time the same step built
here, so every chapter measures the same thing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ContextManager

import torch

from cs336_systems.bench.timing import synchronize
from cs336_systems.model import AdamW, TransformerLM, cross_entropy
from cs336_systems.model.config import ModelConfig

from .nvtx import RangeFactory, range_factory

MODES = ("forward", "forward-backward", "train")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODE_SHORT = {"forward": "fwd", "forward-backward": "fwd+bwd", "train": "fwd+bwd+opt"}


# --8<-- [start:autocast]
def autocast_context(dtype: str, device: torch.device | str) -> Callable[[], ContextManager]:
    """A factory of the context each forward runs in: autocast for bf16, a no-op for fp32.

    contextlib.nullcontext keeps one code path: the timed loop never branches on precision.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "fp32":
        return contextlib.nullcontext
    device_type = torch.device(device).type
    return lambda: torch.autocast(device_type=device_type, dtype=DTYPES[dtype])
# --8<-- [end:autocast]


def bf16_supported(device: torch.device | str) -> bool:
    """Can this device run bf16 autocast? CUDA asks the driver; a CPU is asked by trying a matmul."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            out = torch.nn.functional.linear(torch.ones(2, 2, device=dev), torch.ones(2, 2, device=dev))
        return out.dtype == torch.bfloat16
    except (RuntimeError, TypeError):
        return False


def build_model(cfg: ModelConfig, device: torch.device | str, seed: int = 0) -> TransformerLM:
    """Random-initialised LM straight on the device (no CPU copy of a 2.7B model)."""
    torch.manual_seed(seed)
    return TransformerLM.from_config(cfg, device=device)


def random_batch(cfg: ModelConfig, batch_size: int, context: int, device, seed: int = 0):
    """Random token ids and next-token targets, (batch, context) each."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (batch_size, context), generator=g)
    y = torch.randint(0, cfg.vocab_size, (batch_size, context), generator=g)
    return x.to(device), y.to(device)


def phase_ranges(rng: RangeFactory | None = None, *, sync: torch.device | str | None = None,
                 marker: Callable[[str], None] | None = None) -> RangeFactory:
    """Ranges for forward/backward/optimizer: `rng` (NVTX or record_function), an optional memory
    marker at the start of each phase, and an optional synchronize at its end (so a profiler's range
    spans the phase's GPU work, not just its launches)."""
    rng = rng or range_factory(None)

    @contextlib.contextmanager
    def phase(name: str):
        if marker is not None:
            marker(name)
        with rng(name):
            yield
            if sync is not None:
                synchronize(sync)

    return phase


# --8<-- [start:make_step]
def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, mode: str, dtype: str,
              optimizer: torch.optim.Optimizer | None = None,
              phase: RangeFactory | None = None) -> Callable[[], None]:
    """The step the benchmark times. forward: inference (no graph kept); forward-backward: loss and
    gradients; train: zero_grad, forward, backward, optimizer step. Each step builds a fresh graph."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "train" and optimizer is None:
        raise ValueError("mode 'train' needs an optimizer")
    autocast = autocast_context(dtype, x.device)
    phase = phase or range_factory(None)
    vocab = model.config.vocab_size if hasattr(model, "config") else None

    def forward_loss() -> torch.Tensor:
        with autocast():
            logits = model(x)  # (batch, seq, vocab)
            return cross_entropy(logits.view(-1, vocab or logits.shape[-1]), y.view(-1))

    def step() -> None:
        if mode == "forward":
            with torch.no_grad(), phase("forward"), autocast():
                model(x)
            return
        (optimizer if optimizer is not None else model).zero_grad(set_to_none=True)
        with phase("forward"):
            loss = forward_loss()
        with phase("backward"):
            loss.backward()
        if mode == "train":
            with phase("optimizer"):
                optimizer.step()

    return step
# --8<-- [end:make_step]


def make_optimizer(model: torch.nn.Module, mode: str) -> AdamW | None:
    return AdamW(model.parameters(), lr=1e-4, weight_decay=0.01) if mode == "train" else None
