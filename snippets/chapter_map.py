"""The chapter map of the site: chapter -> package modules -> tests -> `just` recipe -> results.

docs/index.md runs this at build time, so the map is read off the repository as it is: a module,
test or results file appears only once it exists. Each chapter declares its benchmarks (registry
names), modules, test-file globs and results folders below; on top of those the map adds the
modules its page includes (`--8<--`), the results its page reads by name (`results_table(...)`,
`load_results(...)`), and the tests that import its benchmark modules.

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
    modules: tuple[str, ...] = ()  # under cs336_systems/, dotted (shown only once they exist)
    tests: tuple[str, ...] = ()  # globs under tests/ (besides the tests that import the modules)
    results: tuple[str, ...] = ()  # bench globs under results/ (besides the ones the page reads)
    marker: str = ""  # the pytest marker of the chapter's tests (tests/chapters.py): `pytest -m marker`


CHAPTERS = (
    Chapter("profiling.md", "Profiling and benchmarking", ("model", "end-to-end", "kernels"),
            ("profiling.benchmark", "profiling.steps", "profiling.nvtx", "profiling.torch_profile",
             "profiling.sweeps", "profiling.kernel_sweep", "profiling.kernel_attribution", "profiling.clocks",
             "bench.timing"),
            ("test_benchmark*.py", "test_profil*.py", "test_timing*.py"), ("end-to-end/*", "profiling/*"), marker="profiling"),
    Chapter("mixed-precision.md", "Mixed precision", ("accumulation", "end-to-end"),
            ("profiling.mixed_precision", "profiling.sweeps"), ("test_mixed_precision*.py",),
            ("mixed-precision/*",), marker="mixed_precision"),
    Chapter("labs/accumulation.py", "Lab: accumulation in low precision"),
    Chapter("memory.md", "Memory", ("memory",), ("profiling.memory", "profiling.memory_sweep"),
            ("test_memory*.py",), ("memory/*",), marker="memory"),
    Chapter("attention.md", "Attention and torch.compile", ("attention", "attention-oom"),
            ("attention.reference", "attention.benchmarks.pytorch_sweep", "model.attention", "profiling.attention_oom"),
            ("test_attention*.py", "test_pytorch_attention*.py", "test_model_attention*.py"),
            ("attention/pytorch_attention", "attention/oom_checks"), marker="attention"),
    Chapter("flash-attention.md", "FlashAttention-2 in Triton", ("flash-sweep", "flash-leaderboard", "flash-host"),
            ("attention.weighted_sum", "attention.online_softmax", "attention.flash_pytorch",
             "attention.flash_triton", "attention.flash_fwd_kernel", "attention.flash_bwd_kernel",
             "attention.tile_io", "attention.flash_launch", "attention.tiles", "attention.api",
             "attention.benchmarks.flash_sweep", "attention.benchmarks.leaderboard", "attention.fast.function",
             "attention.fast.table", "attention.fast.tuning.tune", "attention.fast.experiments.ab_dkdv",
             "attention.fast.experiments.ab_onepass", "attention.fast.flash_bwd_onepass_kernel",
             "attention.fast.experiments.reduce_probe", "attention.fast.gluon.flash_bwd_ws_kernel",
             "attention.fast.gluon.onepass_ws", "attention.fast.direct_launch"),
            ("test_flash*.py", "test_online_softmax*.py", "test_weighted_sum*.py", "test_ab_*.py", "test_reduce_probe*.py", "test_onepass_ws*.py",
             "test_direct_launch*.py"),
            ("attention/flash_*", "attention/dkdv_ab", "attention/onepass_ab", "attention/reduce_probe",
             "attention/host_overhead"), marker="flash"),
    Chapter("collectives.md", "Collectives", ("collectives",),
            ("distributed.collectives_bench", "distributed.launch"), ("test_collectives*.py", "test_launch*.py"),
            ("collectives/*",), marker="collectives"),
    Chapter("ddp.md", "Data-parallel training", ("ddp",),
            ("distributed.ddp", "distributed.ddp.naive", "distributed.ddp.flat", "distributed.ddp.overlap",
             "distributed.ddp.buckets", "distributed.ddp.bucketed", "distributed.step_trace"),
            ("test_ddp*.py", "test_bucket*.py"), ("ddp/*",), marker="ddp"),
    Chapter("communication-accounting.md", "Communication accounting", (),
            ("sharding.communication_accounting",), ("test_communication_accounting*.py",), marker="comm_accounting"),
    Chapter("sharding.md", "Optimizer state sharding", ("sharding",),
            ("sharding.sharded_optimizer", "sharding.zero1", "sharding.accounting", "sharding.sharding_bench"),
            ("test_sharded_optimizer*.py", "test_sharding*.py"), ("sharding/*",), marker="sharding"),
    Chapter("fsdp.md", "Fully sharded data parallel (2026)", ("fsdp",),
            ("distributed.fsdp.shard_layout", "distributed.fsdp.layers", "distributed.fsdp.comm",
             "distributed.fsdp.fsdp", "distributed.fsdp.gather"),
            ("test_fsdp*.py", "test_adapters_2026.py"), ("fsdp/*",), marker="fsdp"),
    Chapter("memory/checkpointing.md", "Gradient checkpointing (2026)", ("checkpointing",),
            ("profiling.checkpoint_theory",), ("test_checkpointing*.py",), ("memory/checkpointing",),
            marker="memory"),
    Chapter("parallelism.md", "Choosing a parallelism (2026)", ("tp-ffn",),
            ("parallelism.ring", "parallelism.costs", "parallelism.answers", "parallelism.tp_ffn"),
            ("test_parallelism*.py", "test_tp_ffn*.py"), ("parallelism/*",), marker="parallelism"),
    Chapter("training-step.md", "The 2026 leaderboard: an 8B training step (2026)",
            ("training-step", "fused-ce", "fused-adamw"),
            ("training_step.arithmetic", "training_step.memory_budget", "training_step.fused_ce",
             "training_step.fused_adamw", "training_step.variants", "training_step.rows", "training_step.bench"),
            ("test_training_step.py", "test_fused_*.py"), ("training-step", "training_step/*"), marker="training_step"),
)

SNIPPET = re.compile(r'--8<--\s+"(cs336_systems/[^":]+\.py)')
# Imports in the page's executed code (markdown-exec blocks, the lab notebook).
PAGE_IMPORT = re.compile(r"^\s*(?:from\s+(cs336_systems[\w.]*)\s+import\s+([\w, ]+)|import\s+(cs336_systems[\w.]*))", re.M)
GENERIC = ("report.results", "cs336_systems.bench")  # every chapter renders through these
RESULTS_CALL = re.compile(r'(?:results_table|load_results)\(\s*["\']([^"\']+)["\']')


def module_file(dotted: str) -> Path | None:
    path = ROOT / Path(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def chapter_modules(chapter: Chapter) -> list[str]:
    """Dotted names of the modules behind the chapter's benchmarks and the code it shows."""
    names = [f"cs336_systems.{m}" for m in chapter.modules]
    names += [BENCHMARKS[b].module for b in chapter.benches]
    page = ROOT / "docs" / chapter.page
    if page.exists():
        text = page.read_text()
        for rel in SNIPPET.findall(text):
            names.append(rel.removesuffix(".py").replace("/", "."))
        for package, imported, module in PAGE_IMPORT.findall(text):
            if module:
                names.append(module)
                continue
            # `from cs336_systems.x import y`: y is a module when x/y.py exists, else a name in x
            for name in (n.strip() for n in imported.split(",") if n.strip()):
                names.append(f"{package}.{name}" if module_file(f"{package}.{name}") else package)
    declared = {f"cs336_systems.{m}" for m in chapter.modules}
    generic = tuple(g + "." for g in GENERIC)
    # A page importing a package-level helper (`from cs336_systems.model import get_config`) or the
    # generic rendering code does not make that package part of the chapter.
    return [n for n in dict.fromkeys(names) if module_file(n) and (n in declared or (
            n not in GENERIC and not n.startswith(generic) and module_file(n).name != "__init__.py"))]


def imported_names(test: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def helper_texts(test: Path, imports: set[str]) -> str:
    """Text of the test file and of the tests/ helpers it imports (they may carry `pytestmark`)."""
    texts = [test.read_text()]
    for name in imports:
        if name.startswith("tests."):
            helper = ROOT / "tests" / (name.split(".")[1] + ".py")
            if helper.exists() and helper != test:
                texts.append(helper.read_text())
    return "\n".join(dict.fromkeys(texts))


def chapter_tests(chapter: Chapter) -> list[tuple[str, list[str]]]:
    """(test file, markers it uses) for the chapter's tests: named for it, or importing one of its
    benchmark modules (shared modules such as the attention reference or the process launcher are
    imported by the tests of several chapters, so they do not count)."""
    benches = [BENCHMARKS[b].module for b in chapter.benches]
    found = []
    for test in sorted((ROOT / "tests").glob("test_*.py")):
        imports = imported_names(test)
        named = any(test.match(pattern) for pattern in chapter.tests)
        uses_module = any(name == m or name.startswith(m + ".") for name in imports for m in benches)
        if named or uses_module:
            text = helper_texts(test, imports)
            markers = [m for m in MARKERS if re.search(rf"pytest\.mark\.{m}\b", text)]
            found.append((test.relative_to(ROOT).as_posix(), markers))
    return found


def chapter_results(chapter: Chapter) -> list[str]:
    """Results files of the chapter: its declared benches and those its page reads by name."""
    benches = list(chapter.results)
    page = ROOT / "docs" / chapter.page
    if page.exists():
        benches += RESULTS_CALL.findall(page.read_text())
    files = {p for bench in benches for p in (ROOT / "results").glob(f"{bench}/*.jsonl")}
    return sorted(p.relative_to(ROOT).as_posix() for p in files)


def page_link(page: str) -> str:
    """Link from the site's home page (directory URLs: profiling.md -> profiling/)."""
    return page.removesuffix(".md").removesuffix(".py") + "/"


def grouped(names: list[str], sep: str = ".") -> str:
    """'profiling.a', 'profiling.b', 'bench.c' -> '`profiling`: a, b; `bench`: c' (wraps at commas)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        head, _, tail = name.rpartition(sep)
        groups.setdefault(head, []).append(tail)
    return "<br>".join(f"`{head}`: {', '.join(tails)}" if head else ", ".join(tails)
                       for head, tails in groups.items())


def results_cell(files: list[str]) -> str:
    """results/<bench>/<device>.jsonl files, grouped by folder: '`memory`: peaks, residual (cpu)'."""
    devices: dict[str, list[str]] = {}
    for f in files:
        bench, _, device = f.removeprefix("results/").removesuffix(".jsonl").rpartition("/")
        devices.setdefault(bench, []).append(device)
    folders: dict[str, dict[str, list[str]]] = {}
    for bench, devs in devices.items():
        head, _, tail = bench.rpartition("/")
        folders.setdefault(head, {})[tail] = devs
    cells = []
    for head, benches in folders.items():
        kinds = {tuple(d) for d in benches.values()}
        if len(kinds) == 1:
            body = f"{', '.join(benches)} ({', '.join(next(iter(kinds)))})"
        else:
            body = ", ".join(f"{b} ({', '.join(d)})" for b, d in benches.items())
        cells.append(f"`{head}`: {body}" if head else body)
    return "<br>".join(cells)


def chapter_map() -> str:
    none = "—"
    lines = ["| chapter | modules in `cs336_systems/` | its tests | tests in `tests/` (markers) "
             "| `just bench` NAME | results in `results/` (device) |",
             "|---|---|---|---|---|---|"]
    for ch in CHAPTERS:
        modules = [m.removeprefix("cs336_systems.") for m in chapter_modules(ch)]
        tests = chapter_tests(ch)
        recipes = [b for b in ch.benches if module_file(BENCHMARKS[b].module)]
        cells = [
            f"[{ch.title}]({page_link(ch.page)})",
            grouped(modules) or none,
            f"`pytest -m {ch.marker}`" if ch.marker else none,
            ", ".join(t.removeprefix("tests/") + (f" ({', '.join(ms)})" if ms else "") for t, ms in tests)
            or none,
            ", ".join(recipes) or none,
            results_cell(chapter_results(ch)) or none,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(chapter_map())
