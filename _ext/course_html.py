"""Small fixes to the HTML that Jupyter Book 1.x produces for this course.

(1) Repeated scripts.
sphinx-thebe 0.3.1 adds its inline configuration script (``const THEBE_JS_URL
= ...``) once per ``env-before-read-docs`` event, which Jupyter Book's build
fires more than once; the second copy throws "Identifier 'THEBE_JS_URL' has
already been declared" on every page. This extension drops repeated script
entries before a page is written. tests/test_book.py checks every page for
JavaScript errors in a real browser, so a regression shows there.

(2) The PDF link.
The role ``{book-pdf}`book.pdf``` links the PDF that ``make pdf`` writes
(``course_pdf``, ``_build/pdf/book.pdf``) where it exists, copying it next to
the HTML pages; where it does not (after ``make book`` alone) the role says how
to make it instead of linking a missing file. The page notes the PDF as a
dependency, so the next HTML build after ``make pdf`` re-reads it (``make pdf``
runs that build itself).

(3) The search page.
``_ext/search_scorer.js`` is the book's ``html_search_scorer``: it ranks first the
pages whose headings are about the query, and writes the math in the results'
snippets as plain text rather than TeX. Set here, as a path from this file,
so that the build finds it from any working directory.
"""

import os
import shutil
from pathlib import Path

from docutils import nodes

PDF_MISSING = "not built yet: run make pdf"


def _drop_repeated_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen = set()
    unique = []
    for script in scripts:
        # The copies differ in priority and in filename (None or ""), so compare
        # only what the browser sees: the source and the attributes.
        filename = getattr(script, "filename", script) or ""
        attributes = tuple(sorted(getattr(script, "attributes", {}).items()))
        key = (str(filename), attributes)
        if key in seen:
            continue
        seen.add(key)
        unique.append(script)
    context["script_files"] = unique


def _hide_input_in_singlehtml(app):
    """myst-nb renders ``hide-input`` cells for the ``html`` builder only; the
    single-page build that ``make pdf`` prints uses the same HTML for them."""
    if app.builder.name != "singlehtml":
        return
    from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput, visit_HideCellInput

    app.add_node(HideCodeCellNode, override=True,
                 singlehtml=(visit_HideCellInput, depart_HideCellInput))


def _pdf_path(app) -> Path:
    return Path(app.srcdir) / app.config.course_pdf


def book_pdf_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{book-pdf}`book.pdf```: a link to the PDF where ``make pdf`` has written it."""
    env = inliner.document.settings.env
    pdf = _pdf_path(env.app)
    env.note_dependency(str(pdf))
    if env.app.builder.name != "html":
        # The single-page build is what the PDF is printed from: no link to itself.
        return [nodes.Text(text)], []
    if not pdf.is_file():
        return [nodes.emphasis(rawtext, PDF_MISSING)], []
    depth = env.docname.count("/")
    uri = "../" * depth + pdf.name
    return [nodes.reference(rawtext, text, refuri=uri, classes=["course-book-pdf"])], []


def _copy_pdf(app, exception):
    pdf = _pdf_path(app)
    if exception is None and app.builder.name == "html" and pdf.is_file():
        shutil.copy2(pdf, os.path.join(app.outdir, pdf.name))


SEARCH_SCORER = Path(__file__).with_name("search_scorer.js")


def _use_search_scorer(app, config):
    if not config.html_search_scorer:
        config.html_search_scorer = str(SEARCH_SCORER)


def setup(app):
    app.add_config_value("course_pdf", "_build/pdf/book.pdf", "env")
    app.connect("config-inited", _use_search_scorer)
    app.add_role("book-pdf", book_pdf_role)
    app.connect("build-finished", _copy_pdf)
    app.connect("html-page-context", _drop_repeated_scripts, priority=900)
    app.connect("builder-inited", _hide_input_in_singlehtml)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
