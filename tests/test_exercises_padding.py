"""attnlib.exercises.padding: check_padding_mask and check_cross_attention.

Each checker accepts a right answer, and rejects each usual mistake with a
message that names it (one test per mistake), and nonsense input.
"""

from __future__ import annotations

import pytest
import torch

from attnlib import MultiHeadAttention
from attnlib.exercises._common import CheckFailed
from attnlib.exercises.padding import check_cross_attention, check_padding_mask

# ---------------------------------------------------------------------------
# check_padding_mask
# ---------------------------------------------------------------------------


def padding_mask(key_padding_mask, causal):
    n = key_padding_mask.shape[-1]
    allowed = ~key_padding_mask[:, None, None, :]  # (batch, 1, 1, N): True = a real key
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    return allowed.expand(-1, -1, n, -1)


def _built(*, flip=False, rows=False, cols=True, causal_rule=None, torch_polarity=False):
    def fn(key_padding_mask, causal):
        n = key_padding_mask.shape[-1]
        real = key_padding_mask if flip else ~key_padding_mask
        allowed = torch.ones(key_padding_mask.shape[0], 1, n, n, dtype=torch.bool)
        if cols:
            allowed = allowed & real[:, None, None, :]
        if rows:
            allowed = allowed & real[:, None, :, None]
        if (causal if causal_rule is None else causal_rule):
            allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
        return ~allowed if torch_polarity else allowed

    return fn


def test_check_padding_mask_accepts_a_right_answer(capsys):
    assert check_padding_mask(padding_mask) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_padding_mask_accepts_three_dimensional_masks():
    assert check_padding_mask(lambda kpm, causal: padding_mask(kpm, causal)[:, 0]) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(_built(flip=True), "polarity", id="padding-polarity-flipped"),
        pytest.param(_built(rows=True, cols=False), r"QUERIES \(rows\) instead of the padded "
                     r"KEYS \(columns\)", id="rows-instead-of-columns"),
        pytest.param(_built(rows=True), "as well as the padded keys", id="rows-and-columns"),
        pytest.param(_built(torch_polarity=True), "torch's polarity", id="torch-polarity"),
        pytest.param(_built(cols=False), "ignores the padding", id="padding-ignored"),
        pytest.param(_built(causal_rule=False), "no causal mask", id="causal-missing"),
        pytest.param(_built(causal_rule=True), "applies a causal mask, though causal=False",
                     id="causal-always"),
    ],
)
def test_check_padding_mask_names_each_mistake(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_padding_mask(wrong)


def test_check_padding_mask_rejects_nonsense():
    with pytest.raises(CheckFailed, match="a function"):
        check_padding_mask("~key_padding_mask")
    with pytest.raises(CheckFailed, match="returned list"):
        check_padding_mask(lambda kpm, causal: [[True]])
    with pytest.raises(CheckFailed, match="expected bool"):
        check_padding_mask(lambda kpm, causal: padding_mask(kpm, causal).float())
    with pytest.raises(CheckFailed, match=r"returned shape \(3, 5\)"):
        check_padding_mask(lambda kpm, causal: ~kpm)
    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_padding_mask(lambda kpm, causal: (_ for _ in ()).throw(NotImplementedError()))


# ---------------------------------------------------------------------------
# check_cross_attention
# ---------------------------------------------------------------------------


def cross_attention(x, context, W_query, W_key, W_value, key_padding_mask):
    queries, keys, values = x @ W_query, context @ W_key, context @ W_value
    attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
    attn_scores = attn_scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    return torch.softmax(attn_scores, dim=-1) @ values


def _cross(*, causal=False, kv_from_x=False, flip=False, rows=False, no_padding=False,
           swap=False):
    def fn(x, context, W_query, W_key, W_value, key_padding_mask):
        if swap:
            x, context = context, x
        source = x if kv_from_x else context
        queries, keys, values = x @ W_query, source @ W_key, source @ W_value
        attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
        hide = ~key_padding_mask if flip else key_padding_mask
        if not no_padding:
            attn_scores = attn_scores.masked_fill(
                hide[:, :, None] if rows else hide[:, None, :], float("-inf"))
        if causal:
            n_q, n_kv = attn_scores.shape[-2:]
            attn_scores = attn_scores.masked_fill(
                ~torch.ones(n_q, n_kv, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(attn_scores, dim=-1) @ values

    return fn


def test_check_cross_attention_accepts_a_right_answer(capsys):
    assert check_cross_attention(cross_attention) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_cross_attention_accepts_attnlib_with_the_weights():
    """attnlib's MultiHeadAttention(causal=False) with one head is a right answer too."""

    def with_attnlib(x, context, W_query, W_key, W_value, key_padding_mask):
        d_in, d_out = W_query.shape
        mha = MultiHeadAttention(d_in, d_out, 8, 0.0, 1, causal=False).double()
        with torch.no_grad():
            for layer, w in ((mha.W_query, W_query), (mha.W_key, W_key), (mha.W_value, W_value)):
                layer.weight.copy_(w.T)
            mha.out_proj.weight.copy_(torch.eye(d_out))
            mha.out_proj.bias.zero_()
        return mha(x, context=context, key_padding_mask=key_padding_mask).detach()

    assert check_cross_attention(with_attnlib) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(_cross(causal=True), "applies a causal mask", id="causal-mask"),
        pytest.param(_cross(kv_from_x=True), "keys and values from x", id="kv-from-x"),
        pytest.param(_cross(flip=True), "flips the padding's polarity", id="polarity"),
        pytest.param(_cross(rows=True), r"QUERIES \(rows\) instead of the padded KEYS",
                     id="rows-instead-of-columns"),
        pytest.param(_cross(no_padding=True), "ignores key_padding_mask", id="no-padding"),
    ],
)
def test_check_cross_attention_names_each_mistake(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_cross_attention(wrong)


def test_check_cross_attention_names_queries_from_the_context():
    with pytest.raises(CheckFailed, match="queries from the context"):
        check_cross_attention(_cross(swap=True))  # on the probe with equal lengths


def test_check_cross_attention_names_one_row_per_context_token():
    def per_context_token(x, context, W_query, W_key, W_value, key_padding_mask):
        queries, keys, values = context @ W_query, x @ W_key, x @ W_value
        return torch.softmax(queries @ keys.transpose(-2, -1) / 2.0, dim=-1) @ values

    def square_right_then_swapped(x, context, *rest):
        fn = cross_attention if x.shape[1] == context.shape[1] else per_context_token
        return fn(x, context, *rest)

    with pytest.raises(CheckFailed, match="one row per CONTEXT token"):
        check_cross_attention(square_right_then_swapped)


def test_check_cross_attention_rejects_nonsense():
    with pytest.raises(CheckFailed, match="a function"):
        check_cross_attention(torch.zeros(2))
    with pytest.raises(CheckFailed, match="returned NoneType"):
        check_cross_attention(lambda *args: None)
    with pytest.raises(CheckFailed, match="differs from cross-attention"):
        check_cross_attention(lambda x, *args: torch.zeros(x.shape[0], x.shape[1], 4,
                                                            dtype=x.dtype))
