"""The checkers of chapter 3 (attnlib.exercises.scaling).

Each checker must accept the reference and the solutions the book prints,
reject each typical wrong answer with a message that names it (one test per
wrong answer), answer nonsense with a clear CheckFailed, and leave the global
random state alone.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlib.exercises import CheckFailed, check_query_jacobian, check_scaled_scores

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def failure_of(check, answer) -> str:
    with pytest.raises(CheckFailed) as info:
        check(answer)
    return str(info.value)


# --- the solutions printed in chapter 3 (keep in step with the notebook) -------------------


def scaled_scores(query, key):
    d_k = query.shape[-1]  # the size of each query and key vector
    attn_scores = query @ key.transpose(-2, -1)  # (..., num_queries, num_keys)
    return attn_scores / math.sqrt(d_k)


def query_jacobian(query, key, scale):
    attn_scores = (key @ query.unsqueeze(-1)).squeeze(-1)  # (..., num_keys)
    w = torch.softmax(attn_scores * scale, dim=-1)  # the attention weights
    outer = w.unsqueeze(-1) * w.unsqueeze(-2)  # w w^T: (..., num_keys, num_keys)
    softmax_jac = torch.diag_embed(w) - outer  # d w / d (scaled scores)
    return softmax_jac @ key * scale  # chain rule: (..., num_keys, d_k)


def autograd_query_jacobian(query, key, scale):
    """The same derivative by autograd, for any number of leading dimensions."""
    def weights(q, k):
        return torch.softmax(k @ q * scale, dim=-1)

    flat_q = query.reshape(-1, query.shape[-1])
    flat_k = key.reshape(-1, *key.shape[-2:])
    jac = torch.func.vmap(torch.func.jacrev(weights))(flat_q, flat_k)
    return jac.reshape(*key.shape)


# --- check_scaled_scores -------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    scaled_scores,
    lambda q, k: torch.matmul(q, k.mT) * q.shape[-1] ** -0.5,
    lambda q, k: torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-1]),
], ids=["book-solution", "mT", "einsum"])
def test_check_scaled_scores_accepts_right_answers(answer, capsys):
    assert check_scaled_scores(answer) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_scaled_scores_names_a_missing_scale():
    message = failure_of(check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1))
    assert "does not scale the scores" in message and "sqrt(d_k) = sqrt(5)" in message


def test_check_scaled_scores_names_division_by_d_k():
    message = failure_of(check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1])
    assert "divides by d_k = 5 instead of sqrt(d_k)" in message


def test_check_scaled_scores_names_multiplication_by_sqrt_d_k():
    message = failure_of(
        check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])
    )
    assert "multiplies by sqrt(d_k)" in message


def test_check_scaled_scores_names_d_k_to_the_one_half_as_d_k_over_2():
    # `d_k ** 1/2` is (d_k ** 1) / 2: the scale comes out as d_k / 2.
    def precedence(q, k):
        scale = q.shape[-1] ** 1/2
        return q @ k.transpose(-2, -1) / scale

    message = failure_of(check_scaled_scores, precedence)
    assert "divides by d_k / 2 = 2.5" in message and "d_k ** 0.5" in message


def test_check_scaled_scores_names_scores_over_d_k_to_the_one_half():
    # `scores / d_k ** 1/2` is (scores / d_k) / 2.
    message = failure_of(
        check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1] ** 1/2
    )
    assert "divides by 2 * d_k = 10" in message and "binds tighter" in message


def test_check_scaled_scores_names_the_number_of_keys_as_scale():
    # d_k read from key.shape[0]: on one sequence that is the number of keys.
    message = failure_of(
        check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(k.shape[0])
    )
    assert "sqrt(4), the square root of the number of keys" in message
    assert "query.shape[-1]" in message


def test_check_scaled_scores_names_the_number_of_queries_as_scale():
    # d_k read from query.shape[1]: right on one sequence, the number of queries on a batch.
    message = failure_of(
        check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[1])
    )
    assert "sqrt(3), the square root of the number of queries" in message
    assert "a batch" in message


def test_check_scaled_scores_names_the_batch_size_as_scale():
    def batch_as_d_k(q, k):
        d_k = q.shape[-1] if q.ndim == 2 else q.shape[0]
        return q @ k.transpose(-2, -1) / math.sqrt(d_k)

    message = failure_of(check_scaled_scores, batch_as_d_k)
    assert "sqrt(2), the square root of the batch size" in message


def test_check_scaled_scores_names_the_softmax_applied():
    message = failure_of(check_scaled_scores, lambda q, k: torch.softmax(scaled_scores(q, k), -1))
    assert "applies the softmax" in message


def test_check_scaled_scores_names_transposed_scores():
    message = failure_of(check_scaled_scores, lambda q, k: scaled_scores(k, q))
    assert "transposed scores" in message and "key @ query^T" in message


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
def test_check_scaled_scores_names_key_T_on_a_batch():
    message = failure_of(check_scaled_scores, lambda q, k: q @ k.T / math.sqrt(q.shape[-1]))
    assert "works on a single input but not on a batch" in message and ".T" in message


def test_check_scaled_scores_names_an_in_place_change():
    def in_place(q, k):
        q /= math.sqrt(q.shape[-1])
        return q @ k.transpose(-2, -1)

    assert "changed its argument query in place" in failure_of(check_scaled_scores, in_place)


def test_check_scaled_scores_reports_an_unknown_mistake_with_its_size():
    message = failure_of(check_scaled_scores, lambda q, k: scaled_scores(q, k) + 0.1)
    assert "matches none of the typical mistakes" in message and "0.1" in message


@pytest.mark.parametrize("answer, match", [
    ("query @ key.T", "expected a function fn(query, key)"),
    (lambda q, k: scaled_scores(q, k).tolist(), "returned list"),
    (lambda q, k: scaled_scores(q, k).float(), "dtype torch.float32"),
    (lambda q, k: scaled_scores(q, k)[..., :2], "returned shape"),
], ids=["string", "list", "float32", "wrong-shape"])
def test_check_scaled_scores_answers_nonsense_clearly(answer, match):
    assert match in failure_of(check_scaled_scores, answer)


def test_check_scaled_scores_reports_the_stub():
    def stub(query, key):
        raise NotImplementedError("compute the scaled scores")

    assert "raised NotImplementedError" in failure_of(check_scaled_scores, stub)


# --- check_query_jacobian ------------------------------------------------------------------


@pytest.mark.parametrize("answer", [query_jacobian, autograd_query_jacobian],
                         ids=["book-solution", "autograd"])
def test_check_query_jacobian_accepts_right_answers(answer, capsys):
    assert check_query_jacobian(answer) is True
    assert capsys.readouterr().out.startswith("Correct:")


def _softmax_jac(w):
    return torch.diag_embed(w) - w.unsqueeze(-1) * w.unsqueeze(-2)


def _weights(query, key, scale):
    return torch.softmax((key @ query.unsqueeze(-1)).squeeze(-1) * scale, dim=-1)


def test_check_query_jacobian_names_the_missing_chain_rule_factor():
    def no_factor(query, key, scale):
        return _softmax_jac(_weights(query, key, scale)) @ key

    message = failure_of(check_query_jacobian, no_factor)
    assert "leaves out the chain-rule factor of the scale" in message


def test_check_query_jacobian_names_the_scale_applied_twice():
    def twice(query, key, scale):
        return _softmax_jac(_weights(query, key, scale)) @ key * scale**2

    assert "applies the scale twice" in failure_of(check_query_jacobian, twice)


def test_check_query_jacobian_names_the_jacobian_at_unscaled_scores():
    def unscaled_weights(query, key, scale):
        return _softmax_jac(_weights(query, key, 1.0)) @ key * scale

    assert "at the unscaled scores" in failure_of(check_query_jacobian, unscaled_weights)


def test_check_query_jacobian_names_the_flipped_sign():
    def flipped(query, key, scale):
        return -_softmax_jac(_weights(query, key, scale)) @ key * scale

    assert "sign of the softmax Jacobian flipped" in failure_of(check_query_jacobian, flipped)


def test_check_query_jacobian_names_the_missing_outer_product():
    def no_outer(query, key, scale):
        return torch.diag_embed(_weights(query, key, scale)) @ key * scale

    assert "leaves the outer product out" in failure_of(check_query_jacobian, no_outer)


def test_check_query_jacobian_names_the_diagonal_only():
    def diagonal(query, key, scale):
        w = _weights(query, key, scale)
        return torch.diag_embed(w - w**2) @ key * scale

    assert "keeps only the diagonal" in failure_of(check_query_jacobian, diagonal)


def test_check_query_jacobian_names_the_inner_product():
    def inner(query, key, scale):
        w = _weights(query, key, scale)
        return (torch.diag_embed(w) - w @ w) @ key * scale  # w @ w: a number for one query

    assert "inner product" in failure_of(check_query_jacobian, inner)


def test_check_query_jacobian_names_scale_divided_in_the_chain_rule():
    def divided(query, key, scale):
        return _softmax_jac(_weights(query, key, scale)) @ key / scale

    message = failure_of(check_query_jacobian, divided)
    assert "divides by scale = 0.4472 in the chain rule" in message


def test_check_query_jacobian_names_scale_treated_as_a_divisor():
    def divisor(query, key, scale):
        return _softmax_jac(_weights(query, key, 1 / scale)) @ key / scale

    message = failure_of(check_query_jacobian, divisor)
    assert "treats scale = 0.4472 as a divisor" in message


def test_check_query_jacobian_names_the_softmax_across_the_batch():
    # Right for one query (dim 0 is then the keys); wrong on the batch probe.
    def across_batch(query, key, scale):
        attn_scores = (key @ query.unsqueeze(-1)).squeeze(-1)
        return _softmax_jac(torch.softmax(attn_scores * scale, dim=0)) @ key * scale

    message = failure_of(check_query_jacobian, across_batch)
    assert "softmax over the wrong dimension (dim=0" in message and "a batch" in message


def test_check_query_jacobian_names_the_transpose():
    def transposed(query, key, scale):
        return query_jacobian(query, key, scale).transpose(-2, -1)

    assert "returns the transpose" in failure_of(check_query_jacobian, transposed)


def test_check_query_jacobian_names_code_that_only_works_for_one_query():
    def one_query_only(query, key, scale):
        w = torch.softmax(key @ query * scale, dim=-1)
        return (torch.diag(w) - torch.outer(w, w)) @ key * scale

    message = failure_of(check_query_jacobian, one_query_only)
    assert "works on a single input but not on a batch" in message and "torch.diag_embed" in message


def test_check_query_jacobian_names_an_in_place_change():
    def in_place(query, key, scale):
        key *= scale
        w = torch.softmax((key @ query.unsqueeze(-1)).squeeze(-1), dim=-1)
        return _softmax_jac(w) @ key

    assert "changed its argument key in place" in failure_of(check_query_jacobian, in_place)


@pytest.mark.parametrize("answer, match", [
    (query_jacobian(torch.ones(5), torch.ones(4, 5), 1.0), "expected a function"),
    (lambda q, k, s: _softmax_jac(_weights(q, k, s)), "returned shape"),
    (lambda q, k, s: query_jacobian(q, k, s).float(), "dtype torch.float32"),
], ids=["tensor", "softmax-jacobian-only", "float32"])
def test_check_query_jacobian_answers_nonsense_clearly(answer, match):
    assert match in failure_of(check_query_jacobian, answer)


# --- both ------------------------------------------------------------------------------------


def _uses_global_rng(query, key, *rest):
    torch.rand(3)  # an answer that draws from the global generator
    return scaled_scores(query, key) if not rest else query_jacobian(query, key, *rest)


@pytest.mark.parametrize("check, answer", [
    (check_scaled_scores, scaled_scores),
    (check_scaled_scores, lambda q, k: q @ k.transpose(-2, -1)),
    (check_scaled_scores, _uses_global_rng),
    (check_query_jacobian, query_jacobian),
    (check_query_jacobian, _uses_global_rng),
], ids=["scores-right", "scores-wrong", "scores-rng", "jacobian-right", "jacobian-rng"])
def test_checks_leave_the_global_random_state_alone(check, answer):
    before = torch.get_rng_state()
    try:
        check(answer)
    except CheckFailed:
        pass
    assert torch.equal(torch.get_rng_state(), before)


def test_the_reference_gradient_is_the_autograd_gradient():
    # The checker's reference formula, checked independently of the checker.
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 2, 7, generator=generator, dtype=torch.float64)
    key = torch.randn(3, 2, 6, 7, generator=generator, dtype=torch.float64)
    for scale in (1.0, 1 / math.sqrt(7), 0.05):
        torch.testing.assert_close(
            query_jacobian(query, key, scale), autograd_query_jacobian(query, key, scale)
        )


@pytest.mark.parametrize("check", [check_scaled_scores, check_query_jacobian])
def test_checks_refuse_a_bad_device(check):
    with pytest.raises(TypeError, match="device must be"):
        check(scaled_scores, device=3)


@CUDA
def test_checks_run_on_cuda():
    assert check_scaled_scores(scaled_scores, device="cuda") is True
    assert check_query_jacobian(query_jacobian, device="cuda") is True
