"""A tiny decoder-only transformer built from the course's own parts.

Chapter 10 trains it on the CPU in seconds and watches its attention weights
take shape. Every piece is one the course has built: token embeddings, a
positional encoding from :mod:`attnlib.positional`, and blocks of causal
:class:`attnlib.MultiHeadAttention`, each added to the *residual stream*:

.. code-block:: text

    x = tok_emb(idx) + position                      # the residual stream
    for each block:
        x = x + attn(LayerNorm(x))                    # pre-LayerNorm attention
        x = x + mlp(LayerNorm(x))                     # only if d_ff is given
    logits = out_head(LayerNorm(x))                   # unembedding

Without the MLP (``d_ff=None``, the default) the model is *attention-only*: all
it can do is move information between positions, which is what chapter 10
wants to watch. Another token mixing goes in by passing a module or a factory
as ``attention`` (:mod:`attnlib.variants`). :meth:`TinyTransformer.generate`
continues a prompt greedily, with or without one cache per block, each made
by its block's attention (``new_cache()``, an :class:`attnlib.kv_cache.Cache`).

Shape legend used in every docstring here:

* ``batch``: sequences processed together.
* ``num_tokens``: tokens in each sequence, at most ``context_length``.
* ``vocab_size``: number of distinct token ids, ``0 .. vocab_size - 1``.
* ``d_model``: size of the residual stream (every token's vector).
* ``num_heads``: attention heads per block; ``head_dim = d_model // num_heads``.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

from ._validation import check_bool, check_dropout, check_positive_int, type_name
from .gqa import GroupedQueryAttention
from .kv_cache import Cache, KVCache
from .multihead import MultiHeadAttention
from .positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
)
from .variants import AttentionFactory, SharedKVAttention

__all__ = [
    "POSITIONAL_CHOICES",
    "TransformerBlock",
    "TinyTransformer",
]

#: The values :class:`TinyTransformer` accepts for ``positional``.
POSITIONAL_CHOICES = ("learned", "sinusoidal", "rope")


def _label(attention: object) -> str:
    """A name for ``attention`` (a module or a factory) in messages and reprs."""
    if isinstance(attention, nn.Module):
        return type(attention).__name__
    return str(getattr(attention, "__name__", type(attention).__name__))


class TransformerBlock(nn.Module):
    """One pre-LayerNorm block: causal attention, then an optional MLP.

    ``forward(x)`` returns ``x + attn(norm_1(x))``, then, when the block has an
    MLP, adds ``mlp(norm_2(...))`` the same way. Each sub-layer reads a
    normalised copy of the residual stream and *adds* its output to it, so a
    block that has learned nothing yet passes its input on almost unchanged.

    Args:
        d_model: size of the residual stream (the attention's ``d_in`` and
            ``d_out``).
        context_length: the most tokens a sequence may have.
        num_heads: attention heads; must divide ``d_model``.
        d_ff: keyword-only; hidden size of the MLP ``Linear(d_model, d_ff) ->
            GELU -> Linear(d_ff, d_model)``. Default None: no MLP (an
            attention-only block).
        dropout: keyword-only; dropout on the attention weights, in ``[0, 1)``.
            Default 0.0.
        rope: keyword-only; rotate each head's queries and keys by their
            positions (RoPE). Default ``False``.
        attention: keyword-only; the token mixing: None (default: causal
            multi-head attention, as below), an ``nn.Module`` used as it is, or a
            factory called as ``attention(d_model, context_length, num_heads)``
            (:data:`attnlib.variants.AttentionFactory`, e.g.
            :class:`attnlib.variants.LinearAttention`). Its ``forward(x,
            return_weights=False, *, kv_cache=None)`` maps ``(batch, num_tokens,
            d_model)`` to the same shape; ``dropout`` and ``rope`` configure only
            the default attention, so they must stay off with another.

    Attributes:
        norm_1: ``nn.LayerNorm(d_model)`` before the attention.
        attn: the attention: by default an :class:`attnlib.MultiHeadAttention`,
            or with ``rope=True`` an :class:`attnlib.GroupedQueryAttention` with
            ``num_kv_groups = num_heads`` (that is, multi-head attention) and
            ``rope=True``.
        norm_2, mlp: ``nn.LayerNorm(d_model)`` and the MLP, or None for both.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_model)``, float.
        - Output: the same shape.

    Raises:
        TypeError: a size is not an int, ``dropout`` is not a float, ``rope``
            is not a bool, or ``attention`` is neither a module nor callable.
        ValueError: a size is not positive, ``d_model`` is not divisible by
            ``num_heads``, ``dropout`` is outside ``[0, 1)``, with
            ``rope=True`` the head size ``d_model // num_heads`` is odd, or
            ``attention`` is given with ``dropout`` or ``rope``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.1
    (residual connections around each sub-layer); Xiong et al. (2020), "On
    Layer Normalization in the Transformer Architecture", section 3 (the
    pre-LN placement used by GPT-2 and here).
    """

    def __init__(
        self,
        d_model: int,
        context_length: int,
        num_heads: int,
        *,
        d_ff: int | None = None,
        dropout: float = 0.0,
        rope: bool = False,
        attention: torch.nn.Module | AttentionFactory | None = None,
    ) -> None:
        check_positive_int("d_model", d_model)
        check_positive_int("context_length", context_length)
        check_positive_int("num_heads", num_heads)
        if d_ff is not None:
            check_positive_int("d_ff", d_ff)
        check_dropout(dropout)
        check_bool("rope", rope)
        if attention is not None and not callable(attention):
            raise TypeError(
                f"attention must be an nn.Module, a factory (d_model, context_length, "
                f"num_heads) -> nn.Module, or None, got {type_name(attention)}"
            )
        if attention is not None and (rope or dropout != 0):
            raise ValueError(
                "dropout and rope configure the default attention: with attention="
                f"{_label(attention)!r} they must stay off, got dropout={dropout}, rope={rope}"
            )
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        if rope and (d_model // num_heads) % 2 != 0:
            raise ValueError(
                f"RoPE rotates pairs of features, so head_dim = d_model // num_heads = "
                f"{d_model // num_heads} must be even (d_model={d_model}, num_heads={num_heads})"
            )
        super().__init__()
        self.d_model = d_model
        self.d_ff = d_ff
        self.norm_1 = nn.LayerNorm(d_model)
        self.attn: nn.Module
        if isinstance(attention, nn.Module):
            self.attn = attention
        elif attention is not None:
            self.attn = attention(d_model, context_length, num_heads)
        elif rope:
            self.attn = GroupedQueryAttention(
                d_model, d_model, context_length, dropout, num_heads, num_heads, rope=True
            )
        else:
            self.attn = MultiHeadAttention(d_model, d_model, context_length, dropout, num_heads)
        self.norm_2: nn.LayerNorm | None
        self.mlp: nn.Sequential | None
        if d_ff is None:
            self.norm_2 = None
            self.mlp = None
        else:
            self.norm_2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
            )

    def new_cache(self) -> Cache | None:
        """The attention's empty cache (``attn.new_cache()``); None for an attention
        that keeps nothing of its own (a KV-sharing consumer)."""
        make = getattr(self.attn, "new_cache", None)
        if make is None:  # a module without new_cache keeps keys and values
            return KVCache()
        cache = make()
        if cache is not None and not isinstance(cache, Cache):
            raise TypeError(f"{type_name(self.attn)}.new_cache() must return an "
                            f"attnlib.kv_cache.Cache or None, got {type_name(cache)}")
        return cache

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        *,
        kv_cache: Cache | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the block on the residual stream ``x``.

        Args:
            x: ``(batch, num_tokens, d_model)``.
            return_weights: also return the attention weights, computed on
                :class:`attnlib.MultiHeadAttention`'s readable path. Default
                ``False``.
            kv_cache: keyword-only; this block's cache (:meth:`new_cache`),
                passed to the attention (``x`` then holds only the new tokens).
                Default None.

        Returns:
            ``(batch, num_tokens, d_model)``; with ``return_weights=True``, the
            pair ``(x, attn_weights)`` with ``attn_weights`` of shape
            ``(batch, num_heads, num_tokens, num_cached + num_tokens)``
            (``num_cached = 0`` without a cache): the weights the attention
            applied.

        Raises:
            TypeError, ValueError: as :meth:`attnlib.MultiHeadAttention.forward`
                for a wrong ``x``, ``return_weights`` or ``kv_cache``.
        """
        check_bool("return_weights", return_weights)
        if return_weights:
            attn_out, attn_weights = self.attn(
                self.norm_1(x), return_weights=True, kv_cache=kv_cache
            )
        else:
            attn_out = self.attn(self.norm_1(x), kv_cache=kv_cache)
        x = x + attn_out  # (batch, num_tokens, d_model)
        if self.mlp is not None and self.norm_2 is not None:
            x = x + self.mlp(self.norm_2(x))  # (batch, num_tokens, d_model)
        if return_weights:
            return x, attn_weights
        return x

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"


class TinyTransformer(nn.Module):
    """A small decoder-only (GPT-style) language model for toy tasks.

    Token ids go in; for every position come out the logits of the next token.
    The model is causal: the logits at position ``t`` depend only on tokens
    ``0 .. t``. With ``d_ff=None`` (the default) it is attention-only.

    Args:
        vocab_size: number of token ids.
        context_length: the most tokens a sequence may have.
        d_model: size of the residual stream.
        num_heads: attention heads per block; must divide ``d_model``.
        num_layers: number of blocks.
        d_ff: keyword-only; the MLP's hidden size in every block, or None
            (default) for an attention-only model.
        positional: keyword-only; ``"learned"`` (default: one trained vector
            per position, :class:`attnlib.positional.LearnedPositionalEmbedding`)
            or ``"sinusoidal"`` (the fixed table of
            :class:`attnlib.positional.SinusoidalPositionalEncoding`), added to
            the token embeddings; or ``"rope"``: nothing is added, and every
            attention layer rotates its queries and keys instead
            (:class:`attnlib.positional.RotaryPositionalEmbedding`), so the
            scores depend only on relative positions.
        dropout: keyword-only; dropout on the attention weights. Default 0.0.
        kv_sharing: keyword-only; number of consecutive blocks that use one
            set of keys and values (cross-layer KV sharing). Default 1: every
            block has its own, the model as before. With ``kv_sharing=2``,
            blocks 0, 2, 4, ... compute keys and values
            (:class:`~attnlib.variants.SharedKVAttention` producers) and blocks 1, 3, 5, ...
            reuse them from the producer's cache, so the KV cache halves. Needs
            ``dropout=0`` and does not return attention weights.
        attention: keyword-only; what mixes the tokens in every block: None
            (default: causal multi-head attention), or a factory called once
            per block as ``attention(d_model, context_length, num_heads)``
            (:data:`~attnlib.variants.AttentionFactory`: e.g.
            :class:`~attnlib.variants.LinearAttention`,
            :class:`~attnlib.variants.TopKAttention`,
            :func:`~attnlib.variants.latent_attention_layer`,
            :func:`~attnlib.variants.gated_deltanet_layer`). Another attention
            needs ``kv_sharing=1``, ``dropout=0`` and a positional other than
            ``"rope"``; the variants return no attention weights, and each
            decodes with its own cache.

    Attributes:
        tok_emb: ``nn.Embedding(vocab_size, d_model)``.
        pos_emb: the positional module, or None with ``positional="rope"``.
        blocks: ``nn.ModuleList`` of ``num_layers`` :class:`TransformerBlock`.
        final_norm: ``nn.LayerNorm(d_model)``.
        out_head: the unembedding, ``nn.Linear(d_model, vocab_size, bias=False)``.

    Raises:
        TypeError: a size is not an int, ``d_ff`` is not an int or None,
            ``positional`` is not a str, ``dropout`` is not a float, or
            ``attention`` is not a factory (a module, a string or another
            object).
        ValueError: a size is not positive, ``d_model`` is not divisible by
            ``num_heads``, ``positional`` is not one of
            :data:`POSITIONAL_CHOICES`, ``dropout`` is outside ``[0, 1)``, or
            with ``positional="rope"`` the head size is odd; ``kv_sharing`` is
            not positive, or above 1 with ``dropout > 0``; ``attention`` is
            given together with ``kv_sharing > 1``, ``dropout > 0`` or
            ``positional="rope"``.

    Source: Radford et al. (2019), "Language Models are Unsupervised Multitask
    Learners", section 2.3 (GPT-2: a decoder-only transformer with layer
    normalisation at the input of each sub-block and after the last block);
    Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits"
    (attention-only models and the residual stream); Su et al. (2021),
    "RoFormer", section 3.4 (RoPE); Brandon et al. (2024), "Reducing
    Transformer Key-Value Cache Size with Cross-Layer Attention", section 2
    (``kv_sharing``).
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        *,
        d_ff: int | None = None,
        positional: str = "learned",
        dropout: float = 0.0,
        kv_sharing: int = 1,
        attention: AttentionFactory | None = None,
    ) -> None:
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("kv_sharing", kv_sharing)
        if attention is not None and (
            isinstance(attention, (nn.Module, str)) or not callable(attention)
        ):
            raise TypeError(
                "attention must be a factory called as attention(d_model, context_length, "
                "num_heads), one module per block (e.g. attnlib.variants.LinearAttention), "
                f"or None, got {type_name(attention)} attention={attention!r}"
            )
        if attention is not None and (kv_sharing > 1 or dropout != 0 or positional == "rope"):
            raise ValueError(
                f"attention={_label(attention)!r} needs kv_sharing=1, dropout=0 and positional "
                f"'learned' or 'sinusoidal', got kv_sharing={kv_sharing}, dropout={dropout}, "
                f"positional={positional!r}"
            )
        if kv_sharing > 1 and dropout != 0:
            raise ValueError(
                f"kv_sharing={kv_sharing} needs dropout=0 (the shared layers have no "
                f"dropout), got dropout={dropout}"
            )
        check_positive_int("context_length", context_length)
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_layers", num_layers)
        if not isinstance(positional, str):
            raise TypeError(f"positional must be a str, got {type_name(positional)}")
        if positional not in POSITIONAL_CHOICES:
            raise ValueError(
                f"positional must be one of {POSITIONAL_CHOICES}, got positional={positional!r}"
            )
        check_dropout(dropout)  # d_ff, the head size and RoPE's: checked by every block
        rope = positional == "rope"
        super().__init__()
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.positional = positional
        self.kv_sharing = int(kv_sharing)
        #: "softmax" for the default attention, else the factory's name (for reprs)
        self.attention = "softmax" if attention is None else _label(attention)
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb: LearnedPositionalEmbedding | SinusoidalPositionalEncoding | None
        if positional == "learned":
            self.pos_emb = LearnedPositionalEmbedding(context_length, d_model)
        elif positional == "sinusoidal":
            self.pos_emb = SinusoidalPositionalEncoding(d_model, context_length)
        else:
            self.pos_emb = None
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model, context_length, num_heads, d_ff=d_ff, dropout=dropout, rope=rope,
                attention=attention,
            ) if self.kv_sharing == 1 else TransformerBlock(
                d_model, context_length, num_heads, d_ff=d_ff,
                attention=SharedKVAttention(  # producers of keys and values, and consumers
                    d_model, context_length, num_heads, makes_kv=i % self.kv_sharing == 0,
                    rope=rope,
                ),
            )
            for i in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)

    def new_caches(self) -> list[Cache]:
        """One empty cache per block (each block's ``new_cache()``), for
        :meth:`forward`'s ``kv_caches``; a block that keeps nothing of its own (a
        KV-sharing consumer) gets the cache of the block below it."""
        caches: list[Cache] = []
        for block in self.blocks:
            cache = cast(TransformerBlock, block).new_cache()
            if cache is None and not caches:
                raise ValueError("the first block has no cache of its own to share")
            caches.append(caches[-1] if cache is None else cache)
        return caches

    def _num_cached(self, kv_caches: object, num_tokens: int) -> int:
        if kv_caches is None:
            return 0
        if not isinstance(kv_caches, (list, tuple)) or not all(
            isinstance(c, Cache) for c in kv_caches
        ):
            raise TypeError(
                "kv_caches must be a list of caches, one per block (model.new_caches()), "
                f"got {type_name(kv_caches)}"
            )
        if len(kv_caches) != self.num_layers:
            raise ValueError(
                f"kv_caches has {len(kv_caches)} caches, but the model has "
                f"num_layers={self.num_layers}: pass one per block"
            )
        counts = {c.num_tokens for c in kv_caches}  # a shared cache counts once
        if len(counts) != 1:
            raise ValueError(f"the caches in kv_caches hold different numbers of tokens: {counts}")
        num_cached = counts.pop()
        if num_cached + num_tokens > self.context_length:
            raise ValueError(
                f"the caches hold {num_cached} tokens and idx adds num_tokens={num_tokens}: "
                f"{num_cached + num_tokens} tokens exceed context_length={self.context_length}"
            )
        return num_cached

    def _add_positions(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """``x`` plus the positional vectors of positions ``start .. start + num_tokens - 1``."""
        if self.positional == "rope":  # the attention layers rotate queries and keys
            return x
        positions = torch.arange(start, start + x.shape[1], device=x.device)  # (num_tokens,)
        if isinstance(self.pos_emb, LearnedPositionalEmbedding):
            table = self.pos_emb.embedding(positions)  # (num_tokens, d_model)
        else:
            assert self.pos_emb is not None  # "learned" or "sinusoidal", checked in __init__
            encoding = self.pos_emb.encoding
            assert isinstance(encoding, torch.Tensor)  # a registered buffer
            table = encoding[positions].to(x.dtype)  # (num_tokens, d_model)
        return x + table  # (batch, num_tokens, d_model)

    def _check_idx(self, idx: object) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a torch.Tensor of token ids, got {type_name(idx)}")
        if idx.dtype != torch.long:
            raise TypeError(f"idx must have dtype torch.int64 (token ids), got {idx.dtype}")
        if idx.ndim != 2:
            raise ValueError(
                f"idx must be (batch, num_tokens), got {idx.ndim}-D shape {tuple(idx.shape)}"
            )
        num_tokens = idx.shape[1]
        if num_tokens == 0 or idx.shape[0] == 0:
            raise ValueError(f"idx must hold at least one token, got shape {tuple(idx.shape)}")
        if num_tokens > self.context_length:
            raise ValueError(
                f"num_tokens={num_tokens} exceeds context_length={self.context_length}"
            )
        device = self.tok_emb.weight.device
        if idx.device != device:
            raise ValueError(
                f"idx is on {idx.device} but the model is on {device}: "
                f"move one, e.g. idx.to('{device}')"
            )
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"idx holds token id {bad}, outside 0 .. vocab_size - 1 = {self.vocab_size - 1}"
            )

    def forward(
        self,
        idx: torch.Tensor,
        return_weights: bool = False,
        *,
        kv_caches: list[Cache] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Next-token logits for every position of ``idx``.

        Args:
            idx: token ids, int64 ``(batch, num_tokens)``, each in
                ``0 .. vocab_size - 1``, with ``num_tokens <= context_length``.
            return_weights: also return every layer's attention weights,
                computed on :class:`attnlib.MultiHeadAttention`'s readable path
                (the weights the attention applied). Default ``False``: the
                fused fast path.
            kv_caches: keyword-only; one cache per block (:meth:`new_caches`),
                all holding the same ``num_cached``
                earlier tokens. ``idx`` then holds only the *new* tokens, at
                positions ``num_cached ..``; their keys and values are appended
                to the caches. Default None: ``idx`` is the whole sequence.

        Returns:
            ``logits``: ``(batch, num_tokens, vocab_size)``; ``logits[:, t]``
            scores the token that follows the sequence up to ``idx[:, t]``.
            With ``return_weights=True``, the pair ``(logits, attn_weights)``
            where ``attn_weights`` is a list with one
            ``(batch, num_heads, num_tokens, num_cached + num_tokens)`` tensor
            per layer (``num_cached = 0`` without caches).

        Raises:
            TypeError: ``idx`` is not an int64 tensor, ``return_weights`` is
                not a bool, or ``kv_caches`` is not a list of caches.
            ValueError: ``idx`` is not 2-D or is empty, has more than
                ``context_length`` tokens (cached ones included), holds an id
                outside the vocabulary, or is on another device than the
                model; ``kv_caches`` does not have one cache per block, or its
                caches hold different numbers of tokens.
        """
        self._check_idx(idx)
        check_bool("return_weights", return_weights)
        num_cached = self._num_cached(kv_caches, idx.shape[1])
        x = self._add_positions(self.tok_emb(idx), num_cached)  # (batch, num_tokens, d_model)
        caches: list[Cache] | list[None] = [None] * self.num_layers
        if kv_caches is not None:
            caches = kv_caches
        elif self.kv_sharing > 1:  # the consumers read the producers' caches
            caches = self.new_caches()
        all_weights = []
        for block, cache in zip(self.blocks, caches, strict=True):
            if return_weights:
                x, attn_weights = block(x, return_weights=True, kv_cache=cache)
                all_weights.append(attn_weights)  # (batch, num_heads, num_tokens, N_kv)
            else:
                x = block(x, kv_cache=cache)
        logits = self.out_head(self.final_norm(x))  # (batch, num_tokens, vocab_size)
        if return_weights:
            return logits, all_weights
        return logits

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True
    ) -> torch.Tensor:
        """Continue ``idx`` greedily (the most likely next token), one token at a time.

        Without a cache every step runs the model on the whole sequence so
        far; with one (the default) the prompt runs once and every later step
        runs only the newest token, whose queries attend to the cached keys
        and values. Both give the same tokens. Run it in ``eval()`` mode for
        deterministic output (dropout is active in training mode).

        Args:
            idx: the prompt, int64 ``(batch, num_tokens)``.
            max_new_tokens: tokens to add; ``num_tokens + max_new_tokens`` must
                not exceed ``context_length``.
            use_cache: keyword-only; decode with one cache per block
                (:meth:`new_caches`). Default ``True``.

        Returns:
            int64 ``(batch, num_tokens + max_new_tokens)``: the prompt followed
            by the generated tokens.

        Raises:
            TypeError: ``idx`` is not an int64 tensor, ``max_new_tokens`` is
                not an int, or ``use_cache`` is not a bool.
            ValueError: as :meth:`forward` for ``idx``; ``max_new_tokens`` is
                not positive, or the result would exceed ``context_length``.

        Source: incremental decoding with cached keys and values, Shazeer
        (2019), "Fast Transformer Decoding: One Write-Head is All You Need",
        section 2.4; greedy choice of the next token.
        """
        self._check_idx(idx)
        check_positive_int("max_new_tokens", max_new_tokens)
        check_bool("use_cache", use_cache)
        total = idx.shape[1] + max_new_tokens
        if total > self.context_length:
            raise ValueError(
                f"num_tokens={idx.shape[1]} + max_new_tokens={max_new_tokens} = {total} "
                f"exceeds context_length={self.context_length}"
            )
        caches = self.new_caches() if use_cache else None
        logits = self(idx, kv_caches=caches)  # (batch, num_tokens, vocab_size)
        out = idx
        for step in range(max_new_tokens):
            next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (batch, 1)
            out = torch.cat((out, next_token), dim=1)  # (batch, num_tokens + step + 1)
            if step == max_new_tokens - 1:
                break
            if use_cache:
                logits = self(next_token, kv_caches=caches)  # (batch, 1, vocab_size)
            else:
                logits = self(out)  # (batch, num_tokens + step + 1, vocab_size)
        return out

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, context_length={self.context_length}, "
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_layers={self.num_layers}, positional={self.positional!r}"
            + (f", kv_sharing={self.kv_sharing}" if self.kv_sharing > 1 else "")
            + (f", attention={self.attention!r}" if self.attention != "softmax" else "")
        )
