"""What the pages quote, by name: facts, tables, figures and claims, each registered one way.

A chapter's module registers everything its pages use in one call, at its end:

    register("memory",
             facts={"weights_mib": lambda: f"{weights_mib():,.0f}"},        # text for a sentence
             tables={"peaks": peaks_table},                                 # Markdown + provenance
             figures={"timeline": lambda: timeline_figure(512, "train")},   # a plt.Figure
             claims={"weights_dominate": lambda: weights_mib() > 1000})     # True or False

and a page uses them by name (docs/hooks/markers.py fills them at build time):

    The weights take {{ memory.weights_mib }} MiB. {{ claim: memory.weights_dominate }}
    {{ table: memory.peaks }}
    {{ figure: memory.timeline }}

A claim is the data-dependent part of the sentence before it, as a test: it renders nothing, and
the strict build fails, naming page, line and claim, when it is false. So new results that overturn
a sentence stop the site until a person rewrites the sentence and its claim. Names are
`chapter.name` (lowercase letters, digits, `_`). Every report module is imported on first use.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Callable

KINDS = ("fact", "table", "figure", "claim")
NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
# The test that shows a false claim fails the build names one here; it then reads as false.
NEGATE = "REPORT_NEGATE_CLAIM"
_ITEMS: dict[str, dict[str, Callable[[], object]]] = {kind: {} for kind in KINDS}
_LOADED: list[bool] = []


def register(chapter: str, *, facts: dict | None = None, tables: dict | None = None,
             figures: dict | None = None, claims: dict | None = None) -> None:
    """Register a chapter's items: name (without the chapter) -> function of nothing."""
    for kind, items in zip(KINDS, (facts, tables, figures, claims)):
        for short, fn in (items or {}).items():
            name = f"{chapter}.{short}"
            if not NAME.match(name):
                raise ValueError(f"{kind} name must look like 'chapter.name' (lowercase, digits, _): {name!r}")
            if name in _ITEMS[kind] and _ITEMS[kind][name] is not fn:
                raise ValueError(f"{kind} {name!r} is registered twice")
            _ITEMS[kind][name] = fn


def _load_all() -> None:
    """Import every module of the report package, so each registers its items."""
    if _LOADED:
        return
    _LOADED.append(True)
    import report

    for info in pkgutil.iter_modules(report.__path__):
        importlib.import_module(f"report.{info.name}")


def get(kind: str, name: str) -> Callable[[], object]:
    """The registered function. An unknown name raises KeyError naming it."""
    _load_all()
    if name not in _ITEMS[kind]:
        raise KeyError(f"unknown {kind} {name!r}: register it in report/{name.split('.')[0]}*.py")
    return _ITEMS[kind][name]


def fact(name: str) -> str:
    return str(get("fact", name)())


def table(name: str) -> str:
    return str(get("table", name)())


def figure(name: str) -> str:
    from report.figures import svg

    return svg(get("figure", name)())


def claim(name: str) -> bool:
    """Whether the claim holds over the committed results (a raised error propagates)."""
    holds = bool(get("claim", name)())
    return (not holds) if os.environ.get(NEGATE) == name else holds


def names(kind: str) -> list[str]:
    _load_all()
    return sorted(_ITEMS[kind])
