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

import math
import numbers
import sys

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
    "check_sdpa_inputs",
]


def type_name(value: object) -> str:
    """The full name of ``value``'s type: ``int``, ``numpy.int64``, ``torch.Tensor``.

    A PyTorch type is named by its shortest public path (``torch.nn.Linear``,
    not ``torch.nn.modules.linear.Linear``).
    """
    cls = type(value)
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    if module.startswith("torch"):
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            public = ".".join(parts[:i])
            if getattr(sys.modules.get(public), cls.__qualname__, None) is cls:
                return f"{public}.{cls.__qualname__}"
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
    value = float(dropout)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={dropout}")
    return value


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
    index = int(dim)
    if not -x.ndim <= index < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimension(s)")
    return index


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


def check_sdpa_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> None:
    """The arguments of a scaled dot-product attention call, before any computation.

    Shared by :func:`attnlib.scaled_dot_product_attention` and
    :func:`attnlib.functional.flash_attention`, so both refuse bad input with
    the same words.

    Raises:
        TypeError: ``query``, ``key`` or ``value`` is not a floating-point
            tensor, their dtypes differ, ``dropout_p`` or ``scale`` is not a
            real number, ``is_causal`` is not a bool, or ``attn_mask`` is not a
            tensor (or None) of dtype bool or the query's dtype.
        ValueError: they are on different devices, have fewer than 2
            dimensions, disagree on ``d_k``, ``num_tokens_kv`` or the leading
            dimensions; ``dropout_p`` is outside ``[0, 1)``; ``scale`` is not
            finite; ``attn_mask`` does not broadcast to the scores' shape, or
            comes with ``is_causal=True``.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_float_tensor(name, t, min_ndim=2)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            "query, key and value must share a dtype, got "
            f"{query.dtype}, {key.dtype}, {value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise ValueError(
            "query, key and value must be on one device, got "
            f"{query.device}, {key.device}, {value.device}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query and key must have the same d_k, got query {tuple(query.shape)} "
            f"and key {tuple(key.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key and value must have the same num_tokens_kv, got key {tuple(key.shape)} "
            f"and value {tuple(value.shape)}"
        )
    if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
        raise ValueError(
            "query, key and value must have the same leading (batch, head) dimensions, got "
            f"{tuple(query.shape[:-2])}, {tuple(key.shape[:-2])} and {tuple(value.shape[:-2])}"
        )
    if _is_bool(dropout_p) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type_name(dropout_p)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    check_bool("is_causal", is_causal)
    if scale is not None:
        if _is_bool(scale) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a float or None, got {type_name(scale)}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    if attn_mask is not None:
        _check_attn_mask(attn_mask, query, key, is_causal)


def _check_attn_mask(
    attn_mask: object, query: torch.Tensor, key: torch.Tensor, is_causal: bool
) -> None:
    if is_causal:
        raise ValueError("give either attn_mask or is_causal=True, not both")
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type_name(attn_mask)}")
    if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
        raise TypeError(
            f"attn_mask must be bool or have the query's dtype {query.dtype}, "
            f"got {attn_mask.dtype}"
        )
    scores_shape = (*query.shape[:-1], key.shape[-2])
    try:
        broadcast = torch.broadcast_shapes(attn_mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the "
            f"attention scores' shape {scores_shape}"
        )
