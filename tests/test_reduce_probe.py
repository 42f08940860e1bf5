"""The dQ-add probe adds what the one-pass backward adds (on the interpreter: atomics and stores)."""

from __future__ import annotations

import pytest
import torch

from tests.triton_mode import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)  # reduce_probe imports triton at its top

from cs336_systems.attention.fast.experiments import reduce_probe  # noqa: E402
from tests.triton_mode import DEVICE, ON_GPU, pytestmark  # noqa: F401


@pytest.mark.skipif(ON_GPU, reason="the interpreter's check; on a GPU `just bench flash-reduce-probe` is the run")
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 32)])
@pytest.mark.parametrize("mode", ["atomics", "store"])
def test_each_key_tile_adds_into_the_query_tiles_at_and_after_its_diagonal(block_m, block_n, mode):
    bh, seq, d = 2, 64, 16
    fn, dq, nbytes = reduce_probe.run_probe(bh, seq, d, block_m, block_n, mode, num_warps=1, device=DEVICE)
    fn()
    want, last, pairs = torch.zeros(seq), torch.zeros(seq), 0
    for t in range(seq // block_n):  # key tile t adds (1 + t) to every query tile from t * block_n on
        for start in range(t * block_n, seq, block_m):
            want[start:start + block_m] += 1 + t
            last[start:start + block_m] = 1 + t  # what plain stores leave: the last writer's value
            pairs += 1
    expect = want if mode == "atomics" else last  # programs run in order under the interpreter
    assert torch.equal(dq.cpu(), expect[None, :, None].expand(bh, seq, d))
    assert nbytes == bh * pairs * block_m * d * 4


def test_tiles_must_cover_dq_exactly():
    with pytest.raises(ValueError, match="multiples of BLOCK_M"):
        reduce_probe.run_probe(1, 64, 16, 32, 16, "atomics", device=DEVICE)


def test_bad_tiles_name_the_argument(capsys):
    with pytest.raises(SystemExit):
        reduce_probe.main(["--tiles", "64"])
    assert "--tiles" in capsys.readouterr().err
