"""pytest hooks for the chapter notebooks run under nbval.

The notebooks' stored outputs were made under the pinned CPU arithmetic of
``_ext/numerics.env`` (AVX2 kernels in ATen, MKL and oneDNN; two threads). nbval
starts each notebook's kernel from this process, so the settings are put in the
environment here, before any kernel starts: the outputs then reproduce bit for
bit on any x86-64 CPU with AVX2, Intel or AMD.
"""

import os
from pathlib import Path

import pytest


def pinned_numerics() -> dict[str, str]:
    """The settings of ``_ext/numerics.env``: ``NAME=value`` lines, ``#`` comments."""
    text = (Path(__file__).resolve().parents[1] / "_ext" / "numerics.env").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


os.environ.update(pinned_numerics())

import torch  # noqa: E402  (after the settings: torch reads them when it loads)


def pytest_collection_modifyitems(config, items):
    """Skip notebook cells tagged ``gpu`` where no CUDA GPU exists.

    Such a cell guards itself too, so it prints a clear line in a reader's
    kernel; under nbval it is not executed at all, and pytest says why.
    """
    if torch.cuda.is_available():
        return
    reason = "cell tagged 'gpu': no CUDA GPU on this machine"
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "gpu" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(pytest.mark.skip(reason=reason))
