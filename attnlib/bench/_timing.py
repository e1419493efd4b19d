"""Timing contestants with :class:`torch.utils.benchmark.Timer`, one call per
contestant per repetition, interleaved round-robin with a rotating order
(:func:`time_contestants`). Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils import benchmark

from .._validation import check_int as _check_int
from .._validation import check_positive_int as _check_positive_int
from .._validation import type_name
from ._constants import MODES
from ._contestants import Contestant


@dataclass(frozen=True)
class PreparedCall:
    """A contestant's call to time (``step``), its gradient reset and its Timer."""

    contestant: Contestant
    step: Callable[[], None]
    clear_grads: Callable[[], None]
    timer: benchmark.Timer


def _make_step(contestant: Contestant, inputs: tuple[torch.Tensor, ...], mode: str,
               grad_output: torch.Tensor | None) -> Callable[[], None]:
    if mode == "forward":
        def step() -> None:
            with torch.inference_mode():
                contestant.fn(*inputs)
    else:
        def step() -> None:
            contestant.fn(*inputs).backward(grad_output)
    return step


def prepare_call(contestant: Contestant, inputs: tuple[torch.Tensor, ...], mode: str,
                 grad_output: torch.Tensor | None) -> PreparedCall:
    step = _make_step(contestant, inputs, mode, grad_output)

    def clear_grads() -> None:  # the Timer's setup: runs before each timed call, untimed
        for t in (*contestant.params, *inputs):
            t.grad = None

    timer = benchmark.Timer(
        stmt="step()", setup="clear_grads()",
        globals={"step": step, "clear_grads": clear_grads},
        num_threads=torch.get_num_threads(), description=contestant.name,
    )
    return PreparedCall(contestant, step, clear_grads, timer)


def check_mode(mode: object) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def check_warmup(warmup: object) -> int:
    return _check_int("warmup", warmup, minimum=0)


def prepare_all(contestants: dict[str, Contestant], x: torch.Tensor, mode: str,
             seed: int) -> dict[str, PreparedCall]:
    """Inputs, a fixed random ``grad_output`` (seeded) and a Timer for each contestant."""
    prepared = {}
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, c in contestants.items():
        inputs = c.make_inputs(x)
        with torch.no_grad():
            shape = c.fn(*inputs).shape
        grad_output = torch.randn(shape, generator=gen).to(device=x.device, dtype=x.dtype)
        prepared[name] = prepare_call(c, inputs, mode, grad_output)
    return prepared


def time_prepared(prepared: dict[str, PreparedCall], reps: int,
                   warmup: int) -> dict[str, list[float]]:
    """``warmup + reps`` round-robin repetitions; each contestant's last ``reps`` times (s).

    ``Timer.blocked_autorange(min_run_time=0)`` runs one untimed warm-up call
    and then times one call (its smallest block), with the GPU synchronised,
    the threads fixed and the garbage collector off.
    """
    names = list(prepared)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(warmup + reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            measurement = prepared[name].timer.blocked_autorange(min_run_time=0.0)
            if rep >= warmup:
                times[name].extend(measurement.times)  # one call: one time
    for p in prepared.values():
        p.clear_grads()
    return times


def quantiles(times: list[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (linear interpolation)."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    q1, median, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, median, q3


def time_contestants(
    contestants: dict[str, Contestant],
    x: torch.Tensor,
    mode: str,
    *,
    reps: int = 15,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Time the contestants on one input, interleaved round-robin.

    Each of the ``warmup + reps`` repetitions times one call of every
    contestant with :class:`torch.utils.benchmark.Timer`, in an order that
    rotates by one place per repetition; only the last ``reps`` are kept.
    Each timed call follows an untimed one of the same contestant; gradients
    are cleared before each call, outside the timed region; Python's garbage
    collector is off while timing.

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
    check_mode(mode)
    _check_positive_int("reps", reps)
    check_warmup(warmup)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, num_tokens, d_model), got shape {tuple(x.shape)}")
    prepared = prepare_all(contestants, x, mode, seed=1)
    return time_prepared(prepared, reps, warmup)
