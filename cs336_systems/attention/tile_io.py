"""Tile loads and stores shared by the forward and backward kernels.

Kernel modules import these @triton.jit helpers; Triton inlines them into each kernel, so sharing
the source changes nothing in the compiled code.

Two ways to load a tile: pointer arithmetic (`load_rows`: every thread computes the addresses of
its elements, masked where a tile can run past the tensor), or Hopper's tensor memory accelerator
(`load_tile` with TMA: one descriptor of the whole (Z, H, N, d) tensor, the copy engine fetches the
box and zero-fills rows past the end, and no thread spends registers on addresses).
"""

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def load_rows(base, offs_row, offs_d, stride_row, stride_d, n_rows,
              ROW_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """A (rows, HEAD_DIM_PAD) tile; masked only where it can run past the tensor."""
    ptrs = base + offs_row[:, None] * stride_row + offs_d[None, :] * stride_d
    if ROW_MASK:
        mask = offs_row[:, None] < n_rows
        if HEAD_DIM != HEAD_DIM_PAD:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        return tl.load(ptrs, mask=mask, other=0.0)
    elif HEAD_DIM != HEAD_DIM_PAD:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def head_base(T, z, h, stride_z, stride_h, TMA: tl.constexpr):
    """What a tile load of (batch z, head h) starts from: with TMA the descriptor of the whole tensor
    (the load names z and h), else the pointer to that head's row 0."""
    if TMA:
        return T
    else:
        return T + z * stride_z + h * stride_h


# --8<-- [start:load_tile]
@triton.jit
def load_tile(src, z, h, start, offs_row, offs_d, stride_row, stride_d, n_rows, ROW_MASK: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + BLOCK) of (batch z, head h): a (BLOCK, HEAD_DIM_PAD) tile. With TMA, `src`
    is a descriptor of the 4-D tensor with box (1, 1, BLOCK, HEAD_DIM_PAD); otherwise it points at
    row 0 of this (batch, head) and `offs_row` = start + arange(BLOCK)."""
    if TMA:
        return src.load([z, h, start, 0]).reshape(BLOCK, HEAD_DIM_PAD)
    else:
        return load_rows(src, offs_row, offs_d, stride_row, stride_d, n_rows, ROW_MASK, HEAD_DIM, HEAD_DIM_PAD)
# --8<-- [end:load_tile]


@triton.jit
def store_rows(base, tile, offs_row, offs_d, stride_row, stride_d, n_rows, HEAD_DIM: tl.constexpr):
    ptrs = base + offs_row[:, None] * stride_row + offs_d[None, :] * stride_d
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=(offs_row[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))
