"""The old fact decorator, kept while chapters move to report.registry.register (then removed)."""

from __future__ import annotations

from report import registry


def fact(name: str):
    def deco(fn):
        chapter, _, short = name.partition(".")
        registry.register(chapter, facts={short: fn})
        return fn
    return deco


def register(facts: dict) -> None:
    """Register `{"chapter.name": fn}` (the old profiling-style table)."""
    for name, fn in facts.items():
        fact(name)(fn)


def names() -> list[str]:
    return registry.names("fact")
