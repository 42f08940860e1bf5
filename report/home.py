"""The home page's chapter map: snippets/chapter_map.py renders the one map, tests/chapters.py."""

import runpy

from report.registry import register
from report.results import REPO_ROOT

register("home", tables={"chapter_map": lambda: runpy.run_path(str(REPO_ROOT / "snippets" / "chapter_map.py"))["chapter_map"]()})
