"""Claims of docs/training-step.md, asserted over the package's formulas and, for "Measured on one
H200", over the committed rows of the two fused pieces (results/training_step/fused_ce and
fused_adamw) read through report.training_step, as the page reads them.

Each test quotes the sentence it guards; when a formula or a measurement overturns one, rewrite the
sentence and the test.
"""

from __future__ import annotations

import pytest

from cs336_systems.training_step import arithmetic
from report import training_step as page
from report.flash_grid import step
from report.reproducing import copy_ceiling_tbps, matmul_ceiling_tflops

H200_GIB = 139  # the usable memory the page states for one H200 (about 139 GiB of 141 GB)


def _budget(name):
    return page.budget_of(page.LAYOUTS[name])


def test_the_goal_is_about_half_the_datasheet_rate():
    # "one step is ... model FLOPs, ... s on two H200s at 100% MFU; the goal this project set, 4.5 s,
    # is ... MFU."
    assert 4.7e15 < page.flops() < 4.8e15
    assert 2.3 < page.seconds_at(1.0) < 2.5
    assert 0.5 < page.mfu_at(page.GOAL_S) < 0.55


def test_the_plain_model_does_not_fit_and_its_probabilities_are_most_of_it():
    # "The plain model does not come close: its naive attention keeps each layer's probabilities,
    # ... GiB of the ... GiB it would hold at the end of the forward"
    plain = _budget("plain (naive attention, full logits, DDP)")
    assert plain.lower_bound / page.GIB > 10 * H200_GIB
    assert plain.attention_probabilities > 0.5 * plain.end_of_forward


def test_ours_fits_sharded_and_replicated():
    # "our variant is estimated at ... GiB per GPU under FSDP and ... GiB replicated: both fit, which
    # leaves memory to spend on keeping some blocks' activations"
    fsdp = _budget("ours (FlashAttention, fused loss, FSDP2, every block checkpointed)")
    ddp = _budget("ours, no sharding (DDP), every block checkpointed")
    assert fsdp.estimate < ddp.estimate < H200_GIB * page.GIB
    assert _budget("ours, FSDP2, last 10 blocks kept").estimate < H200_GIB * page.GIB


def test_the_full_logits_would_be_18_5_gib():
    # "The full logits would be 65,536 x 151,936 values, 18.5 GiB in bf16"
    assert f"{65_536 * page.CFG.vocab_size * 2 / 2**30:.1f}" == "18.5"
    assert page.BATCH * page.CONTEXT == 65_536


def test_sdpa_has_the_faster_attention_at_the_steps_shape():
    # "Our FlashAttention at the step's own attention shape is not yet cuDNN's equal ...: where SDPA
    # picks cuDNN, the stock variant has the faster attention today."; and the one-GPU section: "its
    # FlashAttention-2 backend is slower than ours here"
    assert step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd")
    assert step("flash", "fwd_bwd") > step("ours", "fwd_bwd") and step("flash", "fwd") > step("ours", "fwd")


# "Measured on one H200": results/training_step/fused_ce and fused_adamw, read as the page reads them

def _ce(impl):
    return page.ce_rows().loc[impl]


def _adamw(impl):
    return page.adamw_rows().loc[impl]


def test_the_pieces_were_measured_at_the_steps_shapes():
    # "times the LM head and the loss on all the positions of the step's batch"; "one `opt.step()`
    # over ... billion bf16 parameters, the share of one rank when the 8B model is sharded over two GPUs"
    ce = page.ce_rows()
    assert (ce.positions == page.BATCH * page.CONTEXT).all() and (ce.vocab == page.CFG.vocab_size).all()
    assert (ce.d_model == page.CFG.d_model).all() and (ce.dtype == "bf16").all()
    adamw = page.adamw_rows()
    assert (adamw["size"] == "8B").all() and (adamw.shard == page.GPUS).all() and (adamw.dtype == "bf16").all()
    assert adamw.numel.iloc[0] == pytest.approx(arithmetic.params(page.CFG) / page.GPUS, rel=0.01)


def test_the_fused_loss_is_a_little_faster_than_f_cross_entropy():
    # "The fused loss is a little faster than `F.cross_entropy` on the full logits, ... ms against ... ms"
    ratio = _ce("torch").ms / _ce("fused").ms
    assert 1.0 < ratio < 1.2


def test_the_fused_loss_needs_about_a_tenth_of_the_memory():
    # "and needs about a tenth of its memory: ... GiB above the inputs against ... GiB"
    share = _ce("fused").peak_gib / _ce("torch").peak_gib
    assert 1 / 14 < share < 1 / 7


def test_the_chunked_loss_saves_memory_but_is_much_slower():
    # "PyTorch's own way to save that memory, checkpointed chunks, gets down to ... GiB but takes
    # ... ms, ... times as long as ours."
    chunked, fused, torch_ = _ce("torch-chunked"), _ce("fused"), _ce("torch")
    assert fused.peak_gib < chunked.peak_gib < torch_.peak_gib / 5
    assert chunked.ms > 1.4 * fused.ms and chunked.ms > torch_.ms


def test_f_cross_entropy_holds_three_logit_sized_buffers():
    # "`F.cross_entropy` peaks at ... buffers the size of the full logits (... GiB each)"
    torch_ = _ce("torch")
    assert round(torch_.peak_gib / torch_.full_logits_gib) == 3
    # "ours never holds more than one chunk's logits": its peak is well under one full logits buffer
    assert _ce("fused").peak_gib < torch_.full_logits_gib / 2


def test_the_fused_loss_runs_near_the_matmul_ceiling():
    # "together run at ... TFLOP/s, ... of what a large bf16 matmul reaches on this GPU, so the pass
    # over the logits costs little next to the matmuls"
    assert _ce("fused").tflops > 0.85 * matmul_ceiling_tflops("bf16")


def test_fused_adamw_beats_torch_fused_and_foreach_is_slowest():
    # "`FusedAdamW` updates one rank's half of the 8B model in ... ms, ... times as fast as torch's
    # fused AdamW"; "The `foreach` version ... is the slowest by far."
    ours, fused, foreach = _adamw("ours"), _adamw("torch-fused"), _adamw("torch-foreach")
    assert ours.ms < fused.ms / 1.2
    assert foreach.ms > 2 * fused.ms > 2 * ours.ms


def test_fused_adamw_is_near_the_copy_bandwidth():
    # "Ours moves ... TB/s, ... of what a large copy reaches on this GPU; torch's fused kernel moves
    # ... TB/s." (the sentence gives the share; it reads as "close to the copy")
    assert _adamw("ours").gb_per_s / 1e3 > 0.85 * copy_ceiling_tbps()
    assert _adamw("torch-fused").gb_per_s < _adamw("ours").gb_per_s


def test_fused_adamw_launches_hide_behind_the_gpu():
    # "`opt.step()` returns after ... ms, later than torch's ... ms but well before the GPU is done"
    ours, fused = _adamw("ours"), _adamw("torch-fused")
    assert fused.host_ms < ours.host_ms < 0.5 * ours.ms


def test_the_adamw_saving_is_small_next_to_the_goal():
    # "the saving is ... ms per step, small next to the 4.5 s the project aims for"
    saved_s = (_adamw("torch-fused").ms - _adamw("ours").ms) / 1e3
    assert 0 < saved_s < 0.01 * page.GOAL_S


def test_one_gpu_share_ours_is_slower_and_the_fused_pieces_beat_pytorch():
    # answer: "the fused pieces beat PyTorch's, but one GPU's share of the step (one sequence) took
    # ... ms with ours against ... ms stock"; "Ours is ... ms slower, at ... MFU against stock's ..."
    assert page._one("ours", "step_ms") > page._one("stock", "step_ms")
    assert page._one("ours", "mfu") < page._one("stock", "mfu")
    assert page._ce("fused", "ms") < page._ce("torch", "ms") and page._ce("fused", "ms") < page._ce("torch-chunked", "ms")
    assert page._adamw("ours", "ms") < page._adamw("torch-fused", "ms")


def test_one_gpu_attention_covers_the_gap():
    # "over ... layers, ours costs ... ms more than cuDNN's, more than the whole gap"
    gap = page._one("ours", "step_ms") - page._one("stock", "step_ms")
    assert page.attention_extra_ms() > gap > 0


def test_one_gpu_rows_are_single_steps_of_the_same_run():
    # "Each row is a single timed step"; the table's note: "every block checkpointed and compiled"
    df = page.one_gpu_rows()
    assert (df.n_timed == 1).all() and df.run_id.nunique() == 1
    assert all(f["checkpointed_blocks"] == page.CFG.num_layers and f["compile"] for f in df["flags"])


def test_the_goal_needs_a_faster_step_than_one_gpus_share():
    # "the ... s goal needs a step at least ... times as fast as stock's here"
    assert page._one("stock", "step_ms") / 1e3 / page.GOAL_S > 1


def test_one_gpu_peaks_lie_inside_the_memory_budget():
    # "both peaked at ... GiB, between its lower bound for this layout, ... GiB, and its estimate"
    peaks = page.one_gpu_rows().peak_allocated_gib
    assert len({f"{p:.1f}" for p in peaks}) == 1  # "both peaked at" one number, as the page prints it
    assert page._one_estimate("lower_bound") < peaks.min() and peaks.max() < page._one_estimate("estimate")
