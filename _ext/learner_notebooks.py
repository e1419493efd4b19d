"""The notebooks a learner opens: exercises without their answers, and solutions apart.

The chapter notebooks (``chapters/*.ipynb``) are the book's sources: MyST Markdown
(```` ```{exercise} ```` and ```` ```{solution} ```` blocks, ``:label:`` lines) that
Jupyter and Colab show as raw text, each solution under its exercise, and the code
cells that run the solutions, hidden only by the book's ``remove-cell`` and
``hide-cell`` tags. From each chapter this module makes two notebooks:

* the **learner notebook** (``notebooks/NN_name.ipynb``): every ``{exercise}``
  block becomes a plain heading, "Exercise 3.2: Title", with its text and a
  link to its solution; the ``{solution}`` blocks are gone, and so are the code
  cells of the exercises section that the book hides (the solutions' code and
  the cells that compute a worked answer's numbers). What stays of the section
  are the exercises' stubs (untagged) and their check cells (tagged
  ``raises-exception``), which fail until the learner fills the stub, as in the
  book; an exercise without a stub gets an empty code cell where its answer's
  code was. Everything before the exercises section is the chapter unchanged.
* the **solutions notebook** (``notebooks/solutions/NN_name.ipynb``): the whole
  chapter, with each solution as a "Solution to exercise 3.2" section under its
  exercise and every code cell (a front end ignores the book's hiding tags).

Both are written without outputs, so that they are worksheets to run, and
small enough to keep in the repository, where Colab opens them
(``colab.research.google.com/github/.../blob/main/notebooks/...``). ``make book``
writes them (``python _ext/learner_notebooks.py``); tests/test_learner_notebooks.py
checks that the committed copies are up to date, that no answer is left in a
learner notebook, and that each runs top to bottom with only the exercises'
checks failing (its exercises section run there, the chapter before it by
nbval). The book itself is built from ``chapters/`` and does not change;
_ext/course_downloads.py puts the same notebooks in the built book (download
button, notebooks.zip) and points the Colab button at them.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
#: Where the learner notebooks live in the repository; solutions in a subfolder.
LEARNER_DIR = "notebooks"
SOLUTIONS_DIR = "solutions"
#: Tags with which the book hides a code cell, whole or in part.
HIDING_TAGS = {"remove-cell", "hide-cell", "remove-input", "hide-input"}
#: The tag of a cell that is expected to fail (an exercise's check).
CHECK_TAG = "raises-exception"

_OPENING = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>exercise|solution)\}\s*(?P<arg>.*?)\s*$")
_OPTION = re.compile(r"^:(?P<key>[\w-]+):\s*(?P<value>.*?)\s*$")


def _blocks(text: str):
    """Split MyST Markdown into plain text and ``{exercise}``/``{solution}`` blocks.

    Yields ``("text", lines)`` and ``(name, arg, options, body_lines)``. A block
    ends at a line of the opening fence's character at least as long as the
    opening fence and nothing else (CommonMark's rule, which MyST follows), so
    the shorter ```` ``` ```` fences of code inside a ```` ```` ```` block stay in its body.
    """
    lines = text.split("\n")
    plain: list[str] = []
    i = 0
    while i < len(lines):
        match = _OPENING.match(lines[i])
        if not match:
            plain.append(lines[i])
            i += 1
            continue
        if plain:
            yield ("text", plain)
            plain = []
        fence = match["fence"]
        closing = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        i += 1
        options = {}
        while i < len(lines) and (option := _OPTION.match(lines[i])):
            options[option["key"]] = option["value"]
            i += 1
        body = []
        while i < len(lines) and not closing.match(lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{{{match['name']}}} {match['arg']!r} is never closed")
        i += 1  # the closing fence
        yield (match["name"], match["arg"], options, body)
    if plain:
        yield ("text", plain)


def _trim(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")


def chapter_number(name: str) -> int:
    """``03_why_scale.ipynb`` -> 3."""
    return int(re.match(r"(\d+)_", name).group(1))


def colab_url(config: dict, path: str) -> str:
    """Colab's address of the repository file ``path`` (at ``repository.branch``)."""
    repository = config["repository"]
    github = repository["url"].removeprefix("https://github.com/").strip("/")
    colab = config.get("launch_buttons", {}).get("colab_url", "https://colab.research.google.com")
    return f"{colab.rstrip('/')}/github/{github}/blob/{repository.get('branch', 'main')}/{path}"


def _strip_outputs(nb) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


def make_notebooks(path: Path | str, config: dict):
    """The learner and the solutions notebook of the chapter notebook at ``path``."""
    path = Path(path)
    source = nbformat.read(path, as_version=4)
    number = chapter_number(path.name)
    solutions_link = (
        f"[solutions notebook]({SOLUTIONS_DIR}/{path.name}) "
        f"([open it in Colab]({colab_url(config, f'{LEARNER_DIR}/{SOLUTIONS_DIR}/{path.name}')}))"
    )
    learner = copy.deepcopy(source)
    solutions = copy.deepcopy(source)
    learner.cells, solutions.cells = [], []
    titles: dict[str, str] = {}  # label -> "Exercise 3.2"
    in_exercises = False
    for cell in source.cells:
        if cell.cell_type != "markdown":
            tags = set(cell.metadata.get("tags", []))
            solutions.cells.append(copy.deepcopy(cell))
            # In the exercises section the book hides only answers: a solution's
            # code, or the cell that computes a worked answer's numbers.
            if not (in_exercises and cell.cell_type == "code" and tags & HIDING_TAGS
                    and CHECK_TAG not in tags):
                learner.cells.append(copy.deepcopy(cell))
            elif learner.cells[-1].cell_type == "markdown":
                # An exercise without a stub (one to think and measure): an empty
                # cell where the answer's code was, for the learner's own.
                learner.cells.append(nbformat.v4.new_code_cell(
                    f"# Your code for {list(titles.values())[-1].lower()}, if it needs any."))
            continue
        learner_parts, solution_parts = [], []
        for block in _blocks(cell.source):
            if block[0] == "text":
                learner_parts.append(_trim(block[1]))
                solution_parts.append(_trim(block[1]))
                continue
            name, arg, options, body = block
            if name == "exercise":
                in_exercises = True
                title = f"Exercise {number}.{len(titles) + 1}"
                titles[options.get("label", title)] = title
                heading = f"### {title}: {arg}" if arg else f"### {title}"
                learner_parts.append(f"{heading}\n\n{_trim(body)}\n\n"
                                     f"*Its solution*: in this chapter's {solutions_link}.")
                solution_parts.append(f"{heading}\n\n{_trim(body)}")
            else:
                title = titles.get(arg, "the exercise")
                solution_parts.append(f"#### Solution to {title.lower()}\n\n{_trim(body)}")
        for parts, target, original in ((learner_parts, learner, cell),
                                        (solution_parts, solutions, cell)):
            text = "\n\n".join(part for part in parts if part)
            if text:
                new = copy.deepcopy(original)
                new.source = text
                target.cells.append(new)
    learner.cells.insert(1, nbformat.v4.new_markdown_cell(
        "This is the chapter's notebook for working the exercises: their solutions are not in "
        f"it. Each exercise links to its solution in this chapter's {solutions_link}; the "
        "course book shows them too, folded under each exercise."))
    solutions.cells.insert(1, nbformat.v4.new_markdown_cell(
        "This notebook is the chapter with the solutions of its exercises, each under its "
        f"exercise. To work the exercises yourself, open the [notebook without the solutions]"
        f"(../{path.name}) ([in Colab]({colab_url(config, f'{LEARNER_DIR}/{path.name}')}))."))
    for nb in (learner, solutions):
        _strip_outputs(nb)
        for i, cell in enumerate(nb.cells):
            # Ids unique and stable: the same chapter gives the same bytes.
            cell["id"] = f"cell-{i}"
    return learner, solutions


def notebook_texts(root: Path | str = ROOT, config: dict | None = None) -> dict[str, str]:
    """Every learner and solutions notebook, as ``{relative path: JSON text}``.

    Paths are relative to the learner folder: ``03_why_scale.ipynb`` and
    ``solutions/03_why_scale.ipynb``.
    """
    import yaml

    root = Path(root)
    chapters = sorted((root / "chapters").glob("*.ipynb"))
    if not chapters:
        raise FileNotFoundError(f"no notebooks in {root / 'chapters'}")
    if config is None:
        config = yaml.safe_load((root / "_config.yml").read_text())
    texts = {}
    for chapter in chapters:
        learner, solutions = make_notebooks(chapter, config)
        texts[chapter.name] = nbformat.writes(learner) + "\n"
        texts[f"{SOLUTIONS_DIR}/{chapter.name}"] = nbformat.writes(solutions) + "\n"
    return texts


def write_notebooks(target: Path | str, root: Path | str = ROOT) -> list[Path]:
    """Write every learner and solutions notebook under ``target``; return the paths.

    Notebooks in ``target`` that no chapter makes any more are removed.
    """
    target = Path(target)
    texts = notebook_texts(root)
    written = []
    for relative, text in texts.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for old in list(target.glob("*.ipynb")) + list(target.glob(f"{SOLUTIONS_DIR}/*.ipynb")):
        if old not in written:
            old.unlink()
    return written


if __name__ == "__main__":
    # python _ext/learner_notebooks.py [TARGET]: the repository's notebooks/ by default.
    destination = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / LEARNER_DIR
    for written_path in write_notebooks(destination):
        print(written_path)
