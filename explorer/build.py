"""Build the live explorer's files into explorer/site/explorer/ (run by ``make book``).

1. ``npm ci`` installs onnxruntime-web at the version of package-lock.json
   (skipped when node_modules already holds it), and its WebAssembly build is
   copied to ``ort/``: ``ort.wasm.min.js``, the loader it imports and the
   SIMD ``.wasm`` (about 11 MB, the smallest build of that version).
2. :func:`attnlib.export.write_explorer_models` trains chapter 10's models as
   the chapter does (about 20 s) and writes them, with chapter 6's layer, to
   ``models/`` as ONNX files checked against PyTorch with onnxruntime. A stamp
   (a hash of attnlib's sources and the pinned arithmetic) skips this when
   nothing changed.

Without npm or a network connection the book is still built: ``models.json``
then says ``"onnxruntime_web": null``, the explorer shows a sentence saying so
and the page keeps its still figure, and this script prints why.
The book copies explorer/site/ to its root (``html_extra_path`` in _config.yml).

Usage: ``python explorer/build.py [--force]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "explorer" / "site" / "explorer"
ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
DIST = ROOT / "node_modules" / "onnxruntime-web" / "dist"


def _installed_version() -> str | None:
    """The onnxruntime-web version in node_modules, if it is the lock file's."""
    try:
        lock = json.loads((ROOT / "package-lock.json").read_text())
        wanted = lock["packages"]["node_modules/onnxruntime-web"]["version"]
        have = json.loads((DIST.parent / "package.json").read_text())["version"]
    except (OSError, KeyError, ValueError):
        return None
    return have if have == wanted and all((DIST / f).is_file() for f in ORT_FILES) else None


def install_ort() -> str | None:
    """``npm ci`` if needed, then copy the wasm build; the version, or None on failure."""
    version = _installed_version()
    if version is None:
        npm = shutil.which("npm")
        if npm is None:
            print("explorer: npm is missing (apt-get install nodejs npm): the book is built "
                  "without the live explorer, whose pages show a still figure instead.")
            return None
        result = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        version = _installed_version()
        if result.returncode != 0 or version is None:
            print("explorer: npm could not install onnxruntime-web (no network?): the book is "
                  "built without the live explorer, whose pages show a still figure instead. "
                  f"npm said:\n{result.stderr.strip()[-1500:]}")
            return None
    target = SITE / "ort"
    target.mkdir(parents=True, exist_ok=True)
    for name in ORT_FILES:
        shutil.copy2(DIST / name, target / name)
    return version


def _stamp() -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "attnlib").rglob("*.py")) + [ROOT / "_ext" / "numerics.env"]:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def write_models(force: bool = False) -> dict:
    """The ONNX files and models.json, rewritten when attnlib changed (or ``force``)."""
    import torch

    from attnlib.export import write_explorer_models

    out = SITE / "models"
    stamp_file = ROOT / "explorer" / ".models-stamp"
    meta_file = out / "models.json"
    if not force and stamp_file.is_file() and meta_file.is_file() \
            and stamp_file.read_text() == _stamp():
        return json.loads(meta_file.read_text())
    torch.set_num_threads(1)  # as chapter 10 trains (chapter_10_models also sets it)
    meta = write_explorer_models(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp_file.write_text(_stamp())
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="retrain and re-export")
    args = parser.parse_args(argv)
    version = install_ort()
    meta = write_models(args.force)
    meta["onnxruntime_web"] = version
    (SITE / "models" / "models.json").write_text(json.dumps(meta, indent=1) + "\n")
    files = [p for p in SITE.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    print(f"explorer: {len(files)} files, {total:,} bytes in {SITE.relative_to(ROOT)} "
          f"(onnxruntime-web {version or 'missing'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
