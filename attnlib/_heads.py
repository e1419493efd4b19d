"""Plumbing of the attention modules (a private module with public names).

:mod:`attnlib.attention` and :mod:`attnlib.multihead` import these helpers
from here, below both of them:

* :func:`register_causal_mask` (chapter 5 prints it) and
  :func:`register_no_mask`: the bool ``mask`` buffer and its loading rule
  (the load-state-dict pre-hooks :func:`keep_own_mask` and
  :func:`drop_incoming_mask`);
* :func:`resolve_head_dim`, :func:`check_key_padding_mask`,
  :func:`num_cached`, :func:`check_context` and
  :func:`check_plain_multi_head`: the checks of the multi-head modules'
  arguments, made before any computation;
* :func:`moved_keywords`: the decorator of an ``__init__`` whose options
  moved to a later chapter's class.

The attention computation itself (readable, fused or tiled, with grouped
key/value heads) is :func:`attnlib.functional.attention`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn as nn

from ._validation import check_positive_int, type_name
from .functional import causal_mask
from .kv_cache import KVCache

_F = TypeVar("_F", bound=Callable[..., Any])


def register_causal_mask(module: nn.Module, context_length: int) -> None:
    """Give ``module`` a bool ``mask`` buffer (True = may attend) that survives loading.

    The buffer is persistent, so state_dict keys match the reference
    implementation's (Raschka 2024, ch. 3, which also calls it ``mask``). That
    reference stores a *float* mask that is 1 where attention is **blocked**;
    copied into a bool buffer it would flip the mask. The mask is fully
    determined by ``context_length``, so loading keeps the module's own mask:
    an incoming ``mask`` of the right shape is replaced by it (a wrong shape
    still fails with torch's usual size-mismatch error).
    """
    module.register_buffer("mask", causal_mask(context_length), persistent=True)
    module.register_load_state_dict_pre_hook(keep_own_mask)


def keep_own_mask(
    module: nn.Module,
    state_dict: dict[str, object],
    prefix: str,
    local_metadata: dict[str, object],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load-state-dict pre-hook of :func:`register_causal_mask`: keep the module's own mask.

    An incoming ``mask`` of the module's shape, or none at all, is replaced by
    the module's buffer; one of another shape is left for torch's size check.
    The arguments are those of ``nn.Module.register_load_state_dict_pre_hook``.
    """
    # ``load_state_dict`` hands hooks its own shallow copy of the caller's dict,
    # so replacing an entry here does not change the caller's state_dict.
    key = prefix + "mask"
    incoming = state_dict.get(key)
    own = module.get_buffer("mask")
    if incoming is None or (isinstance(incoming, torch.Tensor) and incoming.shape == own.shape):
        # (A state_dict without a mask, saved by a module built with
        # mask_buffer=False, loads too: the mask is the module's own either way.)
        state_dict[key] = own


def drop_incoming_mask(
    module: nn.Module,
    state_dict: dict[str, object],
    prefix: str,
    local_metadata: dict[str, object],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load-state-dict pre-hook of :func:`register_no_mask`: drop an incoming ``mask``."""
    # A module built with mask_buffer=False has no mask: a saved one (fully
    # determined by context_length) is not an unexpected key, it is ignored.
    state_dict.pop(prefix + "mask", None)


def register_no_mask(module: nn.Module) -> None:
    """Register ``mask = None`` (no buffer, no state_dict entry); saved masks are ignored."""
    module.register_buffer("mask", None)
    module.register_load_state_dict_pre_hook(drop_incoming_mask)


def resolve_head_dim(d_out: int, num_heads: int, head_dim: object) -> int:
    """``head_dim``, checked, or ``d_out // num_heads`` when it is None.

    Raises:
        TypeError: ``head_dim`` is neither None nor an int.
        ValueError: ``head_dim`` is not positive; or it is None and ``d_out``
            is not divisible by ``num_heads``.
    """
    if head_dim is None:
        if d_out % num_heads != 0:
            raise ValueError(
                f"d_out={d_out} is not divisible by num_heads={num_heads} "
                "(or give head_dim, and the heads need not fill d_out)"
            )
        return d_out // num_heads
    return check_positive_int("head_dim", head_dim)


def moved_keywords(*names: str, to: str) -> Callable[[_F], _F]:
    """Decorate an ``__init__`` so that keywords moved to another class name it.

    ``@moved_keywords("qk_norm", "sinks", to="attnlib.QKNormSinkAttention")``
    on a class's ``__init__``: a call with ``qk_norm=`` or ``sinks=`` (options
    the class had before they moved into that class) raises a TypeError that
    names where they went, before any computation. Every other keyword
    reaches ``__init__`` as written, so an unknown one fails with Python's
    own TypeError ("got an unexpected keyword argument"). ``functools.wraps``
    keeps the signature inspectable (``inspect.signature`` shows
    ``__init__``'s own).

    Args:
        *names: the keywords that moved.
        to: keyword-only; the class that takes them now, as the message names it.

    Returns:
        The decorator.

    Raises:
        TypeError: (from the decorated call) a moved keyword is given, with
            any value.
    """

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
            given = [name for name in names if name in kwargs]
            if given:
                raise TypeError(
                    f"{type_name(self)} no longer takes {' or '.join(given)}: it moved "
                    f"to {to}; build that class instead"
                )
            return fn(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def check_key_padding_mask(
    key_padding_mask: object, batch: int, num_tokens_kv: int, device: torch.device
) -> None:
    """Check a ``(batch, num_tokens_kv)`` bool key-padding mask (None passes).

    Raises:
        TypeError: not a tensor, or not bool.
        ValueError: wrong shape or device.
    """
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a bool tensor or None, got "
                        f"{type_name(key_padding_mask)}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be bool (True where a key is padding), got "
            f"{key_padding_mask.dtype}"
        )
    if tuple(key_padding_mask.shape) != (batch, num_tokens_kv):
        raise ValueError(
            f"key_padding_mask must be (batch, num_tokens_kv) = ({batch}, {num_tokens_kv}), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    if key_padding_mask.device != device:
        raise ValueError(f"key_padding_mask is on {key_padding_mask.device}, x on {device}")


def num_cached(kv_cache: object, num_tokens: int, context_length: int) -> int:
    """Tokens already in ``kv_cache`` (0 without one); checks before any computation.

    Raises:
        TypeError: ``kv_cache`` is neither None nor a :class:`attnlib.KVCache`.
        ValueError: the cached and the new tokens together exceed ``context_length``.
    """
    if kv_cache is None:
        return 0
    if not isinstance(kv_cache, KVCache):
        raise TypeError(f"kv_cache must be an attnlib.KVCache or None, got {type_name(kv_cache)}")
    cached = kv_cache.num_tokens
    if cached + num_tokens > context_length:
        raise ValueError(
            f"the KV cache holds {cached} tokens and x adds num_tokens={num_tokens}: "
            f"{cached + num_tokens} tokens exceed context_length={context_length}"
        )
    return cached


def check_context(
    module: nn.Module,
    context: object,
    x: torch.Tensor,
    kv_cache: object,
) -> torch.Tensor:
    """The tensor keys and values come from: ``x``, or ``context`` (cross-attention), checked.

    Raises:
        TypeError: ``context`` is not a tensor of ``x``'s dtype.
        ValueError: a causal module is given a context; a context with a KV
            cache; ``context`` is not ``(batch, num_tokens_kv,
            d_in)`` with ``x``'s batch and at least one token, or on another device.
    """
    if context is None:
        return x
    if getattr(module, "causal", True):
        raise ValueError(
            "context was given to a causal module: in cross-attention every query may see "
            "every key of the context, so a causal mask there is a mistake; build the "
            "module with causal=False"
        )
    if kv_cache is not None:
        raise ValueError(
            "context and kv_cache together are not supported: the context's keys and values "
            "are recomputed on each call (the queries need no cache)"
        )
    if not isinstance(context, torch.Tensor):
        raise TypeError(f"context must be a torch.Tensor or None, got {type_name(context)}")
    if context.dtype != x.dtype:
        raise TypeError(f"context has dtype {context.dtype}, x has {x.dtype}")
    d_in = x.shape[-1]  # checked against the module's d_in already
    if context.ndim != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != d_in:
        raise ValueError(
            f"context must be (batch, num_tokens_kv, d_in) = ({x.shape[0]}, num_tokens_kv, "
            f"{d_in}), got shape {tuple(context.shape)}"
        )
    if context.shape[1] == 0:
        raise ValueError("context has no tokens (num_tokens_kv = 0)")
    if context.device != x.device:
        raise ValueError(f"context is on {context.device}, x on {x.device}")
    return context


def check_plain_multi_head(module: nn.Module, name: str, needed_by: str) -> None:
    """Refuse a multi-head attention module that computes more than chapter 6's.

    For converters written for chapter 6's :class:`attnlib.MultiHeadAttention`,
    which its subclasses :class:`attnlib.GroupedQueryAttention` and
    :class:`attnlib.QKNormSinkAttention` pass as an ``isinstance`` check: shared
    key/value heads, RoPE, QK-norm, sinks or a sliding window would be lost
    in the conversion (a subclass without them computes chapter 6's layer).

    Raises:
        ValueError: ``num_kv_groups != num_heads``, or ``rope``, ``qk_norm``,
            ``sinks`` or ``window`` is set, naming ``name`` (the argument) and
            ``needed_by`` (what needs it plain).
    """
    num_heads, num_kv_groups = module.num_heads, module.num_kv_groups
    has_rope = getattr(module, "rope", None) is not None
    if num_kv_groups != num_heads or has_rope:
        raise ValueError(
            f"{needed_by} needs multi-head attention without shared key/value heads or RoPE: "
            f"{name} has num_kv_groups={num_kv_groups} (num_heads={num_heads}) and "
            f"rope={has_rope}"
        )
    parts = [part for part in ("qk_norm", "sinks", "window")
             if getattr(module, part, None) is not None]
    if parts:
        raise ValueError(
            f"{needed_by} needs multi-head attention without QK-norm, sinks or a sliding "
            f"window: {name} ({type_name(module)}) has {', '.join(parts)}"
        )
