"""profiling/residuals.py: what autograd saves, by saving line, against counts made by hand."""

from __future__ import annotations

import dataclasses

import torch

from cs336_systems.model import get_config
from cs336_systems.model.layers import Linear
from cs336_systems.profiling.residuals import block_parameter_bytes, block_residuals, saved_by_line
from cs336_systems.sharding.accounting import saved_activation_bytes, transformer_activation_bytes


def test_saved_tensors_are_counted_once_per_storage_by_the_line_that_saved_them():
    lin = Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)

    def run():
        a = lin(x)  # saves x (the weight is resident) at layers.py's linear line
        return (a * a.view(3, 2).view(2, 3)).softmax(-1)  # a twice, one storage; then the output

    rows = {r["site"]: r for r in saved_by_line(run, resident=list(lin.parameters()))}
    linear = next(r for site, r in rows.items() if site.startswith("cs336_systems/model/layers.py:"))
    assert linear["bytes"] == 2 * 4 * 4 and "linear" in linear["code"]  # x: (2, 4) fp32
    outside = rows["(outside cs336_systems/model)"]
    assert outside["bytes"] == 2 * 3 * 4 + 2 * 3 * 4 and outside["tensors"] == 2  # a once, softmax output


def test_a_meta_block_saves_what_the_hand_count_says():
    # The hand count in sharding.accounting (per layer: the difference between 2 layers and 1) is
    # independent code; autograd's own hooks on the meta device must agree to the byte, at any size.
    for size, batch, context in (("small", 2, 64), ("2.7B", 4, 512), ("2.7B", 4, 2048)):
        cfg = dataclasses.replace(get_config(size, context), context_length=context)
        one, two = (dataclasses.replace(cfg, num_layers=n) for n in (1, 2))
        per_layer = transformer_activation_bytes(two, batch, context) - transformer_activation_bytes(one, batch, context)
        assert sum(r["bytes"] for r in block_residuals(cfg, batch, context)) == per_layer, size


def test_block_gradients_are_its_parameters():
    cfg = get_config("small")
    from cs336_systems.model.layers import RotaryEmbedding
    from cs336_systems.model.transformer import TransformerBlock

    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, RotaryEmbedding(cfg.rope_theta, cfg.d_head, 8), "meta")
    assert block_parameter_bytes(cfg) == 4 * sum(p.numel() for p in block.parameters())


def test_saved_bytes_are_the_same_on_the_meta_device_as_on_the_cpu():
    # On "meta" every storage's address is 0: a count keyed by address would see one storage.
    counts = []
    for device in ("cpu", "meta"):
        lin = Linear(8, 16, device=device)
        x = torch.ones(4, 8, device=device, requires_grad=True)
        with saved_activation_bytes(lin.parameters()) as saved:
            torch.nn.functional.silu(lin(x)).softmax(-1)  # saves x, lin(x), the softmax output
        counts.append(saved["bytes"])
    assert counts[0] == counts[1] == 4 * (4 * 8 + 2 * 4 * 16)
