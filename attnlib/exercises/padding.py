"""Checkers for padding masks and cross-attention (issue 18, section 5).

* :func:`check_padding_mask` - ``fn(key_padding_mask, causal)`` turns a
  ``(batch, num_tokens)`` key-padding mask (True where a key is padding,
  torch's meaning) into attnlib's attention mask (True where a query may
  attend), combined with the causal mask when asked.
* :func:`check_cross_attention` - ``fn(x, context, W_query, W_key, W_value,
  key_padding_mask)``: single-head cross-attention, queries from ``x``, keys
  and values from ``context``, padded context keys hidden.

Both run seeded probes and name the usual mistakes by computing each one:
the padding's polarity flipped, padded queries (rows) masked instead of
padded keys (columns), a causal mask on cross-attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    judge,
    passed,
    require_callable,
    require_tensor,
    seeded_randn,
)

__all__ = ["check_padding_mask", "check_cross_attention"]

_CPU = torch.device("cpu")


def _padding(lengths: list[int], num_tokens: int, *, left: bool = False) -> torch.Tensor:
    """``(batch, num_tokens)`` bool, True at the padding after each length (before it, left)."""
    positions = torch.arange(num_tokens)[None, :]
    lengths_ = torch.tensor(lengths)[:, None]
    return positions < num_tokens - lengths_ if left else positions >= lengths_


def _mask(padding: torch.Tensor, causal: bool, *, keys: bool = True, queries: bool = False,
          flip_padding: bool = False) -> torch.Tensor:
    """An attention mask ``(batch, 1, N, N)``, True = may attend, built right or wrong."""
    n = padding.shape[-1]
    real = padding if flip_padding else ~padding  # (batch, N), True = a real token
    allowed = torch.ones(padding.shape[0], 1, n, n, dtype=torch.bool)
    if keys:
        allowed = allowed & real[:, None, None, :]  # hide padded keys: columns
    if queries:
        allowed = allowed & real[:, None, :, None]  # hide padded queries: rows
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    return allowed


def _wrong_masks(padding: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    right = _mask(padding, causal)
    wrong = {
        "uses the padding mask's polarity as attnlib's: key_padding_mask is True where a key "
        "is PADDING (torch's meaning), attnlib's masks are True where a query MAY attend, so "
        "invert it: keep = ~key_padding_mask.": _mask(padding, causal, flip_padding=True),
        "hides the padded QUERIES (rows) instead of the padded KEYS (columns): a padded token "
        "must not be looked at, so index the padding over the last dimension, "
        "~key_padding_mask[:, None, None, :].": _mask(padding, causal, keys=False, queries=True),
        "hides the padded queries (rows) as well as the padded keys: only the keys need "
        "hiding; a padded query's row is ignored later (and a row with no key at all gives "
        "nan in a softmax).": _mask(padding, causal, queries=True),
        "returns torch's polarity (True where attention is BLOCKED): the result must be True "
        "where a query may attend, as attnlib's masks are.": ~right,
        "ignores the padding: the padded keys are still visible.":
            _mask(padding, causal, keys=False),
    }
    if causal:
        wrong["has no causal mask, though causal=True: combine the padding with "
              "torch.tril(...) (&)."] = _mask(padding, False)
    else:
        wrong["applies a causal mask, though causal=False: only the padding is hidden then."] = (
            _mask(padding, True))
    return wrong


@checker
def check_padding_mask(fn: Callable[[torch.Tensor, bool], torch.Tensor]) -> bool:
    """Check a function that turns a key-padding mask into an attention mask.

    ``fn(key_padding_mask, causal)``: ``key_padding_mask`` is a ``(batch,
    num_tokens)`` bool tensor, **True where a key is padding** (the meaning of
    the keyword in ``torch.nn.MultiheadAttention`` and attnlib's multi-head
    classes); ``causal`` a bool. It must return a bool mask ``(batch, 1,
    num_tokens, num_tokens)`` (or ``(batch, num_tokens, num_tokens)``), **True
    where a query may attend** (attnlib's convention): padded keys hidden from
    every query, and with ``causal=True`` the future too.

    Probes: 3 sequences of 5 tokens, lengths 5, 3 and 1, left-padded with
    ``causal=True``, right-padded with ``causal=False``.

    Recognised wrong answers: the padding's polarity flipped (the padding
    mask used as "may attend"), padded queries (rows) masked instead of padded
    keys (columns), rows and columns both masked, the result in torch's
    polarity (True = blocked), the padding ignored, the causal mask missing
    or applied with ``causal=False``; a non-tensor, a non-bool or a wrongly
    shaped result is named as such.

    Returns:
        True, after printing one line, if the function is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns something
            else; the message names the likely mistake.

    Source: the ``key_padding_mask`` of :class:`torch.nn.MultiheadAttention`;
    Vaswani et al. (2017), section 3.2.3 (masking).
    """
    require_callable(fn, "your padding-mask function")
    what = answer_name(fn, "fn")
    for causal in (True, False):
        padding = _padding([5, 3, 1], 5, left=causal)
        side = "left" if causal else "right"
        out = call_answer(fn, padding.clone(), causal, what=what)
        if isinstance(out, torch.Tensor) and out.ndim == 3:
            out = out[:, None]  # (batch, N, N) -> (batch, 1, N, N)
        out = require_tensor(out, f"{what}(key_padding_mask, causal={causal})", (3, 1, 5, 5))
        if out.dtype != torch.bool:
            raise CheckFailed(
                f"{what} returned a {out.dtype} mask; expected bool, True where a query may "
                "attend (an additive float mask is another convention)."
            )
        judge(out.double(), _mask(padding, causal).double(),
              {k: v.double() for k, v in _wrong_masks(padding, causal).items()}, what,
              f"key_padding_mask for lengths 5, 3, 1 (of 5, {side}-padded) and causal={causal}",
              reference="the right mask")
    return passed(f"{what} hides the padded keys (columns), with the causal mask when asked.")


def _cross_attention(x: torch.Tensor, context: torch.Tensor, weights: list[torch.Tensor],
                     padding: torch.Tensor, *, causal: bool = False, kv_from_x: bool = False,
                     flip_padding: bool = False, mask_queries: bool = False,
                     no_padding: bool = False, swap: bool = False) -> torch.Tensor:
    """Single-head cross-attention ``(batch, N_q, d_out)``, right or with one mistake."""
    W_query, W_key, W_value = weights
    if swap:  # queries from the context, keys and values from x
        x, context = context, x
    source = x if kv_from_x else context
    queries, keys, values = x @ W_query, source @ W_key, source @ W_value
    attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5  # (b, N_q, N_kv)
    if not no_padding:
        hide = ~padding if flip_padding else padding  # (b, N_kv), True = hide
        hide = hide[:, :, None] if mask_queries else hide[:, None, :]
        attn_scores = attn_scores.masked_fill(hide, float("-inf"))
    if causal:
        n_q, n_kv = attn_scores.shape[-2:]
        future = ~torch.ones(n_q, n_kv, dtype=torch.bool).tril()
        attn_scores = attn_scores.masked_fill(future, float("-inf"))
    return torch.softmax(attn_scores, dim=-1) @ values


@checker
def check_cross_attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check single-head cross-attention with a key-padding mask on the context.

    ``fn(x, context, W_query, W_key, W_value, key_padding_mask)``: ``x``
    ``(batch, num_tokens, d_in)`` gives the queries, ``context`` ``(batch,
    num_tokens_kv, d_in)`` the keys and values (``x @ W_query``,
    ``context @ W_key``, ``context @ W_value``, each weight ``(d_in,
    d_out)``); ``key_padding_mask`` ``(batch, num_tokens_kv)`` is True where
    a context token is padding. It returns the context vectors ``(batch,
    num_tokens, d_out)``: scores scaled by ``1/sqrt(d_out)``, padded keys
    hidden, softmax over the keys, **no causal mask** (every query may see
    the whole context).

    Probes (float64, seeded): 4 queries against 4 context tokens, then 3
    against 6, every context row with some padding and some real tokens.

    Recognised wrong answers: a causal mask on cross-attention, keys and
    values from ``x`` instead of the context, the padding's polarity flipped,
    padded queries (rows) masked instead of padded keys (columns), the
    padding ignored, queries taken from the context (output of the wrong
    length).

    Returns:
        True, after printing one line, if the function is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or computes something
            else; the message names the likely mistake.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.3
    (encoder-decoder attention); :class:`torch.nn.MultiheadAttention`.
    """
    require_callable(fn, "your cross-attention function")
    what = answer_name(fn, "fn")
    generator = torch.Generator().manual_seed(2025)
    d_in, d_out = 5, 4
    weights = [seeded_randn(generator, d_in, d_out, device=_CPU) for _ in range(3)]
    for n_q, n_kv, lengths in ((4, 4, [3, 2]), (3, 6, [4, 1])):
        x = seeded_randn(generator, 2, n_q, d_in, device=_CPU)
        context = seeded_randn(generator, 2, n_kv, d_in, device=_CPU)
        padding = _padding(lengths, n_kv)
        out = call_answer(fn, x.clone(), context.clone(), *[w.clone() for w in weights],
                          padding.clone(), what=what)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (2, n_kv, d_out) != (
                2, n_q, d_out):
            raise CheckFailed(
                f"{what} returned shape {tuple(out.shape)}, one row per CONTEXT token: the "
                "queries must come from x (one row per query) and the keys and values from "
                "the context."
            )
        out = require_tensor(out, what, (2, n_q, d_out))
        args = (x, context, weights, padding)
        wrong = {
            "applies a causal mask: in cross-attention every query may see every token of "
            "the context (its positions are not the queries'), so no causal mask.":
                _cross_attention(*args, causal=True),
            "flips the padding's polarity: key_padding_mask is True where a key is PADDING, "
            "so fill the scores with -inf where it is True (masked_fill(key_padding_mask"
            "[:, None, :], -inf)), not where it is False.":
                _cross_attention(*args, flip_padding=True),
            "ignores key_padding_mask: the padded context tokens still get weight.":
                _cross_attention(*args, no_padding=True),
        }
        if n_q == n_kv:  # shapes that let these mistakes run
            wrong["takes the keys and values from x: in cross-attention they come from the "
                  "context (context @ W_key, context @ W_value); only the queries come from "
                  "x."] = _cross_attention(*args, kv_from_x=True)
            wrong["masks the padded QUERIES (rows) instead of the padded KEYS (columns): the "
                  "padding belongs to the context's tokens, the last dimension of the scores, "
                  "so index it as key_padding_mask[:, None, :]."] = _cross_attention(
                      *args, mask_queries=True)
            wrong["takes the queries from the context and the keys and values from x: the "
                  "other way round (with a context of another length the output would have "
                  "one row per context token)."] = _cross_attention(*args, swap=True)
        judge(out, _cross_attention(*args), wrong, what,
              f"{n_q} queries and {n_kv} context tokens, context lengths {lengths}",
              reference="cross-attention",
              advice="Check each step: queries from x, keys and values from the context, "
                     "scores / sqrt(d_out), -inf at padded keys, softmax over dim=-1.")
    return passed(f"{what} computes cross-attention: queries from x, keys and values from the "
                  "context, padded context tokens hidden, no causal mask.")
