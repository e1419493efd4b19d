"""Tests for the toy tasks of attnlib.data: reversal and induction batches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import data
from attnlib.data import IGNORE_INDEX, SEPARATOR, induction_batch, reversal_batch

SMALL = settings(max_examples=25, deadline=None)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- reversal


def test_reversal_shapes_and_dtype():
    inputs, targets = reversal_batch(5, 7, 12, generator=gen())
    assert inputs.shape == targets.shape == (5, 14)
    assert inputs.dtype == targets.dtype == torch.long


def test_reversal_targets_are_the_reversed_inputs():
    inputs, targets = reversal_batch(16, 6, 10, generator=gen())
    torch.testing.assert_close(targets[:, 6:], inputs[:, :6].flip(-1), rtol=0, atol=0)
    assert (targets[:, :6] == IGNORE_INDEX).all()
    # Row by row, by hand, for the first row.
    row = inputs[0].tolist()
    assert targets[0, 6:].tolist() == row[:6][::-1]


def test_reversal_layout_separator_then_teacher_forcing():
    inputs, targets = reversal_batch(8, 5, 9, generator=gen(3))
    assert (inputs[:, 5] == SEPARATOR).all()
    # After the separator the model reads the answer so far: input t+1 is target t.
    torch.testing.assert_close(inputs[:, 6:], targets[:, 5:-1], rtol=0, atol=0)
    # Task tokens never collide with the separator and stay in the vocabulary.
    assert inputs[:, :5].min() >= 1 and inputs.max() <= 8


def test_reversal_is_seeded():
    a = reversal_batch(4, 6, 20, generator=gen(1))
    b = reversal_batch(4, 6, 20, generator=gen(1))
    c = reversal_batch(4, 6, 20, generator=gen(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"num_tokens": 2.0}, TypeError, "num_tokens must be an int"),
        ({"vocab_size": 1}, ValueError, "vocab_size must be >= 2"),
        ({"generator": 3}, TypeError, "generator must be a torch.Generator"),
    ],
)
def test_reversal_errors(kwargs, error, match):
    args = {"batch_size": 2, "num_tokens": 3, "vocab_size": 5} | kwargs
    with pytest.raises(error, match=match):
        reversal_batch(**args)


# ---------------------------------------------------------------- induction


def test_induction_shapes_and_dtype():
    inputs, targets, offsets = induction_batch(6, 10, 4, 16, generator=gen())
    assert inputs.shape == targets.shape == (6, 14)
    assert offsets.shape == (6,)
    assert inputs.dtype == targets.dtype == offsets.dtype == torch.long
    assert inputs.min() >= 0 and inputs.max() < 16


def test_induction_prefix_tokens_are_distinct():
    inputs, _, _ = induction_batch(32, 12, 5, 14, generator=gen())
    for row in inputs[:, :12]:
        assert len(set(row.tolist())) == 12


def test_induction_second_half_is_determined_by_the_first():
    prefix_len, repeat_len = 9, 5
    inputs, targets, offsets = induction_batch(64, prefix_len, repeat_len, 20, generator=gen(4))
    for row, target, k in zip(inputs.tolist(), targets.tolist(), offsets.tolist(), strict=True):
        prefix = row[:prefix_len]
        assert row[prefix_len:] == prefix[k : k + repeat_len]
        for t in range(len(row)):
            if target[t] == IGNORE_INDEX:
                continue
            # The next token is whatever followed the current token in the prefix.
            s = prefix.index(row[t])
            assert target[t] == prefix[s + 1] == row[t + 1]


def test_induction_scores_exactly_the_repeat_positions():
    inputs, targets, _ = induction_batch(4, 8, 5, 10, generator=gen())
    scored = (targets != IGNORE_INDEX).nonzero()[:, 1].unique().tolist()
    assert scored == [8, 9, 10, 11]  # P .. P + R - 2


def test_induction_random_offsets_cover_the_range_fixed_offset_is_fixed():
    _, _, offsets = induction_batch(400, 10, 6, 12, generator=gen())
    assert sorted(offsets.unique().tolist()) == [0, 1, 2, 3, 4]
    inputs, _, offsets = induction_batch(50, 10, 6, 12, offset=3, generator=gen())
    assert (offsets == 3).all()
    torch.testing.assert_close(inputs[:, 10:], inputs[:, 3:9], rtol=0, atol=0)


def test_induction_is_seeded():
    a = induction_batch(4, 6, 3, 8, generator=gen(5))
    b = induction_batch(4, 6, 3, 8, generator=gen(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@SMALL
@given(
    prefix_len=st.integers(2, 12),
    repeat_frac=st.floats(0.0, 1.0),
    extra_vocab=st.integers(0, 8),
    seed=st.integers(0, 1000),
)
def test_induction_property_targets_follow_the_earlier_occurrence(
    prefix_len, repeat_frac, extra_vocab, seed
):
    repeat_len = 2 + round(repeat_frac * (prefix_len - 2))
    inputs, targets, _ = induction_batch(
        3, prefix_len, repeat_len, prefix_len + extra_vocab, generator=gen(seed)
    )
    for row, target in zip(inputs.tolist(), targets.tolist(), strict=True):
        for t, y in enumerate(target):
            if y != IGNORE_INDEX:
                assert y == row[row.index(row[t]) + 1]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"prefix_len": 11}, ValueError, "prefix_len=11 exceeds vocab_size=10"),
        ({"repeat_len": 1}, ValueError, "repeat_len must be in 2 .. prefix_len=6"),
        ({"repeat_len": 7}, ValueError, "repeat_len must be in 2 .. prefix_len=6"),
        ({"offset": 3}, ValueError, "offset must be in 0 .. prefix_len - repeat_len = 2"),
        ({"offset": -1}, ValueError, "offset must be in 0"),
        ({"offset": True}, TypeError, "offset must be an int"),
        ({"batch_size": -2}, ValueError, "batch_size"),
        ({"generator": "seed"}, TypeError, "generator must be a torch.Generator"),
    ],
)
def test_induction_errors(kwargs, error, match):
    args = {"batch_size": 2, "prefix_len": 6, "repeat_len": 4, "vocab_size": 10} | kwargs
    with pytest.raises(error, match=match):
        induction_batch(**args)


def test_journey_data_is_unchanged():
    assert data.JOURNEY_TOKENS[1] == "journey"
    assert data.journey_embeddings()[1].tolist() == pytest.approx([0.55, 0.87, 0.66])
