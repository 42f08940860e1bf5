"""Properties of the bucket assignment (cs336_systems/distributed/ddp/buckets.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from cs336_systems.distributed.ddp.buckets import MB, assign_buckets, bucket_cap_bytes
from tests.strategies import bucket_caps, parameter_byte_sizes


def _bytes(bucket: list[int], sizes: list[int]) -> int:
    return sum(sizes[i] for i in bucket)


@settings(max_examples=300, deadline=None)
@given(sizes=parameter_byte_sizes(), cap=bucket_caps())
def test_every_parameter_in_exactly_one_bucket_in_reverse_order(sizes, cap):
    buckets = assign_buckets(sizes, cap)
    flat = [i for bucket in buckets for i in bucket]
    # Reading the buckets in order walks the parameters backwards: a partition, and reverse order.
    assert flat == list(reversed(range(len(sizes))))
    assert all(buckets), "no empty bucket"


@settings(max_examples=300, deadline=None)
@given(sizes=parameter_byte_sizes(), cap=bucket_caps())
def test_no_bucket_over_the_cap_unless_it_holds_one_larger_parameter(sizes, cap):
    for bucket in assign_buckets(sizes, cap):
        if cap is not None and _bytes(bucket, sizes) > cap:
            assert len(bucket) == 1 and sizes[bucket[0]] > cap


@settings(max_examples=300, deadline=None)
@given(sizes=parameter_byte_sizes(), cap=bucket_caps())
def test_buckets_are_full_greedy(sizes, cap):
    """A bucket is closed only because the next parameter would not fit: no needless calls."""
    buckets = assign_buckets(sizes, cap)
    if cap is None:
        assert len(buckets) <= 1
    for this, following in zip(buckets, buckets[1:]):
        assert _bytes(this, sizes) + sizes[following[0]] > cap


@settings(max_examples=100, deadline=None)
@given(sizes=parameter_byte_sizes(), cap=bucket_caps())
def test_deterministic_and_pure(sizes, cap):
    """Every rank computes the same buckets from the same sizes; the input is not touched."""
    before = list(sizes)
    assert assign_buckets(sizes, cap) == assign_buckets(tuple(sizes), cap)
    assert sizes == before


def test_toy_model_caps():
    """The course's toy-model regimes: 0.0001 MB is below every tensor (one per bucket)."""
    sizes = [400, 2000, 1000]  # ToyModel's trainable fp32 tensors: fc1 (10x10), fc2 (50x10), fc3 (5x50)
    assert assign_buckets(sizes, bucket_cap_bytes(0.0001)) == [[2], [1], [0]]
    assert assign_buckets(sizes, bucket_cap_bytes(0.0016)) == [[2], [1], [0]]  # 1677 bytes
    assert assign_buckets(sizes, 2400) == [[2], [1, 0]]
    assert assign_buckets(sizes, bucket_cap_bytes(0.01)) == [[2, 1, 0]]
    assert assign_buckets(sizes, None) == [[2, 1, 0]]
    assert assign_buckets([], None) == [] and assign_buckets([], 10) == []


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_bucket_size_is_named(bad):
    with pytest.raises(ValueError, match="bucket_size_mb"):
        bucket_cap_bytes(bad)


def test_cap_in_mib():
    assert bucket_cap_bytes(1) == MB and bucket_cap_bytes(None) is None
    assert bucket_cap_bytes(1e-9) == 1  # rounds up to one byte, never to zero
