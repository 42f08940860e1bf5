"""Triton kernel of the fused AdamW step: one pass over a parameter, its gradient and its two moments.

Loaded through `triton_loader.kernels(__name__)` by `fused_adamw.py`, so importing the optimizer
does not import triton.
"""

import triton
import triton.language as tl


# --8<-- [start:kernel]
@triton.jit
def adamw_step(p_ptr, g_ptr, m_ptr, v_ptr, n, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
               step_size, bias_correction2_sqrt, eps, BLOCK: tl.constexpr):
    """One AdamW step on BLOCK elements of a flat (n,) parameter, in torch.optim.AdamW's form:

        p <- p * (1 - lr wd)                                   decay, applied first
        m <- beta1 m + (1 - beta1) g
        v <- beta2 v + (1 - beta2) g^2
        p <- p - step_size m / (sqrt(v) / sqrt(1 - beta2^t) + eps),   step_size = lr / (1 - beta1^t)

    The scalars come from the host as float32 (Python floats, computed there in float64 once per
    group and step). Loads widen to float32, all arithmetic is float32, each of p, m, v is rounded
    once to its own dtype at the store. sqrt_rn and div_rn are the IEEE correctly rounded
    operations: Triton's plain `/` and `tl.sqrt` compile to approximate PTX (div.full, sqrt.approx),
    whose error the tests' rounding bounds do not model.
    """
    # int64 offsets: an (n,) tensor may hold more than 2^31 elements (a vocab x d_model embedding
    # of a larger model; 8B's is 151936 x 4096 = 6.2e8, under but not far)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    p = tl.load(p_ptr + offs, mask=ok).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=ok).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=ok).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=ok).to(tl.float32)
    p = p * decay
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    p = p - tl.div_rn(step_size * m, denom)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=ok)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=ok)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=ok)
# --8<-- [end:kernel]
