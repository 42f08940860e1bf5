"""Peak throughput of known devices, for MFU and roofline columns."""

from __future__ import annotations

# Dense peak FLOP/s by device-name substring, from the vendors' datasheets (SXM parts).
# fp32 means plain CUDA-core fp32 (PyTorch's default: TF32 off for matmuls).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "tf32": 494e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "tf32": 494e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12, "tf32": 156e12},
}


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Datasheet peak for `device_name` in `dtype` ('bf16', 'fp16', 'fp32'); None if unknown."""
    for key, table in PEAK_FLOPS.items():
        if key.lower() in device_name.lower():
            return table.get(dtype)
    return None
