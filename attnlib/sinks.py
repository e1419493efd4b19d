"""Attention sinks and QK-norm: two small changes current models make to attention.

**Attention sinks.** Softmax weights must sum to 1, so a head with nothing
useful to read must still put its weight somewhere; trained models dump it on
the first tokens (StreamingLLM's "attention sinks", Xiao et al. 2023). gpt-oss
gives every head a learned logit ``sink`` that joins the softmax's
denominator but has no value:

.. code-block:: text

    attn_weights[t, s] = exp(score[t, s]) / (exp(sink) + sum_j exp(score[t, j]))

so a row may sum to less than 1 and a head can attend to "nothing".

**QK-norm.** Qwen3, OLMo 2 and Gemma 3 RMS-normalise each head's queries and
keys (with a learned per-feature gain) before RoPE, which bounds the attention
logits and steadies training.

:class:`QKNormSinkAttention` is :class:`attnlib.GroupedQueryAttention` with
both (chapter 13), each one line in a step of the grouped-query layer:

.. code-block:: python

    # transform_queries_keys, before RoPE: QKNorm's two RMSNorms
    queries, keys = self.qk_norm(queries, keys)
    # attend: the sink logits go into attnlib.functional.attention's softmax
    options["sinks"] = self.sinks.sinks  # (num_heads,), an AttentionSinks' parameter

and its mask step gives gpt-oss's optional sliding window. The sink logits
are an :class:`AttentionSinks`' parameter; its own ``forward``
(:func:`sink_attention`, the readable path) is for using sinks outside a
multi-head layer.

Shape legend: ``(batch, num_heads, num_tokens, head_dim)`` for queries,
``(batch, num_kv_groups, num_tokens_kv, head_dim)`` for keys and values
(``num_kv_groups`` divides ``num_heads``; consecutive query heads share).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from ._validation import check_bool, check_float_tensor, check_positive_int, type_name
from .functional import (
    attention,
    merge_key_padding_mask,
    sliding_window_mask,
    softmax_with_sinks,
)
from .gqa import GroupedQueryAttention
from .kv_cache import KVCache

__all__ = [
    "softmax_with_sinks",
    "sink_attention",
    "AttentionSinks",
    "QKNorm",
    "QKNormSinkAttention",
]


def _check_eps(name: str, value: object) -> float:
    """A positive finite float (an int is taken too; a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive finite float, got {type_name(value)}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite float, got {value!r}")
    return float(value)


def sink_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    sinks: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention whose softmax has a sink logit per head.

    :func:`attnlib.functional.attention` on its readable path with ``sinks``:
    the scaled, masked scores go through :func:`softmax_with_sinks`.

    Args:
        queries: ``(batch, num_heads, num_tokens, head_dim)``.
        keys, values: ``(batch, num_kv_groups, num_tokens_kv, head_dim(_v))``,
            ``num_kv_groups`` dividing ``num_heads`` (grouped-query attention).
        sinks: ``(num_heads,)``.
        attn_mask: keyword-only; bool, **True where a query may attend**
            (or additive float), broadcastable to ``(batch, num_heads,
            num_tokens, num_tokens_kv)``. Default None.
        is_causal: keyword-only; the causal mask aligned at the top-left (use
            ``attn_mask`` after a cache). Default ``False``.
        scale: keyword-only; default ``1 / sqrt(head_dim)``.

    Returns:
        ``context_vec``: ``(batch, num_heads, num_tokens, head_dim_v)``.

    Raises:
        TypeError, ValueError: as :func:`attnlib.scaled_dot_product_attention`
            for the tensors and mask; ``sinks`` as :func:`softmax_with_sinks`;
            ``num_heads`` not divisible by ``num_kv_groups``.

    Source: as :func:`softmax_with_sinks`.
    """
    context_vec, _ = attention(queries, keys, values, attn_mask, is_causal=is_causal,
                               scale=scale, sinks=sinks, implementation="readable")
    return context_vec


class AttentionSinks(nn.Module):
    """A learned sink logit per head, and the attention that uses it.

    ``forward(queries, keys, values, ...)`` is :func:`sink_attention` with
    this module's ``sinks``: it replaces the ``scaled_dot_product_attention``
    call of a multi-head layer in one line.

    Args:
        num_heads: query heads.
        init: keyword-only; initial value of every sink logit. Default 0.0.

    Attributes:
        sinks: ``nn.Parameter`` ``(num_heads,)``.

    Raises:
        TypeError: ``num_heads`` is not an int.
        ValueError: ``num_heads`` is not positive.

    Source: as :func:`softmax_with_sinks`.
    """

    def __init__(self, num_heads: int, *, init: float = 0.0) -> None:
        check_positive_int("num_heads", num_heads)
        super().__init__()
        self.num_heads = int(num_heads)
        self.sinks = nn.Parameter(torch.full((self.num_heads,), float(init)))

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        """:func:`sink_attention` with ``self.sinks``; same arguments and shapes."""
        return sink_attention(queries, keys, values, self.sinks, attn_mask=attn_mask,
                              is_causal=is_causal, scale=scale)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class QKNorm(nn.Module):
    """RMSNorm of every query and key head, with learned gains (QK-norm).

    ``forward(queries, keys)`` returns ``(q_norm(queries), k_norm(keys))``,
    each normalising the last (``head_dim``) dimension; call it after the
    projection and before RoPE, as Qwen3 does.

    Args:
        head_dim: size of a query/key head.
        eps: keyword-only; the RMSNorms' epsilon. Default 1e-6.

    Attributes:
        q_norm, k_norm: ``nn.RMSNorm(head_dim)``, one gain per feature shared
            by all heads.

    Raises:
        TypeError: ``head_dim`` is not an int.
        ValueError: ``head_dim`` is not positive.

    Source: Dehghani et al. (2023), "Scaling Vision Transformers to 22
    Billion Parameters", section 3.1 (QK normalisation); Qwen team (2025),
    "Qwen3 Technical Report", section 2; OLMo team (2024), "2 OLMo 2
    Furious", section 3.2.
    """

    def __init__(self, head_dim: int, *, eps: float = 1e-6) -> None:
        check_positive_int("head_dim", head_dim)
        super().__init__()
        self.head_dim = int(head_dim)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise ``queries`` ``(..., head_dim)`` and ``keys`` ``(..., head_dim)``.

        Raises:
            TypeError: either is not a floating-point tensor.
            ValueError: its last dimension is not ``head_dim``.
        """
        for name, t in (("queries", queries), ("keys", keys)):
            check_float_tensor(name, t)
            if t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name}.shape[-1]={t.shape[-1]} does not match head_dim={self.head_dim}"
                )
        return self.q_norm(queries), self.k_norm(keys)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}"


class QKNormSinkAttention(GroupedQueryAttention):
    """Grouped-query attention with QK-norm (Qwen3) and attention sinks (gpt-oss).

    :class:`attnlib.GroupedQueryAttention` (its ``forward`` unchanged) with two
    options of current models, each a part created after the parent's layers,
    so that the seeded ``W_query``, ``W_key``, ``W_value`` and ``out_proj`` are
    the same with and without them:

    * ``qk_norm=True``: a :class:`QKNorm` RMS-normalises each query and key
      head (a learned gain per feature) after the head split and before RoPE,
      in :meth:`transform_queries_keys`, as Qwen3, OLMo 2 and Gemma 3 do;
    * ``sinks=True``: an :class:`AttentionSinks` gives each query head a
      learned sink logit (initialised to 0) that joins its softmax's
      denominator, so a head may attend to "nothing", as gpt-oss does; its
      ``sinks`` go into :func:`attnlib.functional.attention` in :meth:`attend`,
      on every path but ``"flash"``;
    * ``window=W``: each query attends to the last ``W`` keys, itself included
      (:func:`attnlib.functional.sliding_window_mask`, aligned at the
      bottom-right after a KV cache), in :meth:`attention_mask`, as gpt-oss's
      sliding-window layers (``W = 128``) and Mistral do. The cache still keeps
      every key.

    The ``"flash"`` path (:func:`attnlib.functional.flash_attention`, chapter
    8's tiled kernel) has no sinks and no mask but the causal one, so
    :meth:`check_inputs` refuses ``attn_implementation="flash"`` with sinks or
    a window, on each call before any computation (the attribute may be set
    after construction); ``return_weights=True`` takes the readable path and
    works.

    With ``qk_norm=False``, ``sinks=False`` and ``window=None`` it computes
    what :class:`attnlib.GroupedQueryAttention` computes.

    Args:
        d_in, d_out, context_length, dropout: as
            :class:`attnlib.GroupedQueryAttention`.
        num_heads, num_kv_groups, qkv_bias: as there.
        out_bias, rope, rope_base, head_dim: keyword-only; as there.
        mask_buffer, causal, attn_implementation: keyword-only; as there.
        qk_norm: keyword-only; add the :class:`QKNorm`. Default False.
        qk_norm_eps: keyword-only; the QK-norm RMSNorms' epsilon, a positive
            finite float. Default 1e-6.
        sinks: keyword-only; add the :class:`AttentionSinks`. Default False.
        window: keyword-only; the sliding window, a positive int, or None
            (default: full causal attention). Only with ``causal=True``.

    Attributes:
        qk_norm: the :class:`QKNorm` (``state_dict`` keys
            ``qk_norm.q_norm.weight``, ``qk_norm.k_norm.weight``, each
            ``(head_dim,)``), or None.
        sinks: the :class:`AttentionSinks` (``sinks.sinks``, ``(num_heads,)``),
            or None.
        window: int or None.
        The others as :class:`attnlib.GroupedQueryAttention`; the parameters
        come in the order ``W_query``, ``W_key``, ``W_value``, ``out_proj``,
        then ``qk_norm``'s and ``sinks``.

    Raises:
        TypeError: as :class:`attnlib.GroupedQueryAttention`, ``qk_norm``
            or ``sinks`` is not a bool, ``qk_norm_eps`` is not a float, or
            ``window`` is neither None nor an int.
        ValueError: as :class:`attnlib.GroupedQueryAttention`; ``window`` is
            not positive, or is given with ``causal=False``; ``qk_norm_eps``
            is not positive and finite.

    Source: Dehghani et al. (2023), "Scaling Vision Transformers to 22
    Billion Parameters", section 3.1, and Qwen team (2025), "Qwen3 Technical
    Report", section 2 (QK-norm); OpenAI (2025), "gpt-oss-120b & gpt-oss-20b
    Model Card", section 2.1 (sinks, and the alternating 128-token windows);
    Beltagy, Peters and Cohan (2020), "Longformer", section 3.1 (sliding window).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 num_heads: int, num_kv_groups: int, qkv_bias: bool = False, *,
                 out_bias: bool = True, rope: bool = False, rope_base: float = 10000.0,
                 head_dim: int | None = None, mask_buffer: bool = True, causal: bool = True,
                 attn_implementation: str = "sdpa", qk_norm: bool = False,
                 qk_norm_eps: float = 1e-6, sinks: bool = False,
                 window: int | None = None) -> None:
        check_bool("qk_norm", qk_norm)
        qk_norm_eps = _check_eps("qk_norm_eps", qk_norm_eps)
        check_bool("sinks", sinks)
        if window is not None:
            window = check_positive_int("window", window)
            if causal is False:
                raise ValueError(f"window={window} is a causal sliding window: it needs "
                                 "causal=True, got causal=False")
        super().__init__(d_in, d_out, context_length, dropout, num_heads, num_kv_groups,
                         qkv_bias, out_bias=out_bias, rope=rope, rope_base=rope_base,
                         head_dim=head_dim, mask_buffer=mask_buffer, causal=causal,
                         attn_implementation=attn_implementation)
        # Created after the parent's layers, so that the seeded weights are the same.
        self.qk_norm = QKNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else None
        self.sinks = AttentionSinks(self.num_heads) if sinks else None
        self.window = window

    def transform_queries_keys(
        self, queries: torch.Tensor, keys: torch.Tensor, num_cached: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm of each head if the module has it, then RoPE (Qwen3's order).

        Shapes as :meth:`attnlib.GroupedQueryAttention.transform_queries_keys`.
        """
        if self.qk_norm is not None:  # RMSNorm of each head, before RoPE
            queries, keys = self.qk_norm(queries, keys)
        return super().transform_queries_keys(queries, keys, num_cached)

    def check_inputs(self, x: torch.Tensor, return_weights: bool,
                     context: torch.Tensor | None, kv_cache: KVCache | None,
                     key_padding_mask: torch.Tensor | None) -> int:
        """:meth:`attnlib.GroupedQueryAttention.check_inputs`, and no ``"flash"``
        path with sinks or a window (it has neither): checked on each call,
        before any computation, since ``attn_implementation`` may change.

        Raises:
            TypeError, ValueError: as there; ValueError: ``attn_implementation
                == "flash"`` without ``return_weights`` in a module with sinks or
                a window.
        """
        cached = super().check_inputs(x, return_weights, context, kv_cache, key_padding_mask)
        parts = [part for part, on in (("sinks", self.sinks is not None),
                                       (f"window={self.window}", self.window is not None)) if on]
        if self.attn_implementation == "flash" and not return_weights and parts:
            raise ValueError(
                f"attn_implementation='flash' cannot run a module with {' and '.join(parts)}: "
                "attnlib.functional.flash_attention (chapter 8's tiled kernel) has no sinks "
                "and no mask but the causal one; use 'sdpa' or 'readable'"
            )
        return cached

    def attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               attn_mask: torch.Tensor | None, is_causal: bool, return_weights: bool = False,
               **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`attnlib.MultiHeadAttention.attend` (same arguments and shapes) with
        the sink logits, if any: the readable path's weights then sum to less than 1.

        Raises:
            TypeError: ``sinks=`` is given to a module that has its own.
        """
        if self.sinks is not None:  # gpt-oss: each head's sink logit joins its softmax
            if "sinks" in options:
                raise TypeError("attend got sinks= but the module has its own sinks "
                                "(sinks.sinks); pass none, or build it with sinks=False")
            options["sinks"] = self.sinks.sinks  # (num_heads,)
        return super().attend(queries, keys, values, attn_mask, is_causal, return_weights,
                              **options)

    def attention_mask(self, num_cached: int, num_tokens_kv: int,
                       key_padding_mask: torch.Tensor | None = None, *, fast: bool = False,
                       ) -> tuple[torch.Tensor | None, bool]:
        """:meth:`attnlib.MultiHeadAttention.attention_mask`, or with a ``window``
        the bottom-right rows of :func:`attnlib.functional.sliding_window_mask`
        (``(N_q, N_kv)``, True = may attend; merged with a ``key_padding_mask``
        into ``(batch, 1, N_q, N_kv)``) and ``is_causal=False``."""
        if self.window is None:
            return super().attention_mask(num_cached, num_tokens_kv, key_padding_mask,
                                          fast=fast)
        allowed = sliding_window_mask(num_tokens_kv - num_cached, self.window,
                                      num_tokens_kv=num_tokens_kv,
                                      device=self.W_query.weight.device)
        return merge_key_padding_mask(allowed, key_padding_mask), False

    def options_repr(self) -> str:
        """:meth:`attnlib.MultiHeadAttention.options_repr` plus ``qk_norm=True``,
        ``sinks=True`` and ``window=W`` where set."""
        return super().options_repr() + "".join(
            f", {name}=True"
            for name, part in (("qk_norm", self.qk_norm), ("sinks", self.sinks))
            if part is not None
        ) + ("" if self.window is None else f", window={self.window}")
