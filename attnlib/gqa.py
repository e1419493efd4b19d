"""Grouped-query attention: fewer key/value heads than query heads.

In multi-head attention every query head has its own key and value heads, so
a KV cache stores ``2 * num_heads * head_dim`` numbers per token and layer.
Multi-query attention (Shazeer 2019) keeps a single key/value head shared by
all query heads; grouped-query attention (Ainslie et al. 2023) sits between
the two: ``num_kv_groups`` key/value heads, each shared by a group of
``num_heads // num_kv_groups`` query heads. The cache shrinks by the factor
``num_heads / num_kv_groups``.

Shape legend (as in :mod:`attnlib.attention`), plus:

* ``num_kv_groups``: key/value heads; divides ``num_heads``.
* ``group_size``: ``num_heads // num_kv_groups``, query heads per key/value head.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch
import torch.nn as nn

from . import functional as attn_functional
from ._heads import (
    _allowed_keys,
    _check_context,
    _check_key_padding_mask,
    _fused_qkv_projection,
    _head_dim,
    _num_cached,
    _pack_qkv,
    _register_causal_mask,
    _register_no_mask,
    _sdpa_shared_kv,
    _sink_attention_weights,
)
from ._validation import check_bool as _check_bool
from ._validation import check_dropout as _check_dropout
from ._validation import check_input as _check_input
from ._validation import check_positive_int as _check_positive_int
from .kv_cache import KVCache
from .positional import RotaryPositionalEmbedding
from .sinks import AttentionSinks, QKNorm

__all__ = ["GroupedQueryAttention"]


class GroupedQueryAttention(nn.Module):
    r"""Causal grouped-query self-attention, optionally with rotary position embeddings.

    Queries are projected to ``num_heads`` heads of ``head_dim`` features
    (``d_out // num_heads`` unless given), as in
    :class:`attnlib.MultiHeadAttention`; keys and values to only
    ``num_kv_groups`` heads of the same size. Key/value head ``j`` serves query
    heads ``j * group_size ... (j + 1) * group_size - 1`` (consecutive query
    heads share, as :func:`torch.repeat_interleave` on the head dimension and
    ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``
    arrange them). ``num_kv_groups == num_heads`` is multi-head attention;
    ``num_kv_groups == 1`` is multi-query attention.

    With ``rope=True`` a :class:`attnlib.RotaryPositionalEmbedding` rotates the
    queries and keys of each head by their positions (after the projection,
    before the scores), as in Llama-style models; with a KV cache the positions
    continue from the number of cached tokens, and the cache stores rotated keys.

    ``forward`` has the two paths of :class:`attnlib.MultiHeadAttention`: a
    fast one (one fused projection GEMM and torch's fused attention kernel,
    which shares the key/value heads itself) and a readable one
    (``return_weights=True``: ``repeat_interleave`` then
    :func:`attnlib.scaled_dot_product_attention`).

    Args:
        d_in: size of each input embedding.
        d_out: size of the layer's output; must be divisible by ``num_heads``
            unless ``head_dim`` is given.
        context_length: the most tokens (cached and new) a sequence may have.
        dropout: probability of zeroing each attention weight in training
            mode, in ``[0, 1)``.
        num_heads: number of query heads.
        num_kv_groups: number of key/value heads; must divide ``num_heads``.
        qkv_bias: give the query, key and value projections a bias. Default ``False``.
        out_bias: keyword-only; give ``out_proj`` a bias. Default ``True``.
        rope: keyword-only; rotate queries and keys with RoPE. Default ``False``
            (no positional information inside the layer).
        rope_base: keyword-only; RoPE's ``base``. Default 10000.
        head_dim: keyword-only; features per head. Default None:
            ``d_out // num_heads``. Given, the heads need not fill ``d_out``:
            ``W_query`` maps ``d_in -> num_heads * head_dim`` and ``out_proj``
            maps ``num_heads * head_dim -> d_out``, as in Qwen3 (hidden size
            1024, 16 heads of 128) and Gemma.
        mask_buffer: keyword-only; register the ``(context_length,
            context_length)`` bool ``mask`` buffer. Default True (chapter 5's
            way, and the reference book's). False registers none (``mask`` is
            None, and no ``state_dict`` entry; a saved ``mask`` is ignored on
            loading): the fast path from position 0 uses ``is_causal=True``,
            and the other calls build the rows they need, ``num_tokens x
            (num_cached + num_tokens)`` bools, for that call only. The buffer
            is ``context_length**2`` bytes per layer: 64 MiB at 8 192 tokens,
            1 GiB at 32 768 (``tests/test_gqa.py`` counts them); the outputs are
            the same either way. With ``causal=False`` no buffer is registered.
        qk_norm: keyword-only; RMS-normalise each query and key head (a
            learned gain per feature, :class:`attnlib.QKNorm`) after the
            projection and before RoPE, as Qwen3, OLMo 2 and Gemma 3 do.
            Default False (no parameters added).
        sinks: keyword-only; give each query head a learned sink logit that
            joins its softmax's denominator (:class:`attnlib.AttentionSinks`,
            initialised to 0), so a head may attend to "nothing", as gpt-oss
            does. Default False (no parameters added).
        causal: keyword-only; mask future keys. Default True. False gives
            bidirectional attention (an encoder), and is required for
            cross-attention (``forward(x, context=...)``), where a causal
            mask would be a mistake.

    Attributes:
        W_query: ``nn.Linear(d_in, num_heads * head_dim, bias=qkv_bias)``.
        W_key, W_value: ``nn.Linear(d_in, num_kv_groups * head_dim, bias=qkv_bias)``.
        out_proj: ``nn.Linear(num_heads * head_dim, d_out, bias=out_bias)``.
            Parameters are created in the order ``W_query``, ``W_key``,
            ``W_value``, ``out_proj``. (``num_heads * head_dim == d_out`` unless
            ``head_dim`` was given.)
        head_dim: features per head; group_size: ``num_heads // num_kv_groups``.
        rope: the :class:`attnlib.RotaryPositionalEmbedding`, or None.
        mask: bool buffer ``(context_length, context_length)``, True = may
            attend; None with ``mask_buffer=False`` or ``causal=False``.
        qk_norm: the :class:`attnlib.QKNorm` (``state_dict`` keys
            ``qk_norm.q_norm.weight``, ``qk_norm.k_norm.weight``), or None.
        sinks: the :class:`attnlib.AttentionSinks` (``sinks.sinks``,
            ``(num_heads,)``), or None.
        causal: bool.

    Warning:
        Dropout acts in training mode, which is a module's default: call
        ``.eval()`` for deterministic outputs.

    Note:
        :class:`attnlib.MultiHeadAttention` is the case ``num_kv_groups ==
        num_heads`` without RoPE, and is built as a subclass: it shares this
        constructor, the fast path's packed weights and, with a KV cache, this
        ``forward``.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, or a flag
            is not a bool.
        ValueError: a size is not positive; ``head_dim`` is None and ``d_out``
            is not divisible by ``num_heads``; ``num_heads`` is not divisible by ``num_kv_groups``;
            ``dropout`` is outside ``[0, 1)``; with ``rope=True``, ``head_dim``
            is odd or ``rope_base`` is not finite and positive.

    Source: Ainslie et al. (2023), "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints", section 2.2; Shazeer (2019),
    "Fast Transformer Decoding: One Write-Head is All You Need" (multi-query);
    Su et al. (2021), RoFormer, eq. (34) (RoPE).
    """

    mask: torch.Tensor | None  # the buffer of _register_causal_mask; None with mask_buffer=False

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        num_kv_groups: int,
        qkv_bias: bool = False,
        *,
        out_bias: bool = True,
        rope: bool = False,
        rope_base: float = 10000.0,
        head_dim: int | None = None,
        mask_buffer: bool = True,
        qk_norm: bool = False,
        sinks: bool = False,
        causal: bool = True,
    ) -> None:
        _check_positive_int("d_in", d_in)
        _check_positive_int("d_out", d_out)
        _check_positive_int("context_length", context_length)
        _check_dropout(dropout)
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("num_kv_groups", num_kv_groups)
        _check_bool("qkv_bias", qkv_bias)
        _check_bool("out_bias", out_bias)
        _check_bool("rope", rope)
        _check_bool("mask_buffer", mask_buffer)
        for name, flag in (("qk_norm", qk_norm), ("sinks", sinks), ("causal", causal)):
            _check_bool(name, flag)
        head_dim = _head_dim(d_out, num_heads, head_dim)
        if num_heads % num_kv_groups != 0:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by num_kv_groups={num_kv_groups}: "
                "each key/value head must serve the same number of query heads"
            )
        super().__init__()
        self.d_in = int(d_in)
        self.d_out = int(d_out)
        self.context_length = int(context_length)
        self.num_heads = int(num_heads)
        self.num_kv_groups = int(num_kv_groups)
        self.head_dim = head_dim
        self.group_size = self.num_heads // self.num_kv_groups
        self.dropout_p = float(dropout)
        q_dim = self.num_heads * self.head_dim  # d_out unless head_dim was given
        kv_dim = self.num_kv_groups * self.head_dim
        self.W_query = nn.Linear(d_in, q_dim, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(q_dim, d_out, bias=out_bias)
        self.rope = (
            RotaryPositionalEmbedding(self.head_dim, self.context_length, rope_base)
            if rope
            else None
        )
        # Created after out_proj, so that without them the parameters are the same.
        self.qk_norm = QKNorm(self.head_dim) if qk_norm else None
        self.sinks = AttentionSinks(self.num_heads) if sinks else None
        self.causal = bool(causal)
        _pack_qkv(self.W_query, self.W_key, self.W_value)  # side by side, for the fast path
        if mask_buffer and causal:
            _register_causal_mask(self, self.context_length)
        else:  # no (context_length, context_length) buffer: masks are built per call
            _register_no_mask(self)

    def _apply(self, *args: Any, **kwargs: Any) -> GroupedQueryAttention:
        # .to(), .double(), .cuda() give each parameter new storage: pack them
        # again, so that the fast path reads the stacked weight without a copy
        # (attnlib._heads._pack_qkv has the numbers).
        module = super()._apply(*args, **kwargs)
        _pack_qkv(self.W_query, self.W_key, self.W_value)
        return module

    @overload
    def forward(
        self,
        x: torch.Tensor,
        return_weights: Literal[False] = ...,
        *,
        context: torch.Tensor | None = ...,
        kv_cache: KVCache | None = ...,
        key_padding_mask: torch.Tensor | None = ...,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, return_weights: Literal[True], *,
        context: torch.Tensor | None = ..., kv_cache: KVCache | None = ...,
        key_padding_mask: torch.Tensor | None = ...,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(
        self, x: torch.Tensor, return_weights: bool, *,
        context: torch.Tensor | None = ..., kv_cache: KVCache | None = ...,
        key_padding_mask: torch.Tensor | None = ...,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        *,
        context: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Grouped-query attention of ``x`` (causal self-attention unless built otherwise).

        Args:
            x: input embeddings, ``(batch, num_tokens, d_in)``, with
                ``num_tokens <= context_length``. With ``kv_cache``, only the
                new tokens.
            return_weights: take the readable path and also return the
                per-query-head attention weights. Default ``False``.
            context: keyword-only; cross-attention: ``(batch, num_tokens_kv,
                d_in)``, any ``num_tokens_kv``; the queries come from ``x``,
                the keys and values from ``context`` (an encoder's output, an
                image's patches), and no causal mask applies. Only for a module
                built with ``causal=False`` and ``rope=False``, and without
                ``kv_cache``. Default None (self-attention).
            kv_cache: keyword-only; an :class:`attnlib.KVCache` holding the keys
                and values of the tokens before ``x`` (empty at the start of a
                sequence); it stores ``num_kv_groups`` key/value heads (rotated
                keys with RoPE). The new tokens' keys and values are appended
                to it in place, and the new queries attend to everything
                cached and to themselves, causally: ``x``'s token ``i`` sits at
                position ``num_cached + i`` and sees keys
                ``0 ... num_cached + i`` (the causal mask aligned at the
                bottom-right). Feeding a sequence in chunks, one call per chunk
                with the same cache, gives the outputs of one call on the
                whole sequence. Default None.
            key_padding_mask: keyword-only; ``(batch, num_cached + num_tokens)``
                bool, **True where a key is padding** (torch's meaning of this
                keyword, as in ``nn.MultiheadAttention``: the *opposite*
                polarity of attnlib's attention masks, which are True where a
                query may attend). Padded keys get no weight; the causal mask
                still applies. A query row whose keys are all masked (e.g. the
                first tokens of a left-padded sequence) returns zeros, as
                :func:`attnlib.scaled_dot_product_attention` does for
                all-masked rows (torch's module returns NaN there). The
                outputs at padded *query* positions are computed but
                meaningless: ignore them (or mask the loss). With a
                ``context``, ``(batch, num_tokens_kv)``: the context's keys.
                Default None.

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_out)``. With
            ``return_weights=True``, the pair ``(context_vec, attn_weights)``,
            ``attn_weights`` being ``(batch, num_heads, num_tokens,
            num_cached + num_tokens)`` (``num_tokens_kv`` with a context),
            after dropout; with sinks each row sums to less than 1.

        Raises:
            TypeError: ``x`` is not a floating-point tensor or its dtype differs
                from the module's parameters, ``return_weights`` is not a bool,
                or ``kv_cache`` is not a :class:`KVCache`.
            ValueError: ``x`` is not 3-D, ``x.shape[-1] != d_in``, ``x`` has no
                tokens, ``num_tokens > context_length``, the cached and new
                tokens together exceed ``context_length``, the cache holds
                another batch size or layout, or ``x`` is on another device;
                ``key_padding_mask`` is not a bool tensor ``(batch,
                num_cached + num_tokens)`` on ``x``'s device (TypeError for
                the dtype); ``context`` is given to a causal module or one
                with RoPE, with a cache, or is not ``(batch, num_tokens_kv,
                d_in)`` (TypeError: not a tensor of ``x``'s dtype).
        """
        _check_input(x, self.d_in, (3,), self.context_length, like=self.W_query.weight)
        _check_bool("return_weights", return_weights)
        b, num_tokens, _ = x.shape
        num_heads, num_kv_groups, head_dim = self.num_heads, self.num_kv_groups, self.head_dim
        num_cached = _num_cached(kv_cache, num_tokens, self.context_length)
        source = _check_context(self, context, x, kv_cache)  # keys and values come from it
        _check_key_padding_mask(key_padding_mask, b, num_cached + source.shape[1], x.device)
        if kv_cache is not None:
            kv_cache.check_next(b, num_kv_groups, head_dim, head_dim, x.dtype, x.device)

        if return_weights:  # readable: one projection per matrix
            queries, keys, values = self.W_query(x), self.W_key(source), self.W_value(source)
        else:  # fast: one GEMM with the stacked (d_out + 2 * kv_dim, d_in) weight
            queries, keys, values = _fused_qkv_projection(
                x, self.W_query, self.W_key, self.W_value, context
            )  # (b, num_tokens, d_out), (b, num_tokens_kv, kv_dim), (b, num_tokens_kv, kv_dim)
        queries = queries.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # queries: (b, num_heads, num_tokens, head_dim)
        keys = keys.view(b, -1, num_kv_groups, head_dim).transpose(1, 2)
        # keys: (b, num_kv_groups, num_tokens_kv, head_dim), num_tokens_kv = source.shape[1]
        values = values.view(b, -1, num_kv_groups, head_dim).transpose(1, 2)
        # values: (b, num_kv_groups, num_tokens_kv, head_dim)
        if self.qk_norm is not None:  # RMSNorm of each head, before RoPE (Qwen3)
            queries, keys = self.qk_norm(queries, keys)
        if self.rope is not None:  # rotate by position num_cached + t (values are not rotated)
            queries = self.rope(queries, offset=num_cached)
            keys = self.rope(keys, offset=num_cached)
        if kv_cache is not None:
            keys, values = kv_cache.update(keys, values)
            # keys, values: (b, num_kv_groups, num_cached + num_tokens, head_dim)

        dropout_p = self.dropout_p if self.training else 0.0
        # New queries are the last positions: bottom-right rows of the causal mask
        # (True = may attend), or None where is_causal=True applies the same mask.
        allowed, is_causal = _allowed_keys(
            self, num_cached, keys.shape[-2], not return_weights, key_padding_mask, self.causal
        )
        if return_weights:
            # Give every query head its own copy of its group's key and value head.
            keys = keys.repeat_interleave(self.group_size, dim=1)
            # keys: (b, num_heads, num_tokens_kv, head_dim)
            values = values.repeat_interleave(self.group_size, dim=1)
            # values: (b, num_heads, num_tokens_kv, head_dim)
            if self.sinks is None:
                context_vec, attn_weights = attn_functional.scaled_dot_product_attention(
                    queries, keys, values, attn_mask=allowed, dropout_p=dropout_p,
                    return_weights=True,
                )  # (b, num_heads, num_tokens, head_dim), (b, num_heads, num_tokens, N_kv)
            else:  # gpt-oss: each head's sink logit joins its softmax's denominator
                context_vec, attn_weights = _sink_attention_weights(
                    queries, keys, values, self.sinks, allowed, dropout_p
                )
        else:  # torch shares the key/value heads itself (enable_gqa)
            context_vec = _sdpa_shared_kv(
                queries, keys, values, attn_mask=allowed, is_causal=is_causal,
                dropout_p=dropout_p, sinks=self.sinks,
            )  # (b, num_heads, num_tokens, head_dim)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, num_heads * head_dim)
        # context_vec: (b, num_tokens, num_heads * head_dim), d_out unless head_dim was given
        context_vec = self.out_proj(context_vec)  # (b, num_tokens, d_out)
        if return_weights:
            return context_vec, attn_weights
        return context_vec

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"num_heads={self.num_heads}, num_kv_groups={self.num_kv_groups}, "
            f"dropout_p={self.dropout_p}{_options(self)}"
        )


def _options(module: GroupedQueryAttention) -> str:
    """The non-default options, for ``extra_repr``."""
    return "".join(
        f", {name}={value}"
        for name, value, default in (
            ("causal", module.causal, True),
            ("qk_norm", module.qk_norm is not None, False),
            ("sinks", module.sinks is not None, False),
        )
        if value != default
    )
