"""MkDocs hook: keep every page self-contained (nothing loads from outside the site's server).

Two steps on each rendered page:
1. Drop nbconvert's Mermaid loader from the notebook page (mkdocs-jupyter's template always emits a
   script that would import Mermaid from a CDN if the notebook had a diagram; ours have none).
2. Log an error for any external asset left: `src`/`href` of script, link, img, iframe, source,
   audio, video, embed, object; `url(http...)` in inline CSS; `import("http...")` in inline JS.
   Under `mkdocs build --strict` that fails the build and names the page. Plain links (`<a href>`)
   to papers are fine: following one is the reader's choice, not a request the page makes.
"""

from __future__ import annotations

import re

from mkdocs.plugins import get_plugin_logger

log = get_plugin_logger("offline")

NBCONVERT_MERMAID = re.compile(
    r'<script type="module">(?:(?!</script>).)*?cdnjs\.cloudflare\.com/ajax/libs/mermaid(?:(?!</script>).)*?</script>',
    re.S)
ASSET_TAGS = "script|link|img|iframe|source|audio|video|embed|object|track|input"
TAG = re.compile(rf"<({ASSET_TAGS})\b([^>]*)>", re.I)
ATTR = re.compile(r"""([\w-]+)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""")
ASSET_ATTRS = {"src", "href", "srcset", "data", "poster"}
# <link rel=...> kinds that name a URL without fetching it (`mkdocs serve` adds a canonical link).
NOT_FETCHED = {"canonical", "alternate", "author", "license", "help", "search", "next", "prev"}
EXTERNAL = re.compile(r"(?i)(https?:)?//")
CSS_URL = re.compile(r"""(?:url\(|@import\s+)\s*["']?((?:https?:)?//[^"')\s]+)""", re.I)
JS_IMPORT = re.compile(r"""\b(?:import|importScripts)\(\s*["']((?:https?:)?//[^"']+)""")


def external_assets(text: str) -> list[str]:
    """Every URL in `text` that a browser would fetch from another host while showing the page."""
    found = []
    for tag in TAG.finditer(text):
        attrs = {k.lower(): v.strip("\"'") for k, v in ATTR.findall(tag.group(2))}
        if tag.group(1).lower() == "link" and set(attrs.get("rel", "").lower().split()) <= NOT_FETCHED \
                and attrs.get("rel"):
            continue
        for name in ASSET_ATTRS & attrs.keys():
            urls = [u.split()[0] for u in attrs[name].split(",") if u.strip()] if name == "srcset" \
                else [attrs[name]]
            found += [u for u in urls if EXTERNAL.match(u.strip())]
    found += CSS_URL.findall(text) + JS_IMPORT.findall(text)
    return found


def on_post_page(output: str, page, config) -> str:  # noqa: ARG001 (mkdocs API)
    output = NBCONVERT_MERMAID.sub("", output)
    for url in dict.fromkeys(external_assets(output)):
        log.error(f"{page.file.src_uri}: the page would load {url} from outside the site; "
                  "vendor nothing, render at build time instead")
    return output
