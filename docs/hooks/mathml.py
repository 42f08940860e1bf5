"""MkDocs hook: turn arithmatex's generic math markup into MathML at build time.

`pymdownx.arithmatex` (generic mode) leaves `$...$` as `<span class="arithmatex">\\(...\\)</span>`
and `$$...$$` as `<div class="arithmatex">\\[...\\]</div>`, meant for a client-side script. We convert
both with the pure-Python `latex2mathml` instead, so pages carry native MathML (which Chromium,
Firefox and Safari render) and load no math script from anywhere.

A bad expression is logged as an error naming the page and the LaTeX; `mkdocs build --strict`
(our only kind of build) then fails instead of publishing raw LaTeX.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert
from mkdocs.plugins import get_plugin_logger

log = get_plugin_logger("mathml")

# The LaTeX inside is HTML-escaped (&lt; &amp;); arithmatex never nests these tags.
INLINE = re.compile(r'<span class="arithmatex">\\\((?P<tex>.*?)\\\)</span>', re.S)
DISPLAY = re.compile(r'<div class="arithmatex">\\\[(?P<tex>.*?)\\\]</div>', re.S)
# latex2mathml passes unknown commands through as text (<mi>\foo</mi>) and leaves a bare `&`
# for environments it does not know (e.g. `aligned`): both mean the reader would see junk.
# Headings keep their math as text in the table of contents: `\(...\)` inside a TOC title.
TOC_INLINE = re.compile(r"\\\((?P<tex>.*?)\\\)", re.S)
TEXT_NODE = re.compile(r">([^<]+)<")
BARE_AMPERSAND = re.compile(r"&(?!#x?[0-9A-Fa-f]+;|[A-Za-z]+;)")


class MathError(ValueError):
    """A LaTeX expression latex2mathml cannot render faithfully."""


def latex_to_mathml(tex: str, display: bool) -> str:
    """MathML for one expression; MathError when the result would not be what the author wrote."""
    try:
        mathml = convert(tex.strip(), display="block" if display else "inline")
    except Exception as exc:  # latex2mathml raises its own exception types, one per mistake
        raise MathError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
    for text in TEXT_NODE.findall(mathml):
        if "\\" in text:
            raise MathError(f"unsupported LaTeX {text.strip()!r} (latex2mathml does not know it)")
        if BARE_AMPERSAND.search(text):
            raise MathError("an `&` outside a supported environment (use align*, split, cases, "
                            "array or a matrix; `aligned` is not supported)")
    return mathml


def convert_page_math(content: str, page_name: str) -> tuple[str, list[str]]:
    """Replace every arithmatex span/div in `content`; return the new HTML and the errors."""
    errors: list[str] = []

    def replace(match: re.Match[str], display: bool) -> str:
        tex = html.unescape(match.group("tex"))
        try:
            mathml = latex_to_mathml(tex, display)
        except MathError as exc:
            errors.append(f"{page_name}: cannot convert {'display' if display else 'inline'} "
                          f"math {tex.strip()!r}: {exc}")
            return match.group(0)
        # Keep the display wrapper: Material gives `div.arithmatex` a horizontal scrollbar.
        return f'<div class="arithmatex">{mathml}</div>' if display else mathml

    content = DISPLAY.sub(lambda m: replace(m, True), content)
    content = INLINE.sub(lambda m: replace(m, False), content)
    return content, errors


def convert_toc_titles(items) -> None:
    """Math in headings, as the sidebar's table of contents shows them (titles are HTML there)."""
    for item in items:
        def replace(match: re.Match[str]) -> str:
            try:
                return latex_to_mathml(html.unescape(match.group("tex")), display=False)
            except MathError:  # already reported for the heading itself
                return match.group(0)

        item.title = TOC_INLINE.sub(replace, item.title)
        convert_toc_titles(item.children)


def on_page_content(html_content: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    content, errors = convert_page_math(html_content, page.file.src_uri)
    for message in errors:
        log.error(message)
    convert_toc_titles(page.toc)
    return content
