"""training_step/keep_blocks.py: the largest --keep-blocks whose memory estimate fits a rank."""

from __future__ import annotations

import pytest

from cs336_systems.model import get_config
from cs336_systems.training_step import keep_blocks as kb
from cs336_systems.training_step.train_step import StepOptions

CFG = get_config("8B")
OPTIONS = StepOptions(shard="fsdp2")


def _estimate(variant: str, k: int, world: int = 2) -> float:
    return kb.estimate_bytes(CFG, variant, kb.replace(OPTIONS, keep_blocks=k), world, 1)


def test_each_kept_block_adds_memory():
    # a kept block saves its activations for backward; a checkpointed one only its input
    costs = [_estimate("ours", k) for k in range(4)]
    assert all(b > a for a, b in zip(costs, costs[1:]))


@pytest.mark.parametrize("k", [0, 3, 11])
def test_the_largest_k_that_fits_every_variant(k):
    worst = max(_estimate(v, k) for v in ("stock", "ours"))
    capacity = worst / kb.HEADROOM  # k fits exactly; k + 1 cannot (it costs more)
    assert kb.most_kept_blocks(CFG, ["stock", "ours"], OPTIONS, 2, 1, capacity) == k


def test_sharding_over_two_gpus_frees_room_for_more_kept_blocks():
    gib = 2**30
    one = kb.most_kept_blocks(CFG, ["ours"], StepOptions(), 1, 1, 140 * gib)
    two = kb.most_kept_blocks(CFG, ["ours"], OPTIONS, 2, 1, 140 * gib)
    assert two > one


def test_nothing_fits_gives_zero_and_the_bench_decides():
    assert kb.most_kept_blocks(CFG, ["ours"], OPTIONS, 2, 1, capacity_bytes=1.0) == 0


def test_the_cli_prints_k_and_refuses_bad_arguments(capsys):
    assert kb.main(["--size", "tiny", "--device", "cpu", "--dtype", "fp32"]) == 0
    assert capsys.readouterr().out.strip() == str(get_config("tiny").num_layers)  # all fit in RAM
    for argv, flag in ((["--headroom", "1.5"], "--headroom"), (["--batch", "3"], "--batch"),
                       (["--variant", "plain"], "--variant"), (["--world-size", "0"], "--world-size")):
        with pytest.raises(SystemExit) as info:
            kb.main(argv + ["--memory-per-rank-gib", "80"])
        assert info.value.code == 2 and flag in capsys.readouterr().err
