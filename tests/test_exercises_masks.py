"""attnlib.exercises.masks: check_causal_mask and check_causal_attention.

Each checker accepts the reference and the book's solution, and rejects each
typical wrong answer with a message that names it (one test per wrong answer).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import attnlib
from attnlib.exercises import CheckFailed, check_causal_attention, check_causal_mask

# ---------------------------------------------------------------------------
# check_causal_mask
# ---------------------------------------------------------------------------


def book_causal_mask(num_tokens):
    """The solution printed in chapter 5."""
    ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
    return torch.tril(ones)  # True on and below the diagonal


def test_check_causal_mask_accepts_the_reference(capsys):
    assert check_causal_mask(attnlib.causal_mask) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_causal_mask_accepts_the_book_solution():
    assert check_causal_mask(book_causal_mask) is True


def test_check_causal_mask_accepts_an_index_comparison():
    def by_index(num_tokens):
        i = torch.arange(num_tokens)
        return i[None, :] <= i[:, None]

    assert check_causal_mask(by_index) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1),
                     "polarity is flipped", id="flipped-polarity"),
        pytest.param(lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1),
                     "diagonal is missing", id="without-diagonal"),
        pytest.param(lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool)),
                     "UPPER triangle", id="upper-triangle"),
        pytest.param(lambda n: torch.tril(torch.ones(n, n)),
                     "float mask of dtype torch.float32, not bool", id="float-mask"),
        pytest.param(lambda n: torch.tril(torch.ones(n, n, dtype=torch.long)),
                     "int64 mask of dtype torch.int64, not bool", id="int-mask"),
        pytest.param(lambda n: torch.zeros(n, n).masked_fill(
            ~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf")),
                     "additive float mask", id="additive-mask"),
        pytest.param(lambda n: torch.tril(torch.ones(6, 6, dtype=torch.bool)),
                     r"returned shape \(6, 6\); expected \(5, 5\), and fn\(8\) has the same "
                     "shape: the size is fixed", id="fixed-size"),
        pytest.param(lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool))[None],
                     r"returned shape \(1, 5, 5\); expected \(5, 5\): a 2-D mask.*Leave out "
                     "any batch or head dimension", id="extra-dimension"),
        pytest.param(lambda n: torch.tril(torch.ones(n, n + 1, dtype=torch.bool)),
                     "the mask must be square", id="not-square"),
        pytest.param(lambda n: torch.tril(torch.ones(n + 1, n + 1, dtype=torch.bool)),
                     r"off by \+1", id="off-by-one"),
        pytest.param(lambda n: torch.ones(n, dtype=torch.bool),
                     r"returned shape \(5,\); expected \(5, 5\)", id="wrong-shape"),
    ],
)
def test_check_causal_mask_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as info:
        check_causal_mask(wrong)
    assert isinstance(info.value, AssertionError)  # pytest reports a failed check as a failure


def test_check_causal_mask_float_mask_with_flipped_polarity_says_both():
    with pytest.raises(CheckFailed, match="not bool .*polarity is flipped as well"):
        check_causal_mask(lambda n: torch.triu(torch.ones(n, n), diagonal=1))


def failure_of_mask(answer) -> str:
    with pytest.raises(CheckFailed) as info:
        check_causal_mask(answer)
    return str(info.value)


def test_check_causal_mask_names_an_all_true_mask_as_seeing_the_future():
    def all_true(num_tokens):
        return torch.ones(num_tokens, num_tokens, dtype=torch.bool)

    with pytest.raises(CheckFailed, match="True everywhere, so it masks nothing: every token "
                                          "sees the future"):
        check_causal_mask(all_true)


def test_check_causal_mask_unnamed_wrong_mask_shows_the_expected_one_and_the_future():
    def one_ahead(num_tokens):  # the diagonal of torch.tril one too high
        return torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)

    message = failure_of_mask(one_ahead)
    assert "row i is True in columns 0 to i" in message
    assert "lets tokens see the future: True above the diagonal at (query, key) = (0, 1), " \
        "(1, 2), (2, 3), (3, 4)." in message


def test_check_causal_mask_unnamed_wrong_mask_shows_the_hidden_past():
    def window_of_two(num_tokens):  # a sliding window, not the causal mask
        ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
        return torch.tril(ones) & torch.triu(ones, diagonal=-1)

    message = failure_of_mask(window_of_two)
    assert "future" not in message
    assert "hides tokens a query may see (False on or below the diagonal) at (2, 0), " \
        "(3, 0), (3, 1), (4, 0), ..." in message


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param("torch.tril", "expected your causal-mask function .*a function, but got "
                     "str", id="a-string"),
        pytest.param(book_causal_mask(3), "a function, but got torch.Tensor", id="called-it"),
        pytest.param(lambda n: [[True]], "returned list; expected a torch.Tensor", id="a-list"),
        pytest.param(lambda n: (book_causal_mask(n), None), "returned a tuple", id="a-tuple"),
        pytest.param(lambda: None, "raised TypeError", id="no-argument"),
    ],
)
def test_check_causal_mask_answers_nonsense_clearly(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_causal_mask(answer)


def test_check_causal_mask_reports_the_stub():
    def stub(num_tokens):
        raise NotImplementedError("write the mask")

    with pytest.raises(CheckFailed, match="raised NotImplementedError: replace the stub"):
        check_causal_mask(stub)


def test_check_causal_mask_refuses_a_bad_device_argument():
    with pytest.raises(TypeError, match="device must be a torch.device, a str or None, got int"):
        check_causal_mask(book_causal_mask, device=0)


# ---------------------------------------------------------------------------
# check_causal_attention
# ---------------------------------------------------------------------------


class BookCausalAttention(nn.Module):
    """The solution printed in chapter 5."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(context_length, context_length, dtype=torch.bool))
        self.register_buffer("mask", mask)  # True = may attend

    def forward(self, x):
        num_tokens = x.shape[1]
        queries = self.W_query(x)  # (b, num_tokens, d_out)
        keys = self.W_key(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)  # (b, num_tokens, num_tokens)
        allowed = self.mask[:num_tokens, :num_tokens]
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (b, num_tokens, d_out)


def make_causal(mistake):
    """A causal attention class with one typical mistake."""

    class Wrong(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            super().__init__()
            bias = False if mistake == "ignores_qkv_bias" else qkv_bias
            self.W_query = nn.Linear(d_in, d_out, bias=bias)
            self.W_key = nn.Linear(d_in, d_out, bias=bias)
            self.W_value = nn.Linear(d_in, d_out, bias=bias)
            self.p = dropout
            mask = torch.tril(torch.ones(context_length, context_length, dtype=torch.bool))
            if mistake == "plain_attribute_mask":
                self.mask = mask
            else:
                self.register_buffer("mask", mask)

        def forward(self, x):
            n = x.shape[1]
            queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
            scores = queries @ keys.transpose(1, 2)
            if mistake == "dropout_on_scores":
                scores = nn.functional.dropout(scores, self.p, training=self.training)
            allowed = self.mask if mistake == "mask_not_cut" else self.mask[:n, :n]
            if mistake == "flipped_mask":
                scores = scores.masked_fill(allowed, float("-inf"))
            elif mistake == "no_diagonal":
                scores = scores.masked_fill(~torch.tril(allowed, diagonal=-1), float("-inf"))
            elif mistake == "zero_fill":
                scores = scores.masked_fill(~allowed, 0.0)
            elif mistake not in ("no_mask", "mask_after_softmax"):
                scores = scores.masked_fill(~allowed, float("-inf"))
            d_k = keys.shape[-1]
            scale = {"not_scaled": 1.0, "divided_by_d_k": d_k, "multiplied": d_k**-0.5,
                     "scaled_by_d_in": x.shape[-1] ** 0.5,
                     "scaled_by_num_tokens": keys.shape[1] ** 0.5}.get(mistake, d_k**0.5)
            dim = -2 if mistake == "softmax_dim" else -1
            weights = torch.softmax(scores / scale, dim=dim)
            if mistake == "scale_after_softmax":
                weights = torch.softmax(scores, dim=-1) / d_k**0.5
            if mistake == "mask_after_softmax":
                weights = weights * allowed
            if mistake == "only_last_token_leaks":
                weights = weights.clone()
                weights[:, :-1, -1] += 0.01
            keep = torch.rand_like(weights) >= self.p
            if mistake == "dropout_one_over_p":
                weights = weights * keep / self.p if self.training and self.p else weights
            elif mistake == "dropout_not_scaled":
                weights = weights * keep if self.training else weights
            elif mistake == "dropout_in_eval":
                weights = nn.functional.dropout(weights, self.p, training=True)
            elif mistake == "dropout_keep_probability":
                weights = nn.functional.dropout(weights, 1 - self.p, training=self.training)
            elif mistake == "dropout_on_values":
                values = nn.functional.dropout(values, self.p, training=self.training)
            elif mistake not in ("no_dropout", "dropout_on_output", "dropout_on_scores"):
                weights = nn.functional.dropout(weights, self.p, training=self.training)
            out = weights @ values
            if mistake == "dropout_on_output":
                out = nn.functional.dropout(out, self.p, training=self.training)
            return out

    Wrong.__name__ = f"Causal_{mistake}"
    return Wrong


def test_check_causal_attention_accepts_attnlib(capsys):
    assert check_causal_attention(attnlib.CausalAttention) is True
    assert "causality and dropout are right" in capsys.readouterr().out


def test_check_causal_attention_accepts_the_book_solution():
    assert check_causal_attention(BookCausalAttention) is True


def test_check_causal_attention_accepts_the_correct_variant_of_the_test_class():
    # make_causal's mistakes are its only difference from a right answer
    assert check_causal_attention(make_causal("none")) is True


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ("not_scaled", "scores are not scaled"),
        ("divided_by_d_k", "divided by d_k instead of sqrt"),
        ("multiplied", "MULTIPLIED by sqrt\\(d_k\\) instead of divided"),
        ("scaled_by_d_in", r"divided by sqrt\(d_in\) = sqrt\(5\), the size of the INPUTS"),
        ("scaled_by_num_tokens", r"divided by sqrt\(num_tokens\) = sqrt\(7\).*keys.shape\[1\]"),
        ("scale_after_softmax", "WEIGHTS are divided by sqrt\\(d_k\\), after the softmax"),
        ("mask_not_cut", r"works with num_tokens = context_length = 8 but not with 7 tokens.*"
                         r"self.mask\[:num_tokens, :num_tokens\]"),
        ("softmax_dim", "softmax runs over the wrong dimension"),
        ("no_mask", "there is no causal mask"),
        ("flipped_mask", "polarity is flipped"),
        ("no_diagonal", "hides the diagonal too"),
        ("mask_after_softmax", "masked AFTER the softmax and not renormalised"),
        ("zero_fill", "set to 0 instead of -inf"),
        ("only_last_token_leaks", "a future token leaks: changing the input at position"),
        ("plain_attribute_mask", "self.mask is a plain tensor attribute"),
        ("ignores_qkv_bias", "with qkv_bias=True, W_query has no bias"),
        ("no_dropout", "the attention weights are never dropped"),
        ("dropout_one_over_p", "scaled by 1/p = 5 instead of 1/\\(1-p\\) = 1.25"),
        ("dropout_not_scaled", "not scaled by 1/\\(1-p\\)"),
        ("dropout_in_eval", "dropout must be off after module.eval"),
        ("dropout_on_values", "its features are zeroed one by one"),
        ("dropout_on_output", "its features are zeroed one by one"),
        ("dropout_on_scores", "never zeroed.*Dropout on the scores, before the softmax"),
        ("dropout_keep_probability", "drops [78][0-9]% of the attention weights instead of "
                                     "p = 20%.*not 1 - dropout"),
    ],
)
def test_check_causal_attention_names_each_wrong_answer(mistake, named):
    with pytest.raises(CheckFailed, match=named):
        check_causal_attention(make_causal(mistake))


def test_check_causal_attention_names_nan_with_its_positions():
    class NanFromRowOne(BookCausalAttention):
        def forward(self, x):
            out = super().forward(x).clone()
            out[:, 1] = float("nan")
            return out

    with pytest.raises(CheckFailed, match=r"gives nan at positions \[1\]\. The softmax"):
        check_causal_attention(NanFromRowOne)


def test_check_causal_attention_scale_by_batch_cannot_pass():
    """The probe's batch differs from d_out, so keys.shape[0] is not d_k by accident."""

    class ScaledByBatch(BookCausalAttention):
        def forward(self, x):
            queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
            n = x.shape[1]
            scores = (queries @ keys.transpose(1, 2)).masked_fill(
                ~self.mask[:n, :n], float("-inf"))
            weights = self.dropout(torch.softmax(scores / keys.shape[0] ** 0.5, dim=-1))
            return weights @ values

    with pytest.raises(CheckFailed, match="differs from the reference causal attention"):
        check_causal_attention(ScaledByBatch)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param("CausalAttention", "a class, but got str", id="a-string"),
        pytest.param(BookCausalAttention(3, 2, 4, 0.0), "Pass the class itself, not an instance",
                     id="an-instance"),
        pytest.param(dict, "subclass of torch.nn.Module", id="not-a-module"),
    ],
)
def test_check_causal_attention_answers_nonsense_clearly(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_causal_attention(answer)


def test_check_causal_attention_names_a_missing_layer():
    class NoLinear(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            super().__init__()
            self.W_q = nn.Linear(d_in, d_out)

    with pytest.raises(CheckFailed, match="no W_query with a .weight"):
        check_causal_attention(NoLinear)


def test_check_causal_attention_names_a_transposed_weight():
    class RawWeights(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            super().__init__()
            self.W_query = nn.Linear(d_out, d_in)  # (d_in, d_out): the v1 layout

    with pytest.raises(CheckFailed, match=r"W_query.weight has shape \(5, 3\)"):
        check_causal_attention(RawWeights)


def test_check_causal_attention_names_a_tuple_output():
    class ReturnsWeights(BookCausalAttention):
        def forward(self, x):
            return super().forward(x), None

    with pytest.raises(CheckFailed, match="returned a tuple of 2"):
        check_causal_attention(ReturnsWeights)


def test_check_causal_attention_reports_the_stub():
    class Stub(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
            raise NotImplementedError

    with pytest.raises(CheckFailed, match="raised NotImplementedError"):
        check_causal_attention(Stub)


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda: check_causal_mask(book_causal_mask), id="mask"),
        pytest.param(lambda: check_causal_attention(BookCausalAttention), id="attention"),
        pytest.param(lambda: pytest.raises(CheckFailed, check_causal_attention,
                                           make_causal("dropout_one_over_p")), id="failing"),
    ],
)
def test_checks_leave_the_global_random_state_unchanged(run):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    run()
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(1234)
    expected_draw = torch.rand(3)
    torch.manual_seed(1234)
    run()
    assert torch.equal(torch.rand(3), expected_draw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_checks_run_on_cuda():
    assert check_causal_mask(book_causal_mask, device="cuda") is True
    assert check_causal_attention(BookCausalAttention, device="cuda") is True
