"""Attention as plain functions: softmax, weight-free attention, masks, and a
readable reference for scaled dot-product attention.

:func:`attention` is the one call every attention module makes after
splitting the heads: the readable :func:`scaled_dot_product_attention`,
torch's fused kernel or the tiled :func:`flash_attention` behind one
signature (``implementation``), with grouped key/value heads and sinks. The
modules build their masks here too (:func:`causal_mask`,
:func:`bottom_right_causal_mask`, :func:`sliding_window_mask`,
:func:`merge_key_padding_mask`).

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
import torch.nn.functional as F

from ._masks import bottom_right_causal_mask, causal_mask, sliding_window_mask
from ._validation import check_dim, check_float_tensor, check_sdpa_inputs, type_name
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
    "softmax_with_sinks",
    "merge_key_padding_mask",
    "ATTN_IMPLEMENTATIONS",
    "attention",
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
    check_float_tensor("x", x)
    dim = check_dim(x, dim)
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
    check_float_tensor("x", x)
    dim = check_dim(x, dim)
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
    check_float_tensor("x", x)
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
    check_sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale)
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


def softmax_with_sinks(attn_scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension with one extra, value-less logit per head.

    Args:
        attn_scores: ``(batch, num_heads, num_tokens, num_tokens_kv)``;
            masked entries ``-inf``.
        sinks: ``(num_heads,)``, each head's sink logit.

    Returns:
        ``attn_weights`` of ``attn_scores``' shape: ``exp(s) / (exp(sink) +
        sum exp(s))``, computed stably (the maximum of the row and the sink is
        subtracted first); each row sums to less than 1.

    Raises:
        TypeError: either is not a floating-point tensor.
        ValueError: ``attn_scores`` is not 4-D or ``sinks`` is not
            ``(num_heads,)``.

    Source: OpenAI (2025), "gpt-oss-120b & gpt-oss-20b Model Card", section
    2.1 (a learned bias in the softmax's denominator per head); Xiao et al.
    (2023), "Efficient Streaming Language Models with Attention Sinks",
    sections 3.1-3.3.
    """
    check_float_tensor("attn_scores", attn_scores, min_ndim=4)
    check_float_tensor("sinks", sinks)
    if attn_scores.ndim != 4 or sinks.shape != (attn_scores.shape[1],):
        raise ValueError(
            "attn_scores must be (batch, num_heads, num_tokens, num_tokens_kv) and sinks "
            f"(num_heads,), got {tuple(attn_scores.shape)} and {tuple(sinks.shape)}"
        )
    sink = sinks.to(attn_scores.dtype)[None, :, None, None]  # (1, num_heads, 1, 1)
    row_max = torch.maximum(attn_scores.amax(dim=-1, keepdim=True), sink)  # (b, h, n, 1)
    exp_scores = (attn_scores - row_max).exp()  # (b, h, n, n_kv); 0 where masked
    denominator = exp_scores.sum(dim=-1, keepdim=True) + (sink - row_max).exp()
    return exp_scores / denominator  # (b, h, n, n_kv)


def merge_key_padding_mask(
    attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """One attention mask from a ``(N_q, N_kv)`` mask and a per-sequence key-padding mask.

    Args:
        attn_mask: bool ``(num_tokens_q, num_tokens_kv)``, **True where a query
            may attend**, or None (every key allowed).
        key_padding_mask: bool ``(batch, num_tokens_kv)``, **True where a key is
            padding** (torch's meaning of the keyword, as in
            ``nn.MultiheadAttention``: the opposite polarity), or None.

    Returns:
        ``attn_mask`` itself without a ``key_padding_mask``; else a bool
        ``(batch, 1, num_tokens_q, num_tokens_kv)`` mask (``(batch, 1, 1,
        num_tokens_kv)`` without ``attn_mask``), True where a query may attend
        to a real key: it broadcasts over the heads.

    Raises:
        TypeError: a mask is neither None nor a bool tensor.
        ValueError: ``key_padding_mask`` is not 2-D, or the two disagree on
            ``num_tokens_kv``.

    Source: the ``key_padding_mask`` of :class:`torch.nn.MultiheadAttention`.
    """
    for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
            raise TypeError(f"{name} must be a bool tensor or None, got {type_name(mask)}"
                            + (f" of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else ""))
    if key_padding_mask is None:
        return attn_mask
    if key_padding_mask.ndim != 2 or (
        attn_mask is not None and attn_mask.shape[-1] != key_padding_mask.shape[-1]
    ):
        raise ValueError(
            "key_padding_mask must be (batch, num_tokens_kv) with attn_mask's num_tokens_kv, "
            f"got {tuple(key_padding_mask.shape)} and attn_mask "
            f"{None if attn_mask is None else tuple(attn_mask.shape)}"
        )
    keep = ~key_padding_mask[:, None, None, :]  # (batch, 1, 1, N_kv), True = real key
    return keep if attn_mask is None else keep & attn_mask  # (batch, 1, N_q, N_kv)


#: The implementations :func:`attention` can run: ``"readable"`` is
#: :func:`scaled_dot_product_attention` (it returns the weights), ``"sdpa"``
#: torch's fused :func:`torch.nn.functional.scaled_dot_product_attention`, and
#: ``"flash"`` the tiled :func:`attnlib.flash.flash_attention` (no mask but the
#: causal one, no dropout, no sinks).
ATTN_IMPLEMENTATIONS = ("readable", "sdpa", "flash")

#: torch >= 2.5 lets scaled_dot_product_attention share key/value heads itself.
_SDPA_HAS_ENABLE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


def attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    sinks: torch.Tensor | None = None,
    implementation: str = "sdpa",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention of split heads, by the implementation asked for.

    The one call every attnlib attention module makes after projecting and
    splitting the heads (Hugging Face's "attention interface", nanoGPT's
    ``self.flash`` branch): the same arguments reach the readable
    :func:`scaled_dot_product_attention`, torch's fused kernel or the tiled
    :func:`attnlib.flash.flash_attention`. Fewer key/value heads than query
    heads (grouped-query attention) are shared: key/value head ``j`` serves
    query heads ``j * r ... j * r + r - 1``, ``r = num_heads // num_kv_groups``
    (``repeat_interleave``, or torch's ``enable_gqa=True``).

    Args:
        queries: ``(batch, num_heads, num_tokens_q, head_dim)``.
        keys: ``(batch, num_kv_groups, num_tokens_kv, head_dim)``,
            ``num_kv_groups`` dividing ``num_heads``.
        values: ``(batch, num_kv_groups, num_tokens_kv, head_dim_v)``.
        attn_mask: bool, **True where a query may attend**, broadcastable to
            ``(batch, num_heads, num_tokens_q, num_tokens_kv)``, or None.
        is_causal: keyword-only; the causal mask aligned at the top-left
            (queries and keys from position 0). Default False.
        scale: keyword-only; default ``1 / sqrt(head_dim)``.
        dropout_p: keyword-only; dropout on the weights (pass 0 in evaluation
            mode). Default 0.
        sinks: keyword-only; ``(num_heads,)`` sink logits that join each head's
            softmax denominator (:mod:`attnlib.sinks`), or None.
        implementation: keyword-only; one of :data:`ATTN_IMPLEMENTATIONS`.
            Default ``"sdpa"``.

    Returns:
        ``(context_vec, attn_weights)``: ``context_vec`` ``(batch, num_heads,
        num_tokens_q, head_dim_v)``; ``attn_weights`` ``(batch, num_heads,
        num_tokens_q, num_tokens_kv)`` after dropout with ``"readable"``, None
        otherwise (the fused and tiled kernels never hold them). A query row
        with no allowed key gives zeros.

    Raises:
        TypeError: a tensor is not a floating-point tensor.
        ValueError: ``implementation`` is unknown; the tensors are not 4-D or
            ``num_heads`` is not divisible by ``num_kv_groups``;
            ``"flash"`` with an ``attn_mask``, dropout or sinks. Otherwise as
            the implementation raises (:func:`scaled_dot_product_attention`).

    Source: Vaswani et al. (2017), eq. (1); Ainslie et al. (2023), "GQA",
    section 2.2 (shared key/value heads); Dao et al. (2022) (the tiled path).
    """
    if implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {ATTN_IMPLEMENTATIONS}, got {implementation!r}"
        )
    group_size = _group_size(queries, keys, values)
    if implementation == "readable":
        keys = keys.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
        values = values.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, hd_v)
        if sinks is None:
            return scaled_dot_product_attention(
                queries, keys, values, attn_mask, dropout_p, is_causal, scale,
                return_weights=True,
            )
        return _readable_with_sinks(queries, keys, values, sinks, attn_mask, is_causal, scale,
                                    dropout_p)
    if implementation == "flash":
        if attn_mask is not None or dropout_p > 0.0 or sinks is not None:
            raise ValueError(
                "implementation='flash' takes no attn_mask (only is_causal), no dropout and "
                "no sinks; use 'sdpa' or 'readable' for those (or with a KV cache)"
            )
        keys = keys.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
        values = values.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, hd_v)
        return flash_attention(queries, keys, values, is_causal, scale), None
    if sinks is not None:  # gpt-oss: each head's sink logit joins its denominator
        return _sdpa_with_sinks(queries, keys, values, sinks, attn_mask, is_causal, scale,
                                dropout_p), None
    out = _sdpa(queries, keys, values, attn_mask, is_causal, scale, dropout_p)
    if attn_mask is not None and attn_mask.ndim == 4 and attn_mask.dtype == torch.bool:
        # Rows with no key at all (padding): zeros, as the readable path gives
        # (torch's CPU kernel does too; other backends may give NaN).
        out = out.masked_fill(~attn_mask.any(dim=-1, keepdim=True), 0.0)
    return out, None


def _group_size(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> int:
    """Query heads per key/value head, checked."""
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_float_tensor(name, t, min_ndim=4)
        if t.ndim != 4:
            raise ValueError(
                f"{name} must be (batch, heads, num_tokens, head_dim), got {tuple(t.shape)}"
            )
    num_heads, num_kv_groups = queries.shape[1], keys.shape[1]
    if num_kv_groups == 0 or num_heads % num_kv_groups != 0 or values.shape[1] != num_kv_groups:
        raise ValueError(
            f"num_heads={num_heads} is not divisible by num_kv_groups={num_kv_groups} (the "
            f"heads of keys), or values have {values.shape[1]} heads, not {num_kv_groups}"
        )
    return num_heads // num_kv_groups


def _sdpa(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    dropout_p: float,
) -> torch.Tensor:
    """torch's fused kernel, sharing key/value heads (``enable_gqa`` from torch 2.5)."""
    grouped = {}  # the same number of heads: the call of plain multi-head attention
    if keys.shape[1] != queries.shape[1] and _SDPA_HAS_ENABLE_GQA:
        grouped = {"enable_gqa": True}
    elif keys.shape[1] != queries.shape[1]:  # older torch: one copy per query head
        group_size = queries.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
        values = values.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, hd_v)
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **grouped,
    )


def _readable_with_sinks(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    sinks: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable path with a sink logit per head: :func:`softmax_with_sinks` of the
    scaled, masked scores (rows sum to less than 1), then dropout; keys and values
    already have ``num_heads`` heads."""
    check_sdpa_inputs(queries, keys, values, attn_mask, dropout_p, is_causal, scale)
    if scale is None:
        scale = queries.shape[-1] ** -0.5
    attn_scores = (queries @ keys.transpose(-2, -1)) * scale  # (b, num_heads, N_q, N_kv)
    if is_causal:
        attn_mask = causal_mask(*attn_scores.shape[-2:], device=queries.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_scores = attn_scores.masked_fill(~attn_mask, float("-inf"))
        else:
            attn_scores = attn_scores + attn_mask
    attn_weights = softmax_with_sinks(attn_scores, sinks)  # (b, num_heads, N_q, N_kv)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, dropout_p)
    return attn_weights @ values, attn_weights  # (b, num_heads, N_q, head_dim_v), weights


def _sdpa_with_sinks(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    sinks: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    dropout_p: float,
) -> torch.Tensor:
    """torch's fused kernel with a sink logit per head.

    The sink is one extra key whose score is the head's logit and whose value
    is zero: a zero key (score ``q . 0 = 0``) plus an additive float mask equal
    to ``sink`` in its column. So the kernel computes ``exp(s) / (exp(sink) +
    sum exp(s))`` and the sink adds nothing to the output; gradients reach
    ``sinks`` through the float mask. A row whose keys are all masked gives
    zeros (only the sink is left).
    """
    b, num_heads, num_tokens, head_dim = queries.shape
    num_tokens_kv = keys.shape[-2]
    if is_causal:  # from position 0: the top-left causal rows
        attn_mask = causal_mask(num_tokens, num_tokens_kv, device=queries.device)
    if attn_mask is None:
        attn_mask = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool,
                               device=queries.device)
    # attn_mask: (N_q, N_kv) or (b, 1, N_q, N_kv), True = may attend
    bias = torch.zeros(attn_mask.shape, dtype=queries.dtype, device=queries.device)
    bias = bias.masked_fill(~attn_mask, float("-inf")).view(
        -1, 1, num_tokens, num_tokens_kv
    )  # (1 or b, 1, N_q, N_kv): 0 where a query may attend, -inf elsewhere
    sink = sinks.to(queries.dtype)[None, :, None, None]  # (1, num_heads, 1, 1)
    bias = torch.cat(
        [bias.expand(-1, num_heads, -1, -1), sink.expand(bias.shape[0], -1, num_tokens, 1)],
        dim=-1,
    )  # (1 or b, num_heads, N_q, N_kv + 1): the sink is the last column
    zero = keys.new_zeros(b, keys.shape[1], 1, head_dim)  # (b, num_kv_groups, 1, head_dim)
    keys = torch.cat([keys, zero], dim=2)  # (b, num_kv_groups, N_kv + 1, head_dim)
    values = torch.cat([values, zero.new_zeros(b, values.shape[1], 1, values.shape[-1])],
                       dim=2)  # (b, num_kv_groups, N_kv + 1, head_dim_v)
    return _sdpa(queries, keys, values, bias, False, scale, dropout_p)
