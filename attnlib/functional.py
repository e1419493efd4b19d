"""Attention as plain functions: softmax, weight-free attention, masks, and a
readable reference for scaled dot-product attention.

Shape legend used in every docstring here:

* ``num_tokens`` (``N``): tokens in the sequence; ``num_tokens_q`` and
  ``num_tokens_kv`` when queries and keys/values may differ in length.
* ``d_in``: size of each input embedding.
* ``d_k``: size of each query and key vector; ``d_v``: size of each value vector.
* ``...``: any number of leading (batch, head) dimensions.

Mask convention, the same everywhere in attnlib: a **bool mask is True where a
query may attend** to a key, as in :func:`torch.nn.functional.scaled_dot_product_attention`.
``torch.nn.MultiheadAttention`` uses the opposite polarity (True = masked out).
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch

from ._validation import check_dim as _check_dim
from ._validation import check_float_tensor as _check_float_tensor
from ._validation import check_int
from ._validation import check_sdpa_inputs as _check_sdpa_inputs
from .flash import flash_attention  # the tiled FlashAttention forward (chapter 8)

__all__ = [
    "softmax_naive",
    "softmax",
    "simplified_attention",
    "causal_mask",
    "bottom_right_causal_mask",
    "sliding_window_mask",
    "scaled_dot_product_attention",
    "flash_attention",
]


def softmax_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax written straight from its definition: ``exp(x) / sum(exp(x))``.

    It is correct for small inputs and exists to show why nobody computes
    softmax this way: ``exp`` overflows float32 for inputs above about 88.7,
    giving ``inf / inf = nan``. Use :func:`softmax` instead.

    Args:
        x: floating-point tensor of any shape ``(...)``.
        dim: the dimension whose entries are normalised to sum to 1.

    Returns:
        A tensor of the shape and dtype of ``x`` (empty if ``x`` is empty
        along ``dim``, as with :func:`torch.softmax`).

    Raises:
        TypeError: ``x`` is not a floating-point tensor, or ``dim`` is not an int.
        ValueError: ``dim`` is out of range for ``x``.

    Source: the softmax function, e.g. Goodfellow, Bengio and Courville (2016),
    *Deep Learning*, eq. (6.29).
    """
    _check_float_tensor("x", x)
    dim = _check_dim(x, dim)
    if x.shape[dim] == 0:
        return torch.empty_like(x)  # nothing to normalise, as torch.softmax
    exp_x = torch.exp(x)
    return exp_x / exp_x.sum(dim=dim, keepdim=True)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax: subtract the maximum before exponentiating.

    ``softmax(x) = softmax(x - c)`` for any constant ``c``; with ``c = max(x)``
    the largest exponent is ``exp(0) = 1``, so nothing overflows. The result
    equals :func:`torch.softmax` (to floating-point rounding), including
    ``nan`` for a slice that is entirely ``-inf``.

    Args:
        x: floating-point tensor of any shape ``(...)``.
        dim: the dimension whose entries are normalised to sum to 1.

    Returns:
        A tensor of the shape and dtype of ``x`` (empty if ``x`` is empty
        along ``dim``, as with :func:`torch.softmax`).

    Raises:
        TypeError: ``x`` is not a floating-point tensor, or ``dim`` is not an int.
        ValueError: ``dim`` is out of range for ``x``.

    Source: Goodfellow, Bengio and Courville (2016), *Deep Learning*, section 4.1.
    """
    _check_float_tensor("x", x)
    dim = _check_dim(x, dim)
    if x.shape[dim] == 0:
        return torch.empty_like(x)  # nothing to normalise, as torch.softmax
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp_x = torch.exp(shifted)
    return exp_x / exp_x.sum(dim=dim, keepdim=True)


def simplified_attention(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention with no trainable weights: every token is its own query,
    key and value.

    ``attn_scores = x @ x^T`` (``w_ij = x_i . x_j``), ``attn_weights`` is the
    row-wise softmax of the scores, and each context vector is the weighted sum
    ``y_i = sum_j attn_weights[i, j] * x_j``. There is no ``1/sqrt(d)`` scale.

    Args:
        x: input embeddings, ``(num_tokens, d_in)`` or ``(batch, num_tokens, d_in)``.

    Returns:
        ``(context_vec, attn_weights)``: ``context_vec`` has the shape of
        ``x``; ``attn_weights`` is ``(num_tokens, num_tokens)`` or
        ``(batch, num_tokens, num_tokens)``, each row summing to 1.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``x`` is not 2- or 3-dimensional, or has no tokens.

    Source: the dot-product weighting of Vaswani et al. (2017), "Attention Is
    All You Need", section 3.2.1, with the projections taken to be the identity.
    """
    _check_float_tensor("x", x)
    if x.ndim not in (2, 3):
        raise ValueError(
            "x must be (num_tokens, d_in) or (batch, num_tokens, d_in), "
            f"got shape {tuple(x.shape)}"
        )
    if x.shape[-2] == 0:
        raise ValueError(f"x must hold at least one token, got shape {tuple(x.shape)}")
    attn_scores = x @ x.transpose(-2, -1)  # (..., num_tokens, num_tokens)
    attn_weights = torch.softmax(attn_scores, dim=-1)  # rows sum to 1
    context_vec = attn_weights @ x  # (..., num_tokens, d_in)
    return context_vec, attn_weights


def causal_mask(
    num_tokens: int,
    num_tokens_kv: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Bool mask that lets each token attend to itself and earlier tokens only.

    Args:
        num_tokens: number of query positions (rows).
        num_tokens_kv: number of key positions (columns); defaults to ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``j <= i``. This is the lower triangle
        aligned at the top-left corner, the same mask that
        ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``
        uses. (``torch.nn.MultiheadAttention`` wants the opposite polarity:
        pass ``~causal_mask(n)`` there.)

    Raises:
        TypeError: a size is not an integer (Python or NumPy; bools are refused).
        ValueError: a size is negative.

    Source: the decoder masking of Vaswani et al. (2017), section 3.2.3.
    """
    if num_tokens_kv is None:
        num_tokens_kv = num_tokens
    num_tokens = check_int("num_tokens", num_tokens, minimum=0)
    num_tokens_kv = check_int("num_tokens_kv", num_tokens_kv, minimum=0)
    ones = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool, device=device)
    return torch.tril(ones)


def bottom_right_causal_mask(
    num_tokens: int,
    num_tokens_kv: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask for the *last* ``num_tokens`` positions of ``num_tokens_kv`` keys.

    With a KV cache, ``num_tokens`` new queries follow ``num_tokens_kv - num_tokens``
    cached tokens, so query ``i`` sits at position ``num_tokens_kv - num_tokens + i``
    and may attend to keys ``0 ... num_tokens_kv - num_tokens + i``: the lower
    triangle aligned at the **bottom-right** corner. :func:`causal_mask` with
    two sizes aligns it at the top-left instead (query ``i`` sees keys
    ``0 ... i``), which is right only when both sizes are equal.

    Args:
        num_tokens: number of (new) query positions (rows).
        num_tokens_kv: number of key positions (columns), cached and new;
            at least ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``j <= num_tokens_kv - num_tokens + i``.

    Raises:
        TypeError: a size is not an integer (Python or NumPy; bools are refused).
        ValueError: a size is negative, or ``num_tokens > num_tokens_kv``.

    Source: incremental decoding of a causal decoder (Vaswani et al. 2017,
    section 3.2.3, masking; Shazeer 2019, section 2.4); PyTorch calls this
    alignment ``torch.nn.attention.bias.causal_lower_right``.
    """
    num_tokens = check_int("num_tokens", num_tokens, minimum=0)
    num_tokens_kv = check_int("num_tokens_kv", num_tokens_kv, minimum=0)
    if num_tokens > num_tokens_kv:
        raise ValueError(
            f"num_tokens={num_tokens} new queries cannot be the last positions of "
            f"num_tokens_kv={num_tokens_kv} keys: expected num_tokens <= num_tokens_kv"
        )
    ones = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=num_tokens_kv - num_tokens)


def sliding_window_mask(
    num_tokens: int,
    window: int,
    *,
    num_tokens_kv: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Banded causal mask: each token attends to itself and the ``window - 1`` before it.

    Token ``i`` may attend to keys ``j`` with ``i - window < j <= i``: at most
    ``window`` keys, the most recent ones. Stacked layers still pass
    information further back (``L`` layers reach ``L * (window - 1)``
    tokens back), and a KV cache needs to keep only the last ``window`` keys and
    values. ``window >= num_tokens`` gives :func:`causal_mask`.

    Args:
        num_tokens: number of query positions (rows).
        window: how many keys each query may see, itself included; ``>= 1``.
        num_tokens_kv: keyword-only; number of key positions (columns) when the
            queries are the *last* ``num_tokens`` of them (a KV cache: aligned
            bottom-right as in :func:`bottom_right_causal_mask`). Defaults to
            ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``0 <= p_i - j < window`` with
        ``p_i = num_tokens_kv - num_tokens + i`` the query's position.

    Raises:
        TypeError: a size or ``window`` is not an integer (bools are refused).
        ValueError: a size is negative, ``window < 1``, or
            ``num_tokens > num_tokens_kv``.

    Source: Beltagy, Peters and Cohan (2020), "Longformer: The Long-Document
    Transformer", section 3.1 (sliding window); used causally by Mistral 7B
    (Jiang et al. 2023, window 4096).
    """
    window = check_int("window", window, minimum=1)
    if num_tokens_kv is None:
        num_tokens_kv = num_tokens
    causal = bottom_right_causal_mask(num_tokens, num_tokens_kv, device=device)
    offset = causal.shape[1] - causal.shape[0]  # position of query 0
    too_old = torch.tril(torch.ones_like(causal), diagonal=offset - window)  # p_i - j >= window
    return causal & ~too_old


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    *,
    return_weights: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    *,
    return_weights: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    scale: float | None = ...,
    *,
    return_weights: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(query @ key^T * scale + mask) @ value``, computed the readable way.

    A reference implementation with the semantics of
    :func:`torch.nn.functional.scaled_dot_product_attention`: it materialises
    the ``(num_tokens_q, num_tokens_kv)`` weight matrix so that it can be
    inspected and plotted. Use the torch function when speed matters.

    Args:
        query: ``(..., num_tokens_q, d_k)``.
        key: ``(..., num_tokens_kv, d_k)``.
        value: ``(..., num_tokens_kv, d_v)``. The leading dimensions ``...`` of
            query, key and value must be equal (torch also broadcasts them;
            this reference does not).
        attn_mask: ``None``; a bool tensor, **True where a query may attend**;
            or a float tensor of the query's dtype that is added to the scores.
            Must broadcast to ``(..., num_tokens_q, num_tokens_kv)``.
        dropout_p: probability of zeroing each attention weight. Default 0.
        is_causal: apply :func:`causal_mask` (query ``i`` sees keys ``j <= i``).
        scale: multiplier of the scores; default ``1 / sqrt(d_k)``.
        return_weights: also return the attention weights.

    Returns:
        ``context_vec`` ``(..., num_tokens_q, d_v)``; with ``return_weights``,
        the pair ``(context_vec, attn_weights)`` where ``attn_weights`` is
        ``(..., num_tokens_q, num_tokens_kv)``, the weights actually applied
        to ``value`` (after dropout). A query row that the mask hides from
        every key gets all-zero weights and a zero context vector, as in torch.

    Warning:
        Like the torch function, dropout is applied whenever ``dropout_p > 0``:
        this function does not know about training and evaluation mode. A
        module should pass ``dropout_p=0.0`` in evaluation mode. Kept weights
        are scaled by ``1 / (1 - dropout_p)``.

    Raises:
        TypeError: an argument has the wrong type, the tensors' dtypes differ,
            or a float mask's dtype differs from the query's.
        ValueError: query and key disagree on ``d_k``; key and value disagree on
            ``num_tokens_kv``; the leading dimensions differ; the mask does not
            broadcast to the scores' shape; both ``attn_mask`` and
            ``is_causal=True`` are given; ``dropout_p`` is outside ``[0, 1)``;
            ``scale`` is not finite.

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1);
    masking as in section 3.2.3; dropout on the weights as in PyTorch.
    """
    _check_sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale)
    num_tokens_q, num_tokens_kv = query.shape[-2], key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])

    attn_scores = (query @ key.transpose(-2, -1)) * scale  # (..., num_tokens_q, num_tokens_kv)

    allowed = None  # bool mask, True = may attend
    if is_causal:
        allowed = causal_mask(num_tokens_q, num_tokens_kv, device=query.device)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask
    elif attn_mask is not None:
        attn_scores = attn_scores + attn_mask  # float mask: added to the scores
    if allowed is not None:
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))

    # A query row that no key may be attended from is all -inf (bool mask,
    # causal mask with more queries than keys, or a float mask of -inf), and
    # softmax would give nan there. torch returns zeros for such rows; so do we
    # (with no keys at all, every row is such a row). Filling the row's scores
    # with 0 first keeps nan out of the gradient too.
    dead_rows = (attn_scores == float("-inf")).all(dim=-1, keepdim=True)  # (..., N_q, 1)
    attn_scores = attn_scores.masked_fill(dead_rows, 0.0)
    attn_weights = torch.softmax(attn_scores, dim=-1).masked_fill(dead_rows, 0.0)
    if dropout_p > 0.0:
        attn_weights = torch.dropout(attn_weights, dropout_p, train=True)

    context_vec = attn_weights @ value  # (..., num_tokens_q, d_v)
    if return_weights:
        return context_vec, attn_weights
    return context_vec
