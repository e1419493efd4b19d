"""`make pdf` produces a PDF of the whole book that a reader can use.

The fixture does what ``make pdf`` does: a single-page HTML build of the book
(``jupyter-book build --builder singlehtml``), printed by the system Chromium
through Playwright (``_ext/make_pdf.py``). The tests open the PDF with pypdf.

Chromium leaves out of a PDF the glyphs that a box clips, so a code line that
is cut off at the page's edge is missing its end from the PDF's text: every
line of every code cell the book shows must be found whole. Where Chromium is
missing the tests are skipped, unless ``ATTNLIB_REQUIRE_BROWSER=1`` (CI).

The PDF is also checked as a reader uses it: a bookmark per chapter and section,
page numbers in the contents, the version, date and authors on the title page,
and a scan of every page (rasterised by pypdfium2) for empty boxes and
half-empty pages, for words or numbers broken across lines and for printed
labels of screen controls (issue 21).
"""

from __future__ import annotations

import html.parser
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


@pytest.fixture(scope="module")
def plain_text(pdf_text) -> tuple[list[str], dict[float, int]]:
    """Each page's text in pypdf's plain mode, and how many characters are drawn
    at each scale (the text matrix's, rounded): one pass over the pages for the
    tests that read them (the pass takes 20-30 s on a quiet machine; three tests
    made one each)."""
    reader, _, _ = pdf_text
    scales: dict[float, int] = {}

    def visit(text, cm, tm, font, size):
        if text.strip():
            scale = round(cm[0], 3)
            scales[scale] = scales.get(scale, 0) + len(text)

    return [page.extract_text(visitor_text=visit) or "" for page in reader.pages], scales


def test_pdf_has_a_sensible_number_of_pages(pdf_text):
    reader, _, _ = pdf_text
    pages = len(reader.pages)
    files = toc_files()
    # Every page of the book starts a new sheet; no runaway layout (a page per line).
    assert len(files) <= pages <= 60 * len(files), f"{pages} pages for {len(files)} book pages"
    print(f"book.pdf: {pages} pages")


def test_pdf_is_printed_at_full_size(pdf_text, plain_text):
    """Nothing in the book is wider than an A4 page's column: Chromium did not
    shrink the book to fit (text beyond the paper's edge would still be in the
    PDF's text, so the text checks below cannot see such a cut)."""
    _, _, printed = pdf_text
    widths = re.search(r"laid out (\d+) px wide in a (\d+) px column", printed)
    assert widths, printed
    layout, column = map(int, widths.groups())
    assert layout <= column, f"the book is {layout} px wide for a {column} px column: {printed}"
    # And in the PDF itself: most text is drawn at 0.75 pt per CSS px.
    _, scales = plain_text
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
    _, text, _ = pdf_text
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
    # pdfium counts the image objects drawn on each page (in forms too) without
    # decoding them: pypdf's page.images decodes each, 15-30 s for the book.
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    pdf = pdfium.PdfDocument(PDF)
    images = sum(len(list(pdf[i].get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE])))
                 for i in range(len(pdf)))
    assert images >= figures, f"{images} images in the PDF, {figures} figures in the notebooks"


# ---------------------------------------------------------------------------
# Bookmarks, the contents' page numbers, the title page, and a scan of the
# printed pages for the faults of issue 21: empty boxes, half-empty pages,
# words and numbers broken across lines, printed widget labels.

MONTHS = ("January|February|March|April|May|June|July|August|September|October|November"
          "|December")
# Labels of controls that do nothing on paper (myst-nb, sphinx-togglebutton,
# sphinx-copybutton, matplotlib's JavaScript animation player).
WIDGET_LABELS = re.compile(
    r"(?:Hide|Show) code cell (?:content|source|outputs?)|Click to (?:show|hide)"
    r"|Copy to clipboard"
    r"|Toggle hidden content|Once\s*Loop\s*Reflect",
    re.I,
)
MM = 72 / 25.4  # PDF points per millimetre
CLOSING = ".,;:!?)]}'\""
BOUNDARY = "\x00"
# The tallest empty box (or empty foot of a box) allowed on a page, in cm: less
# than the two lines of prose that a paragraph's widows moved (1.1-1.5 cm), more
# than the part of a line a page cannot hold (make_pdf.py, print.css). Inside a
# box, between two lines of text: less than three blank lines of code.
BOX_CM = 1.0
GAP_CM = 1.5


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).translate(QUOTES)


def page_title(path: Path) -> str:
    """The `# Title` of a book page: a notebook's first markdown cell, or a
    Markdown file's first heading outside its front matter and code blocks."""
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        return re.search(r"^#\s+(.+)$", first.source, re.M).group(1).strip()
    lines = path.read_text().splitlines()
    if lines and lines[0].strip() == "---":
        lines = lines[lines.index("---", 1) + 1:]
    fence = None
    for line in lines:
        mark = re.match(r"^\s*(`{3,}|~{3,})", line)
        if mark:
            fence = None if fence and mark.group(1).startswith(fence) else (fence or mark.group(1))
            continue
        if fence is None and re.match(r"^#\s+\S", line):
            return line[1:].strip()
    raise AssertionError(f"{path}: no title")


def toc_pages() -> list[tuple[str, Path, bool]]:
    """(title as printed, source, numbered) for each page of the book after the
    introduction, in order: numbered chapters read "3. Title"."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = []
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        for number, entry in enumerate(part.get("chapters", []), start=1):
            path = next(ROOT.glob(entry["file"] + ".*"))
            title = re.sub(r"[*_`$\\]", "", page_title(path))
            if part.get("numbered"):
                title = f"{number}. {title}"
            out.append((title, path, bool(part.get("numbered"))))
    return out


def outline_tree(reader) -> list[tuple[str, int, list]]:
    """The PDF's bookmarks as (title, page from 1, children)."""

    def walk(items):
        out = []
        for item in items:
            if isinstance(item, list):
                if out:
                    out[-1][2].extend(walk(item))
                continue
            out.append((item.title, reader.get_destination_page_number(item) + 1, []))
        return out

    return walk(reader.outline)


def test_pdf_has_a_bookmark_per_chapter_and_section(pdf_text):
    """Each page of the book (_toc.yml) is a bookmark at the top level that reads as
    its title, at the page where it starts, and each chapter's `##` sections are
    bookmarks under it."""
    reader, _, _ = pdf_text
    tree = outline_tree(reader)
    tops = {squash(title): (page, children) for title, page, children in tree}
    assert tops, "the PDF has no bookmarks"
    for title, path, _ in toc_pages():
        assert squash(title) in tops, f"no bookmark {title!r}; the top level: {[t for t, _, _ in tree]}"
        page, children = tops[squash(title)]
        assert squash(title) in squash(reader.pages[page - 1].extract_text() or ""), (
            f"bookmark {title!r} points to page {page}, which does not show that title")
        if path.suffix != ".ipynb":
            continue
        nb = nbformat.read(path, as_version=4)
        sections = [line for cell in nb.cells if cell.cell_type == "markdown"
                    for line in re.findall(r"^##\s+(.+)$", cell.source, re.M)]
        assert len(children) == len(sections), (
            f"{path.name}: {len(children)} section bookmarks for {len(sections)} sections")
        for (child, _, _), section in zip(children, sections, strict=True):
            # The words before any math or code in the heading.
            plain = re.split(r"[$`]", section)[0]
            plain = re.sub(r"[*_\\]|\[([^\]]*)\]\([^)]*\)", r"\1", plain)
            assert squash(plain) in squash(child), f"{path.name}: bookmark {child!r} for {section!r}"


def contents_pages(reader) -> str:
    """The text of the pages before the introduction: the cover and the contents."""
    text = []
    for page in reader.pages[:6]:
        words = page.extract_text() or ""
        text.append(words)
        if "Self-attention is the one idea" in normalise(words):
            break
    return "\n".join(text)


def test_contents_show_the_page_of_each_chapter(pdf_text):
    """The contents give each page of the book its page number, and that is the page
    where its title is printed (and where its bookmark points)."""
    reader, _, _ = pdf_text
    contents = normalise(contents_pages(reader))
    tops = {squash(title): page for title, page, _ in outline_tree(reader)}
    for title, _, _ in toc_pages():
        line = re.search(re.escape(normalise(title)).replace(r"\ ", r"\s+") + r"[\s.·…]*(\d+)\s*$",
                         contents, re.M)
        assert line, f"the contents have no page number for {title!r}:\n{contents[:3000]}"
        number = int(line.group(1))
        assert squash(title) in squash(reader.pages[number - 1].extract_text() or ""), (
            f"the contents put {title!r} on page {number}, which does not show it")
        assert number == tops.get(squash(title)), (
            f"the contents say page {number} for {title!r}, its bookmark {tops.get(squash(title))}")


def test_entry_lengths_add_up_to_where_each_entry_starts():
    """make_pdf.py writes the contents' numbers from the pages each page of the book
    took when last printed, some prints showing only the pages that changed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_pdf", ROOT / "_ext" / "make_pdf.py")
    make_pdf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_pdf)
    # A whole print: 4 pages before the first entry, then entries of 3, 5 and 2 pages.
    whole = make_pdf.entry_lengths([5, 8, 13], 14)
    assert whole == {0: 3, 1: 5, 2: 2}
    # A print of entry 1 only (the others hidden), now 7 pages long.
    assert make_pdf.entry_lengths([None, 1, None], 7) == {1: 7}
    # A print of entries 0 and 2, each with a page more.
    assert make_pdf.entry_lengths([1, None, 5], 7) == {0: 4, 2: 3}


def test_title_page_has_version_date_and_authors(pdf_text):
    reader, _, _ = pdf_text
    cover = normalise(reader.pages[0].extract_text() or "")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sys.path.insert(0, str(ROOT))
    import attnlib

    assert squash(config["title"]) in squash(cover), cover
    assert squash(config["author"]) in squash(cover), f"no authors on the title page: {cover}"
    assert re.search(rf"\b{re.escape(attnlib.__version__)}\b", cover), (
        f"no version {attnlib.__version__} on the title page: {cover}")
    assert re.search(rf"\b\d{{1,2}}\s+(?:{MONTHS})\s+20\d\d\b", cover), f"no date: {cover}"


def test_no_widget_labels_are_printed(pdf_text):
    _, text, _ = pdf_text
    found = sorted({m.group(0) for m in WIDGET_LABELS.finditer(normalise(text))})
    assert not found, f"labels of screen controls printed in the PDF: {found}"


def page_scan(page) -> dict:
    """One printed page, rasterised at 1 px per point (pypdfium2): the tallest run
    of rows (in cm) filled with one non-white colour (a box's background) that
    holds no text and no image, the height of the text area and how far down it
    is used (points), and the bottom of the first figure with its caption (points
    from the top of the text area, None without an image).

    A run with a line of text straight above it and straight below it is the
    inside of a box that goes on, not an empty box: two blank lines in a code
    cell (PEP 8's, before a ``def``, measure 0.85-0.95 cm), the space between
    two paragraphs of an exercise. Such runs are ``gap_cm``; ``box_cm`` is the
    tallest of the others: a box, or the end of a box at the page's foot, with
    nothing in it."""
    import numpy as np
    import pypdfium2.raw as pdfium_c

    # uint8, and colours computed only for the rows that may be filled: reductions
    # over an int32 copy of each of 500 pages took most of the test's time.
    img = np.asarray(page.render(scale=1).to_pil().convert("RGB"))
    height, width, _ = img.shape
    top, bottom = round(16 * MM), height - round(16 * MM)  # make_pdf.py's margins
    left, right = round(14 * MM), width - round(14 * MM)
    area = img[top:bottom, left:right]
    rows = area.shape[0]
    covered = np.zeros(rows, bool)  # rows with text or an image
    first_image = None
    for obj in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        _, low, _, high = obj.get_bounds()
        y0, y1 = max(round(height - high) - top, 0), max(round(height - low) - top + 1, 0)
        covered[y0:y1] = True
        if first_image is None or y0 < first_image[0]:
            first_image = (y0, y1)
    text = page.get_textpage()
    for i in range(text.count_chars()):
        x0, low, x1, high = text.get_charbox(i)
        if x1 > x0:
            covered[max(round(height - high) - top, 0):max(round(height - low) - top + 1, 0)] = True
    nonwhite = np.minimum(np.minimum(area[..., 0], area[..., 1]), area[..., 2]) < 253
    fill = np.zeros(rows, bool)
    for y in np.nonzero(~covered & (nonwhite.mean(axis=1) >= 0.5))[0]:
        row = area[y].astype(np.int32)
        colour = (row[:, 0] // 4 << 12) | (row[:, 1] // 4 << 6) | row[:, 2] // 4
        _, counts = np.unique(colour[nonwhite[y]], return_counts=True)
        fill[y] = counts.max() >= 0.5 * area.shape[1]
    tallest, gap, start = 0, 0, None
    for y, flag in enumerate(np.append(fill, False)):
        if flag and start is None:
            start = y
        elif not flag and start is not None:
            # Text on the row just above and just below: the inside of a box.
            enclosed = start > 0 and covered[start - 1] and y < rows and covered[y]
            if enclosed:
                gap = max(gap, y - start)
            else:
                tallest = max(tallest, y - start)
            start = None
    inked = nonwhite.any(axis=1) | covered
    used = np.nonzero(inked)[0]
    # The first figure with its caption: from the first image down to the first
    # gap of 24 pt (the caption follows the image 16-19 pt below, its lines 6-8 pt
    # apart; the text after a figure 29 pt below).
    figure_bottom = None
    if first_image is not None:
        y, blank = first_image[1], 0
        while y < rows and blank < 24:
            blank = 0 if inked[y] else blank + 1
            y += 1
        figure_bottom = y - blank
    return {"box_cm": tallest / MM / 10, "gap_cm": gap / MM / 10, "rows": rows,
            "used": int(used[-1]) + 1 if len(used) else 0, "figure_bottom": figure_bottom}


def test_no_empty_boxes_or_half_empty_pages(pdf_text):
    """No page holds a box with nothing in it (the frame a code cell left behind
    when its code moved to the next page, or the foot of an exercise whose last
    lines moved), 1 cm or more, and no page is more than half empty but the last
    of a page of the book (before a new chapter): not even before a figure that
    does not fit (make_pdf.py prints it smaller, or the prose after it first).
    Inside a box, between two lines of text, no empty stretch of 1.5 cm or more
    either (two blank lines of code are 0.95 cm)."""
    import pypdfium2 as pdfium

    reader, _, _ = pdf_text
    starts = {page for _, page, _ in outline_tree(reader)}  # each page of the book
    pdf = pdfium.PdfDocument(PDF)
    scans = [page_scan(pdf[i]) for i in range(len(pdf))]
    boxes = {n: round(s["box_cm"], 2) for n, s in enumerate(scans, 1) if s["box_cm"] >= BOX_CM}
    gaps = {n: round(s["gap_cm"], 2) for n, s in enumerate(scans, 1) if s["gap_cm"] >= GAP_CM}
    half, emptiest = {}, 0.0
    first = min(starts, default=2)
    for n, scan in enumerate(scans, 1):
        if n < first or n == len(scans) or n + 1 in starts:
            continue  # the cover and contents, the last page of a chapter
        empty = (scan["rows"] - scan["used"]) / scan["rows"]
        emptiest = max(emptiest, empty)
        if empty > 0.5:
            half[n] = f"{empty:.0%} empty"
    tallest = max(s["box_cm"] for s in scans)
    print(f"{len(pdf)} pages; boxes >= {BOX_CM} cm: {boxes} (tallest {tallest:.2f} cm);"
          f" gaps in a box >= {GAP_CM} cm: {gaps}; half-empty pages: {half}"
          f" (the emptiest inside a chapter: {emptiest:.0%})")
    assert not boxes, f"pages with an empty box (cm high): {boxes}"
    assert not gaps, f"pages with an empty stretch inside a box (cm high): {gaps}"
    assert not half, f"pages more than half empty inside a chapter: {half}"


def spaced(text: str) -> tuple[str, set[int]]:
    """``text`` squashed (see squash) and where it had whitespace: the indices of
    the squashed characters that followed a space or a line break."""
    chars, gaps, gap = [], set(), False
    for ch in normalise(text):
        if ch == BOUNDARY:  # the edge of inline code or a link: pypdf may see a gap
            gaps.add(len(chars))
            continue
        if ch.isspace():
            gap = True
            continue
        if gap and chars:
            gaps.add(len(chars))
        gap = False
        chars.append(ch)
    return "".join(chars), gaps


class _Prose(html.parser.HTMLParser):
    """Runs of prose in the book's paragraphs: text between formulas (MathJax
    typesets them after the HTML is written) and footnote marks."""

    SKIP = ("math", "headerlink")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.in_article = False
        self.stack: list[tuple[str, bool]] = []
        self.pieces: list[str] = []
        self.current: list[str] = []

    def _flush(self):
        piece = " ".join("".join(self.current).split())
        # Allowed breaks in spaced(): a boundary at the ends means nothing.
        piece = piece.strip(BOUNDARY + " ")
        if len(piece.split()) >= 2:
            self.pieces.append(piece)
        self.current = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self.in_article = True
        if tag in ("br", "img", "input", "hr", "meta", "link", "wbr"):
            return
        classes = (attrs.get("class") or "").split()
        skip = (tag in ("script", "style", "sup", "pre") or any(c in self.SKIP for c in classes)
                or "cell_output" in classes)
        if tag == "p" or skip:
            self._flush()
        elif self.current:
            self.current.append(BOUNDARY)
        self.stack.append((tag, skip))

    def handle_endtag(self, tag):
        skip = False
        while self.stack:
            name, skip = self.stack.pop()
            if name == tag:
                break
        if tag == "p" or skip:
            self._flush()
        elif self.current:
            self.current.append(BOUNDARY)

    def handle_data(self, data):
        if (self.in_article and any(name == "p" for name, _ in self.stack)
                and not any(skip for _, skip in self.stack)):
            self.current.append(data)


def test_no_word_or_number_is_broken_across_lines(pdf_text, plain_text):
    """Lines break between words only: every line of code, every line of printed
    output and every run of prose is in the PDF with line breaks (or spaces) only
    where it has spaces ("sums t|o 1", "-1.64|31]" fail)."""
    # pypdf's plain mode: its layout mode spaces out a line after a ligature
    # ("Simpliﬁed dot-pr    oduct").
    texts, _ = plain_text
    pages = []
    for number, text in enumerate(texts, start=1):
        footer = re.compile(rf"^\s*{number}\s*/\s*{len(texts)}\s*$", re.M)
        pages.append(footer.sub("", text, count=1))
    flat, gaps = spaced("\n".join(pages))
    gap_at = bytearray(len(flat) + 1)
    for i in gaps:
        gap_at[i] = 1
    lines = []
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            tags = set(cell.metadata.get("tags", []))
            if cell.cell_type != "code" or tags & HIDDEN:
                continue
            lines += [(path.name, line) for line in cell.source.splitlines()]
            if "remove-output" in tags:
                continue
            for out in cell.outputs:
                if out.output_type == "stream" and out.name == "stdout":
                    lines += [(path.name, line) for line in out.text.splitlines()]
    prose = _Prose()
    prose.feed(SINGLEHTML.read_text())
    lines += [("prose", piece) for piece in prose.pieces]
    broken, checked = [], 0
    for where, line in lines:
        word, allowed = spaced(line)
        if len(word) < 12:
            continue  # a short one may also match across unrelated lines
        start, found, whole = flat.find(word), False, False
        while start >= 0 and not whole:
            found = True
            # A line may break after a hyphen or a dash, and pypdf puts a space
            # before punctuation that follows a link or inline code.
            whole = all(not gap_at[start + k] or k in allowed or word[k] in CLOSING
                        or word[k - 1] in "-\u2013\u2014/([{" for k in range(1, len(word)))
            start = flat.find(word, start + 1)
        checked += found
        if found and not whole:
            broken.append(f"{where}: {line.strip()[:100]}")
    print(f"{checked} lines and runs of prose checked; {len(broken)} broken")
    assert checked > 1000, f"only {checked} lines found in the PDF's text"
    assert not broken, f"{len(broken)} lines broken inside a word or number: {broken[:20]}"


# ------------------------------------------------- paper, not a screen (issue 28)


@pytest.fixture(scope="module")
def page_texts(plain_text) -> list[str]:
    """Each printed page's text, squashed (see squash), the footer left in."""
    return [squash(text) for text in plain_text[0]]


SOLUTION_BLOCK = re.compile(r"^(`{3,})\{solution\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*(.*?)^\1\s*$",
                            re.M | re.S)


def first_words(markdown: str, count: int = 8) -> str:
    """The first words of a block's plain prose (before any math, code or link)."""
    plain = re.split(r"[$`\[]|\n\n", markdown.strip())[0]
    return " ".join(re.sub(r"[*_\\]", "", plain).split()[:count])


def test_solutions_are_in_an_appendix_after_the_chapters(pdf_text, page_texts):
    """Paper does not hide a solution under its exercise: every solution is printed
    in the appendix "Solutions" (a top-level bookmark after the last chapter), and
    nowhere before it."""
    reader, _, printed = pdf_text
    tops = [(title, page) for title, page, _ in outline_tree(reader)]
    titles = [squash(t) for t, _ in tops]
    assert squash("Solutions") in titles, f"no Solutions bookmark: {[t for t, _ in tops]}"
    appendix = tops[titles.index(squash("Solutions"))][1]
    last_chapter = max(page for title, page in tops if re.match(r"\d+\.", title))
    assert appendix > last_chapter, (appendix, last_chapter)
    early, checked = [], 0
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            for block in SOLUTION_BLOCK.finditer(cell.source if cell.cell_type == "markdown" else ""):
                words = squash(first_words(block.group(2)))
                if len(words) < 25:
                    continue
                pages = [n for n, text in enumerate(page_texts, 1) if words in text]
                checked += bool(pages)
                if pages and min(pages) < appendix:
                    early.append(f"{path.name} p{min(pages)}: {first_words(block.group(2))}")
    print(f"{checked} solutions found; the appendix starts on page {appendix}")
    assert checked >= 30, f"only {checked} solutions found in the PDF"
    assert not early, f"{len(early)} solutions printed before the appendix: {early[:5]}"


def test_exercise_checks_print_no_failure(pdf_text):
    """An exercise's check cell fails until the reader fills the stub; paper prints
    the check, not its CheckFailed or NotImplementedError message."""
    _, text, _ = pdf_text
    flat = squash(text)
    printed = []
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            if "raises-exception" not in cell.metadata.get("tags", []):
                continue
            for out in cell.get("outputs", []):
                # The message whole: its start may quote the exercise's own words.
                if out.output_type == "error" and squash(out.evalue)[:120] in flat:
                    printed.append(f"{path.name} cell {index}: {out.ename}: {out.evalue[:60]}")
    assert not printed, f"{len(printed)} failure messages printed: {printed[:5]}"


# Words that only a screen can act on, and what paper says instead (intro.md's
# course-screen-only and course-print-only spans; print.css).
SCREEN_ONLY = ["rocket-shaped", "hidden until you open", "Show the source of"]
PRINT_ONLY = ["their solutions are in the appendix, Solutions",
              "On the web book, every chapter page has a launch button"]


def test_screen_only_words_are_not_printed(pdf_text):
    _, text, _ = pdf_text
    flat = squash(text)
    assert not [w for w in SCREEN_ONLY if squash(w) in flat]
    assert all(squash(w) in flat for w in PRINT_ONLY), [w for w in PRINT_ONLY if squash(w) not in flat]


def test_each_figure_is_on_the_page_of_its_caption(pdf_text, page_texts):
    """A caption printed on the page after its figure ("Fig 4.1 p90 -> 91") reads as
    the caption of nothing: the page where a caption starts holds an image."""
    reader, _, _ = pdf_text
    first_chapter = min(page for title, page, _ in outline_tree(reader) if re.match(r"\d+\.", title))
    apart, checked = [], 0
    for path in chapter_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            caption = cell.metadata.get("mystnb", {}).get("figure", {}).get("caption")
            if cell.cell_type != "code" or not caption:
                continue
            words = squash(first_words(caption, 10))
            if len(words) < 25:
                continue  # a few words before the first formula: found anywhere
            pages = [n for n, t in enumerate(page_texts, 1) if words in t and n >= first_chapter]
            if not pages:
                continue
            checked += 1
            if not reader.pages[pages[0] - 1].images:
                apart.append(f"{path.name}: {first_words(caption, 10)!r} on p{pages[0]}")
    print(f"{checked} captions found")
    assert checked >= 10, f"only {checked} figure captions found in the PDF"
    assert not apart, f"captions on a page without their figure: {apart}"


def test_the_api_reference_is_compact_on_paper(pdf_text):
    """The API reference printed whole took 221 of 600 pages: on paper each name has
    its signature and first paragraph (make_pdf.py), the web book the rest."""
    reader, text, _ = pdf_text
    tops = [(squash(title), page) for title, page, _ in outline_tree(reader)]
    start = next(i for i, (title, _) in enumerate(tops) if title.startswith(squash("API reference")))
    # The module pages (titled `attnlib`, `attnlib.x...`) follow the index as bookmarks of
    # their own: the reference ends at the first bookmark after them.
    after = [page for title, page in tops[start + 1:] if not title.startswith("attnlib")]
    end = after[0] if after else len(reader.pages) + 1
    pages = end - tops[start][1]
    print(f"API reference: {pages} pages of {len(reader.pages)}")
    assert squash("On paper, each name has its signature") in squash(text)
    assert tops[start + 1][0].startswith("attnlib"), "no module page after the index"
    assert pages <= 90, f"the API reference takes {pages} pages"
