"""Checkers for chapter 10's exercises: measuring what trained attention heads do.

* :func:`check_prefix_matching_score` - ``fn(attn_weights, inputs)`` returns each
  head's prefix-matching score, as :func:`attnlib.training.prefix_matching_score`
  defines it.

It tests what the answer computes on seeded float64 attention weights and token
sequences built so that every typical wrong answer gives another number, and
names the wrong answer it recognises.
"""

from __future__ import annotations

import torch

from ..training import prefix_matching_score
from ._common import (
    CheckFailed,
    call_answer,
    checker,
    is_close,
    max_difference,
    name_wrong_answer,
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
#: written into the answer fail.
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
             diagonal: int = -1, most_recent: bool = False, average: str = "counted",
             transpose: bool = False) -> torch.Tensor:
    """The score computed the right way or with one typical mistake."""
    if transpose:
        attn_weights = attn_weights.transpose(-1, -2)
    n = inputs.shape[1]
    same = inputs[:, :, None] == inputs[:, None, :]  # (batch, t, s)
    earlier = torch.ones(n, n, dtype=torch.bool, device=inputs.device).tril(diagonal)
    match = same & earlier  # (batch, t, s)
    if most_recent:  # keep only the largest s of each row
        last = torch.where(match, torch.arange(n, device=inputs.device), -1).amax(dim=-1)
        match = torch.zeros_like(match)
        rows = (last >= 0).nonzero(as_tuple=True)
        match[rows[0], rows[1], last[rows]] = True
    after = torch.zeros_like(match)
    if shift == 1:
        after[:, :, 1:] = match[:, :, :-1]  # key s + 1
    else:
        after = match  # key s itself
    counted = after.any(dim=-1)  # (batch, t)
    on_target = (attn_weights * after[:, None].to(attn_weights.dtype)).sum(dim=-1)  # (b, h, t)
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
        "occurs three times).": _variant(attn_weights, inputs, most_recent=True),
        "you let a token count as its own earlier occurrence (s <= t instead of s < t): then "
        "every query counts and looks at key t + 1, which the causal mask hides. Use "
        "torch.tril(..., diagonal=-1).": _variant(attn_weights, inputs, diagonal=0),
        "rows and columns are swapped: attn_weights[b, h, t, j] is the weight from query t to "
        "key j (rows are queries). You read attn_weights[b, h, j, t].": _variant(
            attn_weights, inputs, transpose=True
        ),
    }


def _probe(fn, attn_weights: torch.Tensor, inputs: torch.Tensor) -> None:
    batch, num_heads, num_tokens, _ = attn_weights.shape
    what = (f"fn(attn_weights, inputs) with attn_weights of shape {tuple(attn_weights.shape)} "
            f"and inputs of shape {tuple(inputs.shape)}")
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
    expected = prefix_matching_score(attn_weights, inputs)
    if is_close(out, expected):
        return
    message = name_wrong_answer(out, _wrong_answers(attn_weights, inputs))
    if message is not None:
        raise CheckFailed(f"{what}: {message}")
    raise CheckFailed(
        f"{what} returned {out.tolist()}, but the prefix-matching scores are "
        f"{expected.tolist()} (largest difference {max_difference(out, expected):.3g}). "
        "Compare your function with attnlib.training.prefix_matching_score on a small example "
        "you can check by hand, such as tokens a b c a b."
    )


@checker
def check_prefix_matching_score(fn, *, device=None) -> bool:
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
    sum instead of a mean, per-sequence averages, only the most recent
    occurrence, a token counted as its own earlier occurrence, rows and
    columns swapped, one number instead of one per head.

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
    probes = (
        (_causal_weights(3, 2, 9, 10, device), torch.tensor(_PROBE_TOKENS, device=device)),
        (_causal_weights(2, 3, 6, 11, device), torch.tensor(_PROBE_TOKENS_2, device=device)),
    )
    for attn_weights, inputs in probes:
        _probe(fn, attn_weights, inputs)
    return passed("one prefix-matching score per head, averaged over the counted queries.")
