"""Claims of docs/flash-attention/faster-than-cudnn.md, section "The whole grid: where ours is not
yet cuDNN's equal", asserted over results/attention/flash_grid and the tuned table.

Each test quotes the sentence it guards. When a new grid run or a re-tuned table makes one fail,
rewrite the sentence (and the test); never make the page choose its own wording.
"""

from __future__ import annotations

import types

import pytest
import torch

from report import flash_grid
from report.flash_grid import long_range, plans, speeds, step, times

SEQS = (1024, 2048, 4096, 8192, 16384, 32768)


def _levels(s, level):
    return s.index.get_level_values(level)


def test_every_cell_states_ours_against_cudnn_in_both_modes():
    # Issue 18's acceptance: "every cell of the grid states ours/cuDNN for fwd and fwd+bwd"; the
    # answer: "in ... of 48 cells" (2 d x 2 masks x 2 batch x heads x 6 lengths).
    for mode in ("fwd", "fwd_bwd"):
        s = speeds("ours", mode)
        assert len(s) == 2 * 2 * 2 * len(SEQS) and s.notna().all()
        assert sorted(set(_levels(s, "seq"))) == list(SEQS)


def test_the_goal_is_not_met_and_the_gluon_cells_meet_it():
    # Answer: "the goal is not met"; "Forward+backward meets it in ... of ... cells and the forward
    # in ..., all with d = 64 and sequences from 8,192, causal and non-causal: the cells that run the
    # tuned Gluon kernels."
    for mode in ("fwd", "fwd_bwd"):
        met = flash_grid.met(mode)
        assert 0 < len(met) < len(speeds("ours", mode))
        assert set(_levels(met, "d")) == {64} and min(_levels(met, "seq")) >= flash_grid.LONG
        assert set(plans().loc[met.index].fwd) == {"large, Gluon"}
    assert set(_levels(flash_grid.met("fwd_bwd"), "mask")) == {"causal", "full"}


def test_every_long_d128_cell_is_behind_and_short_sequences_are_furthest():
    # Answer: "Every long d = 128 cell is behind (...x to ...x cuDNN's speed), and the short sequences
    # are furthest behind (down to ...x, at ...)"
    assert long_range("fwd_bwd", d=128).max() < 1
    s = speeds()
    assert _levels(s[[s.idxmin()]], "seq")[0] <= 2048
    assert s[_levels(s, "seq") <= 2048].min() < s[_levels(s, "seq") >= 4096].min()


def test_the_2026_step_cell_misses_in_both_modes_and_is_from_the_earlier_run():
    # Answer: "The 2026 training step's cell ... ran at ...x forward+backward and ...x forward, in the
    # earlier run: the newest run stopped before it."
    assert step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd")
    assert step("ours", "fwd") > step("cudnn", "fwd")
    assert tuple(flash_grid.STEP_CELL[c] for c in flash_grid.CELL) in flash_grid.earlier_cells()


def test_the_earlier_cells_are_the_1x32_d128_ones_named():
    # "the ... cells marked † (1 x 32 at d = 128: the non-causal ones, and the causal ones from
    # 16,384) are the earlier run's"
    want = {(128, "full", "1 x 32", n) for n in SEQS} | {(128, "causal", "1 x 32", n) for n in (16384, 32768)}
    assert set(flash_grid.earlier_cells()) == want
    df = flash_grid.grid_rows()
    new = df[df.git == flash_grid.newest_git()]
    assert len(new[(new.impl == "ours")]) == 2 * (48 - len(want))  # the rest are all the newest run's


def test_ours_leads_flash_and_flex_at_long_sequences():
    # "Ours leads SDPA's FlashAttention-2 backend in every cell from ... positions, and at 32,768 it
    # beats flex_attention in ... of the ... cells where flex ran its compiled kernel."
    start = flash_grid.beats_from("flash")
    assert start <= flash_grid.LONG
    won = flash_grid.beats("flash")
    assert won[_levels(won, "seq") >= start].all()
    assert flash_grid.beats("flex").loc[32768].all()


def test_the_flex_oom_was_the_unfused_fallback():
    # Note: "asked for ... GiB, the size of that cell's whole fp32 score matrix (32 x 32,768 x
    # 32,768 x 4 bytes)"; "those two rows ... were removed" (1 x 32 x 4,096, d = 128, non-causal).
    assert flash_grid.flex_oom_gib() == 32 * 32768 * 32768 * 4 / 2**30
    flex = flash_grid.grid_rows(status=None).query("impl == 'flex'")
    assert flex.query("heads == 32 and seq == 4096 and d == 128 and not causal").empty


# ---- what tuning the grid's keys bought ----------------------------------------------------------

def test_the_tuner_builds_non_causal_keys_and_a_huge_class_for_the_step():
    # "The tuner (... --only grid) now builds non-causal keys and times each key under its own mask,
    # at a shape of the grid (16 x 2,048 for "medium", 32 x 8,192 for "large"), and gives the 2026
    # step's shape ... a size class of its own, "huge", searched widely."
    from cs336_systems.attention.fast.tuning.tune import tune_shapes

    shapes = {s[0]: s for s in tune_shapes("grid")}
    for d in (64, 128):
        assert shapes[f"bf16-d{d}-full-medium"][1:3] == (16, 2048)
        assert shapes[f"bf16-d{d}-full-large"][1:3] == (32, 8192)
    assert shapes["bf16-d128-causal-huge"][1:3] == (32, 32768) and shapes["bf16-d128-causal-huge"][5]
    assert "bf16-d64-full-large" in flash_grid.tuned_keys() and "bf16-d128-causal-huge" in flash_grid.tuned_keys()


def test_non_causal_d64_now_meets_cudnn_at_long_sequences_and_was_behind():
    # "d = 64 without a mask went from ...x-...x cuDNN's speed at long sequences (heuristic tiles) to
    # ...x-...x: the tuner chose the Gluon kernels there"
    before = flash_grid._long(flash_grid.earlier_speeds(), d=64, mask="full")
    after = long_range("fwd_bwd", d=64, mask="full")
    assert before.max() < 1 <= after.min()
    assert set(plans().loc[after.index].fwd) == {"large, Gluon"}


def test_non_causal_d128_improved_but_stays_behind():
    # "d = 128 without a mask (1 x 16, long sequences) went from ...x-...x to ...x-...x with tuned
    # Triton tiles ... their tiles alone do not reach cuDNN."
    where = {"d": 128, "mask": "full", "batch x heads": "1 x 16"}
    before = flash_grid._long(flash_grid.earlier_speeds(), **where)
    after = long_range("fwd_bwd", **where)
    assert before.max() < after.min() and after.max() < 1
    assert set(plans().loc[after.index].fwd) == {"large, Triton"}


def test_one_cell_got_slower_through_the_gluon_path():
    # "At 1 x 16 x 4,096, d = 64, non-causal, forward+backward took ... ms through the tuned Gluon
    # kernels against ... ms with the heuristic Triton tiles before."
    cell = (64, "full", "1 x 16", 4096)
    assert times("ours", "fwd_bwd").loc[cell] > flash_grid.earlier_times().loc[cell]
    assert plans().bwd.loc[cell] == "large, Gluon"


# ---- why the cells that miss do -------------------------------------------------------------------

def test_the_step_cells_backward_is_further_behind_than_its_forward():
    # "The backward is further behind than the forward: at the step's cell (earlier run) the backward
    # alone ... took ... ms against cuDNN's ... ms. The d = 128 causal "large" entry is still the one
    # timed at ... (a single head)."
    bwd = flash_grid.step_backward_ms("cudnn") / flash_grid.step_backward_ms("ours")
    fwd = step("cudnn", "fwd") / step("ours", "fwd")
    assert bwd < fwd < 1
    assert flash_grid.tuned_at("bf16-d128-causal-large").startswith("1 x ")


def test_a_floor_under_every_call_and_the_host_is_most_of_it():
    # "At seq 1,024 it took ... to ... ms against cuDNN's ... to ... ms, while ours' forward alone
    # took ... to ... ms: the backward call adds far more than its kernels' share of so little work."
    # Far more: ours' backward (fwd+bwd minus fwd) at least 3x cuDNN's in every cell at 1,024.
    ours = flash_grid.short_ms("ours", "fwd_bwd") - flash_grid.short_ms("ours", "fwd")
    cudnn = flash_grid.short_ms("cudnn", "fwd_bwd") - flash_grid.short_ms("cudnn", "fwd")
    assert (ours >= 3 * cudnn).all()
    assert flash_grid.short_ms("ours", "fwd_bwd").min() > flash_grid.short_ms("cudnn", "fwd_bwd").max()
    # "The host's time is most of it: ... one eager forward+backward step at ... µs of host time
    # against cuDNN's ... µs": more than half of ours' shortest forward+backward is the host's.
    assert flash_grid.host_step_us("ours") > flash_grid.host_step_us("cudnn")
    assert flash_grid.host_step_us("ours") / 1000 > 0.5 * flash_grid.short_ms("ours", "fwd_bwd").min()


def test_the_causal_1x16_cells_sit_on_the_floor():
    # "at 2,048, 4,096 and 8,192 positions (4 and 16 times the work of the first) ours'
    # forward+backward took ..., ... and ... ms": 16x the work in about twice the time or less.
    t = times("ours", "fwd_bwd").loc[flash_grid.GLUON_FLOOR_CELL]
    assert t[8192] < 2.5 * t[2048]


@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_the_gluon_kernels_take_head_dim_64_only(monkeypatch, which):
    # "both Gluon kernels take only d = 64 (fwd_ws_supported and ws_supported: 'written for head dim
    # 64')": asked on a stand-in for a Hopper tensor, the rule refuses d = 128 and takes d = 64.
    import triton

    from cs336_systems.attention.fast.gluon import fwd_ws, onepass_ws

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")

    def fake(d):
        return types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16,
                                     shape=(1, 16, 1024, d), is_contiguous=lambda: True)

    def ask(d):
        t = fake(d)
        return fwd_ws.fwd_ws_supported(t, t, t) if which == "fwd" else onepass_ws.ws_supported(t, t, t, t, True)

    assert ask(64) is None
    assert ask(128) == "written for head dim 64"


