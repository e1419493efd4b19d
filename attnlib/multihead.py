"""Multi-head causal self-attention: several heads side by side, then split
out of one set of projections.

:class:`MultiHeadAttentionWrapper` runs several :class:`attnlib.CausalAttention`
heads one after the other and concatenates their outputs;
:class:`MultiHeadAttention` splits the heads out of one set of projections, adds
an output projection, a fused fast path and an optional KV cache for generating
token by token (``forward(x, kv_cache=attnlib.KVCache())``); its ``forward``
is the one chapter 6 builds. :class:`attnlib.GroupedQueryAttention` (chapter
9) extends it.

Shape legend as in :mod:`attnlib.attention`: ``batch`` (``b``), ``num_tokens``
(``<= context_length``), ``d_in``, ``d_out`` (of the whole layer), ``num_heads``
and ``head_dim = d_out // num_heads`` (the ``d_k`` of the ``1/sqrt(d_k)``
scale).

Mask convention, the same everywhere in attnlib: a **bool mask is True where a
query may attend** to a key. Parameter-creation order is ``W_query``,
``W_key``, ``W_value``, then ``out_proj``, the order of Raschka (2024), *Build
a Large Language Model (From Scratch)*, chapter 3, so that with the same seed
the weights, and hence the numbers, are the book's.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._heads import (
    check_context,
    check_key_padding_mask,
    check_plain_multi_head,
    moved_keywords,
    num_cached,
    register_causal_mask,
    register_no_mask,
    resolve_head_dim,
)
from ._validation import check_bool, check_dropout, check_input, check_positive_int, type_name
from .attention import CausalAttention
from .functional import (
    ATTN_IMPLEMENTATIONS,
    attention,
    bottom_right_causal_mask,
    merge_key_padding_mask,
)
from .kv_cache import KVCache

__all__ = [
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
]


class MultiHeadAttentionWrapper(nn.Module):
    r"""Several independent :class:`CausalAttention` heads, outputs concatenated.

    The plainest multi-head attention: ``num_heads`` heads, each with its own
    ``d_in -> d_out`` projections, run one after the other on the same input;
    their context vectors are concatenated on the last dimension, giving
    ``d_out * num_heads`` features per token. :class:`MultiHeadAttention`
    computes the same kind of result in one pass.

    Args:
        d_in: size of each input embedding.
        d_out: size of **each head's** context vector.
        context_length: the most tokens an input may have.
        dropout: probability of zeroing each attention weight in training
            mode, in ``[0, 1)``.
        num_heads: number of heads.
        qkv_bias: give the projections a bias. Default ``False``.

    Attributes:
        heads: ``nn.ModuleList`` of ``num_heads`` :class:`CausalAttention`
            modules, created in order (each creates its ``W_query``, ``W_key``,
            ``W_value``).

    Warning:
        Dropout acts in training mode, which is a module's default: call
        ``.eval()`` for deterministic outputs.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, or
            ``qkv_bias`` is not a bool.
        ValueError: ``d_in``, ``d_out``, ``context_length`` or ``num_heads`` is
            not positive, or ``dropout`` is outside ``[0, 1)``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (concatenated heads, without the output projection ``W^O``); Raschka (2024),
    *Build a Large Language Model (From Scratch)*, section 3.6.1.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        check_positive_int("context_length", context_length)
        check_dropout(dropout)
        check_positive_int("num_heads", num_heads)
        check_bool("qkv_bias", qkv_bias)
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.num_heads = num_heads
        self.heads = nn.ModuleList(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
                for _ in range(num_heads)
            ]
        )

    @overload
    def forward(self, x: torch.Tensor, return_weights: Literal[False] = ...) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, return_weights: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(
        self, x: torch.Tensor, return_weights: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run every head on ``x`` and concatenate their context vectors.

        Args:
            x: input embeddings, ``(batch, num_tokens, d_in)`` (or unbatched
                ``(num_tokens, d_in)``), with ``num_tokens <= context_length``.
            return_weights: also return the heads' attention weights. Default ``False``.

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_out * num_heads)`` (or
            ``(num_tokens, d_out * num_heads)``); head ``h`` fills features
            ``h * d_out`` to ``(h + 1) * d_out - 1``. With ``return_weights=True``,
            the pair ``(context_vec, attn_weights)``, ``attn_weights`` being
            ``(batch, num_heads, num_tokens, num_tokens)`` (or
            ``(num_heads, num_tokens, num_tokens)``), after dropout.

        Raises:
            TypeError: ``x`` is not a floating-point tensor or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError), or
                ``return_weights`` is not a bool.
            ValueError: ``x`` is not 2- or 3-D, ``x.shape[-1] != d_in``, ``x``
                has no tokens, or ``num_tokens > context_length``.
        """
        check_input(x, self.d_in, (2, 3), self.context_length)
        check_bool("return_weights", return_weights)
        if not return_weights:
            # (..., num_tokens, d_out * num_heads)
            return torch.cat([head(x) for head in self.heads], dim=-1)
        outputs = [head(x, return_weights=True) for head in self.heads]
        context_vec = torch.cat([c for c, _ in outputs], dim=-1)
        # context_vec: (..., num_tokens, d_out * num_heads)
        attn_weights = torch.stack([w for _, w in outputs], dim=-3)
        # attn_weights: (..., num_heads, num_tokens, num_tokens)
        return context_vec, attn_weights

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"num_heads={self.num_heads}"
        )


class MultiHeadAttention(nn.Module):
    r"""Causal multi-head self-attention: heads split from one set of projections.

    One ``d_in -> d_out`` projection each for queries, keys and values; their
    outputs are split into ``num_heads`` heads of ``head_dim = d_out // num_heads``
    features, each head attends causally with scale ``1/sqrt(head_dim)`` and
    dropout on its weights, the heads' context vectors are concatenated back to
    ``d_out`` features and mixed by the output projection ``out_proj`` (``W^O``).

    ``forward`` projects (:meth:`project`), splits the heads
    (:meth:`split_heads`), adds what the call brings (a KV cache's earlier keys
    and values), builds the mask (:meth:`attention_mask`), attends
    (:meth:`attend`, which calls :func:`attnlib.functional.attention`), merges
    the heads (:meth:`merge_heads`) and applies ``out_proj``. Subclasses build
    their ``forward`` from these public steps. The attention function has the
    implementations ``attn_implementation`` names:

    * ``"sdpa"`` (default): :func:`torch.nn.functional.scaled_dot_product_attention`
      with ``is_causal=True``, a fused kernel that never stores the
      ``(num_tokens, num_tokens)`` weights;
    * ``"flash"``: :func:`attnlib.functional.flash_attention`, the tiled
      algorithm of chapter 8 (no dropout, no padding, no cache);
    * ``"readable"``: :func:`attnlib.scaled_dot_product_attention` with the
      causal ``mask`` buffer, which ``forward(x, return_weights=True)`` always
      takes, returning the per-head weights for plotting.

    What a call brings comes in as arguments: ``forward(x,
    kv_cache=attnlib.KVCache())`` generates token by token (the keys and values
    of earlier calls are kept in the cache; chapter 9), ``key_padding_mask``
    hides padded keys, ``context`` gives cross-attention. What later chapters
    add to the layer lives in subclasses: :class:`attnlib.GroupedQueryAttention`
    (chapter 9) has fewer key/value heads and RoPE, and
    :class:`attnlib.QKNormSinkAttention` (chapter 13) adds QK-norm and
    attention sinks to it.

    Parameters are created in the order ``W_query``, ``W_key``, ``W_value``,
    ``out_proj`` (the reference book's), so seeded numbers match it.
    :meth:`from_torch` and :meth:`to_torch` convert from and to
    :class:`torch.nn.MultiheadAttention`.

    Args:
        d_in: size of each input embedding.
        d_out: size of the layer's output (all heads together); must be
            divisible by ``num_heads``.
        context_length: the most tokens an input may have.
        dropout: probability of zeroing each attention weight in training mode,
            in ``[0, 1)``.
        num_heads: number of heads.
        qkv_bias: give the query, key and value projections a bias. Default ``False``.
        out_bias: keyword-only; give ``out_proj`` a bias. Default ``True`` (as
            in the reference book and in ``torch.nn.MultiheadAttention``).
            ``from_torch`` sets it to ``False`` for a torch module built with
            ``bias=False``, whose output projection has no bias.
        causal: keyword-only; default True. False: bidirectional
            self-attention, and cross-attention with ``forward(x,
            context=...)`` (queries from ``x``, keys and values from
            ``context``), which equals ``nn.MultiheadAttention(x, context,
            context)``. A causal module refuses a context.
        mask_buffer: keyword-only; register the ``(context_length,
            context_length)`` bool ``mask`` buffer. Default True. With False,
            ``mask`` is None, no memory grows with ``context_length**2``, and
            each call builds the mask rows it needs
            (:func:`attnlib.functional.bottom_right_causal_mask`) or lets
            ``is_causal=True`` apply them; the outputs are the same.
        attn_implementation: keyword-only; one of
            :data:`attnlib.functional.ATTN_IMPLEMENTATIONS`, the path of
            ``forward`` without ``return_weights``. Default ``"sdpa"``. An
            attribute: set it to switch.
        num_kv_groups, head_dim: keyword-only; the layout of the projections
            that :class:`attnlib.GroupedQueryAttention` passes (as
            ``kdim``/``vdim`` are ``nn.MultiheadAttention``'s):
            ``num_kv_groups`` key/value heads, dividing ``num_heads`` (default
            None: ``num_heads``), of ``head_dim`` features each (default None:
            ``d_out // num_heads``). Given, ``W_query`` maps ``d_in -> num_heads
            * head_dim``, ``W_key`` and ``W_value`` map ``d_in -> num_kv_groups
            * head_dim``, and ``out_proj`` maps ``num_heads * head_dim ->
            d_out``; the parameters are created in the same order either way.

    Attributes:
        W_query: ``nn.Linear(d_in, d_out, bias=qkv_bias)`` (``num_heads *
            head_dim`` outputs if ``head_dim`` was given).
        W_key, W_value: the same, with ``num_kv_groups * head_dim`` outputs.
        out_proj: ``nn.Linear(d_out, d_out, bias=out_bias)`` (inputs
            ``num_heads * head_dim`` if ``head_dim`` was given).
        head_dim: ``d_out // num_heads`` unless given.
        num_kv_groups, group_size: ``num_heads`` and 1 unless given.
        causal: bool. attn_implementation: str.
        dropout_p: the attention-weight dropout probability (a float; set it
            to change the dropout).
        mask: bool buffer ``(context_length, context_length)``, True = may
            attend; used by the readable path and saved in the ``state_dict``
            under ``mask`` (as in the reference). Loading keeps the module's own
            mask, as for :class:`CausalAttention`. None with ``mask_buffer=False``
            or ``causal=False``.

    Warning:
        Dropout acts in training mode, which is a module's default: call
        ``.eval()`` for deterministic outputs. In training mode with
        ``dropout_p > 0`` the two paths draw different dropout masks, so only
        their distributions agree.

    Warning:
        The readable path computes the scores ``queries @ keys^T``, the softmax
        and the weighted sum in the input's dtype. In float32 and float64 the
        two paths agree to rounding. In bfloat16 or float16, and the more so
        the larger the scores, the readable path can be less accurate than
        torch's fused kernel (which may accumulate in float32): compare the
        paths, or check a result, in float32 or float64.

    Note:
        Loading the reference book's ``state_dict`` into this module works
        (its float ``mask`` is ignored, see :class:`CausalAttention`). The
        other direction does not: this module's ``mask`` is bool and True
        where a query **may** attend, while the reference classes
        (Raschka 2024, ch. 3) keep a float mask that is 1 where attention is
        **blocked**; loaded into them, attnlib's mask becomes its inverse: each
        token then attends only to the tokens after it (and the last token to
        none, which gives NaN). Drop the ``mask`` key
        (``{k: v for k, v in sd.items() if not k.endswith("mask")}`` with
        ``strict=False``) when loading attnlib's weights there.

    Note:
        Forward hooks on ``W_query``, ``W_key`` and ``W_value`` do not run on
        the fused path of :meth:`project` (gradients on and
        ``return_weights=False``), which applies their three weights as one
        ``F.linear`` without calling the layers: a hook there, to record or
        change a projection, needs ``return_weights=True`` or
        ``torch.no_grad()`` (as :func:`attnlib.training.ablate_head_into` does).
        Hooks on ``out_proj`` always run.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, a flag
            is not a bool, or an unknown keyword is given (the removed
            ``qk_norm`` and ``sinks`` name :class:`attnlib.QKNormSinkAttention`).
        ValueError: ``d_in``, ``d_out``, ``context_length``, ``num_heads``,
            ``num_kv_groups`` or ``head_dim`` is not positive; ``head_dim`` is
            None and ``d_out`` is not divisible by ``num_heads``;
            ``num_heads`` is not divisible by ``num_kv_groups``; ``dropout``
            is outside ``[0, 1)``; ``attn_implementation`` is unknown.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (multi-head attention, ``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``)
    and section 3.2.3 (causal masking); Raschka (2024), *Build a Large Language
    Model (From Scratch)*, section 3.6.2.
    """

    mask: torch.Tensor | None  # register_causal_mask's buffer; None with mask_buffer=False

    @moved_keywords("qk_norm", "sinks", to="attnlib.QKNormSinkAttention")
    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        out_bias: bool = True,
        causal: bool = True,
        mask_buffer: bool = True,
        attn_implementation: str = "sdpa",
        num_kv_groups: int | None = None,
        head_dim: int | None = None,
    ) -> None:
        for name, size in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length)):
            check_positive_int(name, size)
        check_dropout(dropout)
        check_positive_int("num_heads", num_heads)
        num_kv_groups = num_heads if num_kv_groups is None else num_kv_groups
        check_positive_int("num_kv_groups", num_kv_groups)
        for name, flag in (("qkv_bias", qkv_bias), ("out_bias", out_bias),
                           ("mask_buffer", mask_buffer), ("causal", causal)):
            check_bool(name, flag)
        head_dim = resolve_head_dim(d_out, num_heads, head_dim)
        if num_heads % num_kv_groups != 0:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by num_kv_groups={num_kv_groups}: "
                "each key/value head must serve the same number of query heads"
            )
        super().__init__()
        self.d_in, self.d_out = int(d_in), int(d_out)
        self.context_length = int(context_length)
        self.num_heads, self.num_kv_groups = int(num_heads), int(num_kv_groups)
        self.head_dim = head_dim
        self.group_size = self.num_heads // self.num_kv_groups
        self.dropout_p = float(dropout)
        q_dim = self.num_heads * self.head_dim  # d_out unless head_dim was given
        kv_dim = self.num_kv_groups * self.head_dim
        self.W_query = nn.Linear(d_in, q_dim, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(q_dim, d_out, bias=out_bias)
        self.causal = bool(causal)
        self.attn_implementation = _check_implementation(attn_implementation)
        if mask_buffer and causal:
            register_causal_mask(self, self.context_length)
        else:  # no (context_length, context_length) buffer: masks are built per call
            register_no_mask(self)

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
        """Causal multi-head self-attention of ``x`` (or cross-attention to ``context``).

        Args:
            x: input embeddings, ``(batch, num_tokens, d_in)``, with
                ``num_tokens <= context_length``. With ``kv_cache``, only the
                *new* tokens.
            return_weights: take the readable path and also return the
                per-head attention weights. Default ``False`` (the path of
                ``attn_implementation``).
            context: keyword-only; for a module built with ``causal=False``:
                ``(batch, num_tokens_kv, d_in)``, the
                sequence the keys and values come from (cross-attention: an
                encoder's output). Not with a ``kv_cache``. Default None:
                self-attention.
            kv_cache: keyword-only; an :class:`attnlib.KVCache` (see
                :meth:`new_cache`) holding the keys and values of the tokens
                before ``x`` (empty at the start of a sequence); the new
                tokens' keys and values are appended to it in place, and the
                new queries attend to everything cached and causally to each
                other: ``x``'s token ``i`` sits at position ``num_cached + i``
                (the causal mask aligned at the bottom-right). Feeding a
                sequence in chunks, one call per chunk with the same cache,
                gives the outputs of one call on the whole sequence. Default None.
            key_padding_mask: keyword-only; ``(batch, num_cached + num_tokens)``
                bool, **True where a key is padding**: torch's meaning of the
                keyword, the *opposite* of attnlib's attention masks (True =
                may attend). Combined with the causal mask; a query whose keys
                are all padding returns zeros (``nn.MultiheadAttention`` gives
                NaN). The outputs at padded *query* positions are computed but
                meaningless. With a ``context``, ``(batch, num_tokens_kv)``.
                Default None.

        Returns:
            ``output``: ``(batch, num_tokens, d_out)``, the heads' context
            vectors mixed by ``out_proj``. With ``return_weights=True``, the
            pair ``(output, attn_weights)``, ``attn_weights`` being ``(batch,
            num_heads, num_tokens, num_tokens)`` (``num_cached + num_tokens``
            columns with a cache, ``num_tokens_kv`` with a context): the
            weights applied to the values, after dropout.

        Raises:
            TypeError: ``x`` is not a floating-point tensor or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError), ``return_weights`` is not a bool, or ``kv_cache``
                is not a :class:`KVCache`.
            ValueError: ``x`` is not 3-D, ``x.shape[-1] != d_in``, ``x`` has no
                tokens, ``num_tokens > context_length``, the cached and new
                tokens together exceed ``context_length``, or the cache holds
                another batch size or layout; a bad ``key_padding_mask`` or
                ``context`` (see :meth:`check_inputs`).
        """
        num_cached = self.check_inputs(x, return_weights, context, kv_cache, key_padding_mask)
        # Step 1: project (one GEMM of the three weights side by side on the fast path).
        queries, keys, values = self.project(x, context, fused=not return_weights)
        # queries: (b, num_tokens, num_heads * head_dim); keys, values: (b, N_kv, ...)
        # Steps 2-3: split the features into heads of head_dim; heads before tokens.
        queries, keys, values = (self.split_heads(t) for t in (queries, keys, values))
        # queries: (b, num_heads, num_tokens, head_dim); keys, values: (b, heads, N_kv, head_dim)
        if kv_cache is not None:  # generation: the earlier tokens' keys and values come first
            keys, values = kv_cache.update(keys, values)  # (b, heads, num_cached + N, head_dim)

        # Steps 4-6: scores, mask, softmax and weighted sum (attend: functional.attention).
        attn_mask, is_causal = self.attention_mask(
            num_cached, keys.shape[-2], key_padding_mask, fast=not return_weights
        )  # True = may attend; or None with is_causal=True, which applies the same mask
        context_vec, attn_weights = self.attend(
            queries, keys, values, attn_mask, is_causal, return_weights
        )  # (b, num_heads, num_tokens, head_dim), weights (b, num_heads, num_tokens, N_kv)

        # Steps 7-8: heads back side by side, then the output projection.
        output: torch.Tensor = self.out_proj(self.merge_heads(context_vec))  # (b, N, d_out)
        if return_weights and attn_weights is not None:  # the readable path's weights
            return output, attn_weights
        return output

    def check_inputs(
        self,
        x: torch.Tensor,
        return_weights: bool,
        context: torch.Tensor | None,
        kv_cache: KVCache | None,
        key_padding_mask: torch.Tensor | None,
    ) -> int:
        """Check :meth:`forward`'s arguments before any computation; return ``num_cached``.

        Raises:
            TypeError, ValueError: as :meth:`forward` documents; a ``context``
                given to a causal module, or with a cache.
        """
        check_input(x, self.d_in, (3,), self.context_length, like=self.W_query.weight)
        check_bool("return_weights", return_weights)
        cached = num_cached(kv_cache, x.shape[1], self.context_length)
        source = check_context(self, context, x, kv_cache)  # keys and values come from it
        check_key_padding_mask(key_padding_mask, x.shape[0], cached + source.shape[1], x.device)
        if kv_cache is not None:
            kv_cache.check_next(x.shape[0], self.num_kv_groups, self.head_dim, self.head_dim,
                                x.dtype, x.device)
        return cached

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None, *, fused: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries of ``x``, keys and values of ``x`` (or ``context``): step 1 of ``forward``.

        With ``fused=True`` and gradients, the three weights are concatenated
        on the call and applied as ONE ``F.linear``: one GEMM forward, and in
        the backward ``x`` receives one product instead of a sum of three
        (the numbers of a layer whose weights are one tensor). Otherwise the
        three layers are applied one by one, which on the CPU is as fast as
        one fused GEMM (``tests/test_attention.py`` checks the values agree).

        The fused path does not call ``W_query``, ``W_key`` and ``W_value`` as
        modules, so **their forward hooks do not run** there (nor their
        forward pre-hooks); the layers' own ``forward`` is bypassed too. A
        hook on a projection needs ``fused=False``: ``forward(x,
        return_weights=True)``, or any call under ``torch.no_grad()``.

        Args:
            x: ``(batch, num_tokens, d_in)``.
            context: ``(batch, num_tokens_kv, d_in)`` or None (self-attention).
            fused: keyword-only; see above. Default True.

        Returns:
            ``(queries, keys, values)``: ``(batch, num_tokens, num_heads *
            head_dim)``, ``(batch, num_tokens_kv, num_kv_groups * head_dim)``
            twice.
        """
        layers = (self.W_query, self.W_key, self.W_value)
        params = [p for layer in layers for p in layer.parameters()]
        if fused and context is None and torch.is_grad_enabled() and any(
            p.requires_grad for p in params
        ):
            weight = torch.cat([layer.weight for layer in layers])  # (d_q + 2 * d_kv, d_in)
            bias = None if self.W_query.bias is None else torch.cat(
                [self.W_query.bias, self.W_key.bias, self.W_value.bias])
            sizes = [layer.out_features for layer in layers]
            queries, keys, values = F.linear(x, weight, bias).split(sizes, dim=-1)  # views
        else:
            source = x if context is None else context
            queries, keys, values = self.W_query(x), self.W_key(source), self.W_value(source)
        return queries, keys, values

    def split_heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """Features into heads of ``head_dim``, heads before tokens: steps 2-3 of ``forward``.

        Args:
            tensor: queries ``(batch, num_tokens, num_heads * head_dim)``, or
                keys or values ``(batch, num_tokens_kv, num_kv_groups * head_dim)``.

        Returns:
            ``(batch, heads, num_tokens, head_dim)``: a view (``view``, then
            ``transpose``; no copy), ``heads`` being ``num_heads`` for the
            queries and ``num_kv_groups`` for keys and values.
        """
        b, num_tokens, _ = tensor.shape
        return tensor.view(b, num_tokens, -1, self.head_dim).transpose(1, 2)

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        return_weights: bool = False,
        **options: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores, mask, softmax and weighted sum: steps 4-6 of ``forward``.

        :func:`attnlib.functional.attention` with the module's dropout (in
        training mode only) on the path ``attn_implementation`` names, or on
        the readable path with ``return_weights=True``.

        Args:
            queries: ``(batch, num_heads, num_tokens, head_dim)``.
            keys, values: ``(batch, num_kv_groups, num_tokens_kv, head_dim)``.
            attn_mask, is_causal: from :meth:`attention_mask` (True = may attend).
            return_weights: take the readable path, which returns the weights.
                Default ``False``.
            **options: further keywords of :func:`attnlib.functional.attention`
                that a subclass adds (``sinks`` in
                :class:`attnlib.QKNormSinkAttention`).

        Returns:
            ``(context_vec, attn_weights)``: ``(batch, num_heads, num_tokens,
            head_dim)`` and, on the readable path, ``(batch, num_heads,
            num_tokens, num_tokens_kv)`` (else None).
        """
        return attention(
            queries, keys, values, attn_mask, is_causal=is_causal,
            dropout_p=self.dropout_p if self.training else 0.0,
            implementation="readable" if return_weights else self.attn_implementation,
            **options,
        )

    def merge_heads(self, context_vec: torch.Tensor) -> torch.Tensor:
        """Heads back side by side: step 7 of ``forward`` (``reshape`` copies).

        Args:
            context_vec: ``(batch, num_heads, num_tokens, head_dim)``.

        Returns:
            ``(batch, num_tokens, num_heads * head_dim)`` (``d_out`` unless
            ``head_dim`` was given).
        """
        b, _, num_tokens, _ = context_vec.shape
        return context_vec.transpose(1, 2).reshape(b, num_tokens, -1)

    def attention_mask(
        self,
        num_cached: int,
        num_tokens_kv: int,
        key_padding_mask: torch.Tensor | None = None,
        *,
        fast: bool = False,
    ) -> tuple[torch.Tensor | None, bool]:
        """The mask of one attention call: ``(attn_mask, is_causal)``.

        ``attn_mask`` is True where a query may attend to a key, for the new
        queries at positions ``num_cached ... num_tokens_kv - 1`` (the
        bottom-right rows of the causal mask, sliced from the ``mask`` buffer
        or, without one, :func:`attnlib.functional.bottom_right_causal_mask`)
        and the keys ``0 ... num_tokens_kv - 1``: ``(N_q, N_kv)``, or ``(batch,
        1, N_q, N_kv)`` merged with a ``key_padding_mask``
        (:func:`attnlib.functional.merge_key_padding_mask`). With ``fast=True``
        from position 0 without padding it is ``(None, True)``: the kernel's
        ``is_causal=True`` applies the same mask without one being built. A
        module built with ``causal=False`` has no causal rows.
        """
        if self.causal and fast and num_cached == 0 and key_padding_mask is None:
            return None, True
        allowed = None
        if self.causal and self.mask is not None:
            allowed = self.mask[num_cached:num_tokens_kv, :num_tokens_kv]  # (N_q, N_kv)
        elif self.causal:
            allowed = bottom_right_causal_mask(num_tokens_kv - num_cached, num_tokens_kv,
                                               device=self.W_query.weight.device)
        return merge_key_padding_mask(allowed, key_padding_mask), False

    def new_cache(self) -> KVCache:
        """An empty :class:`attnlib.KVCache` for this layer (one per layer and batch)."""
        return KVCache()

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"num_heads={self.num_heads}, dropout_p={self.dropout_p}{self.options_repr()}"
        )

    def options_repr(self) -> str:
        """The non-default options, for ``extra_repr``: ``", causal=False"``."""
        return "".join(
            f", {name}={value!r}"
            for name, value, default in (
                ("causal", self.causal, True),
                ("attn_implementation", self.attn_implementation, "sdpa"),
            )
            if value != default
        )

    # -- interoperability with torch.nn.MultiheadAttention ------------------

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, context_length: int) -> MultiHeadAttention:
        """Build an equivalent :class:`MultiHeadAttention` from a ``torch.nn.MultiheadAttention``.

        Torch packs the three input projections into ``in_proj_weight``
        ``(3 * embed_dim, embed_dim)``, rows ``[W_q; W_k; W_v]`` (and
        ``in_proj_bias`` likewise); they are copied into ``W_query``, ``W_key``
        and ``W_value``, and ``out_proj`` is copied as is. A torch module built
        with ``bias=False`` has no output bias either, so the result gets
        ``qkv_bias=False, out_bias=False``. Dropout, dtype, device and
        training mode are copied. The new module does not share memory with
        ``module``.

        The result is causal: it equals ``module(x, x, x,
        attn_mask=~attnlib.causal_mask(num_tokens), need_weights=False)[0]``
        (torch's bool masks are True where attention is **blocked**).

        Called on ``MultiHeadAttention`` only: a torch module is plain
        multi-head attention, which a subclass (grouped-query attention, RoPE,
        QK-norm, sinks) would only pretend to be, so
        ``GroupedQueryAttention.from_torch`` raises a TypeError instead of
        returning another class than it names.

        Args:
            module: a ``torch.nn.MultiheadAttention`` built with
                ``batch_first=True`` and without ``kdim``/``vdim`` different
                from ``embed_dim``, ``add_bias_kv`` or ``add_zero_attn``.
            context_length: the most tokens the new module accepts.

        Returns:
            A :class:`MultiHeadAttention` with ``d_in = d_out = embed_dim``.

        Raises:
            TypeError: ``module`` is not a ``torch.nn.MultiheadAttention``, or
                ``from_torch`` is called on a subclass.
            ValueError: ``module`` has ``batch_first=False``, ``kdim`` or
                ``vdim`` different from ``embed_dim``, ``add_bias_kv=True`` or
                ``add_zero_attn=True``; or ``context_length`` is not positive.

        Source: the parameter layout of :class:`torch.nn.MultiheadAttention`.
        """
        if cls is not MultiHeadAttention:
            raise TypeError(
                f"{cls.__name__}.from_torch is not supported: torch.nn.MultiheadAttention is "
                "plain multi-head attention; call attnlib.MultiHeadAttention.from_torch"
            )
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"module must be a torch.nn.MultiheadAttention, got {type_name(module)}"
            )
        embed_dim = module.embed_dim
        if not module.batch_first:
            raise ValueError("module must have batch_first=True, got batch_first=False")
        if module.kdim != embed_dim or module.vdim != embed_dim:
            raise ValueError(
                f"module must have kdim == vdim == embed_dim={embed_dim}, "
                f"got kdim={module.kdim} and vdim={module.vdim}"
            )
        if module.bias_k is not None or module.bias_v is not None:
            raise ValueError("module must have add_bias_kv=False, got add_bias_kv=True")
        if module.add_zero_attn:
            raise ValueError("module must have add_zero_attn=False, got add_zero_attn=True")
        check_positive_int("context_length", context_length)

        qkv_bias = module.in_proj_bias is not None
        out_bias = module.out_proj.bias is not None
        new = MultiHeadAttention(
            embed_dim,
            embed_dim,
            context_length,
            float(module.dropout),
            module.num_heads,
            qkv_bias=qkv_bias,
            out_bias=out_bias,
        )
        ref = module.in_proj_weight
        new.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            # in_proj_weight: (3 * embed_dim, embed_dim) -> three (embed_dim, embed_dim) blocks
            w_q, w_k, w_v = module.in_proj_weight.chunk(3, dim=0)
            new.W_query.weight.copy_(w_q)
            new.W_key.weight.copy_(w_k)
            new.W_value.weight.copy_(w_v)
            if qkv_bias:
                # in_proj_bias: (3 * embed_dim,) -> three (embed_dim,) blocks
                b_q, b_k, b_v = module.in_proj_bias.chunk(3, dim=0)
                new.W_query.bias.copy_(b_q)
                new.W_key.bias.copy_(b_k)
                new.W_value.bias.copy_(b_v)
            new.out_proj.weight.copy_(module.out_proj.weight)
            if out_bias:
                new.out_proj.bias.copy_(module.out_proj.bias)
        new.train(module.training)
        return new

    def to_torch(self) -> nn.MultiheadAttention:
        """Build an equivalent ``torch.nn.MultiheadAttention(batch_first=True)``.

        The reverse of :meth:`from_torch`: ``W_query``, ``W_key``, ``W_value``
        are stacked into ``in_proj_weight`` ``(3 * d_out, d_in)``. Torch has one
        ``bias`` flag for both the input and the output projections, so the
        torch module has ``bias = qkv_bias or out_bias``, and a bias this module
        lacks is filled with zeros there (the default ``qkv_bias=False,
        out_bias=True`` gives a zero ``in_proj_bias``, which torch will train).
        Dropout, dtype, device and training mode are copied; no memory is
        shared.

        Call the result with ``attn_mask=~attnlib.causal_mask(num_tokens)``
        (True = blocked, torch's polarity) or ``is_causal=True`` with that mask,
        to get this module's causal output.

        Only plain multi-head attention converts: a subclass's module with
        shared key/value heads, RoPE, QK-norm, sinks or a sliding window is
        refused before anything is built (torch's module has none of them, so
        it would compute something else); one without them (e.g.
        ``GroupedQueryAttention`` with ``num_kv_groups == num_heads`` and no
        RoPE) converts.

        Returns:
            A ``torch.nn.MultiheadAttention`` with ``embed_dim = d_out``.

        Raises:
            ValueError: ``num_kv_groups != num_heads``, or the module has RoPE,
                QK-norm, sinks or a window; ``d_in != d_out``, or ``num_heads *
                head_dim != d_out`` (torch's self-attention uses one
                ``embed_dim`` for all three).

        Source: the parameter layout of :class:`torch.nn.MultiheadAttention`.
        """
        check_plain_multi_head(self, "self", "to_torch")
        if self.num_heads * self.head_dim != self.d_out:
            raise ValueError(
                f"to_torch needs num_heads * head_dim == d_out (torch's embed_dim), got "
                f"num_heads={self.num_heads}, head_dim={self.head_dim}, d_out={self.d_out}"
            )
        if self.d_in != self.d_out:
            raise ValueError(
                f"to_torch needs d_in == d_out (torch's embed_dim), got d_in={self.d_in} "
                f"and d_out={self.d_out}"
            )
        qkv_bias = self.W_query.bias is not None
        out_bias = self.out_proj.bias is not None
        ref = self.W_query.weight
        module = nn.MultiheadAttention(
            self.d_out,
            self.num_heads,
            dropout=self.dropout_p,
            bias=qkv_bias or out_bias,
            batch_first=True,
            device=ref.device,
            dtype=ref.dtype,
        )
        with torch.no_grad():
            module.in_proj_weight.copy_(
                torch.cat([self.W_query.weight, self.W_key.weight, self.W_value.weight], dim=0)
            )  # (3 * d_out, d_in)
            if qkv_bias:
                module.in_proj_bias.copy_(
                    torch.cat([self.W_query.bias, self.W_key.bias, self.W_value.bias], dim=0)
                )  # (3 * d_out,)
            elif out_bias:
                module.in_proj_bias.zero_()
            module.out_proj.weight.copy_(self.out_proj.weight)
            if out_bias:
                module.out_proj.bias.copy_(self.out_proj.bias)
            elif qkv_bias:
                module.out_proj.bias.zero_()
        module.train(self.training)
        return module


def _check_implementation(attn_implementation: object) -> str:
    """``attn_implementation``, checked against ``ATTN_IMPLEMENTATIONS``."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, "
            f"got {attn_implementation!r}"
        )
    return str(attn_implementation)
