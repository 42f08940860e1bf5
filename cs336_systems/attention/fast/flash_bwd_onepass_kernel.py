"""FlashAttention-2 backward in one pass (Triton): dK, dV resident, dQ accumulated with fp32 atomics.

    grid (key tiles, Z*H); each program keeps one key tile's K, V and streams the query tiles:
        S^T = K Q^T,  P^T = exp2(S^T * c - L2),  dV += P^T dO
        dP^T = V dO^T,  dS^T = P^T * (dP^T - D),  dK += dS^T Q
        dQ[query tile] += (dS^T)^T K * sm_scale       (fp32 atomic add, relaxed)

5 matmuls and one exponential per score tile, where the two-pass kernels of `flash_bwd_kernel`
run 7 and two. The price: every program adds into the rows of dQ it touches, so dQ lives in an
fp32 buffer (zeroed before, cast to the input dtype after, on the host) and is written with
atomics. The order in which the key tiles' contributions are summed is whatever order the programs
happen to run in, so dQ is NOT bitwise deterministic run to run (fp32 rounding differs in the last
bits); dK and dV are (each program owns its rows).

Two ways to add a (BLOCK_M, d) fp32 tile into dQ: every thread issues atomics for its elements
(`tl.atomic_add`), or, with TMA (Hopper), the tile is written to shared memory and the copy engine
adds it into global memory in one bulk tensor reduction (`cp.reduce.async.bulk.tensor`, the way
FlashAttention-3 accumulates dQ). The interpreter has no bulk reductions, so there the TMA version
loads through descriptors but adds with atomics.

The tuner times this kernel against the two-pass ones: so far it has measured slower at the
leaderboard shape (the chapter has the numbers) but faster for several fp32 shapes.

Causal programs skip query tiles above the diagonal (they see none of the key tile), mask only the
tiles straddling it and a ragged last query tile. When n_keys is not a multiple of BLOCK_N
(EVEN_N false, decided on the host), P^T is zeroed for the missing keys: their dS would otherwise
reach dQ through a product with zero K rows, and exp2 of an unmasked score can overflow to inf.

The loop and the tile ranges repeat `flash_bwd_kernel`'s dK/dV pass on purpose: each kernel file
can change (and be A/B-timed) without moving the other's compiled code.

INPUT_PRECISION is every tl.dot's input_precision (`flash_launch.dot_precision`; the interpreter
ignores it).

Do not import this module directly: `triton_loader.kernels(__name__)` loads it for the current mode.
"""

import triton
import triton.language as tl

from ..tile_io import LOG2E, head_base, load_tile, store_rows


# --8<-- [start:onepass_tiles]
@triton.jit
def onepass_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, L_row, D_row, stride_qn, stride_qd,
                        stride_dn, stride_dd, z, h, offs_n, offs_d, lo, hi, n_queries, n_keys, qk_scale, sm_scale,
                        CAUSAL: tl.constexpr, MASKED: tl.constexpr, EVEN_N: tl.constexpr,
                        BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                        TMA: tl.constexpr, DQ_TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Query tiles [lo, hi): accumulate into this key tile's dK, dV; add their dQ rows atomically."""
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
        pT = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale
                          - L2[None, :])  # (BLOCK_N, BLOCK_M)
        if MASKED:
            if CAUSAL:  # the -1e6 of masked scores makes their P exactly 0
                pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        if not EVEN_N:  # keys past the end: P = 0, so their dS (and dQ share) is 0
            pT = tl.where(offs_n[:, None] < n_keys, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M)
        dsT = (pT * (dpT - Di[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk, input_precision=INPUT_PRECISION)
        # (BLOCK_M, HEAD_DIM_PAD) fp32, this key tile's share
        dq = tl.dot(tl.trans(dsT), k, input_precision=INPUT_PRECISION) * sm_scale
        if DQ_TMA:  # the tile goes to shared memory; the TMA engine adds it into global (rows past n_q dropped)
            dq_base.atomic_add([z, h, start_m, 0], dq.reshape(1, 1, BLOCK_M, HEAD_DIM_PAD))
        else:  # every thread adds its elements (vectorised red.global)
            dq_ptrs = dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM),
                              sem="relaxed")
            elif HEAD_DIM != HEAD_DIM_PAD:
                tl.atomic_add(dq_ptrs, dq, mask=offs_d[None, :] < HEAD_DIM, sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv
# --8<-- [end:onepass_tiles]


@triton.jit
def bwd_onepass_kernel(Q, K, V, DO, L, Delta, DQ, DK, DV,
                       stride_qz, stride_qh, stride_qn, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                       stride_vz, stride_vh, stride_vn, stride_vd, stride_dz, stride_dh, stride_dn, stride_dd,
                       n_heads, n_queries, n_keys, qk_scale, sm_scale,
                       CAUSAL: tl.constexpr, EVEN_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                       HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr = False, DQ_TMA: tl.constexpr = False, NO_TAIL: tl.constexpr = False):
    """Grid (key tiles, Z*H). DQ is a zeroed fp32 (Z, H, n_q, d); DQ, DK, DV are contiguous.
    With TMA, Q, K, V, DO are descriptors (boxes of BLOCK_M rows for Q, DO, BLOCK_N for K, V); with
    DQ_TMA, DQ is a descriptor (box BLOCK_M rows) and the dQ shares are added by the TMA engine.
    NO_TAIL: no ragged last query tile (see flash_bwd_kernel.dkdv_program).
    Causal: key tile 0 sees every query, so it goes first."""
    lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    n_bh = tl.num_programs(1)
    tile = lin // n_bh
    bh = lin % n_bh
    zi = bh // n_heads
    hi = bh % n_heads
    z = zi.to(tl.int64)
    h = hi.to(tl.int64)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    k = load_tile(head_base(K, z, h, stride_kz, stride_kh, TMA), zi, hi, tile * BLOCK_N, offs_n, offs_d,
                  stride_kn, stride_kd, n_keys, True, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
    v = load_tile(head_base(V, z, h, stride_vz, stride_vh, TMA), zi, hi, tile * BLOCK_N, offs_n, offs_d,
                  stride_vn, stride_vd, n_keys, True, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N, TMA)
    q_base = head_base(Q, z, h, stride_qz, stride_qh, TMA)
    do_base = head_base(DO, z, h, stride_dz, stride_dh, TMA)
    if DQ_TMA:
        dq_base = DQ
    else:
        dq_base = DQ + bh.to(tl.int64) * n_queries * HEAD_DIM
    L_row = L + bh.to(tl.int64) * n_queries
    D_row = Delta + bh.to(tl.int64) * n_queries
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    # Same query-tile ranges as the dK/dV pass: skipped / straddling the diagonal (masked) /
    # fully visible / a ragged last tile (masked).
    if CAUSAL:
        lo = tile * BLOCK_N
        lo_full = lo + (BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        dk, dv = onepass_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, L_row, D_row, stride_qn, stride_qd,
                                     stride_dn, stride_dd, zi, hi, offs_n, offs_d, lo, tl.minimum(lo_full, n_queries),
                                     n_queries, n_keys, qk_scale, sm_scale,
                                     CAUSAL, True, EVEN_N, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA, DQ_TMA,
                                     INPUT_PRECISION)
    else:
        lo_full = 0
    hi_full = lo_full + tl.maximum(n_queries - lo_full, 0) // BLOCK_M * BLOCK_M
    dk, dv = onepass_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, L_row, D_row, stride_qn, stride_qd,
                                 stride_dn, stride_dd, zi, hi, offs_n, offs_d, lo_full, hi_full,
                                 n_queries, n_keys, qk_scale, sm_scale,
                                 CAUSAL, False, EVEN_N, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA, DQ_TMA,
                                     INPUT_PRECISION)
    if not NO_TAIL:
        dk, dv = onepass_query_tiles(dk, dv, k, v, q_base, do_base, dq_base, L_row, D_row, stride_qn, stride_qd,
                                     stride_dn, stride_dd, zi, hi, offs_n, offs_d, hi_full, n_queries,
                                     n_queries, n_keys, qk_scale, sm_scale,
                                     CAUSAL, True, EVEN_N, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, TMA, DQ_TMA,
                                     INPUT_PRECISION)
    out = bh.to(tl.int64) * n_keys * HEAD_DIM
    store_rows(DK + out, dk * sm_scale, offs_n, offs_d, HEAD_DIM, 1, n_keys, HEAD_DIM)
    store_rows(DV + out, dv, offs_n, offs_d, HEAD_DIM, 1, n_keys, HEAD_DIM)
