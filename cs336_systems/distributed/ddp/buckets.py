"""Which gradients share an all-reduce: the bucket assignment, a pure function of sizes and a cap.

Backward produces gradients roughly in reverse parameter order (the last layer's first), so buckets
are filled walking the parameters backwards: bucket 0 holds the last parameters and is the first to
be complete. A bucket is closed when the next parameter would push it over the cap; a parameter
larger than the cap therefore sits alone in its own bucket (it is never dropped or split).
"""

from __future__ import annotations

from collections.abc import Sequence

MB = 1024 * 1024  # bucket sizes are in MiB, like torch DDP's bucket_cap_mb


def bucket_cap_bytes(bucket_size_mb: float | None) -> int | None:
    """The cap in bytes (at least 1); None means one unbounded bucket."""
    if bucket_size_mb is None:
        return None
    if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, (int, float)) \
            or not bucket_size_mb > 0 or bucket_size_mb == float("inf"):
        raise ValueError(f"bucket_size_mb must be a positive finite number of MB or None, "
                         f"got {bucket_size_mb!r}")
    return max(1, int(bucket_size_mb * MB))


# --8<-- [start:assign_buckets]
def assign_buckets(sizes: Sequence[int], cap: int | None) -> list[list[int]]:
    """Group parameter indices 0..n-1 (forward order, `sizes` in bytes) into buckets.

    Returns buckets in the order their gradients complete: bucket 0 holds the last parameters.
    Reading the buckets in order gives n-1, n-2, ..., 0. `cap=None`: one bucket with everything.
    """
    if cap is not None and cap < 1:
        raise ValueError(f"cap must be a positive number of bytes or None, got {cap}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be non-negative byte counts, got {list(sizes)}")
    buckets: list[list[int]] = []
    filled = 0  # bytes in the open bucket
    for i in reversed(range(len(sizes))):
        if not buckets or (cap is not None and filled + sizes[i] > cap):
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += sizes[i]
    return buckets
# --8<-- [end:assign_buckets]
