"""The fused cross-entropy's row kernel (Triton): loss and d loss / d logits of one chunk of logits.

One program owns one row of a (chunk, V) logits buffer and walks it in tiles of BLOCK_V columns,
twice. The first walk carries the online-softmax statistics of the row in fp32, as FlashAttention
does over keys: the running max m and the running sum l = sum exp(z - m), rescaled by
exp(m_old - m_new) whenever the max grows, so no exp ever sees a positive argument (no overflow,
whatever the logits' magnitude). The row's loss is lse - z[target], lse = m + log(l). The second
walk (WRITE_GRAD) reads m and l and overwrites the logits in place with the gradient of the mean
loss, (softmax - onehot(target)) * grad_scale, grad_scale = 1 / n_valid: the buffer is dead after
this row's loss, so the gradient needs no memory of its own. A row whose target is ignore_index
writes a loss of 0 and a gradient row of zeros (it takes no part in the mean).

exp and log run in base 2 (exp2, log2: the hardware's instructions), with log2(e) folded into the
one multiply each element already pays; the loss goes back to natural log.

Do not import this module directly: `triton_loader.kernels(__name__)` loads it for the current
mode (GPU or interpreter).
"""

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


# --8<-- [start:ce_rows]
@triton.jit
def ce_rows_kernel(Z, T, LOSS, stride_zn, n_vocab, ignore_index, grad_scale,
                   BLOCK_V: tl.constexpr, WRITE_GRAD: tl.constexpr):
    """Grid (chunk,). Z (chunk, V) logits, unit column stride, overwritten by the gradient when
    WRITE_GRAD; T (chunk,) int64 targets; LOSS (chunk,) fp32 per-row loss (0 where ignored)."""
    row = tl.program_id(0).to(tl.int64)  # row * stride_zn passes 2^31 at chunk 4096 x V 600k
    z_row = Z + row * stride_zn
    t = tl.load(T + row)
    offs = tl.arange(0, BLOCK_V)
    if t == ignore_index:
        tl.store(LOSS + row, 0.0)
        if WRITE_GRAD:
            for v0 in range(0, n_vocab, BLOCK_V):
                cols = v0 + offs
                tl.store(z_row + cols, tl.zeros([BLOCK_V], dtype=Z.dtype.element_ty), mask=cols < n_vocab)
    else:
        # walk 1: m, l over the row; columns past V load as -inf, whose exp is 0
        m = tl.full([], float("-inf"), tl.float32)
        l = tl.zeros([], tl.float32)
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + offs
            z = tl.load(z_row + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)  # (BLOCK_V,)
            m_new = tl.maximum(m, tl.max(z, 0))  # finite from the first tile on: it holds column 0
            # alpha = exp(m - m_new) rescales the sum so far (exp(-inf) = 0 on the first tile)
            l = l * tl.math.exp2((m - m_new) * LOG2E) + tl.sum(tl.math.exp2((z - m_new) * LOG2E), 0)
            m = m_new
        lse = m + tl.math.log2(l) * LN2  # l >= 1: the max's own term is exp(0)
        z_t = tl.load(z_row + t).to(tl.float32)
        tl.store(LOSS + row, lse - z_t)
        if WRITE_GRAD:
            # walk 2: dL/dz = (exp(z - m) / l - onehot) * grad_scale, written over the logits
            c = grad_scale / l
            for v0 in range(0, n_vocab, BLOCK_V):
                cols = v0 + offs
                col_ok = cols < n_vocab
                z = tl.load(z_row + cols, mask=col_ok, other=float("-inf")).to(tl.float32)
                g = tl.math.exp2((z - m) * LOG2E) * c
                g = tl.where(cols == t, g - grad_scale, g)
                tl.store(z_row + cols, g.to(Z.dtype.element_ty), mask=col_ok)
# --8<-- [end:ce_rows]
