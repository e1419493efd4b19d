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

import asyncio
import base64
import contextlib
import functools
import http.server
import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote_plus, urlparse

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
# The browser of the tests resolves no host but this machine: a page that asks for
# anything from the network gets an error, as a reader offline would (probe_page
# records each such request).
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
CHROMIUM_ARGS.append(OFFLINE)


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
    page_soup.cache_clear()  # pages parsed before this build are stale
    return HTML


@functools.cache
def page_soup(path: Path):
    """The built page at ``path``, parsed once for all the tests that read it.

    html.parser takes seconds for the book's 6 MB of pages, and CPU-bound seconds
    add up on a busy CI machine: each page was parsed by four tests. The soup is
    shared, so a test must not change it (no ``decompose``, no ``extract``).
    """
    from bs4 import BeautifulSoup

    return BeautifulSoup(path.read_text(), "html.parser")


def text_outside(soup, selector: str) -> str:
    """``soup.get_text()`` as it would be with the elements ``selector`` matches
    removed, without changing the shared soup."""
    left_out = {id(element) for element in soup.select(selector)}
    return "".join(text for text in soup.strings
                   if not any(id(parent) in left_out for parent in text.parents))


def test_book_builds_every_page_of_the_toc(built_book):
    for page in toc_pages():
        html = built_book / f"{page}.html"
        assert html.is_file(), f"{page} is in _toc.yml but {html} was not built"
        # An exercise's check cell fails until the learner fills the stub: it is
        # tagged raises-exception (myst-nb: class tag_raises-exception). No other.
        text = text_outside(page_soup(html), "div.cell.tag_raises-exception")
        assert "Traceback (most recent call last)" not in text, f"{page}: a cell failed"
    assert (built_book / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not served locally"
    reports = built_book / "reports"
    assert not reports.exists() or not any(reports.iterdir()), f"execution reports in {reports}"


# ------------------------------------------------------------ static links


def local_links(built_book: Path) -> list[tuple[str, str]]:
    """(page, href) for every link of every built page that stays in the book."""
    links = []
    for rel in all_pages(built_book):
        soup = page_soup(built_book / rel)
        for tag in soup.select("a[href], link[href], img[src], script[src]"):
            href = tag.get("href") or tag.get("src")
            if urlparse(href).scheme or href.startswith(("//", "mailto:", "javascript:")):
                continue
            links.append((rel, href))
    return links


def test_every_local_link_resolves(built_book):
    """A reader never follows a link to a file or an anchor that is not there (the
    introduction's PDF link after ``make book`` alone, a label on the wrong section)."""
    ids: dict[Path, set[str]] = {}

    def anchors(path: Path) -> set[str]:
        if path not in ids:
            soup = page_soup(path)
            ids[path] = {t.get("id") for t in soup.find_all(id=True)} | {
                t.get("name") for t in soup.find_all(attrs={"name": True})}
        return ids[path]

    broken = []
    links = local_links(built_book)
    for rel, href in links:
        url = urlparse(href)
        target = (built_book / rel).parent / url.path if url.path else built_book / rel
        target = target.resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{rel}: {href} (no file)")
        elif url.fragment and target.suffix == ".html" and url.fragment not in anchors(target):
            broken.append(f"{rel}: {href} (no anchor)")
    assert len(links) > 100
    assert not broken, f"{len(broken)} broken links: {broken[:10]}"


def test_every_page_names_its_favicon(built_book):
    """Without an icon of its own a page makes the browser ask for /favicon.ico, a 404
    in the console. (That the file is there: test_every_local_link_resolves.)"""
    missing = []
    for rel in all_pages(built_book):
        soup = page_soup(built_book / rel)
        if soup.select_one("meta[http-equiv='Refresh' i]"):
            continue  # index.html: a redirect to the introduction, never shown
        if not soup.select_one("link[rel~='icon'][href$='favicon.svg']"):
            missing.append(rel)
    assert not missing, f"pages without the favicon: {missing[:5]}"


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


# How long a page may take to load, typeset its math or answer a search. Playwright's
# default of 30 s is too short on a CI machine with two CPU-bound processes beside the
# suite on 2 cores (issue 25: a chapter's "load" timed out). Each page has its own
# browser context, closed when the page's reading is done.
PAGE_TIMEOUT_MS = 240_000
# The pages read in a batch (in_browser) load this many at a time. One at a time, a
# page's reading was two thirds waiting (the half second without requests that
# "networkidle" waits for, the menus' animations, the page's own round trips): the
# 159 readings of test_every_page_loads_cleanly_offline took 297 s of wall clock for
# 93 s of CPU (a load of 1-2 on 2 cores). Four keep Chromium busy; more only share
# the same CPU, and each page still has PAGE_TIMEOUT_MS to itself.
PAGES_AT_ONCE = 4

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
# Code must fit with a margin: on a 1280-px screen a browser that shows a classic
# scrollbar (15 px) leaves a viewport of 1265 px, with a narrower column. The code
# widths are measured at 1264 px; the other desktop checks stay at the 1280 px that
# the course is read at (a narrower column only narrows a figure or an equation).
LAPTOP = {"width": 1264, "height": 900}
# A figure is shown at no less than this fraction of the width it was drawn for.
MIN_FIGURE_SCALE = 0.60
# The smallest text of a figure as a phone shows it, in CSS px (body text is 16).
MIN_PHONE_FIGURE_TEXT_PX = 11
# The course's code lines are at most this long (ruff --line-length 88).
MAX_CODE_LINE = 88
# attnlib's own lines, shown by attnlib.show_source (ruff's line-length in pyproject.toml).
MAX_PACKAGE_LINE = 100
CHAPTERS = [p for p in toc_pages() if p.startswith("chapters/")]

# How each page is opened: a desktop in the light theme, a phone, and a desktop
# whose system asks for the dark theme (the book's theme follows it: "auto").
MODES = {
    "desktop": (DESKTOP, "light"),
    "phone": (PHONE, "light"),
    "dark": (DESKTOP, "dark"),
    "laptop": (LAPTOP, "light"),  # code widths only
}

# Everything the tests below look at, read from a page in one pass.
PROBE_JS = r"""(vw) => {
  const rgb = c => c.match(/[\d.]+/g).map(Number);
  const opaqueBg = e => { for (; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length < 4 || c[3] > 0.5) return c; }
    return [255, 255, 255]; };
  const visible = e => e.offsetParent !== null || getComputedStyle(e).position === 'fixed';
  const article = document.querySelector('.bd-article') || document.body;
  // Inside a box that scrolls sideways on its own (a table, a long equation), or
  // MathJax's hidden copy for screen readers: not cut off, not widening the page.
  const excused = e => { for (let p = e; p && p !== article; p = p.parentElement) {
      if (p.tagName === 'MJX-ASSISTIVE-MML') return true;
      if (p !== e && ['auto', 'scroll'].includes(getComputedStyle(p).overflowX)) return true; }
    return false; };
  const cut = [];
  for (const e of article.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 1 && visible(e) && !excused(e)) {
      cut.push(e.tagName + '.' + e.className + ': right edge at ' + Math.round(r.right) + ' px');
      if (cut.length > 4) break; } }
  return {
    theme: document.documentElement.dataset.theme || '',
    scroll_width: document.documentElement.scrollWidth,
    cut: cut,
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('mjx-container').length,
    math_errors: document.querySelectorAll('mjx-merror').length,
    // MathJax prints a command it does not know (\text{head\_dim} without
    // textmacros, a typo) as its TeX: a backslash in the typeset formula.
    raw_tex: Array.from(document.querySelectorAll('mjx-assistive-mml'))
      .map(m => m.textContent).filter(t => t.includes('\\')).slice(0, 5),
    wide_math: Array.from(document.querySelectorAll('mjx-container[display="true"]'))
      .filter(m => m.scrollWidth > m.clientWidth + 1)
      .map(m => Math.round(m.scrollWidth) + ' px in ' + Math.round(m.clientWidth) + ' px: '
                + (m.querySelector('mjx-assistive-mml') || m).textContent.slice(0, 60)),
    images: document.images.length,
    broken_images: Array.from(document.images)
      .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    colab: Array.from(document.querySelectorAll('a')).map(a => a.href)
      .filter(h => h.startsWith('https://colab.research.google.com/')),
    search_boxes: Array.from(document.querySelectorAll('.search-button-field'))
      .filter(e => e.offsetParent !== null).length,
    figures: Array.from(document.querySelectorAll('.bd-article img'))
      .filter(i => !i.closest('.header-article-items, .bd-header-article, nav'))
      .map(i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt') || '',
                  width: i.getBoundingClientRect().width, natural: i.naturalWidth,
                  svg: i.src.endsWith('.svg')})),
    // Opaque light boxes behind an image (the theme's white block in the dark).
    // A filter (the theme dims images in the dark) changes the figures' colours.
    filtered: Array.from(document.querySelectorAll('.bd-article img'))
      .filter(i => getComputedStyle(i).filter !== 'none')
      .map(i => i.getAttribute('src') + ': ' + getComputedStyle(i).filter),
    light_blocks: Array.from(document.querySelectorAll('.bd-article img')).map(img => {
      const light = [];
      for (let e = img; e && e.tagName !== 'MAIN'; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        const alpha = c.length > 3 ? c[3] : 1;
        if (alpha > 0.5 && (c[0] + c[1] + c[2]) / 3 > 128) light.push(e.tagName + '.' + e.className);
      }
      return [img.getAttribute('src'), light]; }),
    // attnlib.show_source's code: each coloured piece, its colour and its background.
    source_pairs: Array.from(document.querySelectorAll('.cell_output .text_html .highlight span'))
      .filter(s => s.textContent.trim())
      .map(s => [s.textContent.slice(0, 20), rgb(getComputedStyle(s).color), opaqueBg(s)]),
    // matplotlib's JavaScript players (chapter 10): the player, its frame and each
    // control, against the column (the content box of the cell's output).
    animations: (() => {
      const edges = e => { const b = e.getBoundingClientRect();
        return {left: b.left, right: b.right, width: b.width}; };
      const column = e => { const box = e.closest('.cell_output .output') || article;
        const cs = getComputedStyle(box), r = box.getBoundingClientRect();
        return {left: r.left + parseFloat(cs.paddingLeft), right: r.right - parseFloat(cs.paddingRight)}; };
      return Array.from(article.querySelectorAll('.animation')).map(a => ({
        column: column(a), player: edges(a),
        img: edges(a.querySelector('img')),
        controls: Array.from(a.querySelectorAll('input, button, label'))
          .map(c => Object.assign(edges(c), {name: c.getAttribute('title') || c.textContent.trim()
                                                    || c.getAttribute('type')}))}));
    })(),
    // Boxes that scroll sideways (code, outputs, tables, display equations), and
    // those of them without the fade at an edge (course.js, course.css) that shows it.
    scrollers: (() => {
      const boxes = Array.from(article.querySelectorAll(
        'div.highlight pre, table, mjx-container[display="true"]'))
        .filter(b => visible(b) && b.scrollWidth > b.clientWidth + 1);
      const masked = b => [getComputedStyle(b).maskImage, getComputedStyle(b).webkitMaskImage]
        .some(m => m && m !== 'none');
      return {count: boxes.length, boxes: article.querySelectorAll(
                'div.highlight pre, table, mjx-container[display="true"]').length,
              no_cue: boxes.filter(b => !masked(b)).map(b => b.tagName + ' '
                + Math.round(b.scrollWidth) + ' px in ' + Math.round(b.clientWidth) + ': '
                + b.textContent.trim().slice(0, 40))};
    })(),
    // Printed outputs wider than their box (they scroll, with the fade).
    wide_outputs: Array.from(article.querySelectorAll('.cell_output pre'))
      .filter(p => visible(p) && p.scrollWidth > p.clientWidth + 1)
      .map(p => Math.round(p.scrollWidth) + ' px in ' + Math.round(p.clientWidth) + ' px: '
                + p.textContent.trim().slice(0, 50)),
    // A table header's word split over two lines ("rea|din|g").
    broken_headers: Array.from(article.querySelectorAll('th')).flatMap(th => {
      const broken = [];
      const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const m of node.textContent.matchAll(/\S+/g)) {
          const range = document.createRange();
          range.setStart(node, m.index);
          range.setEnd(node, m.index + m[0].length);
          const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
          if (tops.size > 1) broken.push(m[0]);
        }
      }
      return broken;
    }),
    // Controls a finger must hit: the players' buttons, and each radio button with
    // its label (a click on either selects it), at least 44 x 44 CSS px.
    small_targets: Array.from(article.querySelectorAll(
        '.animation button, .animation input[type="radio"]')).filter(visible).map(c => {
      const label = c.id && article.querySelector('label[for="' + c.id + '"]');
      const r = (label || c).getBoundingClientRect();
      return {name: c.getAttribute('title') || c.value || c.textContent.trim(),
              width: Math.round(r.width), height: Math.round(r.height)};
    }).filter(t => t.width < 44 || t.height < 44),
    // Every code box, with hidden code cells and exercise solutions opened (last:
    // opening them changes the page that the readings above describe).
    code_boxes: (() => {
      article.querySelectorAll('details').forEach(d => { d.open = true; });
      article.querySelectorAll('.admonition.toggle-hidden')
        .forEach(a => a.classList.remove('toggle-hidden'));
      return Array.from(article.querySelectorAll('div.highlight pre')).map(p => {
        const cs = getComputedStyle(p);
        const lines = p.textContent.replace(/\n$/, '').split('\n');
        const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), '');
        return {scroll: p.scrollWidth, client: p.clientWidth,
                right: p.getBoundingClientRect().right, white_space: cs.whiteSpace,
                overflow_x: cs.overflowX, output: p.closest('.cell_output') !== null,
                // attnlib.show_source's listing (an HTML output), or an error's message
                listing: p.closest('.cell_output .text_html') !== null,
                error: p.closest('.cell_output .traceback') !== null,
                // marked prose by course.js (a report with a line over 160 characters,
                // such as pytest's): it wraps on purpose
                prose: p.closest('.course-prose-output') !== null,
                // a printed output laid out in columns: a line indented or aligned
                // by a run of spaces
                aligned: lines.some(l => /^\s+\S|\S {2,}\S/.test(l)),
                chars: longest.length, line: longest.trim().slice(0, 50)}; });
    })(),
  };
}"""

MENU_JS = """(which) => { const d = document.getElementById('pst-' + which + '-sidebar-modal');
  if (!d || !d.open) return null;
  return Array.from(d.querySelectorAll('a'))
    .filter(a => a.offsetParent !== null).map(a => a.getAttribute('href')); }"""


async def open_menu(page, which: str):
    """Click the visible ``which`` (primary/secondary) toggle: the links of the
    sidebar it opens, None if it opens nothing, or the number of visible toggles."""
    toggles = page.locator(f".{which}-toggle")
    visible = [i for i in range(await toggles.count()) if await toggles.nth(i).is_visible()]
    if len(visible) != 1:
        return len(visible)
    await toggles.nth(visible[0]).click()
    await page.wait_for_timeout(300)
    links = await page.evaluate(MENU_JS, which)
    await page.keyboard.press("Escape")
    await page.wait_for_timeout(200)
    return links


def new_context(browser, **options):
    """A browser context whose pages wait up to PAGE_TIMEOUT_MS for anything."""
    context = browser.new_context(**options)
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    context.set_default_navigation_timeout(PAGE_TIMEOUT_MS)
    return context


async def new_async_context(browser, **options):
    """new_context for Playwright's async API (in_browser's jobs)."""
    context = await browser.new_context(**options)
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    context.set_default_navigation_timeout(PAGE_TIMEOUT_MS)
    return context


def in_browser(jobs: dict) -> dict:
    """Run ``jobs`` (a key for each: ``async def job(browser)``, given an async
    Playwright browser) in a Chromium of their own, PAGES_AT_ONCE at a time; return
    each key's result, or the exception its job raised (to be raised by the test
    that reads it, so that one page's failure fails only the tests of that page).

    Playwright's async API runs in a thread of its own: the sync API of the
    ``browser`` fixture keeps the main thread's event loop."""
    results: dict = {}

    async def main():
        from playwright.async_api import async_playwright

        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            gate = asyncio.Semaphore(PAGES_AT_ONCE)

            async def one(key, job):
                async with gate:
                    try:
                        results[key] = await job(browser)
                    except Exception as error:  # re-raised by the test that reads it
                        results[key] = error

            try:
                await asyncio.gather(*(one(key, job) for key, job in jobs.items()))
            finally:
                await browser.close()

    failed: list[BaseException] = []

    def run():
        try:
            asyncio.run(main())
        except BaseException as error:  # raised in the calling thread
            failed.append(error)

    thread = threading.Thread(target=run, name="in_browser")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return results


def result(value):
    """A result of in_browser, or the exception its job raised, raised here."""
    if isinstance(value, BaseException):
        raise value
    return value


async def evaluate_loaded(browser, url: str, viewport: dict, script: str):
    """What ``script`` returns on the page at ``url``, loaded in a ``viewport`` of its
    own context, once the network has been idle (an in_browser job)."""
    context = await new_async_context(browser, viewport=viewport)
    try:
        page = await context.new_page()
        await page.goto(url, wait_until="load")
        await page.wait_for_load_state("networkidle")
        return await page.evaluate(script)
    finally:
        await context.close()


async def probe_page(browser, url: str, mode: str) -> dict:
    """Load a page offline in ``mode``; report what went wrong and what it shows."""
    viewport, scheme = MODES[mode]
    problems = {"console": [], "page_errors": [], "bad_status": [], "failed": [], "external": []}
    context = await new_async_context(browser, viewport=viewport, color_scheme=scheme)
    try:
        page = await context.new_page()

        # A request off this machine is recorded, and fails: Chromium resolves no
        # other host (OFFLINE). Not page.route: a round trip to Python for each of a
        # page's requests cost a third of the probe's CPU.
        page.on("request", lambda r: None if r.url.startswith(("data:", "blob:"))
                or urlparse(r.url).hostname == "127.0.0.1"
                else problems["external"].append(r.url))
        page.on("console",
                lambda m: problems["console"].append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems["page_errors"].append(str(e)))
        page.on(
            "response",
            lambda r: problems["bad_status"].append(f"{r.status} {r.url}")
            if r.status >= 400 else None,
        )
        page.on(
            "requestfailed",
            lambda r: problems["failed"].append(f"{r.url} ({r.failure})")
            if urlparse(r.url).hostname == "127.0.0.1"
            else None,
        )
        await page.goto(url, wait_until="load")
        await page.wait_for_load_state("networkidle")
        if await page.locator(".math").count() > 0:
            await page.wait_for_function(
                "() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            await page.evaluate("() => MathJax.startup.promise")
        report = await page.evaluate(PROBE_JS, viewport["width"])
        if mode == "phone":
            report["primary_menu"] = await open_menu(page, "primary")
            report["secondary_menu"] = await open_menu(page, "secondary")
    finally:
        await context.close()
    report.update(problems)
    return report


@pytest.fixture(scope="module")
def probe(built_book, server, browser):
    """``probe(page, mode)``: the page's report, each page opened once per mode.

    Every reading the tests below take (each page as a desktop, a phone and in the
    dark; the pages of the toc on a laptop) is taken at once, PAGES_AT_ONCE pages
    at a time (in_browser). ``browser`` is asked for its check that Chromium is
    there (a skip, or in CI a failure)."""

    def read(keys) -> dict:
        return in_browser({(rel, mode): functools.partial(probe_page, url=f"{server}/{rel}",
                                                          mode=mode)
                           for rel, mode in keys})

    cache = read([(rel, mode) for rel in all_pages(built_book)
                  for mode in ("desktop", "phone", "dark")]
                 + [(f"{page}.html", "laptop") for page in toc_pages()])

    def get(rel: str, mode: str) -> dict:
        if not rel.endswith(".html"):
            rel += ".html"
        if (rel, mode) not in cache:
            cache.update(read([(rel, mode)]))
        return result(cache[rel, mode])

    return get


def test_every_page_loads_cleanly_offline(built_book, probe):
    pages = all_pages(built_book)
    assert len(pages) >= len(toc_pages())
    failures = {}
    for rel in pages:
        for mode in ("desktop", "phone", "dark"):
            report = probe(rel, mode)
            keys = ("console", "page_errors", "bad_status", "failed", "external", "broken_images")
            bad = {k: report[k] for k in keys if report[k]}
            if report["math_errors"]:
                bad["math_errors"] = report["math_errors"]
            if report["math"] and report["typeset"] < report["math"]:
                bad["math_not_typeset"] = f"{report['typeset']} of {report['math']} typeset"
            if report["raw_tex"]:
                bad["raw_tex_in_typeset_math"] = report["raw_tex"]
            if bad:
                failures[f"{rel} ({mode})"] = bad
    assert not failures, f"pages with problems: {failures}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_page_has_math_figures_and_colab_link(probe, page):
    report = probe(page, "desktop")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = urlparse(config["repository"]["url"]).path.strip("/")
    branch = config["repository"].get("branch", "main")
    # Colab opens the learner notebook (notebooks/, _ext/learner_notebooks.py), not the
    # chapter's source with its solutions.
    expected = (f"https://colab.research.google.com/github/{repo}/blob/{branch}/"
                f"notebooks/{Path(page).name}.ipynb")
    assert expected in report["colab"], f"no Colab link {expected}; found {report['colab']}"
    assert not [h for h in report["colab"] if "/chapters/" in h], report["colab"]
    assert report["math"] > 0 and report["typeset"] >= report["math"] and not report["math_errors"]
    assert report["images"] > 0 and not report["broken_images"], report["broken_images"]


def test_downloads_give_the_learner_notebooks(built_book):
    """A chapter's download menu and notebooks.zip give the learner notebook (no
    solution, no raw MyST) and, apart, the solutions notebook: not the chapter's
    source, which has every solution under its exercise."""
    import zipfile

    for page in CHAPTERS:
        name = Path(page).name + ".ipynb"
        soup = page_soup(built_book / f"{page}.html")
        # The book's own files (the Colab button is tested above; "suggest edit" is
        # the source on GitHub).
        links = {a["href"] for a in soup.select(".bd-header-article a[href$='.ipynb']")
                 if not urlparse(a["href"]).scheme}
        assert links == {f"../notebooks/{name}", f"../notebooks/solutions/{name}"}, links
        learner = (built_book / "notebooks" / name).read_text()
        assert "{solution}" not in learner and "{exercise}" not in learner
        assert "{solution}" not in (built_book / "notebooks" / "solutions" / name).read_text()
        assert "Solution to exercise" in (built_book / "notebooks" / "solutions" / name).read_text()
    with zipfile.ZipFile(built_book / "notebooks.zip") as archive:
        entries = sorted(archive.namelist())
        names = sorted(Path(c).name + ".ipynb" for c in CHAPTERS)
        assert entries == sorted([f"chapters/{n}" for n in names]
                                 + [f"chapters/solutions/{n}" for n in names])
        for n in names:
            assert archive.read(f"chapters/{n}").decode() == (built_book / "notebooks" / n).read_text()


@pytest.mark.parametrize("page_name", toc_pages())
def test_long_equations_are_split_to_fit_the_column(probe, page_name):
    """A displayed equation wider than the desktop column is cut in the PDF and
    scrolls on a desktop: split it (aligned, or several lines)."""
    wide = probe(page_name, "desktop")["wide_math"]
    assert not wide, f"equations wider than the column: {wide}"


# ------------------------------------------------- phones, figures, dark mode


@pytest.mark.parametrize("page_name", toc_pages())
def test_phone_menu_buttons_open_the_chapter_list_and_the_contents(probe, page_name):
    report = probe(page_name, "phone")
    links = report["primary_menu"]
    assert not isinstance(links, int), f"{links} visible menu buttons at 390 px"
    assert links is not None, "the menu button did not open the chapter list"
    # From a chapter page, the other chapters are relative links ("11_writing_the_kernel.html").
    wanted = {Path(c).stem for c in CHAPTERS} - {Path(page_name).stem}
    chapters = {Path(urlparse(h).path).stem for h in links} & wanted
    assert wanted <= chapters, f"the menu does not list {sorted(wanted - chapters)}"
    # "On this page": every page of the toc has sections, so the button is there.
    contents = report["secondary_menu"]
    assert not isinstance(contents, int), f"{contents} visible 'contents' buttons at 390 px"
    assert contents, "the contents button did not open the page's sections"
    assert all(h.startswith("#") for h in contents), contents


def test_one_search_box_on_a_desktop(probe):
    boxes = probe(CHAPTERS[0], "desktop")["search_boxes"]
    assert boxes == 1, f"{boxes} search boxes visible"


def test_no_page_is_wider_than_a_phone(built_book, probe):
    wide = {}
    for rel in all_pages(built_book):
        report = probe(rel, "phone")
        if report["scroll_width"] > PHONE["width"] or report["cut"]:
            wide[rel] = (report["scroll_width"], report["cut"])
    assert not wide, f"pages wider than {PHONE['width']} px, or content cut at its edge: {wide}"


@pytest.mark.parametrize("page_name", toc_pages())
def test_code_lines_fit_their_box_on_a_desktop(probe, page_name):
    """At 1264 px (a 1280-px screen with a scrollbar) a code line of MAX_CODE_LINE
    characters fits its box: in a code cell, an exercise, an opened solution, an
    API entry, the landing page. attnlib's own code, shown by attnlib.show_source,
    fits MAX_PACKAGE_LINE characters, unwrapped. (A printed output is not code: a
    wide table scrolls in its box, see the phone's test below.)"""
    boxes = [b for b in probe(page_name, "laptop")["code_boxes"] if not b["output"] or b["listing"]]
    cut = []
    for b in boxes:
        limit = MAX_PACKAGE_LINE if b["listing"] else MAX_CODE_LINE
        what = "attnlib listing" if b["listing"] else "code box"
        if b["white_space"] != "pre":
            cut.append(f"{what} wraps its lines (white-space {b['white_space']}): {b['line']!r}")
        elif b["scroll"] > b["client"]:
            cut.append(f"{b['scroll']} px of code in a {b['client']} px {what}"
                       + (f" (a line of {b['chars']} characters, over {limit}: {b['line']!r})"
                          if b["chars"] > limit else f" ({b['line']!r})"))
    listings = sum(b["listing"] for b in boxes)
    assert not cut, (f"{len(cut)} of {len(boxes)} code boxes ({listings} attnlib listings) cut or"
                     f" wrapped at {LAPTOP['width']} px: {cut}")


@pytest.mark.parametrize("mode", ["phone", "desktop"])
def test_every_box_that_scrolls_sideways_shows_it(built_book, probe, mode):
    """A code box, an output, a table or a display equation wider than its box
    scrolls in it; its edge fades where there is more (course.js, course.css)."""
    total, scrolling, missing = 0, 0, {}
    for rel in all_pages(built_book):
        report = probe(rel, mode)["scrollers"]
        total += report["boxes"]
        scrolling += report["count"]
        if report["no_cue"]:
            missing[rel] = report["no_cue"][:3]
    print(f"{mode}: {scrolling} of {total} boxes scroll sideways; without the fade: "
          f"{sum(len(v) for v in missing.values())}")
    assert scrolling > 0, "no box scrolls: the test sees nothing to check"
    assert not missing, f"boxes that scroll sideways with nothing to show it: {missing}"


@pytest.mark.parametrize("page_name", toc_pages())
def test_table_headers_break_between_words_on_a_phone(probe, page_name):
    broken = probe(page_name, "phone")["broken_headers"]
    assert not broken, f"table headers broken inside a word at 390 px: {broken}"


def test_player_controls_are_big_enough_for_a_finger(probe):
    """Chapter 10's players on a phone: every button and radio button (with its
    label) at least 44 x 44 CSS px."""
    page_name = next(c for c in CHAPTERS if c.startswith("chapters/10_"))
    report = probe(page_name, "phone")
    assert report["animations"], "chapter 10 shows no player: the selector is stale"
    assert not report["small_targets"], f"controls under 44 x 44 px: {report['small_targets']}"


def test_the_instructors_outputs_fit_their_box_on_a_desktop(probe):
    """The page's pytest reports (a 350-character CheckFailed line, which the next
    sentence asks the reader to read) wrap in their box at 1280 px."""
    report = probe("instructors", "desktop")
    assert not report["wide_outputs"], report["wide_outputs"]


def test_the_code_width_tests_see_attnlib_listings(probe):
    """The chapter that shows attnlib's CausalAttention (chapter 5) has listings for
    the two tests above to measure: the selector is not stale."""
    page_name = next(c for c in CHAPTERS if c.startswith("chapters/05_"))
    assert sum(b["listing"] for b in probe(page_name, "laptop")["code_boxes"]) >= 1
    assert sum(b["listing"] for b in probe(page_name, "phone")["code_boxes"]) >= 1


@pytest.mark.parametrize("page_name", toc_pages())
def test_code_scrolls_in_its_own_box_on_a_phone(probe, page_name):
    """On a phone code is not wrapped (a wrapped Python line loses its indentation):
    a long line scrolls sideways inside its box, which stays within the screen.
    attnlib's code shown by attnlib.show_source (a cell's HTML output) is code too."""
    boxes = [b for b in probe(page_name, "phone")["code_boxes"] if not b["output"] or b["listing"]]
    bad = [f"{'attnlib listing ' if b['listing'] else ''}{b['line']!r}: white-space"
           f" {b['white_space']}, overflow-x {b['overflow_x']}, right edge at {b['right']:.0f} px"
           for b in boxes
           if b["white_space"] != "pre" or b["overflow_x"] not in ("auto", "scroll")
           or b["right"] > PHONE["width"] + 1]
    assert not bad, f"code boxes that wrap or leave the screen on a phone: {bad[:5]}"


@pytest.mark.parametrize("page_name", toc_pages())
def test_printed_columns_keep_their_alignment_on_a_phone(probe, page_name):
    """A printed tensor or table (a line indented, or aligned by a run of spaces) is
    not wrapped at the phone's edge, where a row's last numbers fell to column 0:
    it scrolls sideways in its box. An error's one-line message (a checker's
    CheckFailed) wraps, to be read without scrolling, within the screen, as does a
    report that course.js marks as prose (a line over 160 characters: pytest's)."""
    boxes = [b for b in probe(page_name, "phone")["code_boxes"] if b["output"] and not b["listing"]]
    bad = [f"{b['line']!r}: white-space {b['white_space']}, overflow-x {b['overflow_x']},"
           f" right edge at {b['right']:.0f} px"
           for b in boxes if b["aligned"] and not b["error"] and not b["prose"]
           and (b["white_space"] != "pre" or b["overflow_x"] not in ("auto", "scroll")
                or b["right"] > PHONE["width"] + 1)]
    assert not bad, f"printed columns that wrap or leave the screen on a phone: {bad[:5]}"
    unwrapped = [f"{b['line']!r}: white-space {b['white_space']}, {b['scroll']} px in"
                 f" {b['client']} px" for b in boxes if (b["error"] or b["prose"])
                 and (b["white_space"] != "pre-wrap" or b["scroll"] > b["client"] + 1)]
    assert not unwrapped, f"error messages that do not wrap on a phone: {unwrapped[:5]}"


def test_animations_fit_the_column_on_a_phone(probe):
    """Chapter 10's players (matplotlib's JavaScript animation) fit the 342-px column
    of a 390-px phone: the frame scales down, and no button, slider or label is cut
    at the column's edge (the frame's colour bar labels were, at 374 px)."""
    page_name = next(c for c in CHAPTERS if c.startswith("chapters/10_"))
    players = probe(page_name, "phone")["animations"]
    assert len(players) >= 2, f"{len(players)} animations in {page_name}: is the selector stale?"
    bad = []
    for i, player in enumerate(players):
        left, right = player["column"]["left"] - 1, player["column"]["right"] + 1
        parts = [("the player", player["player"]), ("its frame", player["img"]),
                 *((f"control {c['name']!r}", c) for c in player["controls"])]
        assert len(player["controls"]) >= 10, player["controls"]
        bad += [f"animation {i + 1}: {name} spans {p['left']:.0f}-{p['right']:.0f} px, the column"
                f" {left + 1:.0f}-{right - 1:.0f} px"
                for name, p in parts if p["width"] > 0 and (p["left"] < left or p["right"] > right)]
        if player["img"]["width"] < 0.9 * (right - left - 2):
            bad.append(f"animation {i + 1}: the frame is {player['img']['width']:.0f} px wide")
    assert not bad, bad


# The figure style's text sizes (attnlib/book.mplstyle), in points.
FIGURE_STYLE = ROOT / "attnlib" / "book.mplstyle"
FIGURE_TEXT_KEYS = ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize",
                    "ytick.labelsize", "legend.fontsize")


def smallest_figure_text_pt() -> float:
    """The smallest text size that attnlib/book.mplstyle sets, in points (a named
    size such as "small" is scaled from font.size, as matplotlib does)."""
    import matplotlib as mpl
    from matplotlib.font_manager import font_scalings

    style = mpl.rc_params_from_file(FIGURE_STYLE, use_default_template=False)
    base = float(style.get("font.size", mpl.rcParamsDefault["font.size"]))
    sizes = []
    for key in FIGURE_TEXT_KEYS:
        value = style.get(key, mpl.rcParamsDefault[key])
        sizes.append(base * font_scalings[value] if isinstance(value, str) else float(value))
    return min(sizes)


def figure_name(fig: dict) -> str:
    src = fig["src"] or ""
    return "an animation frame" if src.startswith("data:") else Path(urlparse(src).path).name


def intended_width(built_book: Path, page_name: str, fig: dict) -> float | None:
    """The width, in CSS px, at which a figure's text has the size it was drawn
    at: 100 px an inch. A PNG saved at 100 dpi is meant to be shown at its own
    width; one saved at 200 dpi (sharp on a 2x or 3x screen) at half of it. An
    SVG at its width in points x 100 / 72. None where the image cannot be read."""
    from PIL import Image

    src = fig["src"] or ""
    if src.startswith("data:"):  # a frame of a matplotlib animation (class animation)
        data = io.BytesIO(base64.b64decode(src.partition(",")[2]))
    else:
        path = (built_book / page_name).parent / urlparse(src).path
        if not path.is_file():
            return None
        if path.suffix == ".svg":
            width = re.search(r'<svg[^>]*\swidth="([\d.]+)(pt|px)?"', path.read_text())
            if not width:
                return None
            points = float(width.group(1)) * (72 / 96 if width.group(2) == "px" else 1)
            return points * 100 / 72
        data = path
    with Image.open(data) as image:
        dpi = image.info.get("dpi", (100, 100))[0] or 100
        natural = fig["natural"] or image.width
    return natural * 100 / float(dpi)


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_figures_are_legible_and_described(built_book, probe, page_name):
    figures = probe(page_name, "desktop")["figures"]
    assert figures, "no figures"
    problems = []
    for fig in figures:
        name = figure_name(fig)
        intended = intended_width(built_book, page_name, fig)
        if intended and fig["width"]:
            # Against the width the figure was drawn for, not its pixels: a 2x PNG
            # shown at half its pixel width is at its full size.
            scale = fig["width"] / intended
            if scale < MIN_FIGURE_SCALE:
                problems.append(f"{name} shown at {scale:.0%} of the {intended:.0f} px"
                                f" it was drawn for")
        alt = fig["alt"].strip()
        if len(alt) < 15 or re.search(r"\.(png|svg|jpe?g)$", alt) or alt == name:
            problems.append(f"{name} has no real alt text ({alt!r})")
    assert not problems, problems


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_figure_text_is_legible_on_a_phone(built_book, probe, page_name):
    """On a 390-px phone every figure shrinks to the column; its smallest text
    (the smallest size in attnlib/book.mplstyle, scaled as the figure is) stays
    at least MIN_PHONE_FIGURE_TEXT_PX CSS px."""
    min_pt = smallest_figure_text_pt()
    figures = [f for f in probe(page_name, "phone")["figures"] if f["width"] > 0]
    assert figures, "no figures shown on a phone"
    small = []
    for fig in figures:
        intended = intended_width(built_book, page_name, fig)
        assert intended, f"cannot read {figure_name(fig)}"
        text_px = min_pt * (100 / 72) * fig["width"] / intended
        if text_px < MIN_PHONE_FIGURE_TEXT_PX:
            small.append(f"{figure_name(fig)}: {text_px:.1f} px ({fig['width']:.0f} px shown,"
                         f" drawn for {intended:.0f} px)")
    assert not small, (f"figure text under {MIN_PHONE_FIGURE_TEXT_PX} px on a phone"
                       f" ({min_pt:g} pt is the style's smallest): {small}")


# Limits on a figure's pixels (measured on the book's own figures: at most 0.4 %
# near-white, no dark or white text on a transparent background; a figure drawn
# without attnlib.book on white is 98 % white, with its black text 1 % black ink).
MAX_WHITE_AREA = 0.05
MAX_INK_ON_CLEAR = 0.001


def figure_pixels(path: Path) -> dict:
    """How a PNG would read on either theme's background."""
    import numpy as np
    from PIL import Image, ImageFilter

    with Image.open(path) as image:
        rgba = np.asarray(image.convert("RGBA")).astype(int)
    rgb, alpha = rgba[..., :3], rgba[..., 3]
    low, high = rgb.min(-1), rgb.max(-1)
    neutral = high - low < 20
    # Pixels within 2 px of a transparent one: a line or a letter drawn on the page.
    clear = Image.fromarray(((alpha < 30) * 255).astype("uint8")).filter(ImageFilter.MaxFilter(5))
    on_clear = np.asarray(clear) > 0
    return {
        "opaque_corners": min(alpha[0, 0], alpha[0, -1], alpha[-1, 0], alpha[-1, -1]) == 255,
        "white_area": float(((alpha > 200) & (low > 230)).mean()),
        "dark_ink_on_clear": float(((alpha > 128) & (high < 70) & neutral & on_clear).mean()),
        "white_ink_on_clear": float(((alpha > 128) & (low > 200) & neutral & on_clear).mean()),
    }


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_dark_mode_puts_no_figure_on_a_white_block(built_book, probe, page_name):
    report = probe(page_name, "dark")
    # The system asks for dark; the book's theme ("auto") must follow by itself.
    assert report["theme"] == "dark", f"theme {report['theme']!r} for a dark system"
    problems = [f"{Path(src).name} on {light}" for src, light in report["light_blocks"] if light]
    assert not problems, f"figures on a light block in dark mode: {problems}"
    # pydata-sphinx-theme dims images in the dark: the figures' grey text would fall
    # from 3.9:1 to 2.5:1 against the background.
    assert not report["filtered"], f"figures dimmed by a filter: {report['filtered']}"
    unreadable = []
    for src, _ in report["light_blocks"]:
        path = (built_book / page_name).parent / src
        if path.suffix != ".png" or not path.is_file():
            continue
        pixels = figure_pixels(path)
        if pixels["opaque_corners"]:
            unreadable.append(f"{path.name}: opaque background (drawn without attnlib.book)")
        if pixels["white_area"] > MAX_WHITE_AREA:
            unreadable.append(f"{path.name}: {pixels['white_area']:.0%} opaque white")
        if pixels["dark_ink_on_clear"] > MAX_INK_ON_CLEAR:
            unreadable.append(f"{path.name}: black text or lines on a transparent background"
                              f" ({pixels['dark_ink_on_clear']:.2%}), unreadable in the dark")
        if pixels["white_ink_on_clear"] > MAX_INK_ON_CLEAR:
            unreadable.append(f"{path.name}: white text or lines on a transparent background"
                              f" ({pixels['white_ink_on_clear']:.2%}), unreadable in the light")
    assert not unreadable, unreadable


def test_figure_checks_catch_a_figure_drawn_without_the_book_style(tmp_path):
    """The pixel checks above fail on matplotlib's defaults, on white or transparent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.2), dpi=100)
    ax.plot(range(10), [x * x for x in range(10)], label="x squared")
    ax.set(xlabel="key dimension", ylabel="variance", title="a figure")
    ax.legend()
    fig.savefig(tmp_path / "white.png")
    fig.savefig(tmp_path / "clear.png", transparent=True)
    plt.close(fig)
    white, clear = figure_pixels(tmp_path / "white.png"), figure_pixels(tmp_path / "clear.png")
    assert white["opaque_corners"] and white["white_area"] > MAX_WHITE_AREA
    assert not clear["opaque_corners"] and clear["dark_ink_on_clear"] > MAX_INK_ON_CLEAR


def contrast(fg: list[float], bg: list[float]) -> float:
    def luminance(rgb):
        channels = [c / 255 for c in rgb[:3]]
        channels = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]

    a, b = luminance(fg), luminance(bg)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


@pytest.mark.parametrize("mode", ["desktop", "dark"])
def test_show_source_text_is_readable_in_both_themes(probe, mode):
    """attnlib.show_source's code takes the theme's colours: WCAG AA (4.5:1) everywhere."""
    worst, seen = [], 0
    for page_name in CHAPTERS:
        pairs = probe(page_name, mode)["source_pairs"]
        seen += len(pairs)
        for text, fg, bg in pairs:
            ratio = contrast(fg, bg)
            if ratio < 4.5:
                worst.append((round(ratio, 2), page_name, text))
    assert seen > 50, f"only {seen} pieces of show_source code found: is the selector stale?"
    assert not worst, f"show_source text below 4.5:1 in {mode} mode: {sorted(worst)[:5]}"


# ------------------------------------------------- search, solutions, contents

SEARCH_RESULTS_JS = """() => Array.from(document.querySelectorAll('#search-results ul.search > li'))
  .map(li => ({href: li.querySelector('a').getAttribute('href'),
               title: li.querySelector('a').textContent,
               snippet: li.querySelector('p.context') && li.querySelector('p.context').textContent}))"""


@contextlib.contextmanager
def desktop_page(browser, url: str):
    """A 1280-px page loaded from ``url``, and the list its JavaScript errors go to;
    its browser context is closed afterwards."""
    context = new_context(browser, viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url, wait_until="load")
        yield page, errors
    finally:
        context.close()


def search(browser, server, query: str) -> tuple[list[dict], list[str]]:
    """The results of the book's search page for ``query``, best first, with their
    snippets; and the page's JavaScript errors."""
    with desktop_page(browser, f"{server}/search.html?q={quote_plus(query)}") as (page, errors):
        page.wait_for_function(
            "() => { const s = document.querySelector('#search-results .search-summary');"
            " return s && s.textContent.trim().length > 0; }")
        # Each snippet is fetched from its page after the list is shown.
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(300)
        return page.evaluate(SEARCH_RESULTS_JS), errors


def test_search_ranks_the_kv_cache_chapter_first(server, browser):
    """Chapter 9 teaches the KV cache (three headings say so); chapter 10 uses it
    in one section. Searching "KV cache" lists chapter 9 first."""
    results, errors = search(browser, server, "KV cache")
    pages = [urlparse(r["href"]).path for r in results]
    kv_chapter = next(c for c in CHAPTERS if c.startswith("chapters/09_")) + ".html"
    assert not errors, errors
    assert pages and pages[0] == kv_chapter, (
        f"first results for 'KV cache': {[r['title'] for r in results[:4]]}")


# What a snippet must not show: TeX's commands as bare words ("fracQKᵀ√d_k",
# "beginsplit beginaligned"), and the labels of the header's buttons instead of the
# page's text ("...Colab", "...Repository", "....pdf Attention in ... Contents 9.1.").
SNIPPET_FAULTS = re.compile(r"\bfrac|\bbegin(?!n)|\bColab\b|\bRepository\b|Suggest edit|Open issue"
                            r"|\.ipynb\s+\.pdf|^\.*\.pdf\b|\bContents\s+\d+\.\d+\.")


@pytest.mark.parametrize("query", ["scaled dot product", "softmax", "rotary",
                                   "grouped-query attention", "linear attention",
                                   "ring attention", "KV cache"])
def test_search_snippets_show_the_pages_text_without_tex(server, browser, query):
    """The snippet under each result is cut from the page's HTML, where math is TeX
    source and the header holds the page's buttons; the reader sees the page's
    text, its math without TeX's delimiters or commands."""
    results, errors = search(browser, server, query)
    snippets = [r["snippet"] for r in results if r["snippet"]]
    assert not errors, errors
    assert len(snippets) >= 3, f"only {len(snippets)} snippets: {results}"
    tex = [s for s in snippets if any(d in s for d in ("\\(", "\\)", "\\[", "\\]", "$$"))]
    assert not tex, f"snippets with TeX delimiters: {tex[:3]}"
    faults = [f"{m.group(0)!r} in {s[:200]!r}" for s in snippets
              for m in [SNIPPET_FAULTS.search(s)] if m]
    assert not faults, f"{len(faults)} of {len(snippets)} snippets for {query!r}: {faults[:3]}"


def test_a_click_on_a_solution_title_opens_the_solution(server, browser):
    """A solution's title is mostly its link back to the exercise ("Solution to
    Exercise 1.1 (...)"); a click on it opens the solution, and closes it again,
    without leaving the solution."""
    with desktop_page(browser, f"{server}/{CHAPTERS[0]}.html") as (page, errors):
        page.wait_for_load_state("networkidle")
        solution = page.locator(".solution.dropdown").first
        content = solution.locator(":scope > :not(.admonition-title)").first
        link = solution.locator(".admonition-title a").first
        assert link.count() == 1 and "Exercise" in link.inner_text()
        assert not content.is_visible(), "the solution is open before any click"
        url = page.url
        link.click()
        page.wait_for_timeout(300)
        assert content.is_visible(), "a click on the solution's title did not open it"
        assert page.url == url, f"the click left for {page.url}"
        solution.locator(".admonition-title").click(position={"x": 40, "y": 10})
        page.wait_for_timeout(300)
        assert not content.is_visible(), "a second click on the title did not close it"
        assert not errors, errors


# Every entry of the contents beside a page (pydata-sphinx-theme shows the deeper
# levels of the section being read; here all are shown at once).
SECONDARY_TOC_JS = r"""() => {
  const style = document.createElement('style');
  style.textContent = '.bd-sidebar-secondary nav.page-toc ul { display: block !important; }';
  document.head.appendChild(style);
  const side = document.querySelector('.bd-sidebar-secondary');
  const cs = getComputedStyle(side);
  const edge = side.getBoundingClientRect().right - parseFloat(cs.paddingRight)
               - parseFloat(cs.borderRightWidth);
  const links = Array.from(side.querySelectorAll('nav.page-toc a'))
    .filter(a => a.offsetParent !== null);
  const clipped = links.filter(a => a.scrollWidth > a.clientWidth + 1 ||
      [a, ...a.querySelectorAll('*')].some(e => e.getBoundingClientRect().right > edge + 1))
    .map(a => a.textContent.trim());
  return {links: links.length, clipped: clipped,
          scroll_width: side.scrollWidth, client_width: side.clientWidth};
}"""


def test_api_contents_show_long_names_in_full(built_book, server, browser):
    """Each API page's contents list its module's classes and checkers; at 1280 px
    a long name (check_prefix_matching_score()) wraps within the sidebar."""
    tocs = in_browser({name: functools.partial(evaluate_loaded, url=f"{server}/{name}.html",
                                               viewport=DESKTOP, script=SECONDARY_TOC_JS)
                       for name in api_pages()})
    links = 0
    for page_name in api_pages():
        toc = result(tocs[page_name])
        links += toc["links"]
        assert not toc["clipped"], f"{page_name}: {len(toc['clipped'])} entries cut at the" \
                                   f" sidebar's edge: {toc['clipped'][:5]}"
        assert toc["scroll_width"] <= toc["client_width"], (
            f"{page_name}: the contents scroll sideways: {toc['scroll_width']} px in"
            f" {toc['client_width']} px")
    assert links > 300, f"only {links} entries in the API pages' contents"


# ------------------------------------------------------------ API reference


def public_api() -> dict[str, list[str]]:
    """Every public name of attnlib, with the HTML ids the API page may document it
    under: ``{"attnlib.exercises.multihead.check_merge_heads":
    ["attnlib.exercises.check_merge_heads", ...]}``.

    A module's public names are its ``__all__`` and every function or class it
    defines without a leading underscore (so a name left out of ``__all__`` is
    still caught). A re-exported name counts as documented where any module that
    exports the same object documents it: checkers under attnlib.exercises, the
    package's top-level names in their own modules. ``attnlib.exercises._common``,
    the toolkit for writing a checker, is public for instructors.
    """
    import importlib
    import inspect
    import pkgutil

    import attnlib

    modules = {"attnlib": attnlib}
    for info in pkgutil.walk_packages(attnlib.__path__, "attnlib."):
        private = any(part.startswith("_") for part in info.name.split("."))
        if not private or info.name == "attnlib.exercises._common":
            modules[info.name] = importlib.import_module(info.name)
    names = {}
    for module_name, module in modules.items():
        assert hasattr(module, "__all__"), f"{module_name} has no __all__"
        defined = [n for n, obj in vars(module).items()
                   if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                   and obj.__module__ == module_name]
        for name in [*module.__all__, *defined]:
            if name.startswith("__"):
                continue
            obj = getattr(module, name)
            if inspect.ismodule(obj):  # a submodule: its own section
                names[f"{module_name}.{name}"] = [f"module-{obj.__name__}"]
                continue
            homes = [other for other, mod in modules.items()
                     if name in mod.__all__ and getattr(mod, name) is obj]
            names[f"{module_name}.{name}"] = sorted(f"{home}.{name}"
                                                    for home in {module_name, *homes})
    return names


def api_pages() -> list[str]:
    """The API reference's module pages (``api/attention``, ...): the sections under
    api in _toc.yml."""
    return [page for page in toc_pages() if page.startswith("api/")]


def api_page_of(built_book: Path, html_id: str) -> str:
    """The API page whose HTML has the element ``html_id``
    (``attnlib.kv_cache.KVCache``, ``module-attnlib.multihead``)."""
    pages = [page for page in api_pages()
             if f'id="{html_id}"' in (built_book / f"{page}.html").read_text()]
    assert len(pages) == 1, f"{html_id} is on {pages}"
    return pages[0]


def test_every_public_name_is_on_exactly_one_api_page(built_book):
    """The reference is a page per module (api/*.md, under api.md in _toc.yml): each
    public name of attnlib is documented on one of them, and on one only."""
    import attnlib

    pages = {page: (built_book / f"{page}.html").read_text() for page in ["api", *api_pages()]}
    assert len(pages) >= 20, f"only {len(pages)} API pages: {list(pages)}"
    multihead = api_page_of(built_book, f"module-{attnlib.MultiHeadAttention.__module__}")
    assert f'id="{attnlib.MultiHeadAttention.__module__}.MultiHeadAttention"' in pages[multihead]
    names = public_api()
    for name in ["attnlib.exercises.check_multi_head_attention", "attnlib.exercises._common.RTOL",
                 "attnlib.MultiHeadAttention"]:
        assert name in names
    where = {name: [page for page, html in pages.items() if any(f'id="{i}"' in html for i in ids)]
             for name, ids in names.items()}
    missing = [name for name, found in where.items() if not found]
    twice = {name: found for name, found in where.items() if len(found) > 1}
    assert not missing, f"on no API page: {missing}"
    assert not twice, f"on more than one API page: {twice}"


def test_api_index_lists_every_module_page(built_book):
    """api.md, where the old one-page reference's links land, is the index: a line
    with a link for each module page, in the order of _toc.yml."""
    soup = page_soup(built_book / "api.html")
    article = soup.select_one("article")
    linked = []
    for li in article.select("li"):
        for a in li.select("a.reference.internal"):
            href = a["href"].split("#")[0].removesuffix(".html")
            if href.startswith("api/") and href not in linked:
                linked.append(href)
    assert linked == api_pages(), f"api.html lists {linked}, _toc.yml has {api_pages()}"
    sources = sorted(p.relative_to(ROOT).with_suffix("").as_posix()
                     for p in (ROOT / "api").glob("*.md"))
    assert sources == sorted(api_pages()), "an api/*.md page is missing from _toc.yml"


def test_each_api_page_fits_forty_phone_screens(built_book, server, browser):
    """The reference on one page was 339,217 px tall on a 390 x 844 phone (402
    screens); each module's page is under 40."""
    script = "() => document.documentElement.scrollHeight"
    heights = {name: result(value) for name, value in in_browser(
        {name: functools.partial(evaluate_loaded, url=f"{server}/{name}.html", viewport=PHONE,
                                 script=script)
         for name in ["api", *api_pages()]}).items()}
    print(f"phone heights (px): {heights}")
    assert min(heights.values()) > PHONE["height"], f"a page did not render: {heights}"
    tall = {name: h for name, h in heights.items() if h > 40 * PHONE["height"]}
    assert not tall, f"API pages taller than 40 phone screens ({40 * PHONE['height']} px): {tall}"


@pytest.mark.parametrize("html_id", [
    "attnlib.kv_cache.KVCache",
    "attnlib.exercises.check_prefix_matching_score",
    "attnlib.flash_triton.flash_attention_triton",
    "attnlib.bench.operator_parity",
    "attnlib.experiments.softmax_jacobian",
])
def test_search_finds_an_api_name_on_its_modules_page(built_book, server, browser, html_id):
    """The search index holds the new pages: searching a public name, the first
    result from the API reference is the page that documents it (its module's, or
    the chapters' part of it), linked to the name's entry."""
    page_name = api_page_of(built_book, html_id)
    name = html_id.rsplit(".", 1)[1]
    results, errors = search(browser, server, name)
    assert not errors, errors
    hits = [(urlparse(r["href"]).path.lstrip("/"), urlparse(r["href"]).fragment) for r in results]
    from_api = [(path, fragment) for path, fragment in hits if path.startswith("api")]
    assert from_api, f"no API page found for {name!r}: {hits[:5]}"
    assert from_api[0][0] == f"{page_name}.html", (
        f"{name!r}: first API result {from_api[0]}, expected {page_name}.html; {from_api[:5]}")
    assert (f"{page_name}.html", html_id) in from_api, (
        f"{name!r}: no result links #{html_id} on {page_name}.html: {from_api[:5]}")


def test_api_page_shows_multi_head_attention_in_a_browser(built_book, server, browser):
    import attnlib

    page_name = api_page_of(built_book, f"module-{attnlib.MultiHeadAttention.__module__}")
    with desktop_page(browser, f"{server}/{page_name}.html") as (page, _):
        heading = page.locator(f'[id="{attnlib.MultiHeadAttention.__module__}.MultiHeadAttention"]')
        assert heading.count() == 1 and heading.is_visible()
        assert "num_heads" in heading.locator("xpath=..").inner_text()


# ------------------------------------------------------- around the chapters


def test_intro_links_every_chapter_the_api_instructors_and_pdf(built_book):
    PDF_MISSING = course_html().PDF_MISSING

    html = (built_book / "intro.html").read_text()
    for page_name in [*CHAPTERS, "api", "instructors", "references"]:
        assert f'href="{page_name}.html' in html, f"intro does not link {page_name}"
    # After `make pdf` the introduction links the PDF next to it; after `make book`
    # alone it says how to make it (a link to a missing file would be broken).
    if 'href="book.pdf"' in html:
        assert (built_book / "book.pdf").is_file(), "the intro links book.pdf, which is missing"
    else:
        assert PDF_MISSING in html, "the intro neither links the PDF nor says how to make it"



def course_html():
    """The book's Sphinx extension _ext/course_html.py, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_html", ROOT / "_ext" / "course_html.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPHINX_CONF = """
import sys
sys.path.insert(0, {ext!r})
extensions = ["course_html"]
"""


@pytest.mark.parametrize("pdf_exists", [False, True], ids=["no-pdf", "pdf"])
def test_pdf_link_follows_the_pdf(tmp_path, pdf_exists):
    """The book-pdf role links the PDF and copies it into the HTML only where
    `make pdf` wrote it; otherwise it says how to make it."""
    PDF_MISSING = course_html().PDF_MISSING

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "conf.py").write_text(SPHINX_CONF.format(ext=str(ROOT / "_ext")))
    (src / "index.rst").write_text("Book\n====\n\nThe PDF: :book-pdf:`book.pdf`.\n\n"
                                   ".. toctree::\n\n   sub/page\n")
    (src / "sub" / "page.rst").write_text("Page\n====\n\nAgain: :book-pdf:`the PDF`.\n")
    if pdf_exists:
        (src / "_build" / "pdf").mkdir(parents=True)
        (src / "_build" / "pdf" / "book.pdf").write_bytes(b"%PDF-1.4 stand-in")
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-E", str(src), str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    index, page = (out / "index.html").read_text(), (out / "sub" / "page.html").read_text()
    if pdf_exists:
        assert 'href="book.pdf"' in index and 'href="../book.pdf"' in page
        assert (out / "book.pdf").read_bytes() == b"%PDF-1.4 stand-in"
    else:
        assert "book.pdf\"" not in index and PDF_MISSING in index and PDF_MISSING in page
        assert not (out / "book.pdf").exists()


def test_instructors_page_shows_what_its_examples_print(built_book):
    """The page's code runs at every build; what it prints is what the text promises."""
    soup = page_soup(built_book / "instructors.html")
    outputs = "\n".join(o.get_text() for o in soup.select("div.cell_output"))
    import attnlib.exercises as ex

    for name in ex.__all__:
        if name.startswith("check_"):
            assert name in outputs, f"the list of checkers lacks {name}"
    expected = [
        "CheckFailed: my_softmax(x, dim=-1) overflows",
        "Correct: my_softmax matches torch.softmax",
        # The pytest run of the assignment: one test passes, the wrong mask fails.
        "FAILED test_assignment.py::test_causal_mask - CheckFailed:",
        "polarity is flipped",
        "1 failed, 1 passed",
        "CheckFailed: fn uses the transposed weights",
        "CheckFailed: fn divides by the number of tokens",
        "passed: test_leaves_the_random_state_alone",
    ]
    missing = [text for text in expected if text not in outputs]
    assert not missing, f"instructors.md does not show {missing}"
    assert "\x1b[" not in outputs and "[31m" not in outputs, "terminal colour codes in an output"


def test_chapters_are_numbered_in_the_navigation(built_book):
    html = (built_book / "intro.html").read_text()
    nav = html[html.index('bd-docs-nav'):]
    for number, page_name in enumerate(CHAPTERS, start=1):
        assert re.search(rf'href="{re.escape(page_name)}.html">\s*{number}\. ', nav), (
            f"{page_name} is not numbered {number} in the navigation"
        )
