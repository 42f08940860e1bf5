"""The chapter map as conftest reads it (marker -> (title, test globs)); the map itself, which the
home page renders too, is report/chapters.py."""

from report.chapters import CHAPTERS as MAP
from report.chapters import chapter_of_page, chapters_of

CHAPTERS = {c.marker: (c.title, c.tests) for c in MAP}

__all__ = ["CHAPTERS", "MAP", "chapter_of_page", "chapters_of"]
