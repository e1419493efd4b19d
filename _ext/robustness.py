"""Run every chapter under other roundoff and check that no claim breaks (issue 25).

The stored outputs are made under the pinned arithmetic of ``_ext/numerics.env``. A
reader's laptop or Colab is not pinned: other vector kernels (AVX-512 or none), another
MKL code path, another thread count round differently. A claim that a notebook asserts
(``attnlib.expect``, ``assert``) must hold under all of them, or it was too narrow. This
executes each notebook, without saving it, under each setting below, two at a time, and
reports for each: whether every cell ran (a cell tagged ``raises-exception`` may raise,
as in the book), and how many code cells printed text other than the stored text
(cells tagged ``nbval-ignore-output`` and images not counted): how far the figures move.
It exits with 1 if any notebook failed under any setting.

Usage, from the repository's root (``make robustness`` runs all the chapters):
    python _ext/robustness.py chapters/10_watching_attention_learn.ipynb ...
    python _ext/robustness.py chapters/13_*.ipynb --settings one-thread native
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from execute import execute, pinned_numerics

PINNED = pinned_numerics()
SETTINGS: dict[str, dict[str, str | None]] = {
    "pinned": dict(PINNED),
    "aten-default": {**PINNED, "ATEN_CPU_CAPABILITY": "default"},
    "mkl-compatible": {**PINNED, "MKL_CBWR": "COMPATIBLE"},
    "one-thread": {**PINNED, "OMP_NUM_THREADS": "1"},
    # The machine's own choices, as on a reader's laptop: nothing pinned.
    "native": {name: None for name in PINNED},
}


def text_of(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append(out.get("ename", ""))
    return "".join(parts)


def compared(cell: nbformat.NotebookNode) -> bool:
    tags = cell.metadata.get("tags", [])
    return cell.cell_type == "code" and "nbval-ignore-output" not in tags and "gpu" not in tags


def run_one(setting: str, path: Path) -> dict:
    """Execute one notebook under one setting (in this process); a JSON-able report."""
    stored = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        ran = execute(path, env=SETTINGS[setting], keep_gpu_outputs=False)
    except Exception as error:  # nbclient's CellExecutionError names the cell
        return {"ok": False, "seconds": time.perf_counter() - start,
                "error": str(error).strip().splitlines()[-1][:300], "moved": None}
    moved = [i for i, (old, new) in enumerate(zip(stored.cells, ran.cells, strict=True))
             if compared(old) and text_of(old) != text_of(new)]
    return {"ok": True, "seconds": time.perf_counter() - start, "error": "", "moved": moved}


def run_in_child(setting: str, path: Path) -> dict:
    """Each run in its own process, so settings never leak between concurrent runs."""
    result = subprocess.run([sys.executable, __file__, "--child", setting, str(path)],
                            capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return {"ok": False, "seconds": 0.0, "error": result.stderr.strip()[-300:],
                "moved": None}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.notebooks[0])))
        return 0
    start = time.perf_counter()
    jobs = [(s, p) for s in args.settings for p in args.notebooks]
    with ThreadPoolExecutor(args.jobs) as pool:
        reports = list(pool.map(lambda job: run_in_child(*job), jobs))
    failed = 0
    for (setting, path), report in zip(jobs, reports, strict=True):
        if report["ok"]:
            moved = report["moved"]
            status = f"ok, {len(moved)} cell(s) print other text" + (f" {moved}" if moved else "")
        else:
            failed += 1
            status = f"FAILED: {report['error']}"
        print(f"{setting:15s} {path.name:40s} {report['seconds']:5.0f} s  {status}")
    minutes = (time.perf_counter() - start) / 60
    print(f"{len(jobs)} runs, {failed} failed, {minutes:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
