"""The landing page's running times, from the notebooks' own records.

``make execute`` runs each notebook top to bottom and Jupyter stores, for every
code cell, when it started and when it finished (``metadata.execution``). A
chapter's running time is the span from the first code cell's start to the last
one's end: the kernel's start-up is not in it. :func:`update_intro` writes those
times, rounded to whole seconds (``N&nbsp;s``: the number and its unit stay on one
line on a phone), into the "running on a CPU" column of the
``chapter-times`` table in ``intro.md``; ``make execute`` calls it, and
``tests/test_instructors.py`` checks that the table and the notebooks agree.

Usage: ``python _ext/chapter_times.py`` from the repository's root.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(\| (\d+)\. [^|]*\|[^|]*\| )([^|]*?)( \|.*)$", re.MULTILINE)


def running_seconds(notebook: Path) -> float:
    """Seconds from the first code cell's start to the last code cell's end.

    Raises:
        ValueError: when a code cell has no execution record (the notebook was
            not saved from a run of ``make execute``).
    """
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    records = [c.get("metadata", {}).get("execution") for c in cells]
    if not records or not all(records):
        raise ValueError(f"{notebook.name}: a code cell has no execution record")

    def when(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    start = when(records[0]["iopub.execute_input"])
    end = max(when(r["shell.execute_reply"]) for r in records)
    return (end - start).total_seconds()


def update_intro(root: Path = ROOT) -> str:
    """Rewrite the running times of intro.md's table; return the new text."""
    intro = root / "intro.md"
    times = {int(p.name[:2]): running_seconds(p)
             for p in sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb"))}
    text = ROW.sub(lambda m: f"{m.group(1)}{round(times[int(m.group(2))])}&nbsp;s{m.group(4)}"
                   if int(m.group(2)) in times else m.group(0), intro.read_text())
    intro.write_text(text)
    return text


if __name__ == "__main__":
    update_intro()
