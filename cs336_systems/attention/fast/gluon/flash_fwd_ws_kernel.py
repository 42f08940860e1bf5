"""The FlashAttention-2 forward in Gluon, with FA3's structure at head dim 64 (warp specialisation):
the forward of the table entries that say `gluon_ws` (the tuner times it as kernel "fwd_ws");
`fwd_ws.py` launches it.

A program owns BM = 64 * NW queries of one (batch, head):

    one loader partition (a warp; `_load`): the program's NW query tiles once, then the key and
        value tiles of BN keys through a TMA ring of STAGES slots (mbarriers full/empty; a slot is
        free again when every consumer warpgroup has released it)
    NW consumer partitions (a warpgroup each; `_math`), each owning 64 query rows: per key tile j,
            S_j = Q K_j^T,  m = max(m, rowmax(S_j) c),  P_j = exp2(S_j c - m),
            l = l alpha + rowsum(P_j),  O = O alpha + P_j V_j
        with S_j issued before P_{j-1} V_{j-1} (`_step`), so tile j's exponentials run while the
        tensor cores do the previous tile's PV (FA3's intra-warpgroup overlap). Under the causal
        mask only the tiles that cross the diagonal compare indices (a loop of their own).

Why three warpgroups of 64 rows and 64-key tiles: measured (the chapter): two warpgroups with
128-key tiles were slower than our Triton forward, three with 64-key tiles slightly faster; three
with 128-key tiles spill (the registers are split over 16 warps: Gluon pads the loader warp to a
warpgroup). Written against Triton 3.6's Gluon API, the GPU's version. Grid (query tiles of BM,
Z*H); contiguous bf16/fp16 inputs, head dim 64, n_k a multiple of BN (n_q ragged is fine: rows
past the end are computed and not stored).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _load(q_desc, k_desc, v_desc, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_k, n_tiles,
          D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, NW: gl.constexpr):
    mbarrier.expect(q_bar, NW * 64 * D * 2)
    for w in gl.static_range(NW):
        tma.async_copy_global_to_shared(q_desc, [bh * n_q + m0 + 64 * w, 0], q_bar, q_s.index(w))
    for j in range(n_tiles):
        s = j % STAGES
        mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(kv_full.index(s), 2 * BN * D * 2)
        tma.async_copy_global_to_shared(k_desc, [bh * n_k + j * BN, 0], kv_full.index(s), k_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [bh * n_k + j * BN, 0], kv_full.index(s), v_s.index(s))


@gluon.jit
def _softmax(S, m_i, l_i, offs_m, j, qk_scale, BN: gl.constexpr, MASKED: gl.constexpr):
    """One tile's online-softmax update: P (fp32), the new m, l and the rescale alpha of O."""
    if MASKED:
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S.type.layout))
        S = gl.where(offs_m[:, None] >= offs_n[None, :], S, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(S, 1) * qk_scale)
    p = gl.exp2(S * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


# --8<-- [start:step]
@gluon.jit
def _step(j, acc, p, m_i, l_i, offs_m, q, k_s, v_s, kv_full, kv_empty, qk_scale,
          BN: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr):
    """Tile j's S and softmax while P_{j-1} V_{j-1} runs on the tensor cores."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = acc.type.layout
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    s = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(kv_full.index(s), (j // STAGES) & 1)
    S = hopper.warpgroup_mma(q, k_s.index(s).permute((1, 0)), gl.zeros([64, BN], gl.float32, s_l),
                             use_acc=False, is_async=True)
    acc = hopper.warpgroup_mma(gl.convert_layout(p.to(q.dtype), p_l), v_s.index(prev), acc, is_async=True)
    S = hopper.warpgroup_mma_wait(1, deps=[S])
    p, m_i, l_i, alpha = _softmax(S, m_i, l_i, offs_m, j, qk_scale, BN, MASKED)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(kv_empty.index(prev), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
    return acc, p, m_i, l_i
# --8<-- [end:step]


@gluon.jit
def _first(q, k_s, kv_full, m_i, l_i, offs_m, qk_scale, BN: gl.constexpr, MASKED: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    mbarrier.wait(kv_full.index(0), 0)
    S = hopper.warpgroup_mma(q, k_s.index(0).permute((1, 0)), gl.zeros([64, BN], gl.float32, s_l),
                             use_acc=False, is_async=True)
    S = hopper.warpgroup_mma_wait(0, deps=[S])
    p, m_i, l_i, alpha = _softmax(S, m_i, l_i, offs_m, 0, qk_scale, BN, MASKED)
    return p, m_i, l_i


@gluon.jit
def _math(O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
          D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, W: gl.constexpr):
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    q = q_s.index(W)
    row0 = m0 + W * 64
    offs_m = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_l))
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_l))
    acc = gl.zeros([64, D], gl.float32, o_l)
    mbarrier.wait(q_bar, 0)
    if n_full > 0:
        p, m_i, l_i = _first(q, k_s, kv_full, m_i, l_i, offs_m, qk_scale, BN, False)
    else:
        p, m_i, l_i = _first(q, k_s, kv_full, m_i, l_i, offs_m, qk_scale, BN, True)
    for j in range(1, n_full):
        acc, p, m_i, l_i = _step(j, acc, p, m_i, l_i, offs_m, q, k_s, v_s, kv_full, kv_empty, qk_scale,
                                 BN, STAGES, False)
    for j in range(gl.maximum(n_full, 1), n_tiles):  # the diagonal tile(s): masked
        acc, p, m_i, l_i = _step(j, acc, p, m_i, l_i, offs_m, q, k_s, v_s, kv_full, kv_empty, qk_scale,
                                 BN, STAGES, True)
    last = (n_tiles - 1) % STAGES
    acc = hopper.warpgroup_mma(gl.convert_layout(p.to(q.dtype), p_l), v_s.index(last), acc, is_async=True)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(kv_empty.index(last), count=1)
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_l))
    o = acc / l_o[:, None]
    rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    gl.store(O + (bh.to(gl.int64) * n_q + rows)[:, None] * D + cols[None, :], o.to(O.dtype.element_ty),
             mask=(rows < n_q)[:, None])
    gl.store(L + bh.to(gl.int64) * n_q + offs_m, (m_i + gl.log2(l_i)) * LN2, mask=offs_m < n_q)


@gluon.jit
def fwd_ws_kernel(q_desc, k_desc, v_desc, O, L, n_q, n_k, qk_scale, GROUP,
                  D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  MATH_REGS: gl.constexpr, NW: gl.constexpr):
    BM: gl.constexpr = 64 * NW
    n_tiles_m = gl.num_programs(0)
    n_bh = gl.num_programs(1)
    lin = gl.program_id(0) + gl.program_id(1) * n_tiles_m
    # Programs run in groups of GROUP heads (the launcher picks it: `fwd_ws.heads_per_group`), so
    # the programs running at once read the K and V of few heads, which then stay in L2; within
    # a group the longest programs (last query tiles, causal) first. GROUP = n_bh: one group.
    g0 = lin // (GROUP * n_tiles_m) * GROUP
    g_size = gl.minimum(GROUP, n_bh - g0)
    r = lin - g0 * n_tiles_m
    bh = g0 + r % g_size
    if CAUSAL:
        tile = n_tiles_m - 1 - r // g_size
    else:
        tile = r // g_size
    m0 = tile * BM
    if CAUSAL:  # key tiles up to the last query's diagonal; those before the first query's need no mask
        n_tiles = (gl.minimum(m0 + BM, n_k) + BN - 1) // BN
        n_full = gl.minimum(m0 // BN, n_tiles)
    else:
        n_tiles = n_k // BN
        n_full = n_tiles
    dtype: gl.constexpr = q_desc.dtype
    q_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D], dtype)
    kv_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    q_s = gl.allocate_shared_memory(dtype, [NW, 64, D], q_l)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_l)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_l)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_full.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=NW)  # every consumer warpgroup releases a slot
    # one consumer partition per warpgroup, W picking its rows (the (function, args) pairs are spelled
    # out in each list: jit code cannot build the list in a loop)
    if NW == 2:
        gl.warp_specialize([
            (_math, (O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
                     D, BN, STAGES, CAUSAL, 0)),
            (_math, (O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
                     D, BN, STAGES, CAUSAL, 1)),
            (_load, (q_desc, k_desc, v_desc, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_k, n_tiles,
                     D, BN, STAGES, NW)),
        ], [4, 1], [MATH_REGS, 24])
    else:
        gl.warp_specialize([
            (_math, (O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
                     D, BN, STAGES, CAUSAL, 0)),
            (_math, (O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
                     D, BN, STAGES, CAUSAL, 1)),
            (_math, (O, L, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_full, n_tiles, qk_scale,
                     D, BN, STAGES, CAUSAL, 2)),
            (_load, (q_desc, k_desc, v_desc, q_s, k_s, v_s, q_bar, kv_full, kv_empty, bh, m0, n_q, n_k, n_tiles,
                     D, BN, STAGES, NW)),
        ], [4, 4, 1], [MATH_REGS, MATH_REGS, 24])
