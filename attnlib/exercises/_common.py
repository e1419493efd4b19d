"""What every checker shares: the failure type, calling the learner's code
safely, seeded probes, comparing tensors and naming the typical wrong answer,
and leaving the global random state alone.

A checker module imports from here; the checkers of attention modules also
import from ``attnlib.exercises._attention_modules``, which builds on this one.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from .._validation import type_name

__all__ = [
    "CheckFailed",
    "checker",
    "require_callable",
    "require_class",
    "call_answer",
    "require_tensor",
    "require_unchanged",
    "is_close",
    "same_or_both_nonfinite",
    "name_wrong_answer",
    "judge",
    "passed",
    "probe_device",
    "seeded_randn",
    "answer_name",
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
    """Call the learner's ``fn``; an exception it raises becomes a CheckFailed that says so.

    The message names the exception, the line of the learner's code that raised
    it (where there is one) and the shapes and dtypes of the tensors ``fn`` was
    called with, so that an error such as an ``IndexError`` from ``torch.bmm``
    or a bare ``assert`` can be traced to the input that caused it. An empty
    stub (``NotImplementedError``) is reported as a stub.
    """
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise CheckFailed(
            f"{what} raised NotImplementedError: replace the stub's `raise NotImplementedError` "
            "with your code."
        ) from None
    except CheckFailed:
        raise
    except Exception as exc:  # any error in the learner's code is reported
        where = _learner_line(exc)
        called = _describe_arguments(fn, args, kwargs)
        text = f": {exc}" if str(exc).strip() else ""  # a bare assert has no message
        raise CheckFailed(f"{what} raised {type_name(exc)}{where}{called}{text}") from exc


#: Folders whose frames are not the learner's: the standard library, installed
#: packages (torch among them) and attnlib itself.
_NOT_LEARNER_CODE = tuple(
    os.path.normcase(os.path.abspath(folder)) + os.sep
    for folder in (sysconfig.get_paths()["stdlib"], os.path.dirname(os.path.dirname(__file__)))
)


def _learner_line(exc: BaseException) -> str:
    """`` at line N of fn, `source` `` for the innermost frame of the learner's
    code in ``exc``'s traceback, or ``""`` when none is found."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.normcase(os.path.abspath(frame.filename))
        if path.startswith(_NOT_LEARNER_CODE) or "site-packages" in path or (
                "dist-packages" in path):
            continue
        line = (frame.line or "").strip()
        source = f", `{line[:77]}...`" if len(line) > 80 else (f", `{line}`" if line else "")
        return f" at line {frame.lineno} of {frame.name}{source}"
    return ""


def _describe_argument(name: str, value: Any) -> str:
    """``x (shape (4, 7), torch.float64)``, ``sa_v1 (attnlib...SelfAttention_v1)`` or
    ``group_size=2``: one argument of a call, as a message shows it."""
    if isinstance(value, torch.Tensor):
        device = "" if value.device.type == "cpu" else f", on {value.device}"
        return f"{name} (shape {tuple(value.shape)}, {value.dtype}{device})"
    if isinstance(value, nn.Module):
        return f"{name} ({type_name(value)})"
    text = repr(value)
    return f"{name}={text if len(text) <= 40 else text[:37] + '...'}"


def _describe_arguments(fn: Callable[..., Any], args: Sequence[Any],
                        kwargs: Mapping[str, Any]) -> str:
    """``", when called with x (shape (4, 7), torch.float64) and dim=-1"``: the
    arguments of a call, each by its parameter's name where ``fn``'s signature
    gives it, a tensor by its shape, dtype and (off the CPU) device.

    Returns ``""`` for a call without arguments.
    """
    try:
        signature = inspect.signature(fn.forward if isinstance(fn, nn.Module) else fn)
        parameters = [p for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin without a signature
        parameters = []
    names = [parameters[i].name if i < len(parameters) else f"argument {i + 1}"
             for i in range(len(args))]
    described = [_describe_argument(name, value)
                 for name, value in [*zip(names, args, strict=True), *kwargs.items()]]
    if not described:
        return ""
    listed = described[0] if len(described) == 1 else (
        ", ".join(described[:-1]) + " and " + described[-1])
    return f", when called with {listed}"


def answer_name(answer: object, default: str) -> str:
    """The name of the learner's function or class, for messages; ``default`` for a
    lambda, a ``functools.partial`` or another callable without a usable name."""
    name = getattr(answer, "__name__", "")
    return name if name.isidentifier() else default


def seeded_randn(generator: torch.Generator, *shape: int, device: torch.device,
                 scale: float = 1.0, shift: float = 0.0,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A probe ``randn(*shape) * scale + shift`` drawn from ``generator`` on the CPU
    and then moved to ``device``, so that every device sees the same numbers.

    Returns:
        A tensor of ``shape`` and ``dtype`` (default float64) on ``device``.
    """
    x = torch.randn(*shape, generator=generator, dtype=dtype) * scale + shift
    return x.to(device)


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


def require_unchanged(what: str, saved: Sequence[torch.Tensor], now: Sequence[torch.Tensor],
                      names: Sequence[str]) -> None:
    """Each argument ``now[i]`` must still equal its copy ``saved[i]``, taken before the call.

    Raises:
        CheckFailed: naming the first argument, ``names[i]``, that the learner's
            code changed in place.
    """
    for before, after, name in zip(saved, now, names, strict=True):
        if not torch.equal(before, after):
            raise CheckFailed(
                f"{what} changed its argument {name} in place (an in-place operation such as "
                f"`{name} -= ...`, `{name} /= ...` or `{name}.sub_(...)`). Compute a new "
                f"tensor instead, such as `shifted = {name} - ...`, and leave {name} as it was."
            )


def is_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL,
             rtol: float = RTOL) -> bool:
    """Same shape and ``|actual - expected| <= atol + rtol * |expected|`` everywhere.

    nan compares equal to nan (a wrong answer that overflows is recognised).
    """
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual.to(expected.dtype), expected, atol=atol, rtol=rtol,
                               equal_nan=True))


def same_or_both_nonfinite(actual: torch.Tensor, wrong: torch.Tensor) -> bool:
    """``actual`` reproduces ``wrong``, a typical mistake's result: the same shape, close
    where ``wrong`` is finite, and nan or +-inf exactly where it is not.

    Two ways of writing one mistake that overflows need not give the same kind of
    non-finite number (``inf / inf`` is nan, ``log(inf)`` is inf), so any mix counts.
    """
    if actual.shape != wrong.shape:
        return False
    bad = ~torch.isfinite(wrong)
    if not torch.equal(~torch.isfinite(actual), bad):
        return False
    return is_close(actual[~bad], wrong[~bad])


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


def judge(out: torch.Tensor, expected: torch.Tensor, wrong_answers: Mapping[str, torch.Tensor],
          what: str, probe: str, *, reference: str = "the right answer",
          advice: str = "Compare your result with the reference on a small input, one step "
                        "at a time.") -> None:
    """Return if ``out`` matches ``expected``; otherwise raise CheckFailed naming the mistake.

    The message is ``"{what} {mistake} (seen on {probe})."`` for the first of
    ``wrong_answers`` that ``out`` matches; nan or inf where ``expected`` is finite
    is named as an overflowing exponential; anything else gets the largest
    difference from ``reference`` and ``advice``.
    """
    if is_close(out, expected):
        return
    mistake = name_wrong_answer(out, wrong_answers)
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake} (seen on {probe}).")
    if not torch.isfinite(out).all() and torch.isfinite(expected).all():
        raise CheckFailed(
            f"{what} returned nan or inf on {probe}, where the right answer is finite. "
            "Does an exponential overflow? Subtract the maximum along the softmax's "
            "dimension before exponentiating, or use torch.softmax."
        )
    raise CheckFailed(
        f"{what} differs from {reference} by up to {max_difference(out, expected):.3g} "
        f"on {probe}, and it matches none of the typical mistakes this check knows. {advice}"
    )


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

