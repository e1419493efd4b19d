"""attnlib whole when pip-installed: the wheel alone, in a fresh environment, runs the book.

The package list in pyproject.toml once predated attnlib.distributed, so an installed
attnlib (pip, or the Colab setup cell) lacked chapter 12's package while every test
here passed, since they import attnlib from the checkout. This builds the wheel from a
clean clone, installs it without its dependencies into a fresh virtual environment
that sees the project environment's other packages (torch, matplotlib, triton, ...) as
a read-only layer, and, from a folder without attnlib's sources:

* imports every module of attnlib that the wheel should hold (every ``*.py`` under
  ``attnlib/`` in the checkout), and every module that any chapter imports;
* runs chapters 11 and 12 whole (the kernel under Triton's interpreter; ring attention
  on simulated devices).

Marked ``slow`` (about a minute): ``make test`` and CI run it, ``make unit`` does not.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
WHOLE = ["11_writing_the_kernel.ipynb", "12_attention_across_devices.ipynb"]

pytestmark = pytest.mark.slow

RUN_NOTEBOOK = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
"""


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} failed ({result.returncode}):\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def modules_in_the_checkout() -> set[str]:
    """``attnlib``, ``attnlib.flash``, ``attnlib.distributed._ring``, ... from the sources."""
    names = set()
    for path in (ROOT / "attnlib").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def modules_the_chapters_import() -> set[str]:
    """Every attnlib module named in an import statement or as ``attnlib.x.y`` in a chapter."""
    names = set()
    for chapter in CHAPTERS:
        for cell in nbformat.read(chapter, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module)
                elif isinstance(node, ast.Attribute):
                    dotted = ast.unparse(node)
                    if dotted.startswith("attnlib."):
                        names.add(dotted)
    checkout = modules_in_the_checkout()
    # attnlib.distributed.ring_attention is a function: keep the longest module prefix.
    found = set()
    for name in names:
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        module = next((p for p in prefixes if p in checkout), None)
        if module is not None:
            found.add(module)
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    clone = tmp / "clone"
    run(["git", "clone", "--quiet", "--no-local", ROOT, clone])
    # The working tree's package and its build settings, not only what is committed.
    shutil.copytree(ROOT / "attnlib", clone / "attnlib", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", tmp / "dist", clone])
    wheel = next((tmp / "dist").glob("attnlib-*.whl"))

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    layer = tmp / "layer"
    layer.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if "attnlib" in name or entry.suffix == ".pth" or name.startswith(("pip", "_distutils")):
            continue
        (layer / entry.name).symlink_to(entry)
    site = next(env_dir.glob("lib/python*/site-packages"))
    (site / "project-layer.pth").write_text(f"{layer}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    workdir = tmp / "content"
    workdir.mkdir()
    before = subprocess.run([python, "-c", "import attnlib"], capture_output=True, cwd=workdir,
                            env=env)
    assert before.returncode != 0, "the fresh environment must not find attnlib before install"
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", wheel], env=env, cwd=workdir)
    return {"python": python, "env": env, "workdir": workdir, "tmp": tmp}


def test_every_module_imports_from_the_installed_wheel(installed):
    wanted = sorted(modules_in_the_checkout() | modules_the_chapters_import())
    assert "attnlib.distributed" in wanted and "attnlib.exercises.kernel" in wanted
    script = ("import importlib, json, sys\n"
              "bad = {}\n"
              "for name in sys.argv[1:]:\n"
              "    try:\n"
              "        module = importlib.import_module(name)\n"
              "    except Exception as error:\n"
              "        bad[name] = repr(error)\n"
              "        continue\n"
              "    if 'site-packages' not in (module.__file__ or ''):\n"
              "        bad[name] = 'imported from ' + str(module.__file__)\n"
              "print(json.dumps(bad))\n")
    result = run([installed["python"], "-c", script, *wanted], env=installed["env"],
                 cwd=installed["workdir"])
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("name", WHOLE)
def test_chapter_runs_whole_from_the_installed_wheel(installed, name):
    # The setup cell finds attnlib installed and installs nothing.
    run([installed["python"], "-c", RUN_NOTEBOOK, ROOT / "chapters" / name, installed["workdir"]],
        env=installed["env"], cwd=installed["workdir"], timeout=900)
