"""Tests for attnlib.experiments: the measured case for the 1/sqrt(d_k) scale.

The experiments are random but seeded, so every test here is deterministic.
Statistical tolerances are stated next to each test, derived from the theory
of the quantity measured, at 5 standard errors unless said otherwise: a
correct implementation passes with any seed except with probability below
about 1e-6 per comparison, while the mistakes these tests target (a missing
scale, ``1/d_k`` instead of ``1/sqrt(d_k)``, scores from the wrong vectors)
move the result by many standard errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import experiments
from attnlib.experiments import (
    QueryGradientNorm,
    dot_product_variance,
    query_gradient_norm,
    softmax_jacobian,
    softmax_peakiness,
)
from attnlib.experiments._scaling import random_queries_and_keys

POWERS_OF_TWO = [2**i for i in range(11)]  # 1, 2, 4, ..., 1024


@pytest.fixture(scope="module")
def variance_sweep():
    return dot_product_variance(POWERS_OF_TWO, num_samples=10_000, seed=0)


@pytest.fixture(scope="module")
def peakiness_sweep():
    return softmax_peakiness(POWERS_OF_TWO, num_tokens=16, num_samples=1_000, seed=0)


@pytest.fixture(scope="module")
def gradient_sweep():
    # The chapter's sweep: the same queries and keys as peakiness_sweep.
    return query_gradient_norm(POWERS_OF_TWO, num_tokens=16, num_samples=1_000, seed=0)


# --------------------------------------------------------------------------- variance of q . k
#
# For q, k with independent N(0, 1) components, X = q . k = sum_i q_i k_i has
# mean 0 and variance d_k (Vaswani et al. 2017, footnote 4). Its fourth moment:
# each term q_i k_i has E[(q_i k_i)^4] = 3 * 3 = 9, so its fourth cumulant is
# 9 - 3 = 6, and cumulants add over the d_k independent terms:
# E[X^4] = 3 d_k^2 + 6 d_k. The sample variance s^2 of n draws then has
# Var(s^2) ~= (E[X^4] - d_k^2) / n = (2 d_k^2 + 6 d_k) / n, a relative standard
# error of sqrt((2 + 6 / d_k) / n): 2.8 % at d_k = 1 and 1.4 % at d_k = 1024
# for n = 10 000.


def _relative_se_of_variance(d_k: int, n: int) -> float:
    return math.sqrt((2 + 6 / d_k) / n)


def test_unscaled_variance_is_d_k_within_5_standard_errors(variance_sweep):
    n = variance_sweep.num_samples
    for d_k, measured in zip(variance_sweep.d_ks, variance_sweep.unscaled_variance.tolist(), strict=False):
        tolerance = 5 * d_k * _relative_se_of_variance(d_k, n)
        assert abs(measured - d_k) <= tolerance, (d_k, measured, tolerance)


def test_scaled_variance_is_one_within_5_standard_errors(variance_sweep):
    n = variance_sweep.num_samples
    for d_k, measured in zip(variance_sweep.d_ks, variance_sweep.scaled_variance.tolist(), strict=False):
        tolerance = 5 * _relative_se_of_variance(d_k, n)  # at most 0.14
        assert abs(measured - 1.0) <= tolerance, (d_k, measured, tolerance)


def test_mean_of_dot_product_is_zero_within_5_standard_errors(variance_sweep):
    # The sample mean of X has standard error sqrt(d_k / n).
    n = variance_sweep.num_samples
    for d_k, measured in zip(variance_sweep.d_ks, variance_sweep.mean.tolist(), strict=False):
        assert abs(measured) <= 5 * math.sqrt(d_k / n), (d_k, measured)


def test_relative_standard_error_property_matches_the_derivation(variance_sweep):
    expected = [_relative_se_of_variance(d_k, variance_sweep.num_samples) for d_k in POWERS_OF_TWO]
    # The property uses the exact n - 1 of the unbiased estimator: equal to 1e-4.
    torch.testing.assert_close(
        variance_sweep.relative_standard_error,
        torch.tensor(expected, dtype=torch.float64),
        rtol=1e-4, atol=0,
    )


def test_scaled_variance_is_unscaled_variance_over_d_k(variance_sweep):
    d_ks = torch.tensor(variance_sweep.d_ks, dtype=torch.float64)
    torch.testing.assert_close(
        variance_sweep.scaled_variance, variance_sweep.unscaled_variance / d_ks
    )


def test_variance_result_shapes_and_dtype(variance_sweep):
    assert variance_sweep.d_ks == tuple(POWERS_OF_TWO)
    assert variance_sweep.num_samples == 10_000
    for field in ("mean", "unscaled_variance", "scaled_variance"):
        value = getattr(variance_sweep, field)
        assert value.shape == (len(POWERS_OF_TWO),)
        assert value.dtype == torch.float64


def test_variance_is_seeded():
    first = dot_product_variance([3, 50], num_samples=500, seed=7)
    again = dot_product_variance([3, 50], num_samples=500, seed=7)
    other = dot_product_variance([3, 50], num_samples=500, seed=8)
    torch.testing.assert_close(first.unscaled_variance, again.unscaled_variance, rtol=0, atol=0)
    assert not torch.equal(first.unscaled_variance, other.unscaled_variance)


def test_variance_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    dot_product_variance([4], num_samples=10, seed=0)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- peakiness
#
# Reference distribution, built another way: for a fixed query q and keys with
# independent N(0, 1) components, the scores q . k_j are independent N(0, |q|^2)
# (a Gaussian vector is rotation invariant), and |q| is the norm of a d_k-dim
# standard normal vector. So ``|q| * z`` with z ~ N(0, I_num_tokens) has exactly
# the distribution of the unscaled scores, and ``|q| * z / sqrt(d_k)`` that of
# the scaled ones. The experiment's mean and the reference mean are then two
# independent estimates of one number: their difference has standard error
# sqrt(sd_exp^2 / n_exp + sd_ref^2 / n_ref), with sd_exp ~= sd_ref (we use the
# reference's sample sd for both).


def _reference_scores(d_k: int, num_tokens: int, n: int, seed: int, scaled: bool):
    generator = torch.Generator().manual_seed(seed)
    q_norm = torch.randn(n, d_k, generator=generator, dtype=torch.float64).norm(dim=-1)
    z = torch.randn(n, num_tokens, generator=generator, dtype=torch.float64)
    scores = q_norm[:, None] * z
    return scores / math.sqrt(d_k) if scaled else scores


def _assert_same_mean(measured: float, reference: torch.Tensor, n_measured: int, label):
    se = math.sqrt(reference.var().item() * (1 / n_measured + 1 / reference.numel()))
    assert abs(measured - reference.mean().item()) <= 5 * se, (label, measured, reference.mean())


@pytest.mark.parametrize("scaled", [False, True])
def test_peakiness_matches_the_reference_distribution(peakiness_sweep, scaled):
    for index, d_k in enumerate(peakiness_sweep.d_ks):
        if d_k not in (1, 8, 64, 1024):
            continue
        scores = _reference_scores(d_k, 16, 4_000, seed=1000 + d_k, scaled=scaled)
        weights = torch.softmax(scores, dim=-1)
        max_weight = weights.amax(dim=-1)
        entropy = -(weights * torch.log_softmax(scores, dim=-1)).sum(dim=-1)
        tag = "scaled" if scaled else "unscaled"
        _assert_same_mean(
            getattr(peakiness_sweep, f"{tag}_max_weight")[index].item(),
            max_weight, peakiness_sweep.num_samples, (tag, "max", d_k),
        )
        _assert_same_mean(
            getattr(peakiness_sweep, f"{tag}_entropy")[index].item(),
            entropy, peakiness_sweep.num_samples, (tag, "entropy", d_k),
        )


EVERY_FOURFOLD = slice(0, None, 2)  # d_k = 1, 4, 16, 64, 256, 1024 in POWERS_OF_TWO


def test_unscaled_softmax_gets_peakier_as_d_k_grows(peakiness_sweep):
    # Seeded, so deterministic. Checked at every fourfold step of d_k: the
    # smallest step (256 -> 1024) is about 0.07 in max weight and 0.18 nats in
    # entropy, over 10 standard errors of a difference at n = 1000 (per-sample
    # sd <= 0.22 and <= 0.54). At every doubling the last step (512 -> 1024)
    # is only a few standard errors, too close to call.
    assert torch.all(torch.diff(peakiness_sweep.unscaled_max_weight[EVERY_FOURFOLD]) > 0)
    assert torch.all(torch.diff(peakiness_sweep.unscaled_entropy[EVERY_FOURFOLD]) < 0)
    # Near one-hot at d_k = 1024: most of the weight on one key, entropy far
    # below the uniform log(16) = 2.77 nats.
    assert peakiness_sweep.unscaled_max_weight[-1] > 0.9
    assert peakiness_sweep.unscaled_entropy[-1] < 0.2


def test_scaled_softmax_stays_flat_while_unscaled_does_not():
    # For d_k >= 16 a sample's scaled max weight has sd <= 0.10 and entropy sd
    # <= 0.23 (measured), so at n = 4000 the difference of two means has
    # standard error <= 0.0023 (max weight) and <= 0.0052 (entropy). The claim
    # tested: the scaled values move by less than 0.02 and 0.05 across d_k =
    # 16..1024 (about 9 standard errors), while the unscaled ones move by more
    # than 0.2 and 0.5.
    result = softmax_peakiness([16, 64, 256, 1024], num_samples=4_000, seed=3)

    def spread(x):
        return (x.max() - x.min()).item()

    assert spread(result.scaled_max_weight) < 0.02
    assert spread(result.scaled_entropy) < 0.05
    assert spread(result.unscaled_max_weight) > 0.2
    assert spread(result.unscaled_entropy) > 0.5


def test_peakiness_at_d_k_1_is_the_same_scaled_and_unscaled(peakiness_sweep):
    assert peakiness_sweep.d_ks[0] == 1
    assert peakiness_sweep.scaled_max_weight[0] == peakiness_sweep.unscaled_max_weight[0]
    assert peakiness_sweep.scaled_entropy[0] == peakiness_sweep.unscaled_entropy[0]


def test_peakiness_values_lie_in_their_ranges(peakiness_sweep):
    num_tokens = peakiness_sweep.num_tokens
    assert peakiness_sweep.max_entropy == pytest.approx(math.log(num_tokens))
    for tag in ("unscaled", "scaled"):
        max_weight = getattr(peakiness_sweep, f"{tag}_max_weight")
        entropy = getattr(peakiness_sweep, f"{tag}_entropy")
        assert max_weight.shape == entropy.shape == (len(POWERS_OF_TWO),)
        assert torch.all((max_weight >= 1 / num_tokens) & (max_weight <= 1))
        assert torch.all((entropy >= 0) & (entropy <= math.log(num_tokens)))


# --------------------------------------------------------------------------- softmax Jacobian


def _autograd_jacobian(scores: torch.Tensor) -> torch.Tensor:
    """d softmax(s) / d s by autograd, for scores of shape (..., num_tokens)."""
    flat = scores.reshape(-1, scores.shape[-1])  # (batch, num_tokens)
    jac = torch.func.vmap(torch.func.jacrev(lambda s: torch.softmax(s, dim=-1)))(flat)
    return jac.reshape(*scores.shape, scores.shape[-1])  # (..., num_tokens, num_tokens)


@settings(max_examples=40, deadline=None)
@given(
    batch_shape=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    num_tokens=st.integers(1, 8),
    temperature=st.floats(0.01, 30.0),
    seed=st.integers(0, 2**16),
)
def test_softmax_jacobian_equals_autograd(batch_shape, num_tokens, temperature, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = temperature * torch.randn(
        *batch_shape, num_tokens, generator=generator, dtype=torch.float64
    )
    expected = _autograd_jacobian(scores)
    actual = softmax_jacobian(torch.softmax(scores, dim=-1))
    assert actual.shape == (*batch_shape, num_tokens, num_tokens)
    torch.testing.assert_close(actual, expected)


def test_softmax_jacobian_known_values():
    uniform = torch.full((16,), 1 / 16, dtype=torch.float64)
    norm = torch.linalg.matrix_norm(softmax_jacobian(uniform)).item()
    assert norm == pytest.approx(math.sqrt(15) / 16)
    two_way = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    expected = torch.zeros(4, 4, dtype=torch.float64)
    expected[:2, :2] = torch.tensor([[0.25, -0.25], [-0.25, 0.25]])
    torch.testing.assert_close(softmax_jacobian(two_way), expected)
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    assert torch.equal(softmax_jacobian(one_hot), torch.zeros(3, 3))


def test_softmax_jacobian_rows_sum_to_zero_and_it_is_symmetric():
    weights = torch.softmax(torch.randn(5, 7, generator=torch.Generator().manual_seed(0)), dim=-1)
    jac = softmax_jacobian(weights)
    torch.testing.assert_close(jac.sum(dim=-1), torch.zeros(5, 7))
    torch.testing.assert_close(jac, jac.transpose(-2, -1))
    assert jac.dtype == weights.dtype


def test_softmax_jacobian_does_not_mutate_its_input():
    weights = torch.tensor([0.2, 0.3, 0.5])
    before = weights.clone()
    softmax_jacobian(weights)
    assert torch.equal(weights, before)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([0.5, 0.5], TypeError, "attn_weights must be a torch.Tensor"),
        (torch.tensor([0, 1]), TypeError, "floating-point dtype"),
        (torch.tensor(1.0), ValueError, "at least 1 dimension"),
    ],
)
def test_softmax_jacobian_rejects_bad_input(bad, error, match):
    with pytest.raises(error, match=match):
        softmax_jacobian(bad)


# --------------------------------------------------------------------------- query gradient
#
# For one query q (d_k,) and its keys K (num_tokens, d_k), w = softmax(K q / c)
# with c = 1 (unscaled) or sqrt(d_k) (scaled). The experiment reports the
# Frobenius norm of d w / d q = J(w) K / c per query.


def _autograd_query_jacobian(query: torch.Tensor, keys: torch.Tensor, c: float):
    """d softmax(K q / c) / d q by autograd: (num_tokens, d_k)."""
    return torch.func.jacrev(lambda q: torch.softmax(keys @ q / c, dim=-1))(query)


def test_query_gradient_equals_autograd_on_the_same_draws():
    # Rebuild the experiment's own queries and keys from the shared sampler and
    # differentiate the attention weights by autograd: a missing (or squared)
    # chain-rule factor 1/c, a Jacobian taken at the wrong scores or a wrong J
    # would all differ by far more than rounding.
    d_ks, num_tokens, num_samples, seed = [3, 40], 5, 30, 11
    result = query_gradient_norm(d_ks, num_tokens, num_samples, seed=seed)
    peak = softmax_peakiness(d_ks, num_tokens, num_samples, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    for index, d_k in enumerate(d_ks):
        (queries, keys), = random_queries_and_keys(
            d_k, num_tokens, num_samples, generator
        )
        for c, measured in ((1.0, result.unscaled), (math.sqrt(d_k), result.scaled)):
            expected = torch.stack([
                torch.linalg.matrix_norm(_autograd_query_jacobian(q[0], k, c))
                for q, k in zip(queries, keys, strict=True)
            ])
            torch.testing.assert_close(measured[index], expected)
        # ... and they are the queries and keys softmax_peakiness used.
        attn_scores = (queries @ keys.transpose(-2, -1)).squeeze(-2)  # (n, num_tokens)
        weights = torch.softmax(attn_scores, dim=-1)
        torch.testing.assert_close(peak.unscaled_max_weight[index], weights.amax(-1).mean())
        # The gap between the two best scores, of the same draws.
        ordered = attn_scores.sort(dim=-1, descending=True).values
        torch.testing.assert_close(result.top_two_gap[index], ordered[:, 0] - ordered[:, 1])


def _reference_query_gradient_norms(d_k: int, num_tokens: int, n: int, seed: int, scaled: bool):
    """Norms of d w / d q drawn another way. For a fixed q, split each key into
    its component along q / |q| (a ~ N(0, I_num_tokens)) and the rest (G, of
    shape (num_tokens, d_k - 1), independent N(0, 1)); then the scores are
    |q| a / c and ||J K||_F^2 = |J a|^2 + ||J G||_F^2, the two parts being
    orthogonal. |q| is the norm of a d_k-dim standard normal vector."""
    generator = torch.Generator().manual_seed(seed)
    c = math.sqrt(d_k) if scaled else 1.0
    norms = []
    for start in range(0, n, 250):
        size = min(250, n - start)
        q_norm = torch.randn(size, d_k, generator=generator, dtype=torch.float64).norm(dim=-1)
        a = torch.randn(size, num_tokens, generator=generator, dtype=torch.float64)
        rest = torch.randn(size, num_tokens, d_k - 1, generator=generator, dtype=torch.float64)
        jac = _autograd_jacobian(q_norm[:, None] * a / c)  # (size, N, N)
        along = (jac @ a.unsqueeze(-1)).squeeze(-1).square().sum(-1)
        across = torch.linalg.matrix_norm(jac @ rest).square()
        norms.append(torch.sqrt(along + across) / c)
    return torch.cat(norms)


@pytest.mark.parametrize("scaled", [False, True])
def test_query_gradient_matches_the_reference_distribution(gradient_sweep, scaled):
    # Two independent estimates of one mean, compared at 5 standard errors
    # (see _assert_same_mean). A sampler that drew the wrong vectors, or a
    # missing factor sqrt(d_k), moves the mean by far more.
    for index, d_k in enumerate(gradient_sweep.d_ks):
        if d_k not in (1, 8, 64, 1024):
            continue
        reference = _reference_query_gradient_norms(d_k, 16, 2_000, 3000 + d_k, scaled)
        measured = gradient_sweep.mean(scaled=scaled)[index].item()
        _assert_same_mean(measured, reference, gradient_sweep.num_samples, (scaled, d_k))


def test_scaled_query_gradient_keeps_one_size_at_every_d_k(gradient_sweep):
    # Scaled, a query's norm has a per-sample sd below 0.05 for d_k >= 16
    # (measured), so a median of 1 000 has a standard error near 0.002: the
    # medians for d_k = 16 ... 1024 lie within 0.02 of each other (measured:
    # 0.297 to 0.305). At d_k = 1, 2, 4 the score distribution is not yet
    # Gaussian-like and the median is 0.24 to 0.28. No query saturates.
    median = gradient_sweep.median(scaled=True)
    from_16 = median[POWERS_OF_TWO.index(16):]
    assert (from_16.max() - from_16.min()).item() < 0.02
    assert torch.all((median > 0.2) & (median < 0.35))
    assert torch.all(gradient_sweep.fraction_below(1e-3, scaled=True) == 0)


def test_unscaled_query_gradient_is_heavy_tailed(gradient_sweep):
    d_ks = gradient_sweep.d_ks
    i_64, i_1024 = d_ks.index(64), d_ks.index(1024)
    median_u = gradient_sweep.median(scaled=False)
    median_s = gradient_sweep.median(scaled=True)
    mean_u = gradient_sweep.mean(scaled=False)
    mean_s = gradient_sweep.mean(scaled=True)
    # At d_k = 1 the two arms are the same computation.
    assert torch.equal(gradient_sweep.unscaled[0], gradient_sweep.scaled[0])
    # The typical query: larger than scaled at d_k = 64 (0.84 vs 0.30 here; 0.75
    # to 0.93 over seeds 0-4), hundreds of times smaller at d_k = 1024 (ratio
    # 375 to 1 000 over seeds 0-4).
    assert median_u[i_64] > 2 * median_s[i_64]
    assert median_u[i_1024] < median_s[i_1024] / 100
    # The mean is larger unscaled at every d_k > 1 (the smallest ratio, 1.4,
    # is at d_k = 2; from d_k = 16 on it is above 3, far beyond the noise).
    assert torch.all(mean_u[1:] > mean_s[1:])
    # The share of queries that get (almost) no gradient grows at every
    # fourfold step from d_k = 16 (0.2 %, 7 %, 26 %, 53 %: each step is many
    # binomial standard errors) ...
    fraction = gradient_sweep.fraction_below(1e-3, scaled=False)
    fourfold_from_16 = [d_ks.index(d_k) for d_k in (16, 64, 256, 1024)]
    assert torch.all(torch.diff(fraction[fourfold_from_16]) > 0)
    assert fraction[i_1024] > 0.4
    # ... while the top 10 % of queries get far more than any scaled query.
    p90_u = gradient_sweep.percentile(90, scaled=False)
    assert p90_u[i_1024] > 10 * gradient_sweep.scaled[i_1024].max()


def test_unscaled_query_gradient_is_large_only_for_near_ties(gradient_sweep):
    # Chapter 3 explains the heavy tail by ties: a query keeps a gradient only
    # if its two best scores are close. At d_k = 1024 (measured, seed 0): every
    # query in the top tenth has a gap below 2 (at most 1.9), every query below
    # 0.001 a gap above 11 (at least 11.1), while the median gap is about 12.
    # Were the large norms spread over all gaps, the two sets would overlap.
    i_1024 = gradient_sweep.d_ks.index(1024)
    norms, gap = gradient_sweep.unscaled[i_1024], gradient_sweep.top_two_gap[i_1024]
    assert torch.all(gap >= 0)
    top_tenth = norms >= gradient_sweep.percentile(90, scaled=False)[i_1024]
    almost_none = norms < 1e-3
    assert gap[top_tenth].max() < 2
    assert gap[almost_none].min() > 11
    # The log norm falls in a straight line with the gap (w_2 / w_1 = e^-gap).
    correlation = torch.corrcoef(torch.stack([gap, norms.log()]))[0, 1]
    assert correlation < -0.99


def test_query_gradient_result_shapes_and_methods():
    result = QueryGradientNorm(
        d_ks=(2, 5), num_tokens=3, num_samples=4,
        unscaled=torch.tensor([[0.0, 1e-4, 0.5, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64),
        scaled=torch.tensor([[0.3, 0.3, 0.3, 0.3], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64),
        top_two_gap=torch.zeros(2, 4, dtype=torch.float64),
    )
    torch.testing.assert_close(result.median(scaled=False), torch.tensor([0.25005, 2.5], dtype=torch.float64))
    torch.testing.assert_close(result.mean(scaled=True), torch.tensor([0.3, 0.25], dtype=torch.float64))
    torch.testing.assert_close(result.percentile(0, scaled=False), torch.tensor([0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(result.percentile(100, scaled=True), torch.tensor([0.3, 0.4], dtype=torch.float64))
    torch.testing.assert_close(result.fraction_below(1e-3, scaled=False), torch.tensor([0.5, 0.0], dtype=torch.float64))


def test_query_gradient_sweep_shapes(gradient_sweep):
    for norms in (gradient_sweep.unscaled, gradient_sweep.scaled, gradient_sweep.top_two_gap):
        assert norms.shape == (len(POWERS_OF_TWO), 1_000)
        assert norms.dtype == torch.float64
        assert torch.all(norms >= 0)


@pytest.mark.parametrize(
    "method, kwargs, error, match",
    [
        ("percentile", {"p": 101, "scaled": True}, ValueError, "p=101"),
        ("percentile", {"p": "50", "scaled": True}, TypeError, "p must be a number"),
        ("percentile", {"p": 50, "scaled": 1}, TypeError, "scaled must be a bool"),
        ("fraction_below", {"threshold": 0.0, "scaled": False}, ValueError, "threshold=0.0"),
        ("fraction_below", {"threshold": None, "scaled": False}, TypeError, "threshold must be"),
        ("mean", {"scaled": "yes"}, TypeError, "scaled must be a bool"),
    ],
)
def test_query_gradient_methods_reject_bad_arguments(method, kwargs, error, match):
    result = query_gradient_norm([4], num_tokens=3, num_samples=5, seed=0)
    with pytest.raises(error, match=match):
        getattr(result, method)(**kwargs)


def test_query_gradient_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = query_gradient_norm([3, 50], num_tokens=4, num_samples=20, seed=7)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)
    again = query_gradient_norm([3, 50], num_tokens=4, num_samples=20, seed=7)
    other = query_gradient_norm([3, 50], num_tokens=4, num_samples=20, seed=8)
    assert torch.equal(first.unscaled, again.unscaled) and torch.equal(first.scaled, again.scaled)
    assert not torch.equal(first.unscaled, other.unscaled)


# --------------------------------------------------------------------------- input checks

ALL_EXPERIMENTS = [dot_product_variance, softmax_peakiness, query_gradient_norm]


@pytest.mark.parametrize("experiment", ALL_EXPERIMENTS)
@pytest.mark.parametrize(
    "d_ks, error, match",
    [
        (8, TypeError, "d_ks must be a sequence"),
        ("1,2", TypeError, "d_ks must be a sequence"),
        ([], ValueError, "empty"),
        ([4, 0], ValueError, "d_k=0"),
        ([-2], ValueError, "d_k=-2"),
        ([2.0], TypeError, "2.0"),
        ([True], TypeError, "True"),
    ],
)
def test_experiments_reject_bad_d_ks(experiment, d_ks, error, match):
    with pytest.raises(error, match=match):
        experiment(d_ks)


@pytest.mark.parametrize("experiment", ALL_EXPERIMENTS)
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_samples": 1}, ValueError, "num_samples=1"),
        ({"num_samples": 100.0}, TypeError, "num_samples must be an int"),
        ({"seed": -1}, ValueError, "seed=-1"),
        ({"seed": 0.5}, TypeError, "seed must be an int"),
    ],
)
def test_experiments_reject_bad_sizes_and_seeds(experiment, kwargs, error, match):
    with pytest.raises(error, match=match):
        experiment([4], **kwargs)


@pytest.mark.parametrize("experiment", [softmax_peakiness, query_gradient_norm])
@pytest.mark.parametrize(
    "num_tokens, error, match",
    [(1, ValueError, "num_tokens=1"), ("16", TypeError, "num_tokens must be an int")],
)
def test_softmax_experiments_reject_bad_num_tokens(experiment, num_tokens, error, match):
    with pytest.raises(error, match=match):
        experiment([4], num_tokens=num_tokens)


def test_d_ks_accepts_range_and_keeps_order():
    result = dot_product_variance(range(3, 0, -1), num_samples=4, seed=0)
    assert result.d_ks == (3, 2, 1)


def test_public_names_are_listed():
    for name in experiments.__all__:
        assert getattr(experiments, name).__doc__
