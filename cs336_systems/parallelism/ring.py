"""The handout's ring collectives, simulated step by step over a list of per-device tensors.

Each step every device sends one message to its right neighbour, all at once; the simulation moves
real tensors (so the result can be checked against a plain sum) and counts the bytes each device
sends and receives. With egress bandwidth W per device a step lasts as long as its largest message
takes to send, so the collective's time is sum over steps of max_i bytes_i / W: the number the
closed forms in costs.py predict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RingTrace:
    """What a simulated collective did: per-device results and bytes, per-step largest message."""

    result: list[torch.Tensor]
    sent: list[int]
    received: list[int]
    step_bytes: list[int] = field(default_factory=list)

    def time(self, W: float) -> float:
        """Seconds at W bytes/s of egress per device: every step waits for its largest message."""
        return sum(self.step_bytes) / W

    def then(self, other: "RingTrace") -> "RingTrace":
        """This collective followed by `other` (the result is other's)."""
        return RingTrace(other.result, [a + b for a, b in zip(self.sent, other.sent)],
                         [a + b for a, b in zip(self.received, other.received)],
                         self.step_bytes + other.step_bytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check(xs: list[torch.Tensor]) -> int:
    if len(xs) < 1:
        raise ValueError("need at least one device's tensor")
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"every device must hold a tensor of one shape, got {sorted(shapes)}")
    return len(xs)


def _exchange(trace: RingTrace, outgoing: list[torch.Tensor]) -> list[torch.Tensor]:
    """One step: device i sends outgoing[i] to (i + 1) mod N; returns what each device receives."""
    N = len(outgoing)
    for i, msg in enumerate(outgoing):
        trace.sent[i] += _nbytes(msg)
        trace.received[(i + 1) % N] += _nbytes(msg)
    trace.step_bytes.append(max(_nbytes(m) for m in outgoing))
    return [outgoing[(i - 1) % N].clone() for i in range(N)]  # a copy: the wire does not alias


# --8<-- [start:reduce_scatter]
def reduce_scatter(xs: list[torch.Tensor]) -> RingTrace:
    """Device i holds x^(i) (S bytes) and ends with chunk i of sum_i x^(i) (chunks along dim 0).

    Step t = 1..N-1: device i sends its partial sum of chunk (i - t) mod N to the right, and adds
    the partial sum of chunk (i - t - 1) mod N it receives from the left to its own.
    """
    N = _check(xs)
    y = [list(x.clone().tensor_split(N)) for x in xs]  # y[i][c]: device i's partial sum of chunk c
    trace = RingTrace([], [0] * N, [0] * N)
    for t in range(1, N):
        received = _exchange(trace, [y[i][(i - t) % N] for i in range(N)])
        for i in range(N):
            y[i][(i - t - 1) % N] += received[i]
    trace.result = [y[i][i] for i in range(N)]
    return trace
# --8<-- [end:reduce_scatter]


# --8<-- [start:all_gather]
def all_gather(chunks: list[torch.Tensor]) -> RingTrace:
    """Device i holds chunk i and ends with every chunk, concatenated along dim 0.

    Step t = 1..N-1: device i passes on the chunk it received last step (its own at t = 1), which is
    chunk (i - t + 1) mod N, and receives chunk (i - t) mod N.
    """
    N = len(chunks)
    if N < 1:
        raise ValueError("need at least one device's chunk")
    have = [{i: chunks[i].clone()} for i in range(N)]
    trace = RingTrace([], [0] * N, [0] * N)
    for t in range(1, N):
        received = _exchange(trace, [have[i][(i - t + 1) % N] for i in range(N)])
        for i in range(N):
            have[i][(i - t) % N] = received[i]
    trace.result = [torch.cat([have[i][c] for c in range(N)]) for i in range(N)]
    return trace
# --8<-- [end:all_gather]


def all_reduce(xs: list[torch.Tensor]) -> RingTrace:
    """Ring all-reduce: reduce-scatter, then all-gather of the reduced chunks."""
    rs = reduce_scatter(xs)
    return rs.then(all_gather(rs.result))


# --8<-- [start:alternate]
def alternate_all_reduce(xs: list[torch.Tensor]) -> RingTrace:
    """The handout's alternate ring (problem alternate_ring_all_reduce): whole tensors go round.

    Step t = 1..N-1: device i sends x^((i - t + 1) mod N) (its own at t = 1, then what it received
    last) to the right, receives x^((i - t) mod N) and adds it to its running sum. Every message is
    a full S bytes, N - 1 of them: (N - 1) S / W, against 2 (N - 1)/N S / W for the ring all-reduce.
    """
    N = _check(xs)
    total = [x.clone() for x in xs]
    passing = [x.clone() for x in xs]
    trace = RingTrace([], [0] * N, [0] * N)
    for _ in range(1, N):
        passing = _exchange(trace, passing)
        for i in range(N):
            total[i] += passing[i]
    trace.result = total
    return trace
# --8<-- [end:alternate]
