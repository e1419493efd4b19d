"""Single-head self-attention modules, from a compact class with raw weight
matrices to causal attention.

The classes follow the course's arc: :class:`SelfAttention_v1` (weights as
``nn.Parameter``), :class:`SelfAttention_v2` (weights as ``nn.Linear``) and
:class:`CausalAttention` (future tokens hidden, dropout on the weights). The
multi-head classes, :class:`attnlib.MultiHeadAttentionWrapper` (several causal
heads side by side) and :class:`attnlib.MultiHeadAttention` (the heads split
out of one set of projections), live in :mod:`attnlib.multihead`, which builds
on the classes here; grouped-query attention lives in :mod:`attnlib.gqa`, the
KV cache in :mod:`attnlib.kv_cache`. The plumbing they share (the causal-mask
buffer, the checks of a cache, padding and cross-attention) is in the private
module ``attnlib._heads``, below all of them.

Shape legend used in every docstring here:

* ``batch`` (``b``): sequences processed together.
* ``num_tokens``: tokens in each sequence (``<= context_length`` where the
  module is causal).
* ``d_in``: size of each input embedding.
* ``d_out``: size of each query, key, value and context vector (of the whole
  layer, for the multi-head classes).
* ``num_heads``: attention heads; ``head_dim = d_out // num_heads`` is the size
  of one head's query, key and value vectors (the ``d_k`` of the
  ``1/sqrt(d_k)`` scale).
* ``context_length``: the most tokens a causal module accepts.

Mask convention, the same everywhere in attnlib: a **bool mask is True where a
query may attend** to a key, as in :func:`torch.nn.functional.scaled_dot_product_attention`.
``torch.nn.MultiheadAttention`` uses the opposite polarity (True = masked out).

Parameter-creation order is ``W_query``, ``W_key``, ``W_value`` (then
``out_proj``), the order of Raschka (2024), *Build a Large Language Model (From
Scratch)*, chapter 3, so that with the same seed the weights, and hence the
numbers, are the book's.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
import torch.nn as nn

from ._heads import register_causal_mask
from ._validation import check_bool, check_dropout, check_input, check_positive_int

__all__ = [
    "SelfAttention_v1",
    "SelfAttention_v2",
    "CausalAttention",
]


# ---------------------------------------------------------------------------
# Single-head self-attention
# ---------------------------------------------------------------------------


class SelfAttention_v1(nn.Module):
    r"""Scaled dot-product self-attention with raw weight matrices.

    ``queries = x @ W_query``, ``keys = x @ W_key``, ``values = x @ W_value``;
    ``attn_weights = softmax(queries @ keys^T / sqrt(d_out))`` row by row; and
    ``context_vec = attn_weights @ values``. The weights are ``nn.Parameter``
    tensors drawn from ``torch.rand`` (uniform on ``[0, 1)``), created in the
    order ``W_query``, ``W_key``, ``W_value``: with ``torch.manual_seed(123)``,
    ``d_in=3`` and ``d_out=2`` the output on :func:`attnlib.journey_embeddings`
    is the reference book's.

    Args:
        d_in: size of each input embedding.
        d_out: size of each query, key, value and context vector (``d_k = d_out``).

    Attributes:
        W_query, W_key, W_value: ``nn.Parameter`` of shape ``(d_in, d_out)``.

    Raises:
        TypeError: ``d_in`` or ``d_out`` is not an int.
        ValueError: ``d_in`` or ``d_out`` is not positive.

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1);
    Raschka (2024), *Build a Large Language Model (From Scratch)*, section 3.4.2.
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend every token to every token (no mask).

        Args:
            x: input embeddings, ``(num_tokens, d_in)`` or ``(batch, num_tokens, d_in)``.

        Returns:
            ``context_vec``: ``(num_tokens, d_out)`` or ``(batch, num_tokens, d_out)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor, or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError).
            ValueError: ``x`` is not 2- or 3-D, ``x.shape[-1] != d_in``, or ``x``
                has no tokens.
        """
        check_input(x, self.d_in, (2, 3), like=self.W_query)
        keys = x @ self.W_key  # (..., num_tokens, d_out)
        queries = x @ self.W_query  # (..., num_tokens, d_out)
        values = x @ self.W_value  # (..., num_tokens, d_out)

        attn_scores = queries @ keys.transpose(-2, -1)  # (..., num_tokens, num_tokens)
        d_k = keys.shape[-1]
        attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)  # rows sum to 1
        context_vec = attn_weights @ values  # (..., num_tokens, d_out)
        return context_vec

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


class SelfAttention_v2(nn.Module):
    r"""Scaled dot-product self-attention with ``nn.Linear`` projections.

    The same computation as :class:`SelfAttention_v1`, but the projections are
    ``nn.Linear`` layers: they use PyTorch's default initialisation (uniform on
    ``±1/sqrt(d_in)``, which keeps the scores small, unlike ``torch.rand``) and
    may have a bias. ``nn.Linear`` stores its weight as ``(d_out, d_in)`` and
    computes ``x @ weight.T``, so ``SelfAttention_v1.W_query`` equals
    ``SelfAttention_v2.W_query.weight.T``. Layers are created in the order
    ``W_query``, ``W_key``, ``W_value``.

    Args:
        d_in: size of each input embedding.
        d_out: size of each query, key, value and context vector (``d_k = d_out``).
        qkv_bias: give the three projections a bias. Default ``False``.

    Attributes:
        W_query, W_key, W_value: ``nn.Linear(d_in, d_out, bias=qkv_bias)``;
            each ``weight`` is ``(d_out, d_in)``, each ``bias`` ``(d_out,)``.

    Raises:
        TypeError: ``d_in`` or ``d_out`` is not an int, or ``qkv_bias`` is not a bool.
        ValueError: ``d_in`` or ``d_out`` is not positive.

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1);
    Raschka (2024), *Build a Large Language Model (From Scratch)*, section 3.4.2.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        check_bool("qkv_bias", qkv_bias)
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend every token to every token (no mask).

        Args:
            x: input embeddings, ``(num_tokens, d_in)`` or ``(batch, num_tokens, d_in)``.

        Returns:
            ``context_vec``: ``(num_tokens, d_out)`` or ``(batch, num_tokens, d_out)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor, or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError).
            ValueError: ``x`` is not 2- or 3-D, ``x.shape[-1] != d_in``, or ``x``
                has no tokens.
        """
        check_input(x, self.d_in, (2, 3), like=self.W_query.weight)
        keys = self.W_key(x)  # (..., num_tokens, d_out)
        queries = self.W_query(x)  # (..., num_tokens, d_out)
        values = self.W_value(x)  # (..., num_tokens, d_out)

        attn_scores = queries @ keys.transpose(-2, -1)  # (..., num_tokens, num_tokens)
        d_k = keys.shape[-1]
        attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)  # rows sum to 1
        context_vec = attn_weights @ values  # (..., num_tokens, d_out)
        return context_vec

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


class CausalAttention(nn.Module):
    r"""Single-head causal self-attention with dropout on the attention weights.

    Token ``i`` attends only to tokens ``j <= i``: the scores above the diagonal
    are set to ``-inf`` before the softmax, so their weights are exactly 0 and
    each row still sums to 1. Then dropout zeroes random weights.

    The causal mask is a bool buffer ``mask`` of shape
    ``(context_length, context_length)``, **True where a query may attend**
    (:func:`attnlib.causal_mask`); as a buffer it moves with ``.to()`` and is
    saved in the ``state_dict`` under the key ``mask``, as in the reference
    implementation. Loading a ``state_dict`` keeps the module's own mask (the
    reference stores a float mask of the opposite polarity; see the Note).

    Args:
        d_in: size of each input embedding.
        d_out: size of each query, key, value and context vector (``d_k = d_out``).
        context_length: the most tokens an input may have.
        dropout: probability of zeroing each attention weight in training mode,
            in ``[0, 1)``. Kept weights are scaled by ``1 / (1 - dropout)``.
        qkv_bias: give the three projections a bias. Default ``False``.

    Attributes:
        W_query, W_key, W_value: ``nn.Linear(d_in, d_out, bias=qkv_bias)``,
            created in that order.
        dropout: ``nn.Dropout(dropout)``, applied to the attention weights.
        mask: bool buffer ``(context_length, context_length)``, True = may attend.

    Warning:
        Dropout acts in training mode, which is a module's default: call
        ``.eval()`` for deterministic outputs.

    Note:
        A ``state_dict`` from the reference implementation (whose ``mask`` is a
        float tensor with 1 where attention is *blocked*) loads correctly: an
        incoming ``mask`` of the right shape is ignored in favour of the
        module's own, which depends only on ``context_length``.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, or
            ``qkv_bias`` is not a bool.
        ValueError: ``d_in``, ``d_out`` or ``context_length`` is not positive,
            or ``dropout`` is outside ``[0, 1)``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.3
    (masking); Raschka (2024), *Build a Large Language Model (From Scratch)*,
    section 3.5 (causal attention and dropout on the weights).
    """

    mask: torch.Tensor  # the buffer that register_causal_mask registers

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        qkv_bias: bool = False,
    ) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        check_positive_int("context_length", context_length)
        check_dropout(dropout)
        check_bool("qkv_bias", qkv_bias)
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        register_causal_mask(self, context_length)

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
        """Attend each token to itself and the tokens before it.

        Args:
            x: input embeddings, ``(batch, num_tokens, d_in)`` (or unbatched
                ``(num_tokens, d_in)``), with ``num_tokens <= context_length``.
            return_weights: also return the attention weights. Default ``False``.

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_out)`` (``(num_tokens, d_out)``
            for unbatched input). With ``return_weights=True``, the pair
            ``(context_vec, attn_weights)``, ``attn_weights`` being
            ``(batch, num_tokens, num_tokens)`` (or ``(num_tokens, num_tokens)``):
            the weights actually applied to the values, after dropout.

        Raises:
            TypeError: ``x`` is not a floating-point tensor or its dtype
                differs from the module's parameters (a device mismatch is a
                ValueError), or
                ``return_weights`` is not a bool.
            ValueError: ``x`` is not 2- or 3-D, ``x.shape[-1] != d_in``, ``x``
                has no tokens, or ``num_tokens > context_length``.
        """
        check_input(x, self.d_in, (2, 3), self.context_length, like=self.W_query.weight)
        check_bool("return_weights", return_weights)
        num_tokens = x.shape[-2]
        keys = self.W_key(x)  # (..., num_tokens, d_out)
        queries = self.W_query(x)  # (..., num_tokens, d_out)
        values = self.W_value(x)  # (..., num_tokens, d_out)

        attn_scores = queries @ keys.transpose(-2, -1)  # (..., num_tokens, num_tokens)
        allowed = self.mask[:num_tokens, :num_tokens]  # (num_tokens, num_tokens), True = may attend
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))  # a new tensor
        d_k = keys.shape[-1]
        attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)  # rows sum to 1
        attn_weights = self.dropout(attn_weights)

        context_vec = attn_weights @ values  # (..., num_tokens, d_out)
        if return_weights:
            return context_vec, attn_weights
        return context_vec

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}"
