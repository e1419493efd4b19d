"""The Triton interpreter's setup, shared by the test files that run attnlib's kernels.

Without CUDA the kernels run on the CPU under Triton's interpreter, which Triton switches
on only if ``TRITON_INTERPRET=1`` is set before its first import in the process. Each such
test file imports this module before anything imports Triton: importing it sets the
variable (unless CUDA is here or Triton is already imported), and :func:`import_triton`
imports Triton, skipping the file where Triton is not installed and failing it loudly
where Triton was imported earlier without the interpreter (a skip would leave the kernels
untested in CI).
"""

import os
import sys
import types

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import in this process


def import_triton(reason: str = "Triton is not installed (pip install 'attnlib[triton]'): "
                  "kernel untested") -> tuple[types.ModuleType, bool]:
    """``(triton, interpreted)``: Triton, and whether it was imported under the interpreter.

    Skips the calling module (``reason``) where Triton is missing; fails it where there is
    no CUDA and Triton was imported without ``TRITON_INTERPRET=1``.
    """
    triton = pytest.importorskip("triton", reason=reason)
    from attnlib.flash_triton import imported_interpreted

    interpreted = imported_interpreted(triton)
    if not CUDA and not interpreted:
        pytest.fail("Triton was imported (by an earlier test module) before this file could "
                    "set TRITON_INTERPRET=1, so the kernels cannot run on this CPU",
                    pytrace=False)
    return triton, interpreted
