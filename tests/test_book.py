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
    for page in toc_pages():
        html = built_book / f"{page}.html"
        assert html.is_file(), f"{page} is in _toc.yml but {html} was not built"
        assert "Traceback (most recent call last)" not in html.read_text()
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
