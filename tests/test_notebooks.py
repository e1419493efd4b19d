"""The chapter notebooks follow the course's conventions (CONTRIBUTING.md).

nbval checks what each notebook computes; these tests check how the notebooks
are put together: the Colab setup cell agrees with _config.yml, every notebook
is in the table of contents and the README, outputs come from one clean run,
and GPU cells guard themselves.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def pip_requirements(source: str) -> list[str]:
    """What the cell's ``pip install`` call installs: its arguments that are not options."""
    import ast

    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and node.args and isinstance(node.args[0], ast.List)]
    installs = []
    for call in calls:
        words = [ast.unparse(e) for e in call.args[0].elts]
        if "'install'" in words:
            rest = words[words.index("'install'") + 1:]
            installs += [w for w in rest if not w.startswith("'-")]
    return [w.replace("'", '"') for w in installs]


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def torch_floor() -> tuple[int, int]:
    """The oldest torch the course claims: pyproject.toml's ``torch>=X.Y`` (make torch-floor)."""
    match = re.search(r'"torch>=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml's dependencies name torch>=X.Y"
    return int(match[1]), int(match[2])


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2


def test_the_colab_ref_is_this_release_of_attnlib():
    import attnlib

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert CONFIG["repository"]["attnlib_ref"] == f"v{attnlib.__version__}"
    assert f'version = "{attnlib.__version__}"' in pyproject


def test_config_turns_on_colab_and_names_the_repository_once():
    url = CONFIG["repository"]["url"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url), url
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert (ROOT / "_config.yml").read_text().count(url) == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_installs_attnlib_from_the_configured_repository(path):
    nb = nbformat.read(path, as_version=4)
    first = code_cells(nb)[0].source
    url = CONFIG["repository"]["url"]
    ref = CONFIG["repository"]["attnlib_ref"]
    assert f'ATTNLIB_REPO = "{url}"' in first, f"{path.name}: setup cell does not install from {url}"
    assert f'ATTNLIB_REF = "{ref}"' in first, f"{path.name}: setup cell does not pin ref {ref}"
    assert 'f"attnlib[plot] @ git+{ATTNLIB_REPO}@{ATTNLIB_REF}"' in first, (
        "the setup cell installs attnlib with its plot extra: every chapter draws")
    assert 'importlib.util.find_spec("attnlib") is None' in first, "must do nothing where attnlib exists"
    assert "importlib.invalidate_caches()" in first, "a fresh install must be importable at once"
    assert "-e" not in first.split(), "Colab installs attnlib non-editable"
    assert pip_requirements(first) == ['f"attnlib[plot] @ git+{ATTNLIB_REPO}@{ATTNLIB_REF}"'], (
        "the setup cell installs attnlib and pins nothing else (Colab's torch stays)")
    major, minor = torch_floor()
    assert re.search(rf"torch\.__version__[^\n]*< \({major}, {minor}\)", first), (
        f"the setup cell checks torch >= {major}.{minor}, pyproject's floor")
    assert "raise RuntimeError" in first and f"needs torch {major}.{minor} or newer" in first, (
        "a torch below the floor stops the notebook with a clear error")
    assert "remove-cell" in code_cells(nb)[0].metadata.get("tags", []), "setup is hidden in the book"
    # Every notebook's setup cell is the same text, so one fix reaches them all.
    reference = code_cells(nbformat.read(NOTEBOOKS[0], as_version=4))[0].source
    assert first == reference
    assert not code_cells(nb)[0].outputs, "the setup cell prints nothing locally"


def test_the_torch_floor_is_the_same_wherever_it_is_stated():
    """pyproject's floor is the one the README, CONTRIBUTING.md, the instructors' page and
    make torch-floor (which checks it: unit tests and every notebook) state."""
    floor = "{}.{}".format(*torch_floor())
    checked = re.search(r"^TORCH_FLOOR\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert checked and checked[1].startswith(f"{floor}."), (
        f"make torch-floor checks torch {checked and checked[1]}, not the floor {floor}")
    readme = (ROOT / "README.md").read_text()
    assert f"`torch>={floor}`" in readme and f"({checked[1]}," in readme, (
        "the README's install line and its make torch-floor sentence name the floor")
    assert f"`torch>={floor}`" in (ROOT / "CONTRIBUTING.md").read_text()
    assert f"torch {floor} or newer" in (ROOT / "instructors.md").read_text()
    stated = re.findall(r"torch ?>= ?(\d+\.\d+)|torch (\d+\.\d+) or newer",
                        readme + (ROOT / "CONTRIBUTING.md").read_text()
                        + (ROOT / "instructors.md").read_text())
    assert {a or b for a, b in stated} == {floor}, f"another floor is stated: {stated}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_listed_in_the_toc_and_the_readme(path):
    stem = f"chapters/{path.stem}"
    assert stem in (ROOT / "_toc.yml").read_text(), f"{stem} missing from _toc.yml"
    assert f"{stem}.ipynb" in (ROOT / "README.md").read_text(), f"{stem}.ipynb missing from README.md"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_was_saved_from_one_clean_run(path):
    nb = nbformat.read(path, as_version=4)
    counts = [c.execution_count for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts}"
    for cell in code_cells(nb):
        for out in cell.outputs:
            if "raises-exception" not in cell.metadata.get("tags", []):
                # Only an exercise's check cell may store its (expected) failure.
                assert out.output_type != "error", f"{path.name}: stored error {out.get('ename')}"
            if out.output_type == "stream" and out.name == "stderr":
                assert "Warning" not in out.text, f"{path.name}: stored warning {out.text[:200]}"
    second = code_cells(nb)[1].source
    assert "torch.manual_seed(" in second and "torch.set_printoptions(precision=4" in second


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_gpu_cells_guard_themselves(path):
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):
        if "gpu" in cell.metadata.get("tags", []):
            assert "nbval-ignore-output" in cell.metadata.get("tags", []), "GPU output varies"
            assert "torch.cuda.is_available()" in cell.source, "a gpu cell must skip itself without CUDA"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags_not_visible_comments(path):
    nb = nbformat.read(path, as_version=4)
    for cell in code_cells(nb):
        assert "NBVAL_" not in cell.source, f"{path.name}: use the nbval-ignore-output cell tag"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_package_code_is_pasted_into_a_notebook(path):
    """Classes live in attnlib; a notebook that defines one drifts from the package."""
    nb = nbformat.read(path, as_version=4)
    package_names = {"SelfAttention_v1", "SelfAttention_v2", "CausalAttention",
                     "MultiHeadAttentionWrapper", "MultiHeadAttention"}
    for cell in code_cells(nb):
        for name in package_names:
            assert f"class {name}(" not in cell.source, f"{path.name} redefines attnlib.{name}"
