"""Time and measure causal multi-head self-attention: ``python -m attnlib.bench``.

The benchmark compares, on one device and in one run, six ways to compute (or
part of) one causal self-attention layer of GPT-2-small's size
(``d_model=768``, ``num_heads=12``, so ``head_dim=64``):

* ``reference`` - :class:`attnlib.MultiHeadAttention` on its readable path,
  ``forward(x, return_weights=True)``: it materialises the
  ``(batch, num_heads, num_tokens, num_tokens)`` attention weights.
* ``attnlib`` - :class:`attnlib.MultiHeadAttention`'s fast path, ``forward(x)``,
  which calls :func:`torch.nn.functional.scaled_dot_product_attention`.
* ``torch_mha`` - :class:`torch.nn.MultiheadAttention` with ``batch_first=True``,
  called as ``mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)``.
  Its mask is a bool mask in **torch.nn.MultiheadAttention's polarity, True =
  masked out** (the opposite of attnlib's). Without gradients (the ``forward``
  mode) torch may take its fused inference fast path
  (``torch._native_multi_head_attention``); that is what a user of the module
  gets, so it is what we time.
* ``bare_kernels`` - the floor: the bare operations attnlib's fast path needs,
  as a plain function of weight tensors: ONE fused
  :func:`torch.nn.functional.linear` projection with a packed
  ``(3 * d_model, d_model)`` weight (rows: query, key, value, as torch's
  ``in_proj_weight``; packed once, not per call), ``split`` and
  ``view``/``transpose`` into heads, ``scaled_dot_product_attention(is_causal=True)``,
  ``transpose`` back and ``reshape`` (a copy), and the output
  :func:`~torch.nn.functional.linear`. attnlib can at best match it; the gap
  is the module's overhead. attnlib keeps its three weights as three
  ``nn.Linear`` layers: without gradients it applies them one by one (three
  GEMMs, no copy, as fast on the CPU as the floor's one), with gradients it
  concatenates them on the call into one ``F.linear``. Apart from that
  projection it runs the floor's kernel-launching ATen operators, plus a few
  views (:data:`PROJECTION_OPERATORS` lists the projection's).
  :func:`operator_parity` checks this with :mod:`torch.profiler` and the
  command line prints it; what is left of a time gap is then the Python that
  launches the kernels (a fixed few tens of microseconds per call, large
  against a GPU's short bfloat16 calls: see :func:`operator_parity`).
* ``sdpa_only`` - :func:`torch.nn.functional.scaled_dot_product_attention`
  alone on already projected queries, keys and values, laid out as attnlib
  passes them (a transposed view of ``(batch, num_tokens, d_model)``): the
  attention kernel without the projections, to show where the time goes.
* ``flash_only`` - :func:`attnlib.functional.flash_attention` (tiled, in
  readable PyTorch) on the same inputs as ``sdpa_only``: the course's
  FlashAttention against torch's fused kernel.

Two sweeps of one attention kernel follow (:func:`run_memory_sweep`,
:func:`run_kernel_timing`): peak memory for one head of ``head_dim=64``,
causal, N up to 16 384, of the readable path, torch's fused kernel and
``flash_attention``, with fitted log-log slopes and a plot
(:func:`plot_memory_sweep`); and the time of ``flash_attention`` for several
block sizes against torch's fused kernel at N = 4 096 with 8 heads.

Fairness: every full-layer contestant computes the same function with the same
weights (:func:`check_agreement` verifies it before timing). attnlib's
``qkv_bias`` decides whether the query, key and value projections have a bias;
its ``out_proj`` always has one. ``torch.nn.MultiheadAttention(bias=True)`` has
biases on both its packed input projection and its output projection, and
``bias=False`` on neither, so the like-for-like pair is attnlib with
``qkv_bias=True`` against torch with ``bias=True``: that is the default here
(and GPT-2's own configuration). With ``--no-qkv-bias`` attnlib and
``bare_kernels`` drop the three input biases and torch gets ``bias=True`` with
its input bias fixed at zero, so all still compute the same function (torch
then adds a zero bias, which costs it a little).

Everything runs in evaluation mode (dropout off), float32 by default, causal.
Two modes are timed: ``forward`` (under :func:`torch.inference_mode`) and
``forward_backward`` (the input and the parameters require gradients; the
forward is followed by ``out.backward(grad_output)`` with a fixed random
``grad_output``; gradients are set to ``None`` between repetitions, outside the
timed region).

Timing: :class:`torch.utils.benchmark.Timer`, which synchronises the GPU
around the timed region, fixes the number of threads (to
:func:`torch.get_num_threads`) and turns Python's garbage collector off. Each
repetition times one call of every contestant, interleaved round-robin (the
order rotates by one place per repetition), so a slow drift of the machine's
load hits all of them alike; each timed call follows an untimed one of the
same contestant (``Timer.blocked_autorange(min_run_time=0)``: one warm-up
call, then one timed call), so it is measured warm although another
contestant ran just before. ``warmup`` whole repetitions come first and are
dropped. Reported: median and interquartile range (IQR) of the ``reps``
per-call times.

Peak memory, reported as the peak of the bytes allocated during one call above
what was allocated when it started (activations, outputs, gradients; not the
weights or the input), measured in one separate, untimed call:

* on CUDA, :func:`torch.cuda.max_memory_allocated` after
  :func:`torch.cuda.reset_peak_memory_stats`;
* on the CPU, which keeps no allocator statistics, by
  :class:`torch.profiler.profile` with ``profile_memory=True``: it records every
  allocation and free of PyTorch's CPU allocator, and the peak is the maximum of
  their running sum in time order. This counts all tensors, including the
  kernels' internal buffers, but not memory allocated outside PyTorch's
  allocator (for example by BLAS libraries).

Outputs: a table on stdout, a verdict line per target, sequence length and mode,
a JSON file (see :func:`run_benchmark`, :func:`run_memory_sweep` and
:func:`run_kernel_timing` for its schema) and a PNG of the memory sweep.

The code lives by concept in private modules: ``_constants``,
``_contestants`` (the six contestants, their FLOPs and agreement),
``_timing``, ``_memory``, ``_operators`` (the profiled operator counts),
``_benchmark`` (:func:`run_benchmark`), ``_sweeps`` (the kernel sweeps),
``_report`` (the tables) and ``_cli`` (:func:`main`, run by ``python -m
attnlib.bench`` through ``__main__.py``). Every public name is re-exported
here. The constants and targets below live in the private ``_constants``,
which imports nothing from the package, so that no module here imports one
that imports it; setting one here (``attnlib.bench.TARGET_VS_TORCH_MHA =
1.2``) is passed on to ``_constants``, where the benchmark reads it.
"""

from __future__ import annotations

__all__ = [
    "CONTESTANTS",
    "MODES",
    "Contestant",
    "attention_flops",
    "make_contestants",
    "agreement_tolerance",
    "check_agreement",
    "peak_memory_bytes",
    "time_contestants",
    "run_benchmark",
    "run_memory_sweep",
    "run_kernel_timing",
    "plot_memory_sweep",
    "loglog_slope",
    "format_table",
    "format_sweeps",
    "is_view_operator",
    "PROJECTION_OPERATORS",
    "operator_counts",
    "operator_parity",
    "format_operator_parity",
    "main",
    "MEMORY_SWEEP_SEQ_LENS",
    "TARGET_VS_TORCH_MHA",
    "TARGET_VS_TORCH_MHA_FORWARD_LONG",
    "TARGET_VS_BARE_KERNELS",
    "TARGET_FLASH_VS_SDPA",
    "TARGET_TRITON_VS_SDPA",
    "TARGET_FLASH_MEMORY_BYTES",
    "TARGET_REFERENCE_MEMORY_BYTES",
]

# The constants live in ._constants, which imports nothing from this package; the
# modules below read them there when they run. Each is re-bound here with its
# documentation (for the API page), and _Package.__setattr__ passes an
# assignment on, so setting attnlib.bench.TARGET_X changes what the benchmark uses.
import sys as _sys
import types as _types

from . import _constants
from ._benchmark import run_benchmark
from ._cli import main
from ._contestants import (
    Contestant,
    agreement_tolerance,
    attention_flops,
    check_agreement,
    make_contestants,
)
from ._memory import peak_memory_bytes
from ._operators import (
    PROJECTION_OPERATORS,
    format_operator_parity,
    is_view_operator,
    operator_counts,
    operator_parity,
)
from ._report import format_sweeps, format_table
from ._sweeps import loglog_slope, plot_memory_sweep, run_kernel_timing, run_memory_sweep
from ._timing import time_contestants

CONTESTANTS = _constants.CONTESTANTS
"""The contestants' names, in the order they are reported."""

MODES = _constants.MODES
"""The timed modes."""

TARGET_VS_TORCH_MHA = _constants.TARGET_VS_TORCH_MHA
"""attnlib's time may be at most this multiple of torch_mha's (speed >= 0.9x)."""

TARGET_VS_TORCH_MHA_FORWARD_LONG = _constants.TARGET_VS_TORCH_MHA_FORWARD_LONG
"""In ``forward`` mode at N >= 1024, attnlib's time may be at most this multiple of torch_mha's."""

TARGET_VS_BARE_KERNELS = _constants.TARGET_VS_BARE_KERNELS
"""attnlib's time may be at most this multiple of bare_kernels' (the fused-QKV floor)."""

TARGET_FLASH_VS_SDPA = _constants.TARGET_FLASH_VS_SDPA
"""flash_attention's time may be at most this multiple of torch's fused kernel (kernel timing)."""

TARGET_TRITON_VS_SDPA = _constants.TARGET_TRITON_VS_SDPA
"""On a CUDA GPU, chapter 11's Triton kernel's forward time may be at most this multiple of
torch's fused kernel's (kernel timing, N = 4096): what a textbook FlashAttention-2 kernel
reached against SDPA's flash backend on an H100 in bfloat16 (0.80-0.85x at N = 4k-16k)."""

TARGET_FLASH_MEMORY_BYTES = _constants.TARGET_FLASH_MEMORY_BYTES
"""flash_attention's peak memory above its inputs at the sweep's largest N (one head, d=64)."""

TARGET_REFERENCE_MEMORY_BYTES = _constants.TARGET_REFERENCE_MEMORY_BYTES
"""The readable path's scores and weights at the sweep's largest N must exceed this."""

SCHEMA_VERSION = _constants.SCHEMA_VERSION

MEMORY_SWEEP_SEQ_LENS = _constants.MEMORY_SWEEP_SEQ_LENS
"""Default sequence lengths of :func:`run_memory_sweep`."""


class _Package(_types.ModuleType):
    """This package's module type: setting a constant sets it in ``_constants`` too."""

    def __setattr__(self, name: str, value: object) -> None:
        if not name.startswith("_") and hasattr(_constants, name):
            setattr(_constants, name, value)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
