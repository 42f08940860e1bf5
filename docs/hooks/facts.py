"""MkDocs hook: fill `{{ chapter.name }}` placeholders in the prose with facts from the report layer.

The sentence around a placeholder is written by hand in the Markdown; the number comes from
`report.facts.render(name)`, which reads the committed results. Fenced code blocks are left alone
(they are code, and the Justfile's `{{ARGS}}` has no dot anyway). An unknown name fails the build.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

from report.facts import render

PLACEHOLDER = re.compile(r"\{\{\s*([a-z0-9_]+(?:\.[a-z0-9_]+)+)\s*\}\}")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


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
        out.append(line if fence is not None else PLACEHOLDER.sub(lambda f: render(f.group(1)), line))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    try:
        return fill(markdown)
    except KeyError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc.args[0]}") from None
