"""Every chapter's notebook in one zip, written into the HTML book at build time.

The role ``{notebooks-zip}`notebooks.zip``` links ``notebooks.zip`` at the root
of the built HTML book (relative to the page that uses it); when the HTML
build finishes, :func:`write_notebooks_zip` writes that file from
``chapters/*.ipynb``. The archive holds ``chapters/NN_name.ipynb``, so that it
unpacks into the same layout as the repository. Its entries carry a fixed date,
so the same notebooks give the same bytes.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from docutils import nodes

ZIP_NAME = "notebooks.zip"
#: The date every entry carries (a zip cannot store one before 1980).
ENTRY_DATE = (1980, 1, 1, 0, 0, 0)


def write_notebooks_zip(srcdir: Path | str, outdir: Path | str) -> Path:
    """Write ``outdir/notebooks.zip`` holding every ``srcdir/chapters/*.ipynb``.

    Raises:
        FileNotFoundError: when ``srcdir/chapters`` holds no notebook.
    """
    notebooks = sorted((Path(srcdir) / "chapters").glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks in {Path(srcdir) / 'chapters'}")
    target = Path(outdir) / ZIP_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for notebook in notebooks:
            entry = zipfile.ZipInfo(f"chapters/{notebook.name}", date_time=ENTRY_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, notebook.read_bytes())
    return target


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
