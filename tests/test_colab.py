"""Play Colab: a machine with torch but without attnlib runs a chapter's learner
notebook (what Colab's launch button opens) from its setup cell on.

The test makes a fresh virtual environment with what Colab has preinstalled
(torch, numpy, matplotlib, tqdm, a Jupyter kernel) and no attnlib; clones this
checkout with git and tags the clone with the ref the setup cells install
(``attnlib_ref`` in ``_config.yml``); points chapter 1's setup cell at that
clone (``git+file://`` instead of the repository's URL, the one change); and
runs the whole notebook with nbclient in a folder without the package's
sources. It passes when every cell runs, and attnlib was installed by pip,
non-editable, into the new environment.

Colab's preinstalled packages are this checkout's own (the versions the book is
tested with), seen by the new environment as a read-only layer, as Colab's
system packages are: a folder of links to the project environment's
site-packages with attnlib's own entries left out, named in a ``.pth`` file.
Installing torch afresh would download it again (gigabytes with its CUDA
libraries) on every CI run for nothing the test checks. attnlib itself is not
in the layer, and the test asserts that the new environment cannot import it
before the setup cell runs. Nothing is cached: pip gets ``--no-cache-dir`` and
everything lives in pytest's temporary folder. It takes about a minute; it is
marked ``colab``, so ``pytest -m "not colab"`` leaves it out locally; CI runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
# What Colab's launch button opens: the learner notebook (notebooks/, made from the
# chapter by _ext/learner_notebooks.py), with the chapter's setup cell.
CHAPTER = ROOT / "notebooks" / "01_simplified_attention.ipynb"
# What Colab already has: taken from the project's environment (see above).
COLAB_PACKAGES = ["torch", "numpy", "matplotlib", "tqdm", "ipykernel", "nbclient", "nbformat"]

pytestmark = pytest.mark.colab

RUN_NOTEBOOK = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[3])
"""


PROBE_ENVIRONMENT = """
import importlib.metadata, importlib.util, json, sys
modules = {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]}
metadata = [d.metadata["Name"] for d in importlib.metadata.distributions()
            if (d.metadata["Name"] or "").lower() == "attnlib"]
print(json.dumps({"modules": modules, "attnlib": None if importlib.util.find_spec("attnlib")
                  is None else str(importlib.util.find_spec("attnlib").origin),
                  "attnlib_metadata": metadata}))
"""


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} failed ({result.returncode}):\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is needed to clone the checkout")
    tmp = tmp_path_factory.mktemp("colab")
    ref = CONFIG["repository"]["attnlib_ref"]
    clone = tmp / "repository"
    run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)])
    run(["git", "-C", str(clone), "tag", "-f", ref])

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site_packages = next(env_dir.glob("lib/python*/site-packages"))
    preinstalled = tmp / "colab-preinstalled"
    preinstalled.mkdir()
    project_site = Path(sysconfig.get_paths()["purelib"])
    for entry in project_site.iterdir():
        name = entry.name.lower()
        # attnlib's editable install (its .pth, finder and metadata) stays out.
        if "attnlib" in name or entry.suffix == ".pth" or name.startswith(("pip", "_distutils")):
            continue
        (preinstalled / entry.name).symlink_to(entry)
    (site_packages / "colab-preinstalled.pth").write_text(f"{preinstalled}\n")
    clean_env = {k: v for k, v in os.environ.items()
                 if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    clean_env["PIP_NO_CACHE_DIR"] = "1"
    clean_env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # Colab's packages are there; attnlib is not, under any name.
    probe = run([str(python), "-c", PROBE_ENVIRONMENT, *COLAB_PACKAGES], env=clean_env, cwd=tmp)
    found = json.loads(probe.stdout)
    assert all(found["modules"].values()), f"Colab's packages are missing: {found['modules']}"
    assert found["attnlib"] is None and not found["attnlib_metadata"], (
        f"the fresh environment must not have attnlib: {found}")
    return {"tmp": tmp, "clone": clone, "python": python, "env": clean_env, "ref": ref}


def test_chapter_runs_from_its_setup_cell_in_a_fresh_environment(colab):
    nb = nbformat.read(CHAPTER, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code" and c.source.strip())
    url = CONFIG["repository"]["url"]
    line = f'ATTNLIB_REPO = "{url}"'
    assert setup.source.count(line) == 1, "the setup cell names the repository once"
    # file://localhost/...: the pip in a fresh venv (23.x) rejects an empty host in
    # "name @ git+file:///..." requirements.
    setup.source = setup.source.replace(line, f'ATTNLIB_REPO = "file://localhost{colab["clone"]}"')
    # Run where no attnlib sources lie about (Colab's /content).
    workdir = colab["tmp"] / "content"
    workdir.mkdir()
    source = colab["tmp"] / "chapter.ipynb"
    nbformat.write(nb, source)
    executed = colab["tmp"] / "executed.ipynb"
    run([str(colab["python"]), "-c", RUN_NOTEBOOK, str(source), str(workdir), str(executed)],
        env=colab["env"], cwd=workdir, timeout=900)

    done = nbformat.read(executed, as_version=4)
    # Exercise check cells fail until the learner fills the stub: tagged raises-exception.
    errors = [out for cell in done.cells if cell.cell_type == "code"
              and "raises-exception" not in cell.metadata.get("tags", [])
              for out in cell.get("outputs", []) if out.output_type == "error"]
    ran = [cell for cell in done.cells if cell.cell_type == "code" and cell.source.strip()]
    assert all(cell.get("execution_count") for cell in ran), "not every cell ran"
    assert not errors, errors
    # attnlib now comes from the new environment, installed from the clone, not editable.
    where = run([str(colab["python"]), "-c",
                 "import json, attnlib; print(json.dumps([attnlib.__file__, attnlib.__version__]))"],
                env=colab["env"], cwd=workdir)
    path, version = json.loads(where.stdout)
    assert Path(path).is_relative_to(colab["tmp"] / "venv"), f"attnlib imported from {path}"
    assert f"v{version}" == colab["ref"]
    direct_url = list((colab["tmp"] / "venv").glob("lib/python*/site-packages/attnlib-*.dist-info/direct_url.json"))
    assert direct_url, "attnlib was not installed by pip"
    info = json.loads(direct_url[0].read_text())
    assert info["url"].startswith("file://") and info["url"].endswith(str(colab["clone"]))
    assert info["vcs_info"]["requested_revision"] == colab["ref"]
    assert not info.get("dir_info", {}).get("editable", False)
