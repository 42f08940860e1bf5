"""The chapter map of the site: chapter -> package modules -> tests -> `just` recipe -> results.

docs/index.md runs this at build time, so the map is read off the repository as it is: a module,
test or results file appears only once it exists. What each chapter owns is declared below; the
rest is found: the modules a chapter shows (its `--8<--` includes), the results it renders (its
`results_table(...)` / `load_results(...)` calls), and the test files that import those modules or
call the course adapters the chapter answers.

Run: python snippets/chapter_map.py
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from cs336_systems.bench.registry import BENCHMARKS
from cs336_systems.bench.store import REPO_ROOT as ROOT

MARKERS = ("gpu", "distributed", "interpreter", "slow", "docs")


@dataclass(frozen=True)
class Chapter:
    page: str  # under docs/
    title: str
    benches: tuple[str, ...] = ()  # names in cs336_systems/bench/registry.py
    adapters: tuple[str, ...] = ()  # tests/adapters.py functions whose tests prove this chapter


CHAPTERS = (
    Chapter("profiling.md", "Profiling and benchmarking", ("model", "end-to-end", "kernels")),
    Chapter("mixed-precision.md", "Mixed precision", ("accumulation", "end-to-end")),
    Chapter("labs/accumulation.py", "Lab: accumulation in low precision"),
    Chapter("memory.md", "Memory", ("memory",)),
    Chapter("attention.md", "Attention and torch.compile", ("attention",)),
    Chapter("flash-attention.md", "FlashAttention-2 in Triton", ("flash-sweep", "flash-leaderboard"),
            ("get_flashattention_autograd_function_pytorch", "get_flashattention_autograd_function_triton")),
    Chapter("collectives.md", "Collectives", ("collectives",)),
    Chapter("ddp.md", "Data-parallel training", ("ddp",),
            ("get_ddp_individual_parameters", "get_ddp_bucketed")),
    Chapter("communication-accounting.md", "Communication accounting"),
    Chapter("sharding.md", "Optimizer state sharding", ("sharding",), ("get_sharded_optimizer",)),
)

SNIPPET = re.compile(r'--8<--\s+"(cs336_systems/[^":]+\.py)')
RESULTS_CALL = re.compile(r'(?:results_table|load_results)\(\s*["\']([^"\']+)["\']')


def module_file(dotted: str) -> Path | None:
    path = ROOT / Path(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def chapter_modules(chapter: Chapter) -> list[str]:
    """Dotted names of the modules behind the chapter's benchmarks and the code it shows."""
    names = [BENCHMARKS[b].module for b in chapter.benches if module_file(BENCHMARKS[b].module)]
    page = ROOT / "docs" / chapter.page
    if page.exists():
        for rel in SNIPPET.findall(page.read_text()):
            names.append(rel.removesuffix(".py").replace("/", "."))
    return list(dict.fromkeys(names))


def imported_names(test: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def chapter_tests(chapter: Chapter, modules: list[str]) -> list[tuple[str, list[str]]]:
    """(test file, markers it uses) for each test that imports the modules or calls the adapters."""
    found = []
    for test in sorted((ROOT / "tests").glob("test_*.py")):
        text = test.read_text()
        imports = imported_names(test)
        uses_module = any(name == m or name.startswith(m + ".") for name in imports for m in modules)
        uses_adapter = any(re.search(rf"\b{a}\b", text) for a in chapter.adapters)
        if uses_module or uses_adapter:
            markers = [m for m in MARKERS if re.search(rf"pytest\.mark\.{m}\b", text)]
            found.append((test.relative_to(ROOT).as_posix(), markers))
    return found


def chapter_results(chapter: Chapter) -> list[str]:
    """Results files the chapter renders (every device file of each bench it reads)."""
    page = ROOT / "docs" / chapter.page
    if not page.exists():
        return []
    files = []
    for bench in dict.fromkeys(RESULTS_CALL.findall(page.read_text())):
        files += sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "results" / bench).glob("*.jsonl"))
    return files


def page_link(page: str) -> str:
    """Link from the site's home page (directory URLs: profiling.md -> profiling/)."""
    return page.removesuffix(".md").removesuffix(".py") + "/"


def chapter_map() -> str:
    none = "—"
    lines = ["| chapter | package modules | tests (markers) | `just` recipe | results |",
             "|---|---|---|---|---|"]
    for ch in CHAPTERS:
        modules = chapter_modules(ch)
        tests = chapter_tests(ch, modules)
        recipes = [f"`just bench {b}`" for b in ch.benches if module_file(BENCHMARKS[b].module)]
        results = chapter_results(ch)
        cells = [
            f"[{ch.title}]({page_link(ch.page)})",
            "<br>".join(f"`{m}`" for m in modules) or none,
            "<br>".join(f"`{t}`" + (f" ({', '.join(ms)})" if ms else "") for t, ms in tests) or none,
            "<br>".join(recipes) or none,
            "<br>".join(f"`{r}`" for r in results) or none,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(chapter_map())
