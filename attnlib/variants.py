"""Chapter 13's attention variants as parts of :class:`attnlib.TinyTransformer`, and what
each keeps per sequence.

:class:`VariantAttention` puts causal token mixing of another kind in the place of a
block's softmax attention (linear attention, Gated DeltaNet, multi-head latent
attention, top-k sparse attention; :data:`ATTENTION_CHOICES`), and
:class:`SharedKVAttention` lets a block reuse the keys and values of the block below
it (cross-layer KV sharing). The functions at the end count what a decoder keeps per
sequence with each: a KV cache that grows with the tokens, a latent cache, or a
recurrent state of fixed size (:func:`cache_bytes`).

Shapes as in :mod:`attnlib.models`: ``(batch, num_tokens, d_model)``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validation import check_bool, check_positive_int, type_name
from .kv_cache import KVCache
from .latent import MultiHeadLatentAttention
from .linear_attention import GatedDeltaNet, linear_attention
from .positional import (
    RotaryPositionalEmbedding,
)
from .sparse import top_k_mask

__all__ = [
    "ATTENTION_CHOICES",
    "VariantAttention",
    "SharedKVAttention",
    "softmax_cache_numbers",
    "latent_cache_numbers",
    "linear_state_numbers",
    "cache_bytes",
]

#: The values :class:`~attnlib.models.TinyTransformer` accepts for ``attention``.
ATTENTION_CHOICES = ("softmax", "linear", "gated_deltanet", "mla", "sparse")


class VariantAttention(nn.Module):
    """Causal token mixing of another kind, in the place of a block's softmax attention.

    One adapter with the interface :class:`~attnlib.models.TransformerBlock` expects of its
    attention (``forward(x, kv_cache=None)``, ``(batch, num_tokens, d_model)``
    in and out), for chapter 13's comparison of what each kind can learn:

    * ``"linear"``: causal linear attention with ``phi(x) = elu(x) + 1``
      (:func:`attnlib.linear_attention.linear_attention`), ``num_heads`` heads
      of ``d_model // num_heads``, query/key/value/output projections as in
      multi-head attention.
    * ``"gated_deltanet"``: :class:`attnlib.linear_attention.GatedDeltaNet`
      with ``num_heads`` heads of ``d_model // num_heads`` (short convolution
      of 4, L2-normalised queries and keys, output gate).
    * ``"mla"``: :class:`attnlib.latent.MultiHeadLatentAttention`, with a
      latent of ``kv_lora_rank = d_model // 2``, ``qk_nope_head_dim =
      v_head_dim = d_model // num_heads`` and a decoupled RoPE part of
      ``qk_rope_head_dim = 2 * max(1, head_dim // 4)``; full-rank queries.
    * ``"sparse"``: softmax attention in which each query keeps only its
      ``top_k`` highest-scoring visible keys (:func:`attnlib.sparse.top_k_mask`;
      computed as masked attention, which equals
      :func:`attnlib.sparse.sparse_attention`). The index is the heads'
      mean score ``q . k / sqrt(head_dim)`` itself, detached: DeepSeek's
      separate lightning indexer, trained by distillation, is left out.

    Args:
        kind: one of ``"linear"``, ``"gated_deltanet"``, ``"mla"``, ``"sparse"``.
        d_model: input and output size.
        context_length: the most tokens.
        num_heads: heads; must divide ``d_model``.
        top_k: keyword-only; keys per query for ``"sparse"``. Default 4.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_model)``; output the same shape.

    Raises:
        TypeError: ``kind`` is not a str or a size not an int.
        ValueError: ``kind`` is not one of the four, a size is not positive,
            or ``d_model`` is not divisible by ``num_heads``.

    Source: Katharopoulos et al. (2020), "Transformers are RNNs", eq. (4)-(7)
    (``"linear"``); Yang et al. (2024), "Gated Delta Networks", section 3.4
    (``"gated_deltanet"``); DeepSeek-AI (2024), "DeepSeek-V2", section 2.1
    (``"mla"``); DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 2.1
    (top-k selection, ``"sparse"``).
    """

    def __init__(
        self, kind: str, d_model: int, context_length: int, num_heads: int, *, top_k: int = 4
    ) -> None:
        if not isinstance(kind, str):
            raise TypeError(f"kind must be a str, got {type_name(kind)}")
        if kind not in ATTENTION_CHOICES[1:]:
            raise ValueError(f"kind must be one of {ATTENTION_CHOICES[1:]}, got kind={kind!r}")
        check_positive_int("d_model", d_model)
        check_positive_int("context_length", context_length)
        check_positive_int("num_heads", num_heads)
        check_positive_int("top_k", top_k)
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        super().__init__()
        self.kind, self.d_model, self.num_heads = kind, d_model, num_heads
        self.head_dim = d_model // num_heads
        self.top_k = int(top_k)
        self.mixer: nn.Module | None = None
        if kind == "gated_deltanet":
            self.mixer = GatedDeltaNet(d_model, num_heads, self.head_dim)
        elif kind == "mla":
            self.mixer = MultiHeadLatentAttention(
                d_model, context_length, num_heads, kv_lora_rank=max(1, d_model // 2),
                qk_nope_head_dim=self.head_dim, qk_rope_head_dim=2 * max(1, self.head_dim // 4),
                v_head_dim=self.head_dim,
            )
        else:
            self.W_query = nn.Linear(d_model, d_model, bias=False)
            self.W_key = nn.Linear(d_model, d_model, bias=False)
            self.W_value = nn.Linear(d_model, d_model, bias=False)
            self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self, x: torch.Tensor, return_weights: bool = False, *, kv_cache: object = None
    ) -> torch.Tensor:
        """Mix the tokens of ``x`` causally: ``(batch, num_tokens, d_model)`` in and out.

        Raises:
            ValueError: ``return_weights`` is True or a ``kv_cache`` is given
                (neither is supported here: run the whole sequence).
        """
        if return_weights or kv_cache is not None:
            raise ValueError(
                f"attention={self.kind!r} supports neither return_weights nor a KV cache; "
                "run the whole sequence (model.generate(..., use_cache=False))"
            )
        if self.mixer is not None:
            return self.mixer(x)  # (b, n, d_model)
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        queries = self.W_query(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        keys = self.W_key(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        values = self.W_value(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        if self.kind == "linear":
            context_vec = linear_attention(queries, keys, values)  # (b, h, n, d)
        else:
            with torch.no_grad():
                index_scores = (queries @ keys.transpose(-2, -1)).mean(1) * d**-0.5
                # index_scores: (b, n, n), the heads' mean score
            kept = top_k_mask(index_scores, self.top_k)  # (b, n, n), True = attend
            # Full attention with the other keys masked: equal to attnlib.sparse's
            # sparse_attention (which gathers the kept keys), and cheaper at this size.
            context_vec = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=kept[:, None]
            )  # (b, h, n, d)
        context_vec = context_vec.transpose(1, 2).reshape(b, n, self.d_model)  # (b, n, d_model)
        return self.out_proj(context_vec)

    def extra_repr(self) -> str:
        extra = f", top_k={self.top_k}" if self.kind == "sparse" else ""
        return f"kind={self.kind!r}, d_model={self.d_model}, num_heads={self.num_heads}{extra}"


class SharedKVAttention(nn.Module):
    """Causal multi-head attention that can lend its keys and values to later layers.

    A *producer* (``makes_kv=True``) projects queries, keys and values, and
    returns its (rotated) keys and values with its output; a *consumer*
    (``makes_kv=False``) projects only queries and attends to the keys and
    values a producer lent it. A KV cache is then needed only for producers.

    Args:
        d_model: input and output size.
        context_length: the most tokens.
        num_heads: heads; must divide ``d_model``.
        makes_kv: keyword-only; project keys and values (a producer). Default True.
        rope: keyword-only; rotate queries and keys with RoPE. Default False.

    Raises:
        TypeError: a size is not an int or a flag not a bool.
        ValueError: a size is not positive or ``d_model`` not divisible by
            ``num_heads``.

    Source: Brandon et al. (2024), "Reducing Transformer Key-Value Cache Size
    with Cross-Layer Attention", section 2 (cross-layer attention, CLA).
    """

    def __init__(
        self,
        d_model: int,
        context_length: int,
        num_heads: int,
        *,
        makes_kv: bool = True,
        rope: bool = False,
    ) -> None:
        check_positive_int("d_model", d_model)
        check_positive_int("context_length", context_length)
        check_positive_int("num_heads", num_heads)
        check_bool("makes_kv", makes_kv)
        check_bool("rope", rope)
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.head_dim = d_model // num_heads
        self.makes_kv = makes_kv
        self.W_query = nn.Linear(d_model, d_model, bias=False)
        self.W_key = nn.Linear(d_model, d_model, bias=False) if makes_kv else None
        self.W_value = nn.Linear(d_model, d_model, bias=False) if makes_kv else None
        self.out_proj = nn.Linear(d_model, d_model)
        self.rope = (
            RotaryPositionalEmbedding(self.head_dim, context_length) if rope else None
        )

    def forward(
        self,
        x: torch.Tensor,
        shared_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        *,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attention of ``x``'s queries to this layer's or the lent keys and values.

        Args:
            x: ``(batch, num_tokens, d_model)``; with a cache, only new tokens.
            shared_kv: the producer's ``(keys, values)``, each ``(batch,
                num_heads, num_tokens_kv, head_dim)``; required for a consumer,
                refused for a producer.
            kv_cache: keyword-only; a producer's :class:`attnlib.KVCache`.

        Returns:
            ``(context_vec, (keys, values))``: ``(batch, num_tokens, d_model)``
            and the keys and values used (all cached tokens included).

        Raises:
            ValueError: a consumer without ``shared_kv``, or a producer with it.
        """
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        if self.makes_kv == (shared_kv is not None):
            raise ValueError(
                "a producer layer (makes_kv=True) computes its own keys and values and "
                "takes no shared_kv; a consumer layer needs the producer's shared_kv"
            )
        num_cached = 0
        if shared_kv is None:
            assert self.W_key is not None and self.W_value is not None
            num_cached = 0 if kv_cache is None else kv_cache.num_tokens
            keys = self.W_key(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
            values = self.W_value(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
            if self.rope is not None:
                keys = self.rope(keys, offset=num_cached)
            if kv_cache is not None:
                keys, values = kv_cache.update(keys, values)  # (b, h, num_tokens_kv, d)
        else:
            keys, values = shared_kv
            num_cached = keys.shape[2] - n
        queries = self.W_query(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        if self.rope is not None:
            queries = self.rope(queries, offset=num_cached)
        allowed = torch.ones(n, keys.shape[2], dtype=torch.bool, device=x.device).tril(
            num_cached
        )  # True = may attend; new queries are the bottom rows
        context_vec = F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed)
        context_vec = context_vec.transpose(1, 2).reshape(b, n, self.d_model)  # (b, n, d_model)
        return self.out_proj(context_vec), (keys, values)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, makes_kv={self.makes_kv}"


# ---------------------------------------------------------------------------
# How much a decoder keeps per sequence: KV caches and recurrent states
# ---------------------------------------------------------------------------


def softmax_cache_numbers(num_kv_groups: int, head_dim: int, head_dim_v: int | None = None
                          ) -> tuple[int, int]:
    """Numbers one softmax-attention layer caches: ``(per_token, fixed)``.

    ``per_token = num_kv_groups * (head_dim + head_dim_v)`` (a key and a value
    per key/value head: multi-head attention with ``num_kv_groups =
    num_heads``, multi-query with 1); ``fixed = 0``.

    Raises:
        TypeError, ValueError: a size is not a positive int.

    Source: Ainslie et al. (2023), "GQA", section 2.2.
    """
    check_positive_int("num_kv_groups", num_kv_groups)
    check_positive_int("head_dim", head_dim)
    head_dim_v = head_dim if head_dim_v is None else check_positive_int("head_dim_v", head_dim_v)
    return num_kv_groups * (head_dim + head_dim_v), 0


def latent_cache_numbers(kv_lora_rank: int, qk_rope_head_dim: int) -> tuple[int, int]:
    """Numbers one MLA layer caches: ``(kv_lora_rank + qk_rope_head_dim, 0)``.

    Raises:
        TypeError, ValueError: a size is not a positive int.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.2, Table 1.
    """
    check_positive_int("kv_lora_rank", kv_lora_rank)
    check_positive_int("qk_rope_head_dim", qk_rope_head_dim)
    return kv_lora_rank + qk_rope_head_dim, 0


def linear_state_numbers(
    num_heads: int, head_dim: int, head_dim_v: int, conv_channels: int = 0, conv_size: int = 1
) -> tuple[int, int]:
    """Numbers one linear-attention (Gated DeltaNet) layer keeps: ``(0, fixed)``.

    ``fixed = num_heads * head_dim * head_dim_v`` (the state) ``+
    conv_channels * (conv_size - 1)`` (the short convolution's last inputs).

    Raises:
        TypeError, ValueError: a size is not a positive int (``conv_channels``
            may be 0).

    Source: Yang et al. (2024), "Gated Delta Networks", section 3.
    """
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim),
                        ("head_dim_v", head_dim_v), ("conv_size", conv_size)):
        check_positive_int(name, value)
    if not isinstance(conv_channels, int) or conv_channels < 0:
        raise ValueError(f"conv_channels must be an int >= 0, got conv_channels={conv_channels!r}")
    return 0, num_heads * head_dim * head_dim_v + conv_channels * (conv_size - 1)


def cache_bytes(
    layers: list[tuple[int, int]], num_tokens: int, *, bytes_per_number: int = 2
) -> int:
    """Bytes a decoder keeps for one sequence of ``num_tokens`` tokens.

    Args:
        layers: one ``(per_token, fixed)`` pair per layer, from
            :func:`softmax_cache_numbers`, :func:`latent_cache_numbers`,
            :func:`linear_state_numbers`, or ``(0, 0)`` for a layer that
            reuses an earlier layer's keys and values.
        num_tokens: tokens in the sequence (>= 0).
        bytes_per_number: keyword-only; 2 for bf16/fp16 (default), 1 for fp8.

    Returns:
        ``bytes_per_number * sum(per_token * num_tokens + fixed)``.

    Raises:
        TypeError, ValueError: ``num_tokens`` is not an int >= 0, or
            ``bytes_per_number`` not a positive int.
    """
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an int >= 0, got num_tokens={num_tokens!r}")
    check_positive_int("bytes_per_number", bytes_per_number)
    return bytes_per_number * sum(per_token * num_tokens + fixed for per_token, fixed in layers)
