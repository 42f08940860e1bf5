"""The distributed chapters' analytic numbers for one preset, at the course's standard configuration
(1 node, 2 GPUs, 2 sequences of 512 tokens per rank: the DDP chapter's global batch of 4): what the
DDP, optimizer_state_sharding_accounting (a) and fsdp_accounting (a) answers compute by arithmetic,
no GPU needed. Every number comes from accounting.py's formulas and the model built on the meta device.

    XL_2026 = Setting("2.7B", edition="2026")   # the 2026 handout's xl: d_model 2560, 32 layers
    XL_2025 = Setting("xl", edition="2025")     # the 2025 handout's xl: d_model 1600, 48 layers
    summary(XL_2026)                            # a flat dict of named numbers for a page's facts

The two editions' "xl" are different models: a 2026 answer that says "xl" means our 2.7B preset.
fp32 throughout (the benchmarks' precision): 4-byte weights, gradients and communication, 8 bytes
of AdamW moments per parameter; the activations are those the forward saves (fp32, naive attention).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.model.config import ModelConfig, handout_name

from . import accounting as acc

FP32 = 4
POINTS = ("after_init", "before_step", "after_step")
STAGES = ("ddp", "sharded", "zero3")  # DDP + AdamW; + the course's ShardedOptimizer; FSDP's memory


@dataclass(frozen=True)
class Setting:
    """A preset at a world size and per-rank batch; `edition` says whose size table names it."""

    size: str = "2.7B"
    edition: str = "2026"
    world_size: int = 2
    batch_per_rank: int = 2
    context: int = 512

    def __post_init__(self) -> None:
        handout_name(self.size, self.edition)  # ValueError if that edition's table lacks the preset
        for name in ("world_size", "batch_per_rank", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def cfg(self) -> ModelConfig:
        return get_config(self.size, self.context)

    @property
    def name(self) -> str:
        """What the edition's handout calls the model: "xl" for both XL settings."""
        return handout_name(self.size, self.edition)

    @property
    def n_params(self) -> int:
        return count_parameters(self.cfg)["total"]


XL_2026 = Setting("2.7B", edition="2026")
XL_2025 = Setting("xl", edition="2025")


@functools.cache
def parameter_tensors(size: str) -> tuple[tuple[str, int], ...]:
    """(name, elements) of every parameter of the preset, in registration order (meta device)."""
    model = TransformerLM.from_config(get_config(size), device="meta")
    return tuple((n, p.numel()) for n, p in model.named_parameters())


# --8<-- [start:ddp]
def ddp_numbers(s: Setting, bus_bytes_per_s: float | None = None) -> dict[str, float]:
    """The gradients DDP communicates per step: how many tensors (naive DDP's all-reduce calls), how
    many bytes, the norm gains among them, and what a ring all-reduce moves per rank, 2 (N-1)/N
    of the gradient bytes; with a bus bandwidth (NCCL's busbw convention: bytes x 2 (N-1)/N per
    second), the time of one all-reduce of all of them, bandwidth term only."""
    tensors = parameter_tensors(s.size)
    grad_bytes = FP32 * sum(n for _, n in tensors)
    norms = [n for name, n in tensors if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight"))]
    ring = acc.communication_bytes_per_rank("ddp", s.n_params, s.world_size)
    out = {"params": s.n_params, "tensors": len(tensors), "norm_tensors": len(norms),
           "norm_bytes": FP32 * sum(norms), "grad_bytes": grad_bytes,
           "mean_tensor_bytes": grad_bytes / len(tensors),
           "largest_tensor_bytes": FP32 * max(n for _, n in tensors),
           "allreduce_bytes_per_rank": ring, "tokens_per_rank": s.batch_per_rank * s.context}
    if bus_bytes_per_s is not None:
        out["allreduce_s"] = ring / bus_bytes_per_s
    return out
# --8<-- [end:ddp]


# --8<-- [start:points]
def memory_at_points(s: Setting, stage: str = "ddp") -> dict[str, dict[str, float]]:
    """Bytes per rank by kind at the three points optimizer_state_sharding_accounting (a) asks, as
    sharding_bench's MemoryProbe records them: after building model and optimizer (AdamW creates its
    moments at its first step: none yet), before the optimizer step (gradients in; the activations
    the forward saved, freed again by the backward, listed beside them), after the step (moments in,
    1/N of them under the sharded optimizer)."""
    if stage not in ("ddp", "sharded"):
        raise ValueError(f"stage must be 'ddp' or 'sharded' (the problem's two runs), got {stage!r}")
    m = acc.transformer_memory(s.cfg, s.batch_per_rank, s.world_size, stage, context=s.context)
    rows = {"after_init": {"params": m.params, "grads": 0.0, "optimizer_state": 0.0, "activations": 0.0},
            "before_step": {"params": m.params, "grads": m.grads, "optimizer_state": 0.0,
                            "activations": m.activations},
            "after_step": {"params": m.params, "grads": m.grads, "optimizer_state": m.optimizer_state,
                           "activations": 0.0}}
    for row in rows.values():
        row["total"] = sum(row.values())
    return rows
# --8<-- [end:points]


# --8<-- [start:fsdp]
def fsdp_saving(s: Setting) -> dict[str, float]:
    """fsdp_accounting (a): the peak per rank with DDP + the sharded optimizer (Section 6) against
    FSDP, which shards the weights and gradients too, gathered buffers ignored (as the problem says).
    Both peaks are state plus the forward's activations; the saving is (1 - 1/N)(weights + gradients)."""
    sharded = acc.transformer_memory(s.cfg, s.batch_per_rank, s.world_size, "sharded", context=s.context)
    fsdp = acc.transformer_memory(s.cfg, s.batch_per_rank, s.world_size, "zero3", context=s.context)
    ddp = acc.transformer_memory(s.cfg, s.batch_per_rank, s.world_size, "ddp", context=s.context)
    return {"ddp_peak": ddp.total, "sharded_peak": sharded.total, "fsdp_peak": fsdp.total,
            "saved_vs_sharded": sharded.total - fsdp.total, "saved_vs_ddp": ddp.total - fsdp.total,
            "saved_share_vs_sharded": (sharded.total - fsdp.total) / sharded.total,
            "activations": fsdp.activations}
# --8<-- [end:fsdp]


def communication(s: Setting) -> dict[str, float]:
    """Bytes each rank receives per step: DDP's all-reduce, the course's sharded optimizer
    (all-reduce + broadcasts), ZeRO-1 (reduce-scatter + all-gather), FSDP in fp32 and with bf16
    weights and gradients on the wire (all-gather twice, reduce-scatter once)."""
    n, N = s.n_params, s.world_size
    return {"ddp": acc.communication_bytes_per_rank("ddp", n, N),
            "sharded": acc.communication_bytes_per_rank("sharded", n, N),
            "zero1": acc.communication_bytes_per_rank("zero1", n, N),
            "fsdp_fp32": acc.communication_bytes_per_rank("zero3", n, N),
            "fsdp_bf16": acc.communication_bytes_per_rank("zero3", n, N, grad_bytes=2, param_bytes=2)}


def summary(s: Setting = XL_2026) -> dict[str, float | str]:
    """Every number above, flat and named (`ddp.*`, `points.<stage>.<point>.<kind>`, `fsdp.*`,
    `comm.*`), with the setting itself, for a page's facts."""
    cfg = s.cfg
    out: dict[str, float | str] = {
        "preset": s.size, "edition": s.edition, "handout_name": s.name, "d_model": cfg.d_model,
        "num_layers": cfg.num_layers, "world_size": s.world_size, "batch_per_rank": s.batch_per_rank,
        "context": s.context}
    out.update({f"ddp.{k}": v for k, v in ddp_numbers(s).items()})
    for stage in ("ddp", "sharded"):
        for point, kinds in memory_at_points(s, stage).items():
            out.update({f"points.{stage}.{point}.{k}": v for k, v in kinds.items()})
    out.update({f"fsdp.{k}": v for k, v in fsdp_saving(s).items()})
    out.update({f"comm.{k}": v for k, v in communication(s).items()})
    return out
