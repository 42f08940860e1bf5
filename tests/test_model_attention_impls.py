"""The model trains the same with every attention implementation `--attention` can select.

Reference: the model with its own naive attention. Each other implementation (PyTorch's SDPA, our
tiled PyTorch FA2, our Triton FA2 — on CPU under the Triton interpreter, fp32) trains a copy of the
same tiny model on the same batches; losses and final weights must agree to fp32 tolerance.
"""

from __future__ import annotations

import copy

import pytest
import torch

from cs336_systems.model import AdamW, TransformerLM, cross_entropy, use_attention
from cs336_systems.model.config import ModelConfig

CFG = ModelConfig(vocab_size=97, context_length=48, d_model=64, num_layers=2, num_heads=4, d_ff=128)
STEPS = 3


def train(model: TransformerLM, attention: str, batches: list[torch.Tensor]) -> list[float]:
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    with use_attention(attention):
        for tokens in batches:
            opt.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            loss = cross_entropy(logits.reshape(-1, CFG.vocab_size), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    model = TransformerLM.from_config(CFG)
    g = torch.Generator().manual_seed(1)
    # seq 41 (40 predicted positions): not a multiple of any tile size
    batches = [torch.randint(0, CFG.vocab_size, (2, 41), generator=g) for _ in range(STEPS)]
    initial = copy.deepcopy(model)
    losses = train(model, "naive", batches)
    return initial, batches, losses, model


@pytest.mark.parametrize("attention", ["sdpa", "flash-pytorch", "flash-triton"])
def test_training_matches_naive_attention(reference, attention):
    initial, batches, ref_losses, ref_model = reference
    model = copy.deepcopy(initial)
    losses = train(model, attention, batches)
    assert losses == pytest.approx(ref_losses, rel=1e-4), attention
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=lambda m: f"{attention} {name}: {m}")
