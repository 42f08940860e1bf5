"""FSDP on two GPUs over NCCL (streams, CUDA buffers, the collectives' CUDA paths), against the
same single-process references as tests/test_fsdp.py, computed on the first GPU.

    python -m pytest -q tests/test_fsdp_gpu.py          # on a machine with 2 GPUs

The models here hold only Linear layers: CUDA's matmuls repeat their summation order for the same
shapes on the same architecture, so fp32 must match bit for bit as on the CPU. (An embedding's
backward adds with atomics on CUDA, in any order: the xl runs of the benchmark cover those.)
"""

from __future__ import annotations

import pytest
import torch

from cs336_systems.distributed.launch import Worker, spawn
from tests.test_fsdp import OPTIMIZERS, _tolerance, _train, reference

pytestmark = [
    pytest.mark.gpu, pytest.mark.distributed,
    pytest.mark.skipif(torch.cuda.device_count() < 2,
                       reason="needs 2 CUDA GPUs (FSDP over NCCL between them)"),
]

CASES = [(m, opt, dtype) for m in ("ToyModel", "ToyModelWithTiedWeights", "TinyLayers")
         for opt in OPTIMIZERS for dtype in ("fp32", "bf16")]
CASE_IDS = ["-".join(c) for c in CASES]


def _run_all(worker: Worker) -> dict:
    return {cid: _train(worker, *case) for cid, case in zip(CASE_IDS, CASES)}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_run_all, 2, backend="nccl", device="cuda", timeout_s=300)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fsdp_over_nccl_matches_single_process(ranks, case):
    _, opt_name, dtype_name = case
    ref = reference(*case, device="cuda:0")
    for rank, seen in enumerate(r["-".join(case)] for r in ranks):
        for name, want in ref["final"].items():
            if dtype_name == "fp32":
                assert torch.equal(seen["full"][name], want), f"rank {rank} {name}"
            else:
                torch.testing.assert_close(seen["full"][name], want, rtol=0,
                                           atol=_tolerance(opt_name, dtype_name, ref["g_max"]))
