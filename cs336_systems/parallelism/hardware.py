"""The hardware numbers the parallelism arithmetic takes: C (FLOP/s) and W (egress bytes/s).

These are vendor datasheet figures, not measurements of ours (results/ holds those): dense
(no-sparsity) bf16 tensor-core throughput, and NVLink bandwidth per direction (the datasheets quote
the two directions added up, so W is half the quoted figure). The handout's model gives each device
W of egress to any other device, which within one NVLink-switched node is what a GPU has.
"""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.bench.device import PEAK_FLOPS


@dataclass(frozen=True)
class Device:
    """One accelerator as the handout models it."""

    name: str
    flops: float              # C: dense bf16 FLOP/s
    egress_bandwidth: float   # W: bytes/s one device can send
    memory_bytes: float
    source: str

    def __post_init__(self) -> None:
        for field in ("flops", "egress_bandwidth", "memory_bytes"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)!r}")

    @property
    def alpha(self) -> float:
        """C / W: FLOPs a device can do in the time it sends one byte (the arithmetic intensity a
        collective's bytes must be hidden behind)."""
        return self.flops / self.egress_bandwidth


# --8<-- [start:devices]
H200_NVLINK = Device("H200 SXM, NVLink 4", flops=PEAK_FLOPS["H200"]["bf16"], egress_bandwidth=450e9,
                     memory_bytes=141e9,
                     source="NVIDIA H200 datasheet: 1,979 TFLOP/s bf16 with sparsity (989 dense), "
                            "NVLink 900 GB/s (both directions), 141 GB HBM3e")
# Across nodes: one 400 Gb/s NDR InfiniBand adapter per GPU, as in an HGX H200 cluster.
H200_INFINIBAND = Device("H200 SXM, 400 Gb/s InfiniBand per GPU", flops=PEAK_FLOPS["H200"]["bf16"],
                         egress_bandwidth=50e9, memory_bytes=141e9,
                         source="H200 datasheet (C); NDR InfiniBand 400 Gb/s = 50 GB/s per direction")
B200_NVLINK = Device("B200, NVLink 5", flops=2.25e15, egress_bandwidth=900e9, memory_bytes=180e9,
                     source="NVIDIA HGX B200 datasheet: 4.5 PFLOP/s bf16 with sparsity per GPU "
                            "(2.25 dense), NVLink 1.8 TB/s (both directions), 180 GB")
# --8<-- [end:devices]

DEVICES = {d.name: d for d in (H200_NVLINK, H200_INFINIBAND, B200_NVLINK)}
