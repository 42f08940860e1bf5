"""A checkpoint plan: for each block of the model, what its backward gets from its forward.

    none         nothing recomputed: autograd (or compile's partitioner) keeps what the backward needs
    full         torch.utils.checkpoint: the block's input kept, its whole forward recomputed
    selective    torch.utils.checkpoint with a policy (selective.py): the attention's outputs (O and
                 its log-sum-exp L) kept, so the quadratic attention forward is never recomputed;
                 the rest recomputed
    selective+G  the same, and the outputs of the block's matmul group(s) G kept too:
                     qkv   the q, k and v projections
                     out   the attention's output projection
                     w13   the SwiGLU's W1 and W3
                 (groups joined by +, in any order: selective+qkv+w13). W2's output is no group: no
                 backward formula reads it, so nothing recomputes it (compile drops it as dead code)

The plan's text, as `--checkpoint` takes it and every row records it: comma-separated MODE:COUNT
segments, counted from the first block; the counts sum to the number of blocks. One segment may
leave its count out, and then takes the blocks the others leave:

    full:22,selective:8,none:4     blocks 0-21 full, 22-29 selective, 30-33 kept (34 blocks)
    selective,none:10              the first 24 selective, the last 10 kept
    full                           every block checkpointed (the bench's old --keep-blocks 0)

`parse_plan` turns a text into the canonical plan (equal neighbours merged, groups in the order
above): `parse_plan("none:2,none:2", 4).text == "none:4"`. Anything else raises BadPlan, one line
that says what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("none", "selective", "full")
GROUPS = ("qkv", "out", "w13")


class BadPlan(ValueError):
    """A plan text that cannot be a plan for this model; the message says why."""


def block_mode(text: str) -> str:
    """The canonical form of one block's mode: 'none', 'full', 'selective' or 'selective+g1+g2'."""
    base, *groups = text.strip().split("+")
    if base not in MODES:
        raise BadPlan(f"unknown mode {text.strip()!r} (modes: {', '.join(MODES)}; selective+GROUP with "
                      f"groups {', '.join(GROUPS)})")
    if groups and base != "selective":
        raise BadPlan(f"{text.strip()!r}: only selective takes matmul groups")
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise BadPlan(f"{text.strip()!r}: unknown matmul group {bad[0]!r} (groups: {', '.join(GROUPS)})")
    if len(set(groups)) != len(groups):
        raise BadPlan(f"{text.strip()!r}: a matmul group given twice")
    return "+".join([base, *(g for g in GROUPS if g in groups)])


def saved_groups(mode: str) -> tuple[str, ...]:
    """The matmul groups a (canonical) selective mode keeps: () for selective alone and the others."""
    return tuple(mode.split("+")[1:])


def is_checkpointed(mode: str) -> bool:
    return mode != "none"


@dataclass(frozen=True)
class CheckpointPlan:
    """One canonical mode per block, block 0 first."""

    modes: tuple[str, ...]

    @property
    def text(self) -> str:
        segments: list[list] = []
        for m in self.modes:
            if segments and segments[-1][0] == m:
                segments[-1][1] += 1
            else:
                segments.append([m, 1])
        return ",".join(f"{m}:{n}" for m, n in segments)

    @property
    def kept_blocks(self) -> int:
        """Blocks not checkpointed at all."""
        return sum(not is_checkpointed(m) for m in self.modes)

    @property
    def checkpointed_blocks(self) -> int:
        return len(self.modes) - self.kept_blocks

    def count(self, mode: str) -> int:
        return sum(m == mode for m in self.modes)

    def __len__(self) -> int:
        return len(self.modes)


def parse_plan(text: str, num_blocks: int) -> CheckpointPlan:
    """The plan `text` (module docstring) for a model of `num_blocks` blocks."""
    if not text or not text.strip():
        raise BadPlan("empty plan (give MODE:COUNT segments, e.g. full:30,none:4)")
    segments: list[tuple[str, int | None]] = []
    for raw in text.split(","):
        mode_text, sep, count_text = raw.partition(":")
        mode = block_mode(mode_text)
        if not sep:
            segments.append((mode, None))
            continue
        try:
            count = int(count_text)
        except ValueError:
            raise BadPlan(f"{raw.strip()!r}: the count must be a whole number, got {count_text.strip()!r}") from None
        if count < 1:
            raise BadPlan(f"{raw.strip()!r}: the count must be at least 1")
        segments.append((mode, count))
    open_ = [m for m, n in segments if n is None]
    given = sum(n for _, n in segments if n is not None)
    if len(open_) > 1:
        raise BadPlan(f"{text!r}: at most one segment may leave out its count, {len(open_)} do")
    if open_:
        rest = num_blocks - given
        if rest < 1:
            raise BadPlan(f"{text!r}: the counts already take {given} of the model's {num_blocks} blocks, "
                          f"none left for {open_[0]!r}")
        segments = [(m, rest if n is None else n) for m, n in segments]
    elif given != num_blocks:
        raise BadPlan(f"{text!r}: the counts sum to {given}, the model has {num_blocks} blocks")
    return CheckpointPlan(tuple(m for m, n in segments for _ in range(n)))


def plan_of_keep_blocks(num_blocks: int, keep_blocks: int) -> CheckpointPlan:
    """The bench's older switch: every block but the last `keep_blocks` fully checkpointed."""
    if not 0 <= keep_blocks <= num_blocks:
        raise BadPlan(f"keep_blocks must be in [0, {num_blocks}], got {keep_blocks}")
    return CheckpointPlan(("full",) * (num_blocks - keep_blocks) + ("none",) * keep_blocks)
