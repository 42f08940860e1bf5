"""The head-dim-128 backward's A/B versions (experiments/ab_bwd128.py): each is the committed
kernel's source with its edits applied exactly once, and still a Python module. Their speed and
correctness are the GPU run's (`just bench flash-ab-bwd128`: each version is checked against the
Triton backward before it is timed); Gluon has no CPU interpreter."""

import ast

import pytest

from cs336_systems.attention.fast.experiments import ab_bwd128
from cs336_systems.attention.fast.experiments import bwd128_versions as versions

SOURCE = versions.KERNEL_FILE.read_text()


@pytest.mark.parametrize("version", [*versions.VERSIONS, "dv_early+dq_writer"])
def test_every_version_edits_the_committed_kernel(version):
    edited = versions.variant_source(version, SOURCE)
    ast.parse(edited)
    assert (edited == SOURCE) == (version == "full")


def test_red2_gives_each_warpgroup_two_staging_buffers_and_waits_for_the_older():
    edited = versions.variant_source("red2", SOURCE)
    assert "[4, BM, 64]" in edited and "[2, BM, 64]" not in edited
    assert "tma.store_wait(1)" in edited and "red.index(2 * W + (i & 1))" in edited


def test_an_unknown_version_or_a_missing_line_is_refused():
    with pytest.raises(ValueError, match="unknown version"):
        versions.variant_source("nope", SOURCE)
    with pytest.raises(ValueError, match="copies of"):
        versions.variant_source("red2", SOURCE.replace(versions.RED_PICK, ""))
    with pytest.raises(ValueError, match="the dQ add"):
        versions.variant_source("red2", SOURCE.replace("tma.store_wait(0)", "tma.store_wait(2)"))


def test_under_the_mask_the_kernel_issues_dq_between_dv_and_dk_and_adds_it_under_dk():
    # the order the rows named dq_first measured (results/attention/ab_bwd128): faster causal, slower not
    from cs336_systems.attention.fast.gluon.bwd128_ws import _constexprs

    tiles = SOURCE[SOURCE.index("def _tiles"):SOURCE.index("return dk, dv")]
    order = [tiles.index(x) for x in ("dv = hopper.warpgroup_mma(", "if DQ_UNDER_DK:", "dq = hopper.warpgroup_mma(",
                                      "dk = hopper.warpgroup_mma(", "warpgroup_mma_wait(1, deps=[dv, dq])",
                                      "_tma_reduce_add(", "dk = hopper.warpgroup_mma_wait(0, deps=[dk])")]
    assert order == sorted(order)
    assert _constexprs(128, True, 3, 1)["DQ_UNDER_DK"] and not _constexprs(128, False, 2, 2)["DQ_UNDER_DK"]


def test_the_committed_kernel_takes_dv_and_dks_left_operands_from_registers():
    # the rows named dv_rs, dk_rs in results/attention/ab_bwd128 measured this against shared memory
    assert versions.DV_MMA in SOURCE and versions.DK_MMA in SOURCE
    assert "p_w" not in SOURCE  # P^T has no shared-memory buffer


def test_dq_writer_moves_every_reduction_into_its_own_partition():
    edited = versions.variant_source("dq_writer", SOURCE)
    tiles = edited[edited.index("def _tiles"):edited.index("return dk, dv")]
    writer = edited[edited.index("def _dq_writer"):edited.index("def bwd128_ws_kernel")]
    assert "_tma_reduce_add(" not in tiles and "store_wait" not in tiles  # the math only stages and signals
    assert tiles.index("mbarrier.wait(dq_empty") < tiles.index("red.store(") < tiles.index("mbarrier.arrive(dq_full")
    assert writer.count("_tma_reduce_add(") == 1 and "mbarrier.wait(dq_full" in writer
    assert "(_dq_writer, (" in edited and "[4, 1, 1], [MATH_REGS, 24, 24]" in edited


def test_dv_early_issues_dvs_product_before_the_wait_for_dpt():
    tiles = versions.variant_source("dv_early", SOURCE)
    tiles = tiles[tiles.index("def _tiles"):tiles.index("return dk, dv")]
    assert tiles.count("dv = hopper.warpgroup_mma(") == 1
    order = [tiles.index(x) for x in ("pT = gl.exp2(", "dv = hopper.warpgroup_mma(", "warpgroup_mma_wait(1, deps=[dpT])",
                                      "dsT = (pT * (dpT - Di", "dk = hopper.warpgroup_mma(")]
    assert order == sorted(order)


def test_the_order_versions_fix_the_dq_order_under_either_mask():
    for version, want in (("dq_under_dk", "if True:"), ("dq_after_dk", "if False:")):
        tiles = versions.variant_source(version, SOURCE)
        tiles = tiles[tiles.index("def _tiles"):tiles.index("return dk, dv")]
        assert "if DQ_UNDER_DK:" not in tiles and tiles.count(want) == 3


def test_atomics_adds_dq_by_pointer_with_no_staging():
    edited = versions.variant_source("atomics", SOURCE)
    tiles = edited[edited.index("def _tiles"):edited.index("return dk, dv")]
    assert "gl.atomic_add(dq_row" in tiles and "_tma_reduce_add(" not in tiles and "red.store(" not in tiles
    assert "red_s = 0" in edited and "allocate_shared_memory(gl.float32" not in edited
    assert versions.pointer_dq("atomics") and versions.pointer_dq("dv_early+atomics")
    assert not versions.pointer_dq("full")


def test_the_solo_kernels_launch_fits_two_programs_an_sm():
    import torch

    x = torch.empty(2, 3, 256, 128, dtype=torch.bfloat16)
    vec = torch.empty(2, 3, 256)
    grid, args, constexprs, dq, dk, dv = ab_bwd128.solo_args(x, x, x, x, vec, vec, True, 2)
    assert grid == (256 // ab_bwd128.SOLO_BN, 6) and dq.dtype == torch.float32 and dk.shape == x.shape
    # 8 warps (the loader padded to a warpgroup) of 128 registers: 32K of the SM's 64K a program
    assert constexprs["maxnreg"] * 32 * 8 == 65536 // 2 and constexprs["BN"] == 64
    with pytest.raises(ValueError, match="multiple of"):
        ab_bwd128.solo_args(x[:, :, :100], x, x, x, vec, vec, True, 2)
