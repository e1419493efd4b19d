"""FlashAttention-2 as Triton kernels: the forward and the backward pass, fused.

:mod:`attnlib.flash` writes FlashAttention's loops in PyTorch, one tile per
Python iteration and one kernel launch per tile operation. Here the same
algorithm is written as Triton kernels (Tillet et al. 2019): a Triton *program*
handles one block of rows, holds its tiles in on-chip memory and loops over the
other sequence on its own, so a whole pass is one launch and the
``(num_tokens_q, num_tokens_kv)`` scores never reach main memory.

Four kernels, each one program per block and per (batch, head) pair (per key/value
head for dK and dV):

* forward (Dao 2023, Algorithm 1): one program per block of ``BLOCK_M`` queries
  loops over blocks of ``BLOCK_N`` keys with the online softmax, and writes the
  output and each row's log-sum-exp;
* the backward's preprocessing: ``D = rowsum(dO * O)`` per query row;
* dK and dV (Algorithm 2): one program per block of keys loops over the query
  blocks that see it, recomputing the weights ``P`` from the saved
  log-sum-exp;
* dQ: one program per block of queries loops over the key blocks it sees and
  recomputes ``P`` the same way. Algorithm 2 instead updates dQ in main memory
  from inside the dK/dV loop, with atomic adds between thread blocks (Section
  3.2); this second kernel gives each query block to one program, which sums
  its dQ in registers and writes it once, at the cost of computing ``P`` twice.

The exponentials are base 2, as in FlashAttention-2's kernels: the scores are
multiplied by ``scale * log2(e)``, so ``exp2(s - m)`` equals ``exp(x - max)``
of the natural-base softmax, and the saved log-sum-exp is in base 2 too.

Triton is optional (``pip install attnlib[triton]``): ``import attnlib`` does
not import it; the first call here does, and only then are the kernels handed
to ``triton.jit``. On CUDA tensors they are compiled for the GPU. On CPU
tensors they run under Triton's interpreter, slowly but exactly as written,
with NumPy. The interpreter is switched on by the environment
variable ``TRITON_INTERPRET=1``, which Triton reads when it decorates a
function, its own library's included, at its first import: so the variable must
be set before anything in the process imports Triton (a notebook sets
``os.environ["TRITON_INTERPRET"] = "1"`` in its first cell). A call checks this
and says so when it is not the case.

Beyond the textbook kernel, every loop runs its tiles in three stages: tiles no
query sees (above the causal diagonal, outside a sliding window) are skipped,
tiles every pair of which is seen run without a mask, and only the tiles cut by
the diagonal, the window's edge or the sequence's end apply one (Triton's
fused-attention tutorial does this for the causal mask). Key and value may have
fewer heads than the query (grouped-query attention, no repeat in memory), a
causal sliding window may limit each query to its last ``window`` keys, a
learned sink logit per head (gpt-oss) may join each softmax's denominator, and
on a GPU ``triton.autotune`` may choose the block sizes, warps and stages.

Shapes: ``(batch, num_heads, num_tokens, head_dim)`` for the query and
``(batch, num_kv_groups, num_tokens_kv, head_dim)`` for key and value;
``num_tokens_q`` and ``num_tokens_kv`` may differ.

The backward kernels compute the formulas of :func:`attnlib.flash.flash_attention_backward`,
the PyTorch tile loop that chapter 8's flash attention and ring attention share:
``P = exp(S - L)`` recomputed from the saved log-sum-exp, ``dS = P * (dP - D)`` with
``D = rowsum(dO * O)``, ``dV = P^T dO``, ``dQ = dS K * scale``, ``dK = dS^T Q * scale``
(here in base 2, with the two gradient loops in two kernels).

The kernels themselves are plain Python functions in ``attnlib.flash_triton.kernels``
(``kernels.forward_kernel``, ``kernels.key_tiles``, ``kernels.delta_kernel``,
``kernels.grad_key_value_kernel``, ...), which the book prints; ``jit_kernels``
hands them to ``triton.jit``. The code is split by concern into private modules:
``_kernels`` (the kernels, as ``kernels``), ``_launch`` (Triton's import,
``triton.jit`` and autotuning, input checks, launch settings, the tile schedule in
Python) and ``_api`` (the passes, autograd, the public functions).
"""

# kernels (the kernels as Python functions, printed by chapter 11), jit_kernels (which
# chapter 11 compiles for an H100), import_triton, imported_interpreted and
# key_tile_bounds (the kernels' tile schedule in Python; the exercises and the tests use
# them) are public but not in __all__, off the API page: its links have no target for
# their types (tl.tensor, types.SimpleNamespace, types.ModuleType).
from . import _kernels as kernels  # noqa: F401
from . import _launch
from ._api import flash_attention_triton, flash_attention_triton_forward
from ._launch import autotuned_configs, tile_counts
from ._launch import import_triton as import_triton
from ._launch import imported_interpreted as imported_interpreted
from ._launch import jit_kernels as jit_kernels
from ._launch import key_tile_bounds as key_tile_bounds

__all__ = ["AUTOTUNE_CONFIGS", "CAUSAL_ALIGNMENTS", "HEAD_DIMS", "SUPPORTED_DTYPES",
           "autotuned_configs", "flash_attention_triton", "flash_attention_triton_forward",
           "tile_counts"]

# The constants live in ._launch, where the code reads them; each is re-bound here with
# its documentation, for the API page.
SUPPORTED_DTYPES = _launch.SUPPORTED_DTYPES
"""The input dtypes the kernels take; accumulation is always float32."""

HEAD_DIMS = _launch.HEAD_DIMS
"""The head sizes the kernels take (``tl.arange`` needs a power of two, ``tl.dot`` at least 16)."""

CAUSAL_ALIGNMENTS = _launch.CAUSAL_ALIGNMENTS
"""``causal_alignment``'s values: ``"top_left"`` (torch's ``is_causal``) and ``"bottom_right"``."""

AUTOTUNE_CONFIGS = _launch.AUTOTUNE_CONFIGS
"""``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` that ``autotune=True`` times on a GPU."""
