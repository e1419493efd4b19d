"""Multi-head causal self-attention: several heads side by side, then split
out of one set of projections.

:class:`MultiHeadAttentionWrapper` runs several :class:`attnlib.CausalAttention`
heads one after the other and concatenates their outputs;
:class:`MultiHeadAttention` splits the heads out of one set of projections, adds
an output projection, a fused fast path and an optional KV cache for generating
token by token (``forward(x, kv_cache=attnlib.KVCache())``). It is
grouped-query attention with one key/value head per query head, so it
subclasses :class:`attnlib.GroupedQueryAttention` (chapter 9), whose
constructor and cached ``forward`` it shares; its own ``forward`` is the one
chapter 6 builds.

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

from typing import Literal, overload

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as attn_functional
from ._heads import _fused_qkv_projection, _uses_general_forward
from ._validation import check_bool as _check_bool
from ._validation import check_dropout as _check_dropout
from ._validation import check_input as _check_input
from ._validation import check_positive_int as _check_positive_int
from ._validation import type_name
from .attention import CausalAttention
from .gqa import GroupedQueryAttention, _options
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
        _check_positive_int("d_in", d_in)
        _check_positive_int("d_out", d_out)
        _check_positive_int("context_length", context_length)
        _check_dropout(dropout)
        _check_positive_int("num_heads", num_heads)
        _check_bool("qkv_bias", qkv_bias)
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
        _check_input(x, self.d_in, (2, 3), self.context_length)
        _check_bool("return_weights", return_weights)
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


class MultiHeadAttention(GroupedQueryAttention):
    r"""Causal multi-head self-attention: heads split from one set of projections.

    One ``d_in -> d_out`` projection each for queries, keys and values; their
    outputs are split into ``num_heads`` heads of ``head_dim = d_out // num_heads``
    features, each head attends causally with scale ``1/sqrt(head_dim)`` and
    dropout on its weights, the heads' context vectors are concatenated back to
    ``d_out`` features and mixed by the output projection ``out_proj`` (``W^O``).

    ``forward`` has two paths that compute the same function:

    * fast (default): one fused projection (the weights of ``W_query``,
      ``W_key`` and ``W_value`` stacked into a single ``(3 * d_out, d_in)``
      matrix, so one GEMM instead of three; each of the three ``nn.Linear``
      layers still gets its own gradient, and the three weights are stored
      side by side so that without gradients the stack needs no copy), then
      :func:`torch.nn.functional.scaled_dot_product_attention` with
      ``is_causal=True``, a fused kernel that never stores the
      ``(num_tokens, num_tokens)`` weights;
    * readable (``return_weights=True``): the three projections one by one and
      :func:`attnlib.scaled_dot_product_attention` with the causal ``mask``
      buffer, returning the per-head weights for plotting.

    With ``forward(x, kv_cache=cache)`` the layer generates incrementally:
    ``x`` holds only the new tokens, their keys and values are appended to the
    :class:`attnlib.KVCache`, and the causal mask is aligned at the
    bottom-right (see :meth:`forward`). That path is chapter 9's: this class
    is :class:`attnlib.GroupedQueryAttention` with one key/value head per
    query head (``num_kv_groups = num_heads``, no RoPE) and inherits its
    constructor's plumbing and its cached ``forward``.

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
        head_dim: keyword-only; features per head. Default None: ``d_out //
            num_heads``. Given, the projections map ``d_in -> num_heads *
            head_dim`` and ``out_proj`` maps ``num_heads * head_dim -> d_out``.
        mask_buffer: keyword-only; register the ``(context_length,
            context_length)`` bool ``mask`` buffer. Default True. With False,
            ``mask`` is None, no memory grows with ``context_length**2``, and
            every call goes through :meth:`attnlib.GroupedQueryAttention.forward`,
            which builds the mask rows a call needs (or lets ``is_causal=True``
            apply them); the outputs are the same.
        qk_norm, sinks: keyword-only; QK-norm (Qwen3) and learned attention
            sinks (gpt-oss), as in :class:`attnlib.GroupedQueryAttention`.
            Default False.
        causal: keyword-only; default True. False: bidirectional
            self-attention, and cross-attention with ``forward(x,
            context=...)`` (queries from ``x``, keys and values from
            ``context``), which equals ``nn.MultiheadAttention(x, context,
            context)``. A causal module refuses a context.

    Attributes:
        W_query, W_key, W_value: ``nn.Linear(d_in, d_out, bias=qkv_bias)``
            (``num_heads * head_dim`` outputs if ``head_dim`` was given).
        out_proj: ``nn.Linear(d_out, d_out, bias=out_bias)`` (inputs
            ``num_heads * head_dim`` if ``head_dim`` was given).
        head_dim: ``d_out // num_heads`` unless given.
        num_kv_groups, group_size, rope: as in
            :class:`attnlib.GroupedQueryAttention`: ``num_heads``, 1 and None.
        dropout_p: the attention-weight dropout probability (a float; set it
            to change the dropout).
        mask: bool buffer ``(context_length, context_length)``, True = may
            attend; used by the readable path and saved in the ``state_dict``
            under ``mask`` (as in the reference). Loading keeps the module's own
            mask, as for :class:`CausalAttention`. None with ``mask_buffer=False``.

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

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, or
            ``qkv_bias``/``out_bias`` is not a bool.
        ValueError: ``d_in``, ``d_out``, ``context_length``, ``num_heads`` or
            ``head_dim`` is not positive; ``head_dim`` is None and ``d_out`` is
            not divisible by ``num_heads``; ``dropout`` is outside ``[0, 1)``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (multi-head attention, ``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O``)
    and section 3.2.3 (causal masking); Raschka (2024), *Build a Large Language
    Model (From Scratch)*, section 3.6.2.
    """

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
        head_dim: int | None = None,
        mask_buffer: bool = True,
        qk_norm: bool = False,
        sinks: bool = False,
        causal: bool = True,
    ) -> None:
        # Grouped-query attention with one key/value head per query head: the
        # checks (with these arguments, the same errors), the four projections
        # in the book's order, the packed fast path and the mask buffer.
        super().__init__(
            d_in, d_out, context_length, dropout, num_heads, num_kv_groups=num_heads,
            qkv_bias=qkv_bias, out_bias=out_bias, head_dim=head_dim, mask_buffer=mask_buffer,
            qk_norm=qk_norm, sinks=sinks, causal=causal,
        )

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
                per-head attention weights. Default ``False`` (fast path).
            context: keyword-only; for a module built with ``causal=False``:
                ``(batch, num_tokens_kv, d_in)``, the sequence the keys and
                values come from (cross-attention: an encoder's output).
                Default None: self-attention.
            kv_cache: keyword-only; an :class:`attnlib.KVCache`, for generating
                token by token (chapter 9): ``x`` then holds only the new
                tokens, which attend to the cached ones and causally to each
                other. The call is then
                :meth:`attnlib.GroupedQueryAttention.forward`'s, which documents
                it. Default None.
            key_padding_mask: keyword-only; ``(batch, num_tokens)`` bool (with
                a cache, ``num_cached + num_tokens``), **True where a key is
                padding**: torch's meaning of the keyword, the *opposite* of
                attnlib's attention masks (True = may attend). Combined with
                the causal mask; a query whose keys are all padding returns
                zeros (``nn.MultiheadAttention`` gives NaN). See
                :meth:`attnlib.GroupedQueryAttention.forward`. With a
                ``context``, ``(batch, num_tokens_kv)``. Default None.

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_out)``. With
            ``return_weights=True``, the pair ``(context_vec, attn_weights)``,
            ``attn_weights`` being ``(batch, num_heads, num_tokens, num_tokens)``
            (with a cache, ``num_cached + num_tokens`` columns): the weights
            applied to the values, after dropout.

        Raises:
            TypeError: ``x`` is not a floating-point tensor or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError), ``return_weights`` is not a bool, or ``kv_cache``
                is not a :class:`KVCache`.
            ValueError: ``x`` is not 3-D, ``x.shape[-1] != d_in``, ``x`` has no
                tokens, ``num_tokens > context_length``, the cached and new
                tokens together exceed ``context_length``, or the cache holds
                another batch size or layout; a ``context`` given to a causal
                module (see :meth:`attnlib.GroupedQueryAttention.forward`).
        """
        if self.mask is None or _uses_general_forward(self, kv_cache, key_padding_mask, context):
            # chapter 9's forward: a cache, padding, cross-attention or another option
            return super().forward(x, return_weights, context=context, kv_cache=kv_cache,
                                   key_padding_mask=key_padding_mask)
        _check_input(x, self.d_in, (3,), self.context_length, like=self.W_query.weight)
        _check_bool("return_weights", return_weights)
        b, num_tokens, _ = x.shape
        num_heads, head_dim = self.num_heads, self.head_dim

        # Project, then split d_out into heads and move heads before tokens.
        if return_weights:  # readable: one projection per matrix, as in the chapters
            queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
        else:  # fast: the three projections as one GEMM
            queries, keys, values = _fused_qkv_projection(
                x, self.W_query, self.W_key, self.W_value
            )  # each (b, num_tokens, d_out)
        queries = queries.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # queries: (b, num_heads, num_tokens, head_dim)
        keys = keys.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # keys: (b, num_heads, num_tokens, head_dim)
        values = values.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)
        # values: (b, num_heads, num_tokens, head_dim)

        dropout_p = self.dropout_p if self.training else 0.0
        if return_weights:
            allowed = self.mask[:num_tokens, :num_tokens]  # True = may attend
            context_vec, attn_weights = attn_functional.scaled_dot_product_attention(
                queries, keys, values, attn_mask=allowed, dropout_p=dropout_p, return_weights=True
            )  # (b, num_heads, num_tokens, head_dim), (b, num_heads, num_tokens, num_tokens)
        else:  # is_causal=True: torch's fused kernel applies the same mask itself
            context_vec = F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=dropout_p, is_causal=True
            )  # (b, num_heads, num_tokens, head_dim)

        # Put the heads back side by side: reshape copies, as the transpose is not contiguous.
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, num_heads * head_dim)
        # context_vec: (b, num_tokens, num_heads * head_dim), d_out unless head_dim was given
        context_vec = self.out_proj(context_vec)  # (b, num_tokens, d_out)
        if return_weights:
            return context_vec, attn_weights
        return context_vec

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"num_heads={self.num_heads}, dropout_p={self.dropout_p}{_options(self)}"
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

        Args:
            module: a ``torch.nn.MultiheadAttention`` built with
                ``batch_first=True`` and without ``kdim``/``vdim`` different
                from ``embed_dim``, ``add_bias_kv`` or ``add_zero_attn``.
            context_length: the most tokens the new module accepts.

        Returns:
            A :class:`MultiHeadAttention` with ``d_in = d_out = embed_dim``.

        Raises:
            TypeError: ``module`` is not a ``torch.nn.MultiheadAttention``.
            ValueError: ``module`` has ``batch_first=False``, ``kdim`` or
                ``vdim`` different from ``embed_dim``, ``add_bias_kv=True`` or
                ``add_zero_attn=True``; or ``context_length`` is not positive.

        Source: the parameter layout of :class:`torch.nn.MultiheadAttention`.
        """
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
        _check_positive_int("context_length", context_length)

        qkv_bias = module.in_proj_bias is not None
        out_bias = module.out_proj.bias is not None
        new = cls(
            embed_dim,
            embed_dim,
            context_length,
            float(module.dropout),
            module.num_heads,
            qkv_bias,
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

        Returns:
            A ``torch.nn.MultiheadAttention`` with ``embed_dim = d_out``.

        Raises:
            ValueError: ``d_in != d_out``, or ``num_heads * head_dim != d_out``
                (torch's self-attention uses one ``embed_dim`` for all three).

        Source: the parameter layout of :class:`torch.nn.MultiheadAttention`.
        """
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
