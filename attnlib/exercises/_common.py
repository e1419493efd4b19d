"""What every checker shares: the failure type, calling the learner's code
safely, comparing tensors, and leaving the global random state alone.

A checker module imports from here and nowhere else in ``attnlib.exercises``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._validation import type_name

__all__ = [
    "CheckFailed",
    "checker",
    "require_callable",
    "require_class",
    "call_answer",
    "require_tensor",
    "is_close",
    "name_wrong_answer",
    "passed",
    "probe_device",
    "max_difference",
    "name_nan_output",
    "linear_from_weights",
    "ATOL",
    "RTOL",
]

#: Tolerances every checker uses for float64 probes unless it says otherwise.
ATOL = 1e-6
RTOL = 1e-5


class CheckFailed(AssertionError):
    """The learner's answer does not behave like the reference.

    A subclass of ``AssertionError``, so that pytest reports a failed check in
    an instructor's assignment as a test failure, not an error. The message
    names the likely mistake and how to see it.

    In a notebook, IPython shows only that message, not a stack of the
    checker's own frames: the learner needs the mistake, not attnlib's code.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"CheckFailed: {self}"]


def checker(fn: Callable[..., bool]) -> Callable[..., bool]:
    """Decorate a ``check_*`` function: run it without touching the global RNG.

    The probes a checker draws come from its own seeded generators; this also
    forks torch's global CPU and CUDA random states, so that dropout inside the
    learner's code cannot move the notebook's random stream either.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> bool:
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            return fn(*args, **kwargs)

    return wrapper


def probe_device(device: torch.device | str | None) -> torch.device:
    """The device to probe on: ``device`` if given, else the CPU.

    Raises:
        TypeError: ``device`` is not a ``torch.device``, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.
    """
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a torch.device, a str or None, got {type_name(device)}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device} was asked for, but this machine has no CUDA GPU")
    return device


def require_callable(answer: object, what: str) -> None:
    """``answer`` must be callable (a function); a string, tensor, ... is a CheckFailed."""
    if isinstance(answer, type) or not callable(answer):
        raise CheckFailed(
            f"expected {what}, a function, but got {type_name(answer)} {answer!r:.60}. "
            "Pass the function itself, without calling it: check(my_fn), not check(my_fn())."
        )


def require_class(answer: object, what: str) -> None:
    """``answer`` must be a class (a subclass of ``torch.nn.Module``)."""
    if not isinstance(answer, type):
        raise CheckFailed(
            f"expected {what}, a class, but got {type_name(answer)} {answer!r:.60}. "
            "Pass the class itself, not an instance: "
            "check(MyAttention), not check(MyAttention(...))."
        )
    if not issubclass(answer, torch.nn.Module):
        raise CheckFailed(f"expected {what} to be a subclass of torch.nn.Module, got {answer!r}")


def call_answer(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """Call the learner's ``fn``; an exception it raises becomes a CheckFailed that says so."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise CheckFailed(
            f"{what} raised NotImplementedError: replace the stub's `raise NotImplementedError` "
            "with your code."
        ) from None
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in the learner's code is reported
        raise CheckFailed(f"{what} raised {type(exc).__name__}: {exc}") from exc


def require_tensor(
    out: object,
    what: str,
    shape: tuple[int, ...],
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``out`` must be a tensor of ``shape`` (and ``dtype``, ``device`` if given)."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        raise CheckFailed(
            f"{what} returned a tuple of {len(out)}; expected one tensor of shape {shape}. "
            "Return only the context vectors (or the asked-for tensor)."
        )
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(
            f"{what} returned {type_name(out)}; expected a torch.Tensor of shape {shape}"
        )
    if tuple(out.shape) != tuple(shape):
        raise CheckFailed(f"{what} returned shape {tuple(out.shape)}; expected {tuple(shape)}")
    if dtype is not None and out.dtype != dtype:
        raise CheckFailed(f"{what} returned dtype {out.dtype}; expected {dtype}")
    if device is not None and out.device.type != device.type:
        raise CheckFailed(f"{what} returned a tensor on {out.device}; expected it on {device}")
    return out


def is_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL,
             rtol: float = RTOL) -> bool:
    """Same shape and ``|actual - expected| <= atol + rtol * |expected|`` everywhere.

    nan compares equal to nan (a wrong answer that overflows is recognised).
    """
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual.to(expected.dtype), expected, atol=atol, rtol=rtol,
                               equal_nan=True))


def name_wrong_answer(
    actual: torch.Tensor,
    wrong_answers: Mapping[str, torch.Tensor],
    atol: float = ATOL,
    rtol: float = RTOL,
) -> str | None:
    """The message of the first typical wrong answer that ``actual`` matches, or None."""
    for message, wrong in wrong_answers.items():
        if is_close(actual, wrong, atol, rtol):
            return message
    return None


def max_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference, for a message (nan where either is nan)."""
    diff = (actual.to(expected.dtype) - expected).abs()
    value = float(diff.max()) if diff.numel() else 0.0
    return value if not math.isnan(value) else float("nan")


def passed(message: str) -> bool:
    """Print one short success line and return True."""
    print(f"Correct: {message}")
    return True


def name_nan_output(out: torch.Tensor, what: str) -> None:
    """Raise CheckFailed naming the token positions where ``out`` (batch, num_tokens, ...) is nan.

    Such rows come from a softmax over scores that are all -inf: a mask that
    hides every key of those queries.
    """
    nan_positions = out.isnan().any(dim=-1).any(dim=0).nonzero().flatten().tolist()
    if nan_positions:
        raise CheckFailed(
            f"{what} gives nan at positions {nan_positions}. The softmax of a row of scores "
            "that are all -inf is 0/0: every key of those queries is masked out. Check that "
            "the mask keeps the diagonal, that -inf goes where the mask is False, and the "
            "softmax's dim."
        )


def linear_from_weights(
    x: torch.Tensor, weights: dict[str, torch.Tensor], name: str
) -> torch.Tensor:
    """``x @ weights[name].T (+ weights[name + ".bias"])``: an ``nn.Linear`` recomputed
    from the weights a checker copied into the learner's module, for its reference.

    Args:
        x: ``(..., in_features)``.
        weights: the copied tensors, ``name`` -> ``(out_features, in_features)``
            and, where the layer has a bias, ``name + ".bias"`` -> ``(out_features,)``.
        name: the layer's attribute name, e.g. ``"W_query"``.

    Returns:
        ``(..., out_features)``.
    """
    out = x @ weights[name].T
    if name + ".bias" in weights:
        out = out + weights[name + ".bias"]
    return out
