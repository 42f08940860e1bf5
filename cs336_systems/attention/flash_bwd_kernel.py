"""FlashAttention-2 backward kernels (Triton, plain pointer arithmetic), without atomics.

    preprocess:  D_i = rowsum(dO_i * O_i)                                 grid (query tiles, Z*H)
    dK/dV pass:  one key tile resident, stream query tiles:               grid (key tiles, Z*H)
                 P^T = exp2(K Q^T * c - L2),  dV += P^T dO,  dS^T = P^T * (V dO^T - D),  dK += dS^T Q
    dQ pass:     one query tile resident, stream key tiles:               grid (query tiles, Z*H)
                 P = exp2(Q K^T * c - L2),  dQ += (P * (dO V^T - D)) K

Each program owns the rows it writes, so nothing is atomic; the price is computing P twice.
INPUT_PRECISION is every tl.dot's input_precision (`flash_launch.dot_precision`; the interpreter
ignores it). With TMA (Hopper) the input tiles come through tensor descriptors instead of pointer arithmetic
(`tile_io.load_tile`): same arithmetic, fewer registers and instructions per program.
`bwd_fused_kernel` runs both passes in one launch (one tail instead of two). As in the forward,
causal programs skip tiles past the diagonal and only masked tiles pay for comparisons.

Do not import this module directly: `triton_loader.kernels(__name__)` loads it for the current mode.
"""

import triton
import triton.language as tl

from .tile_io import LOG2E, head_base, load_rows, load_tile, store_rows


@triton.jit
def bwd_preprocess_kernel(O, DO, Delta, stride_oz, stride_oh, stride_on, stride_od,
                          stride_dz, stride_dh, stride_dn, stride_dd, n_heads, n_queries,
                          HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta (Z * H, n_q) fp32 = rowsum(O * dO)."""
    bh = tl.program_id(1)
    z = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    o = load_rows(O + z * stride_oz + h * stride_oh, offs_m, offs_d, stride_on, stride_od, n_queries,
                  True, HEAD_DIM, HEAD_DIM_PAD)
    do = load_rows(DO + z * stride_dz + h * stride_dh, offs_m, offs_d, stride_dn, stride_dd, n_queries,
                   True, HEAD_DIM, HEAD_DIM_PAD)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + bh.to(tl.int64) * n_queries + offs_m, delta, mask=offs_m < n_queries)


# --8<-- [start:dkdv_tiles]
@triton.jit
def dkdv_query_tiles(dk, dv, k, v, q_base, do_base, L_row, D_row, stride_qn, stride_qd,
                     stride_dn, stride_dd, z, h, offs_n, offs_d, lo, hi, n_queries, qk_scale,
                     CAUSAL: tl.constexpr, MASKED: tl.constexpr, BLOCK_M: tl.constexpr,
                     HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TMA: tl.constexpr,
                     INPUT_PRECISION: tl.constexpr):
    """Accumulate the contributions of query tiles [lo, hi) to this key tile's dK, dV."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = load_tile(q_base, z, h, start_m, offs_m, offs_d, stride_qn, stride_qd, n_queries, MASKED,
                      HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, TMA)
        do = load_tile(do_base, z, h, start_m, offs_m, offs_d, stride_dn, stride_dd, n_queries, MASKED,
                       HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, TMA)
        if MASKED:  # a missing query row gets L = +inf, so its P is exactly 0
            L2 = tl.load(L_row + offs_m, mask=offs_m < n_queries, other=float("inf")) * LOG2E
            Di = tl.load(D_row + offs_m, mask=offs_m < n_queries, other=0.0)
        else:
            L2 = tl.load(L_row + offs_m) * LOG2E
            Di = tl.load(D_row + offs_m)
        # dP^T does not need P: issued before the exp2s, it runs on the tensor cores while they do
        sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M)
        pT = tl.math.exp2(sT * qk_scale - L2[None, :])
        if MASKED:
            if CAUSAL:  # the -1e6 of masked scores makes their P exactly 0
                pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        dsT = pT * (dpT - Di[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=INPUT_PRECISION)
    return dk, dv
# --8<-- [end:dkdv_tiles]


@triton.jit
def dkdv_program(tile, bh, Q, K, V, DO, L, Delta, DK, DV,
                 stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                 n_heads, n_queries, n_keys, qk_scale, sm_scale,
                 CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, NO_TAIL: tl.constexpr,
                 INPUT_PRECISION: tl.constexpr):
    """dK, dV of key tile `tile` of (batch*head) `bh`. DK, DV are contiguous (Z, H, n_k, d).
    Q, K, V, DO are pointers, or with TMA descriptors (boxes of BLOCK_M rows for Q, DO, BLOCK_N for K, V).
    NO_TAIL: the host knows no program has a ragged last query tile, so that loop is not compiled
    (its registers would count against every program)."""
    zi = bh // n_heads
    hi = bh % n_heads
    z = zi.to(tl.int64)
    h = hi.to(tl.int64)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    k_base = head_base(K, z, h, stride_kz, stride_kh, TMA)
    v_base = head_base(V, z, h, stride_vz, stride_vh, TMA)
    q_base = head_base(Q, z, h, stride_qz, stride_qh, TMA)
    do_base = head_base(DO, z, h, stride_dz, stride_dh, TMA)
    k = load_tile(k_base, zi, hi, tile * BLOCK_N, offs_n, offs_d, stride_kn, stride_kd, n_keys, True,
                  HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
    v = load_tile(v_base, zi, hi, tile * BLOCK_N, offs_n, offs_d, stride_vn, stride_vd, n_keys, True,
                  HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
    L_row = L + bh.to(tl.int64) * n_queries
    D_row = Delta + bh.to(tl.int64) * n_queries
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    # Causal: queries before this tile see none of its keys (skipped); the first ones after it
    # straddle the diagonal (masked); the rest see all of it. Then a ragged last query tile.
    # The diagonal loop stops at n_queries. (A fixed trip count, masking rows past n_queries
    # instead, compiled to fewer registers but ran 20% slower on the H200: results/attention/dkdv_ab.)
    if CAUSAL:
        lo = tile * BLOCK_N
        lo_full = lo + (BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, L_row, D_row, stride_qn, stride_qd,
                                  stride_dn, stride_dd, zi, hi, offs_n, offs_d, lo, tl.minimum(lo_full, n_queries),
                                  n_queries, qk_scale, CAUSAL, True, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA,
                                  INPUT_PRECISION)
    else:
        lo_full = 0
    hi_full = lo_full + tl.maximum(n_queries - lo_full, 0) // BLOCK_M * BLOCK_M
    dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, L_row, D_row, stride_qn, stride_qd,
                              stride_dn, stride_dd, zi, hi, offs_n, offs_d, lo_full, hi_full,
                              n_queries, qk_scale, CAUSAL, False, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA,
                              INPUT_PRECISION)
    if not NO_TAIL:
        dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, L_row, D_row, stride_qn, stride_qd,
                                  stride_dn, stride_dd, zi, hi, offs_n, offs_d, hi_full, n_queries,
                                  n_queries, qk_scale, CAUSAL, True, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA,
                                  INPUT_PRECISION)
    out = (z * n_heads + h) * n_keys * HEAD_DIM
    store_rows(DK + out, dk * sm_scale, offs_n, offs_d, HEAD_DIM, 1, n_keys, HEAD_DIM)
    store_rows(DV + out, dv, offs_n, offs_d, HEAD_DIM, 1, n_keys, HEAD_DIM)


# --8<-- [start:dq_tiles]
@triton.jit
def dq_key_tiles(dq, q, do, L2, Di, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                 z, h, offs_m, offs_d, lo, hi, n_keys, qk_scale,
                 CAUSAL: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TMA: tl.constexpr,
                 INPUT_PRECISION: tl.constexpr):
    """Accumulate the contributions of key tiles [lo, hi) to this query tile's dQ."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_tile(k_base, z, h, start_n, offs_n, offs_d, stride_kn, stride_kd, n_keys, MASKED,
                      HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
        v = load_tile(v_base, z, h, start_n, offs_n, offs_d, stride_vn, stride_vd, n_keys, MASKED,
                      HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N)
        # (BLOCK_M, BLOCK_N), issued before the exp2s as in the dK/dV pass
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        p = tl.math.exp2(s * qk_scale - L2[:, None])
        if MASKED:
            keep = offs_n[None, :] < n_keys
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        ds = p * (dp - Di[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq
# --8<-- [end:dq_tiles]


@triton.jit
def dq_program(tile, bh, Q, K, V, DO, L, Delta, DQ,
               stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
               stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
               n_heads, n_queries, n_keys, qk_scale, sm_scale,
               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """dQ of query tile `tile` of (batch*head) `bh`. DQ is contiguous (Z, H, n_q, d).
    Q, K, V, DO are pointers, or with TMA descriptors (boxes of BLOCK_M rows for Q, DO, BLOCK_N for K, V)."""
    zi = bh // n_heads
    hi = bh % n_heads
    z = zi.to(tl.int64)
    h = hi.to(tl.int64)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_base = head_base(Q, z, h, stride_qz, stride_qh, TMA)
    do_base = head_base(DO, z, h, stride_dz, stride_dh, TMA)
    k_base = head_base(K, z, h, stride_kz, stride_kh, TMA)
    v_base = head_base(V, z, h, stride_vz, stride_vh, TMA)
    q = load_tile(q_base, zi, hi, tile * BLOCK_M, offs_m, offs_d, stride_qn, stride_qd, n_queries, True,
                  HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, TMA)
    do = load_tile(do_base, zi, hi, tile * BLOCK_M, offs_m, offs_d, stride_dn, stride_dd, n_queries, True,
                   HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, TMA)
    row_ok = offs_m < n_queries
    L2 = tl.load(L + bh.to(tl.int64) * n_queries + offs_m, mask=row_ok, other=float("inf")) * LOG2E
    Di = tl.load(Delta + bh.to(tl.int64) * n_queries + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if CAUSAL:
        hi_k = tl.minimum((tile + 1) * BLOCK_M, n_keys)
        hi_full = tl.minimum(tile * BLOCK_M, n_keys) // BLOCK_N * BLOCK_N
    else:
        hi_k = n_keys
        hi_full = n_keys // BLOCK_N * BLOCK_N
    dq = dq_key_tiles(dq, q, do, L2, Di, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, zi, hi,
                      offs_m, offs_d, 0, hi_full, n_keys, qk_scale, CAUSAL, False, BLOCK_N, HEAD_DIM,
                      HEAD_DIM_PAD, TMA, INPUT_PRECISION)
    dq = dq_key_tiles(dq, q, do, L2, Di, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, zi, hi,
                      offs_m, offs_d, hi_full, hi_k, n_keys, qk_scale, CAUSAL, True, BLOCK_N, HEAD_DIM,
                      HEAD_DIM_PAD, TMA, INPUT_PRECISION)
    store_rows(DQ + (z * n_heads + h) * n_queries * HEAD_DIM, dq * sm_scale, offs_m, offs_d, HEAD_DIM, 1,
               n_queries, HEAD_DIM)


@triton.jit
def bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV,
                    stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                    stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                    n_heads, n_queries, n_keys, qk_scale, sm_scale,
                    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                    TMA: tl.constexpr = False, NO_TAIL: tl.constexpr = False):
    """Grid (key tiles, Z*H). Causal: key tile 0 sees every query, so it goes first."""
    lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    n_bh = tl.num_programs(1)
    dkdv_program(lin // n_bh, lin % n_bh, Q, K, V, DO, L, Delta, DK, DV,
                 stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                 n_heads, n_queries, n_keys, qk_scale, sm_scale,
                 CAUSAL, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, BLOCK_N, TMA, NO_TAIL, INPUT_PRECISION)


@triton.jit
def bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ,
                  stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                  stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                  n_heads, n_queries, n_keys, qk_scale, sm_scale,
                  CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  TMA: tl.constexpr = False):
    """Grid (query tiles, Z*H). Causal: the last query tile sees every key, so it goes first."""
    n_tiles = tl.num_programs(0)
    lin = tl.program_id(0) + tl.program_id(1) * n_tiles
    n_bh = tl.num_programs(1)
    dq_program(n_tiles - 1 - lin // n_bh, lin % n_bh, Q, K, V, DO, L, Delta, DQ,
               stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
               stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
               n_heads, n_queries, n_keys, qk_scale, sm_scale,
               CAUSAL, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, BLOCK_N, TMA, INPUT_PRECISION)


@triton.jit
def bwd_fused_kernel(Q, K, V, DO, L, Delta, DQ, DK, DV, Q2, K2, V2, DO2,
                     stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                     n_heads, n_queries, n_keys, qk_scale, sm_scale, n_kv_tiles, n_q_tiles,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                     BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                     BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                     TMA1: tl.constexpr = False, TMA2: tl.constexpr = False, NO_TAIL: tl.constexpr = False):
    """Grid (key tiles + query tiles, Z*H): both passes in one launch. With as many key as query
    tiles the two kinds alternate, each in decreasing order of work, so long programs start first.
    Q2, K2, V2, DO2 are the dQ programs' view of the inputs: the same tensors, or with TMA2
    descriptors with that pass's boxes."""
    lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    n_bh = tl.num_programs(1)
    idx = lin // n_bh
    bh = lin % n_bh
    if n_kv_tiles == n_q_tiles:
        is_dkdv = idx % 2 == 0
        kv_tile = idx // 2
        q_tile = n_q_tiles - 1 - idx // 2
    else:
        is_dkdv = idx < n_kv_tiles
        kv_tile = idx
        q_tile = n_q_tiles - 1 - (idx - n_kv_tiles)
    if is_dkdv:
        dkdv_program(kv_tile, bh, Q, K, V, DO, L, Delta, DK, DV,
                     stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                     n_heads, n_queries, n_keys, qk_scale, sm_scale,
                     CAUSAL, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M1, BLOCK_N1, TMA1, NO_TAIL, INPUT_PRECISION)
    else:
        dq_program(q_tile, bh, Q2, K2, V2, DO2, L, Delta, DQ,
                   stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                   n_heads, n_queries, n_keys, qk_scale, sm_scale,
                   CAUSAL, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M2, BLOCK_N2, TMA2, INPUT_PRECISION)
