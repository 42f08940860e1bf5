"""The one-pass FlashAttention-2 backward in Gluon, with dQ's matmul and adds moved off the math
warps (warp specialisation): the backward of the table entries that say `gluon_ws` (the tuner
times it as kernel "ws"); `onepass_ws.py` launches it, `experiments/ab_onepass_ws.py` ablates it.

Why: `ab_onepass` and `reduce_probe` showed that the one-pass kernel's dQ adds (8.6 GB of fp32 at
the leaderboard shape with 64-key tiles, ~2.4 ms alone) overlap the math only partly when the warps
that do the math also issue them. Triton 3.6 cannot move them (no warp specialisation of this loop,
one staging buffer per bulk reduction); Gluon, Triton's lower-level dialect, can. A program owns
BN = 128 keys:

    two math partitions, one per 64 keys (4 warps, a warpgroup, each; `_math`): K, V resident in
        shared memory; Q, dO tiles streamed through the partition's own TMA ring of STAGES slots;
        per query tile, as in flash_bwd_onepass_kernel,
            S^T = K Q^T,  P^T = exp2(S^T c - L2),  dV += P^T dO,  dP^T = V dO^T,
            dS^T = P^T (dP^T - D),  dK += dS^T Q
        and dS^T (bf16) goes into the partition's shared-memory ring of SLOTS tiles (mbarriers
        full/empty). Under the causal mask only the first tiles cross the warpgroup's diagonal:
        they run in a loop of their own (`_math_tiles`, MASKED), the rest skip the comparisons
    one dQ partition (a warpgroup, DQ_REGS registers; `_dq`): per query tile, dQ's share
        dS K * sm_scale over all 128 keys (both halves of dS^T into one accumulator: the tensor
        cores do the sum), added into the fp32 dQ by TMA bulk reductions (or atomics: DQ_TMA off)
        while the math warps go on. 128 keys per program halve the adds against 64 (4.3 GB, not 8.6).

The math warpgroups are separate partitions, not one 8-warp partition, so each synchronises only
its own four warps (a 128-key tile split over one 8-warp partition needed a barrier of all eight
per tile, which measured slower). setmaxnreg moves registers from the dQ warpgroup to the math
warpgroups (MATH_REGS; `onepass_ws.register_split`). Written against Triton 3.6's Gluon API, the
GPU's version (Gluon's API changes between releases: 3.9 renamed the TMA copies). Grid (key blocks
of BN, Z*H); contiguous bf16/fp16 inputs, head dim 64; n_q a multiple of 64, n_k of BN.
"""

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add a shared-memory tile into global memory by a TMA bulk reduction (cp.reduce.async.bulk.tensor,
    one bulk group). Gluon 3.6's builder has the op; its Hopper `tma` module does not expose it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


# --8<-- [start:math_tiles]
@gluon.jit
def _math_tiles(i0, i1, dk, dv, L2, Di, offs_m, offs_n, q_desc, do_desc, L_row, D_row, k_s, v_s, q_s, do_s, ds_s,
                ld_bars, ds_full, ds_empty, row_q, n_iter, n_q, qk_scale,
                D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, SLOTS: gl.constexpr, W: gl.constexpr,
                MASKED: gl.constexpr):
    """Query tiles i0 .. i1 - 1 of warpgroup W (see `_math`); MASKED tiles apply the causal mask.
    Returns the carried state: dK, dV (64, D) fp32, the next tile's L (base 2), D and query offsets."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o_l: gl.constexpr = dk.type.layout
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    zero_s = gl.zeros([64, BM], gl.float32, s_l)
    for i in range(i0, i1):
        s = i % STAGES
        mbarrier.wait(ld_bars.index(W * STAGES + s), (i // STAGES) & 1)
        q = q_s.index(W * STAGES + s)
        do = do_s.index(W * STAGES + s)
        sT = hopper.warpgroup_mma(k_s, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dpT = hopper.warpgroup_mma(v_s, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        sT = hopper.warpgroup_mma_wait(1, deps=[sT])
        pT = gl.exp2(sT * qk_scale - L2[None, :])
        if MASKED:
            pT = gl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv = hopper.warpgroup_mma(gl.convert_layout(pT.to(dtype), a_l), do, dv, is_async=True)
        dpT = hopper.warpgroup_mma_wait(1, deps=[dpT])
        dsT = (pT * (dpT - Di[None, :])).to(dtype)
        offs_m += BM  # the next tile's L, D (masked past the end)
        L2 = gl.load(L_row + offs_m, mask=offs_m < n_q, other=0.0) * LOG2E
        Di = gl.load(D_row + offs_m, mask=offs_m < n_q, other=0.0)
        dk = hopper.warpgroup_mma(gl.convert_layout(dsT, a_l), q, dk, is_async=True)
        # hand dS^T to the dQ partition (dQ's share = dS K is its matmul, not ours)
        t = i % SLOTS
        mbarrier.wait(ds_empty.index(W * SLOTS + t), ((i // SLOTS) & 1) ^ 1)
        ds_s.index(W * SLOTS + t).store(dsT)
        fence_async_shared()  # the generic-proxy store, before the dQ partition's MMA reads it
        gl.thread_barrier()  # all four warps' parts stored (a partition's barrier is its own)
        mbarrier.arrive(ds_full.index(W * SLOTS + t), count=1)
        dv, dk = hopper.warpgroup_mma_wait(0, deps=[dv, dk])
        # slot s is read by no MMA any more: prefetch tile i + STAGES into it
        nxt = i + STAGES
        pred = nxt < n_iter
        mbarrier.expect(ld_bars.index(W * STAGES + s), 2 * BM * D * 2, pred=pred)
        tma.async_copy_global_to_shared(q_desc, [row_q + nxt * BM, 0], ld_bars.index(W * STAGES + s), q_s.index(W * STAGES + s), pred=pred)
        tma.async_copy_global_to_shared(do_desc, [row_q + nxt * BM, 0], ld_bars.index(W * STAGES + s), do_s.index(W * STAGES + s), pred=pred)
    return dk, dv, L2, Di, offs_m
# --8<-- [end:math_tiles]


@gluon.jit
def _math(q_desc, k_desc, v_desc, do_desc, L, Delta, DK, DV, k_all, v_all, q_s, do_s, ds_s,
          kv_bars, ld_bars, ds_full, ds_empty, bh, tile, lo, n_iter, n_q, n_k, qk_scale, sm_scale,
          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, SLOTS: gl.constexpr,
          CAUSAL: gl.constexpr, W: gl.constexpr):
    """Warpgroup W of the program: its 64 keys, over the query tiles lo, lo + BM, ... (n_iter of them).
    Its buffers: index W of k_all, v_all, kv_bars; stages W*STAGES.. of the Q/dO ring and its
    barriers; slots W*SLOTS.. of the dS^T ring and its barriers."""
    key0 = tile * BN + W * 64
    k_s = k_all.index(W)
    v_s = v_all.index(W)
    kv_bar = kv_bars.index(W)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    dtype: gl.constexpr = q_desc.dtype
    row_q = bh * n_q + lo  # first query row of the loop in the 2-D (Z*H*n, d) view
    # K, V once; the first STAGES query tiles
    mbarrier.expect(kv_bar, 2 * 64 * D * 2)
    tma.async_copy_global_to_shared(k_desc, [bh * n_k + key0, 0], kv_bar, k_s)
    tma.async_copy_global_to_shared(v_desc, [bh * n_k + key0, 0], kv_bar, v_s)
    for j in gl.static_range(STAGES):
        first = j < n_iter
        mbarrier.expect(ld_bars.index(W * STAGES + j), 2 * BM * D * 2, pred=first)
        tma.async_copy_global_to_shared(q_desc, [row_q + j * BM, 0], ld_bars.index(W * STAGES + j), q_s.index(W * STAGES + j), pred=first)
        tma.async_copy_global_to_shared(do_desc, [row_q + j * BM, 0], ld_bars.index(W * STAGES + j), do_s.index(W * STAGES + j), pred=first)
    offs_n = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_l))
    dk = gl.zeros([64, D], gl.float32, o_l)
    dv = gl.zeros([64, D], gl.float32, o_l)
    L_row = L + bh.to(gl.int64) * n_q
    D_row = Delta + bh.to(gl.int64) * n_q
    # L and D of the first query tile; each tile then loads the next tile's, so their global
    # latency hides behind a tile of math instead of stalling the exponentials
    offs_m = lo + gl.arange(0, BM, layout=gl.SliceLayout(0, s_l))
    L2 = gl.load(L_row + offs_m) * LOG2E
    Di = gl.load(D_row + offs_m)
    # Under the causal mask only the first tiles cross this warpgroup's diagonal (queries below
    # key0 + 64): they alone pay for the mask's comparisons, in a loop of their own
    n_diag = 0
    if CAUSAL:
        n_diag = gl.minimum((key0 + 64 - lo + BM - 1) // BM, n_iter)
    mbarrier.wait(kv_bar, 0)
    dk, dv, L2, Di, offs_m = _math_tiles(0, n_diag, dk, dv, L2, Di, offs_m, offs_n, q_desc, do_desc, L_row, D_row,
                                         k_s, v_s, q_s, do_s, ds_s, ld_bars, ds_full, ds_empty, row_q, n_iter,
                                         n_q, qk_scale, D, BM, STAGES, SLOTS, W, True)
    dk, dv, L2, Di, offs_m = _math_tiles(n_diag, n_iter, dk, dv, L2, Di, offs_m, offs_n, q_desc, do_desc, L_row,
                                         D_row, k_s, v_s, q_s, do_s, ds_s, ld_bars, ds_full, ds_empty, row_q,
                                         n_iter, n_q, qk_scale, D, BM, STAGES, SLOTS, W, False)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    rows = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
    out = (bh.to(gl.int64) * n_k + rows)[:, None] * D + offs_d[None, :]
    gl.store(DK + out, (dk * sm_scale).to(dtype))
    gl.store(DV + out, dv.to(dtype))


# --8<-- [start:dq_warpgroup]
@gluon.jit
def _dq(DQ, dq_desc, red_s, k_all, kv_bars, ds_s, ds_full, ds_empty, bh, lo, n_iter, n_q, sm_scale,
        D: gl.constexpr, BM: gl.constexpr, SLOTS: gl.constexpr, WG: gl.constexpr, DQ_TMA: gl.constexpr):
    """One warpgroup: per query tile, dQ's share = sum over the math warpgroups w of dS_w K_w (the
    tensor cores do the sum: one accumulator), then the add of that share into the fp32 dQ: by
    atomics from registers, or (DQ_TMA) staged in shared memory and added by a TMA bulk reduction
    that no warp waits for until its buffer comes round again."""
    RB: gl.constexpr = red_s.shape[0]  # staging buffers for the bulk reductions
    q_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, q_l))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
    base = DQ + (bh.to(gl.int64) * n_q + lo) * D
    zero_q = gl.zeros([BM, D], gl.float32, q_l)
    for w in gl.static_range(WG):
        mbarrier.wait(kv_bars.index(w), 0)  # K_w is in shared memory
    for i in range(n_iter):
        t = i % SLOTS
        dq = zero_q
        for w in gl.static_range(WG):  # warpgroup w's slots are w * SLOTS + t
            mbarrier.wait(ds_full.index(w * SLOTS + t), (i // SLOTS) & 1)
            dq = hopper.warpgroup_mma(ds_s.index(w * SLOTS + t).permute((1, 0)), k_all.index(w), dq, is_async=True)
        dq = hopper.warpgroup_mma_wait(0, deps=[dq])
        for w in gl.static_range(WG):
            mbarrier.arrive(ds_empty.index(w * SLOTS + t), count=1)
        if DQ_TMA:
            tma.store_wait(RB - 1)  # the bulk reduction issued from buffer i % RB, RB tiles ago, has read it
            gl.thread_barrier()
            red_s.index(i % RB).store(dq * sm_scale)
            fence_async_shared()
            gl.thread_barrier()
            _tma_reduce_add(dq_desc, [bh * n_q + lo + i * BM, 0], red_s.index(i % RB))
        else:
            gl.atomic_add(base + (i * BM + rows)[:, None] * D + cols[None, :], dq * sm_scale, sem="relaxed")
    if DQ_TMA:
        tma.store_wait(0)
# --8<-- [end:dq_warpgroup]


@gluon.jit
def bwd_onepass_ws_kernel(q_desc, k_desc, v_desc, do_desc, L, Delta, DQ, dq_desc, DK, DV, n_q, n_k, qk_scale, sm_scale,
                          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                          SLOTS: gl.constexpr, CAUSAL: gl.constexpr, MATH_REGS: gl.constexpr,
                          DQ_REGS: gl.constexpr, DQ_TMA: gl.constexpr, RED_BUFS: gl.constexpr):
    WG: gl.constexpr = BN // 64  # math warpgroups, one per 64 keys; each has its own buffers
    lin = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    n_bh = gl.num_programs(1)
    tile = lin // n_bh
    bh = lin % n_bh
    if CAUSAL:  # every warpgroup walks the same query tiles (the dQ warpgroup pairs their dS^T by
        lo = tile * BN  # index), from the program's first key on: a later warpgroup's first tiles
    else:  # are masked to zero, a few wasted tiles out of many
        lo = tile * 0
    n_iter = (n_q - lo) // BM
    dtype: gl.constexpr = q_desc.dtype
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D], dtype)
    qd_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BM], dtype)
    k_s = gl.allocate_shared_memory(dtype, [WG, 64, D], kv_l)
    v_s = gl.allocate_shared_memory(dtype, [WG, 64, D], kv_l)
    q_s = gl.allocate_shared_memory(dtype, [WG * STAGES, BM, D], qd_l)
    do_s = gl.allocate_shared_memory(dtype, [WG * STAGES, BM, D], qd_l)
    ds_s = gl.allocate_shared_memory(dtype, [WG * SLOTS, 64, BM], ds_l)
    red_s = gl.allocate_shared_memory(gl.float32, [RED_BUFS, BM, D], dq_desc.layout)  # (DQ_TMA only)
    kv_bar = gl.allocate_shared_memory(gl.int64, [WG, 1], mbarrier.MBarrierLayout())
    ld_bars = gl.allocate_shared_memory(gl.int64, [WG * STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [WG * SLOTS, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [WG * SLOTS, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(WG):
        mbarrier.init(kv_bar.index(w), count=1)
    for s in gl.static_range(WG * STAGES):
        mbarrier.init(ld_bars.index(s), count=1)
    for t in gl.static_range(WG * SLOTS):
        mbarrier.init(ds_full.index(t), count=1)
        mbarrier.init(ds_empty.index(t), count=1)
    # the same function for each math warpgroup, W picking its buffers (the (function, args) pairs
    # are spelled out in each call: jit code cannot hold one in a variable)
    gl.static_assert(WG == 2, "written for two math warpgroups (BN = 128)")
    gl.warp_specialize([
        (_math, (q_desc, k_desc, v_desc, do_desc, L, Delta, DK, DV, k_s, v_s, q_s, do_s, ds_s, kv_bar,
                 ld_bars, ds_full, ds_empty, bh, tile, lo, n_iter, n_q, n_k, qk_scale, sm_scale,
                 D, BM, BN, STAGES, SLOTS, CAUSAL, 0)),
        (_math, (q_desc, k_desc, v_desc, do_desc, L, Delta, DK, DV, k_s, v_s, q_s, do_s, ds_s, kv_bar,
                 ld_bars, ds_full, ds_empty, bh, tile, lo, n_iter, n_q, n_k, qk_scale, sm_scale,
                 D, BM, BN, STAGES, SLOTS, CAUSAL, 1)),
        (_dq, (DQ, dq_desc, red_s, k_s, kv_bar, ds_s, ds_full, ds_empty, bh, lo, n_iter, n_q, sm_scale,
               D, BM, SLOTS, WG, DQ_TMA)),
    ], [4, 4], [MATH_REGS, DQ_REGS])
