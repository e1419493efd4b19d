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

Both are written so that a multi-head ``forward`` needs one line each:

.. code-block:: python

    queries, keys = self.qk_norm(queries, keys)           # QKNorm, before RoPE
    context_vec = self.sinks(queries, keys, values, attn_mask=allowed)  # AttentionSinks

Shape legend: ``(batch, num_heads, num_tokens, head_dim)`` for queries,
``(batch, num_kv_groups, num_tokens_kv, head_dim)`` for keys and values
(``num_kv_groups`` divides ``num_heads``; consecutive query heads share).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._validation import check_float_tensor, check_positive_int
from .functional import attention, softmax_with_sinks

__all__ = ["softmax_with_sinks", "sink_attention", "AttentionSinks", "QKNorm"]


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
