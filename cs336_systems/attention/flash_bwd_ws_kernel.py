"""EXPERIMENT, NOT YET RUN ON A GPU: the one-pass FlashAttention-2 backward in Gluon, with the dQ
adds moved off the math warps (warp specialisation).

Why: `ab_onepass` and `reduce_probe` showed that the one-pass kernel's dQ adds (8.6 GB of fp32 at
the leaderboard shape with 64-key tiles, ~2.4 ms alone) overlap the math only partly when the warps
that do the math also issue them. Triton 3.6 cannot move them (no warp specialisation of this loop,
one staging buffer per bulk reduction); Gluon, Triton's lower-level dialect, can:

    default partition (4 warps, one warpgroup): K, V resident in shared memory; Q, dO tiles streamed
        through a TMA ring of STAGES slots; per tile, as in flash_bwd_onepass_kernel,
            S^T = K Q^T,  P^T = exp2(S^T c - L2),  dV += P^T dO,  dP^T = V dO^T,
            dS^T = P^T (dP^T - D),  dK += dS^T Q,  dQ_share = dS K * sm_scale
        and the share goes into a shared-memory ring of SLOTS tiles (mbarriers full/empty)
    worker partition (4 warps, REDUCE_REGS registers): takes each staged share and adds it into
        the fp32 dQ with atomics, while the math warps go on to the next tile.

With maxnreg=128 at launch, the compiler gives the math warps 176 registers and the reducer 80
(setmaxnreg), so two programs share an SM (compile check for sm_90 with Triton 3.6: no spills,
90 KB of shared memory). Written against Triton 3.6's Gluon API, the GPU's version (Gluon's API
changes between releases: 3.9 renamed the TMA copies). Grid (key tiles, Z*H); contiguous bf16/fp16
inputs; n_q, n_k multiples of the tile; square tiles, so a causal program's first query tile is its
diagonal tile. `onepass_ws.py` launches it, checks it and times it.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _math(q_desc, k_desc, v_desc, do_desc, L, Delta, DK, DV, k_s, v_s, q_s, do_s, ds_s, dq_s,
          kv_bar, ld_bars, dq_full, dq_empty, bh, tile, lo, n_iter, n_q, n_k, qk_scale, sm_scale,
          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, SLOTS: gl.constexpr,
          CAUSAL: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    row_q = bh * n_q + lo  # first query row of this program's loop in the 2-D (Z*H*n, d) view
    # K, V once; the first STAGES query tiles
    mbarrier.expect(kv_bar, 2 * BN * D * 2)
    tma.async_copy_global_to_shared(k_desc, [bh * n_k + tile * BN, 0], kv_bar, k_s)
    tma.async_copy_global_to_shared(v_desc, [bh * n_k + tile * BN, 0], kv_bar, v_s)
    for j in gl.static_range(STAGES):
        first = j < n_iter
        mbarrier.expect(ld_bars.index(j), 2 * BM * D * 2, pred=first)
        tma.async_copy_global_to_shared(q_desc, [row_q + j * BM, 0], ld_bars.index(j), q_s.index(j), pred=first)
        tma.async_copy_global_to_shared(do_desc, [row_q + j * BM, 0], ld_bars.index(j), do_s.index(j), pred=first)
    offs_n = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, s_l))
    dk = gl.zeros([BN, D], gl.float32, o_l)
    dv = gl.zeros([BN, D], gl.float32, o_l)
    zero_s = gl.zeros([BN, BM], gl.float32, s_l)
    zero_q = gl.zeros([BM, D], gl.float32, o_l)
    L_row = L + bh.to(gl.int64) * n_q
    D_row = Delta + bh.to(gl.int64) * n_q
    mbarrier.wait(kv_bar, 0)
    for i in range(n_iter):
        s = i % STAGES
        mbarrier.wait(ld_bars.index(s), (i // STAGES) & 1)
        q = q_s.index(s)
        do = do_s.index(s)
        sT = hopper.warpgroup_mma(k_s, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dpT = hopper.warpgroup_mma(v_s, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        offs_m = lo + i * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_l))
        L2 = gl.load(L_row + offs_m) * LOG2E
        Di = gl.load(D_row + offs_m)
        sT = hopper.warpgroup_mma_wait(1, deps=[sT])
        pT = gl.exp2(sT * qk_scale - L2[None, :])
        if CAUSAL:
            pT = gl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv = hopper.warpgroup_mma(gl.convert_layout(pT.to(dtype), a_l), do, dv, is_async=True)
        dpT = hopper.warpgroup_mma_wait(1, deps=[dpT])
        dsT = (pT * (dpT - Di[None, :])).to(dtype)
        dk = hopper.warpgroup_mma(gl.convert_layout(dsT, a_l), q, dk, is_async=True)
        ds_s.store(dsT)  # dS^T (BN, BM): its transposed view is dQ's A operand
        fence_async_shared()
        gl.thread_barrier()
        dq = hopper.warpgroup_mma(ds_s.permute((1, 0)), k_s, zero_q, use_acc=False, is_async=True)
        dq, dv, dk = hopper.warpgroup_mma_wait(0, deps=[dq, dv, dk])
        # slot s is read by no MMA any more: prefetch tile i + STAGES into it
        nxt = i + STAGES
        pred = nxt < n_iter
        mbarrier.expect(ld_bars.index(s), 2 * BM * D * 2, pred=pred)
        tma.async_copy_global_to_shared(q_desc, [row_q + nxt * BM, 0], ld_bars.index(s), q_s.index(s), pred=pred)
        tma.async_copy_global_to_shared(do_desc, [row_q + nxt * BM, 0], ld_bars.index(s), do_s.index(s), pred=pred)
        # hand this tile's dQ share to the reducer
        t = i % SLOTS
        mbarrier.wait(dq_empty.index(t), ((i // SLOTS) & 1) ^ 1)
        dq_s.index(t).store(dq * sm_scale)
        mbarrier.arrive(dq_full.index(t), count=1)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    rows = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, o_l))
    out = (bh.to(gl.int64) * n_k + rows)[:, None] * D + offs_d[None, :]
    gl.store(DK + out, (dk * sm_scale).to(dtype))
    gl.store(DV + out, dv.to(dtype))


@gluon.jit
def _reduce(DQ, dq_s, dq_full, dq_empty, bh, lo, n_iter, n_q, D: gl.constexpr, BM: gl.constexpr,
            SLOTS: gl.constexpr):
    lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, lay))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, lay))
    base = DQ + (bh.to(gl.int64) * n_q + lo) * D
    for i in range(n_iter):
        t = i % SLOTS
        mbarrier.wait(dq_full.index(t), (i // SLOTS) & 1)
        x = dq_s.index(t).load(lay)
        mbarrier.arrive(dq_empty.index(t), count=1)
        gl.atomic_add(base + (i * BM + rows)[:, None] * D + cols[None, :], x, sem="relaxed")


@gluon.jit
def bwd_onepass_ws_kernel(q_desc, k_desc, v_desc, do_desc, L, Delta, DQ, DK, DV, n_q, n_k, qk_scale, sm_scale,
                          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                          SLOTS: gl.constexpr, CAUSAL: gl.constexpr, REDUCE_REGS: gl.constexpr):
    lin = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    n_bh = gl.num_programs(1)
    tile = lin // n_bh
    bh = lin % n_bh
    if CAUSAL:
        lo = tile * BN
    else:
        lo = tile * 0
    n_iter = (n_q - lo) // BM
    dtype: gl.constexpr = q_desc.dtype
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    qd_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
    dq_l: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    k_s = gl.allocate_shared_memory(dtype, [BN, D], kv_l)
    v_s = gl.allocate_shared_memory(dtype, [BN, D], kv_l)
    q_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qd_l)
    do_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qd_l)
    ds_s = gl.allocate_shared_memory(dtype, [BN, BM], ds_l)
    dq_s = gl.allocate_shared_memory(gl.float32, [SLOTS, BM, D], dq_l)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ld_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ld_bars.index(s), count=1)
    for t in gl.static_range(SLOTS):
        mbarrier.init(dq_full.index(t), count=1)
        mbarrier.init(dq_empty.index(t), count=1)
    gl.warp_specialize([
        (_math, (q_desc, k_desc, v_desc, do_desc, L, Delta, DK, DV, k_s, v_s, q_s, do_s, ds_s, dq_s,
                 kv_bar, ld_bars, dq_full, dq_empty, bh, tile, lo, n_iter, n_q, n_k, qk_scale, sm_scale,
                 D, BM, BN, STAGES, SLOTS, CAUSAL)),
        (_reduce, (DQ, dq_s, dq_full, dq_empty, bh, lo, n_iter, n_q, D, BM, SLOTS)),
    ], [4], [REDUCE_REGS])
