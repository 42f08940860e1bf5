"""Triton kernels of the weighted-sum example: y = (x * w).sum(-1) for x (rows, D), w (D,).

Loaded through `triton_loader.kernels(__name__)`, like the FlashAttention kernels.
"""

import triton
import triton.language as tl


# --8<-- [start:fwd]
@triton.jit
def weighted_sum_fwd(x_ptr, w_ptr, y_ptr, x_stride_row, x_stride_dim, w_stride_dim, n_rows, D,
                     ROWS_TILE: tl.constexpr, D_TILE: tl.constexpr):
    """One program sums ROWS_TILE rows, walking the feature dim D_TILE columns at a time."""
    rows = tl.program_id(0) * ROWS_TILE + tl.arange(0, ROWS_TILE)
    row_ok = rows < n_rows
    acc = tl.zeros([ROWS_TILE], dtype=tl.float32)
    for d0 in range(0, D, D_TILE):
        cols = d0 + tl.arange(0, D_TILE)
        col_ok = cols < D
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_stride_row + cols[None, :] * x_stride_dim,
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols * w_stride_dim, mask=col_ok, other=0.0)
        acc += tl.sum(x.to(tl.float32) * w.to(tl.float32)[None, :], axis=1)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)
# --8<-- [end:fwd]


# --8<-- [start:bwd]
@triton.jit
def weighted_sum_bwd(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_partial_ptr, x_stride_row, x_stride_dim,
                     w_stride_dim, dy_stride_row, n_rows, D,
                     ROWS_TILE: tl.constexpr, D_TILE: tl.constexpr):
    """dx = dy w^T (an outer product, written directly) and this tile's share of dw.

    dw = sum over *all* rows of dy_r x_r, but a program only sees its tile of rows and programs
    have no order. Instead of atomics each program writes its partial sum as one row of
    dw_partial (n_row_tiles, D); the host sums that buffer afterwards.
    """
    tile = tl.program_id(0)
    rows = tile * ROWS_TILE + tl.arange(0, ROWS_TILE)
    row_ok = rows < n_rows
    dy = tl.load(dy_ptr + rows * dy_stride_row, mask=row_ok, other=0.0).to(tl.float32)
    for d0 in range(0, D, D_TILE):
        cols = d0 + tl.arange(0, D_TILE)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_ptr + cols * w_stride_dim, mask=col_ok, other=0.0).to(tl.float32)
        dx = dy[:, None] * w[None, :]
        tl.store(dx_ptr + rows[:, None].to(tl.int64) * D + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_stride_row + cols[None, :] * x_stride_dim,
                    mask=mask, other=0.0).to(tl.float32)
        tl.store(dw_partial_ptr + tile.to(tl.int64) * D + cols, tl.sum(x * dy[:, None], axis=0), mask=col_ok)
# --8<-- [end:bwd]
