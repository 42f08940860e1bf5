"""The one shared module of hypothesis strategies. Append new strategies; keep each documented."""

from __future__ import annotations

from hypothesis import strategies as st

# -- attention / online softmax ---------------------------------------------------------------

def score_rows(max_len: int = 40, bound: float = 1e30) -> st.SearchStrategy[list[float]]:
    """A row of attention scores: finite floats, some tiny, some huge (up to +-bound)."""
    return st.lists(st.floats(min_value=-bound, max_value=bound, allow_nan=False), min_size=1, max_size=max_len)


@st.composite
def chunk_sizes(draw, n: int) -> list[int]:
    """A split of n items into consecutive chunks of positive sizes (any number of chunks)."""
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=n - 1), max_size=n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


@st.composite
def rows_with_masked_chunks(draw, max_len: int = 40) -> tuple[list[float], list[int]]:
    """(row, chunk sizes) where whole chunks are -inf (fully masked tiles), at least one kept."""
    row = draw(score_rows(max_len, bound=1e4))
    sizes = draw(chunk_sizes(len(row)))
    masked = draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    if all(masked):
        masked[draw(st.integers(min_value=0, max_value=len(sizes) - 1))] = False
    out, start = [], 0
    for size, m in zip(sizes, masked):
        out += [float("-inf")] * size if m else row[start:start + size]
        start += size
    return out, sizes


@st.composite
def attention_problems(draw, max_seq: int = 48, head_dims: tuple[int, ...] = (16, 24, 32)) -> dict:
    """A small attention problem: batch, optional heads, ragged n_queries / n_keys, head dim, causal."""
    return {
        "batch": draw(st.integers(min_value=1, max_value=2)),
        "heads": draw(st.sampled_from([None, 1, 3])),
        "n_queries": draw(st.integers(min_value=1, max_value=max_seq)),
        "n_keys": draw(st.integers(min_value=1, max_value=max_seq)),
        "head_dim": draw(st.sampled_from(head_dims)),
        "is_causal": draw(st.booleans()),
    }


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


# -- FSDP (flat shards of one weight) ----------------------------------------------------------

def weight_shapes(max_dim: int = 40) -> st.SearchStrategy[tuple[int, int]]:
    """A Linear/Embedding weight shape (rows, cols): empty, 1-wide, prime and even sizes mixed,
    so numel is often not divisible by the world size."""
    return st.tuples(st.integers(min_value=0, max_value=max_dim),
                     st.integers(min_value=0, max_value=max_dim))


# -- fused LM head + cross-entropy (chunked over positions) ------------------------------------

@st.composite
def fused_ce_problems(draw, max_positions: int = 40, max_vocab: int = 160, max_d: int = 16) -> dict:
    """A small LM-head cross-entropy problem and two ways to chunk its positions: n positions,
    vocab V and d_model d (1 upward: a one-column vocabulary, a one-feature model), two chunk
    sizes from 1 (a chunk per position) to n + 2 (one chunk, larger than the batch), how many
    positions are ignored (0 to n - 1: never all), and a seed for the data."""
    n = draw(st.integers(min_value=1, max_value=max_positions))
    chunk = st.integers(min_value=1, max_value=n + 2)
    return {
        "n": n,
        "vocab": draw(st.integers(min_value=1, max_value=max_vocab)),
        "d": draw(st.integers(min_value=1, max_value=max_d)),
        "chunks": (draw(chunk), draw(chunk)),
        "n_ignored": draw(st.integers(min_value=0, max_value=n - 1)),
        "seed": draw(st.integers(min_value=0, max_value=2**16)),
    }
