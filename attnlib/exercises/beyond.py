"""Checkers for chapter 13's exercises: the absorbed MLA query, one step of the
delta rule and the softmax with a sink.

* :func:`check_absorbed_query` - ``fn(q_nope, W_UK)`` maps each head's query
  into the latent space, ``q_nope[b, h, t] @ W_UK[h]``.
* :func:`check_delta_rule_step` - ``fn(state, query, key, value, beta, g)``
  is one token of the gated delta rule (output and new state).
* :func:`check_sink_softmax` - ``fn(attn_scores, sinks)`` is a softmax whose
  denominator has one extra logit per head.

Each compares the answer with attnlib's reference on seeded float64 probes of
unequal sizes and names the typical wrong answers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..linear_attention import delta_rule_step
from ..sinks import softmax_with_sinks
from ._common import (
    CheckFailed,
    call_answer,
    checker,
    is_close,
    max_difference,
    passed,
    require_callable,
    require_tensor,
)

__all__ = ["check_absorbed_query", "check_delta_rule_step", "check_sink_softmax"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@checker
def check_absorbed_query(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(q_nope, W_UK)``: ``(b, h, n, d_nope)``, ``(h, d_nope, r)`` -> ``(b, h, n, r)``.

    Raises:
        CheckFailed: the answer's shape or values differ from
            ``einsum("bhnd,hdr->bhnr", q_nope, W_UK)``.

    Source: DeepSeek-AI (2024), "DeepSeek-V2", section 2.1.2.
    """
    require_callable(fn, "fn(q_nope, W_UK)")
    g = _generator(13)
    q_nope = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    w_uk = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    out = call_answer(fn, q_nope, w_uk, what="fn(q_nope, W_UK)")
    require_tensor(out, "fn(q_nope, W_UK)", (2, 3, 5, 7))
    expected = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)
    if is_close(out, expected):
        return passed("each head's query is mapped into the latent space by its own W_UK[h]")
    if is_close(out, torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk[:1].expand(3, 4, 7))):
        raise CheckFailed("every head used W_UK[0]: head h needs its own W_UK[h]")
    raise CheckFailed(
        "q_nope @ W_UK per head differs from the reference by up to "
        f"{max_difference(out, expected):.3g}"
    )


@checker
def check_delta_rule_step(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check ``fn(state, query, key, value, beta, g) -> (output, new_state)``.

    Shapes: ``state (b, h, d, dv)``, ``query``/``key (b, h, d)``, ``value
    (b, h, dv)``, ``beta``/``g (b, h)``; output ``(b, h, dv)`` scaled by
    ``1 / sqrt(d)``.

    Raises:
        CheckFailed: wrong shapes or values; names a missing gate, a read
            before the decay, a missing scale or a state changed in place.

    Source: Yang et al. (2024), "Gated Delta Networks", eq. (10).
    """
    require_callable(fn, "fn(state, query, key, value, beta, g)")
    g = _generator(14)
    state = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    query = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    key = F.normalize(torch.randn(2, 3, 4, generator=g, dtype=torch.float64), dim=-1)
    value = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    beta = torch.rand(2, 3, generator=g, dtype=torch.float64)
    log_decay = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    saved = state.clone()
    result = call_answer(fn, state, query, key, value, beta, log_decay,
                         what="fn(state, query, key, value, beta, g)")
    if not isinstance(result, tuple) or len(result) != 2:
        raise CheckFailed("return the pair (output, new_state)")
    out, new_state = result
    require_tensor(out, "output", (2, 3, 5))
    require_tensor(new_state, "new_state", (2, 3, 4, 5))
    if not torch.equal(state, saved):
        raise CheckFailed("the state argument was changed in place: return a new tensor")
    exp_out, exp_state = delta_rule_step(state, query, key, value, beta, log_decay)
    if is_close(out, exp_out) and is_close(new_state, exp_state):
        return passed("decay, recall, correct by beta * (v - recalled), read with the query")
    _, no_gate = delta_rule_step(state, query, key, value, beta, None)
    if is_close(new_state, no_gate):
        raise CheckFailed("the state was not decayed: multiply it by exp(g) first")
    if is_close(out, exp_out * 2.0):  # d = 4: a missing 1/sqrt(d) doubles the output
        raise CheckFailed("the output is not scaled: multiply by 1 / sqrt(head_dim)")
    recalled_first = state.mul(1).clone()
    recalled = (recalled_first * key[..., :, None]).sum(-2)  # read before the decay
    wrong = state * log_decay.exp()[..., None, None] + key[..., :, None] * (
        beta[..., None] * (value - recalled))[..., None, :]
    if is_close(new_state, wrong):
        raise CheckFailed("recall S^T k from the decayed state, not the old one")
    raise CheckFailed(
        f"new_state differs from the reference by up to {max_difference(new_state, exp_state):.3g}"
        f" and the output by up to {max_difference(out, exp_out):.3g}"
    )


@checker
def check_sink_softmax(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(attn_scores, sinks)``: ``(b, h, n, n_kv)``, ``(h,)`` -> weights.

    Raises:
        CheckFailed: wrong shape or values; names a sink left out, a sink
            column kept, and an overflow on large scores.

    Source: OpenAI (2025), gpt-oss model card, section 2.1.
    """
    require_callable(fn, "fn(attn_scores, sinks)")
    g = _generator(15)
    scores = torch.randn(2, 3, 4, 6, generator=g, dtype=torch.float64)
    scores[..., -1] = float("-inf")  # a masked key
    sinks = torch.randn(3, generator=g, dtype=torch.float64)
    out = call_answer(fn, scores, sinks, what="fn(attn_scores, sinks)")
    if isinstance(out, torch.Tensor) and out.shape == (2, 3, 4, 7):
        raise CheckFailed("drop the sink's column: it has no value, only its weight is lost")
    require_tensor(out, "fn(attn_scores, sinks)", (2, 3, 4, 6))
    expected = softmax_with_sinks(scores, sinks)
    if not is_close(out, expected):
        if is_close(out, scores.softmax(-1)):
            raise CheckFailed("that is the plain softmax: add exp(sink) to the denominator")
        raise CheckFailed(
            f"the weights differ from the reference by up to {max_difference(out, expected):.3g}"
        )
    big = call_answer(fn, scores + 800.0, sinks, what="fn(attn_scores + 800, sinks)")
    if not torch.isfinite(big).all():
        raise CheckFailed("scores near 800 overflow exp: subtract the row's maximum first "
                          "(the largest of the scores and the sink)")
    return passed("each row is softmax over the scores and the sink, without the sink")
