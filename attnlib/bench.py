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
  is the module's overhead (including stacking its three weights on each call).
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

Timing: ``warmup`` untimed and then ``reps`` timed repetitions with
:func:`time.perf_counter` (with :func:`torch.cuda.synchronize` around each call
on CUDA), with Python's garbage collector off. The contestants are interleaved
round-robin inside every repetition (and the order rotates), so a slow drift of
the machine's load hits all of them alike. Reported: median and interquartile
range (IQR) of the per-call times.

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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._validation import check_positive_int as _check_positive_int
from .flash import DEFAULT_BLOCK_SIZE, flash_attention

__all__ = [
    "CONTESTANTS",
    "MODES",
    "Contestant",
    "attention_flops",
    "make_contestants",
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
    "main",
    "MEMORY_SWEEP_SEQ_LENS",
    "TARGET_VS_TORCH_MHA",
    "TARGET_VS_TORCH_MHA_FORWARD_LONG",
    "TARGET_VS_BARE_KERNELS",
    "TARGET_FLASH_VS_SDPA",
    "TARGET_FLASH_MEMORY_BYTES",
    "TARGET_REFERENCE_MEMORY_BYTES",
]

CONTESTANTS = ("reference", "attnlib", "torch_mha", "bare_kernels", "sdpa_only", "flash_only")
"""The contestants' names, in the order they are reported."""

MODES = ("forward", "forward_backward")
"""The timed modes."""

TARGET_VS_TORCH_MHA = 1.0 / 0.9
"""attnlib's time may be at most this multiple of torch_mha's (speed >= 0.9x)."""

TARGET_VS_TORCH_MHA_FORWARD_LONG = 0.5
"""In ``forward`` mode at N >= 1024, attnlib's time may be at most this multiple of torch_mha's."""

TARGET_VS_BARE_KERNELS = 1.03
"""attnlib's time may be at most this multiple of bare_kernels' (the fused-QKV floor)."""

TARGET_FLASH_VS_SDPA = 3.0
"""flash_attention's time may be at most this multiple of torch's fused kernel (kernel timing)."""

TARGET_FLASH_MEMORY_BYTES = 128 * 2**20
"""flash_attention's peak memory above its inputs at the sweep's largest N (one head, d=64)."""

TARGET_REFERENCE_MEMORY_BYTES = 2**30
"""The readable path's scores and weights at the sweep's largest N must exceed this."""

SCHEMA_VERSION = 2

_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           "float16": torch.float16, "bfloat16": torch.bfloat16}

# Full-layer contestants compute the whole layer; sdpa_only and flash_only only the attention.
_LAYER_CONTESTANTS = ("reference", "attnlib", "torch_mha", "bare_kernels")


@dataclass(frozen=True)
class Contestant:
    """One way of computing causal self-attention, ready to be timed.

    Attributes:
        name: one of :data:`CONTESTANTS`.
        description: one line saying what is called.
        fn: ``fn(*inputs)`` returns the output tensor; for a full-layer
            contestant ``inputs`` is ``(x,)`` and the output is
            ``(batch, num_tokens, d_model)``; for ``sdpa_only`` and
            ``flash_only`` the inputs are the projected ``(queries, keys, values)``, each
            ``(batch, num_tokens, d_model)``, and the output is
            ``(batch, num_heads, num_tokens, head_dim)``.
        make_inputs: maps ``x`` ``(batch, num_tokens, d_model)`` to new leaf
            tensors (requiring gradients) that ``fn`` takes.
        params: the parameter tensors whose gradients the backward computes.
        full_layer: True when ``fn`` computes the whole layer (projections
            included); False for ``sdpa_only`` and ``flash_only``.
    """

    name: str
    description: str
    fn: Callable[..., torch.Tensor]
    make_inputs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    params: tuple[torch.Tensor, ...]
    full_layer: bool = True


def _check_heads(d_model: int, num_heads: int) -> None:
    _check_positive_int("d_model", d_model)
    _check_positive_int("num_heads", num_heads)
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")


def attention_flops(
    batch: int,
    num_tokens: int,
    d_model: int,
    num_heads: int,
    *,
    backward: bool = False,
    projections: bool = True,
) -> int:
    """Floating-point operations of one causal multi-head self-attention layer.

    One multiply-add counts as 2 FLOPs; biases, softmax, scaling and masking
    are left out (they are O(N*d) and O(h*N^2) against the matmuls' O(N*d^2)
    and O(N^2*d)). With ``b = batch``, ``N = num_tokens``, ``d = d_model``,
    ``h = num_heads`` and ``head_dim = d / h``::

        projections  = 4 * (2 * b * N * d * d)          # Q, K, V and out_proj
        attention    = 2 * (2 * b * h * N * N * head_dim)
                     = 4 * b * N * N * d                # Q @ K^T and weights @ V
        forward      = projections + attention
        forward+backward = 3 * forward                  # backward ~ 2 x forward

    The attention term is **dense**: the causal mask makes half of ``Q @ K^T``
    and of ``weights @ V`` unnecessary, and a kernel that skips the masked
    blocks does about half that work, but the same dense count is used for
    every contestant, so GFLOP/s compare like with like (they are "useful
    dense-equivalent FLOP/s", not the hardware's).

    Args:
        batch: number of sequences ``b``.
        num_tokens: tokens per sequence ``N``.
        d_model: embedding size ``d`` (``d_in == d_out``).
        num_heads: number of heads ``h``; must divide ``d_model``.
        backward: count forward and backward (3x the forward).
        projections: include the four projections; ``False`` counts the
            attention kernel alone (the ``sdpa_only`` contestant).

    Returns:
        The FLOP count, an int.

    Raises:
        TypeError: a size is not an int, or a flag is not a bool.
        ValueError: a size is not positive, or ``num_heads`` does not divide
            ``d_model``.

    Source: Kaplan et al. (2020), "Scaling Laws for Neural Language Models",
    Table 1 (2 FLOPs per multiply-add of each projection) and section 2.1
    (backward ~ twice the forward); the dense attention term as in Chowdhery
    et al. (2022), "PaLM", Appendix B (``12 * L * H * Q * T`` per token for
    forward+backward). Kaplan et al. count ``2 * n_ctx * d_attn`` per token for
    the attention, i.e. causal-halved; we do not halve.
    """
    for name, value in (("batch", batch), ("num_tokens", num_tokens)):
        _check_positive_int(name, value)
    _check_heads(d_model, num_heads)
    for name, flag in (("backward", backward), ("projections", projections)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    head_dim = d_model // num_heads
    proj = 4 * 2 * batch * num_tokens * d_model * d_model if projections else 0
    attn = 2 * 2 * batch * num_heads * num_tokens * num_tokens * head_dim
    forward = proj + attn
    return 3 * forward if backward else forward


def _leaf(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (t.detach().clone().requires_grad_(True),)


def make_contestants(
    d_model: int = 768,
    num_heads: int = 12,
    context_length: int = 2048,
    *,
    names: Sequence[str] = CONTESTANTS,
    qkv_bias: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, Contestant]:
    """Build the contestants with one shared set of weights.

    The weights are those of one :class:`attnlib.MultiHeadAttention`
    (``d_in = d_out = d_model``, dropout 0, evaluation mode) created after
    ``torch.manual_seed(seed)``; ``torch_mha`` gets them copied into its packed
    ``in_proj_weight`` (rows: query, key, value), ``bare_kernels`` gets them
    packed once into one detached ``(3 * d_model, d_model)`` weight (and one
    bias), and ``sdpa_only``/``flash_only`` get detached copies, so no two
    contestants share a gradient.

    Args:
        d_model: embedding size. Default 768 (GPT-2 small).
        num_heads: number of heads; must divide ``d_model``. Default 12.
        context_length: the longest sequence the attnlib module will see.
        names: which contestants to build, a subset of :data:`CONTESTANTS`.
        qkv_bias: biases on the query, key and value projections (see the
            module docstring for how torch's module is matched). Default True.
        device: where the weights live; default :func:`attnlib.get_device`.
        dtype: floating-point dtype of the weights. Default float32.
        seed: seed for the weights.

    Returns:
        A dict from name to :class:`Contestant`, in the order of :data:`CONTESTANTS`.

    Raises:
        TypeError: a size is not an int, ``qkv_bias`` is not a bool, or
            ``dtype`` is not a floating-point dtype.
        ValueError: a size is not positive, ``num_heads`` does not divide
            ``d_model``, ``names`` is empty or names an unknown contestant.

    Source: GPT-2 small's attention size: Radford et al. (2019), "Language
    Models are Unsupervised Multitask Learners", Table 2.
    """
    from . import attention
    from .device import get_device

    _check_heads(d_model, num_heads)
    _check_positive_int("context_length", context_length)
    if isinstance(names, str):
        raise TypeError(f"names must be a sequence of names, not the string {names!r}")
    names = tuple(names)
    if not names:
        raise ValueError("names must name at least one contestant, got none")
    for name in names:
        if name not in CONTESTANTS:
            raise ValueError(f"unknown contestant {name!r}; expected one of {CONTESTANTS}")
    if not isinstance(qkv_bias, bool):
        raise TypeError(f"qkv_bias must be a bool, got {type(qkv_bias).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    device = torch.device(device) if device is not None else get_device()
    head_dim = d_model // num_heads

    torch.manual_seed(seed)
    mha = attention.MultiHeadAttention(
        d_model, d_model, context_length, 0.0, num_heads, qkv_bias=qkv_bias
    )
    mha = mha.to(device=device, dtype=dtype).eval()

    def copy(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().clone().requires_grad_(True)

    w_q, w_k, w_v = (copy(m.weight) for m in (mha.W_query, mha.W_key, mha.W_value))
    b_q, b_k, b_v = (copy(m.bias) for m in (mha.W_query, mha.W_key, mha.W_value))
    w_o, b_o = copy(mha.out_proj.weight), copy(mha.out_proj.bias)
    # The floor's packed projection: one (3 * d_model, d_model) leaf, rows q, k, v.
    w_qkv = copy(torch.cat([w_q, w_k, w_v], dim=0))
    b_qkv = copy(torch.cat([b_q, b_k, b_v], dim=0)) if qkv_bias else None

    def bare_kernels(x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = x.shape
        qkv = F.linear(x, w_qkv, b_qkv)  # ONE GEMM: (b, num_tokens, 3 * d_model)
        queries, keys, values = qkv.split(d_model, dim=-1)  # views, each (b, N, d_model)
        queries = queries.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # queries: (b, num_heads, num_tokens, head_dim)
        keys = keys.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # keys: (b, num_heads, num_tokens, head_dim)
        values = values.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # values: (b, num_heads, num_tokens, head_dim)
        context_vec = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)
        # reshape copies (the transposed tensor is not contiguous), as in attnlib.
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, d_model)
        # context_vec: (b, num_tokens, d_model)
        return F.linear(context_vec, w_o, b_o)

    def sdpa_only(queries, keys, values) -> torch.Tensor:
        b, num_tokens, _ = queries.shape
        queries = queries.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # queries: (b, num_heads, num_tokens, head_dim)
        keys = keys.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # keys: (b, num_heads, num_tokens, head_dim)
        values = values.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # values: (b, num_heads, num_tokens, head_dim)
        return F.scaled_dot_product_attention(queries, keys, values, is_causal=True)

    def flash_only(queries, keys, values) -> torch.Tensor:
        b, num_tokens, _ = queries.shape
        heads = (t.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
                 for t in (queries, keys, values))  # each (b, num_heads, num_tokens, head_dim)
        return flash_attention(*heads, is_causal=True)

    def sdpa_inputs(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            projected = (F.linear(x, w, b) for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))
            return tuple(p.detach().requires_grad_(True) for p in projected)

    out: dict[str, Contestant] = {}
    for name in CONTESTANTS:
        if name not in names:
            continue
        if name == "reference":
            out[name] = Contestant(
                name, "attnlib.MultiHeadAttention(x, return_weights=True): readable, N x N weights",
                lambda x: mha(x, return_weights=True)[0], _leaf, tuple(mha.parameters()))
        elif name == "attnlib":
            out[name] = Contestant(
                name, "attnlib.MultiHeadAttention(x): fast path (scaled_dot_product_attention)",
                lambda x: mha(x), _leaf, tuple(mha.parameters()))
        elif name == "torch_mha":
            torch_mha = torch.nn.MultiheadAttention(
                d_model, num_heads, dropout=0.0, bias=True, batch_first=True,
                device=device, dtype=dtype).eval()
            with torch.no_grad():
                torch_mha.in_proj_weight.copy_(torch.cat([w_q, w_k, w_v], dim=0))
                if qkv_bias:
                    torch_mha.in_proj_bias.copy_(torch.cat([b_q, b_k, b_v], dim=0))
                else:
                    torch_mha.in_proj_bias.zero_()
                torch_mha.out_proj.weight.copy_(w_o)
                torch_mha.out_proj.bias.copy_(b_o)
            masks: dict[int, torch.Tensor] = {}

            def torch_fn(x: torch.Tensor, torch_mha=torch_mha, masks=masks) -> torch.Tensor:
                num_tokens = x.shape[1]
                if num_tokens not in masks:
                    # torch.nn.MultiheadAttention's polarity: True = masked out.
                    masks[num_tokens] = torch.ones(
                        num_tokens, num_tokens, dtype=torch.bool, device=x.device).triu(1)
                return torch_mha(x, x, x, attn_mask=masks[num_tokens], is_causal=True,
                                 need_weights=False)[0]

            out[name] = Contestant(
                name, "torch.nn.MultiheadAttention(x, x, x, is_causal=True, need_weights=False)",
                torch_fn, _leaf, tuple(torch_mha.parameters()))
        elif name == "bare_kernels":
            params = tuple(t for t in (w_qkv, b_qkv, w_o, b_o) if t is not None)
            out[name] = Contestant(
                name, "1 fused F.linear (packed QKV) + scaled_dot_product_attention("
                "is_causal=True) + F.linear", bare_kernels, _leaf, params)
        elif name == "sdpa_only":
            out[name] = Contestant(
                name, "F.scaled_dot_product_attention(is_causal=True) on projected q, k, v",
                sdpa_only, sdpa_inputs, (), full_layer=False)
        else:
            out[name] = Contestant(
                name, "attnlib.functional.flash_attention(is_causal=True) on projected q, k, v "
                f"(block_size={DEFAULT_BLOCK_SIZE})", flash_only, sdpa_inputs, (),
                full_layer=False)
    return out


def check_agreement(
    contestants: dict[str, Contestant],
    x: torch.Tensor,
    *,
    rtol: float = 1e-3,
    atol: float = 1e-4,
) -> None:
    """Check that the full-layer contestants compute the same function.

    Every full-layer contestant's output on ``x`` is compared with the first
    one's by :func:`torch.testing.assert_close`; ``sdpa_only`` (which is not a
    full layer) is skipped.

    Args:
        contestants: from :func:`make_contestants`.
        x: input ``(batch, num_tokens, d_model)``.
        rtol: relative tolerance.
        atol: absolute tolerance.

    Raises:
        TypeError: ``x`` is not a tensor.
        ValueError: ``x`` is not 3-dimensional.
        RuntimeError: two contestants disagree (the message names them).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, num_tokens, d_model), got shape {tuple(x.shape)}")
    first_name, first = None, None
    with torch.no_grad():
        for name, c in contestants.items():
            if not c.full_layer:
                continue
            y = c.fn(*c.make_inputs(x))
            if first is None:
                first_name, first = name, y
                continue
            try:
                torch.testing.assert_close(y, first, rtol=rtol, atol=atol)
            except AssertionError as exc:
                raise RuntimeError(
                    f"contestants {name!r} and {first_name!r} disagree: {exc}") from None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start/stop lines)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (e.g. some notebook kernels)
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before.

    Args:
        fn: a callable with no arguments; its return value is dropped inside
            the measurement (so a returned tensor counts while it is alive).
        device: the device ``fn`` computes on.

    Returns:
        The peak in bytes (an int >= 0); ``None`` on a device other than CPU
        and CUDA. On CUDA: ``torch.cuda.max_memory_allocated`` after
        ``reset_peak_memory_stats``, minus ``memory_allocated`` before. On the
        CPU: the maximum running sum of the allocations and frees that
        :class:`torch.profiler.profile` (``profile_memory=True``) records in
        PyTorch's CPU allocator (memory allocated outside it, e.g. by BLAS,
        is not seen).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    device = torch.device(device)
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    if device.type != "cpu":
        return None
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def _make_step(contestant: Contestant, inputs: tuple[torch.Tensor, ...], mode: str,
               grad_output: torch.Tensor) -> Callable[[], None]:
    if mode == "forward":
        def step() -> None:
            with torch.inference_mode():
                contestant.fn(*inputs)
    else:
        def step() -> None:
            contestant.fn(*inputs).backward(grad_output)
    return step


def _clear_grads(contestant: Contestant, inputs: tuple[torch.Tensor, ...]) -> None:
    for t in (*contestant.params, *inputs):
        t.grad = None


def _check_mode(mode: object) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def _prepare(contestants: dict[str, Contestant], x: torch.Tensor, mode: str, seed: int):
    prepared = {}
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, c in contestants.items():
        inputs = c.make_inputs(x)
        with torch.no_grad():
            shape = c.fn(*inputs).shape
        grad_output = torch.randn(shape, generator=gen).to(device=x.device, dtype=x.dtype)
        prepared[name] = (c, inputs, _make_step(c, inputs, mode, grad_output))
    return prepared


def time_contestants(
    contestants: dict[str, Contestant],
    x: torch.Tensor,
    mode: str,
    *,
    reps: int = 15,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Time the contestants on one input, interleaved round-robin.

    Each of the ``warmup + reps`` repetitions calls every contestant once, in
    an order that rotates by one place per repetition; only the last ``reps``
    are kept. Gradients are cleared before each call, outside the timed region;
    Python's garbage collector is off while timing.

    Args:
        contestants: from :func:`make_contestants`.
        x: input ``(batch, num_tokens, d_model)`` on the contestants' device.
        mode: ``"forward"`` (under :func:`torch.inference_mode`) or
            ``"forward_backward"`` (forward, then ``backward`` of a fixed random
            ``grad_output`` into the input and the parameters).
        reps: timed repetitions. Default 15.
        warmup: untimed repetitions before them.

    Returns:
        A dict from contestant name to its ``reps`` times in seconds.

    Raises:
        TypeError: ``reps`` or ``warmup`` is not an int; ``x`` is not a tensor.
        ValueError: unknown ``mode``; ``reps`` not positive; ``warmup``
            negative; ``x`` not 3-dimensional.
    """
    _check_mode(mode)
    _check_positive_int("reps", reps)
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"warmup must be an int, got {type(warmup).__name__}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got warmup={warmup}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, num_tokens, d_model), got shape {tuple(x.shape)}")
    prepared = _prepare(contestants, x, mode, seed=1)
    return _time_prepared(prepared, x.device, reps, warmup)


def _time_prepared(prepared, device: torch.device, reps: int, warmup: int):
    names = list(prepared)
    times: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for rep in range(warmup + reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                c, inputs, step = prepared[name]
                _clear_grads(c, inputs)
                _sync(device)
                start = time.perf_counter()
                step()
                _sync(device)
                elapsed = time.perf_counter() - start
                if rep >= warmup:
                    times[name].append(elapsed)
    finally:
        if gc_was_enabled:
            gc.enable()
    for c, inputs, _ in prepared.values():
        _clear_grads(c, inputs)
    return times


def _quantiles(times: list[float]) -> tuple[float, float, float]:
    if len(times) == 1:
        return times[0], times[0], times[0]
    q1, median, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, median, q3


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return device.type


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def run_benchmark(
    seq_lens: Sequence[int] = (256, 512, 1024, 2048),
    *,
    batch: int = 1,
    d_model: int = 768,
    num_heads: int = 12,
    modes: Sequence[str] = MODES,
    contestants: Sequence[str] = CONTESTANTS,
    reps: int = 15,
    warmup: int = 2,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    qkv_bias: bool = True,
    measure_memory: bool = True,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Run the whole benchmark and return its results as a JSON-ready dict.

    For each sequence length and mode: one untimed call per contestant to
    measure peak memory (:func:`peak_memory_bytes`; it doubles as a warm-up),
    then :func:`time_contestants`. Before timing, :func:`check_agreement`
    verifies that the full-layer contestants agree at the shortest length.

    Args:
        seq_lens: sequence lengths ``N`` to run. Default 256, 512, 1024, 2048.
        batch: sequences per call. Default 1.
        d_model: embedding size. Default 768.
        num_heads: heads; must divide ``d_model``. Default 12.
        modes: a subset of :data:`MODES`.
        contestants: a subset of :data:`CONTESTANTS`.
        reps: timed repetitions per (length, mode). Default 15.
        warmup: untimed repetitions before them. Default 2.
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        qkv_bias: biases on the query, key and value projections. Default True.
        measure_memory: measure peak memory (else ``peak_memory_bytes`` is None).
        seed: seed for weights and inputs.
        log: called with a progress line after each (length, mode); None is silent.

    Returns:
        A dict with these keys (the JSON schema, version 2; ``main`` adds
        ``memory_sweep`` and ``kernel_timing``, see :func:`run_memory_sweep`
        and :func:`run_kernel_timing`):

        * ``schema_version`` (int) and ``metadata`` (dict): ``torch_version``,
          ``attnlib_version``, ``python_version``, ``platform``, ``device``,
          ``device_name``, ``num_threads``, ``batch``, ``d_model``,
          ``num_heads``, ``head_dim``, ``dtype``, ``qkv_bias``, ``reps``,
          ``warmup``, ``seq_lens``, ``modes``, ``contestants``, ``timestamp``
          (ISO 8601, UTC), ``load_average_start``/``load_average_end``
          (1, 5, 15-minute load or None), ``memory_method``, ``flop_formula``,
          ``targets``.
        * ``records`` (list of dicts), one per contestant, mode and length:
          ``contestant``, ``mode``, ``seq_len``, ``batch``, ``median_ms``,
          ``q1_ms``, ``q3_ms``, ``iqr_ms``, ``min_ms``, ``times_ms`` (all
          timed repetitions), ``flops``, ``gflops_per_s`` (from the median),
          ``peak_memory_bytes`` and ``peak_memory_mb`` (MiB; None when not
          measured), ``time_vs_torch_mha`` and ``time_vs_bare_kernels`` (median
          time over theirs; None when that contestant is absent or this is
          an attention-only contestant), ``time_vs_sdpa_only`` (for the
          attention-only contestants ``sdpa_only`` and ``flash_only``; else None).
        * ``verdicts`` (list of dicts), one per target, mode and length where
          the contestants are present: ``target`` (``"attnlib_vs_torch_mha"``
          or ``"attnlib_vs_bare_kernels"``), ``mode``, ``seq_len``, ``ratio``
          (attnlib's median time over the other's), ``paired_ratio`` (median
          over repetitions of the per-repetition ratio, a noise check),
          ``threshold`` (largest allowed ratio: :data:`TARGET_VS_BARE_KERNELS`;
          :data:`TARGET_VS_TORCH_MHA`, or :data:`TARGET_VS_TORCH_MHA_FORWARD_LONG`
          in ``forward`` mode at N >= 1024), ``passed`` (bool).
        * ``all_targets_met`` (bool; True when there are no verdicts).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a sequence length, ``batch``, ``reps`` or a size is not
            positive (the message names it), ``warmup`` is negative,
            ``num_heads`` does not divide ``d_model``, or a mode or contestant
            is unknown or none is given.
        RuntimeError: the contestants disagree (see :func:`check_agreement`).
    """
    if isinstance(seq_lens, (str, int)) or not isinstance(seq_lens, Sequence):
        raise TypeError(f"seq_lens must be a sequence of ints, got {seq_lens!r}")
    if not seq_lens:
        raise ValueError("seq_lens must hold at least one sequence length, got none")
    for n in seq_lens:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"each seq_len must be an int, got {n!r}")
        if n <= 0:
            raise ValueError(f"seq_len={n} must be a positive number of tokens")
    _check_positive_int("batch", batch)
    _check_positive_int("reps", reps)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got warmup={warmup!r}")
    if isinstance(modes, str) or not modes:
        raise ValueError(f"modes must be a non-empty sequence of {MODES}, got {modes!r}")
    for mode in modes:
        _check_mode(mode)
    from . import __version__
    from .device import get_device

    device = torch.device(device) if device is not None else get_device()
    seq_lens = list(dict.fromkeys(seq_lens))
    modes = list(dict.fromkeys(modes))
    built = make_contestants(d_model, num_heads, max(seq_lens), names=contestants,
                             qkv_bias=qkv_bias, device=device, dtype=dtype, seed=seed)
    metadata = {
        "torch_version": torch.__version__,
        "attnlib_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": _device_name(device),
        "num_threads": torch.get_num_threads(),
        "batch": batch,
        "d_model": d_model,
        "num_heads": num_heads,
        "head_dim": d_model // num_heads,
        "dtype": str(dtype).removeprefix("torch."),
        "qkv_bias": qkv_bias,
        "reps": reps,
        "warmup": warmup,
        "seq_lens": seq_lens,
        "modes": modes,
        "contestants": {name: c.description for name, c in built.items()},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": _load(),
        "memory_method": (
            "torch.cuda.max_memory_allocated above the start" if device.type == "cuda" else
            "peak running sum of torch.profiler CPU allocator events above the start"
            if device.type == "cpu" else "not measured on this device"),
        "flop_formula": "forward = 8*b*N*d^2 + 4*b*N^2*d (dense, causal mask not halved); "
                        "forward_backward = 3*forward; sdpa_only, flash_only: 4*b*N^2*d (x3)",
        "targets": {"attnlib_vs_torch_mha": TARGET_VS_TORCH_MHA,
                    "attnlib_vs_torch_mha_forward_n_ge_1024": TARGET_VS_TORCH_MHA_FORWARD_LONG,
                    "attnlib_vs_bare_kernels": TARGET_VS_BARE_KERNELS},
    }

    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    check_x = torch.randn(batch, min(seq_lens), d_model, generator=gen).to(device, dtype)
    check_agreement(built, check_x)

    records, verdicts = [], []
    for num_tokens in seq_lens:
        x = torch.randn(batch, num_tokens, d_model, generator=gen).to(device, dtype)
        for mode in modes:
            prepared = _prepare(built, x, mode, seed=seed + num_tokens)
            memory = {}
            for name, (c, inputs, step) in prepared.items():
                _clear_grads(c, inputs)
                memory[name] = peak_memory_bytes(step, device) if measure_memory else None
                _clear_grads(c, inputs)
            times = _time_prepared(prepared, device, reps, warmup)
            medians = {name: _quantiles(t)[1] for name, t in times.items()}
            for name, t in times.items():
                q1, median, q3 = _quantiles(t)
                flops = attention_flops(batch, num_tokens, d_model, num_heads,
                                        backward=mode == "forward_backward",
                                        projections=built[name].full_layer)
                full = built[name].full_layer
                mem = memory[name]
                records.append({
                    "contestant": name, "mode": mode, "seq_len": num_tokens, "batch": batch,
                    "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
                    "iqr_ms": (q3 - q1) * 1e3, "min_ms": min(t) * 1e3,
                    "times_ms": [v * 1e3 for v in t],
                    "flops": flops, "gflops_per_s": flops / median / 1e9,
                    "peak_memory_bytes": mem,
                    "peak_memory_mb": None if mem is None else mem / 2**20,
                    "time_vs_torch_mha": median / medians["torch_mha"]
                    if full and "torch_mha" in medians else None,
                    "time_vs_bare_kernels": median / medians["bare_kernels"]
                    if full and "bare_kernels" in medians else None,
                    "time_vs_sdpa_only": median / medians["sdpa_only"]
                    if not full and "sdpa_only" in medians else None,
                })
            vs_torch = TARGET_VS_TORCH_MHA
            if mode == "forward" and num_tokens >= 1024:
                vs_torch = min(vs_torch, TARGET_VS_TORCH_MHA_FORWARD_LONG)
            for other, threshold in (("torch_mha", vs_torch),
                                     ("bare_kernels", TARGET_VS_BARE_KERNELS)):
                if "attnlib" not in times or other not in times:
                    continue
                ratio = medians["attnlib"] / medians[other]
                paired = statistics.median(
                    a / o for a, o in zip(times["attnlib"], times[other], strict=False))
                verdicts.append({
                    "target": f"attnlib_vs_{other}", "mode": mode, "seq_len": num_tokens,
                    "ratio": ratio, "paired_ratio": paired, "threshold": threshold,
                    "passed": bool(ratio <= threshold),
                })
            if log is not None:
                parts = ", ".join(f"{n} {medians[n] * 1e3:.1f} ms" for n in medians)
                log(f"N={num_tokens} {mode}: {parts}")
    metadata["load_average_end"] = _load()
    return {
        "schema_version": SCHEMA_VERSION,
        "metadata": metadata,
        "records": records,
        "verdicts": verdicts,
        "all_targets_met": all(v["passed"] for v in verdicts),
    }


# ---------------------------------------------------------------------------------------
# Sweeps of one attention kernel: memory against N, and flash_attention's time


MEMORY_SWEEP_SEQ_LENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
"""Default sequence lengths of :func:`run_memory_sweep`."""

_KERNELS = ("reference", "sdpa", "flash_attention")


def _attention_inputs(batch, num_heads, num_tokens, head_dim, device, dtype, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (batch, num_heads, num_tokens, head_dim)
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3))


def _check_seq_lens(seq_lens: object, name: str = "seq_lens") -> list[int]:
    if isinstance(seq_lens, (str, int)) or not isinstance(seq_lens, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {seq_lens!r}")
    if not seq_lens:
        raise ValueError(f"{name} must hold at least one sequence length, got none")
    for n in seq_lens:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"each seq_len must be an int, got {n!r}")
        if n <= 0:
            raise ValueError(f"seq_len={n} must be a positive number of tokens")
    return sorted(set(seq_lens))


def loglog_slope(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """Least-squares slope of ``log(y)`` against ``log(x)`` over the pairs with ``y > 0``.

    A quantity that grows like ``x**p`` has slope ``p``: 2 for an ``N x N``
    matrix, 1 for a linear one.

    Args:
        xs: positive abscissae (sequence lengths).
        ys: the measured values, same length; None or non-positive entries are skipped.

    Returns:
        The slope, or None with fewer than two usable pairs.

    Raises:
        ValueError: ``xs`` and ``ys`` differ in length.
    """
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True)
              if y is not None and y > 0]
    if len(points) < 2:
        return None
    mean_x = sum(p[0] for p in points) / len(points)
    mean_y = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mean_x) ** 2 for p in points)
    sxy = sum((p[0] - mean_x) * (p[1] - mean_y) for p in points)
    return sxy / sxx if sxx > 0 else None


def run_memory_sweep(
    seq_lens: Sequence[int] = MEMORY_SWEEP_SEQ_LENS,
    *,
    num_heads: int = 1,
    head_dim: int = 64,
    is_causal: bool = True,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_reference_tokens: int = 4096,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Peak memory of one attention call against the number of tokens N.

    For each N, queries, keys and values ``(1, num_heads, N, head_dim)`` are
    made first; then, under :func:`torch.inference_mode`, the peak memory
    above them (:func:`peak_memory_bytes`) of one call of each kernel:

    * ``reference`` - :func:`attnlib.functional.scaled_dot_product_attention`
      with ``return_weights=True`` (the readable path: it holds the scores
      and the weights, each ``(1, num_heads, N, N)``); measured only up to
      ``max_reference_tokens`` and extrapolated beyond with the power law
      fitted to the measured points (``reference_extrapolated_bytes``);
    * ``sdpa`` - :func:`torch.nn.functional.scaled_dot_product_attention`;
    * ``flash_attention`` - :func:`attnlib.functional.flash_attention`.

    The N² term is predicted: scores and weights need
    ``2 * num_heads * N**2 * element_size`` bytes.

    Args:
        seq_lens: the N to measure. Default :data:`MEMORY_SWEEP_SEQ_LENS`
            (256 to 16 384).
        num_heads: heads per call. Default 1.
        head_dim: ``d_k = d_v``. Default 64.
        is_causal: causal attention (top-left). Default True.
        block_size: ``flash_attention``'s tile size.
        max_reference_tokens: the largest N at which the readable path is run
            (it needs about ``3 * num_heads * N**2 * element_size`` bytes).
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        seed: seed of the inputs.
        log: called with one progress line per N; None is silent.

    Returns:
        A JSON-ready dict: ``metadata`` (the arguments, ``device``,
        ``element_size``); ``records``, one per N: ``seq_len``,
        ``input_bytes``, ``predicted_scores_weights_bytes``, and
        ``reference_peak_bytes`` (None where not run), ``sdpa_peak_bytes``,
        ``flash_attention_peak_bytes``, ``reference_extrapolated_bytes``
        (None where measured); ``slopes``: the log-log slope of each kernel's
        peak against N (:func:`loglog_slope`; for ``flash_attention`` and
        ``sdpa`` over the upper half of the N, where the part that grows with
        N dominates the fixed tile workspace), and ``reference_fit``, the
        fitted ``log2`` coefficient and exponent; ``verdicts``: readable path's
        predicted scores and weights at the largest N above
        :data:`TARGET_REFERENCE_MEMORY_BYTES` (1 GiB), ``flash_attention``'s
        peak at the largest N below :data:`TARGET_FLASH_MEMORY_BYTES` (128
        MiB), and the slopes (reference within 1.8-2.2, flash_attention at
        most 1.2), each with ``target``, ``value``, ``threshold``, ``passed``.

    Raises:
        TypeError, ValueError: a sequence length or size is not a positive int.
    """
    from .device import get_device
    from .functional import scaled_dot_product_attention as readable

    seq_lens = _check_seq_lens(seq_lens)
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim),
                        ("block_size", block_size),
                        ("max_reference_tokens", max_reference_tokens)):
        _check_positive_int(name, value)
    device = torch.device(device) if device is not None else get_device()
    element_size = torch.empty((), dtype=dtype).element_size()
    calls = {
        "reference": lambda q, k, v: readable(q, k, v, is_causal=is_causal, return_weights=True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
        "flash_attention": lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal,
                                                           block_size=block_size),
    }
    records = []
    for num_tokens in seq_lens:
        q, k, v = _attention_inputs(1, num_heads, num_tokens, head_dim, device, dtype,
                                    seed + num_tokens)
        record = {
            "seq_len": num_tokens,
            "input_bytes": 3 * q.numel() * element_size,
            "predicted_scores_weights_bytes": 2 * num_heads * num_tokens**2 * element_size,
        }
        with torch.inference_mode():
            for name, call in calls.items():
                if name == "reference" and num_tokens > max_reference_tokens:
                    record["reference_peak_bytes"] = None
                    continue
                record[f"{name}_peak_bytes"] = peak_memory_bytes(
                    lambda call=call, q=q, k=k, v=v: call(q, k, v), device)
        records.append(record)
        if log is not None:
            parts = ", ".join(f"{name} {_fmt_bytes(record[f'{name}_peak_bytes'])}"
                              for name in _KERNELS)
            log(f"memory N={num_tokens}: {parts}")

    measured = [r for r in records if r["reference_peak_bytes"] is not None]
    reference_slope = loglog_slope([r["seq_len"] for r in measured],
                                   [r["reference_peak_bytes"] for r in measured])
    fit = None
    if reference_slope is not None:
        # log2(peak) = log2_coefficient + exponent * log2(N), fitted on the measured points.
        mean_x = sum(math.log2(r["seq_len"]) for r in measured) / len(measured)
        mean_y = sum(math.log2(r["reference_peak_bytes"]) for r in measured) / len(measured)
        fit = {"exponent": reference_slope, "log2_coefficient": mean_y - reference_slope * mean_x}
    for r in records:
        r["reference_extrapolated_bytes"] = (
            2 ** (fit["log2_coefficient"] + fit["exponent"] * math.log2(r["seq_len"]))
            if fit is not None and r["reference_peak_bytes"] is None else None)
    upper = records[len(records) // 2:] if len(records) > 2 else records
    slopes = {
        "reference": reference_slope,
        "sdpa": loglog_slope([r["seq_len"] for r in upper], [r["sdpa_peak_bytes"] for r in upper]),
        "flash_attention": loglog_slope([r["seq_len"] for r in upper],
                                        [r["flash_attention_peak_bytes"] for r in upper]),
        "upper_seq_lens": [r["seq_len"] for r in upper],
    }
    last = records[-1]
    verdicts = [
        {"target": "reference_scores_weights_over_1_GiB", "seq_len": last["seq_len"],
         "value": last["predicted_scores_weights_bytes"],
         "threshold": TARGET_REFERENCE_MEMORY_BYTES,
         "passed": last["predicted_scores_weights_bytes"] > TARGET_REFERENCE_MEMORY_BYTES},
        {"target": "flash_attention_peak_under_128_MiB", "seq_len": last["seq_len"],
         "value": last["flash_attention_peak_bytes"], "threshold": TARGET_FLASH_MEMORY_BYTES,
         "passed": last["flash_attention_peak_bytes"] is not None
         and last["flash_attention_peak_bytes"] < TARGET_FLASH_MEMORY_BYTES},
        {"target": "reference_slope_near_2", "seq_len": None, "value": slopes["reference"],
         "threshold": [1.8, 2.2], "passed": slopes["reference"] is not None
         and 1.8 <= slopes["reference"] <= 2.2},
        {"target": "flash_attention_slope_at_most_1.2", "seq_len": None,
         "value": slopes["flash_attention"], "threshold": 1.2,
         "passed": slopes["flash_attention"] is not None and slopes["flash_attention"] <= 1.2},
    ]
    return {
        "metadata": {
            "device": str(device), "dtype": str(dtype).removeprefix("torch."),
            "element_size": element_size, "batch": 1, "num_heads": num_heads,
            "head_dim": head_dim, "is_causal": is_causal, "block_size": block_size,
            "max_reference_tokens": max_reference_tokens, "seq_lens": seq_lens,
            "memory_method": "peak_memory_bytes under torch.inference_mode, above the inputs",
        },
        "records": records,
        "slopes": slopes,
        "reference_fit": fit,
        "verdicts": verdicts,
    }


def run_kernel_timing(
    num_tokens: int = 4096,
    *,
    num_heads: int = 8,
    head_dim: int = 64,
    batch: int = 1,
    is_causal: bool = True,
    block_sizes: Sequence[int] = (128, 256, 512),
    reps: int = 5,
    warmup: int = 1,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict:
    """Time :func:`attnlib.functional.flash_attention` against torch's fused kernel.

    Queries, keys and values are ``(batch, num_heads, num_tokens, head_dim)``;
    the forward pass runs under :func:`torch.inference_mode`, timed as in
    :func:`time_contestants` (interleaved round-robin, median of ``reps``).
    Contestants: ``sdpa`` (:func:`torch.nn.functional.scaled_dot_product_attention`,
    which on the CPU dispatches to its fused flash kernel) and one
    ``flash_attention`` per block size. Both are checked to agree first.

    Args:
        num_tokens: N. Default 4096.
        num_heads: heads. Default 8.
        head_dim: ``d_k = d_v``. Default 64.
        batch: sequences. Default 1.
        is_causal: causal attention. Default True.
        block_sizes: the ``flash_attention`` tile sizes to time; the one with
            the lowest median is reported as the best.
        reps: timed repetitions. Default 5.
        warmup: untimed repetitions first. Default 1.
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        seed: seed of the inputs.

    Returns:
        A JSON-ready dict: ``metadata``; ``records``, one per contestant:
        ``contestant``, ``block_size`` (None for ``sdpa``), ``median_ms``,
        ``q1_ms``, ``q3_ms``, ``times_ms``, ``time_vs_sdpa``; ``best_block_size``;
        ``verdicts``: one, ``flash_attention_vs_sdpa``, the best block size's
        time ratio against :data:`TARGET_FLASH_VS_SDPA` (3x).

    Raises:
        TypeError, ValueError: a size, ``reps`` or a block size is not a
            positive int, or ``block_sizes`` is empty.
        RuntimeError: flash_attention and torch's kernel disagree.
    """
    from .device import get_device

    for name, value in (("num_tokens", num_tokens), ("num_heads", num_heads),
                        ("head_dim", head_dim), ("batch", batch), ("reps", reps)):
        _check_positive_int(name, value)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got warmup={warmup!r}")
    if isinstance(block_sizes, (str, int)) or not block_sizes:
        raise ValueError(f"block_sizes must be a non-empty sequence of ints, got {block_sizes!r}")
    block_sizes = [_check_positive_int("block_size", b) for b in block_sizes]
    device = torch.device(device) if device is not None else get_device()
    q, k, v = _attention_inputs(batch, num_heads, num_tokens, head_dim, device, dtype, seed)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    built = {"sdpa": Contestant("sdpa", "F.scaled_dot_product_attention", sdpa,
                                lambda x: (q, k, v), (), full_layer=False)}
    for b in block_sizes:
        def flash(q, k, v, b=b):
            return flash_attention(q, k, v, is_causal=is_causal, block_size=b)
        built[f"flash_attention_b{b}"] = Contestant(
            f"flash_attention_b{b}", f"flash_attention(block_size={b})", flash,
            lambda x: (q, k, v), (), full_layer=False)
    with torch.inference_mode():
        check = tuple(t[..., :256, :] for t in (q, k, v))
        expected = sdpa(*check)
        for name, c in built.items():
            try:
                torch.testing.assert_close(c.fn(*check), expected, rtol=1e-3, atol=1e-4)
            except AssertionError as exc:
                raise RuntimeError(f"{name} and sdpa disagree: {exc}") from None
    prepared = {name: (c, (q, k, v), _make_step(c, (q, k, v), "forward", None))
                for name, c in built.items()}
    times = _time_prepared(prepared, device, reps, warmup)
    medians = {name: _quantiles(t)[1] for name, t in times.items()}
    records = []
    for name, t in times.items():
        q1, median, q3 = _quantiles(t)
        records.append({
            "contestant": "sdpa" if name == "sdpa" else "flash_attention",
            "block_size": None if name == "sdpa" else int(name.rsplit("_b", 1)[1]),
            "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
            "times_ms": [x * 1e3 for x in t], "time_vs_sdpa": median / medians["sdpa"],
        })
    flash_records = [r for r in records if r["contestant"] == "flash_attention"]
    best = min(flash_records, key=lambda r: r["median_ms"])
    return {
        "metadata": {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                     "batch": batch, "num_heads": num_heads, "num_tokens": num_tokens,
                     "head_dim": head_dim, "is_causal": is_causal, "block_sizes": block_sizes,
                     "reps": reps, "warmup": warmup, "num_threads": torch.get_num_threads(),
                     "mode": "forward under torch.inference_mode"},
        "records": records,
        "best_block_size": best["block_size"],
        "verdicts": [{"target": "flash_attention_vs_sdpa", "seq_len": num_tokens,
                      "value": best["time_vs_sdpa"], "threshold": TARGET_FLASH_VS_SDPA,
                      "passed": best["time_vs_sdpa"] <= TARGET_FLASH_VS_SDPA}],
    }


def plot_memory_sweep(sweep: dict, path: str | os.PathLike) -> str:
    """Draw :func:`run_memory_sweep`'s result as a log-log plot and save it.

    Lines: the readable path (measured, then extrapolated dashed), its
    predicted scores and weights ``2 * h * N**2 * element_size``, torch's
    fused kernel and ``flash_attention``; grey guides of slope 2 and 1.
    matplotlib is imported only here.

    Args:
        sweep: the dict :func:`run_memory_sweep` returns.
        path: where to write the figure (the suffix picks the format, e.g. .png).

    Returns:
        The path written, as a string.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sweep["records"]
    ns = [r["seq_len"] for r in records]
    mib = 2.0**20

    def series(key):
        return [None if r[key] is None else r[key] / mib for r in records]

    with plt.style.context("attnlib.book"):
        fig, ax = plt.subplots(figsize=(7.2, 4.5), dpi=100)
        ax.plot(ns, series("predicted_scores_weights_bytes"), color="grey", linestyle=":",
                label="predicted: scores + weights, 2·h·N²·(bytes per element)")
        ax.plot(ns, series("reference_peak_bytes"), "o-", color="C0",
                label="readable path (measured)")
        extrapolated = [(n, r["reference_extrapolated_bytes"] / mib) for n, r in zip(
            ns, records, strict=True) if r["reference_extrapolated_bytes"] is not None]
        if extrapolated:
            last = [(n, r["reference_peak_bytes"] / mib) for n, r in zip(ns, records, strict=True)
                    if r["reference_peak_bytes"] is not None][-1:]
            xs, ys = zip(*(last + extrapolated), strict=True)
            ax.plot(xs, ys, "--", color="C0", label="readable path (extrapolated)")
        ax.plot(ns, series("sdpa_peak_bytes"), "s-", color="C1", label="torch fused kernel")
        ax.plot(ns, series("flash_attention_peak_bytes"), "^-", color="C2",
                label="attnlib flash_attention")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("tokens N")
        ax.set_ylabel("peak memory above the inputs (MiB)")
        meta = sweep["metadata"]
        ax.set_title(f"one attention call, {meta['num_heads']} head(s), d={meta['head_dim']}, "
                     f"{meta['dtype']}, {meta['device']}")
        ax.legend(fontsize=10)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return str(path)


def _fmt_bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def format_sweeps(memory: dict | None, kernel: dict | None) -> str:
    """The memory sweep and the kernel timing as text tables with verdict lines.

    Args:
        memory: :func:`run_memory_sweep`'s result, or None to leave it out.
        kernel: :func:`run_kernel_timing`'s result, or None to leave it out.

    Returns:
        The tables (sizes in MiB; a readable-path value marked ``~`` is
        extrapolated), then one ``PASS``/``FAIL`` line per verdict, as a string.
    """
    lines: list[str] = []
    if memory is not None:
        meta = memory["metadata"]
        lines += [f"Memory sweep: one call, {meta['num_heads']} head(s), d={meta['head_dim']}, "
                  f"{meta['dtype']}, causal={meta['is_causal']}, flash block_size="
                  f"{meta['block_size']}; peak above the inputs",
                  f"{'N':>6} {'scores+weights':>15} {'readable':>13} {'torch fused':>12} "
                  f"{'flash_attention':>16}"]
        for r in memory["records"]:
            readable = (_fmt_bytes(r["reference_peak_bytes"]) if r["reference_peak_bytes"]
                        is not None else "~" + _fmt_bytes(r["reference_extrapolated_bytes"]))
            lines.append(f"{r['seq_len']:>6} {_fmt_bytes(r['predicted_scores_weights_bytes']):>15}"
                         f" {readable:>13} {_fmt_bytes(r['sdpa_peak_bytes']):>12} "
                         f"{_fmt_bytes(r['flash_attention_peak_bytes']):>16}")
        slopes = memory["slopes"]
        lines.append("log-log slopes: " + ", ".join(
            f"{k} {_fmt(slopes[k], '.2f')}" for k in _KERNELS)
            + f" (sdpa and flash over N in {slopes['upper_seq_lens']}); '~' = extrapolated")
    if kernel is not None:
        meta = kernel["metadata"]
        lines += ["", f"Kernel timing: N={meta['num_tokens']}, {meta['num_heads']} heads, "
                  f"d={meta['head_dim']}, batch={meta['batch']}, causal={meta['is_causal']}, "
                  f"{meta['dtype']}, reps={meta['reps']}"]
        for r in kernel["records"]:
            label = "torch sdpa" if r["block_size"] is None else (
                f"flash_attention(block_size={r['block_size']})")
            lines.append(f"  {label:<32} median {r['median_ms']:9.1f} ms  "
                         f"IQR {r['q3_ms'] - r['q1_ms']:7.1f} ms  x{r['time_vs_sdpa']:.2f}")
    verdicts = [*(memory or {}).get("verdicts", []), *(kernel or {}).get("verdicts", [])]
    for v in verdicts:
        value = v["value"]
        in_bytes = "MiB" in v["target"] or "GiB" in v["target"]
        shown = _fmt_bytes(value) if in_bytes else _fmt(value, ".3f")
        limit = _fmt_bytes(v["threshold"]) if in_bytes else v["threshold"]
        lines.append(f"{'PASS' if v['passed'] else 'FAIL'}  {v['target']}: {shown} "
                     f"(threshold {limit})")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(result: dict) -> str:
    """Format :func:`run_benchmark`'s result as a text table and verdict lines.

    Args:
        result: the dict :func:`run_benchmark` returns (or its JSON, loaded).

    Returns:
        The table (one row per record, grouped by mode and sequence length),
        then one ``PASS``/``FAIL`` line per verdict, as a string.

    Raises:
        KeyError: ``result`` lacks ``metadata``, ``records`` or ``verdicts``.
    """
    meta = result["metadata"]
    lines = [
        f"attnlib.bench: {meta['device']} ({meta['device_name']}), "
        f"{meta['num_threads']} threads, torch {meta['torch_version']}, {meta['dtype']}, "
        f"batch={meta['batch']}, d_model={meta['d_model']}, num_heads={meta['num_heads']}, "
        f"qkv_bias={meta['qkv_bias']}, reps={meta['reps']} (+{meta['warmup']} warm-up), "
        f"load {meta.get('load_average_start')} -> {meta.get('load_average_end')}",
        "",
    ]
    header = (f"{'contestant':<13} {'mode':<16} {'seq_len':>7} {'median ms':>10} "
              f"{'IQR ms':>8} {'GFLOP/s':>8} {'peak MiB':>9} {'/torch_mha':>10} {'/bare':>6}")
    lines += [header, "-" * len(header)]
    previous = None
    for r in result["records"]:
        group = (r["mode"], r["seq_len"])
        if previous is not None and group != previous:
            lines.append("")
        previous = group
        lines.append(
            f"{r['contestant']:<13} {r['mode']:<16} {r['seq_len']:>7} {r['median_ms']:>10.2f} "
            f"{r['iqr_ms']:>8.2f} {r['gflops_per_s']:>8.1f} {_fmt(r['peak_memory_mb'], '9.1f'):>9} "
            f"{_fmt(r['time_vs_torch_mha'], '10.3f'):>10} "
            f"{_fmt(r['time_vs_bare_kernels'], '6.3f'):>6}")
    if result["verdicts"]:
        lines += ["", "Targets (time ratios; attnlib must be at most the threshold):"]
    for v in result["verdicts"]:
        what = (f"time <= {v['threshold']:.3g}x torch_mha's"
                if v["target"] == "attnlib_vs_torch_mha"
                else f"within {v['threshold']:.3g}x of the bare kernels (fused-QKV floor)")
        lines.append(
            f"{'PASS' if v['passed'] else 'FAIL'}  {v['mode']:<16} N={v['seq_len']:<5} "
            f"{v['target']:<24} ratio {v['ratio']:.3f} (paired {v['paired_ratio']:.3f}) "
            f"<= {v['threshold']:.3f}: {what}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnlib.bench",
        description=(
            "Time causal multi-head self-attention (GPT-2-small layer size by default): "
            "attnlib's readable reference, attnlib's fast path, torch.nn.MultiheadAttention, "
            "the bare kernels attnlib needs (one fused QKV projection), and "
            "scaled_dot_product_attention and attnlib's flash_attention alone. "
            "Reports median time, GFLOP/s and peak memory, writes JSON, and checks the "
            "targets: attnlib at least 0.9x torch_mha's speed (and at most 0.5x its time "
            "in forward at N >= 1024), and within 1.03x of the bare kernels' time. Then a "
            "memory sweep of one attention call (N up to 16384, with a log-log plot) and "
            "flash_attention's time against torch's fused kernel at N=4096, 8 heads."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seq-lens", type=int, nargs="+", default=None, metavar="N",
                   help="sequence lengths (default 256 512 1024 2048; --quick: 32 64)")
    p.add_argument("--batch", type=int, default=1, help="sequences per call")
    p.add_argument("--d-model", type=int, default=None,
                   help="embedding size (default 768; --quick: 64)")
    p.add_argument("--num-heads", type=int, default=None,
                   help="attention heads (default 12; --quick: 4)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="what to time")
    p.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS),
                   help="which implementations to time")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions per length and mode (default 15; --quick: 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed repetitions first (default 2; --quick: 1)")
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu or cuda (default: attnlib.get_device())")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="dtype")
    p.add_argument("--qkv-bias", action=argparse.BooleanOptionalAction, default=True,
                   help="biases on the query/key/value projections (torch's bias=True matches)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads before running (default: torch's choice)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    p.add_argument("--out", default="bench.json", help="where to write the JSON results")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 when a target is missed")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke test (d_model 64, 4 heads, N 32 64, 3 reps; "
                        "sweeps at N <= 256)")
    p.add_argument("--skip-layer", action="store_true",
                   help="skip the layer benchmark (run only the sweeps)")
    p.add_argument("--no-memory-sweep", action="store_true", help="skip the memory sweep")
    p.add_argument("--memory-seq-lens", type=int, nargs="+", default=None, metavar="N",
                   help="memory sweep lengths (default 256 ... 16384; --quick: 64 128 256)")
    p.add_argument("--max-reference-tokens", type=int, default=None,
                   help="largest N the readable path runs at in the memory sweep; beyond it "
                        "its memory is extrapolated (default 4096; --quick: 128)")
    p.add_argument("--plot", default="bench_memory.png",
                   help="where to save the memory sweep's log-log plot ('' for none)")
    p.add_argument("--no-kernel-timing", action="store_true",
                   help="skip timing flash_attention against torch's fused kernel")
    p.add_argument("--kernel-tokens", type=int, default=None,
                   help="N of the kernel timing (default 4096; --quick: 128)")
    p.add_argument("--kernel-heads", type=int, default=None,
                   help="heads of the kernel timing (default 8; --quick: 2)")
    p.add_argument("--kernel-block-sizes", type=int, nargs="+", default=None,
                   help="flash_attention block sizes to time (default 128 256 512; "
                        "--quick: 16 64)")
    p.add_argument("--kernel-reps", type=int, default=None,
                   help="timed repetitions of the kernel timing (default 5; --quick: 2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m attnlib.bench [options]``.

    Args:
        argv: the arguments (default ``sys.argv[1:]``); see ``--help``.

    Returns:
        The exit status: 0, or 1 with ``--check`` when a target is missed.
        Bad arguments (a non-positive size, an unknown device, ...) exit with
        status 2 and a message, as argparse does.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    quick = args.quick
    seq_lens = args.seq_lens or ([32, 64] if quick else [256, 512, 1024, 2048])
    d_model = args.d_model or (64 if quick else 768)
    num_heads = args.num_heads or (4 if quick else 12)
    reps = args.reps if args.reps is not None else (3 if quick else 15)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    if args.threads is not None:
        if args.threads <= 0:
            parser.error(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device) if args.device is not None else None
    except RuntimeError as exc:
        parser.error(f"--device {args.device!r} is not a torch device: {exc}")
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device!r} asked for CUDA, but CUDA is not available")

    def log(line: str) -> None:
        print(line, flush=True)

    dtype = _DTYPES[args.dtype]
    memory_lens = args.memory_seq_lens or ([64, 128, 256] if quick else
                                           list(MEMORY_SWEEP_SEQ_LENS))
    max_reference = args.max_reference_tokens or (128 if quick else 4096)
    kernel_tokens = args.kernel_tokens or (128 if quick else 4096)
    kernel_heads = args.kernel_heads or (2 if quick else 8)
    kernel_blocks = args.kernel_block_sizes or ([16, 64] if quick else [128, 256, 512])
    kernel_reps = args.kernel_reps or (2 if quick else 5)
    try:
        if args.skip_layer:
            result = {"schema_version": SCHEMA_VERSION, "metadata": {}, "records": [],
                      "verdicts": [], "all_targets_met": True}
        else:
            result = run_benchmark(
                seq_lens, batch=args.batch, d_model=d_model, num_heads=num_heads,
                modes=args.modes, contestants=args.contestants, reps=reps, warmup=warmup,
                device=device, dtype=dtype, qkv_bias=args.qkv_bias,
                measure_memory=not args.no_memory, seed=args.seed, log=log)
        memory = None if args.no_memory_sweep else run_memory_sweep(
            memory_lens, max_reference_tokens=max_reference, device=device, dtype=dtype,
            seed=args.seed, log=log)
        kernel = None if args.no_kernel_timing else run_kernel_timing(
            kernel_tokens, num_heads=kernel_heads, block_sizes=kernel_blocks,
            reps=kernel_reps, warmup=1, device=device, dtype=dtype, seed=args.seed)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    result["memory_sweep"] = memory
    result["kernel_timing"] = kernel
    sweep_verdicts = [*(memory or {}).get("verdicts", []), *(kernel or {}).get("verdicts", [])]
    result["all_targets_met"] = bool(
        result["all_targets_met"] and all(v["passed"] for v in sweep_verdicts))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print()
    if not args.skip_layer:
        print(format_table(result))
        print()
    print(format_sweeps(memory, kernel))
    print(f"\nwrote {os.path.abspath(args.out)}")
    if memory is not None and args.plot:
        print(f"wrote {os.path.abspath(plot_memory_sweep(memory, args.plot))}")
    if args.check and not result["all_targets_met"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
