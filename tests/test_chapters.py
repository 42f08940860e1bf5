"""Every test file proves at least one chapter, and every chapter's page says how to run its tests."""

from __future__ import annotations

from pathlib import Path

from tests.chapters import CHAPTERS, chapters_of

TESTS = Path(__file__).parent


def test_every_test_file_belongs_to_a_chapter():
    files = [p.relative_to(TESTS).as_posix() for p in [*TESTS.glob("test_*.py"), *TESTS.glob("claims/test_*.py")]]
    assert [f for f in files if not chapters_of(f)] == []


def test_every_chapter_marker_matches_some_test_file():
    files = [p.relative_to(TESTS).as_posix() for p in [*TESTS.glob("test_*.py"), *TESTS.glob("claims/test_*.py")]]
    assert [m for m in CHAPTERS if not any(m in chapters_of(f) for f in files)] == []


def test_the_home_page_map_names_real_markers():
    import runpy

    chapters = runpy.run_path(str(TESTS.parent / "snippets" / "chapter_map.py"))["CHAPTERS"]
    assert {c.marker for c in chapters if c.marker} <= set(CHAPTERS)
