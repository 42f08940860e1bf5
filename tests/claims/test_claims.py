"""Every claim the pages make, evaluated over the committed results: one test per claim, marked
with the chapter of the page that uses it (`pytest -m ddp` runs the DDP chapter's claims). And the
registry and the pages agree: every item registered is used on a page, every marker names one.

The strict build checks the same claims where they stand (docs/hooks/markers.py); this file gives
each its own test, so a failure names the claim without building the site.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from report import registry
from tests.chapters import chapter_of_page

DOCS = Path(__file__).resolve().parents[2] / "docs"
_spec = importlib.util.spec_from_file_location("docs_hook_markers", DOCS / "hooks" / "markers.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def uses() -> dict[tuple[str, str], list[str]]:
    """(kind, name) -> the places (page:line) that use it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted([*DOCS.rglob("*.md"), *(DOCS / "labs").glob("*.py")]):
        page = path.relative_to(DOCS).as_posix()
        for line, kind, name in hook.markers(path.read_text()):
            found.setdefault((kind, name), []).append(f"{page}:{line}")
    return found


USES = uses()
CLAIMS = sorted(name for kind, name in USES if kind == "claim")


def _param(name: str):
    page = USES[("claim", name)][0].split(":")[0]
    return pytest.param(name, marks=getattr(pytest.mark, chapter_of_page(page).marker), id=name)


@pytest.mark.parametrize("name", [_param(n) for n in CLAIMS])
def test_claim_holds(name: str):
    assert registry.claim(name), f"{', '.join(USES[('claim', name)])}: claim {name} is false"


def test_every_marker_names_a_registered_item():
    unknown = [f"{where[0]}: {kind} {name}" for (kind, name), where in USES.items()
               if name not in registry.names(kind)]
    assert unknown == []


PREFIXES = sorted({n.split(".")[0] for kind in registry.KINDS for n in registry.names(kind)})


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_registered_item_is_used_on_a_page(prefix: str):
    # A claim no page uses guards no sentence; a fact, table or figure no page shows is dead code.
    unused = [f"{kind} {n}" for kind in registry.KINDS for n in registry.names(kind)
              if n.startswith(prefix + ".") and (kind, n) not in USES]
    assert unused == []
