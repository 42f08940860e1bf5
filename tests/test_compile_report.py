"""The offline compile report's reading of SASS (`tuning/compile_report.innermost_loop_spills`), on a
made-up listing: spills counted per innermost loop with tensor-core products, set-up code left out."""

from __future__ import annotations

from cs336_systems.attention.fast.tuning.compile_report import innermost_loop_spills

SASS = """
        /*0000*/                   STL [R1], R2 ;
.L_x_0:
        /*0010*/                   LDL R3, [R1] ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0030*/                   LDL R4, [R1+0x4] ;
        /*0040*/                   STL [R1+0x8], R4 ;
        /*0050*/               @P0 BRA `(.L_x_1) ;
        /*0060*/               @P1 BRA `(.L_x_0) ;
.L_x_2:
        /*0070*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0080*/                   LDL R6, [R1+0xc] ;
        /*0090*/               @P2 BRA `(.L_x_2) ;
.L_x_3:
        /*00a0*/                   HGMMA.64x128x16.F32.BF16 R88, R200, gdesc[UR4].tnspB, R88 ;
        /*00b0*/               @P3 BRA `(.L_x_3) ;
        /*00c0*/                   EXIT ;
"""


def test_spills_are_counted_in_the_innermost_tile_loops_only():
    # .L_x_1 (inside .L_x_0) holds two spills; .L_x_0 is not innermost; .L_x_2 has no product;
    # .L_x_3 is a tile loop without spills; the set-up STL at 0x0 is in no loop
    assert innermost_loop_spills(SASS) == [2, 0]
