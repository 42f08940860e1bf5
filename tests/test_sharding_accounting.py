"""Memory and communication accounting of data parallelism and ZeRO (optimizer_state_sharding_
accounting) against hand-worked values, and the measuring helpers against autograd itself."""

from __future__ import annotations

import weakref

import pytest
import torch

from cs336_systems.model import TransformerLM, count_parameters, cross_entropy, get_config
from cs336_systems.sharding import accounting as acc

# -- ZeRO bytes per parameter (Rajbhandari et al. 2020, table 1) and communication volume -------------------------------

@pytest.mark.parametrize("N", [1, 2, 8, 64])
def test_zero_bytes_per_parameter_match_the_paper(N):
    assert acc.bytes_per_parameter("ddp", N) == 16
    assert acc.bytes_per_parameter("zero1", N) == pytest.approx(4 + 12 / N)
    assert acc.bytes_per_parameter("sharded", N) == pytest.approx(4 + 12 / N)
    assert acc.bytes_per_parameter("zero2", N) == pytest.approx(2 + 14 / N)
    assert acc.bytes_per_parameter("zero3", N) == pytest.approx(16 / N)


def test_communication_volume():
    P, N = 1000, 4
    allreduce = 2 * 3 / 4 * P * 4  # ring all-reduce of P fp32 values
    assert acc.communication_bytes_per_rank("ddp", P, N) == allreduce
    assert acc.communication_bytes_per_rank("zero1", P, N) == allreduce  # RS + AG = one AR
    assert acc.communication_bytes_per_rank("sharded", P, N) == 1.5 * allreduce
    assert acc.communication_bytes_per_rank("zero3", P, N) == 1.5 * allreduce
    assert acc.communication_bytes_per_rank("ddp", P, 1) == 0
    with pytest.raises(ValueError, match="stage"):
        acc.communication_bytes_per_rank("zero4", P, N)


def test_fp32_memory_breakdown_of_a_preset():
    cfg = get_config("small")
    P = 128_625_408  # the handout's small model: 128,625,408 parameters
    m = acc.memory_per_rank(count_parameters(cfg)["total"], 2, "sharded", acc.FP32_ADAMW)
    assert (m.params, m.grads, m.optimizer_state) == (4 * P, 4 * P, 8 * P / 2)


# -- the activation formula and the measuring helpers, against autograd itself ---------------------

def _saved_bytes_by_hand(model, x) -> int:
    """Independent count: distinct storages autograd saves, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cross_entropy(model(x), x)
    return sum(seen.values())


@pytest.mark.parametrize("batch, seq", [(1, 64), (3, 40)])
def test_activation_formula_matches_what_autograd_saves(batch, seq):
    cfg = get_config("tiny")
    torch.manual_seed(0)
    model = TransformerLM.from_config(cfg)
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    assert acc.transformer_activation_bytes(cfg, batch, seq) == _saved_bytes_by_hand(model, x)
    with acc.saved_activation_bytes(model.parameters()) as saved:
        cross_entropy(model(x), x)
    assert saved["bytes"] == _saved_bytes_by_hand(model, x)


def test_saved_activation_bytes_frees_a_graph_that_is_never_backpropagated():
    # exp saves its own output: a pack hook returning that tensor as is would keep it alive forever
    x = torch.randn(16, requires_grad=True)
    with acc.saved_activation_bytes() as saved:
        y = x.exp()
    alive = weakref.ref(y)
    del y
    assert saved["bytes"] == 16 * 4 and alive() is None


def test_memory_probe_counts_params_grads_and_adamw_state():
    cfg = get_config("tiny")
    model = TransformerLM.from_config(cfg)
    P = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = acc.MemoryProbe(model, opt)
    init = probe.record("after_init")
    assert (init["params_bytes"], init["grads_bytes"], init["state_bytes"]) == (4 * P, 0, 0)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    cross_entropy(model(x), x).backward()
    assert probe.record("before_step")["grads_bytes"] == 4 * P
    opt.step()
    # m and v per parameter, plus AdamW's fp32 scalar step count per tensor
    assert probe.record("after_step")["state_bytes"] == 8 * P + 4 * n_tensors
