"""The one shared module of hypothesis strategies. Append new strategies; keep each documented."""

from __future__ import annotations

from hypothesis import strategies as st

# -- attention / online softmax ---------------------------------------------------------------

# -- distributed / bucketing ------------------------------------------------------------------

def parameter_byte_sizes(max_bytes: int = 4096, max_len: int = 30) -> st.SearchStrategy[list[int]]:
    """Byte sizes of a model's trainable parameters in forward order (0 = an empty tensor)."""
    return st.lists(st.integers(min_value=0, max_value=max_bytes), max_size=max_len)


def bucket_caps(max_bytes: int = 8192) -> st.SearchStrategy[int | None]:
    """A bucket cap in bytes (often smaller than some parameters), or None for one bucket."""
    return st.none() | st.integers(min_value=1, max_value=max_bytes)


# -- sharding (optimizer-state assignment, flat-buffer layout) ---------------------------------

def tensor_sizes(max_size: int = 10_000, max_len: int = 40) -> st.SearchStrategy[list[int]]:
    """Element counts of a list of parameters: zeros (empty tensors), small and large mixed."""
    return st.lists(st.integers(min_value=0, max_value=max_size), max_size=max_len)


def world_sizes(max_world: int = 9) -> st.SearchStrategy[int]:
    """Numbers of ranks, 1 (no sharding) upward."""
    return st.integers(min_value=1, max_value=max_world)
