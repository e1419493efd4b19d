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

from ._validation import check_float_tensor, check_positive_int, check_sdpa_inputs

__all__ = ["softmax_with_sinks", "sink_attention", "AttentionSinks", "QKNorm"]


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
    if isinstance(keys, torch.Tensor) and isinstance(queries, torch.Tensor) and (
        keys.ndim == queries.ndim == 4 and keys.shape[1] != queries.shape[1]
    ):
        if queries.shape[1] % keys.shape[1] != 0:
            raise ValueError(
                f"num_heads={queries.shape[1]} is not divisible by "
                f"num_kv_groups={keys.shape[1]}"
            )
        group_size = queries.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
        values = values.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, hd_v)
    check_sdpa_inputs(queries, keys, values, attn_mask, 0.0, is_causal, scale)
    if scale is None:
        scale = queries.shape[-1] ** -0.5
    attn_scores = (queries @ keys.transpose(-2, -1)) * scale  # (b, h, n, n_kv)
    if is_causal:
        n, n_kv = attn_scores.shape[-2:]
        attn_mask = torch.ones(n, n_kv, dtype=torch.bool, device=queries.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_scores = attn_scores.masked_fill(~attn_mask, float("-inf"))
        else:
            attn_scores = attn_scores + attn_mask
    attn_weights = softmax_with_sinks(attn_scores, sinks)  # (b, h, n, n_kv)
    return attn_weights @ values  # (b, h, n, head_dim_v)


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
