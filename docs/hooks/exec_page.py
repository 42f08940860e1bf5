"""MkDocs hook: say which page a failing `python exec="on"` block is on.

markdown-exec logs the failing code and its traceback but not the page, and a strict build that
aborts on it should point at the file to open. We remember the page being rendered and prefix its
name to markdown-exec's log records on their way through mkdocs' handlers. It also turns each
skipped line of a results file into such a warning (cs336_systems.bench.store.log_skipped_lines).
"""

from __future__ import annotations

import logging

_current: dict[str, str | None] = {"page": None}


class _NameThePage(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        page = _current["page"]
        if page and "markdown_exec" in record.name and not getattr(record, "page_named", False):
            record.msg = f"{page}: {record.msg}"
            record.page_named = True  # one record passes through several handlers
        return True


_FILTER = _NameThePage()


def on_config(config):
    for handler in logging.getLogger("mkdocs").handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    # A line of a results file that the report layer skips (torn, not JSON, not UTF-8) is a
    # warning naming file and line, so `mkdocs build --strict` fails on it (bench/store.py).
    from cs336_systems.bench.store import log_skipped_lines

    log_skipped_lines(logging.getLogger("mkdocs.hooks.results"))
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    _current["page"] = page.file.src_uri
    return markdown


def on_post_build(config) -> None:  # noqa: ARG001 (mkdocs API)
    _current["page"] = None
