"""attnlib.exercises.beyond: chapter 13's checkers accept right answers and name wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from attnlib.exercises import CheckFailed
from attnlib.exercises.beyond import (
    check_absorbed_query,
    check_delta_rule_step,
    check_sink_softmax,
)


def right_query(q_nope, w_uk):
    return torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)


def right_step(state, query, key, value, beta, g):
    state = state * g.exp()[..., None, None]
    recalled = (state * key[..., :, None]).sum(-2)
    state = state + key[..., :, None] * (beta[..., None] * (value - recalled))[..., None, :]
    return (state * query[..., :, None]).sum(-2) / math.sqrt(key.shape[-1]), state


def right_sink(scores, sinks):
    sink = sinks[None, :, None, None]
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    e = (scores - m).exp()
    return e / (e.sum(-1, keepdim=True) + (sink - m).exp())


def test_right_answers_pass(capsys):
    assert check_absorbed_query(right_query)
    assert check_delta_rule_step(right_step)
    assert check_sink_softmax(right_sink)
    assert capsys.readouterr().out.count("Correct") == 3


def test_wrong_answers_are_named():
    with pytest.raises(CheckFailed, match="own W_UK"):
        check_absorbed_query(lambda q, w: torch.einsum("bhnd,dr->bhnr", q, w[0]))
    with pytest.raises(CheckFailed, match="not decayed"):
        check_delta_rule_step(lambda s, q, k, v, b, g: right_step(s, q, k, v, b, 0 * g))
    with pytest.raises(CheckFailed, match="not scaled"):
        check_delta_rule_step(lambda *a: (right_step(*a)[0] * 2.0, right_step(*a)[1]))

    def in_place(state, *rest):
        out, new = right_step(state, *rest)
        state.copy_(new)
        return out, new

    with pytest.raises(CheckFailed, match="in place"):
        check_delta_rule_step(in_place)
    with pytest.raises(CheckFailed, match="plain softmax"):
        check_sink_softmax(lambda s, k: s.softmax(-1))

    def naive(scores, sinks):
        e = scores.exp()
        return e / (e.sum(-1, keepdim=True) + sinks[None, :, None, None].exp())

    with pytest.raises(CheckFailed, match="overflow"):
        check_sink_softmax(naive)
    with pytest.raises(CheckFailed, match="stub|NotImplementedError"):
        check_sink_softmax(lambda s, k: (_ for _ in ()).throw(NotImplementedError("x")))
