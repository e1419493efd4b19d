"""Argument checks shared by every attnlib module.

Each check runs before any computation and raises ``TypeError`` or
``ValueError`` with a message that names the argument, the value it got and
what was expected, as PyTorch's own errors do. Every module imports its checks
from here, so a lower module never imports a higher one for a helper.

Integers and bools from NumPy are accepted wherever Python's are
(``numpy.int64(3)``, ``numpy.bool_(True)``), and a wrong type is named in full
(``numpy.float64``, not ``float64``).
"""

from __future__ import annotations

import numbers

import torch

__all__ = [
    "type_name",
    "check_int",
    "check_positive_int",
    "check_bool",
    "check_dropout",
    "check_float_tensor",
    "check_dim",
    "check_input",
]


def type_name(value: object) -> str:
    """The full name of ``value``'s type: ``int``, ``numpy.int64``, ``torch.Tensor``."""
    cls = type(value)
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    if module.startswith("torch"):
        module = "torch"
    return f"{module}.{cls.__qualname__}"


def _is_bool(value: object) -> bool:
    # numpy.bool_ is not a subclass of bool; recognise it by name so that numpy
    # stays an optional import here.
    return isinstance(value, bool) or type_name(value) == "numpy.bool"


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``value`` as a Python int; a bool, float or other type is a ``TypeError``.

    Raises:
        TypeError: ``value`` is not an integer (bools are refused).
        ValueError: ``value`` is below ``minimum``.
    """
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type_name(value)} {name}={value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as a Python int if it is an integer >= 1.

    Raises:
        TypeError: ``value`` is not an integer (bools are refused).
        ValueError: ``value`` is zero or negative.
    """
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type_name(value)} {name}={value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {name}={value}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` as a Python bool if it is ``bool`` or ``numpy.bool_``.

    Raises:
        TypeError: ``value`` is anything else (``0``/``1`` included).
    """
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool, got {type_name(value)} {name}={value!r}")
    return bool(value)


def check_dropout(dropout: object, name: str = "dropout") -> float:
    """Return ``dropout`` as a float if it is a real number in ``[0, 1)``.

    Raises:
        TypeError: ``dropout`` is not a real number (bools are refused).
        ValueError: ``dropout`` is outside ``[0, 1)``.
    """
    if _is_bool(dropout) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type_name(dropout)} {name}={dropout!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={dropout}")
    return float(dropout)


def check_float_tensor(name: str, x: object, min_ndim: int = 1) -> None:
    """``x`` must be a floating-point ``torch.Tensor`` with at least ``min_ndim`` dimensions.

    Raises:
        TypeError: ``x`` is not a tensor, or its dtype is not floating point.
        ValueError: ``x`` has fewer than ``min_ndim`` dimensions.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}"
        )


def check_dim(x: torch.Tensor, dim: object) -> int:
    """Return ``dim`` as an int if it indexes a dimension of ``x``.

    Raises:
        TypeError: ``dim`` is not an integer.
        ValueError: ``dim`` is out of range for ``x``.
    """
    if _is_bool(dim) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type_name(dim)} dim={dim!r}")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimension(s)")
    return int(dim)


def check_input(
    x: object,
    d_in: int,
    ndims: tuple[int, ...],
    context_length: int | None = None,
    *,
    like: torch.Tensor | None = None,
) -> None:
    """Cheap checks of a module's forward input (no tensor operations).

    Args:
        x: the input; must be a floating-point tensor of rank in ``ndims``
            whose last dimension is ``d_in``.
        d_in: the module's input size.
        ndims: allowed ranks, ``(3,)`` or ``(2, 3)``.
        context_length: the most tokens allowed, or None.
        like: a parameter of the module; ``x`` must share its dtype and device,
            so a mismatch is reported here rather than by torch's matmul.

    Raises:
        TypeError: ``x`` is not a floating-point tensor, or its dtype differs
            from ``like``'s.
        ValueError: wrong rank, last dimension not ``d_in``, no tokens, more
            tokens than ``context_length``, or ``x`` on another device than
            ``like``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if not x.is_floating_point():
        raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
    if x.ndim not in ndims:
        expected = (
            "(batch, num_tokens, d_in)"
            if ndims == (3,)
            else "(num_tokens, d_in) or (batch, num_tokens, d_in)"
        )
        raise ValueError(f"x must be {expected}, got {x.ndim}-D shape {tuple(x.shape)}")
    if x.shape[-1] != d_in:
        raise ValueError(
            f"x.shape[-1]={x.shape[-1]} does not match d_in={d_in} (x has shape {tuple(x.shape)})"
        )
    num_tokens = x.shape[-2]
    if num_tokens == 0:
        raise ValueError(f"x must hold at least one token, got shape {tuple(x.shape)}")
    if context_length is not None and num_tokens > context_length:
        raise ValueError(f"num_tokens={num_tokens} exceeds context_length={context_length}")
    if like is not None:
        if x.dtype != like.dtype:
            raise TypeError(
                f"x has dtype {x.dtype} but the module's parameters are {like.dtype}: "
                f"convert one to match, e.g. x.to({like.dtype}) or module.to({x.dtype})"
            )
        if x.device != like.device:
            raise ValueError(
                f"x is on {x.device} but the module's parameters are on {like.device}: "
                f"move one, e.g. x.to('{like.device}') or module.to('{x.device}')"
            )
