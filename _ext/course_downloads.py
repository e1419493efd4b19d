"""The notebooks a reader takes away from the HTML book: learner notebooks, not sources.

What a reader downloads or opens in Colab is each chapter's learner notebook and
its solutions notebook (_ext/learner_notebooks.py: the exercises without their
answers, MyST turned into plain Markdown), never the book's source with every
solution under its exercise. When the HTML build finishes, this extension

* writes both notebooks of every chapter into the built book, as
  ``notebooks/NN_name.ipynb`` and ``notebooks/solutions/NN_name.ipynb``;
* writes ``notebooks.zip`` at the root of the built book, holding them as
  ``chapters/NN_name.ipynb`` and ``chapters/solutions/NN_name.ipynb``; its
  entries carry a fixed date, so the same notebooks give the same bytes. The role
  ``{notebooks-zip}`notebooks.zip``` links it (relative to the page that uses it).

and, on each chapter page, points the header's buttons at them: the download
menu's ".ipynb" at the learner notebook, with a second entry for the solutions,
and Colab's launch button at the learner notebook in the repository's
``notebooks/`` folder (``make book`` keeps that folder up to date). The book's
pages themselves are built from ``chapters/`` as before.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from docutils import nodes

sys.path.insert(0, str(Path(__file__).parent))
import learner_notebooks  # a sibling module of this extension

ZIP_NAME = "notebooks.zip"
#: The date every entry carries (a zip cannot store one before 1980).
ENTRY_DATE = (1980, 1, 1, 0, 0, 0)


def write_notebooks_zip(srcdir: Path | str, outdir: Path | str) -> Path:
    """Write the learner and solutions notebooks of every ``srcdir/chapters/*.ipynb``
    into ``outdir/notebooks/`` and, zipped under ``chapters/``, into
    ``outdir/notebooks.zip``.

    Raises:
        FileNotFoundError: when ``srcdir/chapters`` holds no notebook.
    """
    texts = learner_notebooks.notebook_texts(srcdir)
    learner_notebooks.write_notebooks(Path(outdir) / learner_notebooks.LEARNER_DIR, srcdir)
    target = Path(outdir) / ZIP_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative, text in sorted(texts.items()):
            entry = zipfile.ZipInfo(f"chapters/{relative}", date_time=ENTRY_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, text)
    return target


def _point_buttons_at_learner_notebooks(app, pagename, templatename, context, doctree):
    """The download menu and Colab's launch button of a chapter page: its learner notebook.

    For a page made from a notebook, sphinx-book-theme's download menu offers the
    source itself (``_sources/chapters/NAME.ipynb``, labelled ".ipynb"): that entry
    now gives the learner notebook, and an entry after it the solutions notebook.
    """
    if not pagename.startswith("chapters/") or not context.get("header_buttons"):
        return
    name = pagename.split("/", 1)[1] + ".ipynb"
    if not (Path(app.srcdir) / "chapters" / name).is_file():
        return
    pathto = context["pathto"]
    folder = learner_notebooks.LEARNER_DIR
    for group in context["header_buttons"]:
        buttons = group.get("buttons", [group])
        for index, button in enumerate(list(buttons)):
            url = button.get("url") or ""
            if group.get("label") == "download-buttons" and url.endswith(f"/{name}"):
                button["url"] = pathto(f"{folder}/{name}", 1)
                button["tooltip"] = "Download the notebook, without the solutions"
                buttons.insert(index + 1, {
                    "type": "link",
                    "url": pathto(f"{folder}/{learner_notebooks.SOLUTIONS_DIR}/{name}", 1),
                    "text": "solutions .ipynb",
                    "icon": "fas fa-key",
                    "tooltip": "Download the notebook with the solutions",
                    "label": "download-solutions-button",
                })
            elif button.get("text") == "Colab" and url.endswith(f"/{pagename}.ipynb"):
                # .../github/ORG/REPO/blob/BRANCH/chapters/NAME.ipynb -> .../notebooks/NAME.ipynb
                button["url"] = url.removesuffix(f"{pagename}.ipynb") + f"{folder}/{name}"


def notebooks_zip_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{notebooks-zip}`label```: a link to the zip at the root of the HTML book."""
    env = inliner.document.settings.env
    depth = env.docname.count("/")
    uri = "../" * depth + ZIP_NAME
    return [nodes.reference(rawtext, text, refuri=uri, classes=["course-notebooks-zip"])], []


def _write_zip(app, exception):
    if exception is None and app.builder.format == "html":
        write_notebooks_zip(app.srcdir, app.outdir)


def setup(app):
    app.add_role("notebooks-zip", notebooks_zip_role)
    app.connect("build-finished", _write_zip)
    # After sphinx-book-theme has made its buttons (priority 501).
    app.connect("html-page-context", _point_buttons_at_learner_notebooks, priority=950)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
