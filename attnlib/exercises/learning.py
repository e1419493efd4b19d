"""Checkers for chapter 10's exercises: measuring what trained attention heads do.

* :func:`check_prefix_matching_score` - ``fn(attn_weights, inputs)`` returns each
  head's prefix-matching score, as :func:`attnlib.training.prefix_matching_score`
  defines it.

It tests what the answer computes on seeded float64 attention weights and token
sequences built so that every typical wrong answer gives another number, and
names the wrong answer it recognises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..training import prefix_matching_score
from ._common import (
    CheckFailed,
    call_answer,
    checker,
    is_close,
    max_difference,
    passed,
    probe_device,
    require_callable,
    require_tensor,
)

__all__ = ["check_prefix_matching_score"]

#: Token rows of the first probe (batch 3, 9 tokens). Row 0 has a token that
#: occurs three times (query 6 has two earlier copies); row 1 repeats a token
#: at once (query 1's target key is itself); row 2 is a prefix and its
#: repetition. The rows count 4, 2 and 4 queries, so averaging per row first
#: gives another number than averaging over all counted queries.
_PROBE_TOKENS = (
    (5, 1, 2, 5, 1, 7, 5, 2, 3),
    (4, 4, 8, 9, 0, 8, 1, 2, 6),
    (0, 1, 2, 3, 4, 0, 1, 2, 3),
)
#: Second probe: other sizes (batch 2, 3 heads, 6 tokens), so that sizes
#: written into the answer fail. Token 3 of row 0 occurs three times again, so
#: that wrong answers which agree by chance on the first probe (the first
#: occurrence only, the largest weight on the targets) differ here.
_PROBE_TOKENS_2 = ((3, 3, 1, 3, 0, 1), (7, 2, 9, 2, 7, 9))


def _causal_weights(batch: int, num_heads: int, num_tokens: int, seed: int,
                    device: torch.device) -> torch.Tensor:
    """Random causal attention weights, float64, rows summing to 1."""
    generator = torch.Generator().manual_seed(seed)
    scores = 2.0 * torch.randn(batch, num_heads, num_tokens, num_tokens, generator=generator,
                               dtype=torch.float64)
    allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return weights.to(device)  # (batch, num_heads, num_tokens, num_tokens)


def _variant(attn_weights: torch.Tensor, inputs: torch.Tensor, *, shift: int = 1,
             earlier: str = "strict", occurrences: str = "every", reduce: str = "sum",
             average: str = "counted", transpose: bool = False) -> torch.Tensor:
    """The score computed the right way or with one typical mistake.

    ``earlier``: which positions ``s`` may match query ``t``: ``"strict"``
    (``s < t``, right), ``"self"`` (``s <= t``) or ``"any"`` (every ``s != t``,
    later ones too). ``occurrences``: ``"every"`` matching ``s`` (right),
    ``"first"`` or ``"last"`` only. ``reduce``: how a query's weights on its
    targets combine: ``"sum"`` (right), ``"mean"`` or ``"max"``.
    """
    if transpose:
        attn_weights = attn_weights.transpose(-1, -2)
    n = inputs.shape[1]
    same = inputs[:, :, None] == inputs[:, None, :]  # (batch, t, s)
    ones = torch.ones(n, n, dtype=torch.bool, device=inputs.device)
    allowed = {"strict": ones.tril(-1), "self": ones.tril(0),
               "any": ~torch.eye(n, dtype=torch.bool, device=inputs.device)}[earlier]
    match = same & allowed  # (batch, t, s)
    if occurrences != "every":  # keep only the smallest or largest s of each row
        positions = torch.arange(n, device=inputs.device)
        if occurrences == "last":
            keep = torch.where(match, positions, -1).amax(dim=-1)  # (batch, t)
        else:
            keep = torch.where(match, positions, n).amin(dim=-1)  # (batch, t)
        rows = match.any(dim=-1).nonzero(as_tuple=True)
        match = torch.zeros_like(match)
        match[rows[0], rows[1], keep[rows]] = True
    after = torch.zeros_like(match)
    if shift == 1:
        after[:, :, 1:] = match[:, :, :-1]  # key s + 1
    else:
        after = match  # key s itself
    counted = after.any(dim=-1)  # (batch, t)
    on_targets = attn_weights * after[:, None].to(attn_weights.dtype)  # (b, h, t, j)
    if reduce == "max":
        on_target = on_targets.amax(dim=-1)  # (b, h, t)
    elif reduce == "mean":
        num_targets = after.sum(dim=-1).clamp(min=1)[:, None]  # (b, 1, t)
        on_target = on_targets.sum(dim=-1) / num_targets
    else:
        on_target = on_targets.sum(dim=-1)  # (b, h, t)
    on_target = on_target * counted[:, None].to(attn_weights.dtype)
    if average == "all":
        return on_target.mean(dim=(0, 2))
    if average == "sum":
        return on_target.sum(dim=(0, 2))
    if average == "rows":
        per_row = on_target.sum(dim=2) / counted.sum(dim=1, keepdim=True).clamp(min=1)
        return per_row.mean(dim=0)  # (num_heads,)
    return on_target.sum(dim=(0, 2)) / counted.sum()


def _wrong_answers(attn_weights: torch.Tensor, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each typical wrong score, keyed by the message that names it."""
    previous = attn_weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))
    return {
        "you measured the weight on the EARLIER OCCURRENCE itself (key s), not on the token "
        "after it (key s + 1). That is a duplicate-token score; an induction head looks one "
        "place further, at what followed the earlier copy. Shift the matches one key to the "
        "right.": _variant(attn_weights, inputs, shift=0),
        "you computed the previous-token score (the weight on key t - 1), which does not look "
        "at the tokens at all. Compare inputs[b, s] with inputs[b, t] to find the earlier "
        "occurrences.": previous,
        "you averaged over EVERY query, also those whose token never occurred before. Only "
        "queries with an earlier copy of their token count: divide by their number.": _variant(
            attn_weights, inputs, average="all"
        ),
        "you divided by nothing: the score is the MEAN over the counted queries of the weight "
        "on their targets, not the sum.": _variant(attn_weights, inputs, average="sum"),
        "you averaged each sequence first and then the sequences. The score averages over all "
        "counted queries of the batch together; sequences with more repeats weigh more. Row 1 "
        "of the probe counts 2 queries, rows 0 and 2 count 4.": _variant(
            attn_weights, inputs, average="rows"
        ),
        "you counted only the MOST RECENT earlier occurrence. The definition sums the weight on "
        "the token after every earlier copy of the query's token (in the probe, token 5 of row 0 "
        "occurs three times).": _variant(attn_weights, inputs, occurrences="last"),
        "you counted only the FIRST earlier occurrence (list.index or argmax finds only the "
        "first). The definition sums the weight on the token after every earlier copy of the "
        "query's token (in the probe, token 5 of row 0 occurs three times).": _variant(
            attn_weights, inputs, occurrences="first"
        ),
        "you took the LARGEST weight among a query's targets. A query whose token occurred "
        "several times has several targets; add their weights (an induction head may split "
        "its attention between them).": _variant(attn_weights, inputs, reduce="max"),
        "you AVERAGED the weights on a query's targets. A query whose token occurred several "
        "times has several targets; add their weights, then average over the queries.": _variant(
            attn_weights, inputs, reduce="mean"
        ),
        "you let a token count as its own earlier occurrence (s <= t instead of s < t): then "
        "every query counts and looks at key t + 1, which the causal mask hides. Use "
        "torch.tril(..., diagonal=-1).": _variant(attn_weights, inputs, earlier="self"),
        "you also matched LATER occurrences of the query's token (s != t instead of s < t): "
        "queries whose token comes again later then count, with weight 0 on keys the causal "
        "mask hides. Only earlier positions s < t count.": _variant(
            attn_weights, inputs, earlier="any"
        ),
        "rows and columns are swapped: attn_weights[b, h, t, j] is the weight from query t to "
        "key j (rows are queries). You read attn_weights[b, h, j, t].": _variant(
            attn_weights, inputs, transpose=True
        ),
    }


def _probes(device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """The checker's two probes, ``(attn_weights, inputs)`` each."""
    return (
        (_causal_weights(3, 2, 9, 10, device), torch.tensor(_PROBE_TOKENS, device=device)),
        (_causal_weights(2, 3, 6, 11, device), torch.tensor(_PROBE_TOKENS_2, device=device)),
    )


def _what(attn_weights: torch.Tensor, inputs: torch.Tensor) -> str:
    return (f"fn(attn_weights, inputs) with attn_weights of shape {tuple(attn_weights.shape)} "
            f"and inputs of shape {tuple(inputs.shape)}")


def _run_probe(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               attn_weights: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """The learner's scores on one probe, after checking their type, shape and device."""
    num_heads = attn_weights.shape[1]
    what = _what(attn_weights, inputs)
    out = call_answer(fn, attn_weights.clone(), inputs.clone(), what=what)
    if isinstance(out, torch.Tensor) and out.ndim == 0:
        raise CheckFailed(
            f"{what} returned one number; expected one score per head, shape ({num_heads},). "
            "Average over the batch and the counted queries, not over the heads."
        )
    out = require_tensor(out, what, (num_heads,))
    if not out.is_floating_point():
        raise CheckFailed(f"{what} returned dtype {out.dtype}; expected a floating-point score")
    if out.device.type != attn_weights.device.type:
        raise CheckFailed(f"{what} returned a tensor on {out.device}; expected it on "
                          f"{attn_weights.device}")
    return out


def _judge_scores(probes: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  outputs: Sequence[torch.Tensor]) -> None:
    """Raise CheckFailed naming the mistake unless every output is right.

    A wrong answer is named only when it gives the learner's numbers on every
    probe, so that two mistakes that happen to agree on one probe are told
    apart by the other.
    """
    expected = [prefix_matching_score(w, x) for w, x in probes]
    wrong = [i for i, (out, exp) in enumerate(zip(outputs, expected, strict=True))
             if not is_close(out, exp)]
    if not wrong:
        return
    first = wrong[0]
    what = _what(*probes[first])
    candidates = [_wrong_answers(w, x) for w, x in probes]  # one dict per probe
    for message in candidates[0]:
        if all(is_close(out, answers[message])
               for out, answers in zip(outputs, candidates, strict=True)):
            raise CheckFailed(f"{what}: {message}")
    out, exp = outputs[first], expected[first]
    raise CheckFailed(
        f"{what} returned {out.tolist()}, but the prefix-matching scores are "
        f"{exp.tolist()} (largest difference {max_difference(out, exp):.3g}). "
        "Compare your function with attnlib.training.prefix_matching_score on a small example "
        "you can check by hand, such as tokens a b c a b."
    )


@checker
def check_prefix_matching_score(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                                device: torch.device | str | None = None) -> bool:
    """Check ``fn(attn_weights, inputs)``: each head's prefix-matching score.

    ``attn_weights`` is ``(batch, num_heads, num_tokens, num_tokens)`` (rows
    are queries) and ``inputs`` the int64 token ids ``(batch, num_tokens)``.
    For a query ``(b, t)`` the targets are the keys ``s + 1`` with ``s < t``
    and ``inputs[b, s] == inputs[b, t]``; a query counts when it has a target.
    ``fn`` must return ``(num_heads,)``: for each head, the mean over the
    counted queries of the summed weight on their targets, as
    :func:`attnlib.training.prefix_matching_score` does. The weights are
    float64, causal and random; the inputs include a token that occurs three
    times and one repeated at once.

    Recognised wrong answers: the earlier occurrence itself instead of the
    token after it, the previous-token score, an average over every query, a
    sum instead of a mean, per-sequence averages, only the most recent or only
    the first earlier occurrence, the largest or the mean weight on a query's
    targets instead of their sum, a token counted as its own earlier
    occurrence, later occurrences matched too, rows and columns swapped, one
    number instead of one per head. A wrong answer is named only when it
    reproduces the answer's numbers on both probes.

    Args:
        fn: the learner's function.
        device: keyword-only; where to put the probes. Default the CPU.

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns a wrong
            score; the message names the likely mistake.
        TypeError: ``device`` is not a device, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.

    Source: Olsson et al. (2022), "In-context Learning and Induction Heads",
    section 2 (prefix matching).
    """
    device = probe_device(device)
    require_callable(fn, "your function fn(attn_weights, inputs)")
    probes = _probes(device)
    outputs = [_run_probe(fn, attn_weights, inputs) for attn_weights, inputs in probes]
    _judge_scores(probes, outputs)
    return passed("one prefix-matching score per head, averaged over the counted queries.")
