"""The one-pass FlashAttention-2 backward in Gluon at head dim 128, with FA3's division of labour:
the backward of the table entries that say `gluon_ws` at d = 128 (`bwd128_ws.py` launches it).

Why another kernel than d = 64's (`flash_bwd_ws_kernel`): there a third warpgroup does dQ's matmul,
so the two math warpgroups get about 200 registers each. At d = 128 a math warpgroup holds dK and
dV for its 64 keys (64 x 128 fp32 each: 128 registers per thread) besides S^T and dP^T (32 each),
which does not fit. Here a one-warp loader issues every TMA load (it needs 24 registers), the two
math warpgroups get 240 each and split dQ's matmul between them by columns. A program owns
BN = 128 keys:

    loader (one warp; `_load`): K and V of the program's keys once, then Q and dO tiles of BM = 64
        queries through a ring of STAGES slots that both math warpgroups read (mbarriers
        ld_full / ld_empty: a slot is free when both have released it)
    math warpgroup W (`_math`), keys k0 + 64 W .. + 63, per query tile i:
            S^T = K_W Q^T,  P^T = exp2(S^T c - L2),  dV_W += P^T dO,  dP^T = V_W dO^T,
            dS^T = P^T (dP^T - Delta),  dK_W += dS^T Q
        with P^T and dS^T as register operands of dV's and dK's products; dS^T also goes into
        its half of the shared (BN, BM) tile of slot i % SLOTS; once both halves
        are there (ds_ready), dQ[:, 64 W: 64 W + 64] += dS K[:, 64 W: 64 W + 64] * sm_scale,
        added into the fp32 dQ by a TMA bulk reduction from the warpgroup's staging buffer.
        Under the causal mask only the first tiles cross the warpgroup's diagonal: they run in a
        loop of their own (MASKED); the rest skip the comparisons.

Written against Triton 3.6's Gluon API, the GPU's version. Grid (key blocks of BN, Z*H);
contiguous bf16/fp16 inputs, head dim 128; n_q a multiple of 64 and n_k of 128.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .flash_bwd_ws_kernel import _tma_reduce_add

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _load(q_desc, k_desc, v_desc, do_desc, k_s, v_s, q_s, do_s, kv_bar, ld_full, ld_empty, bh, k0, lo, n_iter,
          n_q, n_k, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(kv_bar, 2 * BN * D * 2)
    tma.async_copy_global_to_shared(k_desc, [bh * n_k + k0, 0], kv_bar, k_s)
    tma.async_copy_global_to_shared(v_desc, [bh * n_k + k0, 0], kv_bar, v_s)
    row_q = bh * n_q + lo
    for i in range(n_iter):
        s = i % STAGES
        mbarrier.wait(ld_empty.index(s), ((i // STAGES) & 1) ^ 1)  # the first pass finds every slot free
        mbarrier.expect(ld_full.index(s), 2 * BM * D * 2)
        tma.async_copy_global_to_shared(q_desc, [row_q + i * BM, 0], ld_full.index(s), q_s.index(s))
        tma.async_copy_global_to_shared(do_desc, [row_q + i * BM, 0], ld_full.index(s), do_s.index(s))


# --8<-- [start:tiles]
@gluon.jit
def _tiles(i0, i1, dk, dv, offs_n, L_row, D_row, dq_desc, k_w, v_w, k_cols, q_s, do_s, ds_s,
           red, ld_full, ld_empty, ds_ready, ds_free, lo, row_q, qk_scale, sm_scale,
           D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, SLOTS: gl.constexpr, W: gl.constexpr,
           MASKED: gl.constexpr, DQ_UNDER_DK: gl.constexpr):
    """Query tiles i0 .. i1 - 1 of math warpgroup W; returns the carried dK, dV."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    q_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    # the left operand of dV's and dK's products, (64 keys, BM) from registers
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]), k_width=2)
    dtype: gl.constexpr = k_w.dtype
    for i in range(i0, i1):
        s = i % STAGES
        mbarrier.wait(ld_full.index(s), (i // STAGES) & 1)
        q = q_s.index(s)
        do = do_s.index(s)
        sT = hopper.warpgroup_mma(k_w, q.permute((1, 0)), gl.zeros([64, BM], gl.float32, s_l), use_acc=False,
                                  is_async=True)
        dpT = hopper.warpgroup_mma(v_w, do.permute((1, 0)), gl.zeros([64, BM], gl.float32, s_l), use_acc=False,
                                   is_async=True)
        # At d = 128 dK and dV hold 128 registers per thread, so the elementwise work keeps few
        # others alive: L and Delta (column vectors of S^T: 16 registers each) are loaded for this
        # tile only, each just before its use, and L is dead before dP^T arrives.
        offs_m = lo + i * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_l))
        L2 = gl.load(L_row + offs_m) * LOG2E
        sT = hopper.warpgroup_mma_wait(1, deps=[sT])
        pT = gl.exp2(sT * qk_scale - L2[None, :])
        if MASKED:
            pT = gl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        Di = gl.load(D_row + offs_m)
        dpT = hopper.warpgroup_mma_wait(0, deps=[dpT])
        dsT = (pT * (dpT - Di[None, :])).to(dtype)
        # dV's and dK's left operands come from registers: three of the five products reading
        # both operands from shared memory at N = 64 asked for about all of its bandwidth
        # (the A/B run against shared-memory operands: results/attention/ab_bwd128).
        # This warpgroup's half of the (BN, BM) dS^T tile still goes to shared memory: it is both
        # warpgroups' dQ operand.
        t = i % SLOTS
        ds_w = ds_s.index(t).slice(64 * W, 64)
        mbarrier.wait(ds_free.index(t), ((i // SLOTS) & 1) ^ 1)
        ds_w.store(dsT)
        fence_async_shared()  # the generic-proxy stores, before any MMA reads them
        gl.thread_barrier()  # all four warps' parts stored
        mbarrier.arrive(ds_ready.index(t), count=1)
        # dQ's columns of W are dS (BM, BN) K[:, cols], once both halves of dS^T are in. Causal
        # (DQ_UNDER_DK), dQ's product is issued between dV's and dK's and waited for alone, so its
        # staging and reduction run under dK's product; without the mask the three products run
        # back to back and dQ's chain after them (each order the faster there: results/attention/ab_bwd128).
        dv = hopper.warpgroup_mma(gl.convert_layout(pT.to(dtype), a_l), do, dv, is_async=True)
        if DQ_UNDER_DK:
            mbarrier.wait(ds_ready.index(t), (i // SLOTS) & 1)
            dq = hopper.warpgroup_mma(ds_s.index(t).permute((1, 0)), k_cols, gl.zeros([BM, 64], gl.float32, q_l),
                                      use_acc=False, is_async=True)
        dk = hopper.warpgroup_mma(gl.convert_layout(dsT, a_l), q, dk, is_async=True)
        if DQ_UNDER_DK:
            dv, dq = hopper.warpgroup_mma_wait(1, deps=[dv, dq])  # products retire in order: dK's still runs
        else:
            dv, dk = hopper.warpgroup_mma_wait(0, deps=[dv, dk])
            mbarrier.arrive(ld_empty.index(s), count=1)  # Q, dO of slot s are read by no MMA of ours any more
            mbarrier.wait(ds_ready.index(t), (i // SLOTS) & 1)
            dq = hopper.warpgroup_mma(ds_s.index(t).permute((1, 0)), k_cols, gl.zeros([BM, 64], gl.float32, q_l),
                                      use_acc=False, is_async=True)
            dq = hopper.warpgroup_mma_wait(0, deps=[dq])
            mbarrier.arrive(ds_free.index(t), count=1)
        tma.store_wait(0)  # the previous tile's reduction has read the staging buffer
        gl.thread_barrier()
        red.store(dq * sm_scale)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(dq_desc, [row_q + i * BM, 64 * W], red)
        if DQ_UNDER_DK:
            dk = hopper.warpgroup_mma_wait(0, deps=[dk])
            mbarrier.arrive(ld_empty.index(s), count=1)
            mbarrier.arrive(ds_free.index(t), count=1)
    return dk, dv
# --8<-- [end:tiles]


@gluon.jit
def _math(L, Delta, DK, DV, dq_desc, k_s, v_s, q_s, do_s, ds_s, red_s, kv_bar, ld_full, ld_empty, ds_ready, ds_free,
          bh, k0, lo, n_iter, n_q, n_k, qk_scale, sm_scale, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
          SLOTS: gl.constexpr, CAUSAL: gl.constexpr, DQ_UNDER_DK: gl.constexpr,
          W: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    dtype: gl.constexpr = k_s.dtype
    key0 = k0 + 64 * W
    k_w = k_s.slice(64 * W, 64)  # (64 keys of W, D)
    v_w = v_s.slice(64 * W, 64)
    k_cols = k_s.slice(64 * W, 64, dim=1)  # (BN keys, the 64 dQ columns of W)
    red = red_s.index(W)
    offs_n = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_l))
    dk = gl.zeros([64, D], gl.float32, o_l)
    dv = gl.zeros([64, D], gl.float32, o_l)
    L_row = L + bh.to(gl.int64) * n_q
    D_row = Delta + bh.to(gl.int64) * n_q
    row_q = bh * n_q + lo
    n_diag = 0
    if CAUSAL:  # the tiles with queries below key0 + 64 cross this warpgroup's diagonal
        n_diag = gl.minimum((key0 + 64 - lo + BM - 1) // BM, n_iter)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _tiles(0, n_diag, dk, dv, offs_n, L_row, D_row, dq_desc, k_w, v_w, k_cols, q_s, do_s, ds_s, red,
                    ld_full, ld_empty, ds_ready, ds_free, lo, row_q, qk_scale, sm_scale, D, BM, STAGES, SLOTS, W,
                    True, DQ_UNDER_DK)
    dk, dv = _tiles(n_diag, n_iter, dk, dv, offs_n, L_row, D_row, dq_desc, k_w, v_w, k_cols, q_s, do_s, ds_s, red,
                    ld_full, ld_empty, ds_ready, ds_free, lo, row_q, qk_scale, sm_scale, D, BM, STAGES, SLOTS, W,
                    False, DQ_UNDER_DK)
    tma.store_wait(0)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
    out = rows[:, None] * D + offs_d[None, :]  # 32-bit offsets from a 64-bit base: int64 ones take
    base = (bh.to(gl.int64) * n_k + key0) * D  # 128 more registers per thread and spill
    gl.store(DK + base + out, (dk * sm_scale).to(dtype))
    gl.store(DV + base + out, dv.to(dtype))


@gluon.jit
def bwd128_ws_kernel(q_desc, k_desc, v_desc, do_desc, L, Delta, dq_desc, DK, DV, n_q, n_k, qk_scale, sm_scale, GROUP,
                     D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                     SLOTS: gl.constexpr, CAUSAL: gl.constexpr, DQ_UNDER_DK: gl.constexpr,
                     MATH_REGS: gl.constexpr):
    gl.static_assert(BN == 128, "two math warpgroups of 64 keys")
    n_tiles = gl.num_programs(0)
    lin = gl.program_id(0) + gl.program_id(1) * n_tiles
    n_bh = gl.num_programs(1)
    # Programs run in groups of GROUP heads (`bwd128_ws.heads_per_group`), so the programs running
    # at once read and add into the Q, dO and dQ of few heads, which then stay in L2 (one head at
    # a time was 11% faster than every head at once at the 8B step's shape); within a group the
    # first key blocks (causal: the most query tiles) first.
    g0 = lin // (GROUP * n_tiles) * GROUP
    g_size = gl.minimum(GROUP, n_bh - g0)
    r = lin - g0 * n_tiles
    bh = g0 + r % g_size
    tile = r // g_size
    k0 = tile * BN
    if CAUSAL:
        lo = k0
    else:
        lo = k0 * 0
    n_iter = (n_q - lo) // BM
    dtype: gl.constexpr = q_desc.dtype
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    qd_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    ds_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
    k_s = gl.allocate_shared_memory(dtype, [BN, D], kv_l)
    v_s = gl.allocate_shared_memory(dtype, [BN, D], kv_l)
    q_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qd_l)
    do_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qd_l)
    ds_s = gl.allocate_shared_memory(dtype, [SLOTS, BN, BM], ds_l)
    red_s = gl.allocate_shared_memory(gl.float32, [2, BM, 64], dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ld_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ld_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ld_full.index(s), count=1)
        mbarrier.init(ld_empty.index(s), count=2)  # both math warpgroups release a slot
    for t in gl.static_range(SLOTS):
        mbarrier.init(ds_ready.index(t), count=2)  # both halves of dS^T stored
        mbarrier.init(ds_free.index(t), count=2)  # both dQ matmuls have read it
    gl.warp_specialize([
        (_math, (L, Delta, DK, DV, dq_desc, k_s, v_s, q_s, do_s, ds_s, red_s, kv_bar, ld_full, ld_empty, ds_ready,
                 ds_free, bh, k0, lo, n_iter, n_q, n_k, qk_scale, sm_scale, D, BM, STAGES, SLOTS, CAUSAL, DQ_UNDER_DK,
                 0)),
        (_math, (L, Delta, DK, DV, dq_desc, k_s, v_s, q_s, do_s, ds_s, red_s, kv_bar, ld_full, ld_empty, ds_ready,
                 ds_free, bh, k0, lo, n_iter, n_q, n_k, qk_scale, sm_scale, D, BM, STAGES, SLOTS, CAUSAL, DQ_UNDER_DK,
                 1)),
        (_load, (q_desc, k_desc, v_desc, do_desc, k_s, v_s, q_s, do_s, kv_bar, ld_full, ld_empty, bh, k0, lo, n_iter,
                 n_q, n_k, D, BM, BN, STAGES)),
    ], [4, 1], [MATH_REGS, 24])
