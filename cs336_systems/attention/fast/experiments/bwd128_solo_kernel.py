"""An experiment: the head-dim-128 backward with one math warpgroup per program and two programs per
SM (`ab_bwd128 --versions solo`), against the committed kernel's two coupled warpgroups per program.

cuDNN's backward at d = 128 on the H200 is named `..._64x64x128_1x4x1_...`, which reads as 64 keys a
program and one warpgroup. Two such programs on an SM share nothing, so one's softmax-like work
runs under the other's products without any ping-pong; the price is twice the L2 traffic (each
program re-reads Q and dO and adds a whole (64, 128) dQ tile per query tile, for 64 keys instead of
128). This kernel tests that trade with the committed kernel's per-warpgroup code:

    loader (one warp): K, V of the program's 64 keys once, then Q and dO tiles of BM = 64 queries
        through a ring of STAGES slots
    math warpgroup, per query tile i (slot s):
        S^T = K Q^T, P^T = exp2(S^T c - L2), dP^T = V dO^T, dS^T = P^T (dP^T - Delta)
        dV += P^T dO, dK += dS^T Q (register operands); dS^T to shared memory
        dQ[:, 0:64] and dQ[:, 64:128] = dS K[:, half] * sm_scale, each staged in slot s's Q or dO
        buffer (free once dK's and dV's products are done) and added by a TMA bulk reduction; the
        slot goes back to the loader at the next tile, once those reductions have read it

Two programs fit an SM: 104 KB of buffers each (K, V 32; two slots of Q, dO 64; dS^T 8), and 128
registers a thread at launch, of which setmaxnreg gives the math warpgroup 232 and the loader 24. Triton 3.6's
Gluon; grid (key blocks of 64, Z*H); contiguous bf16/fp16, head dim 128; n_q a multiple of 64.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..gluon.flash_bwd128_ws_kernel import _load  # the committed kernel's loader, BN keys of K and V
from ..gluon.flash_bwd_ws_kernel import _tma_reduce_add

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _add_half(dq_desc, red, half, row, col):
    """Stage one (BM, 64) half of a tile's dQ in `red` and add it into dQ's fp32 sum by a bulk reduction."""
    red.store(half)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, [row, col], red)


@gluon.jit
def _tiles(i0, i1, dk, dv, offs_n, L_row, D_row, dq_desc, k_s, v_s, q_s, do_s, ds_s, ld_full, ld_empty, lo, row_q,
           qk_scale, sm_scale, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    q_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]), k_width=2)
    dtype: gl.constexpr = k_s.dtype
    red_l: gl.constexpr = dq_desc.layout
    for i in range(i0, i1):
        s = i % STAGES
        mbarrier.wait(ld_full.index(s), (i // STAGES) & 1)
        q = q_s.index(s)
        do = do_s.index(s)
        sT = hopper.warpgroup_mma(k_s, q.permute((1, 0)), gl.zeros([64, BM], gl.float32, s_l), use_acc=False,
                                  is_async=True)
        dpT = hopper.warpgroup_mma(v_s, do.permute((1, 0)), gl.zeros([64, BM], gl.float32, s_l), use_acc=False,
                                   is_async=True)
        if i > 0:  # the previous tile's reductions have read its slot: back to the loader
            tma.store_wait(0)
            gl.thread_barrier()
            mbarrier.arrive(ld_empty.index((i + STAGES - 1) % STAGES), count=1)
        offs_m = lo + i * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_l))
        L2 = gl.load(L_row + offs_m) * LOG2E
        sT = hopper.warpgroup_mma_wait(1, deps=[sT])
        pT = gl.exp2(sT * qk_scale - L2[None, :])
        if MASKED:
            pT = gl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        Di = gl.load(D_row + offs_m)
        dpT = hopper.warpgroup_mma_wait(0, deps=[dpT])
        dsT = (pT * (dpT - Di[None, :])).to(dtype)
        ds_s.store(dsT)  # the previous tile's dQ products were waited for: nothing reads it now
        fence_async_shared()
        gl.thread_barrier()
        dv = hopper.warpgroup_mma(gl.convert_layout(pT.to(dtype), a_l), do, dv, is_async=True)
        dk = hopper.warpgroup_mma(gl.convert_layout(dsT, a_l), q, dk, is_async=True)
        dq0 = hopper.warpgroup_mma(ds_s.permute((1, 0)), k_s.slice(0, 64, dim=1), gl.zeros([BM, 64], gl.float32, q_l),
                                   use_acc=False, is_async=True)
        dv, dk = hopper.warpgroup_mma_wait(1, deps=[dv, dk])  # in order: dQ's first half may still run
        dq1 = hopper.warpgroup_mma(ds_s.permute((1, 0)), k_s.slice(64, 64, dim=1),
                                   gl.zeros([BM, 64], gl.float32, q_l), use_acc=False, is_async=True)
        dq0 = hopper.warpgroup_mma_wait(1, deps=[dq0])
        # dQ's first half through Q's buffer (dK's product is done with it), the second through dO's
        _add_half(dq_desc, q._reinterpret(gl.float32, [BM, 64], red_l), dq0 * sm_scale, row_q + i * BM, 0)
        dq1 = hopper.warpgroup_mma_wait(0, deps=[dq1])
        _add_half(dq_desc, do._reinterpret(gl.float32, [BM, 64], red_l), dq1 * sm_scale, row_q + i * BM, 64)
    return dk, dv


@gluon.jit
def _math(L, Delta, DK, DV, dq_desc, k_s, v_s, q_s, do_s, ds_s, kv_bar, ld_full, ld_empty, bh, k0, lo, n_iter, n_q,
          n_k, qk_scale, sm_scale, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    dtype: gl.constexpr = k_s.dtype
    offs_n = k0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_l))
    dk = gl.zeros([64, D], gl.float32, o_l)
    dv = gl.zeros([64, D], gl.float32, o_l)
    L_row = L + bh.to(gl.int64) * n_q
    D_row = Delta + bh.to(gl.int64) * n_q
    row_q = bh * n_q + lo
    n_diag = 0
    if CAUSAL:  # 64 keys from lo = k0: only the first query tile crosses the diagonal
        n_diag = gl.minimum(1, n_iter)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _tiles(0, n_diag, dk, dv, offs_n, L_row, D_row, dq_desc, k_s, v_s, q_s, do_s, ds_s, ld_full, ld_empty,
                    lo, row_q, qk_scale, sm_scale, D, BM, STAGES, True)
    dk, dv = _tiles(n_diag, n_iter, dk, dv, offs_n, L_row, D_row, dq_desc, k_s, v_s, q_s, do_s, ds_s, ld_full,
                    ld_empty, lo, row_q, qk_scale, sm_scale, D, BM, STAGES, False)
    tma.store_wait(0)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
    out = rows[:, None] * D + offs_d[None, :]
    base = (bh.to(gl.int64) * n_k + k0) * D
    gl.store(DK + base + out, (dk * sm_scale).to(dtype))
    gl.store(DV + base + out, dv.to(dtype))


@gluon.jit
def bwd128_solo_kernel(q_desc, k_desc, v_desc, do_desc, L, Delta, dq_desc, DK, DV, n_q, n_k, qk_scale, sm_scale,
                       GROUP, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr):
    gl.static_assert(BN == 64, "one math warpgroup of 64 keys")
    n_tiles = gl.num_programs(0)
    lin = gl.program_id(0) + gl.program_id(1) * n_tiles
    n_bh = gl.num_programs(1)
    g0 = lin // (GROUP * n_tiles) * GROUP  # programs in groups of GROUP heads, as the committed kernel
    g_size = gl.minimum(GROUP, n_bh - g0)
    r = lin - g0 * n_tiles
    bh = g0 + r % g_size
    k0 = (r // g_size) * BN
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
    ds_s = gl.allocate_shared_memory(dtype, [BN, BM], ds_l)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ld_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ld_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ld_full.index(s), count=1)
        mbarrier.init(ld_empty.index(s), count=1)
    gl.warp_specialize([
        (_math, (L, Delta, DK, DV, dq_desc, k_s, v_s, q_s, do_s, ds_s, kv_bar, ld_full, ld_empty, bh, k0, lo, n_iter,
                 n_q, n_k, qk_scale, sm_scale, D, BM, STAGES, CAUSAL)),
        (_load, (q_desc, k_desc, v_desc, do_desc, k_s, v_s, q_s, do_s, kv_bar, ld_full, ld_empty, bh, k0, lo, n_iter,
                 n_q, n_k, D, BM, BN, STAGES)),
    ], [1], [LOADER_REGS])
