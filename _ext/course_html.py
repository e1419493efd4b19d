"""Small fixes to the HTML that Jupyter Book 1.x produces for this course.

(1) Repeated scripts.
sphinx-thebe 0.3.1 adds its inline configuration script (``const THEBE_JS_URL
= ...``) once per ``env-before-read-docs`` event, which Jupyter Book's build
fires more than once; the second copy throws "Identifier 'THEBE_JS_URL' has
already been declared" on every page. This extension drops repeated script
entries before a page is written. tests/test_book.py checks every page for
JavaScript errors in a real browser, so a regression shows there.
"""


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


def setup(app):
    app.connect("html-page-context", _drop_repeated_scripts, priority=900)
    app.connect("builder-inited", _hide_input_in_singlehtml)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
