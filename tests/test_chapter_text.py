"""How the chapters' text is put together: exercises and links.

- Every chapter ends with at least three sphinx-exercise ``{exercise}`` blocks,
  each with a non-gated ``{solution}`` that the HTML hides until clicked.
- A coding exercise's solution shows its code in a ```python fence, and the
  code cell right after it runs exactly that code and then a checker, so nbval
  proves the checker accepts the solution the book prints.
- Every "Chapter N" in the text is a link to that chapter, and no text promises
  a chapter that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
CHAPTER_FILES = {int(p.name[:2]): p.name for p in NOTEBOOKS}

FENCE = re.compile(r"^(`{3,}|~{3,})\{(exercise|solution)\}[ \t]*(.*)$", re.MULTILINE)
LABEL = re.compile(r"^:label:\s*(\S+)", re.MULTILINE)
PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _directives(text: str, kind: str) -> list[tuple[str, str]]:
    """(argument, body) of each ``{kind}`` block in a markdown cell."""
    found = []
    for match in FENCE.finditer(text):
        if match.group(2) != kind:
            continue
        ticks = match.group(1)
        end = re.compile(rf"^{re.escape(ticks)}\s*$", re.MULTILINE).search(text, match.end())
        assert end is not None, f"unclosed {{{kind}}} block: {match.group(0)}"
        found.append((match.group(3).strip(), text[match.end():end.start()]))
    return found


def _cells(path: Path):
    return nbformat.read(path, as_version=4).cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_has_three_exercises_each_with_a_hidden_solution(path):
    exercises, solutions = [], {}
    for cell in _cells(path):
        if cell.cell_type != "markdown":
            continue
        for _, body in _directives(cell.source, "exercise"):
            label = LABEL.search(body)
            assert label, f"{path.name}: an exercise without a :label:"
            exercises.append(label.group(1))
        for target, body in _directives(cell.source, "solution"):
            assert ":class: dropdown" in body, f"{path.name}: solution {target} is not a dropdown"
            solutions[target] = body
    assert len(exercises) >= 3, f"{path.name}: {len(exercises)} exercises, expected at least 3"
    missing = [label for label in exercises if label not in solutions]
    assert not missing, f"{path.name}: exercises without a solution: {missing}"
    assert not any("solution-start" in c.source for c in _cells(path)), "use non-gated solutions"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solution_code_is_the_code_that_runs_and_is_checked(path):
    cells = _cells(path)
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        for target, body in _directives(cell.source, "solution"):
            fences = PYTHON_FENCE.findall(body)
            if not fences:
                continue  # a worked answer in words
            code = "\n".join(fence.rstrip("\n") for fence in fences)
            following = next((c for c in cells[index + 1:] if c.cell_type == "code"), None)
            assert following is not None, f"{path.name}: no code cell runs solution {target}"
            assert following.source.startswith(code), (
                f"{path.name}: the code cell after solution {target} must start with the "
                "solution's code, so that the book shows the code nbval runs"
            )
            assert "remove-cell" in following.metadata.get("tags", []), (
                f"{path.name}: the cell running solution {target} must be tagged remove-cell "
                "(its output, the checker's 'Correct', would show under the closed solution)"
            )
            assert re.search(r"\bcheck_\w+\(", following.source[len(code):]), (
                f"{path.name}: the cell running solution {target} must end by calling a checker"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nothing_under_a_closed_solution_gives_the_answer_away(path):
    """The code cells right after a solution run it or check its numbers; a reader who
    has not opened the solution must see neither their code nor their output."""
    cells = _cells(path)
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown" or not _directives(cell.source, "solution"):
            continue
        for following in cells[index + 1:]:
            if following.cell_type != "code":
                break
            tags = following.metadata.get("tags", [])
            shown = following.outputs and not {"remove-cell", "remove-output"} & set(tags)
            assert not shown, (
                f"{path.name}: a code cell after a solution shows its output to a reader "
                f"who has not opened it (tags {tags}): {following.source[:80]!r}")
            assert "remove-cell" in tags or "remove-input" in tags, (
                f"{path.name}: a code cell after a solution shows its code: "
                f"{following.source[:80]!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_check_cells_that_fail_on_the_stub_are_tagged(path):
    for cell in _cells(path):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                assert "raises-exception" in cell.metadata.get("tags", []), (
                    f"{path.name}: a stored error in a cell not tagged raises-exception"
                )
                assert output.ename in {"CheckFailed", "NotImplementedError"}, (
                    f"{path.name}: a check cell raised {output.ename}, not the stub's failure"
                )


CHAPTER_MENTION = re.compile(r"\b[Cc]hapters? (\d+)")
LINKED_MENTION = re.compile(r"\[[^\]]*?\b[Cc]hapters? (\d+)[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """Markdown without code: fenced blocks and inline code spans removed."""
    text = re.sub(r"^(`{3,}|~{3,})(?!\{(exercise|solution))[^\n]*\n.*?^\1\s*$", "", text,
                  flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_mention_is_a_link_to_an_existing_chapter(path):
    own = int(path.name[:2])
    for cell in _cells(path):
        if cell.cell_type != "markdown":
            continue
        text = _prose(cell.source)
        linked = {m.start(1) for m in LINKED_MENTION.finditer(text)}
        for match in LINKED_MENTION.finditer(text):
            number, target = int(match.group(1)), match.group(2).split("#")[0]
            assert number in CHAPTER_FILES, f"{path.name}: links chapter {number}, which does not exist"
            if target:
                assert Path(target).name == CHAPTER_FILES[number], (
                    f"{path.name}: 'Chapter {number}' links to {target}, not {CHAPTER_FILES[number]}"
                )
        for match in CHAPTER_MENTION.finditer(text):
            number = int(match.group(1))
            if number == own or match.start(1) in linked:
                continue
            if re.search(r"\*\s*,\s*$", text[:match.start()]):
                continue  # "*Another Book*, chapter 3": a chapter of a cited book
            # A mention inside a link's text is covered above; any other is a missing link.
            start = text.rfind("[", 0, match.start())
            close = text.find("](", match.end())
            in_link = start != -1 and close != -1 and "]" not in text[start:match.start()]
            assert in_link, f"{path.name}: 'Chapter {number}' is not a link: ...{text[max(0, match.start()-40):match.end()+20]!r}"
            assert number in CHAPTER_FILES, f"{path.name}: mentions chapter {number}, which does not exist"


PROMISE = re.compile(r"\b(a |the )?(later|future|coming|next|upcoming) chapters?\b", re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_text_promises_an_unnamed_later_chapter(path):
    for cell in _cells(path):
        if cell.cell_type != "markdown":
            continue
        for match in PROMISE.finditer(_prose(cell.source)):
            text = _prose(cell.source)
            around = text[match.start():match.end() + 80]
            assert re.search(r"\]\([^)]*\.ipynb", around), (
                f"{path.name}: promises a {match.group(0)!r} without linking it: {around!r}"
            )


# Code in the book's pages: fenced code and code cells of the Markdown pages, and fenced
# code in the chapters' Markdown cells (their code cells are checked by ruff). Other
# directives ({table}, {exercise}, ...) hold text, which wraps.
CODE_BLOCK = re.compile(r"^(`{3,})(\S*)[^\n]*\n(.*?)^\1\s*$", re.MULTILINE | re.DOTALL)
MAX_CODE_LINE = 88


def _code_blocks_of_pages() -> list[tuple[str, str]]:
    blocks = []
    for page in sorted(ROOT.glob("*.md")):
        if page.name in {"README.md", "CONTRIBUTING.md"}:
            continue
        blocks += [(page.name, m.group(3)) for m in CODE_BLOCK.finditer(page.read_text())
                   if not m.group(2).startswith("{") or m.group(2) == "{code-cell}"]
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                blocks += [(path.name, m.group(3)) for m in CODE_BLOCK.finditer(cell.source)
                           if not m.group(2).startswith("{")]
    return blocks


def test_code_on_the_pages_fits_88_characters():
    """The book's code box shows 88 characters at 1280 px (tests/test_book.py checks it
    in the browser); this finds a longer line in the source, without a build."""
    long = [f"{name}: {len(line)} characters: {line.strip()[:60]!r}"
            for name, code in _code_blocks_of_pages()
            for line in code.splitlines() if len(line) > MAX_CODE_LINE]
    assert not long, f"code lines over {MAX_CODE_LINE} characters: {long}"
