"""Print the single-page HTML book to a PDF with the system Chromium (make pdf).

    python _ext/make_pdf.py _build/singlehtml/intro.html _build/pdf/book.pdf

The page is served from 127.0.0.1 and every request off this machine is
blocked, so the PDF is made offline. Before printing, the script waits for
MathJax to typeset every formula and for every image to load, opens every
dropdown (exercise solutions, hidden code), and starts each chapter on a new
page; ``_static/print.css`` has the print rules that wrap code lines. The HTML
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

# A4 is 210 mm wide; 96 CSS pixels to the inch.
SIDE_MARGIN_MM = 14
PRINT_WIDTH_PX = round((210 - 2 * SIDE_MARGIN_MM) / 25.4 * 96)

# Run in the page: show what a reader opens by hand, and break pages at chapters.
PREPARE = """() => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  document.querySelectorAll('button.toggle-button').forEach(b => b.remove());
  // A displayed equation wider than the page would make Chromium shrink every
  // page of the book to fit: shrink only that equation (tests/test_book.py asks
  // for such an equation to be split).
  document.querySelectorAll('mjx-container[display="true"]').forEach(m => {
    if (m.scrollWidth > m.clientWidth + 1) m.style.zoom = m.clientWidth / m.scrollWidth;
  });
  // Sphinx's single-page build marks where each page of the book starts.
  const starts = Array.from(document.querySelectorAll('span[id^="document-"]'));
  starts.forEach(span => {
    let next = span.nextElementSibling;
    if (next) next.classList.add('course-chapter-start');
  });
  // Wider than the column, and Chromium shrinks every page: say what is too wide.
  const width = document.documentElement.scrollWidth;
  const wide = Array.from(document.querySelectorAll('.bd-article *'))
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                 && !e.closest('mjx-assistive-mml'))
    .slice(0, 5).map(e => e.tagName + '.' + e.className + ': '
                         + (e.textContent || '').trim().slice(0, 60));
  return {chapters: starts.length, width: width, wide: wide};
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def print_pdf(html: Path, pdf: Path) -> dict:
    """Print ``html`` (a file in a built book) to ``pdf``; return the number of pages of
    the book (``chapters``), the laid-out ``width`` in CSS px and what is ``wide``r
    than the column."""
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
            # The window as wide as the printed column (A4 less the margins), so
            # that what PREPARE measures is laid out as it will be printed.
            page = browser.new_page(viewport={"width": PRINT_WIDTH_PX, "height": 1400})

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
            layout = page.evaluate(PREPARE)
            page.wait_for_function(
                "() => Array.from(document.images).every(i => i.complete)"
            )
            pdf.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(
                path=str(pdf),
                format="A4",
                print_background=True,
                margin={"top": "16mm", "bottom": "16mm", "left": f"{SIDE_MARGIN_MM}mm",
                        "right": f"{SIDE_MARGIN_MM}mm"},
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
    return layout


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
    layout = print_pdf(args.html.resolve(), args.pdf)
    if args.copy_to is not None and args.copy_to.is_dir():
        shutil.copy2(args.pdf, args.copy_to / args.pdf.name)
    print(f"wrote {args.pdf} ({layout['chapters']} pages of the book, each from a new sheet),"
          f" laid out {layout['width']} px wide in a {PRINT_WIDTH_PX} px column")
    if layout["width"] > PRINT_WIDTH_PX:
        print("wider than the page, so Chromium shrank every page to fit:", *layout["wide"],
              sep="\n  ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
