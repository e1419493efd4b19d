"""The instructors' page and the landing page: what they show works, and agrees with the repo.

The assignment files (``test_assignment.py``, ``grade.py``, otter's test files) and the
install line are read from instructors.md itself, so these tests grade with exactly what the
page tells an instructor to write.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTORS = (ROOT / "instructors.md").read_text()
INTRO = (ROOT / "intro.md").read_text()
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
PYPROJECT_VERSION = re.search(
    r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M
).group(1)
# The landing page's running times come from the notebooks (make execute writes them).
chapter_times = runpy.run_path(str(ROOT / "_ext" / "chapter_times.py"))
running_seconds = chapter_times["running_seconds"]

RIGHT = '''
import torch


def my_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def my_causal_mask(num_tokens):
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
'''
# Right softmax, causal mask with the polarity flipped.
WRONG = RIGHT.replace(".tril()", ".triu(diagonal=1)")


def page_block(pattern: str) -> str:
    """The ```python block of instructors.md whose first line matches ``pattern``."""
    found = re.search(rf"```python\n({pattern}\n.*?)```", INSTRUCTORS, re.S)
    assert found, f"instructors.md has no ```python block starting {pattern!r}"
    return found.group(1)


def assignment(folder: Path, submission: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submission.py").write_text(submission)
    (folder / "test_assignment.py").write_text(page_block(r"# test_assignment\.py"))
    return folder


# --- install line -------------------------------------------------------------------------


def test_install_line_is_the_configured_repository_at_the_release_tag():
    url, ref = CONFIG["repository"]["url"], CONFIG["repository"]["attnlib_ref"]
    assert ref == f"v{PYPROJECT_VERSION}"
    # One command, continued over two lines to fit the code box's 88 characters.
    lines = re.findall(r'pip install \\\n\s*"attnlib @ git\+[^"]*"', INSTRUCTORS)
    assert [re.sub(r"\\\n\s*", "", line) for line in lines] == [
        f'pip install "attnlib @ git+{url}@{ref}"'], lines


# --- the pytest plugin --------------------------------------------------------------------


def test_plugin_command_reports_the_checkers_message_alone(tmp_path):
    folder = assignment(tmp_path, WRONG)
    # One ordinary failure, which the plugin must leave as pytest reports it.
    (folder / "test_other.py").write_text("def test_plain():\n    x = 1\n    assert x == 2\n")
    command = re.search(r"```bash\n(pytest .*?)\n```", INSTRUCTORS).group(1)
    assert "-p attnlib.exercises.pytest_plugin" in command and "test_assignment.py" in command
    args = shlex.split(command) + ["test_other.py"]
    result = subprocess.run([sys.executable, "-m", *args], cwd=folder, capture_output=True,
                            text=True, env={**os.environ, "COLUMNS": "100"}, timeout=120)
    out = result.stdout
    assert result.returncode == 1, out
    assert "2 failed, 1 passed" in out
    assert "\nCheckFailed: fn(5): the polarity is flipped" in out
    assert "FAILED test_assignment.py::test_causal_mask - CheckFailed: fn(5)" in out
    # Neither the checker's source nor attnlib's private module is shown ...
    assert "def check_causal_mask" not in out and "_common" not in out
    # ... but an ordinary failure keeps pytest's full report.
    assert "assert x == 2" in out and "AssertionError" in out


# --- grade.py -----------------------------------------------------------------------------


@pytest.mark.parametrize(("submission", "score"), [(RIGHT, "2/2"), (WRONG, "1/2"),
                                                   ("raise SystemError('no')", "0/2")])
def test_grade_script_scores_a_submission(tmp_path, monkeypatch, capsys, submission, score):
    (tmp_path / "grade.py").write_text(page_block(r"# grade\.py.*?"))
    (tmp_path / "submission.py").write_text(submission)
    # Run as `python grade.py submission.py` would, in this process (torch is imported once).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["grade.py", "submission.py"])
    runpy.run_path("grade.py", run_name="__main__")
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"score: {score}", out
    if submission == WRONG:
        assert "my_causal_mask: 0/1: fn(5): the polarity is flipped" in out


# --- otter-grader -------------------------------------------------------------------------


def test_otter_grades_a_right_and_a_wrong_submission(tmp_path):
    pytest.importorskip("otter")
    otter = Path(sys.executable).with_name("otter")
    blocks = re.findall(r"```python\n(# tests/\w+\.py\n.*?)```", INSTRUCTORS, re.S)
    assert len(blocks) == 2
    for block in blocks:
        path = tmp_path / block.split("\n", 1)[0].removeprefix("# ")
        path.parent.mkdir(exist_ok=True)
        path.write_text(block)
    # The pinned install line, as the page says, for the grading image.
    install = re.search(r'pip install \\\n\s*"(attnlib @ .*?)"', INSTRUCTORS).group(1)
    (tmp_path / "requirements.txt").write_text(install + "\n")
    commands = re.search(r"```bash\n(otter generate .*?)\n```", INSTRUCTORS, re.S).group(1)
    generate, run = [shlex.split(line) for line in commands.splitlines()]
    subprocess.run([str(otter), *generate[1:]], cwd=tmp_path, check=True, capture_output=True,
                   timeout=120)
    with zipfile.ZipFile(tmp_path / "autograder.zip") as archive:
        assert f"- {install}" in archive.read("environment.yml").decode()
    # Both submissions graded at once (each run starts a kernel: seconds).
    runs = {}
    for name, submission in [("right", RIGHT), ("wrong", WRONG)]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "submission.py").write_text(submission)
        argv = [str(otter), run[1], *[str(tmp_path / a) if a.endswith(".zip") else a
                                      for a in run[2:]]]
        runs[name] = (folder, subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True))
    scores = {}
    for name, (folder, process) in runs.items():
        out, _ = process.communicate(timeout=300)
        assert process.returncode == 0, out
        results = json.loads((folder / "results.json").read_text())
        scores[name] = {t["name"]: (t["score"], t["max_score"], t["output"])
                        for t in results["tests"] if "score" in t}
    assert {k: v[:2] for k, v in scores["right"].items()} == {
        "softmax": (1.0, 1.0), "causal_mask": (1.0, 1.0)}
    assert {k: v[:2] for k, v in scores["wrong"].items()} == {
        "softmax": (1.0, 1.0), "causal_mask": (0, 1.0)}
    assert "CheckFailed: fn(5): the polarity is flipped" in scores["wrong"]["causal_mask"][2]


# --- the landing page ---------------------------------------------------------------------


def test_landing_page_version_citation_and_authors_agree_with_pyproject():
    assert f"**version {PYPROJECT_VERSION}**" in INTRO
    assert f"`v{PYPROJECT_VERSION}`" in INTRO
    bibtex = re.search(r"```bibtex\n(.*?)```", INTRO, re.S).group(1)
    assert f"version = {{{PYPROJECT_VERSION}}}" in bibtex
    assert f"url     = {{{CONFIG['repository']['url']}}}" in bibtex
    assert "author  = {{The Self-Attention, Step by Step authors}}" in bibtex
    assert CONFIG["author"] == "The Self-Attention, Step by Step authors"
    assert "the\nSelf-Attention, Step by Step authors" in INTRO
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["version"] == PYPROJECT_VERSION
    assert citation["cff-version"] == "1.2.0"
    assert citation["title"] == CONFIG["title"]
    assert citation["authors"] == [{"name": CONFIG["author"]}]
    assert citation["repository-code"] == CONFIG["repository"]["url"]


def test_feedback_buttons_are_on():
    html = CONFIG["html"]
    assert html["use_issues_button"] and html["use_edit_page_button"]
    assert html["use_repository_button"]


def _chapter_rows() -> dict[int, list[str]]:
    table = re.search(r":name: chapter-times\n(.*?)```", INTRO, re.S).group(1)
    rows = {}
    for line in table.splitlines():
        found = re.match(r"\| (\d+)\. ", line)
        if found:
            rows[int(found.group(1))] = [cell.strip() for cell in line.strip("|").split("|")]
    return rows


def test_every_chapter_has_its_times_and_gpu_needs_on_the_landing_page():
    notebooks = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    rows = _chapter_rows()
    assert sorted(rows) == [int(p.name[:2]) for p in notebooks]
    for path in notebooks:
        nb = json.loads(path.read_text())
        name, reading, running, gpu = rows[int(path.name[:2])]
        # The chapter's name as the navigation shows it: the notebook's title.
        title = nb["cells"][0]["source"]
        title = ("".join(title) if isinstance(title, list) else title).splitlines()[0]
        assert name.split(". ", 1)[1].replace(r"$\sqrt{d_k}$", "√dₖ") == title[2:], (name, title)
        # Reading: words of the markdown cells at 200 a minute, rounded to 5 minutes. A
        # chapter that has since grown or shrunk by more than one step needs its row updated.
        words = sum(len("".join(c["source"]).split()) for c in nb["cells"]
                    if c["cell_type"] == "markdown")
        estimate = max(5, 5 * round(words / 1000))
        minutes = int(re.fullmatch(r"(\d+)&nbsp;min", reading).group(1))
        assert abs(minutes - estimate) <= 5, (path.name, words, reading)
        # The running time is the notebook's own record of its last `make execute`
        # (_ext/chapter_times.py writes it into the table): a record, not a timing assert.
        assert running == f"{round(running_seconds(path))}&nbsp;s", (
            f"{path.name}: the table says {running}; run `python _ext/chapter_times.py`")
        gpu_cells = sum("gpu" in c["metadata"].get("tags", []) for c in nb["cells"]
                        if c["cell_type"] == "code")
        if gpu_cells == 0:
            assert gpu == "no", (path.name, gpu)
        else:
            assert str(gpu_cells) in gpu, (path.name, gpu_cells, gpu)


# --- notebooks.zip ------------------------------------------------------------------------


def test_notebooks_zip_holds_every_chapter(tmp_path):
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        from course_downloads import ZIP_NAME, write_notebooks_zip
    finally:
        sys.path.remove(str(ROOT / "_ext"))
    target = write_notebooks_zip(ROOT, tmp_path / "html")
    assert target == tmp_path / "html" / ZIP_NAME
    # The learner notebooks (no solutions) and the solutions notebooks, as committed in
    # notebooks/ (test_learner_notebooks checks that those are the chapters' own).
    names = [p.name for p in sorted((ROOT / "chapters").glob("*.ipynb"))]
    expected = sorted([f"chapters/{n}" for n in names]
                      + [f"chapters/solutions/{n}" for n in names])
    with zipfile.ZipFile(target) as archive:
        assert sorted(archive.namelist()) == expected
        for name in names:
            assert archive.read(f"chapters/{name}") == (ROOT / "notebooks" / name).read_bytes()
            assert archive.read(f"chapters/solutions/{name}") == (
                ROOT / "notebooks" / "solutions" / name).read_bytes()
            assert b"{solution}" not in archive.read(f"chapters/{name}")
    # The landing page links it with the role the extension registers.
    assert "{notebooks-zip}`notebooks.zip`" in INTRO
    assert "course_downloads" in CONFIG["sphinx"]["local_extensions"]
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        write_notebooks_zip(tmp_path / "empty", tmp_path / "out")
