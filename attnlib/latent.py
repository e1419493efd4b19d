"""Multi-head latent attention (MLA): keys and values from one small latent vector.

Grouped-query attention shrinks the KV cache by sharing key/value heads
between query heads. DeepSeek-V2's multi-head latent attention shrinks it
further without sharing heads: every token is compressed to one latent vector
``c_kv`` of ``kv_lora_rank`` numbers, and each head's keys and values are
linear functions of it (a low-rank factorisation of the key and value
projections). RoPE cannot go through that factorisation (a rotation that
depends on the position would sit between the two factors), so a small
*decoupled* RoPE key of ``qk_rope_head_dim`` numbers, shared by all heads, is
computed beside the latent. The cache holds only ``c_kv`` and that key:
``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer, against
``2 * num_heads * head_dim`` for multi-head attention.

At inference the up-projection of the keys can be *absorbed* into the query
and the up-projection of the values into the output, so attention runs on
the latents directly: the absorbed form is multi-query attention whose one
key/value head is the latent. :class:`MultiHeadLatentAttention` computes both
forms (``absorb=False``/``True``), which agree to rounding.

Shape legend:

* ``batch``, ``num_tokens`` (new tokens), ``num_tokens_kv`` (cached + new).
* ``d_in``: the residual stream's size (input and output of the layer).
* ``num_heads``: query heads, each with its own key and value head.
* ``qk_nope_head_dim`` / ``qk_rope_head_dim``: the parts of a query or key
  without and with RoPE; a head's query and key have their sum.
* ``v_head_dim``: size of one head's value.
* ``kv_lora_rank`` / ``q_lora_rank``: sizes of the key/value and query latents.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn as nn

from ._validation import check_bool, check_input, check_positive_int, type_name
from .functional import attention, bottom_right_causal_mask
from .kv_cache import Cache
from .positional import RotaryPositionalEmbedding, yarn_mscale

__all__ = ["LatentCache", "MultiHeadLatentAttention"]


class LatentCache(Cache):
    """What :class:`MultiHeadLatentAttention` keeps between decoding steps.

    Two tensors per layer, appended to on the token dimension: the normalised
    latents ``c_kv`` and the RoPE keys (already rotated), shared by all heads.
    No per-head key or value is stored. A :class:`attnlib.kv_cache.Cache`:
    ``update(latents, rope_keys)`` in the place of ``update(keys, values)``.

    Attributes:
        latents: ``(batch, num_tokens, kv_lora_rank)``, or None while empty.
        rope_keys: ``(batch, num_tokens, qk_rope_head_dim)``, or None while empty.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.2 and eq. (9)-(10)
    (only ``c_kv`` and the decoupled key are cached).
    """

    def __init__(self) -> None:
        self.latents: torch.Tensor | None = None
        self.rope_keys: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens cached so far (0 while empty)."""
        return 0 if self.latents is None else self.latents.shape[1]

    def update(
        self, latents: torch.Tensor, rope_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' latents and RoPE keys; return all cached ones.

        Args:
            latents: ``(batch, num_new, kv_lora_rank)``.
            rope_keys: ``(batch, num_new, qk_rope_head_dim)``.

        Returns:
            ``(latents, rope_keys)`` of every cached token, old ones first.

        Raises:
            ValueError: the batch size, sizes, dtype or device differ from what
                the cache holds, or the two disagree on ``(batch, num_new)``.
        """
        if latents.shape[:2] != rope_keys.shape[:2]:
            raise ValueError(
                "latents and rope_keys must agree on (batch, num_new), got "
                f"{tuple(latents.shape)} and {tuple(rope_keys.shape)}"
            )
        if self.latents is None or self.rope_keys is None:
            self.latents = latents.clone(memory_format=torch.contiguous_format)
            self.rope_keys = rope_keys.clone(memory_format=torch.contiguous_format)
        else:
            held = (self.latents.shape[0], self.latents.shape[2], self.rope_keys.shape[2],
                    self.latents.dtype, self.latents.device)
            new = (latents.shape[0], latents.shape[2], rope_keys.shape[2], latents.dtype,
                   latents.device)
            if held != new:
                raise ValueError(
                    "this latent cache holds (batch, kv_lora_rank, qk_rope_head_dim, dtype, "
                    f"device)={held}, but the new tokens have {new}: use one cache per layer"
                )
            self.latents = torch.cat([self.latents, latents], dim=1)
            self.rope_keys = torch.cat([self.rope_keys, rope_keys], dim=1)
        return self.latents, self.rope_keys

    def reset(self) -> None:
        """Empty the cache (to start a new sequence)."""
        self.latents = None
        self.rope_keys = None

    def memory_bytes(self) -> int:
        """Bytes held: ``batch * num_tokens * (kv_lora_rank + qk_rope_head_dim) * itemsize``."""
        if self.latents is None or self.rope_keys is None:
            return 0
        return self.latents.nbytes + self.rope_keys.nbytes

    def __repr__(self) -> str:
        if self.latents is None or self.rope_keys is None:
            return "LatentCache(empty)"
        b, n, r = self.latents.shape
        return (
            f"LatentCache(batch={b}, num_tokens={n}, kv_lora_rank={r}, "
            f"qk_rope_head_dim={self.rope_keys.shape[2]}, dtype={self.latents.dtype})"
        )


class MultiHeadLatentAttention(nn.Module):
    r"""Causal multi-head latent attention (MLA) with decoupled RoPE, as in DeepSeek-V2/V3.

    For every token ``x`` (rows are tokens; ``W`` are ``nn.Linear`` weights):

    .. code-block:: text

        c_q  = RMSNorm(x W_query_down)                  # (q_lora_rank,)  [if q_lora_rank]
        q    = c_q W_query_up  (or x W_query)           # per head: [q_nope, q_rope]
        c_kv, k_rope = split(x W_kv_down)               # (kv_lora_rank,), (qk_rope_head_dim,)
        c_kv = RMSNorm(c_kv)                            # cached
        k_rope = RoPE(k_rope)                           # cached, shared by all heads
        k_nope, v = split(c_kv W_kv_up)                 # per head
        head h: softmax([q_nope, RoPE(q_rope)] . [k_nope, k_rope] * scale) v

    with ``scale = 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``; the heads'
    outputs are concatenated and projected by ``out_proj``.

    **YaRN** (``rope_scaling={"rope_type": "yarn", ...}``, as DeepSeek-V3's
    released configuration: ``factor`` 40, ``original_max_position_embeddings``
    4096, ``mscale`` = ``mscale_all_dim`` = 1). The RoPE part's frequencies are
    stretched as :class:`attnlib.RotaryPositionalEmbedding` does for
    ``"yarn"`` (its cos and sin carry YaRN's ``attention_factor``, here
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``, 1 for
    DeepSeek-V3), and, where ``mscale_all_dim`` is given, the whole score
    (RoPE and non-RoPE parts) is multiplied by ``mscale(factor,
    mscale_all_dim)^2`` with ``mscale(s, m) = 0.1 m ln(s) + 1``
    (:func:`attnlib.positional.yarn_mscale`): 1.874 for DeepSeek-V3, which
    sharpens the softmax as the context stretches.

    **Absorbed form** (``forward(..., absorb=True)``). Writing head ``h``'s
    slice of ``W_kv_up`` as ``W_UK[h]`` (``kv_lora_rank -> qk_nope_head_dim``)
    and ``W_UV[h]`` (``kv_lora_rank -> v_head_dim``),
    ``q_nope . k_nope = (q_nope W_UK[h]^T) . c_kv`` and
    ``sum_j a_j v_j = (sum_j a_j c_kv_j) W_UV[h]``. So each head's query is
    mapped into the latent space once, scores are taken against the cached
    latents themselves, the weighted sum of latents is taken, and only then
    mapped to the value space: no per-head key or value is ever formed. It is
    multi-query attention with one key head ``[c_kv, k_rope]`` of size
    ``kv_lora_rank + qk_rope_head_dim`` and one value head ``c_kv``.

    RoPE uses attnlib's half-split layout
    (:class:`attnlib.RotaryPositionalEmbedding`); DeepSeek's checkpoints pair
    adjacent components (Hugging Face's ``rope_interleave=True``): permute the
    RoPE rows of ``W_query``/``W_query_up`` and ``W_kv_down`` (even rows first,
    then odd ones) to load them.

    Args:
        d_in: size of the residual stream (input and output).
        context_length: the most tokens (cached and new) a sequence may have.
        num_heads: attention heads.
        kv_lora_rank: keyword-only; size of the key/value latent ``c_kv``.
        qk_nope_head_dim: keyword-only; per-head query/key size without RoPE.
        qk_rope_head_dim: keyword-only; size of the RoPE part (even).
        v_head_dim: keyword-only; per-head value size.
        q_lora_rank: keyword-only; size of the query latent, or None (default)
            for a full-rank query projection.
        rope_base: keyword-only; RoPE's base. Default 10000.
        rope_scaling: keyword-only; RoPE's scaling, a dict with ``rope_type``
            and its options under transformers' ``rope_parameters`` names (as
            :class:`attnlib.RotaryPositionalEmbedding`'s ``scaling``); with
            ``"yarn"`` and ``mscale_all_dim``, the score scale is multiplied by
            ``yarn_mscale(factor, mscale_all_dim)^2`` as well. Default None.
        eps: keyword-only; the RMSNorms' epsilon. Default 1e-6.

    Attributes:
        W_query: ``nn.Linear(d_in, num_heads * qk_head_dim, bias=False)``, or
            None when ``q_lora_rank`` is given; then ``W_query_down``
            (``d_in -> q_lora_rank``), ``query_norm`` (``nn.RMSNorm``) and
            ``W_query_up`` (``q_lora_rank -> num_heads * qk_head_dim``).
        W_kv_down: ``nn.Linear(d_in, kv_lora_rank + qk_rope_head_dim, bias=False)``.
        kv_norm: ``nn.RMSNorm(kv_lora_rank)``.
        W_kv_up: ``nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim +
            v_head_dim), bias=False)``; per head, the key rows then the value rows.
        out_proj: ``nn.Linear(num_heads * v_head_dim, d_in, bias=False)``.
        rope: the :class:`attnlib.RotaryPositionalEmbedding` of the RoPE parts.
        scale: the scores' factor, ``1 / sqrt(qk_head_dim)`` times YaRN's
            ``mscale^2`` where it applies.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_in)``.
        - Output: ``(batch, num_tokens, d_in)``.

    Raises:
        TypeError: a size is not an int (``q_lora_rank`` may be None).
        ValueError: a size is not positive or ``qk_rope_head_dim`` is odd; as
            :class:`attnlib.RotaryPositionalEmbedding` for a bad ``rope_scaling``.

    Source: DeepSeek-AI (2024), "DeepSeek-V2: A Strong, Economical, and
    Efficient Mixture-of-Experts Language Model", section 2.1.2 (low-rank
    key-value joint compression, eq. (9)-(11); the absorption of ``W_UK``
    into ``W_Q`` and ``W_UV`` into ``W_O``), section 2.1.3 (decoupled RoPE,
    eq. (12)-(19)); DeepSeek-AI (2024), "DeepSeek-V3 Technical Report",
    section 2.1.1; Peng et al. (2023), "YaRN: Efficient Context Window
    Extension of Large Language Models", section 3.4 (the attention scale);
    DeepSeek-V3's ``inference/model.py`` (``softmax_scale * mscale * mscale``)
    and transformers' ``yarn_apply_mscale``.
    """

    def __init__(
        self,
        d_in: int,
        context_length: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_scaling: Mapping[str, object] | None = None,
        eps: float = 1e-6,
    ) -> None:
        for name, value in (
            ("d_in", d_in), ("context_length", context_length), ("num_heads", num_heads),
            ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
            ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim),
        ):
            check_positive_int(name, value)
        if q_lora_rank is not None:
            check_positive_int("q_lora_rank", q_lora_rank)
        if qk_rope_head_dim % 2 != 0:
            raise ValueError(
                f"qk_rope_head_dim={qk_rope_head_dim} must be even: RoPE rotates pairs"
            )
        super().__init__()
        self.d_in = int(d_in)
        self.context_length = int(context_length)
        self.num_heads = int(num_heads)
        self.kv_lora_rank = int(kv_lora_rank)
        self.qk_nope_head_dim = int(qk_nope_head_dim)
        self.qk_rope_head_dim = int(qk_rope_head_dim)
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.v_head_dim = int(v_head_dim)
        self.q_lora_rank = None if q_lora_rank is None else int(q_lora_rank)
        q_out = self.num_heads * self.qk_head_dim
        if self.q_lora_rank is None:
            self.W_query: nn.Linear | None = nn.Linear(d_in, q_out, bias=False)
            self.W_query_down = self.query_norm = self.W_query_up = None
        else:
            self.W_query = None
            self.W_query_down = nn.Linear(d_in, self.q_lora_rank, bias=False)
            self.query_norm = nn.RMSNorm(self.q_lora_rank, eps=eps)
            self.W_query_up = nn.Linear(self.q_lora_rank, q_out, bias=False)
        self.W_kv_down = nn.Linear(d_in, self.kv_lora_rank + self.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.kv_lora_rank, eps=eps)
        self.W_kv_up = nn.Linear(
            self.kv_lora_rank, self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
            bias=False,
        )
        self.out_proj = nn.Linear(self.num_heads * self.v_head_dim, d_in, bias=False)
        self.rope = RotaryPositionalEmbedding(self.qk_rope_head_dim, self.context_length,
                                              rope_base, scaling=rope_scaling)
        self.scale = 1.0 / math.sqrt(self.qk_head_dim)
        scaling = self.rope.scaling  # the checked options
        if scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
            # YaRN's temperature on the whole score, (0.1 m ln(factor) + 1)^2.
            mscale = yarn_mscale(float(scaling["factor"]),  # type: ignore[arg-type]
                                 float(scaling["mscale_all_dim"]))  # type: ignore[arg-type]
            self.scale *= mscale * mscale

    @property
    def cache_numbers_per_token(self) -> int:
        """How many numbers the cache keeps per token, ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def new_cache(self) -> LatentCache:
        """An empty :class:`LatentCache` for :meth:`forward`'s ``kv_cache``."""
        return LatentCache()

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK`` and ``W_UV``: ``W_kv_up``'s weight split per head.

        Returns:
            ``W_UK``: ``(num_heads, qk_nope_head_dim, kv_lora_rank)`` (a head's
            ``k_nope = W_UK[h] @ c_kv``) and ``W_UV``:
            ``(num_heads, v_head_dim, kv_lora_rank)`` (``v = W_UV[h] @ c_kv``).
        """
        w = self.W_kv_up.weight.view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )  # (num_heads, qk_nope_head_dim + v_head_dim, kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def _queries(self, x: torch.Tensor, num_cached: int) -> tuple[torch.Tensor, torch.Tensor]:
        b, num_tokens, _ = x.shape
        if self.W_query is not None:
            q = self.W_query(x)  # (b, num_tokens, num_heads * qk_head_dim)
        else:
            assert self.W_query_down is not None and self.W_query_up is not None
            assert self.query_norm is not None
            q = self.W_query_up(self.query_norm(self.W_query_down(x)))
        q = q.view(b, num_tokens, self.num_heads, self.qk_head_dim).transpose(1, 2)
        # q: (b, num_heads, num_tokens, qk_head_dim)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, self.rope(q_rope, offset=num_cached)

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        *,
        kv_cache: LatentCache | None = None,
        absorb: bool = False,
    ) -> torch.Tensor:
        """Causal multi-head latent attention of ``x``.

        Args:
            x: ``(batch, num_tokens, d_in)``; with ``kv_cache``, only the new tokens.
            return_weights: must be ``False`` (the signature of attnlib's
                attention layers; this one does not return its weights).
            kv_cache: keyword-only; a :class:`LatentCache` holding the earlier
                tokens' latents and RoPE keys; the new ones are appended in
                place, and the new queries (at positions ``num_cached ..``)
                attend causally to everything cached. Default None.
            absorb: keyword-only; compute the absorbed form (attention on the
                latents; ``W_UK`` applied to the queries, ``W_UV`` after the
                weighted sum) instead of forming per-head keys and values.
                Default ``False``. Both give the same output.

        Returns:
            ``context_vec``: ``(batch, num_tokens, d_in)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the module's
                dtype, ``kv_cache`` is not a :class:`LatentCache`, or
                ``absorb`` or ``return_weights`` is not a bool.
            ValueError: ``x`` is not ``(batch, num_tokens, d_in)`` or is empty,
                the cached and new tokens exceed ``context_length``, or
                ``return_weights`` is True.
        """
        check_input(x, self.d_in, (3,), self.context_length, like=self.W_kv_down.weight)
        check_bool("absorb", absorb)
        if check_bool("return_weights", return_weights):
            raise ValueError("MultiHeadLatentAttention does not return attention weights: "
                             "call it with return_weights=False")
        if kv_cache is not None and not isinstance(kv_cache, LatentCache):
            raise TypeError(
                f"kv_cache must be an attnlib.LatentCache or None, got {type_name(kv_cache)}"
            )
        b, num_tokens, _ = x.shape
        num_cached = 0 if kv_cache is None else kv_cache.num_tokens
        if num_cached + num_tokens > self.context_length:
            raise ValueError(
                f"the cache holds {num_cached} tokens and x adds num_tokens={num_tokens}: "
                f"{num_cached + num_tokens} tokens exceed context_length={self.context_length}"
            )
        q_nope, q_rope = self._queries(x, num_cached)
        # q_nope: (b, num_heads, num_tokens, qk_nope_head_dim); q_rope: (..., qk_rope_head_dim)
        latents, k_rope = self.W_kv_down(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1
        )  # (b, num_tokens, kv_lora_rank), (b, num_tokens, qk_rope_head_dim)
        latents = self.kv_norm(latents)
        k_rope = self.rope(k_rope, offset=num_cached)  # one RoPE key shared by all heads
        if kv_cache is not None:
            latents, k_rope = kv_cache.update(latents, k_rope)
            # latents: (b, num_tokens_kv, kv_lora_rank); k_rope: (b, num_tokens_kv, rope)
        num_tokens_kv = latents.shape[1]
        allowed = bottom_right_causal_mask(num_tokens, num_tokens_kv, device=x.device)
        # allowed: (num_tokens, num_tokens_kv), True = may attend; new queries at the bottom
        w_uk, w_uv = self.absorbed_weights()
        if absorb:
            # Map each head's query into the latent space: q_nope W_UK[h].
            q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)
            # q_latent: (b, num_heads, num_tokens, kv_lora_rank)
            queries = torch.cat([q_latent, q_rope], dim=-1)
            # queries: (b, num_heads, num_tokens, kv_lora_rank + qk_rope_head_dim)
            keys = torch.cat([latents, k_rope], dim=-1).unsqueeze(1)
            # keys: (b, 1, num_tokens_kv, kv_lora_rank + qk_rope_head_dim): one shared head
            values = latents.unsqueeze(1)  # (b, 1, num_tokens_kv, kv_lora_rank)
            latent_context, _ = attention(
                queries, keys.expand(-1, self.num_heads, -1, -1),
                values.expand(-1, self.num_heads, -1, -1), allowed, scale=self.scale,
            )  # (b, num_heads, num_tokens, kv_lora_rank)
            context_vec = torch.einsum("bhnr,hvr->bhnv", latent_context, w_uv)
            # context_vec: (b, num_heads, num_tokens, v_head_dim)
        else:
            k_nope = torch.einsum("bnr,hdr->bhnd", latents, w_uk)
            # k_nope: (b, num_heads, num_tokens_kv, qk_nope_head_dim)
            values = torch.einsum("bnr,hvr->bhnv", latents, w_uv)
            # values: (b, num_heads, num_tokens_kv, v_head_dim)
            k_rope_heads = k_rope.unsqueeze(1).expand(-1, self.num_heads, -1, -1)
            # k_rope_heads: (b, num_heads, num_tokens_kv, qk_rope_head_dim), shared
            queries = torch.cat([q_nope, q_rope], dim=-1)  # (b, num_heads, num_tokens, qk_hd)
            keys = torch.cat([k_nope, k_rope_heads], dim=-1)  # (b, num_heads, N_kv, qk_hd)
            context_vec, _ = attention(queries, keys, values, allowed, scale=self.scale)
            # context_vec: (b, num_heads, num_tokens, v_head_dim)
        context_vec = context_vec.transpose(1, 2).reshape(
            b, num_tokens, self.num_heads * self.v_head_dim
        )  # (b, num_tokens, num_heads * v_head_dim)
        return self.out_proj(context_vec)  # (b, num_tokens, d_in)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"q_lora_rank={self.q_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}"
            + (f", rope_scaling={self.rope.scaling}"
               if self.rope.scaling["rope_type"] != "default" else "")
        )
