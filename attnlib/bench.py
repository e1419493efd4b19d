"""Time and measure causal multi-head self-attention: ``python -m attnlib.bench``.

The benchmark compares, on one device and in one run, five ways to compute (or
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
* ``bare_kernels`` - the bare operations attnlib's fast path needs, as a plain
  function of weight tensors: three :func:`torch.nn.functional.linear`
  projections, ``view``/``transpose`` into heads,
  ``scaled_dot_product_attention(is_causal=True)``, ``transpose`` back and ``reshape``
  (a copy), and the output :func:`~torch.nn.functional.linear`.
  attnlib can at best match it; the gap is the module's overhead.
* ``sdpa_only`` - :func:`torch.nn.functional.scaled_dot_product_attention`
  alone on already projected queries, keys and values, laid out as attnlib
  passes them (a transposed view of ``(batch, num_tokens, d_model)``): the
  attention kernel without the projections, to show where the time goes.

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
and a JSON file (see :func:`run_benchmark` for its schema).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
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
    "format_table",
    "main",
]

CONTESTANTS = ("reference", "attnlib", "torch_mha", "bare_kernels", "sdpa_only")
"""The contestants' names, in the order they are reported."""

MODES = ("forward", "forward_backward")
"""The timed modes."""

TARGET_VS_TORCH_MHA = 1.0 / 0.9
"""attnlib's time may be at most this multiple of torch_mha's (speed >= 0.9x)."""

TARGET_VS_BARE_KERNELS = 1.05
"""attnlib's time may be at most this multiple of bare_kernels'."""

SCHEMA_VERSION = 1

_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           "float16": torch.float16, "bfloat16": torch.bfloat16}

# Full-layer contestants compute the whole layer; sdpa_only only the attention.
_LAYER_CONTESTANTS = ("reference", "attnlib", "torch_mha", "bare_kernels")


@dataclass(frozen=True)
class Contestant:
    """One way of computing causal self-attention, ready to be timed.

    Attributes:
        name: one of :data:`CONTESTANTS`.
        description: one line saying what is called.
        fn: ``fn(*inputs)`` returns the output tensor; for a full-layer
            contestant ``inputs`` is ``(x,)`` and the output is
            ``(batch, num_tokens, d_model)``; for ``sdpa_only`` the inputs are
            the projected ``(queries, keys, values)``, each
            ``(batch, num_tokens, d_model)``, and the output is
            ``(batch, num_heads, num_tokens, head_dim)``.
        make_inputs: maps ``x`` ``(batch, num_tokens, d_model)`` to new leaf
            tensors (requiring gradients) that ``fn`` takes.
        params: the parameter tensors whose gradients the backward computes.
        full_layer: True when ``fn`` computes the whole layer (projections
            included); False for ``sdpa_only``.
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
    ``in_proj_weight`` (rows: query, key, value), and ``bare_kernels`` and
    ``sdpa_only`` get detached copies, so no two contestants share a gradient.

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

    def bare_kernels(x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = x.shape
        queries = F.linear(x, w_q, b_q).view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # queries: (b, num_heads, num_tokens, head_dim)
        keys = F.linear(x, w_k, b_k).view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # keys: (b, num_heads, num_tokens, head_dim)
        values = F.linear(x, w_v, b_v).view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
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
            params = tuple(t for t in (w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o) if t is not None)
            out[name] = Contestant(
                name, "3x F.linear + scaled_dot_product_attention(is_causal=True) + F.linear",
                bare_kernels, _leaf, params)
        else:
            out[name] = Contestant(
                name, "F.scaled_dot_product_attention(is_causal=True) on projected q, k, v",
                sdpa_only, sdpa_inputs, (), full_layer=False)
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
        A dict with these keys (the JSON schema, version 1):

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
          ``sdpa_only``).
        * ``verdicts`` (list of dicts), one per target, mode and length where
          the contestants are present: ``target`` (``"attnlib_vs_torch_mha"``
          or ``"attnlib_vs_bare_kernels"``), ``mode``, ``seq_len``, ``ratio``
          (attnlib's median time over the other's), ``paired_ratio`` (median
          over repetitions of the per-repetition ratio, a noise check),
          ``threshold`` (largest allowed ratio), ``passed`` (bool).
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
                        "forward_backward = 3*forward; sdpa_only: 4*b*N^2*d (x3)",
        "targets": {"attnlib_vs_torch_mha": TARGET_VS_TORCH_MHA,
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
                })
            for other, threshold in (("torch_mha", TARGET_VS_TORCH_MHA),
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
        what = ("speed >= 0.9x torch_mha" if v["target"] == "attnlib_vs_torch_mha"
                else "within 1.05x of bare kernels")
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
            "the bare kernels attnlib needs, and scaled_dot_product_attention alone. "
            "Reports median time, GFLOP/s and peak memory, writes JSON, and checks two "
            "targets: attnlib at least 0.9x torch_mha's speed, and within 1.05x of the "
            "bare kernels' time."),
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
                   help="tiny sizes for a smoke test (d_model 64, 4 heads, N 32 64, 3 reps)")
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

    try:
        result = run_benchmark(
            seq_lens, batch=args.batch, d_model=d_model, num_heads=num_heads,
            modes=args.modes, contestants=args.contestants, reps=reps, warmup=warmup,
            device=device, dtype=_DTYPES[args.dtype], qkv_bias=args.qkv_bias,
            measure_memory=not args.no_memory, seed=args.seed, log=log)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print()
    print(format_table(result))
    print(f"\nwrote {os.path.abspath(args.out)}")
    if args.check and not result["all_targets_met"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
