"""DeepSeek Sparse Attention (DSA): each query attends only to its top-k keys.

DeepSeek-V3.2 keeps MLA's cache but stops every query from reading all of it.
A *lightning indexer*, a few small heads with ReLU in place of softmax, scores
every cached token for every query cheaply:

.. code-block:: text

    I[t, s] = sum_j  w[t, j] * ReLU(q_idx[t, j] . k_idx[s])

and the query then attends, with ordinary softmax attention, to the
``top_k`` tokens of highest ``I[t, s]`` among those it may see (causal). The
result is exactly full attention with every other key masked out; the
saving is that only ``top_k`` keys and values are gathered and multiplied,
so the attention costs ``O(N * top_k)`` instead of ``O(N^2)`` (the indexer is
still ``O(N^2)``, but with a few tiny ReLU heads).

Shape legend: ``batch``, ``num_heads``, ``num_tokens`` (queries),
``num_tokens_kv`` (keys: cached + new), ``head_dim``, ``head_dim_v``;
``num_index_heads`` and ``index_head_dim`` for the indexer.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validation import (
    check_bool,
    check_float_tensor,
    check_input,
    check_int,
    check_positive_int,
)

__all__ = ["LightningIndexer", "top_k_mask", "sparse_attention"]


class LightningIndexer(nn.Module):
    r"""The lightning indexer of DeepSeek Sparse Attention.

    ``I[t, s] = sum_j w[t, j] ReLU(q_idx[t, j] . k_idx[s])`` with
    ``num_index_heads`` query heads ``q_idx``, one key ``k_idx`` per token
    (shared by the heads, as in multi-query attention) and per-query head
    weights ``w``, all linear in the input.

    Args:
        d_in: size of the input embeddings.
        num_index_heads: indexer heads.
        index_head_dim: size of an indexer query and key.

    Attributes:
        W_query: ``nn.Linear(d_in, num_index_heads * index_head_dim, bias=False)``.
        W_key: ``nn.Linear(d_in, index_head_dim, bias=False)``.
        W_weights: ``nn.Linear(d_in, num_index_heads, bias=False)``.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size is not positive.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp: Boosting Long-Context
    Efficiency with DeepSeek Sparse Attention", section 2.1, eq. (1).
    """

    def __init__(self, d_in: int, num_index_heads: int, index_head_dim: int) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("num_index_heads", num_index_heads)
        check_positive_int("index_head_dim", index_head_dim)
        super().__init__()
        self.d_in, self.num_index_heads = int(d_in), int(num_index_heads)
        self.index_head_dim = int(index_head_dim)
        self.W_query = nn.Linear(d_in, self.num_index_heads * self.index_head_dim, bias=False)
        self.W_key = nn.Linear(d_in, self.index_head_dim, bias=False)
        self.W_weights = nn.Linear(d_in, self.num_index_heads, bias=False)

    def forward(self, x_query: torch.Tensor, x_key: torch.Tensor) -> torch.Tensor:
        """Index scores of the tokens ``x_key`` for the queries ``x_query``.

        Args:
            x_query: ``(batch, num_tokens, d_in)``, the tokens that query.
            x_key: ``(batch, num_tokens_kv, d_in)``, the tokens scored (with a
                cache, the indexer keys would be cached instead).

        Returns:
            ``index_scores``: ``(batch, num_tokens, num_tokens_kv)`` (no mask).

        Raises:
            TypeError, ValueError: as ``attnlib._validation.check_input``
                for either input.
        """
        check_input(x_query, self.d_in, (3,), like=self.W_query.weight)
        check_input(x_key, self.d_in, (3,), like=self.W_query.weight)
        b, n, _ = x_query.shape
        index_queries = self.W_query(x_query).view(
            b, n, self.num_index_heads, self.index_head_dim
        )  # (b, num_tokens, num_index_heads, index_head_dim)
        index_keys = self.W_key(x_key)  # (b, num_tokens_kv, index_head_dim)
        per_head = F.relu(torch.einsum("bnjd,bsd->bnjs", index_queries, index_keys))
        # per_head: (b, num_tokens, num_index_heads, num_tokens_kv)
        weights = self.W_weights(x_query)  # (b, num_tokens, num_index_heads)
        return torch.einsum("bnj,bnjs->bns", weights, per_head)  # (b, n, num_tokens_kv)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, num_index_heads={self.num_index_heads}, "
            f"index_head_dim={self.index_head_dim}"
        )


def _causal(num_tokens: int, num_tokens_kv: int, device: torch.device) -> torch.Tensor:
    """True where query ``t`` (at position ``num_tokens_kv - num_tokens + t``) may see key ``s``."""
    return torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool, device=device).tril(
        num_tokens_kv - num_tokens
    )


def top_k_mask(index_scores: torch.Tensor, top_k: int, *, causal: bool = True) -> torch.Tensor:
    """The keys each query keeps: its ``top_k`` highest index scores among those it may see.

    Args:
        index_scores: ``(batch, num_tokens, num_tokens_kv)``, e.g. from
            :class:`LightningIndexer`; the queries are the last ``num_tokens``
            positions.
        top_k: keys kept per query (all of them where a query sees fewer).
        causal: keyword-only; only keys at or before the query's position
            may be kept. Default ``True``.

    Returns:
        bool ``(batch, num_tokens, num_tokens_kv)``, **True where the query may
        attend** (the mask convention of ``scaled_dot_product_attention``);
        ``min(top_k, visible keys)`` True per row.

    Raises:
        TypeError: ``index_scores`` is not a floating-point tensor, ``top_k``
            not an int or ``causal`` not a bool.
        ValueError: ``index_scores`` is not 3-D or ``top_k`` is not positive.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 2.1, eq. (2)
    (the top-k selection of key-value entries).
    """
    check_float_tensor("index_scores", index_scores, min_ndim=3)
    if index_scores.ndim != 3:
        raise ValueError(
            "index_scores must be (batch, num_tokens, num_tokens_kv), got shape "
            f"{tuple(index_scores.shape)}"
        )
    top_k = check_positive_int("top_k", top_k)
    check_bool("causal", causal)
    _, n, n_kv = index_scores.shape
    visible = (
        _causal(n, n_kv, index_scores.device)
        if causal
        else torch.ones(n, n_kv, dtype=torch.bool, device=index_scores.device)
    )
    scores = index_scores.masked_fill(~visible, float("-inf"))  # (b, n, n_kv)
    k = min(top_k, n_kv)
    chosen = scores.topk(k, dim=-1).indices  # (b, n, k)
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, chosen, True)
    return mask & visible  # a row that sees fewer than k keys keeps only those


def sparse_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    index_scores: torch.Tensor,
    top_k: int,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of each query to its ``top_k`` keys only, by gathering them.

    The keys chosen by :func:`top_k_mask` are gathered into a
    ``(..., num_tokens, top_k, head_dim)`` tensor per query, so the scores
    and the weighted sum cost ``top_k`` per query, not ``num_tokens_kv``.
    The result equals full attention with the complementary keys masked.

    Args:
        queries: ``(batch, num_heads, num_tokens, head_dim)``, the last
            ``num_tokens`` positions.
        keys: ``(batch, num_heads, num_tokens_kv, head_dim)``.
        values: ``(batch, num_heads, num_tokens_kv, head_dim_v)``.
        index_scores: ``(batch, num_tokens, num_tokens_kv)``, shared by the heads.
        top_k: keys per query.
        scale: keyword-only; the scores' factor. Default ``1 / sqrt(head_dim)``.

    Returns:
        ``context_vec``: ``(batch, num_heads, num_tokens, head_dim_v)``.

    Raises:
        TypeError: a tensor is not floating point, ``top_k`` is not an int.
        ValueError: the shapes do not fit together or ``top_k`` is not positive.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 2.1, eq. (2).
    """
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_float_tensor(name, t, min_ndim=4)
    b, h, n, d = queries.shape
    n_kv = keys.shape[2]
    if keys.shape != (b, h, n_kv, d) or values.shape[:3] != (b, h, n_kv):
        raise ValueError(
            "queries, keys and values must be (batch, num_heads, num_tokens(_kv), head_dim), "
            f"got {tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if n > n_kv:
        raise ValueError(f"num_tokens={n} queries but only num_tokens_kv={n_kv} keys")
    if tuple(index_scores.shape) != (b, n, n_kv):
        raise ValueError(
            f"index_scores must have shape {(b, n, n_kv)}, got {tuple(index_scores.shape)}"
        )
    top_k = check_int("top_k", top_k, minimum=1)
    mask = top_k_mask(index_scores, top_k)  # (b, n, n_kv), True = kept
    k = min(top_k, n_kv)
    # Indices of the kept keys (kept ones first); a row with fewer keeps pads with
    # masked entries that get weight zero.
    chosen = mask.to(torch.int8).topk(k, dim=-1)  # (b, n, k)
    index, valid = chosen.indices, chosen.values.bool()  # (b, n, k) each
    gather = index[:, None, :, :, None]  # (b, 1, n, k, 1)
    picked_keys = keys[:, :, None].expand(b, h, n, n_kv, d).gather(
        3, gather.expand(b, h, n, k, d)
    )  # (b, h, n, k, d)
    dv = values.shape[-1]
    picked_values = values[:, :, None].expand(b, h, n, n_kv, dv).gather(
        3, gather.expand(b, h, n, k, dv)
    )  # (b, h, n, k, dv)
    if scale is None:
        scale = d**-0.5
    attn_scores = (picked_keys @ queries[..., None]).squeeze(-1) * scale  # (b, h, n, k)
    attn_scores = attn_scores.masked_fill(~valid[:, None], float("-inf"))
    attn_weights = attn_scores.softmax(dim=-1)  # (b, h, n, k)
    return (attn_weights[..., None, :] @ picked_values).squeeze(-2)  # (b, h, n, dv)
