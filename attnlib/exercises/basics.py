"""Checkers for the basics of chapters 1 and 2: softmax, simplified attention,
the query/key/value projections, and scaled dot-product attention.

Every checker probes the learner's answer with seeded float64 inputs whose sizes
all differ (so a swapped dimension cannot pass by accident), compares the result
with attnlib's reference, and, where it differs, with the typical wrong answers,
so that the message can name the mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .._validation import type_name
from ..functional import scaled_dot_product_attention as _reference_sdpa
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

__all__ = [
    "check_softmax",
    "check_simplified_attention",
    "check_qkv_projection",
    "check_scaled_dot_product_attention",
]

_DTYPE = torch.float64


def _sentence(failure: CheckFailed) -> str:
    """The failure's message, ending with a full stop (torch's errors end without one)."""
    text = str(failure).rstrip()
    return text if text.endswith(".") else text + "."


# ---------------------------------------------------------------------------------------
# softmax


def _softmax_wrong_answers(x: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """The typical wrong softmaxes of ``x`` along ``dim``, each keyed by its message."""
    asked = dim
    dim = dim % x.ndim
    last = x.ndim - 1
    wrong: dict[str, torch.Tensor] = {}
    if dim != last:
        wrong[
            f"ignores its dim argument: called with dim={asked} it normalised the last "
            "dimension instead. Pass dim on to every max/amax and sum (with keepdim=True)"
        ] = torch.softmax(x, dim=-1)
    for other in range(x.ndim):
        if other == dim or (other == last and dim != last):  # the last: "ignores dim"
            continue
        wrong[
            f"normalises over the wrong dimension: over dim {other} instead of dim={asked}, "
            f"so out.sum(dim={other}) is all ones and out.sum(dim={asked}) is not"
        ] = torch.softmax(x, dim=other)
    wrong[
        "is not normalised: it returns exp(x), whose entries do not sum to 1 along dim. "
        "Divide by the sum of the exponentials along dim"
    ] = torch.exp(x)
    shifted = torch.exp(x - x.amax(dim=dim, keepdim=True))
    wrong[
        "is not normalised: it returns exp(x - max) without dividing by its sum along dim, "
        "so the entries do not sum to 1"
    ] = shifted
    wrong[
        "returns the log-softmax (every entry <= 0): that is log(softmax(x)). Return the "
        "softmax itself"
    ] = torch.log_softmax(x, dim=dim)
    exp_x = torch.exp(x)
    wrong[
        "overflows: it is the naive softmax exp(x) / exp(x).sum(), and exp(1000) is inf "
        "even in float64, so inf / inf = nan. Subtract the maximum along dim before "
        "exponentiating (see the stable softmax of Chapter 1)"
    ] = exp_x / exp_x.sum(dim=dim, keepdim=True)
    global_shift = torch.exp(x - x.max())
    wrong[
        "subtracts the maximum of the whole tensor instead of the maximum along dim: a "
        "slice whose entries all lie far below the global maximum underflows to "
        "0 / 0 = nan. Use x.amax(dim=dim, keepdim=True)"
    ] = global_shift / global_shift.sum(dim=dim, keepdim=True)
    min_shift = torch.exp(x - x.amin(dim=dim, keepdim=True))
    wrong[
        "subtracts the minimum along dim instead of the maximum: every exponent is then "
        ">= 0, and exp overflows (inf / inf = nan) once a slice's entries lie more than "
        "about 709 apart. Subtract the maximum, so that every exponent is <= 0"
    ] = min_shift / min_shift.sum(dim=dim, keepdim=True)
    mean_shift = torch.exp(x - x.mean(dim=dim, keepdim=True))
    wrong[
        "subtracts the mean along dim instead of the maximum: an entry more than about 709 "
        "above its slice's mean still overflows exp (inf / inf = nan). Subtract the "
        "maximum, so that every exponent is <= 0"
    ] = mean_shift / mean_shift.sum(dim=dim, keepdim=True)
    wrong[
        "divides by the sum over the whole tensor instead of the sum along dim, so no "
        "slice sums to 1. Use .sum(dim=dim, keepdim=True)"
    ] = shifted / shifted.sum()
    return wrong


def _softmax_error_hint(message: str) -> str:
    """A hint for the torch errors that a typical softmax mistake raises, or ''."""
    if "must match the size of tensor" in message:
        return (" A reduction along dim, such as x.amax(dim=dim) or exp_x.sum(dim=dim), "
                "drops that dimension, so the result no longer lines up with x; pass "
                "keepdim=True to keep it as a dimension of size 1, which broadcasts.")
    if "torch.return_types" in message:
        return (" x.max(dim=dim) returns a pair (values, indices): take its .values, or "
                "use x.amax(dim=dim, keepdim=True).")
    return ""


@checker
def check_softmax(fn: Callable[..., torch.Tensor], *,
                  device: torch.device | str | None = None) -> bool:
    """Check a learner's softmax ``fn(x, dim=-1)`` against :func:`torch.softmax`.

    The probes are float64 tensors of shapes ``(4, 7)``, ``(3, 5, 6)`` and
    ``(2, 6)``, normalised along ``dim=-1``, ``dim=0``, ``dim=1`` and
    ``dim=-2``; two rows far apart (entries near +1000 and near -1000), which a
    naive or a globally shifted softmax cannot survive; and a ``(3, 5)`` tensor
    whose rows run from about -2000 up to about 0, which overflows a softmax
    shifted by the minimum or the mean instead of the maximum.

    Recognised mistakes: the naive softmax that overflows (nan on large
    inputs); normalising over the wrong dimension; ignoring ``dim``; no
    normalisation (plain ``exp``); dividing by the sum of the whole tensor;
    subtracting the global maximum, or the minimum or mean along ``dim``,
    instead of the maximum along ``dim``; returning the log-softmax; changing
    ``x`` in place. A reduction without ``keepdim=True`` and ``x.max(dim)``
    used without ``.values`` raise torch errors, which the message explains.

    Args:
        fn: the learner's function, always called as ``fn(x, dim=d)``;
            it must return a tensor of ``x``'s shape and dtype.
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

    Source: the softmax function, e.g. Goodfellow, Bengio and Courville (2016),
    *Deep Learning*, eq. (6.29); the max shift of their section 4.1.
    """
    require_callable(fn, "a softmax function fn(x, dim=-1)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    gen = torch.Generator().manual_seed(2017)
    small = seeded_randn(gen, 4, 7, device=device, scale=2.0)
    cube = seeded_randn(gen, 3, 5, 6, device=device, scale=2.0)
    far_apart = torch.cat([seeded_randn(gen, 1, 6, device=device, scale=3.0, shift=1000.0),
                           seeded_randn(gen, 1, 6, device=device, scale=3.0, shift=-1000.0)])
    # each row runs from about -2000 up to about 0: a shift by the row's minimum or
    # mean leaves exponents far above 709, where exp overflows even in float64
    spread = torch.linspace(-2000.0, 0.0, 5, dtype=_DTYPE).to(device)
    wide = seeded_randn(gen, 3, 5, device=device, scale=3.0) + spread
    probes = [  # (x, dim, description)
        (small, -1, "a (4, 7) tensor with dim=-1"),
        (small, 0, "a (4, 7) tensor with dim=0"),
        (cube, 1, "a (3, 5, 6) tensor with dim=1"),
        (cube, -2, "a (3, 5, 6) tensor with dim=-2"),
        (cube, -1, "a (3, 5, 6) tensor with dim=-1"),
        (far_apart, -1, "a (2, 6) tensor whose rows lie near +1000 and near -1000"),
        (far_apart.T.contiguous(), 0,
         "a (6, 2) tensor whose columns lie near +1000 and near -1000, with dim=0"),
        (wide, -1, "a (3, 5) tensor whose rows run from about -2000 up to about 0"),
    ]
    for x, dim, probe in probes:
        before = x.clone()
        what = f"{name}(x, dim={dim})"
        try:
            out = call_answer(fn, x, dim=dim, what=what)
        except CheckFailed as failure:
            hint = _softmax_error_hint(str(failure))
            if not hint:
                raise
            raise CheckFailed(f"{_sentence(failure)}{hint}") from failure.__cause__
        require_unchanged(what, [before], [x], ["x"])
        require_tensor(out, what, tuple(x.shape), dtype=_DTYPE, device=device)
        judge(out, torch.softmax(x, dim=dim), _softmax_wrong_answers(x, dim), what, probe)
    return passed(
        f"{name} matches torch.softmax along any dim, even for huge scores."
    )


# ---------------------------------------------------------------------------------------
# simplified attention (chapter 1)


def _simplified_wrong_answers(x: torch.Tensor) -> dict[str, torch.Tensor]:
    attn_scores = x @ x.transpose(-2, -1)
    d_in = x.shape[-1]
    exp_scores = torch.exp(attn_scores)
    return {
        f"scales the scores by 1/sqrt(d_in) = 1/sqrt({d_in}): simplified attention has no "
        "scale; the scale arrives with trainable queries and keys in Chapter 2":
            torch.softmax(attn_scores / math.sqrt(d_in), dim=-1) @ x,
        "uses the transposed weights: the softmax ran over the wrong dimension (dim=0, so "
        "the columns sum to 1), which for the symmetric scores X X^T is the same as "
        "computing A^T X instead of A X, A being the attention weights. Use "
        "torch.softmax(attn_scores, dim=-1)":
            torch.softmax(attn_scores, dim=0) @ x,
        "skips the softmax: it mixes the inputs with the raw scores X X^T, whose rows do not "
        "sum to 1":
            attn_scores @ x,
        "normalises by dividing the scores by their row sum instead of using the softmax":
            (attn_scores / attn_scores.sum(dim=-1, keepdim=True)) @ x,
        "overflows: its softmax is the naive exp(s) / exp(s).sum(), which gives nan for "
        "large scores. Use a stable softmax (subtract the row maximum) or torch.softmax":
            (exp_scores / exp_scores.sum(dim=-1, keepdim=True)) @ x,
        **{
            f"computes the scores as x.T @ x, shape (d_in, d_in) = ({d_in}, {d_in}), which "
            "compares the embedding dimensions with each other instead of the tokens, and "
            f"then mixes with x @ weights{where}. The scores are x @ x.T, shape "
            "(num_tokens, num_tokens), one per pair of tokens":
                x @ torch.softmax(x.transpose(-2, -1) @ x, dim=dim)
            for dim, where in ((-1, ""), (0, " (softmax over dim=0)"))
        },
    }


@checker
def check_simplified_attention(fn: Callable[[torch.Tensor], torch.Tensor], *,
                               device: torch.device | str | None = None) -> bool:
    """Check a learner's ``fn(x)`` that returns Chapter 1's context vectors.

    The reference is ``softmax(x @ x^T, dim=-1) @ x``, with no scale: the
    context vectors of :func:`attnlib.simplified_attention`. Probes: float64
    inputs ``(num_tokens, d_in)`` of shapes ``(5, 3)`` and ``(4, 7)``, and a
    ``(4, 3)`` input with large entries whose scores overflow a naive softmax.

    Recognised mistakes: returning the attention weights (or both tensors);
    softmax over the wrong dimension, which for these symmetric scores is the
    same as the transposed weights ``A^T X``; scaling by ``1/sqrt(d_in)``;
    no softmax; dividing by the row sum; a naive softmax that overflows; the
    scores computed as ``x.T @ x`` (dimensions compared instead of tokens).

    Args:
        fn: the learner's function, called as ``fn(x)`` with ``x`` of shape
            ``(num_tokens, d_in)``; it must return ``(num_tokens, d_in)``.
        device: where to probe; default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: the answer is not a function, raises, returns the wrong
            shape or dtype, or computes something else, named where typical.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1,
    with the query, key and value projections taken to be the identity.
    """
    require_callable(fn, "a function fn(x) that returns the context vectors")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    what = f"{name}(x)"
    gen = torch.Generator().manual_seed(2014)
    probes = [
        (seeded_randn(gen, 5, 3, device=device), "x of shape (5, 3)"),
        (seeded_randn(gen, 4, 7, device=device), "x of shape (4, 7)"),
        (seeded_randn(gen, 4, 3, device=device, scale=25.0),
         "x of shape (4, 3) with entries of size about 25, whose scores reach the thousands"),
    ]
    for x, probe in probes:
        before = x.clone()
        out = call_answer(fn, x, what=what)
        require_unchanged(what, [before], [x], ["x"])
        num_tokens, d_in = x.shape
        attn_weights = torch.softmax(x @ x.T, dim=-1)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (num_tokens, num_tokens):
            if is_close(out, attn_weights):
                raise CheckFailed(
                    f"{what} returns the attention weights, shape (num_tokens, num_tokens) = "
                    f"{tuple(out.shape)}; return the context vectors attn_weights @ x, shape "
                    f"(num_tokens, d_in) = {(num_tokens, d_in)} (seen on {probe})."
                )
        require_tensor(out, what, (num_tokens, d_in), dtype=_DTYPE, device=device)
        judge(out, attn_weights @ x, _simplified_wrong_answers(x), what, probe)
    return passed(
        f"{name} returns softmax(X X^T) X, also for large scores."
    )


# ---------------------------------------------------------------------------------------
# query, key and value projections (chapter 2)


def _call_projection(fn: Callable[..., Any], x: torch.Tensor,
                     matrices: dict[str, torch.Tensor], what: str, probe: str) -> Any:
    """``fn(x, W_query, W_key, W_value)`` on one probe: the three results, after
    naming a shape error, a changed argument or a result that is not three tensors."""
    before = [x.clone(), *(w.clone() for w in matrices.values())]
    try:
        out = call_answer(fn, x, *matrices.values(), what=what)
    except CheckFailed as failure:
        if x.ndim == 3:  # the 2-d probe passed
            raise CheckFailed(
                f"{_sentence(failure)} It works without a batch dimension but not on {probe}. "
                "Does your code use x.T? On a 3-d tensor .T reverses every dimension; x @ W "
                "needs no transpose and works on any number of leading dimensions."
            ) from None
        if "cannot be multiplied" in str(failure):
            (d_in, d_k), d_v = matrices["W_query"].shape, matrices["W_value"].shape[-1]
            raise CheckFailed(
                f"{failure} (seen on {probe}, with W_query and W_key of shape "
                f"(d_in, d_k) = {(d_in, d_k)} and W_value of shape (d_in, d_v) = "
                f"{(d_in, d_v)}). Each matrix has one row per input dimension, so "
                "x @ W_query needs no transpose. (torch.nn.Linear stores its weight "
                "the other way round, as (d_out, d_in), and computes x @ weight.T.)"
            ) from failure.__cause__
        raise
    require_unchanged(what, before, [x, *matrices.values()], ["x", *matrices])
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise CheckFailed(
            f"{what} returned {type_name(out)}"
            + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
            + "; expected a tuple of three tensors: (queries, keys, values)."
        )
    return out


def _judge_projection(result: object, w_name: str, projections: dict[str, torch.Tensor],
                      where: str, probe: str, device: torch.device) -> None:
    """One of the three results must be ``projections[w_name]``; name how it is not."""
    expected = projections[w_name]
    x_ndim = expected.ndim
    if isinstance(result, torch.Tensor) and x_ndim == 2 and is_close(result, expected.T):
        raise CheckFailed(
            f"{where} are transposed: shape {tuple(result.shape)}, which is "
            f"W^T x^T = (x @ {w_name})^T. With one row per token, compute x @ {w_name}, "
            f"shape (num_tokens, {expected.shape[-1]}) (seen on {probe})."
        )
    if isinstance(result, torch.Tensor) and tuple(result.shape) != tuple(expected.shape):
        if x_ndim == 3:
            raise CheckFailed(
                f"{where} have shape {tuple(result.shape)}, expected "
                f"{tuple(expected.shape)} = (batch, num_tokens, {expected.shape[-1]}). Does "
                "your code use x.T? On a batch, .T reverses every dimension; x @ W "
                f"already works on any number of leading dimensions (seen on {probe})."
            )
        mixed_up = [other for other, p in projections.items()
                    if tuple(p.shape) == tuple(result.shape) and is_close(result, p)]
        if mixed_up:
            raise CheckFailed(
                f"{where} are x @ {mixed_up[0]}, expected x @ {w_name}: a matrix is "
                "used for the wrong role, or the results are returned in the wrong "
                f"order; return (queries, keys, values) (seen on {probe})."
            )
    result = require_tensor(result, where, tuple(expected.shape), dtype=_DTYPE, device=device)
    wrong = {
        f"are x @ {other}, expected x @ {w_name}: a matrix is used for the wrong role, "
        "or the results are returned in the wrong order; return "
        "(queries, keys, values)": projections[other]
        for other in projections if other != w_name
    }
    judge(result, expected, wrong, where, probe)


@checker
def check_qkv_projection(fn: Callable[..., Any], *,
                         device: torch.device | str | None = None) -> bool:
    """Check ``fn(x, W_query, W_key, W_value)`` that returns ``(queries, keys, values)``.

    The reference is ``(x @ W_query, x @ W_key, x @ W_value)``. Probes: float64
    inputs ``x`` of shape ``(num_tokens, d_in) = (5, 3)`` and ``(batch,
    num_tokens, d_in) = (2, 5, 3)``, with ``W_query`` and ``W_key`` of shape
    ``(d_in, d_k) = (3, 4)`` and ``W_value`` of shape ``(d_in, d_v) = (3, 2)``.

    Recognised mistakes: a matrix used for the wrong role (for instance the keys
    computed with ``W_query``) or the results returned in the wrong order; the
    transposed product ``W^T x^T``; a missing batch dimension (``x.T``); a
    transposed matrix (``x @ W_query.T``), whose shape error the message explains.

    Args:
        fn: the learner's function; it must return a tuple of three tensors.
        device: where to probe; default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: the answer is not a function, raises, returns something
            other than three tensors of the right shapes, or the wrong ones.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (the projections), written with row vectors as in PyTorch.
    """
    require_callable(fn, "a function fn(x, W_query, W_key, W_value)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    what = f"{name}(x, W_query, W_key, W_value)"
    gen = torch.Generator().manual_seed(1706)
    d_in, d_k, d_v = 3, 4, 2
    matrices = {
        "W_query": seeded_randn(gen, d_in, d_k, device=device),
        "W_key": seeded_randn(gen, d_in, d_k, device=device),
        "W_value": seeded_randn(gen, d_in, d_v, device=device),
    }
    probes = [
        (seeded_randn(gen, 5, d_in, device=device), "x of shape (num_tokens, d_in) = (5, 3)"),
        (seeded_randn(gen, 2, 5, d_in, device=device),
         "x of shape (batch, num_tokens, d_in) = (2, 5, 3)"),
    ]
    for x, probe in probes:
        out = _call_projection(fn, x, matrices, what, probe)
        projections = {w_name: x @ w for w_name, w in matrices.items()}
        for role, w_name, result in zip(("queries", "keys", "values"), matrices, out,
                                        strict=True):
            _judge_projection(result, w_name, projections, f"the {role} returned by {what}",
                              probe, device)
    return passed(
        f"{name} returns x @ W_query, x @ W_key, x @ W_value, also for a batch."
    )


# ---------------------------------------------------------------------------------------
# scaled dot-product attention (chapter 2)


def _sdpa_wrong_answers(query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor) -> dict[str, torch.Tensor]:
    d_k, d_v = query.shape[-1], value.shape[-1]
    scores = query @ key.transpose(-2, -1)  # (..., num_tokens_q, num_tokens_kv)
    scaled = scores / math.sqrt(d_k)
    wrong = {
        "does not scale the scores: divide query @ key^T by sqrt(d_k), the size of each "
        "query and key vector":
            torch.softmax(scores, dim=-1) @ value,
        f"scales by 1/sqrt(d_v) = 1/sqrt({d_v}), the size of the values; the scale is "
        f"1/sqrt(d_k) = 1/sqrt({d_k}), d_k being the size of the queries and keys "
        "(query.shape[-1])":
            torch.softmax(scores / math.sqrt(d_v), dim=-1) @ value,
        f"scales by 1/d_k = 1/{d_k} instead of 1/sqrt(d_k) = 1/sqrt({d_k})":
            torch.softmax(scores / d_k, dim=-1) @ value,
        f"multiplies the scores by sqrt(d_k) = sqrt({d_k}) instead of dividing by it":
            torch.softmax(scores * math.sqrt(d_k), dim=-1) @ value,
        "scales after the softmax: it divides the weights (or the context vectors) by "
        "sqrt(d_k), so the weights no longer sum to 1. Divide the scores, before the "
        "softmax":
            torch.softmax(scores, dim=-1) @ value / math.sqrt(d_k),
    }
    wrong[
        f"divides by 2 * d_k = {2 * d_k}, not by sqrt(d_k) = {math.sqrt(d_k):.4g}: "
        "`scores / d_k**1/2` is read as (scores / d_k**1) / 2, since ** binds tighter than "
        "/. Write scores / d_k**0.5 or scores / math.sqrt(d_k)"
    ] = torch.softmax(scores / d_k / 2, dim=-1) @ value
    if d_k / 2 != math.sqrt(d_k):  # equal at d_k = 4
        wrong[
            f"divides by d_k**1/2, which Python reads as (d_k**1)/2 = d_k/2 = {d_k / 2:g}, "
            f"not sqrt(d_k) = {math.sqrt(d_k):.4g}: ** binds tighter than /. Write "
            "d_k**0.5 or math.sqrt(d_k)"
        ] = torch.softmax(scores / (d_k / 2), dim=-1) @ value
    other_sizes = ({"num_tokens": query.shape[-2]} if query.shape[-2] == key.shape[-2]
                   else {"num_tokens_q": query.shape[-2], "num_tokens_kv": key.shape[-2]})
    if query.ndim > 2:
        other_sizes["batch"] = query.shape[0]
    for label, size in other_sizes.items():
        if size in (d_k, d_v):  # the same numbers as a scale named above
            continue
        wrong[
            f"scales by 1/sqrt({label}) = 1/sqrt({size}) instead of 1/sqrt(d_k) = "
            f"1/sqrt({d_k}): read d_k from the last dimension, query.shape[-1] (with a "
            "batch in front, shape[0] is the batch size and shape[1] the number of tokens)"
        ] = torch.softmax(scores / math.sqrt(size), dim=-1) @ value
    if query.shape[-2] == key.shape[-2]:  # square: a transpose still fits the shapes
        wrong[
            "uses transposed weights: the weights that reach the values are the transpose "
            "of softmax(query @ key^T / sqrt(d_k), dim=-1). Check the order of query and "
            "key in the scores and that nothing transposes the weights"
        ] = torch.softmax(scaled, dim=-1).transpose(-2, -1) @ value
        wrong[
            "uses transposed scores: key @ query^T instead of query @ key^T, so row i "
            "holds key i's dot products with every query"
        ] = torch.softmax(scaled.transpose(-2, -1), dim=-1) @ value
    wrong[
        "normalises over the wrong dimension: the softmax must run over the keys, the last "
        "dimension (dim=-1), so that each query's weights sum to 1"
    ] = torch.softmax(scaled, dim=-2) @ value
    exp_scores = torch.exp(scaled)
    wrong[
        "overflows: its softmax is the naive exp(s) / exp(s).sum(), which gives nan when "
        "scores are large. Subtract the row maximum first, or use torch.softmax"
    ] = (exp_scores / exp_scores.sum(dim=-1, keepdim=True)) @ value
    return wrong


@checker
def check_scaled_dot_product_attention(fn: Callable[..., torch.Tensor], *,
                                       device: torch.device | str | None = None) -> bool:
    """Check a learner's ``fn(query, key, value)`` that returns the context vectors.

    The reference is :func:`attnlib.scaled_dot_product_attention` (no mask, no
    dropout): ``softmax(query @ key^T / sqrt(d_k), dim=-1) @ value``. Probes,
    all float64 with ``d_k != d_v``:

    * ``(num_tokens, d)``: query ``(5, 4)``, key ``(5, 4)``, value ``(5, 3)``
      (square, so that a transposed answer still fits the shapes);
    * a batch: query ``(2, 4, 5)``, key ``(2, 6, 5)``, value ``(2, 6, 3)``
      (``num_tokens_q != num_tokens_kv``);
    * large scores: query and key with entries of about 40, so that
      ``query @ key^T / sqrt(d_k)`` is far above 710, where ``exp`` overflows.

    Recognised mistakes: scores not scaled; scaled by ``sqrt(d_v)``, by
    ``d_k``, by ``d_k**1/2`` written either way (``scores / (d_k**1/2)`` divides
    by ``d_k / 2``, ``scores / d_k**1/2`` by ``2 * d_k``) or by the square root of the
    number of tokens or of the batch size instead of ``sqrt(d_k)``; multiplied
    by ``sqrt(d_k)``; the scale applied after the softmax; softmax over the
    wrong dimension
    (over the queries); transposed weights or transposed scores; returning the
    weights (or both tensors); a naive softmax that overflows; ``key.T`` on a
    batch.

    Args:
        fn: the learner's function, called as ``fn(query, key, value)``.
        device: where to probe; default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: the answer is not a function, raises, returns the wrong
            shape or dtype, or computes something else, named where typical.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1).
    """
    require_callable(fn, "a function fn(query, key, value)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    what = f"{name}(query, key, value)"
    gen = torch.Generator().manual_seed(1762)
    probes = [
        ((5, 4), (5, 4), (5, 3), 1.0,
         "query (5, 4), key (5, 4), value (5, 3): num_tokens = 5, d_k = 4, d_v = 3"),
        ((2, 4, 5), (2, 6, 5), (2, 6, 3), 1.0,
         "a batch: query (2, 4, 5), key (2, 6, 5), value (2, 6, 3): batch = 2, "
         "num_tokens_q = 4, num_tokens_kv = 6, d_k = 5, d_v = 3"),
        ((2, 3, 4), (2, 5, 4), (2, 5, 2), 40.0,
         "large scores: query (2, 3, 4) and key (2, 5, 4) with entries of about 40, "
         "value (2, 5, 2)"),
    ]
    passed_2d = False
    for q_shape, k_shape, v_shape, size, probe in probes:
        query = seeded_randn(gen, *q_shape, device=device, scale=size)
        key = seeded_randn(gen, *k_shape, device=device, scale=size)
        value = seeded_randn(gen, *v_shape, device=device)
        before = [query.clone(), key.clone(), value.clone()]
        try:
            out = call_answer(fn, query, key, value, what=what)
        except CheckFailed as failure:
            if passed_2d and query.ndim == 3:
                raise CheckFailed(
                    f"{_sentence(failure)} It works without a batch dimension but not on "
                    f"{probe}. "
                    "Does your code use key.T? On a 3-d tensor .T reverses every dimension; "
                    "use key.transpose(-2, -1), which swaps only the last two."
                ) from None
            raise
        require_unchanged(what, before, [query, key, value], ["query", "key", "value"])
        context_vec, attn_weights = _reference_sdpa(query, key, value, return_weights=True)
        if isinstance(out, torch.Tensor) and out.shape == attn_weights.shape:
            if is_close(out, attn_weights):
                raise CheckFailed(
                    f"{what} returns the attention weights, shape (..., num_tokens_q, "
                    f"num_tokens_kv) = {tuple(out.shape)}; return the context vectors "
                    f"attn_weights @ value, shape {tuple(context_vec.shape)} (seen on {probe})."
                )
        require_tensor(out, what, tuple(context_vec.shape), dtype=_DTYPE, device=device)
        judge(out, context_vec, _sdpa_wrong_answers(query, key, value), what, probe)
        passed_2d = True
    return passed(
        f"{name} computes softmax(Q K^T / sqrt(d_k)) V, also for a batch."
    )
