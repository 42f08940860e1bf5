"""Toy models and a single-process reference trainer for the distributed tests (the shapes
of the course's own DDP test models).

The models are tiny on purpose (the largest tensor is 50 x 10 fp32 = 2000 bytes), so bucket caps
such as 0.0001 MB (= 104.9 bytes) force a parameter larger than the cap alone into its bucket.
Each carries one of the traps a data-parallel wrapper must survive:

- `ToyModel`: a frozen bias (requires_grad=False) inside a layer that is used, and a frozen
  parameter `no_grad_fixed_param` that forward never touches. A wrapper that hooks or communicates
  them crashes or hangs; both must still be broadcast from rank 0.
- `ToyModelWithTiedWeights`: one weight shared by two layers. It appears once in `parameters()` and
  receives gradient from both uses; autograd sums the two in the weight's single AccumulateGrad node,
  so `.grad` is written (and a post-accumulate hook fires) once per backward, not twice as the
  course text says (tests/test_ddp_stages.py checks which).
- `ToyModelWithUnusedParameter`: a trainable parameter forward never uses, so it never gets a
  gradient; finishing gradient synchronization must not wait for it.
- `ToyModelWithBuffer`: a registered buffer (running statistic) that must be broadcast too.

Two references for a data-parallel run in which each rank trains on `shard(batch, rank, world_size)`:

- `train_reference` runs the same steps on the whole batch in one process: the semantics DDP must
  have (the loss is a mean over equal shards, so the mean of the per-shard gradients is the
  full-batch gradient). In floating point the two only agree to within rounding, and an optimizer
  such as AdamW can turn a rounding-level difference into a visible one (tests/tolerances.py, and
  tests/test_ddp_stages.py for why), so the tests compare *gradients* with it, under a derived bound.
- `train_sharded_reference` repeats the data-parallel arithmetic in one process: each rank's
  shard gradient separately, divided by the world size, summed. For two ranks that is exactly what
  the all-reduce computes (a + b == b + a in IEEE arithmetic, and dividing by 2 is exact), so a
  correct wrapper matches it bit for bit, whatever the CPU's summation order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

IN_FEATURES = 10
OUT_FEATURES = 5


class _FrozenBiasLinear(nn.Module):
    """Linear(10 -> 50) whose bias is frozen: used in forward, never trained."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class ToyModel(nn.Module):
    """10 -> 10 -> 50 -> 5 MLP with a frozen bias and an unused frozen parameter."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = _FrozenBiasLinear()
        self.fc3 = nn.Linear(50, OUT_FEATURES, bias=False)
        self.relu = nn.ReLU()
        # Frozen and unused: must be broadcast, must not be hooked or communicated.
        self.no_grad_fixed_param = nn.Parameter(torch.randn(2), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, 10) -> (batch, 5)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class ToyModelWithTiedWeights(nn.Module):
    """fc4 and fc2 share one (50, 10) weight tensor: two uses per forward, one summed .grad write."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = _FrozenBiasLinear()          # weight (50, 10)
        self.fc3 = nn.Linear(50, 10, bias=False)
        self.fc4 = nn.Linear(10, 50, bias=False)
        self.fc4.weight = self.fc2.fc.weight    # tied: one Parameter, two uses per forward
        self.fc5 = nn.Linear(50, OUT_FEATURES, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, 10) -> (batch, 5)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.relu(self.fc3(x))
        x = self.relu(self.fc4(x))
        return self.fc5(x)


class ToyModelWithUnusedParameter(nn.Module):
    """A trainable parameter that forward never touches: its .grad stays None forever."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 20)
        self.unused = nn.Linear(20, 20)          # trainable, never called
        self.fc2 = nn.Linear(20, OUT_FEATURES)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


class ToyModelWithBuffer(nn.Module):
    """A buffer that forward reads (a fixed input scale): rank 0's copy must reach everyone."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.rand(IN_FEATURES) + 0.5)
        self.fc1 = nn.Linear(10, 16)
        self.fc2 = nn.Linear(16, OUT_FEATURES)
        self.tanh = nn.Tanh()  # a module, so tests/tolerances.py can drop it from the magnitude net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.tanh(self.fc1(x * self.scale)))


TOY_MODELS: dict[str, type[nn.Module]] = {
    "ToyModel": ToyModel,
    "ToyModelWithTiedWeights": ToyModelWithTiedWeights,
    "ToyModelWithUnusedParameter": ToyModelWithUnusedParameter,
    "ToyModelWithBuffer": ToyModelWithBuffer,
}


def make_model(name_or_cls: str | type[nn.Module], seed: int) -> nn.Module:
    """A toy model initialised from `seed` (so rank r can start from different weights than rank 0)."""
    cls = TOY_MODELS[name_or_cls] if isinstance(name_or_cls, str) else name_or_cls
    torch.manual_seed(seed)
    return cls()


def make_batches(steps: int, batch_size: int, seed: int = 1234,
                 in_features: int = IN_FEATURES, out_features: int = OUT_FEATURES
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` full batches (x: (batch, in), y: (batch, out)), identical on every rank for one seed."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, in_features, generator=g),
             torch.randn(batch_size, out_features, generator=g)) for _ in range(steps)]


def shard(batch: Sequence[torch.Tensor], rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
    """Rank `rank`'s contiguous 1/world_size slice of every tensor of the batch."""
    n = batch[0].shape[0]
    if n % world_size:
        raise ValueError(f"batch size {n} is not divisible by world_size {world_size}")
    per = n // world_size
    return tuple(t[rank * per:(rank + 1) * per] for t in batch)


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def train_reference(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                    optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
                    = default_optimizer,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                    = nn.functional.mse_loss) -> nn.Module:
    """Train a deep copy of `model` in this process on the full batches; return the copy.

    Only parameters with requires_grad go to the optimizer (frozen ones must stay put either way).
    """
    model = copy.deepcopy(model)
    optimizer = optimizer_factory([p for p in model.parameters() if p.requires_grad])
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    return model


def average_shard_gradients(model: nn.Module, batch: Sequence[torch.Tensor], world_size: int,
                            micro_batches: int = 1,
                            loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                            = nn.functional.mse_loss) -> None:
    """Set each trainable parameter's .grad to what a data-parallel step leaves there, by the same
    arithmetic: rank r's gradient from its own shard (its `micro_batches` accumulated in .grad, each
    loss divided by their number, as inside no_sync), divided by world_size, summed over ranks in
    rank order. Parameters that get no gradient keep .grad None."""
    params = [p for p in model.parameters() if p.requires_grad]
    per_rank = []
    for r in range(world_size):
        for p in params:
            p.grad = None
        x, y = shard(batch, r, world_size)
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = loss_fn(model(xm), ym)
            (loss / micro_batches if micro_batches > 1 else loss).backward()
        per_rank.append([p.grad for p in params])
    for i, p in enumerate(params):
        grads = [g[i] for g in per_rank]
        p.grad = None if grads[0] is None else sum((g / world_size for g in grads[1:]),
                                                   grads[0] / world_size)


def train_sharded_reference(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                            world_size: int,
                            optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
                            = default_optimizer, micro_batches: int = 1) -> nn.Module:
    """`train_reference`, but each step's gradient is `average_shard_gradients`: what `world_size`
    data-parallel ranks compute, in one process. Returns the trained deep copy of `model`."""
    model = copy.deepcopy(model)
    optimizer = optimizer_factory([p for p in model.parameters() if p.requires_grad])
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        average_shard_gradients(model, batch, world_size, micro_batches)
        optimizer.step()
    return model


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, detached copies (what the tests compare)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_states_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                        *, rtol: float = 0.0, atol: float = 0.0, context: str = "") -> None:
    """Same keys, every tensor equal (or within a tolerance the caller derives: none is a sensible
    default, see tests/tolerances.py); the message names the first tensor that differs."""
    assert actual.keys() == expected.keys(), f"{context}: keys differ: {actual.keys() ^ expected.keys()}"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{context}: {name}: {m}")
