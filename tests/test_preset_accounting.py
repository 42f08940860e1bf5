"""The distributed chapters' arithmetic for the 2026 handout's xl (our 2.7B preset), checked against
counts made here by hand from the handout's shapes, not through accounting.py."""

from __future__ import annotations

import pytest

from cs336_systems.sharding import preset_accounting as pa

D, F, L, V = 2560, 10240, 32, 10_000          # the 2026 xl: d_model, d_ff, layers, vocab
N_2026 = L * (4 * D * D + 3 * D * F + 2 * D) + 2 * V * D + D  # blocks, embedding + LM head, final norm
N, BATCH, CTX = 2, 2, 512


def test_the_2026_xl_is_our_2_7b_and_the_2025_xl_is_not():
    assert pa.XL_2026.cfg.d_model == D and pa.XL_2026.cfg.num_layers == L and pa.XL_2026.name == "xl"
    assert pa.XL_2025.cfg.d_model == 1600 and pa.XL_2025.name == "xl"
    assert pa.XL_2026.n_params == N_2026 == 3_406_809_600
    with pytest.raises(ValueError, match="no preset"):
        pa.Setting("xl", edition="2026")  # the 1600-wide xl is not in the 2026 table
    with pytest.raises(ValueError, match="world_size"):
        pa.Setting(world_size=0)


def test_ddp_gradients_by_hand():
    got = pa.ddp_numbers(pa.XL_2026, bus_bytes_per_s=100e9)
    # per block 9 tensors (ln1, q, k, v, o, ln2, w1, w2, w3), plus embedding, final norm, LM head
    assert got["tensors"] == 9 * L + 3 and got["norm_tensors"] == 2 * L + 1
    assert got["norm_bytes"] == 4 * D * (2 * L + 1)
    assert got["grad_bytes"] == 4 * N_2026
    assert got["largest_tensor_bytes"] == 4 * D * F  # a SwiGLU matrix: larger than V x D
    assert got["allreduce_bytes_per_rank"] == 2 * (N - 1) / N * 4 * N_2026  # ring: 2(N-1)/N
    assert got["allreduce_s"] == pytest.approx(got["allreduce_bytes_per_rank"] / 100e9)
    assert got["tokens_per_rank"] == BATCH * CTX


def _activations() -> int:
    """What the forward saves per rank, counted here from the model's code (fp32, naive attention,
    b = 2 sequences of s = 512): per layer two norms (3bsd + bs each), q, k, v (3bsd), RoPE's cos and
    sin (2 s d_head), the softmax output (b h s s), the ~mask (s s bools), the output projection's
    input (bsd), SwiGLU's four (b, s, d_ff); outside: token ids and targets (int64), the final norm,
    the logits and the loss's logsumexp."""
    b, s, h, dh = BATCH, CTX, 32, D // 32
    per_layer = 4 * (2 * (3 * b * s * D + b * s) + 3 * b * s * D + 2 * s * dh + b * h * s * s + b * s * D
                     + 4 * b * s * F) + s * s
    outside = 8 * b * s + 4 * (3 * b * s * D + b * s + b * s * V + b * s)
    return L * per_layer + outside


def test_memory_at_the_three_points_by_hand():
    n = N_2026
    ddp = pa.memory_at_points(pa.XL_2026, "ddp")
    assert ddp["after_init"]["total"] == 4 * n  # AdamW's moments come at its first step
    assert ddp["before_step"] == {"params": 4 * n, "grads": 4 * n, "optimizer_state": 0.0,
                                  "activations": _activations(), "total": 8 * n + _activations()}
    assert ddp["after_step"]["total"] == 16 * n
    sharded = pa.memory_at_points(pa.XL_2026, "sharded")
    assert sharded["after_step"]["optimizer_state"] == 8 * n / N
    assert sharded["after_step"]["total"] == 8 * n + 8 * n / N
    with pytest.raises(ValueError, match="stage"):
        pa.memory_at_points(pa.XL_2026, "zero3")


def test_fsdp_saves_the_sharded_share_of_weights_and_gradients():
    n, act = N_2026, _activations()
    got = pa.fsdp_saving(pa.XL_2026)
    assert got["sharded_peak"] == 4 * n + 4 * n + 8 * n / N + act
    assert got["fsdp_peak"] == 16 * n / N + act
    assert got["saved_vs_sharded"] == (1 - 1 / N) * 8 * n  # 13.6 GB at N = 2
    assert got["saved_vs_ddp"] == (1 - 1 / N) * 16 * n


def test_communication_per_rank_by_hand():
    n, f = N_2026, (N - 1) / N
    got = pa.communication(pa.XL_2026)
    assert got == {"ddp": 2 * f * 4 * n, "sharded": 3 * f * 4 * n, "zero1": 2 * f * 4 * n,
                   "fsdp_fp32": 3 * f * 4 * n, "fsdp_bf16": 3 * f * 2 * n}


def test_summary_is_flat_and_names_the_preset():
    s = pa.summary()
    assert s["preset"] == "2.7B" and s["handout_name"] == "xl" and s["edition"] == "2026"
    assert s["ddp.tensors"] == 291 and s["points.sharded.after_step.total"] == 8 * N_2026 + 4 * N_2026
    assert all(isinstance(v, (int, float, str)) for v in s.values())
    old = pa.summary(pa.XL_2025)
    assert old["d_model"] == 1600 and old["ddp.tensors"] == 9 * 48 + 3
