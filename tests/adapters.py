"""The course's test adapters (CS336 assignment 2, both the 2025 and the 2026 names), pointing at
this project's classes.

Anyone holding the course's tests can drop them next to this file and run them unchanged. This file
imports only torch and cs336_systems; each body is one line so the mapping reads at a glance.
"""

from __future__ import annotations

from typing import Type

import torch


def get_flashattention_autograd_function_pytorch() -> Type:
    """The tiled pure-PyTorch FlashAttention-2 autograd.Function (the class itself)."""
    from cs336_systems.attention.flash_pytorch import FlashAttentionPyTorch

    return FlashAttentionPyTorch


def get_flashattention_autograd_function_triton() -> Type:
    """The Triton FlashAttention-2 autograd.Function (the class itself), with the measured tiles."""
    from cs336_systems.attention.fast import FlashAttentionFast

    return FlashAttentionFast


def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    """DDP that all-reduces each gradient asynchronously as soon as it is accumulated."""
    from cs336_systems.distributed.ddp.overlap import DDPOverlapIndividual

    return DDPOverlapIndividual(module)


def ddp_individual_parameters_on_after_backward(ddp_model: torch.nn.Module,
                                                optimizer: torch.optim.Optimizer) -> None:
    """After backward, before optimizer.step(): wait for the outstanding all-reduces."""
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float | None) -> torch.nn.Module:
    """Bucketed, overlapped DDP; bucket_size_mb=None means one unbounded bucket."""
    from cs336_systems.distributed.ddp.bucketed import DDPBucketed

    return DDPBucketed(module, bucket_size_mb=bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: torch.nn.Module,
                                   optimizer: torch.optim.Optimizer) -> None:
    """After backward, before optimizer.step(): wait for every bucket and copy grads back."""
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: torch.nn.Module,
                                      optimizer: torch.optim.Optimizer) -> None:
    """At the start of a step: nothing to do, the container resets its bucket state itself."""
    ddp_model.on_train_batch_start()


def get_sharded_optimizer(params, optimizer_cls: Type[torch.optim.Optimizer],
                          **kwargs) -> torch.optim.Optimizer:
    """Optimizer-state sharding (ZeRO-1 style, as the course specifies): wraps any optimizer."""
    from cs336_systems.sharding.sharded_optimizer import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)


# -- the 2026 edition's names -------------------------------------------------------------------

def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    """2026's name for the per-parameter overlapped DDP (2025: get_ddp_individual_parameters)."""
    from cs336_systems.distributed.ddp.overlap import DDPOverlapIndividual

    return DDPOverlapIndividual(module)


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """After backward, before optimizer.step(): wait for the outstanding all-reduces."""
    ddp_model.finish_gradient_synchronization()


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Fully-sharded data parallel: Linear/Embedding weights sharded, the rest replicated."""
    from cs336_systems.distributed.fsdp import FSDP

    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """After backward, before optimizer.step(): every shard's .grad is its averaged piece."""
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a collective: call on all ranks), keyed like named_parameters()."""
    from cs336_systems.distributed.fsdp import gather_full_params

    return gather_full_params(fsdp_model)


def get_flash_autograd_function_triton() -> Type:
    """The name the 2026 handout's text gives the Triton FlashAttention-2 adapter (same class)."""
    from cs336_systems.attention.fast import FlashAttentionFast

    return FlashAttentionFast
