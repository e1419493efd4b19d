"""Caches: what an attention layer keeps between decoding steps.

:class:`Cache` is the one interface of attnlib's caches (as Hugging Face's
``Cache.update(key, value, layer_idx)``): ``update`` takes the new tokens' two
tensors and returns what the layer attends to; ``num_tokens``, ``reset`` and
``memory_bytes`` say what it holds. Every attention layer of attnlib makes its
own with ``new_cache()``: a :class:`KVCache` here, multi-head latent
attention's :class:`attnlib.latent.LatentCache`, Gated DeltaNet's
:class:`attnlib.linear_attention.RecurrentState`; so
:meth:`attnlib.TinyTransformer.generate` decodes with any of them.

When a causal language model generates text it runs one new token at a time.
The keys and values of the earlier tokens do not change (causal attention never
lets an earlier token see a later one), so recomputing them at every step is
wasted work. A :class:`KVCache` stores them: at each step the attention layer
projects only the new tokens, appends their keys and values to the cache, and
attends the new queries to everything cached.

Pass one cache per attention layer to its ``forward(x, kv_cache=cache)``
(:class:`attnlib.MultiHeadAttention`, :class:`attnlib.GroupedQueryAttention`);
``x`` then holds only the new tokens.

Shape legend:

* ``batch``: sequences decoded together.
* ``num_kv_groups``: key/value heads (the name of
  :class:`attnlib.GroupedQueryAttention` and of Raschka's code; ``num_heads``
  for multi-head attention).
* ``num_tokens``: tokens cached so far; ``num_new``: tokens being added.
* ``head_dim``: size of one head's key (and value) vectors.
"""

from __future__ import annotations

import functools
import warnings
from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ._validation import type_name

__all__ = ["Cache", "KVCache"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _renamed_keyword(old: str, new: str) -> Callable[[_F], _F]:
    """Accept the keyword ``old`` as ``new`` with a DeprecationWarning (a renamed argument)."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__qualname__}() got both {old}= and {new}=")
                warnings.warn(
                    f"{fn.__qualname__}(): {old}= is renamed {new}=", DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


class Cache(metaclass=ABCMeta):
    """What one attention layer keeps between decoding steps: the interface of every cache.

    A cache belongs to one layer and one batch of sequences. The layer calls
    :meth:`update` once per forward pass with two tensors of the new tokens
    (keys and values, for a :class:`KVCache`) and attends to what it returns;
    a cache that only appends returns everything held, old tokens first.
    Layers make their own (``layer.new_cache()``), and a model keeps one per
    layer (:meth:`attnlib.TinyTransformer.new_caches`).

    Source: Hugging Face transformers' ``Cache`` (``update(key_states,
    value_states, layer_idx)``, ``get_seq_length``), one object per layer here.
    """

    @property
    @abstractmethod
    def num_tokens(self) -> int:
        """Tokens seen so far (0 while empty)."""

    def __len__(self) -> int:
        return self.num_tokens

    @abstractmethod
    def update(
        self, first: torch.Tensor, second: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the new tokens' two tensors; return the two the layer reads.

        Raises:
            TypeError, ValueError: the tensors do not fit what the cache holds.
        """

    @abstractmethod
    def reset(self) -> None:
        """Empty the cache (to start a new sequence)."""

    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes the cache's tensors hold."""


class KVCache(Cache):
    """Keys and values of one attention layer for the tokens seen so far.

    The cache starts empty; :meth:`update` appends the keys and values of new
    tokens and returns everything cached. Appending is ``torch.cat`` on the
    token dimension: each step allocates new ``keys`` and ``values`` tensors
    one step longer and copies the old ones into them (the ``KVCache`` object
    is updated in place, its tensors are not). That keeps the cache exactly
    as large as what it holds; production caches instead preallocate
    ``context_length`` slots and write into them.
    The module that owns the cache decides what goes in: attnlib's layers store
    keys after RoPE (if any), values as projected.

    Decoding is normally done under :func:`torch.no_grad`; with gradients
    enabled the cache keeps the autograd graph of every stored key and value.

    Attributes:
        keys: ``(batch, num_kv_groups, num_tokens, head_dim)``, or None while empty.
        values: ``(batch, num_kv_groups, num_tokens, head_dim_v)``, or None while empty.

    Example::

        cache = attnlib.KVCache()
        out_prompt = mha(prompt, kv_cache=cache)     # (1, len(prompt), d_out)
        out_next = mha(next_token, kv_cache=cache)   # (1, 1, d_out)
        len(cache)                                   # len(prompt) + 1

    Source: the incremental decoding of Transformer decoders (e.g. Shazeer
    2019, "Fast Transformer Decoding: One Write-Head is All You Need",
    section 2.4), as in Hugging Face's ``DynamicCache``.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens cached so far (0 while empty)."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @_renamed_keyword("num_kv_heads", "num_kv_groups")
    def check_next(
        self,
        batch: int,
        num_kv_groups: int,
        head_dim: int,
        head_dim_v: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Raise before any computation if new keys of this layout cannot be appended.

        ``num_kv_groups`` was called ``num_kv_heads`` in attnlib 0.2.0; that
        keyword still works, with a ``DeprecationWarning``.

        Raises:
            ValueError: the batch size, number of key/value heads, head size or
                device differs from what the cache holds (a cache belongs to one
                layer and one batch of sequences: use a new one, or
                :meth:`reset`).
            TypeError: the dtype differs from the cached tensors'.
        """
        if self.keys is None or self.values is None:
            return
        held = (self.keys.shape[0], self.keys.shape[1], self.keys.shape[-1],
                self.values.shape[-1])
        new = (batch, num_kv_groups, head_dim, head_dim_v)
        if held != new:
            raise ValueError(
                "this KV cache holds keys and values for (batch, num_kv_groups, head_dim, "
                f"head_dim_v)={held}, but the new ones are {new}: use one cache per layer "
                "and batch (KVCache() or cache.reset())"
            )
        if dtype != self.keys.dtype:
            raise TypeError(f"the KV cache holds {self.keys.dtype} tensors, got {dtype}")
        if device != self.keys.device:
            raise ValueError(f"the KV cache is on {self.keys.device}, got tensors on {device}")

    def update(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' keys and values; return all cached ones.

        Args:
            keys: ``(batch, num_kv_groups, num_new, head_dim)``.
            values: ``(batch, num_kv_groups, num_new, head_dim_v)``.

        Returns:
            ``(keys, values)`` of every cached token, old ones first:
            ``(batch, num_kv_groups, num_tokens + num_new, head_dim)`` and
            ``(..., head_dim_v)``.

        Raises:
            TypeError: ``keys`` or ``values`` is not a floating-point tensor, or
                their dtypes differ (from each other or from the cache's).
            ValueError: they are not 4-D, disagree on
                ``(batch, num_kv_groups, num_new)``, or do not fit what the cache
                holds (see :meth:`check_next`).
        """
        for name, t in (("keys", keys), ("values", values)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type_name(t)}")
            if not t.is_floating_point():
                raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
            if t.ndim != 4:
                raise ValueError(
                    f"{name} must be (batch, num_kv_groups, num_new, head_dim), "
                    f"got {t.ndim}-D shape {tuple(t.shape)}"
                )
        if keys.shape[:-1] != values.shape[:-1]:
            raise ValueError(
                "keys and values must agree on (batch, num_kv_groups, num_new), got "
                f"{tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if keys.dtype != values.dtype:
            raise TypeError(f"keys and values must share a dtype, got {keys.dtype} and "
                            f"{values.dtype}")
        b, h, _, d = keys.shape
        self.check_next(b, h, d, values.shape[-1], keys.dtype, keys.device)
        if self.keys is None or self.values is None:
            # Copies of their own: the new keys and values are often views into a larger
            # buffer (the fused projection also holds the queries), which the cache would
            # otherwise keep alive; and the caller's tensors are never aliased.
            self.keys = keys.clone(memory_format=torch.contiguous_format)
            self.values = values.clone(memory_format=torch.contiguous_format)
        else:  # new, longer tensors: the old ones are copied into them
            self.keys = torch.cat([self.keys, keys], dim=-2)  # (b, h, num_tokens + num_new, d)
            self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values

    def reset(self) -> None:
        """Empty the cache (to start a new sequence)."""
        self.keys = None
        self.values = None

    def memory_bytes(self) -> int:
        """Bytes held by the cached keys and values:
        ``batch * num_kv_groups * num_tokens * (head_dim + head_dim_v) * itemsize``.

        The cache owns exactly this memory: it stores its own contiguous copies,
        never views into a larger tensor."""
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes

    def __repr__(self) -> str:
        if self.keys is None:
            return "KVCache(empty)"
        b, h, n, d = self.keys.shape
        return (
            f"KVCache(batch={b}, num_kv_groups={h}, num_tokens={n}, head_dim={d}, "
            f"dtype={self.keys.dtype}, memory_bytes={self.memory_bytes()})"
        )
