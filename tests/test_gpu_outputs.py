"""Stored GPU outputs survive a CPU re-execution, and only while their code is unchanged.

A GPU machine's outputs of the cells tagged ``gpu`` are merged into the chapters by
``_ext/gpu_outputs.py merge``, which stamps each cell with ``gpu_run`` (device, software,
SHA-256 of the source that ran). ``make execute`` (``_ext/execute.py``) re-runs the
notebooks on a CPU, where those cells only print that they skip themselves; it must put
the stored outputs back, and drop them once the cell's code differs from the code that ran
(issue 33).
"""

import shutil
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
from execute import STAMP, execute, is_gpu_cell, source_digest  # noqa: E402

# The quickest chapter with a stamped gpu cell (about 3 s on 2 cores).
CHAPTER = ROOT / "chapters" / "02_trainable_qkv.ipynb"
SKIPPING = "No CUDA GPU on this machine: skipping this GPU cell."

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="on a GPU, execute() runs the gpu cells for real")


def stamped_cells(nb: nbformat.NotebookNode) -> dict[int, nbformat.NotebookNode]:
    return {i: cell for i, cell in enumerate(nb.cells)
            if is_gpu_cell(cell) and STAMP in cell.metadata}


def stream_text(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs
                   if out.output_type == "stream")


def test_a_cpu_re_execution_keeps_the_stored_gpu_outputs():
    stored = nbformat.read(CHAPTER, as_version=4)
    gpu = stamped_cells(stored)
    assert gpu, f"{CHAPTER.name} has no gpu cell with a stored GPU run"
    for cell in gpu.values():
        assert cell.metadata[STAMP]["source_sha256"] == source_digest(cell.source)
        assert SKIPPING not in stream_text(cell)  # a real GPU run is stored

    ran = execute(CHAPTER)  # not written back: the chapter on disk stays as it is

    assert len(ran.cells) == len(stored.cells)
    for index, cell in gpu.items():
        assert ran.cells[index].outputs == cell.outputs, f"cell {index}'s output changed"
        assert ran.cells[index].metadata[STAMP] == cell.metadata[STAMP]
    # Every other cell was executed afresh: the stored GPU outputs are put back, no more.
    code = [i for i, c in enumerate(ran.cells) if c.cell_type == "code" and i not in gpu]
    assert all(ran.cells[i].execution_count for i in code)


def edited_copy(tmp_path: Path, keep_text_check: bool) -> tuple[Path, int]:
    """Chapter 2 in tmp_path with its stamped gpu cell's code edited; the cell's index."""
    copy = tmp_path / CHAPTER.name
    shutil.copy(CHAPTER, copy)
    nb = nbformat.read(copy, as_version=4)
    index, cell = next(iter(stamped_cells(nb).items()))
    cell.source = cell.source.replace("matches the CPU result", "agrees with the CPU")
    assert cell.metadata[STAMP]["source_sha256"] != source_digest(cell.source)
    if not keep_text_check:  # the hidden cell that ties the text to the stored run
        nb.cells = [c for c in nb.cells if is_gpu_cell(c) or STAMP not in c.source]
    nbformat.write(nb, copy)
    return copy, index


def test_a_gpu_cell_whose_code_changed_loses_its_stored_output_and_stamp(tmp_path):
    copy, index = edited_copy(tmp_path, keep_text_check=False)

    ran = execute(copy)

    changed = ran.cells[index]
    assert STAMP not in changed.metadata
    assert stream_text(changed).strip() == SKIPPING  # the CPU's own output, not the GPU's
    assert "NVIDIA" not in stream_text(changed)


def test_the_text_about_a_gpu_run_fails_its_check_once_the_cell_changed(tmp_path):
    # The chapter's sentence about the H200 run is checked against the stored run of the
    # cell's present code: after an edit, re-executing stops until the text is changed.
    copy, _ = edited_copy(tmp_path, keep_text_check=True)
    with pytest.raises(CellExecutionError, match="the GPU cell's stored run"):
        execute(copy)
