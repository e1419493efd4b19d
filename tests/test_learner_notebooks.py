"""The notebooks a learner opens (notebooks/, made by _ext/learner_notebooks.py).

Colab's launch button, the download button and notebooks.zip give these, not the
chapters' sources: no solution and no MyST markup that Jupyter or Colab shows as
raw text, each exercise a plain heading with a link to its solution, and the
notebook runs top to bottom with only the exercises' checks failing. The
browser-side links (Colab button, download menu, zip) are checked in
tests/test_book.py. The runs of the notebooks are marked slow (each starts a
kernel): the part of a learner notebook that differs from its chapter runs here,
the rest is the chapter's, which nbval runs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
import learner_notebooks  # noqa: E402  (from _ext/, put on the path above)

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
LEARNER = ROOT / learner_notebooks.LEARNER_DIR
# What Jupyter and Colab would show as raw MyST.
MYST_LEFTOVERS = re.compile(r"\{exercise\}|\{solution\}|^:label:|^:class:", re.M)
SOLUTION_BLOCK = re.compile(r"^(`{3,})\{solution\}[^\n]*\n(.*?)^\1\s*$", re.M | re.S)
EXERCISE_TITLE = re.compile(r"^(`{3,})\{exercise\}\s*(.*?)\s*$", re.M)
PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def solution_code_lines(chapter: nbformat.NotebookNode) -> set[str]:
    """Lines of the chapter's answers that no other cell shares: the code of its
    {solution} blocks and of the exercises section's code cells hidden in the book."""
    answers, others = [], []
    in_exercises = False
    for cell in chapter.cells:
        if cell.cell_type == "markdown":
            in_exercises = in_exercises or "{exercise}" in cell.source
            for block in SOLUTION_BLOCK.finditer(cell.source):
                answers += PYTHON_FENCE.findall(block.group(2))
            continue
        tags = set(cell.metadata.get("tags", []))
        hidden = tags & {"remove-cell", "hide-cell"} and "raises-exception" not in tags
        (answers if in_exercises and hidden else others).append(cell.source)

    def lines(sources):
        return {line.strip() for source in sources for line in source.splitlines()}

    # A line a stub or any other visible cell has too (a def line) gives nothing away.
    return {line for line in lines(answers) - lines(others) if len(line) >= 20}


@pytest.fixture(scope="module")
def made() -> dict[str, str]:
    return learner_notebooks.notebook_texts(ROOT)


def test_the_committed_notebooks_are_those_the_chapters_make(made):
    """Colab opens notebooks/ from the repository: it must follow the chapters."""
    committed = {p.relative_to(LEARNER).as_posix(): p.read_text()
                 for p in sorted(LEARNER.rglob("*.ipynb"))}
    stale = sorted(set(made) ^ set(committed)
                   | {name for name in made if committed.get(name) != made[name]})
    assert not stale, (f"notebooks/ is out of date for {stale}: run "
                       "`.venv/bin/python _ext/learner_notebooks.py` (make book does)")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_learner_notebook_has_no_answer_and_no_myst(chapter, made):
    source = nbformat.read(chapter, as_version=4)
    learner = nbformat.reads(made[chapter.name], as_version=4)
    markdown = "\n".join(c.source for c in learner.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in learner.cells if c.cell_type == "code")
    assert not MYST_LEFTOVERS.findall(markdown), MYST_LEFTOVERS.findall(markdown)
    assert "```{" not in markdown
    answers = solution_code_lines(source)
    assert answers, "the test found no solution code in the chapter: is its pattern stale?"
    shown = {line.strip() for line in (markdown + "\n" + code).splitlines()}
    assert not answers & shown, f"solution code in the learner notebook: {sorted(answers & shown)[:5]}"
    # Worksheets: no stored output, so no "Correct: ..." from a solution's check.
    assert not any(c.get("outputs") for c in learner.cells if c.cell_type == "code")

    # Every exercise is there, numbered as in the book, with its solution one click away.
    titles = [m.group(2) for c in source.cells if c.cell_type == "markdown"
              for m in EXERCISE_TITLE.finditer(c.source)]
    number = learner_notebooks.chapter_number(chapter.name)
    headings = re.findall(r"^### (Exercise \d+\.\d+): (.*)$", markdown, re.M)
    assert headings == [(f"Exercise {number}.{i}", t) for i, t in enumerate(titles, 1)]
    link = f"({learner_notebooks.SOLUTIONS_DIR}/{chapter.name})"
    assert markdown.count(link) == len(titles) + 1  # each exercise and the note at the top
    # The stubs and their checks stay, as in the book.
    checks = [c for c in source.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert [c.source for c in learner.cells if "raises-exception" in c.metadata.get("tags", [])] \
        == [c.source for c in checks]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_solutions_notebook_holds_every_solution(chapter, made):
    source = nbformat.read(chapter, as_version=4)
    solutions = nbformat.reads(made[f"{learner_notebooks.SOLUTIONS_DIR}/{chapter.name}"],
                               as_version=4)
    markdown = "\n".join(c.source for c in solutions.cells if c.cell_type == "markdown")
    assert not MYST_LEFTOVERS.findall(markdown)
    # A block's text, without its option lines (":class: dropdown").
    blocks = [re.sub(r"^(:[\w-]+:.*\n)+", "", b.group(2))
              for c in source.cells if c.cell_type == "markdown"
              for b in SOLUTION_BLOCK.finditer(c.source)]
    assert blocks and all(block.strip() in markdown for block in blocks)
    assert len(re.findall(r"^#### Solution to exercise \d+\.\d+$", markdown, re.M)) == len(blocks)
    # Every code cell of the chapter, solutions included, in order.
    assert ([c.source for c in solutions.cells if c.cell_type == "code"]
            == [c.source for c in source.cells if c.cell_type == "code"])


def test_the_learner_check_catches_an_answer_left_in(made):
    """The answer check above is not vacuous: a learner notebook with a solution's
    code cell put back fails it."""
    chapter = CHAPTERS[0]
    source = nbformat.read(chapter, as_version=4)
    answer = next(c for c in source.cells if "remove-cell" in c.metadata.get("tags", [])
                  and "NotImplementedError" not in c.source and "check_" in c.source)
    learner = nbformat.reads(made[chapter.name], as_version=4)
    learner.cells.append(answer)
    shown = {line.strip() for c in learner.cells for line in c.source.splitlines()}
    assert solution_code_lines(source) & shown


RUN_NOTEBOOK_TIMEOUT = 900
EXERCISE_HEADING = re.compile(r"^### Exercise \d+\.\d+", re.M)


def names_of(source: str) -> tuple[set[str], set[str]]:
    """The names a code cell binds at the notebook's top level, and those it reads
    from there (inside its functions and comprehensions too). IPython's syntax
    (magics, ``!`` lines) is turned into Python first, as the kernel does."""
    import ast
    import symtable

    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(source)
    top = symtable.symtable(code, "<cell>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    # x += 1 reads x: symtable counts it as an assignment only.
    read |= {node.target.id for node in ast.walk(ast.parse(code))
             if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)}
    tables = list(top.get_children())
    while tables:  # what a function, class or comprehension reads from the top level
        table = tables.pop()
        read |= {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
        tables += table.get_children()
    return bound, read


def section_start(nb: nbformat.NotebookNode, marker: re.Pattern) -> int:
    """The index of the first markdown cell where ``marker`` is found: where the
    exercises section starts ("### Exercise 3.1" in a learner notebook,
    ``{exercise}`` in a chapter)."""
    return next(i for i, c in enumerate(nb.cells)
                if c.cell_type == "markdown" and marker.search(c.source))


def exercise_run(learner: nbformat.NotebookNode) -> list[int]:
    """The code cells (indices) of a learner notebook to run for its exercises
    section: the setup and settings cells (the first two), every cell of the
    section, the cells before it that a test run of the chapter does not take
    (``gpu`` cells, skipped by nbval on a CPU; cells that read the notebook's
    own file, which nbval runs beside the chapter and its outputs), and before
    each of these the last cell to bind each name it reads, and so on back (the
    imports, and chapter 11's Triton cell), in the notebook's order."""
    start = section_start(learner, EXERCISE_HEADING)
    code = [i for i, c in enumerate(learner.cells) if c.cell_type == "code"]
    names = {i: names_of(learner.cells[i].source) for i in code}
    chosen = set(code[:2]) | {i for i in code if i > start} | {
        i for i in code if "gpu" in learner.cells[i].metadata.get("tags", [])
        or ".ipynb" in learner.cells[i].source}
    wanted = [(i, name) for i in chosen for name in names[i][1]]
    while wanted:
        reader, name = wanted.pop()
        binders = [i for i in code if i < min(reader, start) and name in names[i][0]]
        if binders and binders[-1] not in chosen:
            chosen.add(binders[-1])
            wanted += [(binders[-1], n) for n in names[binders[-1]][1]]
    return sorted(chosen)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_learner_notebook_runs_with_only_the_exercise_checks_failing(chapter, made, monkeypatch):
    """As a learner runs it, top to bottom: every cell runs; the cells that fail are
    the exercises' checks (their stubs are not filled), each of them, and no other.

    Run here in two parts, so that CI does not run each chapter twice (issue 25,
    item 7: that took a quarter of its CPU time). Up to its exercises section a
    learner notebook is its chapter, code cell for code cell (asserted below),
    and nbval runs the chapter's cells in every test run. What that run does not
    show runs here in a fresh kernel (exercise_run): the section without the
    solutions between its cells, and the cells before it that nbval skips or runs
    otherwise (``gpu`` cells, which take their no-GPU path here; cells that read
    the notebook's own file, which here has no outputs), each after the cells
    that bind what it reads (the sections read only the setup and imports, and
    chapter 11's its Triton cell)."""
    from nbclient import NotebookClient

    source = nbformat.read(chapter, as_version=4)
    learner = nbformat.reads(made[chapter.name], as_version=4)
    run = exercise_run(learner)
    start = section_start(learner, EXERCISE_HEADING)
    first = section_start(source, EXERCISE_TITLE)

    def body(nb, end):
        return [(c.source, c.metadata.get("tags", [])) for c in nb.cells[:end]
                if c.cell_type == "code"]

    assert body(learner, start) == body(source, first), (
        "the learner notebook differs from its chapter before the exercises section")
    # The chapters' pinned arithmetic (_ext/numerics.env), as nbval runs them.
    for line in (ROOT / "_ext" / "numerics.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            monkeypatch.setenv(*(part.strip() for part in line.split("=", 1)))
    learner.cells = [learner.cells[i] for i in run]
    NotebookClient(learner, timeout=RUN_NOTEBOOK_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(LEARNER)}}).execute()
    failed = [c for c in learner.cells if any(o.output_type == "error" for o in c.outputs)]
    checks = [c for c in learner.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert checks, "the exercises section has no check cell: is exercise_run's split stale?"
    assert all(c.execution_count for c in learner.cells if c.source)
    assert [c.source for c in failed] == [c.source for c in checks], (
        "cells that failed: " + "; ".join(c.source[:60] for c in failed))
    # They fail because a stub is not filled: CheckFailed or the stub's own error.
    names = {o.ename for c in failed for o in c.outputs if o.output_type == "error"}
    assert names <= {"CheckFailed", "NotImplementedError"}, names


def test_exercise_run_follows_what_the_section_reads():
    """exercise_run takes the cells that bind what the section (and a gpu cell)
    reads, and what those read, back to the first cell; not the rest."""
    gpu = nbformat.v4.new_code_cell("count += 1")
    gpu.metadata["tags"] = ["gpu"]
    cells = [nbformat.v4.new_code_cell("# setup"),
             nbformat.v4.new_code_cell("import torch\nimport math"),
             nbformat.v4.new_code_cell("big = torch.ones(3)\nslow = train()"),
             nbformat.v4.new_code_cell("scale = math.sqrt(big.numel())"),
             nbformat.v4.new_code_cell("unused = slow + 1"),
             nbformat.v4.new_code_cell("def helper(scale):\n    return scale"),
             nbformat.v4.new_code_cell("count = 0"),
             gpu,
             nbformat.v4.new_markdown_cell("### Exercise 1.1: Scale\n\nDo it."),
             nbformat.v4.new_code_cell("%time\ndef my_scale(x):\n    return x * scale"),
             nbformat.v4.new_code_cell("check(my_scale)")]
    notebook = nbformat.v4.new_notebook(cells=cells)
    assert exercise_run(notebook) == [0, 1, 2, 3, 6, 7, 9, 10]
