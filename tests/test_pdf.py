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
# Its own output folder, so that it never races the HTML build of test_book.py.
BUILD = ROOT / "_build" / "pdf-build"
SINGLEHTML = BUILD / "_build" / "singlehtml" / "intro.html"
PDF = ROOT / "_build" / "pdf" / "book.pdf"
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
def pdf_text() -> tuple[object, str]:
    if not CHROMIUM.exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("ATTNLIB_REQUIRE_BROWSER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run(
        [str(jupyter_book), "build", "-n", "--keep-going", "--builder", "singlehtml",
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
    text = "\n".join(page.extract_text() or "" for page in reader.pages)
    return reader, text


def test_pdf_has_a_sensible_number_of_pages(pdf_text):
    reader, _ = pdf_text
    pages = len(reader.pages)
    files = toc_files()
    # Every page of the book starts a new sheet; no runaway layout (a page per line).
    assert len(files) <= pages <= 60 * len(files), f"{pages} pages for {len(files)} book pages"
    print(f"book.pdf: {pages} pages")


def test_pdf_has_every_chapter_title_in_order(pdf_text):
    _, text = pdf_text
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
    _, text = pdf_text
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
    _, text = pdf_text
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
    reader, text = pdf_text
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
