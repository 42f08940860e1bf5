"""The home page's chapter map, read off the repository when the site is built (tests/chapters.py
declares each chapter; a module, test or results file shows only once it exists).

Run: python snippets/chapter_map.py
"""

from __future__ import annotations

import re
from pathlib import Path

from cs336_systems.bench.registry import BENCHMARKS
from cs336_systems.bench.store import REPO_ROOT as ROOT
from tests.chapters import CHAPTERS, Chapter

TEST_MARKERS = ("gpu", "distributed", "interpreter", "slow", "docs")
INCLUDE = re.compile(r'--8<--\s+"(cs336_systems/[^":]+\.py)')


def module_exists(dotted: str) -> bool:
    path = ROOT / "cs336_systems" / Path(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def modules(ch: Chapter) -> list[str]:
    """Declared modules, the benchmarks' modules and the modules its pages include."""
    names = list(ch.modules) + [BENCHMARKS[b].module.removeprefix("cs336_systems.") for b in ch.benches]
    for page in ch.pages:
        if (ROOT / "docs" / page).exists():
            names += [m.removesuffix(".py").removeprefix("cs336_systems/").replace("/", ".")
                      for m in INCLUDE.findall((ROOT / "docs" / page).read_text())]
    return [n for n in dict.fromkeys(names) if module_exists(n)]


def tests(ch: Chapter) -> list[str]:
    """Its test files, each with the markers it uses (gpu, distributed, ...), its own or those of the
    tests/ helpers it imports (tests/triton_mode.py carries `pytestmark`)."""
    out = []
    for path in sorted({p for g in ch.tests for p in (ROOT / "tests").glob(g)}):
        text = path.read_text()
        helpers = {ROOT / "tests" / f"{m}.py" for m in re.findall(r"^\s*from tests\.(\w+) import", text, re.M)}
        text += "".join(h.read_text() for h in helpers if h.exists())
        used = [m for m in TEST_MARKERS if re.search(rf"pytest\.mark\.{m}\b", text)]
        name = path.relative_to(ROOT / "tests").as_posix()
        out.append(name + (f" ({', '.join(used)})" if used else ""))
    return out


def grouped(names: list[str]) -> str:
    """'profiling.a', 'profiling.b', 'bench.c' -> '`profiling`: a, b<br>`bench`: c'."""
    groups: dict[str, list[str]] = {}
    for name in names:
        head, _, tail = name.rpartition(".")
        groups.setdefault(head, []).append(tail)
    return "<br>".join(f"`{h}`: {', '.join(t)}" if h else ", ".join(t) for h, t in groups.items())


def results(ch: Chapter) -> str:
    """Its results files, grouped by folder: '`memory`: peaks, residual (nvidia-h200)'."""
    files = sorted({p for g in ch.results for p in (ROOT / "results").glob(f"{g}/*.jsonl")})
    benches: dict[str, list[str]] = {}
    for f in files:
        benches.setdefault(f.parent.relative_to(ROOT / "results").as_posix(), []).append(f.stem)
    folders: dict[str, dict[str, list[str]]] = {}
    for bench, devices in benches.items():
        head, _, tail = bench.rpartition("/")
        folders.setdefault(head, {})[tail] = devices
    cells = []
    for head, tails in folders.items():  # one device list for the folder when every file shares it
        kinds = {tuple(d) for d in tails.values()}
        body = (f"{', '.join(tails)} ({', '.join(next(iter(kinds)))})" if len(kinds) == 1
                else ", ".join(f"{t} ({', '.join(d)})" for t, d in tails.items()))
        cells.append(f"`{head}`: {body}" if head else body)
    return "<br>".join(cells)


def chapter_map() -> str:
    lines = ["| chapter | modules in `cs336_systems/` | its tests | tests in `tests/` (markers) "
             "| `just bench` NAME | results in `results/` (device) |", "|---|---|---|---|---|---|"]
    for ch in CHAPTERS:
        link = f"[{ch.title}]({ch.pages[0]})" if ch.pages else ch.title
        cells = [link, grouped(modules(ch)), f"`pytest -m {ch.marker}`", ", ".join(tests(ch)),
                 ", ".join(b for b in ch.benches if b in BENCHMARKS), results(ch)]
        lines.append("| " + " | ".join(c or "—" for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(chapter_map())
