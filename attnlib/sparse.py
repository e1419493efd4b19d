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

from collections.abc import Mapping

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
from .functional import bottom_right_causal_mask
from .positional import RotaryPositionalEmbedding

__all__ = ["LightningIndexer", "top_k_mask", "sparse_attention"]


class LightningIndexer(nn.Module):
    r"""The lightning indexer of DeepSeek Sparse Attention, as DeepSeek-V3.2 defines it.

    For a query token ``t`` (at position ``p_t``) and a key token ``s`` (at
    ``p_s``), with ``H = num_index_heads`` and ``D = index_head_dim``:

    .. code-block:: text

        q[t, j] = RoPE_r(W_query(c_q[t])[j], p_t)     # head j; c_q: the latent query
        k[s]    = RoPE_r(LayerNorm(W_key(x[s])), p_s)  # one key per token, shared
        w[t]    = W_weights(x[t]) / sqrt(H)            # one weight per head
        I[t, s] = sum_j  w[t, j] * ReLU(q[t, j] . k[s] / sqrt(D))

    ``RoPE_r`` rotates only the *first* ``rope_head_dim`` components of a query
    or key (attnlib's half-split layout, which is also the indexer's layout in
    DeepSeek's code and in transformers, unlike MLA's interleaved one) and
    leaves the other ``D - rope_head_dim`` as they are. The queries come from
    the attention's latent query ``c_q = RMSNorm(x W_query_down)``
    (``q_lora_rank`` numbers, :class:`attnlib.MultiHeadLatentAttention`'s
    ``query_norm(W_query_down(x))``), the keys and the head weights from the
    token ``x`` itself; with ``q_lora_rank=None`` the queries come from ``x``
    too. The scales ``1 / sqrt(D)`` and ``1 / sqrt(H)`` are those of
    DeepSeek's inference code; being positive, they change no top-k choice.

    The indexer is itself quadratic: every query scores every earlier key, at
    ``H * D`` multiply-adds per (query, key) pair (DeepSeek-V3.2: 64 * 128,
    in FP8), against ``num_heads * (qk_head_dim + v_head_dim)`` for the
    dense attention it lets the model skip once keys and values are
    up-projected, as in prefill (128 * (192 + 128) in DeepSeek-V3), and
    139,264 multiply-adds per pair in MLA's absorbed form, as it decodes
    (:func:`attnlib.experiments.decode_cost`).

    Args:
        d_in: size of the input tokens ``x``.
        context_length: the most positions (RoPE's table).
        num_index_heads: indexer heads ``H``.
        index_head_dim: size ``D`` of an indexer query and key.
        rope_head_dim: keyword-only; the leading components rotated by RoPE
            (even, at most ``index_head_dim``; DeepSeek-V3.2 uses MLA's
            ``qk_rope_head_dim``, 64 of 128).
        q_lora_rank: keyword-only; size of the latent query ``c_q``, or None
            (default) for queries from ``x``.
        rope_base: keyword-only; RoPE's base. Default 10000.
        rope_scaling: keyword-only; RoPE's ``scaling`` (a dict, as
            :class:`attnlib.RotaryPositionalEmbedding` takes it, e.g. YaRN).
            Default None.
        eps: keyword-only; the key LayerNorm's epsilon. Default 1e-6.

    Attributes:
        W_query: ``nn.Linear(q_lora_rank or d_in, num_index_heads *
            index_head_dim, bias=False)`` (transformers' ``wq_b``).
        W_key: ``nn.Linear(d_in, index_head_dim, bias=False)`` (``wk``).
        key_norm: ``nn.LayerNorm(index_head_dim, eps)`` (``k_norm``), with
            gain and bias.
        W_weights: ``nn.Linear(d_in, num_index_heads, bias=False)``
            (``weights_proj``).
        rope: the :class:`attnlib.RotaryPositionalEmbedding` of the first
            ``rope_head_dim`` components.

    Raises:
        TypeError: a size is not an int (``q_lora_rank`` may be None).
        ValueError: a size is not positive, or ``rope_head_dim`` is odd or
            larger than ``index_head_dim``; as
            :class:`attnlib.RotaryPositionalEmbedding` for ``rope_base`` and
            ``rope_scaling``.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp: Boosting Long-Context
    Efficiency with DeepSeek Sparse Attention", section 1 (architecture), eq. (1);
    DeepSeek-V3.2-Exp's ``inference/model.py`` (class ``Indexer``: the key
    LayerNorm, the partial non-interleaved RoPE, queries from the latent
    query); transformers' ``DeepseekV32Indexer``.
    """

    def __init__(
        self,
        d_in: int,
        context_length: int,
        num_index_heads: int,
        index_head_dim: int,
        *,
        rope_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_scaling: Mapping[str, object] | None = None,
        eps: float = 1e-6,
    ) -> None:
        for name, value in (
            ("d_in", d_in), ("context_length", context_length),
            ("num_index_heads", num_index_heads), ("index_head_dim", index_head_dim),
            ("rope_head_dim", rope_head_dim),
        ):
            check_positive_int(name, value)
        if q_lora_rank is not None:
            check_positive_int("q_lora_rank", q_lora_rank)
        if rope_head_dim % 2 != 0 or rope_head_dim > index_head_dim:
            raise ValueError(
                f"rope_head_dim={rope_head_dim} must be even and at most "
                f"index_head_dim={index_head_dim}"
            )
        super().__init__()
        self.d_in, self.context_length = int(d_in), int(context_length)
        self.num_index_heads = int(num_index_heads)
        self.index_head_dim = int(index_head_dim)
        self.rope_head_dim = int(rope_head_dim)
        self.q_lora_rank = None if q_lora_rank is None else int(q_lora_rank)
        q_in = self.d_in if self.q_lora_rank is None else self.q_lora_rank
        self.W_query = nn.Linear(q_in, self.num_index_heads * self.index_head_dim, bias=False)
        self.W_key = nn.Linear(self.d_in, self.index_head_dim, bias=False)
        self.key_norm = nn.LayerNorm(self.index_head_dim, eps=eps)
        self.W_weights = nn.Linear(self.d_in, self.num_index_heads, bias=False)
        self.rope = RotaryPositionalEmbedding(
            self.rope_head_dim, self.context_length, rope_base, scaling=rope_scaling
        )

    def _rotate(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """RoPE on the first ``rope_head_dim`` components of ``x`` (..., num_tokens, D)."""
        rotated, rest = x.split([self.rope_head_dim, x.shape[-1] - self.rope_head_dim], -1)
        return torch.cat([self.rope(rotated, offset=offset), rest], dim=-1)

    def forward(
        self,
        x: torch.Tensor,
        q_latent: torch.Tensor | None = None,
        *,
        x_key: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Index scores ``I[t, s]`` of the keys ``x_key`` for the queries of ``x``.

        Args:
            x: ``(batch, num_tokens, d_in)``, the tokens that query (their head
                weights, and their queries when ``q_lora_rank`` is None).
            q_latent: ``(batch, num_tokens, q_lora_rank)``, the latent queries
                ``c_q`` of the same tokens; required when ``q_lora_rank`` is
                set, refused otherwise.
            x_key: keyword-only; ``(batch, num_tokens_kv, d_in)``, the tokens
                scored, at positions ``0 .. num_tokens_kv - 1``; the queries are
                the last ``num_tokens`` of them (as when decoding with a cache).
                Default ``x``.

        Returns:
            ``index_scores``: ``(batch, num_tokens, num_tokens_kv)``, not
            masked (:func:`top_k_mask` applies causality).

        Raises:
            TypeError: an input is not a floating-point tensor of the module's
                dtype.
            ValueError: an input has the wrong shape, ``q_latent`` is missing
                or not expected, ``x_key`` has fewer tokens than ``x`` or more
                than ``context_length``.
        """
        check_input(x, self.d_in, (3,), self.context_length, like=self.W_key.weight)
        if x_key is None:
            x_key = x
        else:
            check_input(x_key, self.d_in, (3,), self.context_length, like=self.W_key.weight)
        b, n, _ = x.shape
        n_kv = x_key.shape[1]
        if x_key.shape[0] != b or n_kv < n:
            raise ValueError(
                f"x_key must be (batch={b}, num_tokens_kv >= num_tokens={n}, d_in), "
                f"got shape {tuple(x_key.shape)}"
            )
        if self.q_lora_rank is None:
            if q_latent is not None:
                raise ValueError(
                    "q_latent is given but q_lora_rank=None: the queries come from x"
                )
            source = x
        else:
            if q_latent is None:
                raise ValueError(
                    f"q_lora_rank={self.q_lora_rank}: pass q_latent, the latent queries"
                )
            check_float_tensor("q_latent", q_latent, min_ndim=3)
            if tuple(q_latent.shape) != (b, n, self.q_lora_rank):
                raise ValueError(
                    f"q_latent must have shape {(b, n, self.q_lora_rank)}, "
                    f"got {tuple(q_latent.shape)}"
                )
            source = q_latent
        h, d = self.num_index_heads, self.index_head_dim
        index_queries = self.W_query(source).view(b, n, h, d).transpose(1, 2)
        # index_queries: (b, num_index_heads, num_tokens, index_head_dim)
        index_queries = self._rotate(index_queries, n_kv - n)
        index_keys = self._rotate(self.key_norm(self.W_key(x_key)), 0)
        # index_keys: (b, num_tokens_kv, index_head_dim), one per token, shared by the heads
        per_head = F.relu(
            torch.einsum("bjnd,bsd->bjns", index_queries, index_keys) * d**-0.5
        )  # (b, num_index_heads, num_tokens, num_tokens_kv)
        weights = self.W_weights(x) * h**-0.5  # (b, num_tokens, num_index_heads)
        return torch.einsum("bnj,bjns->bns", weights, per_head)  # (b, n, num_tokens_kv)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, num_index_heads={self.num_index_heads}, "
            f"index_head_dim={self.index_head_dim}, rope_head_dim={self.rope_head_dim}, "
            f"q_lora_rank={self.q_lora_rank}"
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

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 1, eq. (2)
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
    visible = (  # (n, n_kv), True = may be kept; the queries are the last n positions
        bottom_right_causal_mask(n, n_kv, device=index_scores.device)
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

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 1, eq. (2).
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
