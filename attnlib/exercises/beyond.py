"""Checkers for chapter 13's exercises: the absorbed MLA query, one step of the
delta rule and the softmax with a sink.

* :func:`check_absorbed_query` - ``fn(q_nope, W_UK)`` maps each head's query
  into the latent space, ``q_nope[b, h, t] @ W_UK[h]``.
* :func:`check_delta_rule_step` - ``fn(state, query, key, value, beta, g)``
  is one token of the gated delta rule (output and new state).
* :func:`check_sink_softmax` - ``fn(attn_scores, sinks)`` is a softmax whose
  denominator has one extra logit per head.

Each calls the answer on several seeded float64 probes (a square one, where a
transposed matrix still runs, and unequal sizes), then compares it with each
typical mistake, written here as a learner would write it: a mistake is named
only when it gives the answer's results on every probe. No message states the
formula; each names the mistake and the chapter's section that shows the step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import type_name
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    max_difference,
    passed,
    require_callable,
    require_tensor,
    require_unchanged,
    same_or_both_nonfinite,
)

__all__ = ["check_absorbed_query", "check_delta_rule_step", "check_sink_softmax"]

_DTYPE = torch.float64

#: A typical mistake: a function with the exercise's signature that computes it.
Mistake = Callable[..., Any]


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=_DTYPE)


def _gives(result: Any, mistake: Mistake, args: Sequence[torch.Tensor]) -> bool:
    """Whether ``mistake(*args)`` reproduces ``result`` (a tensor or a pair of tensors);
    False where the mistake cannot run on these arguments (a shape that does not fit)."""
    try:
        wrong = mistake(*[a.clone() for a in args])
    except (RuntimeError, IndexError, ValueError):
        return False
    if isinstance(result, torch.Tensor):
        return isinstance(wrong, torch.Tensor) and same_or_both_nonfinite(result, wrong)
    return (isinstance(wrong, tuple) and len(wrong) == len(result)
            and all(same_or_both_nonfinite(r, w) for r, w in zip(result, wrong, strict=True)))


def _results(fn: Callable[..., Any], probes: Sequence[Sequence[torch.Tensor]],
             names: Sequence[str], what: str, mistakes: dict[str, Mistake],
             as_result: Callable[[Any], Any], see: str) -> list[Any]:
    """The answer's result on every probe, each passed through ``as_result`` (which
    raises CheckFailed for a result of the wrong type); an argument changed in place is
    a CheckFailed. Where the answer raises on a later probe, a mistake that gives its
    results on the probes before and cannot run on this one either is named instead."""
    results: list[Any] = []
    for args in probes:
        saved = [a.clone() for a in args]
        try:
            result = call_answer(fn, *args, what=what)
        except CheckFailed:
            for message, mistake in mistakes.items():
                if results and all(_gives(r, mistake, a) for r, a in zip(results, probes,
                                                                          strict=False)):
                    try:
                        mistake(*[a.clone() for a in args])
                    except (RuntimeError, IndexError, ValueError):
                        raise CheckFailed(
                            f"{what} {message} (it ran on the earlier probes, whose sizes "
                            f"let it, and raised on {_sizes(args)}). {see}.") from None
            raise
        require_unchanged(what, saved, args, names)
        results.append(as_result(result))
    return results


def _sizes(args: Sequence[torch.Tensor]) -> str:
    return "arguments of shapes " + ", ".join(str(tuple(a.shape)) for a in args)


def _name_mistake(results: Sequence[Any], probes: Sequence[Sequence[torch.Tensor]],
                  mistakes: dict[str, Mistake], what: str, probe: str, see: str) -> None:
    """Raise CheckFailed naming the first mistake that gives ``results`` on every probe."""
    for message, mistake in mistakes.items():
        if all(_gives(r, mistake, a) for r, a in zip(results, probes, strict=True)):
            raise CheckFailed(f"{what} {message} (seen on {probe}). {see}.")


def _first_wrong(results: Sequence[Any], expected: Sequence[Any]) -> int | None:
    """The index of the first probe whose result is not close to the expected one (a
    tensor, or each tensor of a pair), or None when every result is right."""
    for i, (result, right) in enumerate(zip(results, expected, strict=True)):
        pairs = zip(result, right, strict=True) if isinstance(right, tuple) else [(result,
                                                                                  right)]
        if not all(is_close(r, e) for r, e in pairs):
            return i
    return None


def _pair(result: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, new_state)``: a tuple, a list or another sequence of two tensors."""
    if (isinstance(result, torch.Tensor) or not isinstance(result, Sequence)
            or isinstance(result, (str, bytes)) or len(result) != 2
            or not all(isinstance(part, torch.Tensor) for part in result)):
        raise CheckFailed(f"{what} returned {type_name(result)}; expected the pair "
                          "(output, new_state), such as a tuple of two tensors")
    return result[0], result[1]


def _tensor(result: Any, what: str) -> torch.Tensor:
    if not isinstance(result, torch.Tensor):
        raise CheckFailed(f"{what} returned {type_name(result)}; expected a torch.Tensor")
    return result


# ---------------------------------------------------------------------------------------
# the absorbed MLA query


_SEE_MLA = "See 'Multi-head latent attention' in this chapter"


def _absorbed(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)


def _absorbed_mistakes() -> dict[str, Mistake]:
    def head_after_token(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _absorbed(q, w).transpose(1, 2)

    def reshaped(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return head_after_token(q, w).reshape(_absorbed(q, w).shape)

    return {
        "uses W_UK[0] for every head, where head h has its own W_UK[h]":
            lambda q, w: torch.einsum("bhnd,dr->bhnr", q, w[0]),
        "multiplies by each head's W_UK[h] transposed: the query's qk_nope_head_dim "
        "entries meet the rows of W_UK[h], and the result has kv_lora_rank entries":
            lambda q, w: torch.einsum("bhnd,hrd->bhnr", q, w),
        "sums W_UK over the heads, so every head gets the same matrix, where head h has its "
        "own W_UK[h]": lambda q, w: q @ w.sum(0),
        "averages W_UK over the heads, so every head gets the same matrix, where head h has "
        "its own W_UK[h]": lambda q, w: q @ w.mean(0),
        "sums the heads' results: each head keeps its own latent query":
            lambda q, w: _absorbed(q, w).sum(1, keepdim=True).expand(_absorbed(q, w).shape),
        "scales by 1 / sqrt(qk_nope_head_dim): the absorbed query is the plain product, "
        "and attention's scale comes later, with the scores":
            lambda q, w: _absorbed(q, w) / math.sqrt(q.shape[-1]),
        "scales by 1 / sqrt(kv_lora_rank): the absorbed query is the plain product, and "
        "attention's scale comes later, with the scores":
            lambda q, w: _absorbed(q, w) / math.sqrt(w.shape[-1]),
        "returns (batch, num_heads, kv_lora_rank, num_tokens): the last two dimensions "
        "are transposed": lambda q, w: _absorbed(q, w).transpose(-2, -1),
        "puts the heads after the tokens, (batch, num_tokens, num_heads, kv_lora_rank), "
        "where the exercise asks for (batch, num_heads, num_tokens, kv_lora_rank)":
            head_after_token,
        "reshapes (batch, num_tokens, num_heads, kv_lora_rank) into the asked-for shape "
        "instead of transposing it back, which mixes the heads and the tokens": reshaped,
    }


@checker
def check_absorbed_query(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(q_nope, W_UK)``: ``(b, h, n, d_nope)``, ``(h, d_nope, r)`` -> ``(b, h, n, r)``.

    Each head's query is mapped into the latent space by its own ``W_UK[h]``:
    ``einsum("bhnd,hdr->bhnr", q_nope, W_UK)``. The probes are float64: ``q_nope``
    ``(2, 3, 5, 4)`` with a square ``W_UK`` ``(3, 4, 4)``, where a transposed matrix
    still runs, then ``(2, 3, 5, 4)`` with ``(3, 4, 7)`` and ``(1, 2, 3, 6)`` with
    ``(2, 6, 5)``.

    Recognised mistakes: ``W_UK[0]`` for every head; ``W_UK[h]`` transposed;
    ``W_UK`` summed or averaged over the heads; the heads' results summed; a scale
    by ``1/sqrt(d_nope)`` or ``1/sqrt(r)``; the result's last two dimensions
    transposed; the heads after the tokens, transposed or reshaped; an input
    changed in place; a result that is not a tensor or has another shape.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns another shape
            or other values; the message names the mistake where it is a
            typical one.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.2.
    """
    require_callable(fn, "a function fn(q_nope, W_UK)")
    name = answer_name(fn, "fn")
    what = f"{name}(q_nope, W_UK)"
    gen = torch.Generator().manual_seed(13)
    probes = [(_randn(gen, 2, 3, 5, 4), _randn(gen, 3, 4, 4)),
              (_randn(gen, 2, 3, 5, 4), _randn(gen, 3, 4, 7)),
              (_randn(gen, 1, 2, 3, 6), _randn(gen, 2, 6, 5))]
    mistakes = _absorbed_mistakes()
    results = _results(fn, probes, ["q_nope", "W_UK"], what, mistakes,
                       lambda out: _tensor(out, what), _SEE_MLA)
    expected = [_absorbed(*args) for args in probes]
    first = _first_wrong(results, expected)
    if first is None:
        return passed("each head's query is mapped into the latent space by its own W_UK[h]")
    q_nope, w_uk = probes[first]
    probe = (f"q_nope of shape {tuple(q_nope.shape)} and W_UK of shape "
             f"{tuple(w_uk.shape)}")
    _name_mistake(results, probes, mistakes, what, probe, _SEE_MLA)
    require_tensor(results[first], f"{what} on {probe}", tuple(expected[first].shape))
    raise CheckFailed(
        f"{what} differs from the absorbed query by up to "
        f"{max_difference(results[first], expected[first]):.3g} on {probe}, and matches "
        f"none of the typical mistakes this check knows. {_SEE_MLA}, and compare one head "
        "and one token with the product of that query and that head's matrix.")


# ---------------------------------------------------------------------------------------
# one step of the gated delta rule


_SEE_DELTA = "See 'Linear attention and Gated DeltaNet' in this chapter"


def _delta_step(state: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, *,
                decay: str = "exp", recall_from: str = "decayed", recall_with: str = "key",
                correction: str = "v-r", beta_on: str = "difference",
                outer: str = "k,delta", read_from: str = "new", read: str = "S^T q",
                scale: str = "1/sqrt(d)") -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule, right with the defaults, or with one slip.

    The slips: ``decay`` ``"none"``, ``"g"`` (by g itself), ``"exp(-g)"`` or
    ``"after"`` (after the update); ``recall_from="old"`` (before the decay);
    ``recall_with="query"``; ``correction`` ``"r-v"`` (the same as subtracting the
    write) or ``"v"`` (nothing recalled subtracted); ``beta_on`` ``"none"`` or ``"v"``;
    ``outer="delta,k"`` (the outer product transposed); ``read_from`` ``"decayed"``
    or ``"old"``; ``read="S q"``; ``scale`` ``"none"``, ``"1/sqrt(dv)"`` or
    ``"sqrt(d)"``.
    """
    gate = {"exp": g.exp(), "none": torch.ones_like(g), "g": g, "exp(-g)": (-g).exp(),
            "after": torch.ones_like(g)}[decay][..., None, None]
    decayed = state * gate
    source = {"decayed": decayed, "old": state}[recall_from]
    probe = {"key": key, "query": query}[recall_with]
    recalled = (source * probe[..., :, None]).sum(-2)  # S^T k: (b, h, dv)
    difference = {"v-r": value - recalled, "r-v": recalled - value, "v": value}[correction]
    if beta_on == "difference":
        difference = beta[..., None] * difference
    elif beta_on == "v":
        difference = beta[..., None] * value - recalled
    write = (key[..., :, None] * difference[..., None, :] if outer == "k,delta"
             else difference[..., :, None] * key[..., None, :])
    new_state = decayed + write
    if decay == "after":
        new_state = new_state * g.exp()[..., None, None]
    read_state = {"new": new_state, "decayed": decayed, "old": state}[read_from]
    if read == "S^T q":
        output = (read_state * query[..., :, None]).sum(-2)
    else:
        output = (read_state * query[..., None, :]).sum(-1)
    d, dv = key.shape[-1], value.shape[-1]
    factor = {"1/sqrt(d)": 1 / math.sqrt(d), "none": 1.0, "1/sqrt(dv)": 1 / math.sqrt(dv),
              "sqrt(d)": math.sqrt(d)}[scale]
    return output * factor, new_state


def _delta_mistakes() -> dict[str, Mistake]:
    slips: list[tuple[str, dict[str, str]]] = [
        ("never decays the state by the gate", {"decay": "none"}),
        ("decays the state by g itself: g is the log of the decay, at most 0, so the "
         "state's sign flips", {"decay": "g"}),
        ("decays the state by exp(-g): g is already the log of the decay, at most 0, so "
         "the state grows", {"decay": "exp(-g)"}),
        ("decays the state after the update: the new write is decayed too, and the "
         "recall comes from the state before its decay", {"decay": "after"}),
        ("recalls from the state as it came in, before the decay", {"recall_from": "old"}),
        ("recalls with the query: the delta rule reads what the state holds for the new "
         "key", {"recall_with": "query"}),
        ("flips the correction's sign (it writes beta (recalled - value), or subtracts the "
         "write from the state), so the recall moves away from the value",
         {"correction": "r-v"}),
        ("writes beta * value without subtracting what the state recalls: that is (gated) "
         "linear attention, not the delta rule", {"correction": "v"}),
        ("leaves out beta, the writing strength", {"beta_on": "none"}),
        ("multiplies only the value by beta, not the whole difference between the value "
         "and what the state recalls", {"beta_on": "v"}),
        ("adds the outer product the wrong way round, (head_dim_v, head_dim) where the "
         "state is (head_dim, head_dim_v)", {"outer": "delta,k"}),
        ("reads the output from the decayed state before the update: the output reads the "
         "state after this token's write", {"read_from": "decayed"}),
        ("reads the output from the state as it came in, before the decay and the update",
         {"read_from": "old"}),
        ("reads S q instead of S^T q: the query meets the state's key dimension, "
         "head_dim", {"read": "S q"}),
        ("does not scale the output by 1 / sqrt(head_dim)", {"scale": "none"}),
        ("scales the output by 1 / sqrt(head_dim_v), the values' size, where the exercise "
         "asks for the keys' head_dim", {"scale": "1/sqrt(dv)"}),
        ("multiplies the output by sqrt(head_dim) instead of dividing by it",
         {"scale": "sqrt(d)"}),
    ]
    def with_slip(slip: dict[str, str]) -> Mistake:
        return lambda *args: _delta_step(*args, **slip)  # type: ignore[arg-type]

    mistakes: dict[str, Mistake] = {message: with_slip(slip) for message, slip in slips}
    mistakes["returns the state it was given as new_state, not the updated one"] = (
        lambda *args: (_delta_step(*args)[0], args[0]))
    return mistakes


def _delta_probes() -> list[tuple[torch.Tensor, ...]]:
    """(state, query, key, value, beta, g): head_dim = head_dim_v = 4 first, where a
    transposed state still runs, then head_dim 4 and head_dim_v 5, then 3 and 6."""
    gen = torch.Generator().manual_seed(14)
    probes: list[tuple[torch.Tensor, ...]] = []
    for batch, heads, d, dv in ((2, 3, 4, 4), (2, 3, 4, 5), (1, 2, 3, 6)):
        probes.append((
            _randn(gen, batch, heads, d, dv),
            _randn(gen, batch, heads, d),
            F.normalize(_randn(gen, batch, heads, d), dim=-1),
            _randn(gen, batch, heads, dv),
            torch.rand(batch, heads, generator=gen, dtype=_DTYPE) * 0.8 + 0.1,
            -torch.rand(batch, heads, generator=gen, dtype=_DTYPE) - 0.1,
        ))
    return probes


@checker
def check_delta_rule_step(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check ``fn(state, query, key, value, beta, g) -> (output, new_state)``.

    Shapes: ``state (b, h, d, dv)``, ``query``/``key (b, h, d)``, ``value
    (b, h, dv)``, ``beta``/``g (b, h)``; output ``(b, h, dv)``. The state is
    decayed by ``exp(g)``, the recall ``S^T k`` of the decayed state corrected
    towards ``v`` by ``beta``, and the output ``S^T q / sqrt(d)`` read from the
    new state; ``state`` is not changed in place. The result may be a tuple, a
    list or another sequence of the two tensors. The probes are float64, with
    unit-norm keys, ``beta`` in (0.1, 0.9) and ``g`` in (-1.1, -0.1): ``d = dv
    = 4`` first (a transposed state still runs there), then ``d = 4, dv = 5``
    and ``d = 3, dv = 6``.

    Recognised mistakes: no decay, a decay by ``g``, by ``exp(-g)`` or after
    the update; the recall from the undecayed state or with the query; the
    correction's sign flipped (or the write subtracted), or without the recall
    (linear attention); ``beta`` left out or on the value only; the outer product
    transposed; the output read before the update or before the decay, as
    ``S q``, unscaled, scaled by ``1/sqrt(dv)`` or multiplied by ``sqrt(d)``;
    the old state returned; the pair in the wrong order; ``state`` changed in
    place.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than a pair of tensors of the right shapes, or computes something
            else; the message names the mistake where it is a typical one.

    Source: Yang et al. (2024), "Gated Delta Networks", eq. (10).
    """
    require_callable(fn, "a function fn(state, query, key, value, beta, g)")
    name = answer_name(fn, "fn")
    what = f"{name}(state, query, key, value, beta, g)"
    probes = _delta_probes()
    mistakes = _delta_mistakes()
    results = _results(fn, probes, ["state", "query", "key", "value", "beta", "g"], what,
                       mistakes, lambda result: _pair(result, what), _SEE_DELTA)
    expected = [_delta_step(*args) for args in probes]
    first = _first_wrong(results, expected)
    if first is None:
        return passed("decay, recall, correct by beta * (v - recalled), read with the query")
    state, _, _, value = probes[first][:4]
    probe = f"state of shape {tuple(state.shape)} and value of shape {tuple(value.shape)}"
    _name_mistake(results, probes, mistakes, what, probe, _SEE_DELTA)
    out, new_state = results[first]
    right_out, right_new = expected[first]
    if out.shape == right_new.shape and new_state.shape == right_out.shape:
        raise CheckFailed(f"{what} returns (new_state, output): the exercise asks for "
                          "(output, new_state).")
    require_tensor(out, f"{what}[0], the output, on {probe}", tuple(right_out.shape))
    require_tensor(new_state, f"{what}[1], the new state, on {probe}",
                   tuple(right_new.shape))
    raise CheckFailed(
        f"{what} gives a new state that differs from the right one by up to "
        f"{max_difference(new_state, right_new):.3g} and an output by up to "
        f"{max_difference(out, right_out):.3g} on {probe}, and matches none of the "
        f"typical mistakes this check knows. {_SEE_DELTA}, and follow the exercise's "
        "four steps one at a time.")


# ---------------------------------------------------------------------------------------
# the softmax with a sink


_SEE_SINKS = "See 'Attention sinks and QK-norm' in this chapter"


def _with_sink(scores: torch.Tensor, sinks: torch.Tensor, *, sink_view: str = "head",
               shift: str = "row and sink", numerator: str = "scores",
               sink_term: str = "exp", dim: int = -1) -> torch.Tensor:
    """The softmax with a sink, right with the defaults, or with one slip: ``sink_view``
    ``"query"`` or ``"key"`` (sinks broadcast along the tokens); ``shift`` ``"row"`` (the
    scores' maximum alone), ``"global"`` (one maximum for the tensor) or ``"none"``;
    ``numerator="scores and sink"``; ``sink_term`` ``"raw"`` (the sink less the shift,
    not exponentiated), ``"zero"`` (a sink logit 0) or ``"subtract"``; ``dim=-2`` (the
    sum over the queries)."""
    sink = {"head": sinks[None, :, None, None], "query": sinks[None, None, :, None],
            "key": sinks[None, None, None, :]}[sink_view]
    if shift == "row and sink":
        m = torch.maximum(scores.amax(dim, keepdim=True), sink)
    elif shift == "row":
        m = scores.amax(dim, keepdim=True)
    elif shift == "global":
        m = scores.max()
    else:
        m = torch.zeros((), dtype=scores.dtype)
    e = torch.exp(scores - m)
    extra = {"exp": torch.exp(sink - m), "raw": sink - m, "zero": torch.exp(-m),
             "subtract": -torch.exp(sink - m)}[sink_term]
    top = e + torch.exp(sink - m) if numerator == "scores and sink" else e
    return top / (e.sum(dim, keepdim=True) + extra)


def _sink_mistakes() -> dict[str, Mistake]:
    def column_kept(last: bool) -> Mistake:
        def fn(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
            sink = sinks[None, :, None, None].expand(*scores.shape[:-1], 1)
            parts = [scores, sink] if last else [sink, scores]
            return torch.cat(parts, dim=-1).softmax(-1)
        return fn

    def key_dropped(sink_first: bool) -> Mistake:
        def fn(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
            weights = column_kept(not sink_first)(scores, sinks)
            return weights[..., :-1] if sink_first else weights[..., 1:]
        return fn

    def renormalised(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        weights = column_kept(True)(scores, sinks)[..., :-1]
        return weights / weights.sum(-1, keepdim=True)

    def masked_as_zero(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        return _with_sink(torch.where(torch.isinf(scores), 0.0, scores), sinks)

    def times_mask(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        return _with_sink(scores * torch.isfinite(scores), sinks)

    def naive_patched(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(_with_sink(scores, sinks, shift="none"))

    return {
        "is the plain softmax: the sink's share of each row is lost":
            lambda scores, sinks: scores.softmax(-1),
        "drops the sink's column from a softmax over the scores and the sink, then "
        "renormalises what is left, which gives the sink's share back to the keys":
            renormalised,
        "returns the sink's column too: it has no value, so only the scores' weights are "
        "returned": column_kept(True),
        "returns the sink's column too (first): it has no value, so only the scores' "
        "weights are returned": column_kept(False),
        "drops the last key's column instead of the sink's": key_dropped(True),
        "drops the first key's column instead of the sink's": key_dropped(False),
        "adds the sink's exponential to every numerator too: the sink joins only the "
        "denominator": lambda s, k: _with_sink(s, k, numerator="scores and sink"),
        "adds the sink logit itself (less the row's maximum) to the denominator, not its "
        "exponential": lambda s, k: _with_sink(s, k, sink_term="raw"),
        "adds the sink logit itself to the denominator, not its exponential":
            lambda s, k: _with_sink(s, k, sink_term="raw", shift="none"),
        "uses a sink logit of 0 for every head (the softmax-plus-one), where each head has "
        "its own sink": lambda s, k: _with_sink(s, k, sink_term="zero"),
        "subtracts the sink's exponential from the denominator instead of adding it":
            lambda s, k: _with_sink(s, k, sink_term="subtract"),
        "sums over the queries (dim=-2), not over the keys of each row":
            lambda s, k: _with_sink(s, k, dim=-2),
        "gives query i the sink of head i: the sinks are broadcast along the queries, not "
        "the heads": lambda s, k: _with_sink(s, k, sink_view="query"),
        "gives key j the sink of head j: the sinks are broadcast along the keys, not the "
        "heads": lambda s, k: _with_sink(s, k, sink_view="key"),
        "gives nan in a row whose keys are all masked: it subtracts the scores' maximum "
        "alone, which is -inf there, but the sink belongs to every row's softmax":
            lambda s, k: _with_sink(s, k, shift="row"),
        "subtracts one maximum for the whole tensor, not each row's: rows far below it "
        "underflow to 0 / 0": lambda s, k: _with_sink(s, k, shift="global"),
        "overflows on large scores: exp of a score near 800 is inf in float64 unless "
        "something is subtracted first": lambda s, k: _with_sink(s, k, shift="none"),
        "replaces the nan of an overflow by 0 (nan_to_num): large scores must keep their "
        "weights, so the overflow must be avoided, not hidden": naive_patched,
        "gives masked keys (-inf) a weight: the masked scores became 0": masked_as_zero,
        "multiplies the scores by a 0/1 mask: -inf * 0 is nan, so the rows with masked "
        "keys become nan": times_mask,
    }


def _sink_probes() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(attn_scores, sinks) for every probe, each described by :data:`_SINK_PROBES`."""
    gen = torch.Generator().manual_seed(15)
    scores = _randn(gen, 2, 3, 4, 6)
    scores[..., -1] = -math.inf  # a masked key
    sinks = _randn(gen, 3)
    square = _randn(gen, 2, 3, 3, 3)
    empty_row = _randn(gen, 2, 3, 4, 6)
    empty_row[:, :, 0, :] = -math.inf  # query 0 sees no key: the sink takes it all
    empty_row[:, :, 1:, 4:] = -math.inf
    apart = _randn(gen, 2, 3, 4, 5) + torch.tensor([800.0, 800.0, -800.0, -800.0],
                                                   dtype=_DTYPE)[:, None]
    return [(square, sinks + 1.0), (scores, sinks), (scores + 800.0, sinks),
            (empty_row, sinks), (apart, sinks)]


#: What each probe of :func:`_sink_probes` is, for messages.
_SINK_PROBES = (
    "scores of shape (2, 3, 3, 3), as many queries and keys as heads",
    "scores of shape (2, 3, 4, 6) whose last key is masked",
    "scores near +800 of shape (2, 3, 4, 6)",
    "scores whose first query has every key masked",
    "scores near +800 in rows 0 and 1 and near -800 in rows 2 and 3",
)


@checker
def check_sink_softmax(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(attn_scores, sinks)``: ``(b, h, n, n_kv)``, ``(h,)`` -> weights.

    The weights are ``exp(s) / (exp(sink_h) + sum exp(s))`` over each row of
    head ``h``, of the scores' shape, computed stably. The probes are float64:
    a square probe with as many queries and keys as heads (where sinks
    broadcast along the wrong dimension still run), scores with a masked key
    (``-inf``), scores near +800 (checked by value, not only for being finite), a
    query whose keys are all masked (its weights are all 0: the sink takes the
    whole row), and rows near +800 beside rows near -800.

    Recognised mistakes: the plain softmax; the sink's column dropped and the
    rest renormalised; the sink's column kept, first or last; a key's column dropped
    instead of the sink's; the sink in the numerators; the sink logit not
    exponentiated; a sink of 0; the sink subtracted; the sum over the queries;
    the sinks broadcast along the queries or the keys; the shift by the scores'
    maximum alone (nan in a fully masked row); one maximum for the whole
    tensor; overflow, and an overflow patched with ``nan_to_num`` or a clamp;
    masked scores turned into 0 or multiplied by a 0/1 mask (nan); the scores
    changed in place.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns another shape,
            or computes something else; the message names the mistake where it
            is a typical one.

    Source: OpenAI (2025), gpt-oss model card, section 2.1.
    """
    require_callable(fn, "a function fn(attn_scores, sinks)")
    name = answer_name(fn, "fn")
    what = f"{name}(attn_scores, sinks)"
    probes = _sink_probes()
    mistakes = _sink_mistakes()
    results = _results(fn, probes, ["attn_scores", "sinks"], what, mistakes,
                       lambda out: _tensor(out, what), _SEE_SINKS)
    expected = [_with_sink(*args) for args in probes]
    first = _first_wrong(results, expected)
    if first is None:
        return passed("each row is softmax over the scores and the sink, without the sink")
    probe = _SINK_PROBES[first]
    _name_mistake(results, probes, mistakes, what, probe, _SEE_SINKS)
    out = require_tensor(results[first], f"{what} on {probe}", tuple(expected[first].shape))
    if not torch.isfinite(out).all():
        masked_rows = torch.isinf(probes[first][0]).any(-1, keepdim=True).expand(out.shape)
        if "+800" not in probe and torch.equal(~torch.isfinite(out),
                                               masked_rows & ~torch.isfinite(out)):
            raise CheckFailed(
                f"{what} gives nan in rows that have masked keys, on {probe}: a masked "
                "score is -inf, and -inf * 0 or -inf - (-inf) is nan. A masked key must "
                f"simply get weight 0. {_SEE_SINKS}.")
        raise CheckFailed(
            f"{what} gives nan or inf on {probe}, where the right weights are finite: an "
            f"exponential overflows, or a row is 0 / 0. {_SEE_SINKS}, and chapter 1's "
            "stable softmax.")
    if all(is_close(r, e) for r, e in zip(results[:2], expected[:2], strict=True)):
        raise CheckFailed(
            f"{what} is right on ordinary scores but not on {probe}, and its weights there "
            "are finite: a patch such as clamping the scores or nan_to_num hides an "
            f"overflow instead of avoiding it. {_SEE_SINKS}, and chapter 1's stable "
            "softmax.")
    raise CheckFailed(
        f"{what} differs from the weights with a sink by up to "
        f"{max_difference(out, expected[first]):.3g} on {probe}, and matches none of the "
        f"typical mistakes this check knows. {_SEE_SINKS}.")
