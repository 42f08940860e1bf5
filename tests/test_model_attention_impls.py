"""The model trains the same with every attention implementation `--attention` can select.

Reference: the model with its own naive attention, trained in float64 for a few AdamW steps. Along
that trajectory, at every step's weights, each implementation (our naive attention, PyTorch's SDPA,
our tiled PyTorch FA2, our Triton FA2 -- on CPU under the Triton interpreter -- all in float32)
must give the same loss and the same gradients, to within float32 rounding: normwise relative
error at most gamma_N, N the roundings along the longest path (tests/tolerances.py). Weights after
several float32 AdamW steps are not compared: Adam divides each gradient element by its own running
RMS, so an element whose gradient nearly cancels moves by a rounding-determined +-lr per step, and
two correct implementations can end far apart in it. The optimizer is common code (tests/test_model.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.model import AdamW, TransformerLM, use_attention
from cs336_systems.model.config import ModelConfig
from tests.tolerances import assert_relative_error, gamma, transformer_rounding_depth
from tests.triton_mode import needs_triton

CFG = ModelConfig(vocab_size=97, context_length=48, d_model=64, num_layers=2, num_heads=4, d_ff=128)
STEPS = 3
BATCH, SEQ = 2, 40  # seq 40 predicted positions: not a multiple of any tile size


def loss_and_grads(model: TransformerLM, attention: str, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    tokens = tokens.to(next(model.parameters()).device)
    with use_attention(attention):
        logits = model(tokens[:, :-1])
    # torch's cross-entropy (the model's own computes in float32; the float64 reference must not)
    loss = F.cross_entropy(logits.reshape(-1, CFG.vocab_size), tokens[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach().cpu(), {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def trajectory():
    """Per step: (weights, tokens, loss, gradients) of float64 training with naive attention."""
    torch.manual_seed(0)
    model = TransformerLM.from_config(CFG).double()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, CFG.vocab_size, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    steps = []
    for tokens in batches:
        weights = copy.deepcopy(model.state_dict())
        loss, grads = loss_and_grads(model, "naive", tokens)
        steps.append((weights, tokens, loss, grads))
        opt.step()
    return steps


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash-pytorch",
                                       pytest.param("flash-triton", marks=needs_triton)])
def test_training_matches_naive_attention(trajectory, attention):
    # float32 against float64: the weights' own rounding to float32 adds one more rounding per path
    tol = gamma(transformer_rounding_depth(CFG, SEQ, BATCH) + 1, torch.float32)
    # The Triton kernels run on the GPU where there is one (the interpreter is on only without one);
    # on a GPU, fp32 matmuls are IEEE in cuBLAS and in our kernels alike, so the same bound holds.
    device = "cuda" if attention == "flash-triton" and torch.cuda.is_available() else "cpu"
    model = TransformerLM.from_config(CFG).to(device)
    for t, (weights, tokens, ref_loss, ref_grads) in enumerate(trajectory):
        model.load_state_dict({n: w.float() for n, w in weights.items()})
        loss, grads = loss_and_grads(model, attention, tokens)
        assert_relative_error(loss, ref_loss, tol, f"{attention} step {t}: loss")
        for name, g in grads.items():
            assert_relative_error(g, ref_grads[name], tol, f"{attention} step {t}: {name}")
