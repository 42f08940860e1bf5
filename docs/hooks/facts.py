"""MkDocs hook: fill `{{ chapter.name }}` placeholders in the prose with facts from the report layer.

The sentence around a placeholder is written by hand in the Markdown; the number comes from
`report.facts.render(name)`, which reads the committed results. Fenced code blocks and inline code
spans are left alone (they are code; a page can show a placeholder as `{{ chapter.name }}`). An
unknown name fails the build.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

from report.facts import render

PLACEHOLDER = re.compile(r"\{\{\s*([a-z0-9_]+(?:\.[a-z0-9_]+)+)\s*\}\}")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")  # `...` spans stay literal, so a page can show a placeholder


def _fill_line(line: str) -> str:
    out, last = [], 0
    for code in INLINE_CODE.finditer(line):
        out.append(PLACEHOLDER.sub(lambda f: render(f.group(1)), line[last:code.start()]))
        out.append(code.group(0))
        last = code.end()
    out.append(PLACEHOLDER.sub(lambda f: render(f.group(1)), line[last:]))
    return "".join(out)


def fill(markdown: str) -> str:
    out, fence = [], None
    for line in markdown.splitlines(keepends=True):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1).startswith(fence[0]) and len(m.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        out.append(line if fence is not None else _fill_line(line))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    try:
        return fill(markdown)
    except KeyError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc.args[0]}") from None
