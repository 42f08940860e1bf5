"""The one chapter map (report/chapters.py) matches the repository: every glob finds a file, and
every test file, results folder and page of the site belongs to a chapter."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from tests.chapters import CHAPTERS, NOT_YET_MEASURED, chapter_of_page, chapters_of
from tests.test_docs import nav_pages

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def test_every_glob_matches_a_file():
    dead = [(c.marker, g) for c in CHAPTERS for g in c.tests if not list(TESTS.glob(g))]
    dead += [(c.marker, g) for c in CHAPTERS for g in c.results if not list((ROOT / "results").glob(f"{g}/*.jsonl"))
             and not g.startswith("fsdp") and not g.startswith("parallelism")  # no two-GPU rows yet
             and g not in NOT_YET_MEASURED]
    assert dead == []


def test_every_test_file_belongs_to_a_chapter():
    files = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")]
    assert [f for f in files if not chapters_of(f)] == []


def test_every_results_folder_belongs_to_a_chapter():
    folders = {p.parent.relative_to(ROOT / "results").as_posix() for p in (ROOT / "results").rglob("*.jsonl")
               if "_local" not in p.parts}
    assert [f for f in sorted(folders) if not any(fnmatch(f, g) for c in CHAPTERS for g in c.results)] == []


def test_every_page_of_the_nav_belongs_to_one_chapter():
    for page in nav_pages():
        chapter_of_page(page)
    assert len({c.marker for c in CHAPTERS}) == len(CHAPTERS)
