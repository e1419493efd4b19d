"""Chapter 13's attention variants as parts of :class:`attnlib.TinyTransformer`, and what
each keeps per sequence.

A block's token mixing is chosen by passing a *factory*: a callable
``factory(d_model, context_length, num_heads)`` that returns the attention module
(:data:`AttentionFactory`). :class:`LinearAttention` and :class:`TopKAttention` are
such classes themselves; :func:`latent_attention_layer` and
:func:`gated_deltanet_layer` build :class:`attnlib.latent.MultiHeadLatentAttention` and
:class:`attnlib.linear_attention.GatedDeltaNet` at a block's sizes.
:class:`SharedKVAttention` lets a block reuse the keys and values of the block below
it (cross-layer KV sharing). Every one has the interface of attnlib's attention
layers, ``forward(x, return_weights=False, *, kv_cache=None)`` and ``new_cache()``
(a :class:`attnlib.kv_cache.Cache`), so a model decodes with each one's own cache.
The functions at the end count what a decoder keeps per sequence with each: a KV
cache that grows with the tokens, a latent cache, or a recurrent state of fixed
size (:func:`cache_bytes`).

Shapes as in :mod:`attnlib.models`: ``(batch, num_tokens, d_model)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from ._validation import check_bool, check_positive_int, type_name
from .functional import attention, bottom_right_causal_mask
from .kv_cache import KVCache
from .latent import MultiHeadLatentAttention
from .linear_attention import GatedDeltaNet, linear_attention
from .positional import (
    RotaryPositionalEmbedding,
)
from .sparse import top_k_mask

__all__ = [
    "AttentionFactory",
    "ProjectedAttention",
    "LinearAttention",
    "TopKAttention",
    "latent_attention_layer",
    "gated_deltanet_layer",
    "SharedKVAttention",
    "softmax_cache_numbers",
    "latent_cache_numbers",
    "linear_state_numbers",
    "cache_bytes",
]

#: What :class:`~attnlib.models.TinyTransformer` and
#: :class:`~attnlib.models.TransformerBlock` take as ``attention``: called as
#: ``factory(d_model, context_length, num_heads)``, it returns a module with
#: ``forward(x, return_weights=False, *, kv_cache=None)`` and ``new_cache()``.
AttentionFactory = Callable[[int, int, int], nn.Module]


def _check_sizes(d_model: int, context_length: int, num_heads: int) -> None:
    check_positive_int("d_model", d_model)
    check_positive_int("context_length", context_length)
    check_positive_int("num_heads", num_heads)
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")


class ProjectedAttention(nn.Module):
    """Multi-head projections around a causal token mixing that subclasses define.

    ``forward(x)`` projects ``x`` to queries, keys and values of ``num_heads``
    heads of ``head_dim = d_model // num_heads`` (as multi-head attention
    does), appends the keys and values to a cache if one is given, lets
    :meth:`mix` combine them, and projects the merged heads with
    ``out_proj``. Subclasses (:class:`LinearAttention`, :class:`TopKAttention`)
    define only :meth:`mix`.

    Args:
        d_model: input and output size.
        context_length: the most tokens.
        num_heads: heads; must divide ``d_model``.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_model)``; output the same shape.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size is not positive, or ``d_model`` is not divisible by
            ``num_heads``.

    Source: the projections of multi-head attention, Vaswani et al. (2017),
    "Attention Is All You Need", section 3.2.2.
    """

    def __init__(self, d_model: int, context_length: int, num_heads: int) -> None:
        _check_sizes(d_model, context_length, num_heads)
        super().__init__()
        self.d_model, self.context_length, self.num_heads = d_model, context_length, num_heads
        self.head_dim = d_model // num_heads
        self.W_query = nn.Linear(d_model, d_model, bias=False)
        self.W_key = nn.Linear(d_model, d_model, bias=False)
        self.W_value = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model)

    def new_cache(self) -> KVCache:
        """An empty :class:`attnlib.KVCache` for ``forward``'s ``kv_cache``."""
        return KVCache()

    def mix(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
            ) -> torch.Tensor:
        """Causal mixing of ``(b, h, n, d)`` queries with ``(b, h, n_kv, d)`` keys and
        values (the queries are the last ``n`` positions): ``(b, h, n, d)``.

        Raises:
            NotImplementedError: here; subclasses define it.
        """
        raise NotImplementedError(f"{type_name(self)} must define mix()")

    def forward(
        self, x: torch.Tensor, return_weights: bool = False, *, kv_cache: KVCache | None = None
    ) -> torch.Tensor:
        """Mix the tokens of ``x`` causally: ``(batch, num_tokens, d_model)`` in and out.

        With ``kv_cache`` (:meth:`new_cache`), ``x`` holds only the new tokens:
        their keys and values are appended, and their queries see every cached token.

        Raises:
            TypeError: ``return_weights`` is not a bool or ``kv_cache`` not a KVCache.
            ValueError: ``return_weights`` is True (no weights are returned).
        """
        if check_bool("return_weights", return_weights):
            raise ValueError(f"{type_name(self)} does not return attention weights: "
                             "return_weights=False")
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be an attnlib.KVCache, got {type_name(kv_cache)}")
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        queries = self.W_query(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        keys = self.W_key(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        values = self.W_value(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        if kv_cache is not None:
            keys, values = kv_cache.update(keys, values)  # (b, h, num_tokens_kv, d)
        context_vec = self.mix(queries, keys, values)  # (b, h, n, d)
        context_vec = context_vec.transpose(1, 2).reshape(b, n, self.d_model)  # (b, n, d_model)
        return self.out_proj(context_vec)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}"


class LinearAttention(ProjectedAttention):
    """Causal linear attention with ``phi(x) = elu(x) + 1`` in the place of a softmax block.

    ``num_heads`` heads of ``d_model // num_heads``, with query/key/value/output
    projections as in multi-head attention, mixed by
    :func:`attnlib.linear_attention.linear_attention` (parallel form). Its
    cache (:meth:`ProjectedAttention.new_cache`) is a :class:`attnlib.KVCache`:
    decoding runs the parallel form of the new queries against every cached
    key (a recurrent state of fixed size is
    :class:`~attnlib.linear_attention.GatedDeltaNet`'s). Arguments, shapes and
    errors as :class:`ProjectedAttention`'s.

    Source: Katharopoulos et al. (2020), "Transformers are RNNs", eq. (4)-(7).
    """

    def mix(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
            ) -> torch.Tensor:
        """Linear attention of ``(b, h, n, d)`` queries to ``(b, h, n_kv, d)`` keys."""
        return linear_attention(queries, keys, values)  # (b, h, n, d)


class TopKAttention(ProjectedAttention):
    """Softmax attention in which each query keeps only its ``top_k`` highest-scoring keys.

    Multi-head attention whose queries attend only to the ``top_k`` visible keys
    of highest index score (:func:`attnlib.sparse.top_k_mask`; computed as
    masked attention, which equals :func:`attnlib.sparse.sparse_attention`).
    The index is the heads' mean score ``q . k / sqrt(head_dim)`` itself,
    detached: DeepSeek's separate lightning indexer, trained by distillation,
    is left out.

    Args:
        d_model, context_length, num_heads: as :class:`ProjectedAttention`.
        top_k: keyword-only; keys per query. Default 4.

    Raises:
        TypeError, ValueError: as :class:`ProjectedAttention`; ``top_k`` is not
            a positive int.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 2.1 (top-k selection).
    """

    def __init__(
        self, d_model: int, context_length: int, num_heads: int, *, top_k: int = 4
    ) -> None:
        check_positive_int("top_k", top_k)
        super().__init__(d_model, context_length, num_heads)
        self.top_k = int(top_k)

    def mix(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
            ) -> torch.Tensor:
        """Top-k attention of ``(b, h, n, d)`` queries to ``(b, h, n_kv, d)`` keys."""
        with torch.no_grad():
            index_scores = (queries @ keys.transpose(-2, -1)).mean(1) * self.head_dim**-0.5
            # index_scores: (b, n, n_kv), the heads' mean score
        kept = top_k_mask(index_scores, self.top_k)  # (b, n, n_kv), True = attend
        # Full attention with the other keys masked: equal to attnlib.sparse's
        # sparse_attention (which gathers the kept keys), and cheaper at this size.
        context_vec, _ = attention(queries, keys, values, kept[:, None])  # torch's kernel
        return context_vec

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, top_k={self.top_k}"


def latent_attention_layer(
    d_model: int, context_length: int, num_heads: int
) -> MultiHeadLatentAttention:
    """Multi-head latent attention at a block's sizes (an :data:`AttentionFactory`).

    A latent of ``kv_lora_rank = d_model // 2``, ``qk_nope_head_dim =
    v_head_dim = d_model // num_heads`` and a decoupled RoPE part of
    ``qk_rope_head_dim = 2 * max(1, head_dim // 4)``; full-rank queries.

    Raises:
        TypeError, ValueError: a size is not a positive int, or ``d_model`` is
            not divisible by ``num_heads``.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.
    """
    _check_sizes(d_model, context_length, num_heads)
    head_dim = d_model // num_heads
    return MultiHeadLatentAttention(
        d_model, context_length, num_heads, kv_lora_rank=max(1, d_model // 2),
        qk_nope_head_dim=head_dim, qk_rope_head_dim=2 * max(1, head_dim // 4),
        v_head_dim=head_dim,
    )


def gated_deltanet_layer(d_model: int, context_length: int, num_heads: int) -> GatedDeltaNet:
    """Gated DeltaNet at a block's sizes (an :data:`AttentionFactory`).

    ``num_heads`` heads of ``d_model // num_heads`` (short convolution of 4,
    L2-normalised queries and keys, output gate); ``context_length`` is only
    checked: the layer's state does not grow.

    Raises:
        TypeError, ValueError: a size is not a positive int, or ``d_model`` is
            not divisible by ``num_heads``.

    Source: Yang et al. (2024), "Gated Delta Networks", section 3.4.
    """
    _check_sizes(d_model, context_length, num_heads)
    return GatedDeltaNet(d_model, num_heads, d_model // num_heads)


class SharedKVAttention(nn.Module):
    """Causal multi-head attention that can lend its keys and values to later layers.

    A *producer* (``makes_kv=True``) projects queries, keys and values and
    appends the (rotated) keys and values to its :class:`attnlib.KVCache`; a
    *consumer* (``makes_kv=False``) projects only queries and attends to the
    keys and values in the producer's cache, passed to it as its own
    ``kv_cache``. A consumer's :meth:`new_cache` is None: it keeps nothing, and
    a model hands it the cache of the layer below
    (:meth:`attnlib.TinyTransformer.new_caches`).

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
        _check_sizes(d_model, context_length, num_heads)
        check_bool("makes_kv", makes_kv)
        check_bool("rope", rope)
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

    def new_cache(self) -> KVCache | None:
        """A producer's empty :class:`attnlib.KVCache`; None for a consumer (it reads
        the producer's)."""
        return KVCache() if self.makes_kv else None

    def forward(
        self, x: torch.Tensor, return_weights: bool = False, *, kv_cache: KVCache | None = None
    ) -> torch.Tensor:
        """Attention of ``x``'s queries to this layer's or the producer's keys and values.

        Args:
            x: ``(batch, num_tokens, d_model)``; with a cache, only new tokens.
            return_weights: must be ``False`` (no weights are returned).
            kv_cache: keyword-only; a producer's own :class:`attnlib.KVCache`
                (optional), which it appends to; for a consumer, the producer's
                cache after the producer ran on the same tokens (required).

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_model)``.

        Raises:
            TypeError: ``return_weights`` is not a bool or ``kv_cache`` is not a KVCache.
            ValueError: ``return_weights`` is True, or a consumer gets no cache
                or one holding fewer tokens than ``x``.
        """
        if check_bool("return_weights", return_weights):
            raise ValueError("SharedKVAttention does not return attention weights: "
                             "return_weights=False")
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be an attnlib.KVCache, got {type_name(kv_cache)}")
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        if self.W_key is not None and self.W_value is not None:  # a producer
            num_cached = 0 if kv_cache is None else kv_cache.num_tokens
            keys = self.W_key(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
            values = self.W_value(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
            if self.rope is not None:
                keys = self.rope(keys, offset=num_cached)
            if kv_cache is not None:
                keys, values = kv_cache.update(keys, values)  # (b, h, num_tokens_kv, d)
        elif kv_cache is None or kv_cache.keys is None or kv_cache.values is None or (
                kv_cache.num_tokens < n):
            raise ValueError(
                "a consumer layer (makes_kv=False) reads the keys and values of its "
                "producer: pass the producer's kv_cache after the producer ran on x"
            )
        else:
            keys, values = kv_cache.keys, kv_cache.values  # (b, h, num_tokens_kv, d)
        num_tokens_kv = keys.shape[2]
        queries = self.W_query(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        if self.rope is not None:
            queries = self.rope(queries, offset=num_tokens_kv - n)
        allowed = bottom_right_causal_mask(n, num_tokens_kv, device=x.device)
        # allowed: (n, num_tokens_kv), True = may attend; new queries are the bottom rows
        context_vec, _ = attention(queries, keys, values, allowed)  # (b, h, n, d)
        context_vec = context_vec.transpose(1, 2).reshape(b, n, self.d_model)  # (b, n, d_model)
        return self.out_proj(context_vec)

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
