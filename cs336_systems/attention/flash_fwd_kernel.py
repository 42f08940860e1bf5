"""FlashAttention-2 forward kernel (Triton, plain pointer arithmetic).

One program owns one tile of BLOCK_M queries of one (batch, head) and loops once over key tiles of
BLOCK_N keys, carrying the online-softmax statistics m, l and the unnormalised output in fp32.
Scores live in base 2: qk_scale = log2(e) / sqrt(d) is folded into one multiply and exp2 replaces
exp; the saved logsumexp is converted back to natural log. Under a causal mask the key loop stops
at the diagonal, and only the tiles that need a mask (the diagonal, a ragged last tile) pay for
index comparisons. The head dim is padded to HEAD_DIM_PAD (a power of two) with masked loads.
INPUT_PRECISION is every tl.dot's input_precision (`flash_launch.dot_precision`: "ieee" or "tf32"
for fp32 inputs; the interpreter ignores it).

Do not import this module directly: `triton_loader.kernels(__name__)` loads it for the current
mode (GPU or interpreter).
"""

import triton
import triton.language as tl

from .tile_io import head_base, load_tile

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
MASK_LOG2: tl.constexpr = tl.constexpr(-1.0e6 * 1.4426950408889634)  # the course's -1e6, in base 2


# --8<-- [start:fwd_tiles]
@triton.jit
def fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  z, h, offs_m, offs_d, lo, hi, n_keys, qk_scale,
                  CAUSAL: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TMA: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into (acc, l_i, m_i). MASKED tiles apply the causal and bounds
    masks; the others (fully visible, fully in bounds) skip every comparison."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_tile(k_base, z, h, start_n, offs_n, offs_d, stride_kn, stride_kd, n_keys, MASKED,
                      HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
        if MASKED:
            s = qk * qk_scale
            if CAUSAL:  # add -1e6 where key > query, as the course's reference does
                s = tl.where(offs_m[:, None] >= offs_n[None, :], s, s + MASK_LOG2)
            s = tl.where(offs_n[None, :] < n_keys, s, float("-inf"))  # keys past the end don't exist
            m_new = tl.maximum(m_i, tl.max(s, 1))
            s = s - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            s = qk * qk_scale - m_new[:, None]  # one fused multiply-add per score
        p = tl.math.exp2(s)  # (BLOCK_M, BLOCK_N) = exp(S - m) in base 2
        alpha = tl.math.exp2(m_i - m_new)  # rescales everything accumulated so far
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_tile(v_base, z, h, start_n, offs_n, offs_d, stride_vn, stride_vd, n_keys, MASKED,
                      HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i
# --8<-- [end:fwd_tiles]


# --8<-- [start:fwd_kernel]
@triton.jit
def flash_fwd_kernel(Q, K, V, O, L,
                     stride_qz, stride_qh, stride_qn, stride_qd,
                     stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd,
                     stride_oz, stride_oh, stride_on, stride_od,
                     n_heads, n_queries, n_keys, qk_scale,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                     TMA: tl.constexpr = False):
    """Grid (query tiles, batch * heads). O (Z, H, n_q, d); L (Z * H, n_q) fp32, natural log.
    With TMA, Q, K, V are tensor descriptors (boxes of BLOCK_M rows for Q, BLOCK_N for K and V)."""
    n_tiles = tl.num_programs(0)
    n_bh = tl.num_programs(1)
    if CAUSAL:  # launch the longest programs (last query tiles, most keys) first
        lin = tl.program_id(0) + tl.program_id(1) * n_tiles
        tile = n_tiles - 1 - lin // n_bh
        bh = lin % n_bh
    else:
        tile = tl.program_id(0)
        bh = tl.program_id(1)
    zi = bh // n_heads
    hi_ = bh % n_heads
    z = zi.to(tl.int64)
    h = hi_.to(tl.int64)
    q_base = head_base(Q, z, h, stride_qz, stride_qh, TMA)
    k_base = head_base(K, z, h, stride_kz, stride_kh, TMA)
    v_base = head_base(V, z, h, stride_vz, stride_vh, TMA)

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q = load_tile(q_base, zi, hi_, tile * BLOCK_M, offs_m, offs_d, stride_qn, stride_qd, n_queries, True,
                  HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, TMA)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Key tiles [0, hi_full) are entirely visible and in bounds; [hi_full, hi) need masks;
    # causal programs stop at their diagonal (keys past it are skipped, not masked).
    if CAUSAL:
        hi = tl.minimum((tile + 1) * BLOCK_M, n_keys)
        hi_full = tl.minimum(tile * BLOCK_M, n_keys) // BLOCK_N * BLOCK_N
    else:
        hi = n_keys
        hi_full = n_keys // BLOCK_N * BLOCK_N
    acc, l_i, m_i = fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                  stride_vn, stride_vd, zi, hi_, offs_m, offs_d, 0, hi_full, n_keys, qk_scale,
                                  CAUSAL, False, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, TMA, INPUT_PRECISION)
    acc, l_i, m_i = fwd_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                  stride_vn, stride_vd, zi, hi_, offs_m, offs_d, hi_full, hi, n_keys, qk_scale,
                                  CAUSAL, True, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, TMA, INPUT_PRECISION)

    row_ok = offs_m < n_queries
    tl.store(L + bh.to(tl.int64) * n_queries + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=row_ok)
    o = acc / l_i[:, None]  # normalise once, at the end
    o_ptrs = O + z * stride_oz + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
# --8<-- [end:fwd_kernel]
