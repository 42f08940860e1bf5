"""Units and the few ways a number is written in a sentence, shared by every chapter's module."""

from __future__ import annotations

from collections.abc import Iterable

KiB, MiB, GiB = 2**10, 2**20, 2**30
GB = 1e9


def span(values: Iterable[float], fmt: str = ".0f", unit: str = "") -> str:
    """'lo to hi' of some values, each formatted (one value when both read the same)."""
    values = list(values)
    lo, hi = f"{min(values):{fmt}}{unit}", f"{max(values):{fmt}}{unit}"
    return lo if lo == hi else f"{lo} to {hi}"


def pm(mean: float, std: float, fmt: str = ".1f") -> str:
    return f"{mean:{fmt}} ± {std:{fmt}}"


def listed(values: Iterable[object], fmt: str = "") -> str:
    """'a, b and c': values in a sentence, each formatted."""
    parts = [format(v, fmt) for v in values]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def near(value: float, target: float, rel: float) -> bool:
    """Whether `value` is within `rel` (relative) of `target`."""
    return abs(value - target) <= rel * abs(target)
