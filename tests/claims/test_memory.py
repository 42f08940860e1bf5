"""Claims of docs/memory.md over the committed results (2.7B, batch 4, contexts 128 to 2,048)."""

from __future__ import annotations

import pytest

from cs336_systems.model import get_config
from report import memory as m


def test_training_starts_from_four_copies_of_the_model():
    # (a): "The training step starts from four copies of the model" (weights, gradients, two
    # moments); "the same four copies" in bf16. The remainder is small buffers (< 2% of the total).
    for dtype in ("fp32", "bf16"):
        before = m.peak(512, "train", dtype, "before_mib")
        assert before == pytest.approx(4 * m.weights_mib(), rel=0.02), dtype


def test_timeline_offset_is_the_same_at_both_ends():
    # (a): "The pictures sit ... MiB below the allocator's own counter ..., the same offset at both ends"
    start = m.peak(512, "train", "fp32", "before_mib") - m.peak(512, "train", "fp32", "timeline_start_gib") * 1024
    top = m.peak(512, "train", "fp32") - m.peak(512, "train", "fp32", "timeline_peak_gib") * 1024
    assert start == pytest.approx(top, abs=1.0)  # 1 MiB: the offset is block rounding, not activations


def test_inference_adds_little_and_grows_with_context():
    # (b): "Inference peaks only ... MiB above what was allocated before it (the weights, essentially)"
    extra = [m.peak(c, "forward", "fp32", "extra_mib") for c in (128, 256, 512)]
    assert extra == sorted(extra)
    assert max(extra) < 0.05 * m.weights_mib()
    assert m.peak(512, "forward", "fp32", "before_mib") == pytest.approx(m.weights_mib(), rel=0.02)


def test_short_contexts_peak_in_the_optimizer_long_ones_in_the_forward():
    # (b): "At context 128 and 256 ... The peak then comes in the optimizer step, ... MiB above the
    # start: one temporary sqrt(v) of a feed-forward weight" and "At 512 the activations exceed the
    # freed gradients and the peak ... rises ... MiB above the start."
    for ctx in (128, 256):
        assert m.peak(ctx, "train", "fp32", "extra_mib") == pytest.approx(m.ffn_weight_mib(), rel=0.02)
    assert m.peak(512, "train", "fp32", "extra_mib") > 10 * m.ffn_weight_mib()


def test_bf16_autocast_does_not_save_memory():
    # (c): "Not much, and for inference it makes memory worse" and "That is autocast's weight cache"
    # and "The cache also tips context 256 over"
    for ctx in (128, 256, 512):
        assert m.peak(ctx, "forward", "bf16") > m.peak(ctx, "forward", "fp32")
        assert m.peak(ctx, "train", "bf16") == pytest.approx(m.peak(ctx, "train", "fp32"), rel=0.05)
    assert m.peak(128, "forward", "bf16", "extra_mib") == pytest.approx(m.autocast_cache_mib(), rel=0.02)
    assert m.peak(256, "train", "bf16", "extra_mib") > 2 * m.peak(256, "train", "fp32", "extra_mib")


def test_residual_stream_size_is_measured_and_two_per_layer_come_from_the_adds():
    # (d): "the allocator served ... allocations of exactly ... MiB, and ... of them (2 per layer, one
    # per residual add) come from the two residual adds of `TransformerBlock.forward`"
    r = m.residual()
    assert r.expected_mib == 20.0
    assert m.residual_adds() == 2 * get_config(m.SIZE).num_layers
    assert r.allocations_of_that_size > m.residual_adds()


def test_largest_forward_allocations_are_the_score_matrices_then_swiglu_then_logits():
    # (e): "The largest allocations of the forward, ... MiB each, are the attention score matrices ...
    # allocated in `naive_attention` ..., four per layer. Next come the SwiGLU hidden activations ...
    # and the logits"
    sizes = m.tensor_sizes_mib(512)
    top = m.largest("forward")
    score = top[top.size_mib == sizes["score"]]
    assert top.size_mib.iloc[0] == sizes["score"]
    assert score["site"].str.contains("naive_attention").all()
    assert score["count"].sum() == 4 * get_config(m.SIZE).num_layers
    after = list(dict.fromkeys(top.size_mib[top.size_mib < sizes["score"]]))
    assert after[:2] == [sizes["ffn_hidden"], pytest.approx(sizes["logits"], abs=0.05)]


def test_training_step_adds_weight_sized_buffers_from_backward_and_adamw():
    # (e) prose: "the gradient of each feed-forward weight (... three per layer, allocated by autograd)
    # and AdamW's temporary sqrt(v) of the same size (`optim.py`...)"
    t = m.largest("train")
    ffn = t[t.size_mib == m.ffn_weight_mib()]
    layers = get_config(m.SIZE).num_layers
    assert set(ffn.phases) == {"backward", "optimizer"}
    assert (ffn["count"] == 3 * layers).all()
    assert ffn[ffn.phases == "optimizer"]["site"].str.contains("optim.py").all()


def test_at_2048_the_forward_fits_and_no_training_step_does_not_even_its_first():
    # (b) answer: "At 2,048 it does not fit on the H200: the activations alone, ... MiB by count, are
    # nearly the GPU's ... MiB"; the paragraph: "already in their first, untimed step ...: weights and
    # buffers ... and the activations ... come to ... MiB, more than the GPU's ...; a steady-state
    # step would add ... MiB in all. The fp32 step failed with ... MiB allocated, the residuals of
    # ... of its 32 blocks on top of the model"; (c): "the bf16 training step does not fit either".
    capacity = m.oom(2048, "train", "fp32").capacity_mib
    for dtype in ("fp32", "bf16"):
        assert m.peak(2048, "forward", dtype) < capacity and m.cells().loc[(2048, "train", dtype)].status == "oom"
    assert 0.9 < m.activations_mib(2048) / capacity < 1
    assert m.resident_mib(2048) + m.activations_mib(2048) > capacity
    # a failure in a steady-state step (gradients and moments resident: 3 more model copies, about
    # 6 blocks' worth) would have come before block 26; 30.x blocks saved means the first forward
    assert 29 < m.blocks_saved_at_oom() < 32


def test_the_failed_request_at_2048_was_one_score_matrix():
    # (b): "The failed request was ... MiB, exactly one attention score matrix at this context
    # (4 x 32 x 2048^2 x 4 bytes)"; "... GiB over 32 layers"
    cfg = get_config("2.7B")
    assert cfg.num_heads == 32 and cfg.num_layers == 32
    for dtype in ("fp32", "bf16"):
        assert m.oom(2048, "train", dtype).tried_mib == m.tensor_sizes_mib(2048)["score"] == 4 * 32 * 2048**2 * 4 / 2**20


def test_bf16_raises_the_peak_above_the_start_in_every_cell():
    # (c) answer: "measured above what each step starts from, bf16 autocast raises the peak in every
    # cell (by ... MiB in the training step at context 128, where both peak at the optimizer's
    # temporary)". Cells where both dtypes fit.
    p = m.peaks()
    for (context, mode, dtype), r in p.iterrows():
        if dtype == "bf16" and (context, mode, "fp32") in p.index:
            assert r.extra_mib > p.loc[(context, mode, "fp32")].extra_mib, (context, mode)
    gap = m.peak(128, "train", "bf16", "extra_mib") - m.peak(128, "train", "fp32", "extra_mib")
    assert 0 < gap < 1
    assert m.peak(128, "train", "fp32", "extra_mib") == pytest.approx(m.ffn_weight_mib(), rel=0.01)


def test_at_2048_the_inference_extra_is_the_attention_scores():
    # (b): "... and ... MiB at 2,048, where the attention scores ... take over": the extra above the
    # weights grows more than 10x from 512 to 2,048 (4x the context, 16x the score matrix), and is
    # larger than one score matrix.
    extra_512, extra_2048 = (m.peak(c, "forward", "fp32", "extra_mib") for c in (512, 2048))
    assert extra_2048 > 10 * extra_512 and extra_2048 > m.tensor_sizes_mib(2048)["score"]


def test_f_three_lines_hold_most_of_a_block_and_the_softmax_half():
    # (f) answer: "Three lines of the model save ...% of it: the softmax output alone ...% ..., then
    # the SwiGLU line's three (B, T, d_ff) tensors and the inputs of the linear layers; the next three
    # lines save about ... MiB each."
    df = m.block_saved(2048)
    assert "softmax" in df.code.iloc[0] and "silu" in df.code.iloc[1] and "linear" in df.code.iloc[2]
    assert df.tensors.iloc[1] == 3 and df.tensors.iloc[2] == 4
    assert df.share.iloc[0] > 0.45 and df.share.head(3).sum() > 0.8
    tie = df["bytes"].iloc[3:6]
    assert df["bytes"].iloc[2] > tie.max() and tie.max() / tie.min() < 1.001 and tie.min() > df["bytes"].iloc[6]
    # "it grows as T^2 where the rest grow as T (the inverted causal mask ... at one byte per pair)"
    small = m.block_saved(512).set_index("site")["bytes"]
    big = df.set_index("site")["bytes"]
    ratio = big / small
    softmax, mask = df.site.iloc[0], df[df.code.str.contains("masked_fill")].site.iloc[0]
    assert ratio[softmax] == ratio[mask] == 16
    assert (ratio.drop([softmax, mask]).round(3) == 4).all()


def test_f_the_measured_backward_puts_a_blocks_gradients_at_its_parameter_bytes():
    # (f): "the memory it frees and allocates at context 512 puts one block's gradients at ... MiB";
    # "What is left is 32 blocks' gradients, ... MiB each. That matches what we expect: ... = ... MiB".
    # Every tensor the backward frees or allocates is counted (blocks and outside terms, from the
    # code), and the levels are exact allocator counts at the phase markers, so what remains are the
    # loss scalar, its gradient and such bookkeeping: bytes to KiB. 0.1 MiB per block (3.2 MiB in
    # all) is far above that and far below one block's smallest tensor (the RMSNorm gain, 10 KiB,
    # would not show; a missed (B, T, d_model) tensor, 20 MiB, would).
    assert abs(m.block_gradient_measured_mib() - m.block_gradient_mib()) < 0.1


def test_f_the_block_count_equals_the_checkpointing_pages_hand_count():
    # (f): "The total equals the hand count the gradient checkpointing page uses for A, to the byte."
    from report import checkpointing

    assert m.block_saved(2048)["bytes"].sum() == checkpointing.block_bytes()
