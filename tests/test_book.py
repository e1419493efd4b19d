"""Build the book and open every page in a real headless browser.

The build runs exactly as ``make book`` does (``jupyter-book build -W -n
--keep-going .``: any warning or notebook error fails it). The browser check
serves ``_build/html`` on 127.0.0.1 and opens each page in Debian's Chromium,
driven by Playwright for Python, with every request off this machine blocked:
the book must work offline.

Where Chromium is missing the browser tests are skipped with a reason, unless
``ATTNLIB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which makes them fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM = Path(os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def toc_pages() -> list[str]:
    """Every page of _toc.yml, as paths relative to the book root without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    entries = list(toc.get("chapters", []))
    for part in toc.get("parts", []):
        entries += part.get("chapters", [])
    while entries:
        entry = entries.pop(0)
        pages.append(entry["file"])
        entries[:0] = entry.get("sections", [])
    return pages


@pytest.fixture(scope="module")
def built_book() -> Path:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run(
        [str(jupyter_book), "build", "-W", "-n", "--keep-going", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        pytest.fail(
            f"jupyter-book build failed (exit {result.returncode}):\n"
            f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}",
            pytrace=False,
        )
    return HTML


def test_book_builds_every_page_of_the_toc(built_book):
    from bs4 import BeautifulSoup

    for page in toc_pages():
        html = built_book / f"{page}.html"
        assert html.is_file(), f"{page} is in _toc.yml but {html} was not built"
        soup = BeautifulSoup(html.read_text(), "html.parser")
        # An exercise's check cell fails until the learner fills the stub: it is
        # tagged raises-exception (myst-nb: class tag_raises-exception). No other.
        for cell in soup.select("div.cell.tag_raises-exception"):
            cell.decompose()
        assert "Traceback (most recent call last)" not in soup.get_text(), f"{page}: a cell failed"
    assert (built_book / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not served locally"
    reports = built_book / "reports"
    assert not reports.exists() or not any(reports.iterdir()), f"execution reports in {reports}"


# ---------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def server(built_book):
    handler = functools.partial(QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("ATTNLIB_REQUIRE_BROWSER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def all_pages(built_book: Path) -> list[str]:
    pages = []
    for html in sorted(built_book.rglob("*.html")):
        rel = html.relative_to(built_book)
        if rel.parts[0] in {"_static", "_sources", "_images", "reports"}:
            continue
        pages.append(rel.as_posix())
    return pages


def open_page(browser, url: str) -> dict:
    """Load a page with off-machine requests blocked; report what went wrong."""
    problems = {"console": [], "page_errors": [], "bad_status": [], "failed": [], "external": []}
    context = browser.new_context()
    page = context.new_page()

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            r.continue_()
        else:
            problems["external"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems["console"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems["page_errors"].append(str(e)))
    page.on(
        "response",
        lambda r: problems["bad_status"].append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    page.on(
        "requestfailed",
        lambda r: problems["failed"].append(f"{r.url} ({r.failure})")
        if urlparse(r.url).hostname == "127.0.0.1"
        else None,
    )
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    has_math = page.locator(".math").count() > 0
    if has_math:
        page.wait_for_function(
            "() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000
        )
        page.evaluate("() => MathJax.startup.promise")
    problems["math"] = page.locator(".math").count()
    problems["typeset"] = page.locator("mjx-container").count()
    problems["math_errors"] = page.locator("mjx-merror").count()
    problems["broken_images"] = page.evaluate(
        "() => Array.from(document.images)"
        ".filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src)"
    )
    problems["images"] = page.evaluate("() => document.images.length")
    problems["colab"] = page.evaluate(
        "() => Array.from(document.querySelectorAll('a'))"
        ".map(a => a.href).filter(h => h.startsWith('https://colab.research.google.com/'))"
    )
    context.close()
    return problems


def test_every_page_loads_cleanly_offline(built_book, server, browser):
    pages = all_pages(built_book)
    assert len(pages) >= len(toc_pages())
    failures = {}
    for rel in pages:
        report = open_page(browser, f"{server}/{rel}")
        bad = {k: report[k] for k in ("console", "page_errors", "bad_status", "failed", "external", "broken_images") if report[k]}
        if report["math_errors"]:
            bad["math_errors"] = report["math_errors"]
        if report["math"] and report["typeset"] < report["math"]:
            bad["math_not_typeset"] = f"{report['typeset']} of {report['math']} typeset"
        if bad:
            failures[rel] = bad
    assert not failures, f"pages with problems: {failures}"


@pytest.mark.parametrize("page", [p for p in toc_pages() if p.startswith("chapters/")])
def test_chapter_page_has_math_figures_and_colab_link(built_book, server, browser, page):
    report = open_page(browser, f"{server}/{page}.html")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = urlparse(config["repository"]["url"]).path.strip("/")
    branch = config["repository"].get("branch", "main")
    expected = f"https://colab.research.google.com/github/{repo}/blob/{branch}/{page}.ipynb"
    assert expected in report["colab"], f"no Colab link {expected}; found {report['colab']}"
    assert report["math"] > 0 and report["typeset"] >= report["math"] and not report["math_errors"]
    assert report["images"] > 0 and not report["broken_images"], report["broken_images"]


# ------------------------------------------------- phones, figures, dark mode

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
MIN_FIGURE_SCALE = 0.60


def open_quietly(browser, url: str, viewport: dict, color_scheme: str = "light"):
    """A page at ``viewport``, loaded offline; the caller closes its context."""
    context = browser.new_context(viewport=viewport, color_scheme=color_scheme)
    page = context.new_page()
    page.route(
        "**/*",
        lambda r: r.continue_()
        if urlparse(r.request.url).hostname == "127.0.0.1" or r.request.url.startswith("data:")
        else r.abort(),
    )
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    return context, page


CHAPTERS = [p for p in toc_pages() if p.startswith("chapters/")]


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_phone_menu_button_opens_the_chapter_list(built_book, server, browser, page_name):
    context, page = open_quietly(browser, f"{server}/{page_name}.html", PHONE)
    try:
        toggles = page.locator(".primary-toggle")
        visible = [i for i in range(toggles.count()) if toggles.nth(i).is_visible()]
        assert len(visible) == 1, f"{len(visible)} visible menu buttons at 390 px"
        toggles.nth(visible[0]).click()
        page.wait_for_timeout(300)
        links = page.evaluate(
            "() => { const d = document.getElementById('pst-primary-sidebar-modal');"
            " if (!d || !d.open) return [];"
            " return Array.from(d.querySelectorAll('nav a.reference'))"
            ".filter(a => a.offsetParent !== null).map(a => a.getAttribute('href')); }"
        )
        chapters = [h for h in links if "0" in h and h.endswith(".html")]
        assert len(chapters) >= len(CHAPTERS) - 1, f"menu did not open the chapter list: {links}"
    finally:
        context.close()


def test_one_search_box_on_a_desktop(built_book, server, browser):
    context, page = open_quietly(browser, f"{server}/{CHAPTERS[0]}.html", DESKTOP)
    try:
        boxes = page.evaluate(
            "() => Array.from(document.querySelectorAll('.search-button-field'))"
            ".filter(e => e.offsetParent !== null).length"
        )
        assert boxes == 1, f"{boxes} search boxes visible"
    finally:
        context.close()


def test_no_page_is_wider_than_a_phone(built_book, server, browser):
    wide = {}
    for rel in all_pages(built_book):
        context, page = open_quietly(browser, f"{server}/{rel}", PHONE)
        try:
            width = page.evaluate("() => document.documentElement.scrollWidth")
            if width > PHONE["width"]:
                culprit = page.evaluate(
                    """(vw) => { const out = [];
                    for (const e of document.querySelectorAll('.bd-article *')) {
                      const r = e.getBoundingClientRect();
                      if (r.right > vw + 1 && e.offsetParent !== null) {
                        out.push(e.tagName + '.' + e.className + ': ' + Math.round(r.right));
                        if (out.length > 2) break; } }
                    return out; }""",
                    PHONE["width"],
                )
                wide[rel] = (width, culprit)
        finally:
            context.close()
    assert not wide, f"pages wider than {PHONE['width']} px: {wide}"


FIGURES_JS = """() => Array.from(document.querySelectorAll('.bd-article img'))
  .filter(i => !i.closest('.header-article-items, .bd-header-article, nav'))
  .map(i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt') || '',
              width: i.getBoundingClientRect().width, natural: i.naturalWidth,
              svg: i.src.endsWith('.svg')}))"""


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_figures_are_legible_and_described(built_book, server, browser, page_name):
    context, page = open_quietly(browser, f"{server}/{page_name}.html", DESKTOP)
    try:
        figures = page.evaluate(FIGURES_JS)
    finally:
        context.close()
    assert figures, "no figures"
    problems = []
    for fig in figures:
        name = Path(fig["src"]).name
        if not fig["svg"] and fig["natural"]:
            scale = fig["width"] / fig["natural"]
            if scale < MIN_FIGURE_SCALE:
                problems.append(f"{name} shown at {scale:.0%} of {fig['natural']} px")
        alt = fig["alt"].strip()
        if len(alt) < 15 or re.search(r"\.(png|svg|jpe?g)$", alt) or alt == name:
            problems.append(f"{name} has no real alt text ({alt!r})")
    assert not problems, problems


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_dark_mode_puts_no_figure_on_a_white_block(built_book, server, browser, page_name):
    from PIL import Image

    context, page = open_quietly(browser, f"{server}/{page_name}.html", DESKTOP, "dark")
    try:
        page.evaluate("() => { document.documentElement.dataset.theme = 'dark';"
                      " document.documentElement.dataset.mode = 'dark'; }")
        assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
        blocks = page.evaluate(
            """() => Array.from(document.querySelectorAll('.bd-article img')).map(img => {
              const light = [];
              for (let e = img; e && e.tagName !== 'MAIN'; e = e.parentElement) {
                const c = getComputedStyle(e).backgroundColor.match(/[\\d.]+/g).map(Number);
                const alpha = c.length > 3 ? c[3] : 1;
                if (alpha > 0.5 && (c[0] + c[1] + c[2]) / 3 > 128) light.push(e.tagName + '.' + e.className);
              }
              return [img.getAttribute('src'), light]; })"""
        )
    finally:
        context.close()
    problems = [f"{Path(src).name} on {light}" for src, light in blocks if light]
    opaque = []
    for src, _ in blocks:
        path = (built_book / page_name).parent / src
        if path.suffix == ".png" and path.is_file():
            with Image.open(path) as image:
                rgba = image.convert("RGBA")
                corners = [rgba.getpixel((x, y))[3] for x in (0, rgba.width - 1)
                           for y in (0, rgba.height - 1)]
            if min(corners) == 255:
                opaque.append(path.name)
    assert not problems, f"figures on a light block in dark mode: {problems}"
    assert not opaque, f"figures with an opaque background (drawn without attnlib.book): {opaque}"


def contrast(fg: list[float], bg: list[float]) -> float:
    def luminance(rgb):
        channels = [c / 255 for c in rgb[:3]]
        channels = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]

    a, b = luminance(fg), luminance(bg)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_show_source_text_is_readable_in_both_themes(built_book, server, browser, mode):
    """attnlib.show_source's code takes the theme's colours: WCAG AA (4.5:1) everywhere."""
    worst = []
    for page_name in CHAPTERS:
        context, page = open_quietly(browser, f"{server}/{page_name}.html", DESKTOP, mode)
        try:
            page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{mode}'; }}")
            pairs = page.evaluate(
                """() => { const bg = e => { for (; e; e = e.parentElement) {
                      const c = getComputedStyle(e).backgroundColor.match(/[\\d.]+/g).map(Number);
                      if (c.length < 4 || c[3] > 0.5) return c; }
                      return [255, 255, 255]; };
                  return Array.from(document.querySelectorAll(
                      '.cell_output .text_html .highlight span'))
                    .filter(s => s.textContent.trim())
                    .map(s => [s.textContent.slice(0, 20),
                               getComputedStyle(s).color.match(/[\\d.]+/g).map(Number),
                               bg(s)]); }"""
            )
        finally:
            context.close()
        for text, fg, bg in pairs:
            ratio = contrast(fg, bg)
            if ratio < 4.5:
                worst.append((round(ratio, 2), page_name, text))
    assert not worst, f"show_source text below 4.5:1 in {mode} mode: {sorted(worst)[:5]}"


def test_api_page_documents_every_public_name(built_book):
    import importlib
    import pkgutil

    import attnlib

    html = (built_book / "api.html").read_text()
    assert 'id="attnlib.attention.MultiHeadAttention"' in html
    missing = []
    for info in pkgutil.walk_packages(attnlib.__path__, "attnlib."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        # Checkers are documented once, where attnlib.exercises re-exports them.
        home = "attnlib.exercises" if info.name.startswith("attnlib.exercises.") else info.name
        for name in getattr(module, "__all__", []):
            if f'id="{home}.{name}"' not in html and f'id="{info.name}.{name}"' not in html:
                missing.append(f"{info.name}.{name}")
    assert not missing, f"not on the API page: {missing}"


def test_api_page_shows_multi_head_attention_in_a_browser(built_book, server, browser):
    context, page = open_quietly(browser, f"{server}/api.html", DESKTOP)
    try:
        heading = page.locator('[id="attnlib.attention.MultiHeadAttention"]')
        assert heading.count() == 1 and heading.is_visible()
        assert "num_heads" in heading.locator("xpath=..").inner_text()
    finally:
        context.close()


def test_intro_links_every_chapter_the_api_instructors_and_pdf(built_book):
    html = (built_book / "intro.html").read_text()
    for page_name in [*CHAPTERS, "api", "instructors", "references"]:
        assert f'href="{page_name}.html' in html, f"intro does not link {page_name}"
    assert 'href="book.pdf"' in html


def test_chapters_are_numbered_in_the_navigation(built_book):
    html = (built_book / "intro.html").read_text()
    nav = html[html.index('bd-docs-nav'):]
    for number, page_name in enumerate(CHAPTERS, start=1):
        assert re.search(rf'href="{re.escape(page_name)}.html">\s*{number}\. ', nav), (
            f"{page_name} is not numbered {number} in the navigation"
        )
