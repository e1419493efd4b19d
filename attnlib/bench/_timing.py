"""Timing contestants: ``warmup`` untimed and ``reps`` timed repetitions,
interleaved round-robin with a rotating order, garbage collector off, with
:func:`torch.cuda.synchronize` around each call on CUDA
(:func:`time_contestants`). Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

from .._validation import check_positive_int as _check_positive_int
from . import MODES
from ._contestants import Contestant


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
