"""Checkers for chapter 3, "Why scale by sqrt(d_k)": the scaled scores, and the
gradient of the attention weights that reaches the query.

Both probe the learner's function with seeded float64 inputs whose sizes all
differ (batch 2, 3 queries, 4 keys, d_k = 5), so that a size taken from the
wrong dimension cannot pass by accident, and name each typical mistake by
computing it and comparing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    judge,
    passed,
    probe_device,
    require_callable,
    require_tensor,
    require_unchanged,
    seeded_randn,
)

__all__ = ["check_scaled_scores", "check_query_jacobian"]

_DTYPE = torch.float64
_BATCH, _NUM_QUERIES, _NUM_KEYS, _D_K = 2, 3, 4, 5  # all different on purpose

_BATCH_HINT = (
    "It works on a single input but not on a batch: does it use .T, torch.diag or "
    "torch.outer? On a 3-D tensor .T reverses every dimension; use "
    "x.transpose(-2, -1) (or x.mT), torch.diag_embed, and "
    "w.unsqueeze(-1) * w.unsqueeze(-2) for outer products, which all work on "
    "any number of leading dimensions."
)


def _call_batched(fn: Callable[..., Any], args: tuple[Any, ...], what: str,
                  passed_unbatched: bool) -> Any:
    """Call ``fn`` on a batched probe; if it raises after the unbatched probe
    passed, say that batching is the likely problem."""
    try:
        return call_answer(fn, *args, what=what)
    except CheckFailed as failure:
        if passed_unbatched and "NotImplementedError" not in str(failure):
            raise CheckFailed(f"{str(failure).rstrip('.')}. {_BATCH_HINT}") from None
        raise


# ---------------------------------------------------------------------------------------
# scaled scores


def _scaled_scores_wrong_answers(query: torch.Tensor,
                                 key: torch.Tensor) -> dict[str, torch.Tensor]:
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1)  # (..., num_queries, num_keys)
    wrong = {
        f"does not scale the scores: divide query @ key^T by sqrt(d_k) = sqrt({d_k}), "
        "the size of each query and key vector":
            scores,
        f"divides by d_k = {d_k} instead of sqrt(d_k) = sqrt({d_k}): the variance of the "
        "scores then falls like 1/d_k instead of staying at 1":
            scores / d_k,
        f"multiplies by sqrt(d_k) = sqrt({d_k}) instead of dividing by it":
            scores * math.sqrt(d_k),
        "applies the softmax: return the scaled scores, before any softmax":
            torch.softmax(scores / math.sqrt(d_k), dim=-1),
        # `** 1/2` binds as `(d_k ** 1) / 2`: the two ways it usually appears.
        f"divides by d_k / 2 = {d_k / 2:g}, not by sqrt(d_k): `d_k ** 1/2` is read as "
        "(d_k ** 1) / 2, since ** binds tighter than /. Write d_k ** 0.5 or math.sqrt(d_k)":
            scores / (d_k / 2),
        f"divides by 2 * d_k = {2 * d_k}, not by sqrt(d_k): `scores / d_k ** 1/2` is read "
        "as (scores / d_k) / 2, since ** binds tighter than /. Write "
        "scores / d_k ** 0.5 or scores / math.sqrt(d_k)":
            scores / d_k / 2,
    }
    # The scale taken from the wrong dimension (the size of something else).
    sizes = {
        "the number of keys, key.shape[-2]": key.shape[-2],
        "the number of queries, query.shape[-2]": query.shape[-2],
    }
    if query.ndim == 3:
        sizes["the batch size, shape[0] of a batched query or key"] = query.shape[0]
    for size_name, size in sizes.items():
        wrong[
            f"divides by sqrt({size}), the square root of {size_name}; d_k is the size of "
            "each query and key vector, query.shape[-1]"
        ] = scores / math.sqrt(size)
    return wrong


@checker
def check_scaled_scores(fn: Callable[..., torch.Tensor], *,
                        device: torch.device | str | None = None) -> bool:
    """Check ``fn(query, key)`` that returns the scaled attention scores.

    The reference is ``query @ key^T / sqrt(d_k)``, with ``d_k =
    query.shape[-1]``: the scores before the softmax. Probes: float64
    ``query`` of shape ``(num_queries, d_k) = (3, 5)`` with ``key`` of shape
    ``(num_keys, d_k) = (4, 5)``, then ``(batch, 3, 5)`` with ``(batch, 4, 5)``
    for batch 2.

    Recognised mistakes: no scale; dividing by ``d_k`` instead of
    ``sqrt(d_k)``; multiplying by ``sqrt(d_k)``; ``d_k ** 1/2`` (which is
    ``d_k / 2``), written either way; the square root of the wrong
    size (the number of keys or queries, or the batch size, as when ``d_k`` is
    read from ``key.shape[0]`` or ``query.shape[1]``); transposed scores
    (``key @ query^T``); the softmax applied; code that works on one sequence
    but not on a batch (``key.T``); changing an argument in place.

    Args:
        fn: the learner's function, called as ``fn(query, key)``; it must return
            a tensor of shape ``(..., num_queries, num_keys)`` and ``query``'s dtype.
        device: where to probe (``"cuda"`` to check the answer on a GPU);
            default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: the answer is not a function, raises, returns the wrong
            shape or dtype, or computes something else; the message names the
            mistake where it is a typical one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1,
    eq. (1) and footnote 4.
    """
    require_callable(fn, "a function fn(query, key) that returns the scaled scores")
    device = probe_device(device)
    name = answer_name(fn, "your function")
    what = f"{name}(query, key)"
    gen = torch.Generator().manual_seed(1706)
    probes = [
        (seeded_randn(gen, _NUM_QUERIES, _D_K, device=device),
         seeded_randn(gen, _NUM_KEYS, _D_K, device=device),
         "query (3, 5) and key (4, 5): 3 queries, 4 keys, d_k = 5"),
        (seeded_randn(gen, _BATCH, _NUM_QUERIES, _D_K, device=device),
         seeded_randn(gen, _BATCH, _NUM_KEYS, _D_K, device=device),
         "a batch: query (2, 3, 5) and key (2, 4, 5)"),
    ]
    passed_unbatched = False
    for query, key, probe in probes:
        saved = [query.clone(), key.clone()]
        out = _call_batched(fn, (query, key), what, passed_unbatched)
        require_unchanged(what, saved, [query, key], ["query", "key"])
        expected = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
        if (isinstance(out, torch.Tensor) and out.shape == expected.transpose(-2, -1).shape
                and is_close(out, expected.transpose(-2, -1))):
            raise CheckFailed(
                f"{what} returns transposed scores, shape {tuple(out.shape)}: key @ query^T. "
                f"Row i must hold query i's scores against every key: query @ key^T, shape "
                f"{tuple(expected.shape)} (seen on {probe})."
            )
        if (isinstance(out, torch.Tensor) and query.ndim == 3 and passed_unbatched
                and tuple(out.shape) != tuple(expected.shape)):
            raise CheckFailed(
                f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)} "
                f"(seen on {probe}). {_BATCH_HINT}"
            )
        require_tensor(out, what, tuple(expected.shape), dtype=_DTYPE, device=device)
        judge(out, expected, _scaled_scores_wrong_answers(query, key), what, probe)
        passed_unbatched = True
    return passed(
        f"{name} returns query @ key^T / sqrt(d_k), for one sequence and for a batch."
    )


# ---------------------------------------------------------------------------------------
# the gradient that reaches the query


def _softmax_jacobian(w: torch.Tensor) -> torch.Tensor:
    """diag(w) - w w^T for w of shape (..., n): (..., n, n)."""
    return torch.diag_embed(w) - w.unsqueeze(-1) * w.unsqueeze(-2)


def _query_jacobian_wrong_answers(query: torch.Tensor, key: torch.Tensor,
                                  scale: float) -> dict[str, torch.Tensor]:
    scores = (key @ query.unsqueeze(-1)).squeeze(-1)  # (..., num_keys)
    w = torch.softmax(scores * scale, dim=-1)
    jac = _softmax_jacobian(w)  # (..., num_keys, num_keys)
    wrong = {
        f"leaves out the chain-rule factor of the scale: the scores are scale * key @ query, "
        f"so d scores / d query = scale * key, and the result must be multiplied by "
        f"scale = {scale:.4g}":
            jac @ key,
        f"applies the scale twice (scale^2 = {scale**2:.4g}): it enters once, through "
        "d scores / d query = scale * key; the softmax Jacobian itself is evaluated at the "
        "weights, which already include it":
            jac @ key * scale**2,
        "evaluates the softmax Jacobian at the unscaled scores key @ query: the weights are "
        "softmax(scale * key @ query), and J must come from those weights":
            _softmax_jacobian(torch.softmax(scores, dim=-1)) @ key * scale,
        "has the sign of the softmax Jacobian flipped: J = diag(w) - w w^T (its diagonal "
        "w_i (1 - w_i) is positive), not w w^T - diag(w)":
            -(jac @ key) * scale,
        "leaves the outer product out of the softmax Jacobian: J = diag(w) - w w^T, and the "
        "term - w w^T (entries -w_i w_j) is missing":
            torch.diag_embed(w) @ key * scale,
        "keeps only the diagonal of the softmax Jacobian, w_i (1 - w_i): the off-diagonal "
        "entries -w_i w_j are missing":
            torch.diag_embed(w * (1 - w)) @ key * scale,
        "subtracts the inner product w . w = sum_i w_i^2 (a number) instead of the outer "
        "product w w^T (a matrix): use w.unsqueeze(-1) * w.unsqueeze(-2)":
            (torch.diag_embed(w) - (w * w).sum(-1)[..., None, None]) @ key * scale,
        f"divides by scale = {scale:.4g} in the chain rule instead of multiplying by it: "
        "the scores are scale * key @ query, so d scores / d query = scale * key":
            jac @ key / scale,
        f"treats scale = {scale:.4g} as a divisor (scores / scale) instead of a factor: "
        "the weights are softmax(scale * key @ query), and d scores / d query = scale * key":
            _softmax_jacobian(torch.softmax(scores / scale, dim=-1)) @ key / scale,
    }
    if query.ndim >= 2:
        # Only a batch can tell the softmax's dimension apart: one query has one.
        wrong["takes the softmax over the wrong dimension (dim=0, across the batch): each "
              "query's weights must sum to 1 over its keys, the last dimension, dim=-1"] = (
            _softmax_jacobian(torch.softmax(scores * scale, dim=0)) @ key * scale
        )
    return wrong


@checker
def check_query_jacobian(fn: Callable[..., torch.Tensor], *,
                         device: torch.device | str | None = None) -> bool:
    """Check ``fn(query, key, scale)`` that returns ``d attn_weights / d query``.

    For one query ``q`` and its keys ``K``, ``attn_weights = softmax(scale * K q)``
    and, by the chain rule, ``d attn_weights / d q = J K * scale`` with the
    softmax Jacobian ``J = diag(w) - w w^T``: entry ``[..., j, i]`` is
    ``d w_j / d q_i``. Probes: float64 ``query`` of shape ``(d_k,) = (5,)``
    with ``key`` of shape ``(num_keys, d_k) = (4, 5)`` and ``scale =
    1 / sqrt(5)``; then a batch, ``query`` ``(2, 5)`` with ``key`` ``(2, 4, 5)``
    and ``scale = 0.3``; then large scores with ``scale = 1`` (a nearly
    saturated softmax). The reference is checked against autograd in the tests.

    Recognised mistakes: the chain-rule factor ``scale`` left out (the mistake
    that hides how the scale protects the gradient) or applied twice; the
    softmax Jacobian evaluated at the unscaled scores, with its sign flipped,
    without the outer product, with only its diagonal, or with the inner
    product ``w . w`` in place of the outer product; ``scale`` used as a
    divisor, in the chain rule only or everywhere; the softmax taken across the
    batch (``dim=0``); the result transposed
    (``(d_k, num_keys)``); code that works for one query but not a batch
    (``.T``, ``torch.diag``, ``torch.outer``); changing an argument in place.

    Args:
        fn: the learner's function, called as ``fn(query, key, scale)`` with
            ``query`` ``(..., d_k)``, ``key`` ``(..., num_keys, d_k)`` and a
            Python float ``scale``; it must return ``(..., num_keys, d_k)``.
        device: where to probe; default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: the answer is not a function, raises, returns the wrong
            shape or dtype, or computes something else; the message names the
            mistake where it is a typical one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: the softmax derivative (Goodfellow, Bengio and Courville (2016),
    *Deep Learning*, section 6.2.2.3) and the chain rule, applied to
    Vaswani et al. (2017), section 3.2.1.
    """
    require_callable(fn, "a function fn(query, key, scale) that returns d w / d query")
    device = probe_device(device)
    name = answer_name(fn, "your function")
    what = f"{name}(query, key, scale)"
    gen = torch.Generator().manual_seed(4)
    probes = [
        (seeded_randn(gen, _D_K, device=device), seeded_randn(gen, _NUM_KEYS, _D_K, device=device),
         1 / math.sqrt(_D_K), "query (5,), key (4, 5), scale = 1/sqrt(5)"),
        (seeded_randn(gen, _BATCH, _D_K, device=device),
         seeded_randn(gen, _BATCH, _NUM_KEYS, _D_K, device=device),
         0.3, "a batch: query (2, 5), key (2, 4, 5), scale = 0.3"),
        (seeded_randn(gen, _D_K, device=device, scale=2.0),
         seeded_randn(gen, _NUM_KEYS, _D_K, device=device, scale=2.0),
         1.0, "query (5,), key (4, 5) with scores of size about 10 and scale = 1"),
    ]
    passed_unbatched = False
    for query, key, scale, probe in probes:
        saved = [query.clone(), key.clone()]
        out = _call_batched(fn, (query, key, scale), what, passed_unbatched)
        require_unchanged(what, saved, [query, key], ["query", "key"])
        w = torch.softmax((key @ query.unsqueeze(-1)).squeeze(-1) * scale, dim=-1)
        expected = _softmax_jacobian(w) @ key * scale  # (..., num_keys, d_k)
        if (isinstance(out, torch.Tensor) and out.shape == expected.transpose(-2, -1).shape
                and is_close(out, expected.transpose(-2, -1))):
            raise CheckFailed(
                f"{what} returns the transpose, shape {tuple(out.shape)} = (d_k, num_keys): "
                f"row j must be the gradient of weight w_j, so the shape is (num_keys, d_k) "
                f"= {tuple(expected.shape)}. Compute J @ key, not key^T @ J (seen on {probe})."
            )
        if (isinstance(out, torch.Tensor) and query.ndim == 2 and passed_unbatched
                and tuple(out.shape) != tuple(expected.shape)):
            raise CheckFailed(
                f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)} "
                f"(seen on {probe}). {_BATCH_HINT}"
            )
        require_tensor(out, what, tuple(expected.shape), dtype=_DTYPE, device=device)
        judge(out, expected, _query_jacobian_wrong_answers(query, key, scale), what, probe)
        if query.ndim == 1:
            passed_unbatched = True
    return passed(
        f"{name} returns (diag(w) - w w^T) @ key * scale, the gradient of the attention "
        "weights with respect to the query, for one query, a batch, and large scores."
    )
