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

from typing import Literal, overload

import torch

from ._heads import moved_keywords
from ._validation import check_bool
from .kv_cache import KVCache
from .multihead import MultiHeadAttention
from .positional import RotaryPositionalEmbedding

__all__ = ["GroupedQueryAttention"]


class GroupedQueryAttention(MultiHeadAttention):
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

    It extends :class:`attnlib.MultiHeadAttention`, whose steps its
    ``forward`` calls: the narrower ``W_key`` and ``W_value`` give
    ``num_kv_groups`` heads, which :func:`attnlib.functional.attention` shares
    among the query heads (torch's kernel with ``enable_gqa=True`` on the fast
    path; ``repeat_interleave`` then :func:`attnlib.scaled_dot_product_attention`
    on the readable one, ``return_weights=True``), and RoPE acts in
    :meth:`transform_queries_keys`, between the head split and the cache.
    :class:`attnlib.QKNormSinkAttention` (chapter 13) extends this class with
    QK-norm and attention sinks.

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
        causal: keyword-only; mask future keys. Default True. False gives
            bidirectional attention (an encoder), and is required for
            cross-attention (``forward(x, context=...)``), where a causal
            mask would be a mistake.
        attn_implementation: keyword-only; the path of ``forward`` without
            ``return_weights``: ``"sdpa"`` (default), ``"flash"`` or
            ``"readable"`` (:data:`attnlib.functional.ATTN_IMPLEMENTATIONS`).

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
        causal: bool. attn_implementation: str.

    Warning:
        Dropout acts in training mode, which is a module's default: call
        ``.eval()`` for deterministic outputs.

    Note:
        ``num_kv_groups == num_heads`` without RoPE computes what
        :class:`attnlib.MultiHeadAttention` computes, which this class extends.
        Forward hooks on the projections do not run on the fused path, see
        :meth:`~attnlib.MultiHeadAttention.project`.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, a flag
            is not a bool, or an unknown keyword is given (the removed
            ``qk_norm`` and ``sinks`` name :class:`attnlib.QKNormSinkAttention`).
        ValueError: a size is not positive; ``head_dim`` is None and ``d_out``
            is not divisible by ``num_heads``; ``num_heads`` is not divisible by ``num_kv_groups``;
            ``dropout`` is outside ``[0, 1)``; with ``rope=True``, ``head_dim``
            is odd or ``rope_base`` is not finite and positive;
            ``attn_implementation`` is unknown.

    Source: Ainslie et al. (2023), "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints", section 2.2; Shazeer (2019),
    "Fast Transformer Decoding: One Write-Head is All You Need" (multi-query);
    Su et al. (2021), RoFormer, eq. (34) (RoPE).
    """

    @moved_keywords("qk_norm", "sinks", to="attnlib.QKNormSinkAttention")
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
        causal: bool = True,
        attn_implementation: str = "sdpa",
    ) -> None:
        check_bool("rope", rope)
        # Multi-head attention's layer, with num_kv_groups key/value heads:
        # W_key and W_value map d_in -> num_kv_groups * head_dim.
        super().__init__(
            d_in, d_out, context_length, dropout, num_heads, qkv_bias, out_bias=out_bias,
            causal=causal, mask_buffer=mask_buffer, attn_implementation=attn_implementation,
            num_kv_groups=num_kv_groups, head_dim=head_dim,
        )
        self.rope = (
            RotaryPositionalEmbedding(self.head_dim, self.context_length, rope_base)
            if rope
            else None
        )

    @overload
    def forward(self, x: torch.Tensor, return_weights: Literal[False] = ..., *,
                context: torch.Tensor | None = ..., kv_cache: KVCache | None = ...,
                key_padding_mask: torch.Tensor | None = ...) -> torch.Tensor: ...
    @overload
    def forward(self, x: torch.Tensor, return_weights: Literal[True], *,
                context: torch.Tensor | None = ..., kv_cache: KVCache | None = ...,
                key_padding_mask: torch.Tensor | None = ...
                ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def forward(self, x: torch.Tensor, return_weights: bool, *,
                context: torch.Tensor | None = ..., kv_cache: KVCache | None = ...,
                key_padding_mask: torch.Tensor | None = ...
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x: torch.Tensor, return_weights: bool = False, *,
                context: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                key_padding_mask: torch.Tensor | None = None,
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Multi-head attention's steps with ``num_kv_groups`` key/value heads, and RoPE.

        Arguments, returns and errors as :meth:`attnlib.MultiHeadAttention.forward`
        (the cache holds ``num_kv_groups`` heads; a module with RoPE refuses a ``context``).
        """
        num_cached = self.check_inputs(x, return_weights, context, kv_cache, key_padding_mask)
        queries, keys, values = self.project(x, context, fused=not return_weights)
        queries, keys, values = (self.split_heads(t) for t in (queries, keys, values))
        # queries: (b, num_heads, num_tokens, head_dim); keys, values: (b, num_kv_groups, ...)
        queries, keys = self.transform_queries_keys(queries, keys, num_cached)  # RoPE
        if kv_cache is not None:  # after RoPE: the cache keeps rotated keys
            keys, values = kv_cache.update(keys, values)  # (b, num_kv_groups, N_kv, head_dim)
        attn_mask, is_causal = self.attention_mask(
            num_cached, keys.shape[-2], key_padding_mask, fast=not return_weights
        )
        # each key/value head serves group_size consecutive query heads
        context_vec, attn_weights = self.attend(
            queries, keys, values, attn_mask, is_causal, return_weights
        )  # (b, num_heads, num_tokens, head_dim)
        output: torch.Tensor = self.out_proj(self.merge_heads(context_vec))  # (b, N, d_out)
        if return_weights and attn_weights is not None:  # the readable path's weights
            return output, attn_weights
        return output

    def check_inputs(self, x: torch.Tensor, return_weights: bool, context: torch.Tensor | None,
                     kv_cache: KVCache | None, key_padding_mask: torch.Tensor | None) -> int:
        """:meth:`attnlib.MultiHeadAttention.check_inputs`, and no ``context`` with RoPE.

        Raises:
            TypeError, ValueError: as there; ValueError: a ``context`` given to
                a module with RoPE (its positions and the queries' are of two sequences).
        """
        cached = super().check_inputs(x, return_weights, context, kv_cache, key_padding_mask)
        if context is not None and self.rope is not None:
            raise ValueError(
                "context was given to a module with rope=True: the positions of queries and of "
                "the context's keys belong to different sequences; build it with rope=False"
            )
        return cached

    def transform_queries_keys(
        self, queries: torch.Tensor, keys: torch.Tensor, num_cached: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE: rotate queries ``(b, num_heads, N, head_dim)`` and keys ``(b,
        num_kv_groups, N, head_dim)`` by position ``num_cached + t`` (as they are
        without RoPE). Source: Su et al. (2021), RoFormer, eq. (34)."""
        if self.rope is None:
            return queries, keys
        return self.rope(queries, offset=num_cached), self.rope(keys, offset=num_cached)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"num_heads={self.num_heads}, num_kv_groups={self.num_kv_groups}, "
            f"dropout_p={self.dropout_p}{self.options_repr()}"
        )
