"""The head-dim-128 Gluon backward's A/B versions (`ab_bwd128` times them): each is the committed
kernel's source (`flash_bwd128_ws_kernel.py`) with one edit, an ablation that leaves a stage out
(to see what it costs) or a candidate change; `variant_source` writes one, and refuses where a line
it edits is not in the kernel as often as it expects. Kernels of their own (`OWN_KERNELS`) are
separate files of this package."""

from __future__ import annotations

import re
from pathlib import Path

KERNEL_FILE = Path(__file__).parents[1] / "gluon" / "flash_bwd128_ws_kernel.py"
VARIANT_PACKAGE = "cs336_systems.attention.fast.gluon"
NEVER = "        if row_q < 0:  # ablation: never true, not known at compile time\n"

REDUCE = ("        tma.store_wait(0)  # the previous tile's reduction has read the staging buffer\n"
          "        gl.thread_barrier()\n"
          "        red.store(dq * sm_scale)\n"
          "        fence_async_shared()\n"
          "        gl.thread_barrier()\n"
          "        _tma_reduce_add(dq_desc, [row_q + i * BM, 64 * W], red)\n")
# red2: two dQ staging buffers per math warpgroup. A bulk reduction reads its shared-memory source
# while L2 takes the adds, so with one buffer the next tile's store waits for the previous tile's
# reduction to drain (the no_reduce ablation: about 6 ms of 48 at the 8B step's cell); with two,
# tile i waits only for tile i - 2's. 32 KB more shared memory: fits with one dS^T slot.
RED_ALLOC = "    red_s = gl.allocate_shared_memory(gl.float32, [2, BM, 64], dq_desc.layout)\n"
RED_PICK = "    red = red_s.index(W)\n"
# A dQ add as the kernel writes it, with its tile's row
REDUCE_BLOCK = re.compile(
    r"(?P<ind> +)tma\.store_wait\(0\)[^\n]*\n(?P=ind)gl\.thread_barrier\(\)\n(?P=ind)red\.store\((?P<val>[^\n]*)\)\n"
    r"(?P=ind)fence_async_shared\(\)\n(?P=ind)gl\.thread_barrier\(\)\n"
    r"(?P=ind)_tma_reduce_add\(dq_desc, \[row_q \+ (?P<tile>[^\n]*?) \* BM, 64 \* W\], red\)\n")


def _two_buffers(m: re.Match) -> str:
    """One dQ add through the warpgroup's staging buffer of its tile's parity (red2)."""
    ind, val, tile = m["ind"], m["val"], m["tile"]
    lines = ["tma.store_wait(1)  # the reduction two tiles back has read this tile's staging buffer",
             "gl.thread_barrier()", f"red_i = red.index(2 * W + ({tile} & 1))", f"red_i.store({val})",
             "fence_async_shared()", "gl.thread_barrier()",
             f"_tma_reduce_add(dq_desc, [row_q + {tile} * BM, 64 * W], red_i)"]
    return "".join(ind + line + "\n" for line in lines)


# Rows named dq_first, one_wait, dq_own, dq_next (with red2), no_dq are of versions of dQ's chain
# written against the kernel before it took dq_first's order under the causal mask (DQ_UNDER_DK);
# the lines they edited are gone, and so are they.
DV_MMA = "        dv = hopper.warpgroup_mma(gl.convert_layout(pT.to(dtype), a_l), do, dv, is_async=True)\n"
DK_MMA = "        dk = hopper.warpgroup_mma(gl.convert_layout(dsT, a_l), q, dk, is_async=True)\n"

# Rows named dv_rs, dk_rs and dv_rs+dk_rs are of two versions the kernel has since taken in: P^T
# and dS^T as register operands of dV's and dK's products (they were read from shared memory).

# k_rs / v_rs: K_W (k_rs) or V_W (v_rs) loaded into registers once per program, as the left operand
# of every tile's S^T (k_rs) or dP^T (v_rs) product, so that those products read only Q or dO from
# shared memory; the price is 32 registers per thread for the whole program, beside dK and dV's 128.
KV_WAIT = "    mbarrier.wait(kv_bar, 0)\n"
TILES_KV = "dq_desc, k_w, v_w, k_cols, q_s, do_s, ds_s, red,"  # the two calls, not the def
KV_LAYOUT = ("gl.DotOperandLayout(operand_index=0, parent=gl.NVMMADistributedLayout(version=[3, 0], "
             "warps_per_cta=[4, 1], instr_shape=[16, BM, 16]), k_width=2)")


def _kv_in_registers(source: str, which: str) -> str:
    """K_W or V_W (`which`: "k" or "v") loaded into registers after the K, V load, for every tile."""
    load = f"    {which}_a = {which}_w.load({KV_LAYOUT})  # the program's {which.upper()}_W, from registers for every tile\n"
    calls = TILES_KV.replace(f"{which}_w", f"{which}_a")
    return source.replace(KV_WAIT, KV_WAIT + load).replace(TILES_KV, calls)


# delta_early / stats_first: Delta is loaded after P^T is computed, by when dP^T's product has
# likely retired, so the load's L2 latency may sit between the products with the tensor cores idle
# (both warpgroups at once). delta_early loads it beside L, behind S^T's product; stats_first loads
# both at the top of the iteration, before the wait for Q and dO. The price: Delta's 16 registers
# (and L's, for stats_first) live across the waits.
L_LOAD = ("        offs_m = lo + i * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, s_l))\n"
          "        L2 = gl.load(L_row + offs_m) * LOG2E\n")
D_LOAD = "        Di = gl.load(D_row + offs_m)\n"
TILE_TOP = "        s = i % STAGES\n        mbarrier.wait(ld_full.index(s), (i // STAGES) & 1)\n"


# dq_writer: a one-warp partition issues dQ's reductions (as FA3's dQ writer does): a math
# warpgroup stores its dQ tile into its staging buffer and signals dq_full, and waits (dq_empty)
# only for that buffer's previous reduction to have been read, instead of waiting for the bulk
# store itself and issuing it. Barriers as ds_ready / ds_free, phases by the tile index.
DQ_HANDOFF = ("        mbarrier.wait(dq_empty.index(W), (i & 1) ^ 1)  # the writer has issued and drained this buffer's last tile\n"
              "        red.store(dq * sm_scale)\n"
              "        fence_async_shared()\n"
              "        gl.thread_barrier()\n"
              "        mbarrier.arrive(dq_full.index(W), count=1)\n")
WRITER = '''@gluon.jit
def _dq_writer(dq_desc, red_s, dq_full, dq_empty, row_q, n_iter, BM: gl.constexpr):
    for i in range(n_iter):
        for W in gl.static_range(2):
            mbarrier.wait(dq_full.index(W), i & 1)
            _tma_reduce_add(dq_desc, [row_q + i * BM, 64 * W], red_s.index(W))
        tma.store_wait(1)  # warpgroup 0's reduction has read its buffer
        mbarrier.arrive(dq_empty.index(0), count=1)
        tma.store_wait(0)
        mbarrier.arrive(dq_empty.index(1), count=1)


'''
BARRIERS = "ds_ready, ds_free, lo, row_q"
MATH_DEF = "ld_empty, ds_ready, ds_free,\n          bh"
SPEC_ARGS = "ds_ready,\n                 ds_free, bh"
DS_FREE_ALLOC = "    ds_free = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())\n"
DS_FREE_INIT = "        mbarrier.init(ds_free.index(t), count=2)  # both dQ matmuls have read it\n"
KERNEL_DEF = "@gluon.jit\ndef bwd128_ws_kernel("
PARTITIONS = "    ], [4, 1], [MATH_REGS, 24])"


def _with_writer(source: str) -> str:
    return (source.replace(REDUCE, DQ_HANDOFF)
            .replace(BARRIERS, "ds_ready, ds_free, dq_full, dq_empty, lo, row_q")
            .replace(MATH_DEF, "ld_empty, ds_ready, ds_free, dq_full, dq_empty,\n          bh")
            .replace(SPEC_ARGS, "ds_ready,\n                 ds_free, dq_full, dq_empty, bh")
            .replace(DS_FREE_ALLOC, DS_FREE_ALLOC
                     + "    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())\n"
                     "    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())\n")
            .replace(DS_FREE_INIT, DS_FREE_INIT + "    for w in gl.static_range(2):\n"
                     "        mbarrier.init(dq_full.index(w), count=1)\n        mbarrier.init(dq_empty.index(w), count=1)\n")
            .replace(KERNEL_DEF, WRITER + KERNEL_DEF)
            .replace(PARTITIONS, "        (_dq_writer, (dq_desc, red_s, dq_full, dq_empty, bh * n_q + lo, n_iter, BM)),\n"
                     "    ], [4, 1, 1], [MATH_REGS, 24, 24])"))


# atomics: dQ's adds straight from registers (vector fp32 atomics, two columns a thread-instruction),
# as the Triton kernels add it, instead of staging each tile in shared memory for a bulk reduction:
# no staging store, fence, barriers or wait for the previous tile's reduction, and none of the
# staging's shared-memory traffic; L2 gets the same bytes as many small requests.
# The kernel's dq_desc takes dQ's fp32 tensor itself (`pointer_dq`).
ATOMIC_ADD = ("        dq_row = dq_desc + (row_q + i * BM).to(gl.int64) * D  # 64-bit base, 32-bit offsets\n"
              "        dq_m = gl.arange(0, BM, layout=gl.SliceLayout(1, q_l))\n"
              "        dq_d = 64 * W + gl.arange(0, 64, layout=gl.SliceLayout(0, q_l))\n"
              "        gl.atomic_add(dq_row + dq_m[:, None] * D + dq_d[None, :], dq * sm_scale, sem=\"relaxed\")\n")
POINTER_DQ = {"atomics"}  # versions whose kernel takes dQ's fp32 tensor in place of its tensor map


def pointer_dq(version: str) -> bool:
    """Whether the version's kernel adds into dQ by pointer (its dq_desc argument is the tensor)."""
    return any(part in POINTER_DQ for part in version.split("+"))


# dv_early: dV's product needs only P^T and dO, so it is issued as soon as P^T is (before the wait
# for dP^T), and runs while dS^T is computed and stored; groups retire in order, so waiting with
# one outstanding still finds dP^T done. P^T's bf16 operand lives a little longer.
DP_WAIT = "        dpT = hopper.warpgroup_mma_wait(0, deps=[dpT])\n"
# dq_under_dk / dq_after_dk: the kernel's dQ order (DQ_UNDER_DK, which the launcher sets from the
# mask) forced one way under either mask, to time either order anywhere
ORDER_IF = "        if DQ_UNDER_DK:\n"
# add_next: tile i's dQ add (staging store, fence, barriers, bulk reduction) moved into tile i + 1,
# after its S^T and dP^T products are issued, so that it runs under them instead of on the
# warpgroup's path between dQ's product and the next tile (without the mask the adds cost 16%,
# results/attention/ab_bwd128, call 65); dV's and dK's products first, then dQ's, under either
# mask. dQ (32 registers) lives across the loop's back edge; the last tile's add after the loops.
# dk_split: dK's product split by its columns into two (64, 64) accumulators, issued as dV, dK's
# first half, (wait for both halves of dS^T) dQ, dK's second half: the wait for the other
# warpgroup runs under dV's and a half of dK's products, and dQ's staging and reduction under the
# second half, under either mask (the staging on the warpgroup's path costs ~8-11% without the
# mask: no_staging, call 66). The same registers: two halves of dK's 64.
# Both keep the committed loop up to dS^T's hand-off (HEAD_END) and replace what follows.
TILES_CALL_ARGS = "dk, dv, offs_n, L_row, D_row,"  # in the def and the two calls
DPT_ISSUE = ("        dpT = hopper.warpgroup_mma(v_w, do.permute((1, 0)), gl.zeros([64, BM], gl.float32, s_l), "
             "use_acc=False,\n                                   is_async=True)\n")
HEAD_END = "        mbarrier.arrive(ds_ready.index(t), count=1)\n"
RETURN = "    return dk, dv\n"
MATH_ZEROS = "    dv = gl.zeros([64, D], gl.float32, o_l)\n"
MATH_TAIL = "    tma.store_wait(0)\n    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))\n"
A_LAYOUT_END = "instr_shape=[16, D, 16]), k_width=2)\n"  # the end of a_l's definition in _tiles
DK_ZEROS = "    dk = gl.zeros([64, D], gl.float32, o_l)\n"
DK_STORE = "    gl.store(DK + base + out, (dk * sm_scale).to(dtype))\n"
DV_DK = DV_MMA + DK_MMA  # dV's and dK's products, as committed
ADD_NEXT_TAIL = DV_DK + """        mbarrier.wait(ds_ready.index(t), (i // SLOTS) & 1)
        dq = hopper.warpgroup_mma(ds_s.index(t).permute((1, 0)), k_cols, gl.zeros([BM, 64], gl.float32, q_l),
                                  use_acc=False, is_async=True)
        dv, dk = hopper.warpgroup_mma_wait(1, deps=[dv, dk])  # in order: dQ's may still run
        mbarrier.arrive(ld_empty.index(s), count=1)
        dq = hopper.warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free.index(t), count=1)
    return dk, dv, dq
"""
DK_SPLIT_TAIL = DV_MMA + """        ds_a = gl.convert_layout(dsT, a_h)
        dk_lo = hopper.warpgroup_mma(ds_a, q.slice(0, D // 2, dim=1), dk_lo, is_async=True)
        mbarrier.wait(ds_ready.index(t), (i // SLOTS) & 1)
        dq = hopper.warpgroup_mma(ds_s.index(t).permute((1, 0)), k_cols, gl.zeros([BM, 64], gl.float32, q_l),
                                  use_acc=False, is_async=True)
        dk_hi = hopper.warpgroup_mma(ds_a, q.slice(D // 2, D // 2, dim=1), dk_hi, is_async=True)
        dv, dk_lo, dq = hopper.warpgroup_mma_wait(1, deps=[dv, dk_lo, dq])  # in order: dK's second half runs
        mbarrier.arrive(ds_free.index(t), count=1)
""" + REDUCE + """        dk_hi = hopper.warpgroup_mma_wait(0, deps=[dk_hi])
        mbarrier.arrive(ld_empty.index(s), count=1)
    return dk_lo, dk_hi, dv
"""
A_HALF = ("    a_h: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=gl.NVMMADistributedLayout(\n"
          "        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D // 2, 16]), k_width=2)\n")


def _dq_add(tile: str, indent: str) -> str:
    """The kernel's dQ add (REDUCE) for query tile `tile`, at `indent`."""
    lines = REDUCE.replace("i * BM", f"{tile} * BM").splitlines()
    return "".join(indent + line.strip() + "\n" for line in lines)


def _new_tail(source: str, tail: str) -> str:
    """The source with everything of _tiles' loop after dS^T's hand-off replaced by `tail`."""
    i = source.index(HEAD_END) + len(HEAD_END)
    return source[:i] + tail + source[source.index(RETURN, i) + len(RETURN):]


def _add_next(source: str) -> str:
    q_l = ("    q_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
           "instr_shape=[16, 64, 16])\n    dq = gl.zeros([BM, 64], gl.float32, q_l)  # carried: each tile's add runs in the next\n")
    source = _new_tail(source, ADD_NEXT_TAIL).replace(
        DPT_ISSUE, DPT_ISSUE + "        if i > 0:  # the previous tile's dQ add, under this tile's two products\n"
        + _dq_add("(i - 1)", " " * 12))
    last = "    if n_iter > 0:  # the last tile's dQ add\n" + _dq_add("(n_iter - 1)", " " * 8)
    return (source.replace(TILES_CALL_ARGS, "dk, dv, dq, offs_n, L_row, D_row,")
            .replace("    dk, dv = _tiles(", "    dk, dv, dq = _tiles(")
            .replace(MATH_ZEROS, MATH_ZEROS + q_l).replace(MATH_TAIL, last + MATH_TAIL))


def _dk_split(source: str) -> str:
    halves = ("    h_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], "
              "instr_shape=[16, D // 2, 16])\n"
              "    dk_lo = gl.zeros([64, D // 2], gl.float32, h_l)  # dK's columns 0 .. D/2 - 1\n"
              "    dk_hi = gl.zeros([64, D // 2], gl.float32, h_l)\n")
    store = ("    cols_h = gl.arange(0, D // 2, layout=gl.SliceLayout(0, h_l))\n"
             "    rows_h = gl.arange(0, 64, layout=gl.SliceLayout(1, h_l))\n"
             "    out_h = rows_h[:, None] * D + cols_h[None, :]\n"
             "    gl.store(DK + base + out_h, (dk_lo * sm_scale).to(dtype))\n"
             "    gl.store(DK + base + D // 2 + out_h, (dk_hi * sm_scale).to(dtype))\n")
    return (_new_tail(source, DK_SPLIT_TAIL).replace(A_LAYOUT_END, A_LAYOUT_END + A_HALF, 1)
            .replace(TILES_CALL_ARGS, "dk_lo, dk_hi, dv, offs_n, L_row, D_row,")
            .replace("    dk, dv = _tiles(", "    dk_lo, dk_hi, dv = _tiles(")
            .replace(DK_ZEROS, halves).replace(DK_STORE, store))


# no_bulk / no_staging: ablations that split dQ's add into its two halves (dQ wrong either way):
# no_bulk stages each tile in shared memory as the kernel does but issues no bulk reduction (what
# the adds' L2 traffic costs); no_staging issues the reduction from the staging buffer as it is,
# without the store, fence and barriers before it (what the staging costs on the warpgroup's path)
# no_store leaves out only the staging's store (the fence, the barriers and the reduction stay):
# whether the staging costs its shared-memory writes or its synchronisation
BULK_ADD = REDUCE.splitlines(keepends=True)[-1]  # the reduction's line
STAGING = REDUCE[:-len(BULK_ADD)]  # the store_wait, store, fence and barriers before it
STAGING_STORE = "        red.store(dq * sm_scale)\n"
# the ablations that leave one block of the kernel out (guarded by a condition never true); dQ is
# wrong in each, so the A/B run checks only dK and dV
LEFT_OUT = {"no_reduce": REDUCE, "no_bulk": BULK_ADD, "no_staging": STAGING, "no_store": STAGING_STORE}


# the markers a version edits in more than one place (every other is edited exactly once)
MARKER_COUNTS = {TILES_KV: 2, SPEC_ARGS: 2, BARRIERS: 3, ORDER_IF: 3, TILES_CALL_ARGS: 3}


VERSIONS = {
    "full": "the kernel as committed",
    "red2": "two dQ staging buffers per warpgroup, tile i's reduction drains behind tile i + 1 (slots 1)",
    "delta_early": "Delta loaded beside L, behind S^T's product (not after P^T)",
    "dv_early": "dV's product issued right after P^T, before the wait for dP^T (it runs under dS^T's work)",
    "dq_writer": "a one-warp partition issues dQ's reductions; the math warpgroups only stage and signal",
    "stats_first": "L and Delta loaded at the top of each iteration, before the wait for Q and dO",
    "k_rs": "K_W in registers for the whole program, the left operand of every S^T product",
    "v_rs": "V_W in registers for the whole program, the left operand of every dP^T product",
    "atomics": "dQ's adds as fp32 vector atomics from registers, no shared-memory staging",
    "add_next": "each tile's dQ add in the next tile, under its S^T and dP^T products (dV, dK, then dQ)",
    "dk_split": "dK's product in two column halves: dV, dK's first, dQ, dK's second (the adds under it)",
    "no_reduce": "ablation: dQ's matmul, not its adds (dQ wrong)",
    "no_bulk": "ablation: dQ staged in shared memory, no bulk reduction (dQ wrong)",
    "no_staging": "ablation: the bulk reduction without the staging store, fence and barriers (dQ wrong)",
    "no_store": "ablation: the staging without its store (fence, barriers and reduction kept; dQ wrong)",
    "dq_under_dk": "dQ's product between dV's and dK's, its adds under dK's, under either mask (the causal order)",
    "dq_after_dk": "dQ's product and adds after dV's and dK's, under either mask (the order without the mask)",
}


DQ_WRONG = tuple(LEFT_OUT)  # ablations whose dQ is not checked


def _guard(block: str) -> str:
    return NEVER + "".join("    " + line + "\n" for line in block.splitlines())


def variant_source(name: str, source: str) -> str:
    """The kernel file's text for one version (raises if a line it edits is not there once, or as
    often as MARKER_COUNTS says)."""
    if "+" in name:  # versions applied one after the other
        for part in name.split("+"):
            source = variant_source(part, source)
        return source
    needs = {"full": (), "red2": (RED_ALLOC, RED_PICK), "k_rs": (KV_WAIT, TILES_KV), "v_rs": (KV_WAIT, TILES_KV),
             "atomics": (REDUCE, RED_ALLOC, RED_PICK),
             "add_next": (TILES_CALL_ARGS, MATH_ZEROS, MATH_TAIL, DPT_ISSUE, HEAD_END, RETURN),
             "dk_split": (TILES_CALL_ARGS, DK_ZEROS, DK_STORE, HEAD_END, RETURN),
             "dq_under_dk": (ORDER_IF,), "dq_after_dk": (ORDER_IF,),
             "delta_early": (L_LOAD, D_LOAD), "stats_first": (L_LOAD, D_LOAD, TILE_TOP), "dv_early": (DV_MMA, DP_WAIT),
             "dq_writer": (REDUCE, BARRIERS, MATH_DEF, SPEC_ARGS, DS_FREE_ALLOC, DS_FREE_INIT, KERNEL_DEF, PARTITIONS),
             **{k: (block,) for k, block in LEFT_OUT.items()}}.get(name, ())
    for marker in needs:
        if source.count(marker) != (n := MARKER_COUNTS.get(marker, 1)):
            raise ValueError(f"ab_bwd128: kernel source has {source.count(marker)} copies of {marker.strip()[:60]!r}, not {n}")
    if name == "full":
        return source
    if name == "dv_early":
        return source.replace(DV_MMA, "").replace(DP_WAIT, DV_MMA + DP_WAIT.replace(
            "warpgroup_mma_wait(0, deps=[dpT])", "warpgroup_mma_wait(1, deps=[dpT])  # dV's may still run"))
    if name == "dq_writer":
        return _with_writer(source)
    if name == "delta_early":
        return source.replace(D_LOAD, "").replace(L_LOAD, L_LOAD + D_LOAD)
    if name == "stats_first":
        return source.replace(D_LOAD, "").replace(L_LOAD, "").replace(TILE_TOP, L_LOAD + D_LOAD + TILE_TOP)
    if name in ("k_rs", "v_rs"):
        return _kv_in_registers(source, name[0])
    if name == "red2":  # every dQ add of the source
        source, adds = REDUCE_BLOCK.subn(_two_buffers, source)
        if adds == 0:
            raise ValueError("ab_bwd128: kernel source has 0 copies of the dQ add (store_wait, store, reduce)")
        return (source.replace(RED_ALLOC, RED_ALLOC.replace("[2, BM, 64]", "[4, BM, 64]"))
                .replace(RED_PICK, "    red = red_s  # (4, BM, 64): warpgroup W's two at 2 W and 2 W + 1\n"))
    if name in LEFT_OUT:
        return source.replace(LEFT_OUT[name], _guard(LEFT_OUT[name]))
    if name == "dk_split":
        return _dk_split(source)
    if name == "add_next":
        return _add_next(source)
    if name == "atomics":
        return (source.replace(REDUCE, ATOMIC_ADD).replace(RED_ALLOC, "    red_s = 0  # no staging buffers\n")
                .replace(RED_PICK, "    red = 0  # no staging buffer\n"))
    if name in ("dq_under_dk", "dq_after_dk"):  # a constant the compiler folds, as the constexpr
        return source.replace(ORDER_IF, ORDER_IF.replace("DQ_UNDER_DK", str(name == "dq_under_dk")))
    raise ValueError(f"ab_bwd128: unknown version {name!r}; choose from {list(VERSIONS)}")


# versions that are kernels of their own, not edits of the committed one
OWN_KERNELS = {"solo": "one math warpgroup of 64 keys a program, two programs an SM (bwd128_solo_kernel.py)"}
SOLO_FILE = Path(__file__).parent / "bwd128_solo_kernel.py"
