"""The checkers of chapters 1 and 2 (attnlib.exercises.basics).

Each checker must accept the reference and the solutions the book prints,
reject each typical wrong answer with a message that names it (one test per
wrong answer), answer nonsense with a clear CheckFailed, and leave the global
random state alone.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnlib
from attnlib.exercises import (
    CheckFailed,
    check_qkv_projection,
    check_scaled_dot_product_attention,
    check_simplified_attention,
    check_softmax,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def failure_of(check, answer) -> str:
    with pytest.raises(CheckFailed) as info:
        check(answer)
    return str(info.value)


# --- the solutions printed in chapters 1 and 2 (keep in step with the notebooks) -----------


def stable_softmax(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True)  # the largest entry along dim becomes 0
    exp_x = torch.exp(shifted)
    return exp_x / exp_x.sum(dim=dim, keepdim=True)


def my_simplified_attention(x):
    attn_scores = x @ x.T  # (num_tokens, num_tokens)
    attn_weights = torch.softmax(attn_scores, dim=-1)  # each row sums to 1
    return attn_weights @ x  # (num_tokens, d_in)


def project_qkv(x, W_query, W_key, W_value):
    queries = x @ W_query  # (..., num_tokens, d_k)
    keys = x @ W_key  # (..., num_tokens, d_k)
    values = x @ W_value  # (..., num_tokens, d_v)
    return queries, keys, values


def my_attention(query, key, value):
    d_k = key.shape[-1]
    attn_scores = query @ key.transpose(-2, -1)  # (..., num_tokens_q, num_tokens_kv)
    attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)
    return attn_weights @ value  # (..., num_tokens_q, d_v)


# --- softmax ---------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    attnlib.softmax, torch.softmax, stable_softmax,
    lambda x, dim=-1: torch.nn.functional.softmax(x, dim=dim),
], ids=["attnlib", "torch", "book-solution", "functional"])
def test_check_softmax_accepts_right_answers(answer, capsys):
    assert check_softmax(answer) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_softmax_names_the_naive_softmax_that_overflows():
    def naive(x, dim=-1):
        return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, naive)
    assert "overflows" in message and "naive softmax" in message and "near +1000" in message


def test_check_softmax_names_the_wrong_dimension():
    def over_columns(x, dim=-1):
        return torch.softmax(x, dim=0)

    message = failure_of(check_softmax, over_columns)
    assert "wrong dimension" in message and "dim 0 instead of dim=-1" in message


def test_check_softmax_names_an_ignored_dim():
    def last_dim_only(x, dim=-1):
        return stable_softmax(x, dim=-1)

    message = failure_of(check_softmax, last_dim_only)
    assert "ignores its dim argument" in message and "dim=0" in message


def test_check_softmax_names_a_missing_normalisation():
    message = failure_of(check_softmax, lambda x, dim=-1: torch.exp(x))
    assert "is not normalised" in message and "exp(x)" in message


def test_check_softmax_names_a_shifted_but_unnormalised_answer():
    message = failure_of(check_softmax,
                         lambda x, dim=-1: torch.exp(x - x.amax(dim=dim, keepdim=True)))
    assert "is not normalised" in message and "exp(x - max)" in message


def test_check_softmax_names_the_global_maximum():
    def global_shift(x, dim=-1):
        exp_x = torch.exp(x - x.max())
        return exp_x / exp_x.sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, global_shift)
    assert "maximum of the whole tensor" in message and "0 / 0 = nan" in message


def test_check_softmax_names_a_shift_by_the_minimum():
    # exact in exact arithmetic, but exp(x - min) overflows once a row spans > 709
    def min_shift(x, dim=-1):
        exp_x = torch.exp(x - x.amin(dim=dim, keepdim=True))
        return exp_x / exp_x.sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, min_shift)
    assert "subtracts the minimum along dim" in message and "from about -2000" in message


def test_check_softmax_names_a_shift_by_the_mean():
    def mean_shift(x, dim=-1):
        exp_x = torch.exp(x - x.mean(dim=dim, keepdim=True))
        return exp_x / exp_x.sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, mean_shift)
    assert "subtracts the mean along dim" in message and "from about -2000" in message


def test_check_softmax_names_a_sum_over_the_whole_tensor():
    def whole_sum(x, dim=-1):
        exp_x = torch.exp(x - x.amax(dim=dim, keepdim=True))
        return exp_x / exp_x.sum()

    message = failure_of(check_softmax, whole_sum)
    assert "sum over the whole tensor instead of the sum along dim" in message


@pytest.mark.parametrize("reduction", ["amax", "sum"])
def test_check_softmax_explains_a_missing_keepdim(reduction):
    def no_keepdim(x, dim=-1):
        if reduction == "amax":
            exp_x = torch.exp(x - x.amax(dim=dim))
            return exp_x / exp_x.sum(dim=dim, keepdim=True)
        exp_x = torch.exp(x - x.amax(dim=dim, keepdim=True))
        return exp_x / exp_x.sum(dim=dim)

    message = failure_of(check_softmax, no_keepdim)  # torch's error type is not asserted
    assert "raised" in message and "pass keepdim=True" in message


def test_check_softmax_explains_max_without_values():
    def max_pair(x, dim=-1):
        exp_x = torch.exp(x - x.max(dim=dim, keepdim=True))
        return exp_x / exp_x.sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, max_pair)
    assert "returns a pair (values, indices)" in message and ".values" in message


def test_check_softmax_leaves_other_errors_without_a_hint():
    # The learner's own error, not one of torch's, whose type and text change between
    # releases (torch.softmax(x, dim=None) raised TypeError in 2.13, RuntimeError in 2.11).
    def unfinished(x, dim=-1):
        raise LookupError("my table of exponentials is empty")

    message = failure_of(check_softmax, unfinished)
    assert "raised LookupError" in message and "keepdim" not in message


def test_check_softmax_names_the_log_softmax():
    message = failure_of(check_softmax, lambda x, dim=-1: torch.log_softmax(x, dim=dim))
    assert "log-softmax" in message


def test_check_softmax_names_an_answer_that_changes_its_input():
    def in_place(x, dim=-1):
        x -= x.amax(dim=dim, keepdim=True)
        return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)

    message = failure_of(check_softmax, in_place)
    assert "changed its argument x in place" in message


def test_check_softmax_reports_an_unrecognised_answer_with_the_difference():
    message = failure_of(check_softmax, lambda x, dim=-1: torch.softmax(2 * x, dim=dim))
    assert "differs from the right answer by up to" in message
    assert "none of the typical mistakes" in message


# --- simplified attention (chapter 1) ----------------------------------------------------


@pytest.mark.parametrize("answer", [
    lambda x: attnlib.simplified_attention(x)[0], my_simplified_attention,
], ids=["attnlib", "book-solution"])
def test_check_simplified_attention_accepts_right_answers(answer):
    assert check_simplified_attention(answer) is True


def test_check_simplified_attention_names_returned_weights():
    message = failure_of(check_simplified_attention, lambda x: torch.softmax(x @ x.T, dim=-1))
    assert "returns the attention weights" in message


def test_check_simplified_attention_names_a_returned_pair():
    message = failure_of(check_simplified_attention, attnlib.simplified_attention)
    assert "returned a tuple of 2" in message and "context vectors" in message


def test_check_simplified_attention_names_the_wrong_softmax_dimension():
    message = failure_of(check_simplified_attention,
                         lambda x: torch.softmax(x @ x.T, dim=0) @ x)
    assert "wrong dimension" in message and "dim=0" in message


def test_check_simplified_attention_names_transposed_weights():
    message = failure_of(check_simplified_attention,
                         lambda x: torch.softmax(x @ x.T, dim=-1).T @ x)
    assert "transposed weights" in message and "A^T X" in message


def test_check_simplified_attention_names_a_sqrt_d_scale():
    message = failure_of(check_simplified_attention,
                         lambda x: torch.softmax(x @ x.T / math.sqrt(x.shape[-1]), dim=-1) @ x)
    assert "1/sqrt(d_in)" in message and "no scale" in message


def test_check_simplified_attention_names_a_missing_softmax():
    message = failure_of(check_simplified_attention, lambda x: (x @ x.T) @ x)
    assert "skips the softmax" in message


def test_check_simplified_attention_names_division_by_the_row_sum():
    def by_sum(x):
        scores = x @ x.T
        return scores / scores.sum(dim=-1, keepdim=True) @ x

    message = failure_of(check_simplified_attention, by_sum)
    assert "row sum instead of using the softmax" in message


@pytest.mark.parametrize("dim", [-1, 0])
def test_check_simplified_attention_names_scores_between_dimensions(dim):
    message = failure_of(check_simplified_attention,
                         lambda x: x @ torch.softmax(x.T @ x, dim=dim))
    assert "computes the scores as x.T @ x" in message and "(d_in, d_in)" in message
    assert ("softmax over dim=0" in message) == (dim == 0)


def test_check_simplified_attention_names_a_naive_softmax():
    def naive(x):
        exp_scores = torch.exp(x @ x.T)
        return exp_scores / exp_scores.sum(dim=-1, keepdim=True) @ x

    message = failure_of(check_simplified_attention, naive)
    assert "overflows" in message and "naive" in message and "size about 25" in message


# --- the query, key and value projections (chapter 2) ------------------------------------


def test_check_qkv_projection_accepts_the_book_solution():
    assert check_qkv_projection(project_qkv) is True


def test_check_qkv_projection_names_a_matrix_in_the_wrong_role():
    def keys_from_w_query(x, W_query, W_key, W_value):
        return x @ W_query, x @ W_query, x @ W_value

    message = failure_of(check_qkv_projection, keys_from_w_query)
    assert "the keys returned" in message and "are x @ W_query, expected x @ W_key" in message


def test_check_qkv_projection_names_the_wrong_order():
    def values_first(x, W_query, W_key, W_value):
        return x @ W_value, x @ W_key, x @ W_query

    message = failure_of(check_qkv_projection, values_first)
    assert "the queries returned" in message and "wrong order" in message


def test_check_qkv_projection_names_the_transposed_product():
    def transposed(x, W_query, W_key, W_value):
        return tuple(w.T @ x.T for w in (W_query, W_key, W_value))

    message = failure_of(check_qkv_projection, transposed)
    assert "are transposed" in message and "W^T x^T" in message


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_check_qkv_projection_names_x_dot_t_on_a_batch():
    def with_x_t(x, W_query, W_key, W_value):
        return tuple((w.T @ x.T).T for w in (W_query, W_key, W_value))

    message = failure_of(check_qkv_projection, with_x_t)
    assert "x.T" in message and "batch" in message


def test_check_qkv_projection_explains_a_transposed_matrix():
    def with_w_t(x, W_query, W_key, W_value):
        return x @ W_query.T, x @ W_key.T, x @ W_value.T

    message = failure_of(check_qkv_projection, with_w_t)
    assert "cannot be multiplied" in message and "needs no transpose" in message
    assert "(d_in, d_k) = (3, 4)" in message


def test_check_qkv_projection_needs_three_tensors():
    message = failure_of(check_qkv_projection, lambda x, wq, wk, wv: (x @ wq, x @ wk))
    assert "tuple of length 2" in message and "(queries, keys, values)" in message


# --- scaled dot-product attention (chapter 2) --------------------------------------------


@pytest.mark.parametrize("answer", [
    attnlib.scaled_dot_product_attention,
    torch.nn.functional.scaled_dot_product_attention,
    my_attention,
], ids=["attnlib", "torch", "book-solution"])
def test_check_sdpa_accepts_right_answers(answer):
    assert check_scaled_dot_product_attention(answer) is True


def _sdpa_with(scale=None, dim=-1, transpose_scores=False, transpose_weights=False):
    def answer(query, key, value):
        d_k = query.shape[-1]
        scores = query @ key.transpose(-2, -1)
        if transpose_scores:
            scores = scores.transpose(-2, -1)
        scores = scores / (math.sqrt(d_k) if scale is None else scale(query, value))
        weights = torch.softmax(scores, dim=dim)
        if transpose_weights:
            weights = weights.transpose(-2, -1)
        return weights @ value

    return answer


def test_check_sdpa_names_unscaled_scores():
    message = failure_of(check_scaled_dot_product_attention, _sdpa_with(lambda q, v: 1.0))
    assert "does not scale the scores" in message


def test_check_sdpa_names_a_sqrt_d_v_scale():
    answer = _sdpa_with(lambda q, v: math.sqrt(v.shape[-1]))
    message = failure_of(check_scaled_dot_product_attention, answer)
    assert "1/sqrt(d_v) = 1/sqrt(3)" in message


def test_check_sdpa_names_a_d_k_scale():
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(lambda q, v: q.shape[-1]))
    assert "1/d_k = 1/4 instead of 1/sqrt(d_k)" in message


def test_check_sdpa_names_d_k_to_the_power_one_half():
    # d_k**1/2 is (d_k**1)/2: right at d_k = 4, wrong on the batch probe (d_k = 5)
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(lambda q, v: q.shape[-1]**1/2))
    assert "d_k**1/2" in message and "d_k/2 = 2.5" in message and "a batch" in message


def test_check_sdpa_names_scores_divided_by_d_k_to_the_power_one_half():
    # scores / d_k**1/2 is (scores / d_k**1) / 2: wrong already at d_k = 4
    def slip(query, key, value):
        d_k = query.shape[-1]
        attn_scores = query @ key.transpose(-2, -1)
        return torch.softmax(attn_scores / d_k**1/2, dim=-1) @ value

    message = failure_of(check_scaled_dot_product_attention, slip)
    assert "divides by 2 * d_k = 8, not by sqrt(d_k) = 2" in message
    assert "`scores / d_k**1/2` is read as (scores / d_k**1) / 2" in message


def test_check_sdpa_names_a_multiplication_by_sqrt_d_k():
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(lambda q, v: 1 / math.sqrt(q.shape[-1])))
    assert "multiplies the scores by sqrt(d_k) = sqrt(4)" in message


def test_check_sdpa_names_a_scale_after_the_softmax():
    def scaled_after(query, key, value):
        weights = torch.softmax(query @ key.transpose(-2, -1), dim=-1)
        return weights / math.sqrt(query.shape[-1]) @ value

    message = failure_of(check_scaled_dot_product_attention, scaled_after)
    assert "scales after the softmax" in message


def test_check_sdpa_names_a_scale_by_the_number_of_tokens():
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(lambda q, v: math.sqrt(len(q))))
    assert "1/sqrt(num_tokens) = 1/sqrt(5)" in message and "query.shape[-1]" in message


def test_check_sdpa_names_key_shape_1_on_a_batch():
    # key.shape[1] is d_k for (num_tokens, d_k), but num_tokens_kv on a batch
    def shape_1(query, key, value):
        scores = query @ key.transpose(-2, -1) / math.sqrt(key.shape[1])
        return torch.softmax(scores, dim=-1) @ value

    message = failure_of(check_scaled_dot_product_attention, shape_1)
    assert "1/sqrt(num_tokens_kv) = 1/sqrt(6)" in message and "a batch" in message


def test_check_sdpa_names_query_shape_1_on_a_batch():
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(lambda q, v: math.sqrt(q.shape[1])))
    assert "1/sqrt(num_tokens_q) = 1/sqrt(4)" in message


def test_check_sdpa_names_a_scale_by_the_batch_size():
    def batch_scale(query, key, value):
        size = query.shape[0] if query.ndim == 3 else query.shape[-1]  # right without a batch
        return torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(size), dim=-1) @ value

    message = failure_of(check_scaled_dot_product_attention, batch_scale)
    assert "1/sqrt(batch) = 1/sqrt(2)" in message


def test_check_sdpa_names_the_wrong_softmax_dimension():
    message = failure_of(check_scaled_dot_product_attention, _sdpa_with(dim=-2))
    assert "wrong dimension" in message and "dim=-1" in message


def test_check_sdpa_names_a_softmax_over_the_queries_of_a_batch():
    # dim=1 is right for one (num_tokens_q, num_tokens_kv) matrix, wrong once a batch leads.
    message = failure_of(check_scaled_dot_product_attention, _sdpa_with(dim=1))
    assert "wrong dimension" in message and "a batch" in message


def test_check_sdpa_names_transposed_weights():
    message = failure_of(check_scaled_dot_product_attention,
                         _sdpa_with(transpose_weights=True))
    assert "transposed weights" in message


def test_check_sdpa_names_transposed_scores():
    message = failure_of(check_scaled_dot_product_attention, _sdpa_with(transpose_scores=True))
    assert "transposed scores" in message and "key @ query^T" in message


def test_check_sdpa_names_returned_weights():
    def weights_only(query, key, value):
        return attnlib.scaled_dot_product_attention(query, key, value, return_weights=True)[1]

    message = failure_of(check_scaled_dot_product_attention, weights_only)
    assert "returns the attention weights" in message


def test_check_sdpa_names_a_returned_pair():
    def both(query, key, value):
        return attnlib.scaled_dot_product_attention(query, key, value, return_weights=True)

    message = failure_of(check_scaled_dot_product_attention, both)
    assert "returned a tuple of 2" in message


def test_check_sdpa_names_a_naive_softmax():
    def naive(query, key, value):
        exp_scores = torch.exp(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]))
        return exp_scores / exp_scores.sum(dim=-1, keepdim=True) @ value

    message = failure_of(check_scaled_dot_product_attention, naive)
    assert "overflows" in message and "naive" in message and "large scores" in message


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_check_sdpa_names_key_dot_t_on_a_batch():
    def with_key_t(query, key, value):
        return torch.softmax(query @ key.T / math.sqrt(query.shape[-1]), dim=-1) @ value

    message = failure_of(check_scaled_dot_product_attention, with_key_t)
    assert "key.transpose(-2, -1)" in message and "without a batch dimension" in message


# --- nonsense, random state, devices -----------------------------------------------------

CHECKS = [check_softmax, check_simplified_attention, check_qkv_projection,
          check_scaled_dot_product_attention]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_string_is_a_clear_check_failure(check):
    message = failure_of(check, "my_function")
    assert "a function" in message and "got str" in message


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_called_stub_says_to_fill_it_in(check):
    def stub(*args, **kwargs):
        raise NotImplementedError("fill me in")

    message = failure_of(check, stub)
    assert "NotImplementedError" in message and "replace the stub" in message


@pytest.mark.parametrize("check, answer", [
    (check_softmax, lambda x, dim=-1: torch.softmax(x, dim=dim)[..., :1]),
    (check_simplified_attention, lambda x: x[:1]),
    (check_qkv_projection, lambda x, wq, wk, wv: (x @ wq, x @ wk, (x @ wv)[..., :1])),
    (check_scaled_dot_product_attention, lambda q, k, v: q),
], ids=["softmax", "simplified", "qkv", "sdpa"])
def test_a_wrong_shape_is_named(check, answer):
    message = failure_of(check, answer)
    assert "returned shape" in message or "have shape" in message


@pytest.mark.parametrize("check, answer", [
    (check_softmax, lambda x, dim=-1: torch.softmax(x.float(), dim=dim)),
    (check_simplified_attention, lambda x: my_simplified_attention(x.float())),
    (check_qkv_projection,
     lambda x, wq, wk, wv: tuple(t.float() for t in project_qkv(x, wq, wk, wv))),
    (check_scaled_dot_product_attention, lambda q, k, v: my_attention(q, k, v).float()),
], ids=["softmax", "simplified", "qkv", "sdpa"])
def test_a_wrong_dtype_is_named(check, answer):
    message = failure_of(check, answer)
    assert "dtype torch.float32; expected torch.float64" in message


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_number_instead_of_a_tensor_is_named(check):
    message = failure_of(check, lambda *args, **kwargs: 0.5)
    assert "float" in message


@pytest.mark.parametrize("check, answer", [
    (check_softmax, stable_softmax),
    (check_simplified_attention, my_simplified_attention),
    (check_qkv_projection, project_qkv),
    (check_scaled_dot_product_attention, my_attention),
], ids=["softmax", "simplified", "qkv", "sdpa"])
def test_the_global_random_state_is_unchanged(check, answer):
    def draws_random_numbers(*args, **kwargs):
        torch.rand(100)  # as a learner's code with dropout would
        return answer(*args, **kwargs)

    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert check(draws_random_numbers) is True
    assert torch.equal(torch.get_rng_state(), before)
    failure_of(check, lambda *args, **kwargs: torch.rand(3))  # a failing check too
    assert torch.equal(torch.get_rng_state(), before)


def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        check_softmax(stable_softmax, device="cuda")


@CUDA
@pytest.mark.parametrize("check, answer", [
    (check_softmax, stable_softmax),
    (check_simplified_attention, my_simplified_attention),
    (check_qkv_projection, project_qkv),
    (check_scaled_dot_product_attention, my_attention),
], ids=["softmax", "simplified", "qkv", "sdpa"])
def test_checks_run_on_cuda(check, answer):
    assert check(answer, device="cuda") is True

    def on_the_cpu(*args, **kwargs):
        out = answer(*args, **kwargs)
        return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()

    assert "expected it on cuda" in failure_of(lambda a: check(a, device="cuda"), on_the_cpu)
