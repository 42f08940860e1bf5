"""MkDocs hook: fill a page's report markers from the registry (report/registry.py) at build time.

    {{ chapter.name }}            a fact: its text, in the sentence
    {{ claim: chapter.name }}     a claim about the sentence before it: nothing is shown; a false
                                  claim fails the build, naming page, line and claim
    {{ table: chapter.name }}     on a line of its own: a Markdown table and its provenance line
    {{ figure: chapter.name }}    on a line of its own: an inline SVG figure

Fenced code blocks and inline code spans are left alone (a page can show `{{ chapter.name }}`).
Every false claim and every failing item of a page is reported together, then the build stops.
"""

from __future__ import annotations

import logging
import re

from mkdocs.exceptions import PluginError

from report import registry

MARKER = re.compile(r"\{\{\s*(?:(claim|table|figure):\s*)?([a-z0-9_]+(?:\.[a-z0-9_]+)+)\s*\}\}")
SPACED = re.compile(r"( ?)" + MARKER.pattern)  # a claim takes the space before it along
BLOCK = re.compile(r"^(\s*)\{\{\s*(table|figure):\s*([a-z0-9_.]+)\s*\}\}\s*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")
FIGURE_TOKEN = "REPORTFIGURE{}"
_figures: dict[str, list[str]] = {}  # page -> the SVGs its tokens stand for


class Filler:
    def __init__(self, page: str):
        self.page, self.problems, self.figures = page, [], []

    def _item(self, kind: str, name: str, lineno: int) -> str:
        where = f"{self.page}:{lineno}"
        try:
            if kind == "claim":
                if not registry.claim(name):
                    self.problems.append(f"{where}: claim {name} is false")
                return ""
            return registry.fact(name) if kind is None else getattr(registry, kind)(name)
        except Exception as exc:  # noqa: BLE001 - reported with its page and line, then the build stops
            self.problems.append(f"{where}: {kind or 'fact'} {name}: {type(exc).__name__}: {exc}")
            return ""

    def _inline(self, text: str, lineno: int) -> str:
        def one(m: re.Match) -> str:
            if m.group(2) in ("table", "figure"):
                self.problems.append(f"{self.page}:{lineno}: {m.group(2)} {m.group(3)} must stand on a line of its own")
                return ""
            value = self._item(m.group(2), m.group(3), lineno)
            return value if m.group(2) == "claim" else m.group(1) + value

        return SPACED.sub(one, text)

    def line(self, line: str, lineno: int) -> str:
        block = BLOCK.match(line)
        if block:
            indent, kind, name = block.groups()
            out = self._item(kind, name, lineno)
            if kind == "figure":
                self.figures.append(out)
                out = FIGURE_TOKEN.format(len(self.figures) - 1)
            return "".join(f"{indent}{row}\n" if row else "\n" for row in out.splitlines())
        out, last = [], 0
        for code in INLINE_CODE.finditer(line):
            out += [self._inline(line[last:code.start()], lineno), code.group(0)]
            last = code.end()
        return "".join(out) + self._inline(line[last:], lineno)


def markers(markdown: str) -> list[tuple[int, str, str]]:
    """(line, kind, name) of every marker a page holds, outside code; kind "fact" for a fact."""
    found, fence = [], None
    for lineno, line in enumerate(markdown.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            fence = m.group(1) if fence is None else (None if m.group(1).startswith(fence[0])
                                                      and len(m.group(1)) >= len(fence) else fence)
        elif fence is None:
            found += [(lineno, kind or "fact", name) for kind, name in MARKER.findall(INLINE_CODE.sub("", line))]
    return found


def fill(markdown: str, page: str = "page.md") -> tuple[str, list[str], list[str]]:
    """The page with its markers filled, the SVGs of its figure tokens, and its problems."""
    filler, out, fence = Filler(page), [], None
    for lineno, line in enumerate(markdown.splitlines(keepends=True), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1).startswith(fence[0]) and len(m.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        out.append(line if fence is not None else filler.line(line, lineno))
    return "".join(out), filler.figures, filler.problems


def on_config(config):
    # A line of a results file that the report layer skips (torn, not JSON, not UTF-8) becomes a
    # warning naming file and line, so `mkdocs build --strict` fails on it (bench/store.py).
    from cs336_systems.bench.store import log_skipped_lines

    log_skipped_lines(logging.getLogger("mkdocs.hooks.results"))
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    text, figures, problems = fill(markdown, page.file.src_uri)
    if problems:
        raise PluginError("\n".join(problems))
    _figures[page.file.src_uri] = figures
    return text


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    figures = _figures.pop(page.file.src_uri, [])
    for i, svg in enumerate(figures):
        token = FIGURE_TOKEN.format(i)
        html = re.sub(rf"(<p>)?{token}(</p>)?", lambda _, s=svg: f'<div class="report-figure">{s}</div>', html)
    return html
