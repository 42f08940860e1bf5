"""The docs: snippet markers, snippet references, the strict build, and the built site in a browser.

The site is built once per session (`mkdocs build --strict` into a temporary folder). The browser
test opens it in Debian's headless Chromium: `chromium` must be installed where CI=true (CI
installs it, see .ci/run); elsewhere the browser test skips with the reason when it is absent.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER_ROOTS = (ROOT / "cs336_systems", ROOT / "snippets")
SECTION_NAME = re.compile(r"^[a-z0-9_-]+$")
# A section marker exactly as pymdownx.snippets recognises one (case-insensitive, `;` escapes it);
# our convention is stricter (lowercase), and is checked separately.
MARKER = re.compile(r"(?<!;)(?<!-)-+8<-+[ \t]+\[[ \t]*(start|end)[ \t]*:[ \t]*([a-z][-_0-9a-z]*)[ \t]*\]", re.I)
COMMENT_START = ("#", "//", "<!--", "--", "/*", "*")
# A whole-line include in a page: --8<-- "path" or --8<-- "path:section" (";--8<--" is escaped).
INCLUDE = re.compile(r'^\s*(?<!;)--8<--\s+"([^"]+)"\s*$', re.M)


# ---------------------------------------------------------------- (a) snippet markers in the source

def marker_problems(path: Path) -> list[str]:
    """Unpaired, duplicated, misnamed or malformed section markers in one file."""
    problems, open_at, closed = [], {}, set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        found = MARKER.findall(line)
        if not found:
            # A comment that was meant as a marker but that snippets will not see (code that builds
            # marker strings, e.g. f"# --8<-- [start:{name}]", is not a comment and is left alone).
            if "8<-" in line and re.search(r"\[\s*(start|end)\b", line, re.I) \
                    and line.lstrip().startswith(COMMENT_START):
                problems.append(f"{path}:{lineno}: malformed marker {line.strip()!r}")
            continue
        for kind, name in found:
            where = f"{path}:{lineno}"
            if not SECTION_NAME.match(name):
                problems.append(f"{where}: section name {name!r} must be lowercase letters, digits, - or _")
            if kind == "start":
                if name in open_at or name in closed:
                    problems.append(f"{where}: section {name!r} started twice")
                open_at[name] = lineno
            elif name not in open_at:
                problems.append(f"{where}: end of section {name!r} without a start before it")
            else:
                del open_at[name]
                closed.add(name)
    problems += [f"{path}:{lineno}: section {name!r} has no end (snippets would include the rest of "
                 f"the file)" for name, lineno in open_at.items()]
    return problems


def source_files() -> list[Path]:
    files = []
    for root in MARKER_ROOTS:
        files += [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in {".py", ".md", ".sh", ".txt", ".toml", ".yaml", ".yml", ".cfg"}]
    return sorted(files)


def test_marker_lint_catches_mistakes(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("# --8<-- [start:a]\n# --8<-- [start:B]\n# --8<-- [end:B]\n# --8<-- [end:c]\n"
                   "# --8<-- [start:d]\n# --8<-- [end:d]\n# --8<-- [start:d]\n# --8<-- [end:d]\n"
                   "# --8<-- [start e]\n")
    text = "\n".join(marker_problems(bad))
    for expected in ["'a' has no end", "'B' must be lowercase", "end of section 'c' without a start",
                     "'d' started twice", "malformed marker"]:
        assert expected in text, text


def test_every_section_marker_is_paired():
    problems = [p for f in source_files() for p in marker_problems(f)]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- (b) includes in the pages

def sections_in(path: Path) -> set[str]:
    """Names of the sections that both start and end in `path`."""
    markers = MARKER.findall(path.read_text(encoding="utf-8"))
    starts = {n for k, n in markers if k == "start"}
    return starts & {n for k, n in markers if k == "end"}


def include_problems(page: Path) -> list[str]:
    problems = []
    for ref in INCLUDE.findall(page.read_text(encoding="utf-8")):
        rel, _, section = ref.partition(":")
        target = ROOT / rel  # pymdownx.snippets base_path is the repository root
        label = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        where = f"{label}: --8<-- \"{ref}\""
        if not target.is_file():
            problems.append(f"{where}: no file {rel}")
        elif section and not re.fullmatch(r"[\d:,-]+", section) and section not in sections_in(target):
            problems.append(f"{where}: {rel} has no section {section!r} (start and end markers)")
    return problems


def test_include_check_catches_mistakes(tmp_path: Path):
    fake = tmp_path / "page.md"
    fake.write_text('```python\n--8<-- "cs336_systems/no_such_file.py"\n--8<-- '
                    '"cs336_systems/bench/timing.py:no_such_section"\n;--8<-- "escaped/ignored.py"\n```\n')
    text = "\n".join(include_problems(fake))
    assert "no file cs336_systems/no_such_file.py" in text
    assert "no section 'no_such_section'" in text
    assert "escaped" not in text


def test_every_include_in_the_docs_resolves():
    pages = sorted(DOCS.rglob("*.md"))
    assert pages, "docs/ has no pages"
    problems = [p for page in pages for p in include_problems(page)]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- (c) the strict build

class _IgnoreTags(yaml.SafeLoader):
    """mkdocs.yml may hold !!python/name tags; the nav does not need them."""


_IgnoreTags.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_IgnoreTags)

    def walk(items) -> Iterator[str]:
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from walk(value)
            elif not re.match(r"[a-z]+://", value):
                yield value

    return list(walk(config["nav"]))


def built_path(site: Path, page: str) -> Path:
    """Where mkdocs (directory URLs) writes a page: profiling.md -> profiling/index.html."""
    stem = page.rsplit(".", 1)[0]
    return site / ("index.html" if stem == "index" else f"{stem}/index.html")


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = proc.stdout
    warnings = [line for line in log.splitlines() if re.match(r"^(WARNING|ERROR)\s+-", line)]
    if proc.returncode != 0 or warnings:
        pytest.fail(f"mkdocs build --strict failed (exit {proc.returncode}):\n{log[-6000:]}")
    return out


def test_site_builds_with_every_nav_page(site: Path):
    pages = nav_pages()
    assert pages[0] == "index.md"
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"nav names pages that do not exist in docs/: {missing}"
    unbuilt = [p for p in pages if not built_path(site, p).is_file()]
    assert not unbuilt, f"pages in the nav with no built HTML: {unbuilt}"


RAW_LATEX = re.compile(r"\\\(.+?\\\)|\\\[.+?\\\]", re.S)
NOT_PROSE = re.compile(r"<(pre|code|script|style|textarea)\b.*?</\1>", re.S | re.I)


def raw_latex(html: str) -> list[str]:
    """`\\(...\\)` / `\\[...\\]` left in the text a reader sees (code and scripts excluded)."""
    return [m.group(0)[:80] for m in RAW_LATEX.finditer(NOT_PROSE.sub("", html))]


def test_no_page_keeps_raw_latex(site: Path):
    leftovers = {str(p.relative_to(site)): raw_latex(p.read_text()) for p in site.rglob("*.html")}
    leftovers = {page: hits for page, hits in leftovers.items() if hits}
    assert not leftovers, f"unconverted math (page text or table of contents): {leftovers}"


LEFT_MARKER = re.compile(r"\{\{\s*(?:(?:claim|table|figure):\s*)?([a-z0-9_]+(?:\.[a-z0-9_]+)+)\s*\}\}")


def test_no_page_shows_an_unfilled_marker(site: Path):
    # The markers hook leaves code alone, so a marker written inside backticks reaches the reader as
    # "{{ chapter.name }}" instead of its number: outside code (where the reproducing page shows
    # markers on purpose) none may be left.
    left = {(str(p.relative_to(site)), m.group(1)) for p in site.rglob("*.html")
            for m in LEFT_MARKER.finditer(NOT_PROSE.sub("", p.read_text()))}
    assert left == set()


# ------------------------------------------------------------- the math hook on its own

@functools.cache
def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_math_hook_converts_inline_and_display():
    html = ('<p>x <span class="arithmatex">\\(a &lt; b\\)</span></p>'
            '<div class="arithmatex">\\[\n\\frac{1}{2}\n\\]</div>')
    out, errors = _hook("mathml").convert_page_math(html, "page.md")
    assert errors == []
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">' in out
    assert 'display="block"' in out and "<mfrac>" in out
    assert "&#x0003C;" in out  # the escaped `<` reached latex2mathml as a real `<`
    assert "\\(" not in out and "\\[" not in out


def test_math_hook_converts_headings_in_the_table_of_contents():
    class Item:
        def __init__(self, title, children=()):
            self.title, self.children = title, list(children)

    toc = [Item("Sharded over \\(N_\\text{FSDP} &lt; 4\\) devices", [Item("\\(x^2\\) inner")])]
    _hook("mathml").convert_toc_titles(toc)
    assert toc[0].title.startswith("Sharded over <math") and "&#x0003C;" in toc[0].title
    assert toc[0].children[0].title.startswith("<math") and "\\(" not in toc[0].children[0].title


@pytest.mark.parametrize("tex", [r"\frac{a}{", r"x^", r"\notacommand x", r"\begin{aligned} a &= b \end{aligned}"])
def test_math_hook_reports_bad_latex(tex):
    _, errors = _hook("mathml").convert_page_math(f'<span class="arithmatex">\\({tex}\\)</span>', "ch.md")
    assert len(errors) == 1 and errors[0].startswith("ch.md: cannot convert inline math")


def test_bad_latex_or_a_failing_marker_fails_the_strict_build_naming_the_page(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# ok\n\n$x^2$\n")
    (docs / "broken.md").write_text("# broken\n\n$$\n\\frac{1}{\n$$\n")
    (docs / "failing.md").write_text("# failing\n\nText.\n\n{{ table: reproducing.no_such_table }}\n")
    hooks = ", ".join(str(DOCS / "hooks" / f"{name}.py") for name in ("mathml", "markers"))
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: probe\ntheme: {{name: mkdocs}}\nhooks: [{hooks}]\n"
        "markdown_extensions: [pymdownx.superfences, {pymdownx.arithmatex: {generic: true}}]\n")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    log = proc.stderr + proc.stdout
    assert proc.returncode != 0, log
    assert "broken.md: cannot convert display math" in log
    assert "failing.md:5: table reproducing.no_such_table: KeyError" in log


# ------------------------------------------------------------- the markers hook and its claims

def test_markers_fill_facts_and_tables_and_a_false_claim_names_its_line(monkeypatch):
    from report import registry

    fill = _hook("markers").fill
    text, figures, problems = fill("A {{ ceilings.bf16_tflops }} TFLOP/s matmul. {{ claim: ceilings.tf32_several_times_fp32 }}\n"
                                   "`{{ ceilings.copy_tbps }}` stays code.\n\n  {{ table: reproducing.peaks }}\n", "p.md")
    assert problems == [] and figures == []
    assert f"A {registry.fact('ceilings.bf16_tflops')} TFLOP/s matmul.\n" in text  # the claim and its space are gone
    assert "`{{ ceilings.copy_tbps }}`" in text and "\n  | device |" in text  # the table keeps the marker's indent
    monkeypatch.setenv(registry.NEGATE, "ceilings.tf32_several_times_fp32")
    _, _, problems = fill("x\nSo. {{ claim: ceilings.tf32_several_times_fp32 }} And {{ table: reproducing.peaks }}\n", "p.md")
    assert problems == ["p.md:2: claim ceilings.tf32_several_times_fp32 is false",
                        "p.md:2: table reproducing.peaks must stand on a line of its own"]


def test_a_false_claim_fails_the_real_strict_build_naming_page_line_and_claim(tmp_path: Path):
    # The site as it is, with one claim read as false: the build stops and names every line of the
    # first page that uses it.
    from tests.claims.test_claims import USES

    name = "ddp.flat_not_clearly_faster"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "REPORT_NEGATE_CLAIM": name, "NO_MKDOCS_2_WARNING": "1"})
    log = proc.stderr + proc.stdout
    assert proc.returncode != 0, log[-3000:]
    assert any(f"{where}: claim {name} is false" in log for where in USES[("claim", name)]), log[-3000:]
    assert " is false" not in log.replace(f"claim {name} is false", ""), "another claim failed too"


# ---------------------------------------------------------- (d) the built site requests nothing else

ASSET_TAGS = {"script", "link", "img", "iframe", "source", "audio", "video", "embed", "object",
              "track", "input"}
ASSET_ATTRS = {"src", "href", "srcset", "data", "poster"}


def is_external(url: str) -> bool:
    url = url.strip()
    return bool(re.match(r"(?i)(https?:)?//", url))


class _AssetScanner(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.external: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        self._in = tag if tag in {"script", "style"} else None
        rel = set((dict(attrs).get("rel") or "").lower().split())
        if tag == "link" and rel and rel <= {"canonical", "alternate", "author", "license", "next", "prev"}:
            return  # names a URL, fetches nothing (`mkdocs serve` adds a canonical link)
        if tag in ASSET_TAGS:
            for name, value in attrs:
                if name in ASSET_ATTRS and value:
                    urls = [u.split()[0] for u in value.split(",") if u.strip()] if name == "srcset" else [value]
                    self.external += [f"<{tag} {name}={u}>" for u in urls if is_external(u)]

    def handle_data(self, data):
        if self._in == "style":
            self.external += css_external(data)
        elif self._in == "script":
            self.external += js_external(data)


def css_external(text: str) -> list[str]:
    return [f"css {u}" for u in re.findall(r"""(?:url\(|@import\s+)\s*["']?([^"')\s;]+)""", text)
            if is_external(u)]


def js_external(text: str) -> list[str]:
    return [f"js {u}" for u in re.findall(r"""\b(?:import|importScripts)\(\s*["'`]([^"'`]+)""", text)
            if is_external(u)]


def test_built_files_name_no_external_asset(site: Path):
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix == ".html":
            scanner = _AssetScanner()
            scanner.feed(path.read_text(encoding="utf-8"))
            hits = scanner.external
        elif path.suffix == ".css":
            hits = css_external(path.read_text(encoding="utf-8"))
        elif path.suffix == ".js":
            hits = js_external(path.read_text(encoding="utf-8"))
        else:
            continue
        found += [f"{path.relative_to(site)}: {hit}" for hit in hits]
    assert not found, "external assets in the built site:\n" + "\n".join(found)


def chromium() -> str:
    exe = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; CI must install it (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI runs this test")
    return exe


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def served(site: Path) -> Iterator[str]:
    """The built site on 127.0.0.1, a free port, in a thread."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}


def open_in_chromium(url: str, workdir: Path) -> tuple[str, list[dict]]:
    """Load `url` headless; return the DOM after load and the netlog's URL_REQUEST_START_JOB params."""
    netlog = workdir / "netlog.json"
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
            "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
            "--disable-features=AutofillServerCommunication,OptimizationHints,Translate,MediaRouter",
            # Belt and braces: no name but the local server resolves, so nothing can leave the machine.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
            f"--user-data-dir={workdir / 'profile'}", f"--log-net-log={netlog}",
            "--net-log-capture-mode=Default", "--dump-dom", url]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"chromium failed on {url}:\n{proc.stderr[-3000:]}"
    log = json.loads(netlog.read_text())
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    starts = [e["params"] for e in log["events"]
              if kinds.get(e["type"]) == "URL_REQUEST_START_JOB" and "url" in e.get("params", {})]
    return proc.stdout, starts


def page_requests(starts: list[dict], origin: str) -> list[str]:
    """URLs the page asked for. Chromium's own background traffic (update checks, account probes)
    carries no page origin as initiator or top-frame site, so it is told apart and not counted."""
    site_key = origin.rsplit(":", 1)[0]  # the netlog's isolation key names the site without port
    return [p["url"] for p in starts
            if p.get("initiator") == origin or p.get("network_isolation_key", "").startswith(site_key + " ")]


def test_site_renders_in_chromium_and_requests_nothing_outside(site: Path, served: str, tmp_path: Path):
    pages = nav_pages()
    doms, outside = {}, []
    for i, page in enumerate(pages):
        path = built_path(site, page).relative_to(site).as_posix().removesuffix("index.html")
        workdir = tmp_path / f"p{i}"
        workdir.mkdir()
        dom, starts = open_in_chromium(f"{served}/{path}", workdir)
        requested = page_requests(starts, served)
        assert f"{served}/{path}" in requested, f"netlog of {page} lacks the page itself: {requested}"
        assert any("/assets/javascripts/bundle" in u for u in requested), f"{page}: no bundle loaded?"
        outside += [f"{page}: {u}" for u in requested
                    if urlsplit(u).scheme not in {"data", "chrome", "blob", "about"}
                    and urlsplit(u).hostname not in LOCAL_HOSTS]
        doms[page] = dom
    assert not outside, "pages requested something outside the local server:\n" + "\n".join(outside)

    # A chapter with math and a measured results table (its provenance line names a results file);
    # until a chapter has one, the reproducing page (math, and tables rendered at build time).
    measured = [p for p, dom in doms.items() if "<math" in dom and re.search(r"Source: <code>results/", dom)]
    page = measured[0] if measured else "reproducing.md"
    dom = doms[page]
    assert re.search(r'<math xmlns="http://www.w3.org/1998/Math/MathML" display="(block|inline)">', dom), page
    assert "<table" in dom and "<td" in dom, f"{page} has no table in the browser's DOM"
    assert not raw_latex(dom), f"{page} shows raw LaTeX: {raw_latex(dom)}"
