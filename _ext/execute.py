"""Execute the chapters top to bottom, in place, under the pinned CPU arithmetic.

``make execute`` runs this. Each notebook runs in a fresh kernel (nbclient) from its
own folder, with the settings of ``_ext/numerics.env`` in the kernel's environment,
so its stored outputs reproduce on any x86-64 CPU with AVX2 (see chapters/conftest.py,
which pins nbval's kernels the same way).

A cell tagged ``gpu`` may hold the outputs of a run on a GPU machine, merged by
``_ext/gpu_outputs.py merge``, which stamps the cell's metadata with ``gpu_run``: the
device, the software and the SHA-256 of the cell's source it ran. On a machine without
CUDA such a cell only prints that it skips itself, so after executing the notebook
this script puts the stored GPU outputs back, as long as the cell's source is still
the source that ran on the GPU. A cell whose source changed since has no GPU output
of its own any more: it keeps the CPU's "skipping" output and loses its stamp, and
the page must say it is not yet run on a GPU (issue 33).

Usage, from the repository's root:
    python _ext/execute.py chapters/01_simplified_attention.ipynb ...
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
STAMP = "gpu_run"


def pinned_numerics() -> dict[str, str]:
    """The ``NAME=value`` settings of ``_ext/numerics.env`` (``#`` starts a comment)."""
    text = (ROOT / "_ext" / "numerics.env").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def source_digest(source: str) -> str:
    """SHA-256 of a cell's source, the key that ties a stored GPU output to its code."""
    return hashlib.sha256(source.encode()).hexdigest()


def is_gpu_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and "gpu" in cell.metadata.get("tags", [])


def stored_gpu_outputs(nb: nbformat.NotebookNode) -> dict[int, tuple]:
    """Index -> (outputs, stamp) of the ``gpu`` cells whose stamp matches their source."""
    kept = {}
    for index, cell in enumerate(nb.cells):
        stamp = cell.metadata.get(STAMP) if is_gpu_cell(cell) else None
        if stamp and stamp.get("source_sha256") == source_digest(cell.source):
            kept[index] = (cell.outputs, stamp)
    return kept


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def execute(path: Path, timeout: int = 300, env: dict[str, str | None] | None = None,
            keep_gpu_outputs: bool = True) -> nbformat.NotebookNode:
    """Run the notebook at ``path`` in a fresh kernel and return it, outputs in place.

    ``env`` replaces the kernel's environment variables it names (default: the pinned
    numerics; ``None`` unsets one). Stamped GPU outputs are put back unless CUDA is here or
    ``keep_gpu_outputs`` is false; stamps that no longer match their cell are dropped.
    """
    nb = nbformat.read(path, as_version=4)
    kept = stored_gpu_outputs(nb) if keep_gpu_outputs and not cuda_available() else {}
    for cell in nb.cells:
        cell.metadata.pop(STAMP, None)
    settings: dict[str, str | None] = dict(pinned_numerics()) if env is None else env
    saved = {name: os.environ.get(name) for name in settings}
    for name, value in settings.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    for index, (outputs, stamp) in kept.items():
        nb.cells[index].outputs = outputs
        nb.cells[index].metadata[STAMP] = stamp
    return nb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args()
    for path in args.notebooks:
        start = time.perf_counter()
        nb = execute(path, timeout=args.timeout)
        nbformat.write(nb, path)
        kept = sum(1 for cell in nb.cells if STAMP in cell.metadata)
        note = f", {kept} stored GPU output(s) kept" if kept else ""
        print(f"{path}: executed in {time.perf_counter() - start:.0f} s{note}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
