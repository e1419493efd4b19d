"""Merge the ``gpu`` cells' outputs of a GPU run into the chapters, stamped with provenance.

A GPU machine executes whole notebooks (``../shared/tools/gpu/``); only their cells
tagged ``gpu`` are worth keeping, since every other cell's output is the pinned CPU
run's. This copies a ``gpu`` cell's outputs where the executed notebook has a cell of
identical source at the same index, and stamps the cell's metadata with ``gpu_run``:
the run's label, device and software, and the SHA-256 of the source that ran. The
stamp is what lets ``_ext/execute.py`` keep the outputs through a CPU re-execution,
and drop them once the cell's code changes.

Usage, from the repository's root:
    python _ext/gpu_outputs.py merge RUN_DIR --label 2026-11-28-h200 \\
        --device "NVIDIA H200" --software "torch 2.11.0+cu130, Triton 3.6.0" chapters/*.ipynb
    python _ext/gpu_outputs.py list chapters/*.ipynb
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat
from execute import STAMP, is_gpu_cell, source_digest, stored_gpu_outputs


def merge(run_dir: Path, notebooks: list[Path], label: str, device: str,
          software: str) -> dict[str, tuple[list[int], list[int]]]:
    """Copy and stamp; return ``{notebook: (merged indices, indices whose source differs)}``."""
    report = {}
    for path in notebooks:
        executed = run_dir / path.name
        if not executed.exists():
            continue
        ours = nbformat.read(path, as_version=4)
        theirs = nbformat.read(executed, as_version=4)
        merged, differs = [], []
        for index, cell in enumerate(ours.cells):
            if not is_gpu_cell(cell):
                continue
            if index < len(theirs.cells) and theirs.cells[index].source == cell.source:
                cell.outputs = theirs.cells[index].outputs
                cell.metadata[STAMP] = {"run": label, "device": device, "software": software,
                                        "source_sha256": source_digest(cell.source)}
                merged.append(index)
            else:
                differs.append(index)
        nbformat.write(ours, path)
        report[path.name] = (merged, differs)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge a run's gpu outputs")
    m.add_argument("run_dir", type=Path)
    m.add_argument("--label", required=True)
    m.add_argument("--device", required=True)
    m.add_argument("--software", required=True)
    m.add_argument("notebooks", nargs="+", type=Path)
    ls = sub.add_parser("list", help="which gpu cells hold a stored GPU output")
    ls.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args()
    if args.command == "merge":
        for name, (merged, differs) in merge(args.run_dir, args.notebooks, args.label,
                                             args.device, args.software).items():
            extra = f"; source differs, not merged: {differs}" if differs else ""
            print(f"{name}: merged gpu cells {merged}{extra}")
    else:
        for path in args.notebooks:
            nb = nbformat.read(path, as_version=4)
            gpu = [i for i, cell in enumerate(nb.cells) if is_gpu_cell(cell)]
            if gpu:
                stored = stored_gpu_outputs(nb)
                print(f"{path.name}: gpu cells {gpu}; with a stored GPU run: "
                      + (", ".join(f"{i} ({stored[i][1]['run']})" for i in stored) or "none"))


if __name__ == "__main__":
    main()
