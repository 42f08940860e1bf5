"""Named facts: the numbers a hand-written sentence quotes, rendered from committed results.

A chapter writes its sentences by hand and leaves each measured number as a placeholder,

    Ours takes {{ flash.lb_ours_ms }} ms against cuDNN's {{ flash.lb_cudnn_ms }} ms.

and `docs/hooks/facts.py` fills it at build time from the function registered here under that name.
So the sentence is a person's, the number is the data's, and a test in `tests/claims/` asserts the
claim the sentence makes ("faster"), so new data that overturns it fails the suite instead of
silently publishing a false sentence.

A report module registers its facts with the decorator:

    @fact("flash.lb_ours_ms")
    def _() -> str:
        return f"{leaderboard().ours_ms:.3f}"

Names are `chapter.name` (lowercase letters, digits, `_`; one dot at least).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable

NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
_FACTS: dict[str, Callable[[], str]] = {}
_LOADED: list[bool] = []  # whether every report module has been imported


def fact(name: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    """Register the function that renders the fact `name` (its result is turned into a string)."""
    if not NAME.match(name):
        raise ValueError(f"fact name must look like 'chapter.name' (lowercase, digits, _), got {name!r}")

    def register(fn: Callable[[], object]) -> Callable[[], object]:
        if name in _FACTS and _FACTS[name] is not fn:
            raise ValueError(f"fact {name!r} is registered twice")
        _FACTS[name] = lambda: str(fn())
        return fn

    return register


def _load_all() -> None:
    """Import every module of the report package, so each registers its facts."""
    import report

    if _LOADED:
        return
    _LOADED.append(True)
    for info in pkgutil.iter_modules(report.__path__):
        if info.name != "facts":
            importlib.import_module(f"report.{info.name}")


def render(name: str) -> str:
    """The fact's text. An unknown name raises KeyError naming it (the strict build fails)."""
    _load_all()
    if name not in _FACTS:
        raise KeyError(f"unknown fact {name!r}: register it with @fact({name!r}) in a report module")
    return _FACTS[name]()


def names() -> list[str]:
    _load_all()
    return sorted(_FACTS)
