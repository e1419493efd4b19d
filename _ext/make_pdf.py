"""Print the single-page HTML book to a PDF with the system Chromium (make pdf).

    python _ext/make_pdf.py _build/singlehtml/intro.html _build/pdf/book.pdf

The page is served from 127.0.0.1 and every request off this machine is
blocked, so the PDF is made offline. Before printing, the script waits for
MathJax to typeset every formula and for every image to load, opens every
dropdown (exercise solutions, hidden code), moves the solutions to an appendix
and prints the API reference compact (``PAPER``), starts each chapter on a new page,
adds the version, the date and the authors to the title page, shrinks each
output block that is wider than the column until its longest line fits, and
keeps the opening lines of a code block together where blank lines follow them
(``_static/print.css`` has the print rules). It prints twice or more: a code
cell or other box that would end a page in an empty stretch of its colour (its
next line did not fit below two blank lines of code) starts on the next page
instead, found by a scan of the printed pages and printed again; so does a
figure that leaves more than half of the page before it blank (it is printed
smaller, to fill that page, or where it would have to be too small, the prose
after it comes before it). Each page of the book starts a new sheet, so these
prints after the first show only the pages of the book that changed (``ONLY``),
a fraction of the book. Adding up how many pages each page of the book took
when last printed tells on which page each starts; the final print, of the
whole book, has those numbers in the contents, in boxes reserved before so
that nothing moves, and is checked against them (where they are wrong, the
numbers it shows are written in and it is printed once more). The PDF has a
bookmark (outline entry) for each chapter and section.
The HTML book's next build copies the PDF next to its pages and links it from
the introduction (``make pdf`` runs that build; see ``_ext/course_html.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import http.server
import io
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
# pypdf reads Chromium's PDFs well but says so ("Object count ... exceeds ...").
logging.getLogger("pypdf").setLevel(logging.ERROR)
CHROMIUM = Path(os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]

# A4 is 210 mm wide; 96 CSS pixels to the inch.
SIDE_MARGIN_MM = 14
PRINT_WIDTH_PX = round((210 - 2 * SIDE_MARGIN_MM) / 25.4 * 96)
# Code and outputs are printed at 12 px (print.css); an output wider than the
# column is shrunk until its longest line fits, but not below this.
CODE_PX = 12
SMALLEST_CODE_PX = 7
# A code block's opening lines, followed by blank lines, are kept together up to
# the next line of code (see PREPARE) where they are this many lines or fewer.
KEPT_LINES = 6
# A page whose box (a code cell, an exercise) ends in an empty stretch this tall
# (cm) at the page's foot: the code cell or box that breaks there starts on the
# next page instead, where it starts low enough on the page (a fraction of the
# text area) to leave the page at least half full. tests/test_pdf.py fails at 1 cm.
FOOT_CM = 0.8
FOOT_START = 0.55
# A line too wide even at the smallest size (a long message) wraps, at spaces
# only, at this size: readable, and its alignment is lost anyway.
WRAPPED_CODE_PX = 9
# A figure does not break, and one taller than the space left on a page (a
# stack of panels, up to 200 mm: print.css) moved to the next page and left up
# to 84 % of the page before it blank. Where a page inside a chapter is more than
# half blank and the next page opens with a figure, that figure is printed
# smaller, just enough for it and its caption to fill the page before (less
# FIGURE_SLACK_PT, for the margins above it), but its image never lower than
# SMALLEST_FIGURE (a fraction of the text area's height: 106 mm, the image still
# legible). One figure per chapter a print (each chapter starts a new sheet, so
# chapters do not move one another), up to ROUNDS prints: what a smaller
# figure moves up is measured again in the next print. tests/test_pdf.py fails
# on a page more than half blank.
TEXT_AREA_MM = 297 - 2 * 16
SMALLEST_FIGURE = 0.4
FIGURE_SLACK_PT = 32
# At most this many prints before the last two (boxes moved, figures fitted).
ROUNDS = 12

# Run in the page: show what a reader opens by hand, break pages at chapters, fit
# wide outputs and tables, make the title page, reserve the contents' page
# numbers, and list the chapters and sections for the outline.
PREPARE = """(meta) => {
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
  const firstSection = {};
  starts.forEach(span => {
    let next = span.nextElementSibling;
    if (next) {
      next.classList.add('course-chapter-start');
      firstSection[span.id] = next.id;
    }
  });
  // A code or output block wider than the column: a smaller font, just small
  // enough for its longest line, keeps its columns aligned; below the smallest
  // size it wraps, at spaces only (print.css).
  let shrunk = 0, wrapped = 0;
  document.querySelectorAll('.bd-article pre').forEach(pre => {
    if (pre.scrollWidth <= pre.clientWidth + 1) return;
    const size = parseFloat(getComputedStyle(pre).fontSize);
    let fit = Math.floor(size * pre.clientWidth / pre.scrollWidth * 20) / 20;
    for (let i = 0; i < 20 && fit >= meta.smallest; i++) {
      pre.style.setProperty('font-size', fit + 'px', 'important');
      if (pre.scrollWidth <= pre.clientWidth + 1) break;
      fit = Math.round((fit - 0.05) * 100) / 100;
    }
    if (fit < meta.smallest || pre.scrollWidth > pre.clientWidth + 1) {
      pre.style.setProperty('font-size', meta.wrapped + 'px', 'important');
      pre.style.setProperty('white-space', 'pre-wrap', 'important');
      pre.classList.add('course-print-wrap');
      wrapped += 1;
    } else {
      shrunk += 1;
    }
  });
  // A code block that opens with a few lines and then blank lines (the two
  // before a `def`): where a page has room for those lines only, it would end in
  // them and the blank lines, the rest of the box empty at the foot of the page.
  // Its first lines up to the next line of code stay together (orphans), so
  // that the block then starts on the next page, whole.
  let kept = 0;
  document.querySelectorAll('.bd-article pre').forEach(pre => {
    const lines = pre.textContent.replace(/\\n$/, '').split('\\n');
    const blank = lines.findIndex(line => !line.trim());
    if (blank <= 0) return;
    let next = blank;
    while (next < lines.length && !lines[next].trim()) next++;
    if (next >= lines.length || next + 1 > meta.kept) return;
    pre.style.setProperty('orphans', String(next + 1), 'important');
    kept += 1;
  });
  // The boxes that may start on the next page instead (print_pdf): each code
  // cell, code block outside a cell and exercise or note, with an id (Chromium
  // writes a named destination for it) and the id of what follows it.
  const boxes = [];
  document.querySelectorAll('.bd-article div.cell, .bd-article div[class*="highlight-"], '
                            + '.bd-article .admonition').forEach(box => {
    if (box.closest('div.cell') !== box && box.closest('div.cell')) return;
    let after = box;
    while (after && !after.nextElementSibling) after = after.parentElement;
    after = after && after.nextElementSibling;
    if (!after) return;
    const n = boxes.length;
    if (!box.id) box.id = 'course-box-' + n;
    if (!after.id) after.id = 'course-after-' + n;
    boxes.push({target: box.id, after: after.id});
  });
  // The figures that may be printed smaller (print_pdf), each with an id.
  const figures = [];
  document.querySelectorAll('.bd-article figure').forEach(figure => {
    if (!figure.querySelector('img')) return;
    if (!figure.id) figure.id = 'course-figure-' + figures.length;
    figures.push({target: figure.id});
  });
  // Chromium writes a named destination only for an element that a link points
  // to: links to the boxes and figures, never shown.
  const links = document.createElement('div');
  links.style.display = 'none';
  links.setAttribute('aria-hidden', 'true');
  boxes.map(box => [box.target, box.after]).flat().concat(figures.map(f => f.target))
    .forEach(id => {
      const a = document.createElement('a');
      a.href = '#' + id;
      links.appendChild(a);
    });
  document.body.appendChild(links);
  // A table wider than the column (long code names, formulas in its cells):
  // a smaller font, down to 70 %, rather than names broken in the middle.
  let tables = 0;
  const right = t => Math.max(...Array.from(t.querySelectorAll('td, th'))
    .map(c => c.getBoundingClientRect().right), t.getBoundingClientRect().right);
  const column = document.querySelector('.bd-article').getBoundingClientRect().right;
  document.querySelectorAll('.bd-article table').forEach(t => {
    if (right(t) <= column + 1) return;
    tables += 1;
    for (let scale = 0.95; scale >= 0.7 && right(t) > column + 1; scale -= 0.05) {
      t.style.setProperty('font-size', (scale * 100).toFixed(0) + '%', 'important');
    }
  });
  // The title page: the title, the authors, the version and the date of the
  // build; the contents on the next page and the introduction after it.
  const cover = document.querySelector('#jb-print-docs-body');
  if (cover) {
    const title = cover.querySelector('h1');
    const block = document.createElement('div');
    block.className = 'course-title-page';
    block.setAttribute('role', 'presentation');
    const line = (cls, text) => {
      const p = document.createElement('p');
      p.className = cls;
      p.textContent = text;
      block.appendChild(p);
    };
    line('course-authors', meta.authors);
    line('course-version', 'Version ' + meta.version + ' (attnlib ' + meta.version + ')');
    line('course-date', 'Built on ' + meta.date);
    if (title) {
      // The cover's title, set large by print.css.
      const div = document.createElement('div');
      div.className = 'course-title';
      div.setAttribute('role', 'presentation');
      div.textContent = title.textContent;
      title.replaceWith(div);
      div.after(block);
    } else {
      cover.prepend(block);
    }
    const contents = cover.querySelector('#jb-print-toc h2');
    if (contents) {
      const div = document.createElement('div');
      div.className = 'course-contents-title';
      div.textContent = contents.textContent.trim();
      contents.replaceWith(div);
    }
  }
  // The contents: a box of fixed width at the end of each line, for the page
  // number that the second print writes in.
  const entries = [];
  document.querySelectorAll('#jb-print-toc li > a[href^="#"]').forEach(a => {
    const id = decodeURIComponent(a.getAttribute('href').slice(1));
    const number = document.createElement('span');
    number.className = 'course-toc-page';
    number.textContent = '';
    a.classList.add('course-toc-entry');
    a.appendChild(number);
    entries.push({target: firstSection[id] || id, title: a.textContent.trim()});
  });
  // The outline (bookmarks): the introduction, each chapter and page of the
  // book, and their sections and subsections, each with its element's id
  // (Chromium writes a named destination for every id).
  const heading = section => {
    const h = section.querySelector(':scope > h1, :scope > h2, :scope > h3, :scope > h4, '
                                    + ':scope > h5, :scope > h6');
    if (!h) return null;
    const copy = h.cloneNode(true);
    copy.querySelectorAll('.headerlink').forEach(e => e.remove());
    return copy.textContent.replace(/\\s+/g, ' ').trim();
  };
  const tree = (section, depth) => ({
    target: section.id, title: heading(section),
    children: depth >= 3 ? [] : Array.from(section.querySelectorAll(':scope > section'))
      .filter(s => s.id && heading(s)).map(s => tree(s, depth + 1)),
  });
  const tops = [document.querySelector('.bd-article > section')]
    .concat(starts.map(span => span.nextElementSibling))
    .filter(s => s && s.tagName === 'SECTION' && s.id && heading(s));
  const outline = tops.map(s => tree(s, 1));
  // Wider than the column, and Chromium shrinks every page: say what is too wide.
  const width = document.documentElement.scrollWidth;
  const wide = Array.from(document.querySelectorAll('.bd-article *'))
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                 && !e.closest('mjx-assistive-mml'))
    .slice(0, 5).map(e => e.tagName + '.' + e.className + ': '
                         + (e.textContent || '').trim().slice(0, 60));
  return {chapters: starts.length, width: width, wide: wide, entries: entries, outline: outline,
          shrunk: shrunk, wrapped: wrapped, tables: tables, kept: kept, boxes: boxes,
          figures: figures};
}"""

# Run in the page before PREPARE: what differs between the screen and paper.
# (1) The exercises' solutions leave the chapters for an appendix, "Solutions",
# after the last chapter, a section per chapter; where each solution was, a line
# points to it (a link in the PDF), and its title links back to its exercise. The
# cells that compute a worked answer's numbers (tagged hide-cell, between an
# exercise and its solution) go with it. The appendix is a page of the book of its
# own: a new sheet, a line in the contents, a bookmark with its chapters' sections.
# A collapsed listing of attnlib.show_source is titled "The source of ...", not
# "Show the source of ...".
# (2) The API reference is compact on paper: each name's signature, and the first
# paragraph of each function's and class's docstring (a method's or attribute's is
# left to the web book), with a note that the web book has the rest (221 of 600
# pages before; 93 once issue 27 gave the attention classes their public steps).
PAPER = """() => {
  const text = e => { const c = e.cloneNode(true);
    c.querySelectorAll('.headerlink').forEach(x => x.remove());
    return c.textContent.replace(/\\s+/g, ' ').trim(); };
  const starts = Array.from(document.querySelectorAll('span[id^="document-"]'));
  const chapters = starts.filter(s => s.id.startsWith('document-chapters/'));
  const appendix = document.createElement('section');
  appendix.id = 'course-solutions';
  appendix.className = 'course-solutions-appendix';
  // Sphinx's single page titles each page of the book with an h2 (the cover: h1).
  const title = document.createElement('h2');
  title.textContent = 'Solutions';
  const lead = document.createElement('p');
  lead.textContent = 'The solutions of the exercises, chapter by chapter. Each title names '
    + 'its exercise and links back to it. The code cells that compute a worked answer\\'s '
    + 'numbers come with it.';
  appendix.append(title, lead);
  let moved = 0, cells = 0;
  chapters.forEach(span => {
    const chapter = span.nextElementSibling;
    if (!chapter || chapter.tagName !== 'SECTION') return;
    const solutions = Array.from(chapter.querySelectorAll('div.solution'));
    if (!solutions.length) return;
    const h2 = chapter.querySelector(':scope > h2');
    const part = document.createElement('section');
    part.id = 'course-solutions-' + chapter.id;
    const heading = document.createElement('h3');
    heading.textContent = h2 ? text(h2) : chapter.id;
    part.appendChild(heading);
    solutions.forEach(solution => {
      const before = [];
      for (let e = solution.previousElementSibling;
           e && e.matches('div.cell.tag_hide-cell') && !e.matches('.tag_raises-exception');
           e = e.previousElementSibling) before.unshift(e);
      if (!solution.id) solution.id = 'course-solution-' + moved;
      const pointer = document.createElement('p');
      pointer.className = 'course-solution-pointer';
      const link = document.createElement('a');
      link.href = '#' + solution.id;
      link.textContent = 'Its solution: in the appendix, Solutions, ' + heading.textContent + '.';
      pointer.appendChild(link);
      (before[0] || solution).before(pointer);
      before.forEach(e => part.appendChild(e));
      part.appendChild(solution);
      moved += 1;
      cells += before.length;
    });
    appendix.appendChild(part);
  });
  // Chromium writes a named destination (for the contents and the bookmarks) only
  // for an element that a link points to: a link in each heading, not printed.
  [appendix, ...appendix.querySelectorAll(':scope > section')].forEach(section => {
    const link = document.createElement('a');
    link.className = 'headerlink';
    link.href = '#' + section.id;
    link.textContent = '#';
    section.querySelector(':scope > h2, :scope > h3').appendChild(link);
  });
  if (moved) {
    const last = chapters[chapters.length - 1].nextElementSibling;
    const span = document.createElement('span');
    span.id = 'document-course-solutions';
    last.after(span);
    span.after(appendix);
    // Its line in the contents, after the last chapter's.
    const entry = document.querySelector('#jb-print-toc li > a[href="#'
      + chapters[chapters.length - 1].id + '"]');
    if (entry) {
      const li = document.createElement('li');
      li.className = entry.parentElement.className;
      const a = document.createElement('a');
      a.className = entry.className;
      a.href = '#' + span.id;
      a.textContent = 'Solutions';
      li.appendChild(a);
      entry.parentElement.after(li);
    }
  }
  let api = 0;
  starts.filter(s => s.id.startsWith('document-api')).forEach(span => {
    const page = span.nextElementSibling;
    if (!page) return;
    page.classList.add('course-api-compact');
    page.querySelectorAll('dl.py > dd').forEach(dd => {
      // A method or attribute (a dl inside a class's dd) keeps its signature only.
      let first = !dd.parentElement.parentElement.closest('dl.py');
      Array.from(dd.children).forEach(child => {
        if (child.matches('dl.py')) return;  // a method or attribute: its own turn
        if (child.tagName === 'P' && first) { first = false; return; }
        child.remove();
      });
      api += 1;
    });
    const h2 = page.querySelector(':scope > h2');
    if (h2) {
      const note = document.createElement('p');
      note.className = 'course-print-note';
      note.textContent = 'On paper, each name has its signature, and each function and class '
        + 'the first paragraph of its docstring. The web book\\'s API reference, and help() '
        + 'in Python, give the rest: '
        + 'each argument, the shapes, the defaults and the errors raised.';
      h2.after(note);
    }
  });
  // attnlib.show_source's collapsed listing opens on paper: its summary line is its
  // title, not a control.
  document.querySelectorAll('details.attnlib-source > summary').forEach(summary => {
    const words = summary.firstChild;
    if (words && words.nodeType === Node.TEXT_NODE)
      words.textContent = words.textContent.replace(/^\\s*Show the source of/, 'The source of');
  });
  return {solutions: moved, answer_cells: cells, api_entries: api};
}"""

# Write the page numbers into the contents' boxes (the same order as ``entries``).
NUMBER = """(numbers) => {
  const boxes = document.querySelectorAll('#jb-print-toc .course-toc-page');
  boxes.forEach((box, i) => { box.textContent = numbers[i] === null ? '' : String(numbers[i]); });
  return boxes.length;
}"""


# Start these boxes (element ids) on a new page.
MOVE = """(ids) => ids.forEach(id => {
  document.getElementById(id).style.setProperty('break-before', 'page', 'important');
})"""


# Print these figures' images (figure ids) this many CSS px lower, keeping their
# proportions, but not lower than ``floor`` px; return each image's height before
# and after, and the height it had before the first of these calls.
SHRINK = """([items, floor]) => items.map(([id, by]) => {
  const img = Array.from(document.getElementById(id).querySelectorAll('img'))
    .find(i => i.getBoundingClientRect().height > 0);
  const before = img.getBoundingClientRect().height;
  if (!img.dataset.printHeight) img.dataset.printHeight = String(before);
  const after = Math.max(Math.floor(before - by), Math.ceil(floor));
  img.style.setProperty('height', after + 'px', 'important');
  img.style.setProperty('max-height', after + 'px', 'important');
  img.style.setProperty('width', 'auto', 'important');
  return {target: id, before: before, after: img.getBoundingClientRect().height,
          first: parseFloat(img.dataset.printHeight)};
})"""


# Where a figure cannot be made small enough (SMALLEST_FIGURE), the prose that
# follows it is printed before it instead, as much as fits into the blank foot of
# the page before (``room`` CSS px) and at least ``need`` px (so that the page is
# at most half blank): whole paragraphs, lists and displayed equations only, up to
# the next heading, code cell, box or paragraph that ends in a colon. The figure
# (its cell's output) follows them, as a printed book places a figure at the top
# of the next page. Returns how many were moved (0: none could be).
DEFER = """([id, room, need]) => {
  const figure = document.getElementById(id);
  const output = figure.closest('div.cell_output') || figure;
  const cell = output.closest('div.cell') || output;
  // Not a paragraph that ends in a colon: it introduces what follows it.
  const prose = e => e.matches('p, ul, ol, blockquote, div.math')
    && !(e.matches('p') && e.textContent.trim().endsWith(':'));
  // A hidden check cell prints nothing: passed over, left where it is.
  const empty = e => e.matches('div.cell') && !e.textContent.trim() && !e.querySelector('img');
  const outer = e => {
    const style = getComputedStyle(e);
    const box = e.getBoundingClientRect();
    return [box.top - parseFloat(style.marginTop), box.bottom + parseFloat(style.marginBottom)];
  };
  const moved = [];
  let top = null;
  for (let e = cell.nextElementSibling; e && (prose(e) || empty(e)); e = e.nextElementSibling) {
    if (empty(e)) continue;
    const [start, end] = outer(e);
    if (top === null) top = start;
    if (end - top > room) break;
    moved.push([e, end - top]);
  }
  if (!moved.length || moved[moved.length - 1][1] < need) return 0;
  moved.forEach(([e]) => output.before(e));
  // Inside the cell, after its code: the space a paragraph has after a cell.
  moved[0][0].style.setProperty('margin-top', '1.15rem', 'important');
  return moved.length;
}"""


# Print only the pages of the book (each a chapter, the introduction with the
# cover, the appendix) that hold these element ids, the others hidden; ``null``:
# every page again. Each page of the book starts a new sheet, so hiding one moves
# nothing inside another: a print of the chapters that changed measures them as
# the whole book would, in a fraction of the time (print_pdf). Returns how many
# pages of the book are shown (``pages``) and whether the introduction is (``intro``).
ONLY = """(ids) => {
  const roots = Array.from(document.querySelectorAll('section.course-chapter-start'));
  const intro = Array.from(document.querySelectorAll(
    '.bd-article > section > :not(.toctree-wrapper), #jb-print-docs-body'));
  const shown = new Set(ids === null ? roots.concat(intro) : []);
  (ids || []).forEach(id => {
    let root = document.getElementById(id).closest('section.course-chapter-start');
    if (!root) intro.forEach(e => shown.add(e));
    for (; root; root = root.parentElement.closest('section.course-chapter-start')) {
      shown.add(root);
    }
  });
  roots.concat(intro).forEach(e => {
    if (shown.has(e)) e.style.removeProperty('display');
    else e.style.setProperty('display', 'none', 'important');
  });
  return {pages: roots.filter(e => shown.has(e)).length, intro: shown.has(intro[0])};
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def book_metadata() -> dict:
    """The authors (``author`` in _config.yml), attnlib's version and the build's date
    (``SOURCE_DATE_EPOCH`` where it is set, for a reproducible build; else today)."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sys.path.insert(0, str(ROOT))
    import attnlib

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    day = (dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch
           else dt.datetime.now(dt.timezone.utc)).date()
    return {"authors": str(config.get("author", "")), "version": attnlib.__version__,
            "date": f"{day.day} {day:%B %Y}", "smallest": SMALLEST_CODE_PX,
            "wrapped": WRAPPED_CODE_PX, "kept": KEPT_LINES}


def destination_pages(data: bytes, ids: list[str]) -> list[int | None]:
    """The page (from 1) of each element id of ``ids`` in a PDF printed by Chromium,
    which writes a named destination for every element with an id."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    named = reader.named_destinations
    pages = []
    for target in ids:
        dest = named.get("/" + target) or named.get(target)
        pages.append(None if dest is None else reader.get_destination_page_number(dest) + 1)
    return pages


def destination_tops(data: bytes, ids: list[str]) -> list[tuple[int, float] | None]:
    """The page (from 1) and the height of the top (points from the page's top) of
    each element id of ``ids`` in a PDF printed by Chromium."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    named = reader.named_destinations
    out = []
    for target in ids:
        dest = named.get("/" + target) or named.get(target)
        if dest is None or dest.get("/Top") is None:
            out.append(None)
            continue
        number = reader.get_destination_page_number(dest)
        height = float(reader.pages[number].mediabox.height)
        out.append((number + 1, height - float(dest["/Top"])))
    return out


def _filled(row) -> bool:
    """A row of pixels (RGB) is one non-white colour across half its width or more."""
    import numpy as np

    nonwhite = row.min(axis=1) < 253
    if nonwhite.mean() < 0.5:
        return False
    row = row.astype(np.int32)  # uint8 would overflow in the shifts
    colour = (row[:, 0] // 4 << 12) | (row[:, 1] // 4 << 6) | row[:, 2] // 4
    _, counts = np.unique(colour[nonwhite], return_counts=True)
    return counts.max() >= 0.5 * row.shape[0]


def scan_pages(data: bytes) -> list[dict]:
    """Each page of a PDF printed by Chromium, rasterised at 1 px per point, as
    tests/test_pdf.py's page_scan measures it: the height of the text area
    (``rows``, points), how far down it is used (``used``: its last row with ink
    or an image), the bottom of the first image with its caption below it
    (``figure_bottom``: down to the first gap of 24 pt; None without an image),
    and ``foot``: where the text area ends in an empty stretch of a box (rows up
    to the foot, each filled with one non-white colour across at least half the
    column, with no text or image on them) of FOOT_CM or more, its height in cm,
    where it starts and the text area's height (points from the area's top), else
    None. tests/test_pdf.py measures every empty box and every half-empty page
    this way."""
    import numpy as np
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    mm = 72 / 25.4
    pdf = pdfium.PdfDocument(data)
    scans = []
    for index in range(len(pdf)):
        page = pdf[index]
        # uint8: a reduction over int32 copies of 500 pages took most of a scan's time.
        img = np.asarray(page.render(scale=1).to_pil().convert("RGB"))
        height, width, _ = img.shape
        top, bottom = round(16 * mm), height - round(16 * mm)
        left, right = round(SIDE_MARGIN_MM * mm), width - round(SIDE_MARGIN_MM * mm)
        area = img[top:bottom, left:right]
        rows = area.shape[0]
        images = []
        for obj in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
            _, low, _, high = obj.get_bounds()
            images.append((max(round(height - high) - top, 0),
                           max(round(height - low) - top + 1, 0)))
        # The darkest channel of each pixel (as area.min(axis=2), several times faster).
        darkest = np.minimum(np.minimum(area[..., 0], area[..., 1]), area[..., 2])
        inked = (darkest < 253).any(axis=1)
        for start, end in images:
            inked[start:end] = True
        used = np.nonzero(inked)[0]
        figure_bottom = None
        if images:
            y, blank = min(images)[1], 0
            while y < rows and blank < 24:
                blank = 0 if inked[y] else blank + 1
                y += 1
            figure_bottom = y - blank
        scans.append({"rows": rows, "used": int(used[-1]) + 1 if len(used) else 0,
                      "figure_bottom": figure_bottom, "foot": None})
        y = rows
        while y > 0 and _filled(area[y - 1]):
            y -= 1
        if rows - y < FOOT_CM * 10 * mm:
            continue
        # Text or an image in the stretch ends it there.
        spans = list(images)
        text = page.get_textpage()
        for i in range(text.count_chars()):
            x0, low, x1, high = text.get_charbox(i)
            if x1 > x0:
                spans.append((round(height - high) - top, round(height - low) - top + 1))
        y = max([y] + [min(end, rows) for start, end in spans if end > y and start < rows])
        if rows - y >= FOOT_CM * 10 * mm:
            scans[-1]["foot"] = ((rows - y) / mm / 10, y, rows)
    return scans


def empty_feet(scans: list[dict]) -> dict[int, tuple[float, float, float]]:
    """The pages (from 1) whose text area ends in an empty stretch of a box
    (scan_pages): for each, the stretch's height in cm, where it starts and how
    tall the text area is (points from the area's top)."""
    return {number: scan["foot"] for number, scan in enumerate(scans, 1) if scan["foot"]}


def boxes_to_move(data: bytes, scans: list[dict], boxes: list[dict]) -> tuple[list[str], list[int]]:
    """The boxes of ``boxes`` (``target``: a box's id, ``after``: the id of what
    follows it) that end a page of ``data`` (scanned: ``scans``) in an empty
    stretch (empty_feet) and start low enough on it to start on the next page
    instead; and the pages with an empty stretch that no box can be moved to mend."""
    feet = empty_feet(scans)
    if not feet:
        return [], []
    mm = 72 / 25.4
    starts = destination_tops(data, [box["target"] for box in boxes])
    afters = destination_tops(data, [box["after"] for box in boxes])
    move, left = [], []
    for number, (_, stretch, rows) in sorted(feet.items()):
        # The last box (in the book's order) that starts on this page and goes on
        # past it: the box that breaks at the foot.
        found = None
        for box, start, after in zip(boxes, starts, afters, strict=True):
            if start and start[0] == number and after and after[0] > number:
                found = (box, start[1] - round(16 * mm))
        if found and rows * FOOT_START <= found[1] < stretch:
            move.append(found[0]["target"])
        else:
            left.append(number)
    return move, left


def entry_lengths(pages: list[int | None], total: int) -> dict[int, int]:
    """How many pages each printed entry of ``pages`` (its start page, None where
    it is not printed) takes up to the next printed one, or to the end of the
    ``total`` pages: {index in pages: pages}."""
    shown = [(i, page) for i, page in enumerate(pages) if page is not None]
    ends = [page for _, page in shown[1:]] + [total + 1]
    return {i: end - page for (i, page), end in zip(shown, ends, strict=True)}


def figures_to_fit(data: bytes, scans: list[dict], figures: list[dict], chapters: list[str],
                   heights: dict[str, float], tries: dict[str, int], deferred: set[str],
                   ) -> tuple[list[tuple[str, float]], list[tuple[str, float, float]], list[int]]:
    """The figures of ``figures`` (``target``: a figure's id) to print smaller, and
    by how much (CSS px off the image's height, ``heights``: each image's height
    now), so that each fills the page before it: a page of ``data`` (scanned:
    ``scans``) inside a chapter (``chapters``: the ids where each page of the book
    starts) that is more than half blank, the next page opening with that
    figure. The first such page of each chapter only: the rest of the chapter
    moves. A figure made smaller ``tries`` times before that still did not fit
    leaves more room (FIGURE_SLACK_PT more each time). Where the figure would have
    to be lower than SMALLEST_FIGURE, the prose after it is to be printed before
    it (DEFER): the figure's id, the room on the page before and the least that
    fills it to half (CSS px). Also the pages that cannot be mended so (no figure
    follows, or its prose was moved before)."""
    starts = sorted({page for page in destination_pages(data, chapters) if page})
    tops = destination_tops(data, [figure["target"] for figure in figures])
    floor = SMALLEST_FIGURE * TEXT_AREA_MM / 25.4 * 96
    fit, defer, left, done = [], [], [], set()
    for number, scan in enumerate(scans, 1):
        if not starts or number < starts[0] or number == len(scans) or number + 1 in starts:
            continue  # the cover and contents, the last page of a page of the book
        empty = scan["rows"] - scan["used"]
        if empty <= scan["rows"] / 2:
            continue
        chapter = max(page for page in starts if page <= number)
        following = scans[number]["figure_bottom"]
        # The figure on the next page, or one whose (empty) start is left in the
        # blank foot of this page.
        mm = 72 / 25.4
        found = [(top[0], top[1], figure["target"])
                 for figure, top in zip(figures, tops, strict=True)
                 if top and (top[0] == number + 1
                             or top[0] == number and top[1] - 16 * mm >= scan["used"])]
        if following is None or not found:
            left.append(number)
            continue
        if chapter in done:
            continue
        target = min(found)[2]
        # Points to CSS px: Chromium prints a px as 0.75 pt.
        by = (following + FIGURE_SLACK_PT * (1 + tries.get(target, 0)) - empty) / 0.75
        if heights[target] - by >= floor:
            fit.append((target, by))
        elif target not in deferred:
            defer.append((target, (empty - FIGURE_SLACK_PT) / 0.75,
                          (empty - scan["rows"] / 2) / 0.75 + 8))
        else:
            left.append(number)
            continue
        done.add(chapter)
    return fit, defer, left


def with_outline(data: bytes, outline: list[dict]) -> bytes:
    """The PDF ``data`` with bookmarks: an entry for each item of ``outline`` (a title
    and the id of its element, whose named destination gives the page and the
    height), its ``children`` under it. Chromium's own outline (``outline=True``)
    drops the <h1> headings and runs a heading's lines together."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import Fit

    reader = PdfReader(io.BytesIO(data))
    named = reader.named_destinations
    writer = PdfWriter(clone_from=reader)

    def add(items, parent):
        for item in items:
            dest = named.get("/" + item["target"])
            if dest is None or not item["title"]:
                continue
            number = reader.get_destination_page_number(dest)
            top = dest.get("/Top")
            fit = Fit.xyz(left=None, top=float(top), zoom=None) if top is not None else Fit.fit()
            entry = writer.add_outline_item(title=item["title"], page_number=number, parent=parent,
                                           fit=fit)
            add(item.get("children", []), entry)

    add(outline, None)
    writer.page_mode = "/UseOutlines"
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def print_pdf(html: Path, pdf: Path) -> dict:
    """Print ``html`` (a file in a built book) to ``pdf``; return the number of pages of
    the book (``chapters``), the laid-out ``width`` in CSS px, what is ``wide``r
    than the column, and the contents' ``entries`` with the page each starts on."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    meta = book_metadata()
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
            paper = page.evaluate(PAPER)
            layout = page.evaluate(PREPARE, meta)
            layout.update(paper)
            page.wait_for_function(
                "() => Array.from(document.images).every(i => i.complete)"
            )
            options = dict(
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
            targets = [entry["target"] for entry in layout["entries"]]
            # A box that ends a page in an empty stretch (its next lines did not
            # fit, two blank lines of code before them) starts on the next page.
            # A figure that leaves more than half of the page before it blank is
            # printed smaller, to fill that page; what it moves up is measured
            # again in the next print.
            chapters = [item["target"] for item in layout["outline"]]

            def image_heights() -> dict[str, float]:
                """Each figure's image height now (CSS px; 0 where it is hidden)."""
                return page.evaluate(
                    "(ids) => Object.fromEntries(ids.map(id => [id, Math.max(0, ...Array"
                    ".from(document.getElementById(id).querySelectorAll('img'))"
                    ".map(i => i.getBoundingClientRect().height))]))",
                    [figure["target"] for figure in layout["figures"]],
                )

            moved: list[str] = []
            left: list[int] = []
            blank: list[int] = []
            shrunk: dict[str, float] = {}
            tries: dict[str, int] = {}
            deferred: dict[str, int] = {}
            # What each print after the first showed (ONLY's answer); prints in all.
            partial: list[dict] = []
            prints = 0
            # How many pages each entry of the contents takes, up to the next (-1:
            # the cover, the contents and the introduction), as last printed: where
            # the entries start once every change is made, without a print for it.
            lengths: dict[int, int] = {}
            missing: set[int] = set()  # entries the whole book does not print: no number
            for attempt in range(ROUNDS + 1):
                data = page.pdf(**options)
                prints += 1
                scans = scan_pages(data)
                shown = destination_pages(data, targets)
                if not partial:
                    missing = {i for i, number in enumerate(shown) if number is None}
                if not partial or partial[-1]["intro"]:
                    lengths[-1] = next((p for p in shown if p is not None), len(scans) + 1) - 1
                lengths.update(entry_lengths(shown, len(scans)))
                move, left = boxes_to_move(data, scans, layout["boxes"])
                move = [target for target in move if target not in moved]
                fit, defer, blank = figures_to_fit(data, scans, layout["figures"], chapters,
                                                   image_heights(), tries, set(deferred))
                settled = not move and not fit and not defer
                if settled or attempt == ROUNDS:
                    break
                if move:
                    page.evaluate(MOVE, move)
                    moved += move
                floor = SMALLEST_FIGURE * TEXT_AREA_MM / 25.4 * 96
                for item in page.evaluate(SHRINK, [fit, floor]):
                    shrunk[item["target"]] = item["after"] / item["first"]
                    tries[item["target"]] = tries.get(item["target"], 0) + 1
                for target, room, need in defer:
                    deferred[target] = page.evaluate(DEFER, [target, room, need])
                # The next print: only the pages of the book changed in this one.
                changed = move + [target for target, _ in fit]
                changed += [target for target, _, _ in defer]
                partial.append(page.evaluate(ONLY, changed))
            # Where each entry starts: the pages before it, added up, written into
            # the contents' boxes (of fixed width: the numbers move nothing). The
            # whole book's print with them shows whether they are right. They can be
            # wrong only where a page of the book has content after the pages nested
            # in it (printed with them when one of those changed): then the numbers
            # that print shows are written in, and it is printed once more.
            written = [None if i in missing else 1 + sum(lengths[j] for j in range(-1, i))
                       for i in range(len(targets))]
            page.evaluate(ONLY, None)
            page.evaluate(NUMBER, written)
            data = page.pdf(**options)
            prints += 1
            second = destination_pages(data, targets)
            if second != written:
                print(f"the contents' numbers added up, {written}, are not where the entries"
                      f" start, {second}: printed again with these", file=sys.stderr)
                page.evaluate(NUMBER, second)
                data = page.pdf(**options)
                prints += 1
                if destination_pages(data, targets) != second:
                    raise SystemExit(f"the contents' page numbers moved: {second} then "
                                     f"{destination_pages(data, targets)}")
            if partial:
                # The whole book, measured as it is printed: as its pages were.
                scans = scan_pages(data)
                move, left = boxes_to_move(data, scans, layout["boxes"])
                fit, defer, blank = figures_to_fit(data, scans, layout["figures"], chapters,
                                                   image_heights(), tries, set(deferred))
                move = [target for target in move if target not in moved]
                if settled and (move or fit or defer):
                    raise SystemExit(
                        "the whole book's print asks for changes that the prints of its pages"
                        f" did not ({move}, {fit}, {defer}): a page of the book moved another")
            layout["moved"], layout["feet_left"] = len(moved), left
            layout["figures_shrunk"], layout["blank_left"] = shrunk, blank
            layout["figures_deferred"] = {k: v for k, v in deferred.items() if v}
            layout["prints"], layout["partial"] = prints, [p["pages"] for p in partial]
            for entry, number in zip(layout["entries"], second, strict=True):
                entry["page"] = number
            pdf.parent.mkdir(parents=True, exist_ok=True)
            pdf.write_bytes(with_outline(data, layout["outline"]))
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
    print(f"{layout['shrunk']} wide code or output blocks printed smaller, {layout['wrapped']}"
          f" wrapped at spaces, {layout['tables']} wide tables printed smaller,"
          f" {layout['kept']} code blocks keep their opening lines together,"
          f" {layout['moved']} boxes start on the next page rather than end a page"
          f" in an empty stretch")
    print(f"{layout['solutions']} solutions (with {layout['answer_cells']} cells of worked"
          f" answers) in the appendix; {layout['api_entries']} API entries printed compact")
    print(f"{layout['prints']} prints: the whole book; only the pages of the book that"
          " changed (" + (", ".join(map(str, layout["partial"])) or "none") + ");"
          " the whole book with the contents' page numbers")
    if layout["figures_shrunk"]:
        print(f"{len(layout['figures_shrunk'])} figures printed smaller to fill the page before"
              " them (height, of its print size): " + ", ".join(
                  f"{target} {scale:.0%}" for target, scale in layout["figures_shrunk"].items()))
    if layout["figures_deferred"]:
        print(f"{len(layout['figures_deferred'])} figures printed after the paragraphs that"
              " follow them, too tall to fit smaller (paragraphs moved): " + ", ".join(
                  f"{target} {count}" for target, count in layout["figures_deferred"].items()))
    if layout["blank_left"]:
        print(f"pages still more than half blank inside a chapter: {layout['blank_left']}")
    if layout["feet_left"]:
        print(f"pages still ending in an empty stretch of a box >= {FOOT_CM} cm:"
              f" {layout['feet_left']}")
    for entry in layout["entries"]:
        print(f"contents: page {entry['page']}: {entry['title']}")
    missing = [entry["title"] for entry in layout["entries"] if entry["page"] is None]
    if missing:
        print("no page found for:", *missing, sep="\n  ", file=sys.stderr)
        return 1
    if layout["width"] > PRINT_WIDTH_PX:
        print("wider than the page, so Chromium shrank every page to fit:", *layout["wide"],
              sep="\n  ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
