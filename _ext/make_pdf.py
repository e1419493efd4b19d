"""Print the single-page HTML book to a PDF with the system Chromium (make pdf).

    python _ext/make_pdf.py _build/singlehtml/intro.html _build/pdf/book.pdf

The page is served from 127.0.0.1 and every request off this machine is
blocked, so the PDF is made offline. Before printing, the script waits for
MathJax to typeset every formula and for every image to load, opens every
dropdown (exercise solutions, hidden code), and starts each chapter on a new
page; ``_static/course.css`` has the print rules that wrap code lines. The HTML
book's next build copies the PDF next to its pages and links it from the
introduction (``make pdf`` runs that build; see ``_ext/course_html.py``).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM = Path(os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]

# Run in the page: show what a reader opens by hand, and break pages at chapters.
PREPARE = """() => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  document.querySelectorAll('button.toggle-button').forEach(b => b.remove());
  // Sphinx's single-page build marks where each page of the book starts.
  const starts = Array.from(document.querySelectorAll('span[id^="document-"]'));
  starts.forEach(span => {
    let next = span.nextElementSibling;
    if (next) next.classList.add('course-chapter-start');
  });
  return starts.length;
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def print_pdf(html: Path, pdf: Path) -> int:
    """Print ``html`` (a file in a built book) to ``pdf``; return the number of chapters."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    handler = functools.partial(_Quiet, directory=str(html.parent))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/{html.name}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1000, "height": 1400})

            def route(r):
                if urlparse(r.request.url).hostname == "127.0.0.1" or r.request.url.startswith(
                    ("data:", "blob:")
                ):
                    r.continue_()
                else:
                    r.abort()

            page.route("**/*", route)
            # A busy machine lays out the whole book slowly: be patient.
            page.set_default_timeout(300_000)
            page.goto(url, wait_until="load")
            page.emulate_media(media="print")
            if page.locator(".math").count():
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                )
                page.evaluate("() => MathJax.startup.promise")
            chapters = page.evaluate(PREPARE)
            page.wait_for_function(
                "() => Array.from(document.images).every(i => i.complete)"
            )
            pdf.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(
                path=str(pdf),
                format="A4",
                print_background=True,
                margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"},
                display_header_footer=True,
                header_template="<span></span>",
                footer_template=(
                    '<div style="font-size:8px;width:100%;text-align:center;color:#666">'
                    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
                ),
            )
            browser.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    return chapters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path,
                        help="the single-page book, e.g. _build/singlehtml/intro.html")
    parser.add_argument("pdf", type=Path, help="where to write the PDF")
    parser.add_argument("--copy-to", type=Path, default=None,
                        help="also copy the PDF here (the HTML book's folder)")
    args = parser.parse_args(argv)
    if not args.html.is_file():
        parser.error(f"{args.html} does not exist: build the single-page book first")
    chapters = print_pdf(args.html.resolve(), args.pdf)
    if args.copy_to is not None and args.copy_to.is_dir():
        shutil.copy2(args.pdf, args.copy_to / args.pdf.name)
    print(f"wrote {args.pdf} ({chapters} pages of the book, each from a new sheet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
