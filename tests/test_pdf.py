"""`make pdf` produces a PDF of the whole book that a reader can use.

The fixture does what ``make pdf`` does: a single-page HTML build of the book
(``jupyter-book build --builder singlehtml``), printed by the system Chromium
through Playwright (``_ext/make_pdf.py``). The tests open the PDF with pypdf.

Chromium leaves out of a PDF the glyphs that a box clips, so a code line that
is cut off at the page's edge is missing its end from the PDF's text: every
line of every code cell the book shows must be found whole. Where Chromium is
missing the tests are skipped, unless ``ATTNLIB_REQUIRE_BROWSER=1`` (CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# Its own output folder, so that it never races the HTML build of test_book.py
# (which copies _build/pdf/book.pdf, the PDF of `make pdf`, where it exists).
BUILD = ROOT / "_build" / "pdf-build"
SINGLEHTML = BUILD / "_build" / "singlehtml" / "intro.html"
PDF = BUILD / "book.pdf"
# Chromium prints a CSS pixel as 0.75 pt. Where one element is wider than the
# page it shrinks every page to fit, and text beyond the paper's edge stays in
# the PDF's text: the scale is how a cut line shows.
FULL_SCALE = 0.75
CHROMIUM = Path(os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium"))
HIDDEN = {"remove-cell", "remove-input"}
QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    entries = list(toc.get("chapters", []))
    for part in toc.get("parts", []):
        entries += part.get("chapters", [])
    files += [entry["file"] for entry in entries]
    return files


def chapter_notebooks() -> list[Path]:
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").is_file()]


def squash(text: str) -> str:
    """Text without whitespace, ligatures or curly quotes: wrapping must not change it."""
    text = unicodedata.normalize("NFKC", text).translate(QUOTES)
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def pdf_text() -> tuple[object, str, str]:
    if not CHROMIUM.exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("ATTNLIB_REQUIRE_BROWSER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run(
        [str(jupyter_book), "build", "-W", "-n", "--keep-going", "--builder", "singlehtml",
         "--path-output", str(BUILD), "."],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert build.returncode == 0 and SINGLEHTML.is_file(), build.stdout[-4000:] + build.stderr[-4000:]
    printed = subprocess.run(
        [sys.executable, str(ROOT / "_ext" / "make_pdf.py"), str(SINGLEHTML), str(PDF)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    from pypdf import PdfReader

    reader = PdfReader(PDF)
    total = len(reader.pages)
    pages = []
    for number, page in enumerate(reader.pages, start=1):
        # The footer ("12 / 345") would split a line that runs onto the next page.
        footer = re.compile(rf"^\s*{number}\s*/\s*{total}\s*$", re.M)
        # Layout mode reads a page top to bottom: the end of a code line carried
        # over to the next page comes first there, not after that page's prose.
        text = page.extract_text(extraction_mode="layout") or ""
        pages.append(footer.sub("", text, count=1))
    return reader, "\n".join(pages), printed.stdout


def test_pdf_has_a_sensible_number_of_pages(pdf_text):
    reader, _, _ = pdf_text
    pages = len(reader.pages)
    files = toc_files()
    # Every page of the book starts a new sheet; no runaway layout (a page per line).
    assert len(files) <= pages <= 60 * len(files), f"{pages} pages for {len(files)} book pages"
    print(f"book.pdf: {pages} pages")


def test_pdf_is_printed_at_full_size(pdf_text):
    """Nothing in the book is wider than an A4 page's column: Chromium did not
    shrink the book to fit (text beyond the paper's edge would still be in the
    PDF's text, so the text checks below cannot see such a cut)."""
    reader, _, printed = pdf_text
    widths = re.search(r"laid out (\d+) px wide in a (\d+) px column", printed)
    assert widths, printed
    layout, column = map(int, widths.groups())
    assert layout <= column, f"the book is {layout} px wide for a {column} px column: {printed}"
    # And in the PDF itself: most text is drawn at 0.75 pt per CSS px.
    scales = {}
    for page in reader.pages:

        def visit(text, cm, tm, font, size):
            if text.strip():
                scale = round(cm[0], 3)
                scales[scale] = scales.get(scale, 0) + len(text)

        page.extract_text(visitor_text=visit)
    body = max(scales, key=scales.get)
    assert abs(body - FULL_SCALE) < 0.005, f"the book is printed at {body / FULL_SCALE:.0%}"


def test_pdf_has_every_chapter_title_in_order(pdf_text):
    _, text, _ = pdf_text
    flat = squash(text)
    position = 0
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        title = re.search(r"^#\s+(.+)$", first.source, re.M).group(1)
        title = re.sub(r"[*_`$\\]", "", title)
        found = flat.find(squash(title), position)
        assert found >= 0, f"{path.name}: title {title!r} not in the PDF (after the previous one)"
        position = found


def test_no_code_line_is_cut_off(pdf_text):
    """Each line of each code cell the book shows is in the PDF whole: nothing clipped."""
    _, text, _ = pdf_text
    flat = squash(text)
    missing = {}
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            tags = set(cell.metadata.get("tags", []))
            if cell.cell_type != "code" or tags & HIDDEN:
                continue
            for line in cell.source.splitlines():
                if line.strip() and squash(line) not in flat:
                    missing.setdefault(path.name, []).append(f"cell {index}: {line.strip()[:90]}")
    assert not missing, f"code lines not (whole) in the PDF: {missing}"


def test_long_outputs_wrap_instead_of_being_cut(pdf_text):
    _, text, _ = pdf_text
    flat = squash(text)
    missing = {}
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            tags = set(cell.metadata.get("tags", []))
            if cell.cell_type != "code" or tags & (HIDDEN | {"remove-output"}):
                continue
            for out in cell.outputs:
                if out.output_type != "stream" or out.name != "stdout":
                    continue
                for line in out.text.splitlines():
                    if len(line) > 60 and squash(line) not in flat:
                        missing.setdefault(path.name, []).append(f"cell {index}: {line[:90]}")
    assert not missing, f"output lines not (whole) in the PDF: {missing}"


def test_math_is_typeset_and_figures_are_in(pdf_text):
    reader, text, _ = pdf_text
    # MathJax replaces TeX with glyphs; TeX left in the text means it did not run.
    # Code may hold TeX itself (matplotlib labels): that much is allowed.
    tex = re.compile(r"\\(?:frac|sqrt|operatorname|mathbf|begin|cdot)\b")
    figures, tex_in_code = 0, 0
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            tags = set(cell.metadata.get("tags", []))
            if cell.cell_type == "code" and not tags & HIDDEN:
                tex_in_code += len(tex.findall(cell.source))
            if cell.cell_type == "code" and not tags & {"remove-cell", "remove-output"}:
                figures += sum("image/png" in out.get("data", {}) for out in cell.outputs)
    raw_tex = tex.findall(text)
    assert len(raw_tex) <= tex_in_code, f"{len(raw_tex) - tex_in_code} pieces of untypeset TeX"
    images = sum(len(page.images) for page in reader.pages)
    assert images >= figures, f"{images} images in the PDF, {figures} figures in the notebooks"
