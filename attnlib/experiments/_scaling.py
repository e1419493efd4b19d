"""Chapter 3's experiments: why attention scores are divided by ``sqrt(d_k)``.

Each experiment draws queries and keys whose components are independent
standard normal numbers (mean 0, variance 1), the setting of Vaswani et al.
(2017), footnote 4, and measures what happens as the key dimension ``d_k``
grows, with and without the ``1 / sqrt(d_k)`` scale:
:func:`dot_product_variance`, :func:`softmax_peakiness`,
:func:`query_gradient_norm` (built on :func:`softmax_jacobian`), each with its
frozen result class. Every experiment on attention weights draws its queries and
keys from :func:`random_queries_and_keys`, so equal arguments give equal draws.
Import the public names from :mod:`attnlib.experiments`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .._validation import check_bool, check_float_tensor, check_int, type_name
from ..functional import softmax
from ._common import DTYPE

__all__ = [
    "DotProductVariance",
    "SoftmaxPeakiness",
    "QueryGradientNorm",
    "dot_product_variance",
    "softmax_peakiness",
    "query_gradient_norm",
    "softmax_jacobian",
]


# --------------------------------------------------------------------------- validation


def _check_d_ks(d_ks: object) -> tuple[int, ...]:
    if isinstance(d_ks, (str, bytes)) or not isinstance(d_ks, Sequence):
        raise TypeError(
            "d_ks must be a sequence of positive ints (a list, tuple or range), "
            f"got {type_name(d_ks)}"
        )
    if len(d_ks) == 0:
        raise ValueError("d_ks must hold at least one key dimension, got an empty sequence")
    for d_k in d_ks:
        if isinstance(d_k, bool) or not isinstance(d_k, numbers.Integral):
            raise TypeError(f"each d_k must be an int, got {d_k!r} of type {type_name(d_k)}")
        if d_k < 1:
            raise ValueError(f"each d_k must be >= 1, got d_k={d_k}")
    return tuple(int(d_k) for d_k in d_ks)


def _check_int(name: str, value: object, minimum: int) -> int:
    return check_int(name, value, minimum=minimum)


def _generator(seed: object) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r} of type {type_name(seed)}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got seed={seed}")
    return torch.Generator().manual_seed(int(seed))


# Draws are made this many numbers at a time, so memory stays small (a few MB)
# whatever num_samples and d_k are.
_CHUNK_NUMEL = 2**20


def _standard_normal(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Independent N(0, 1) numbers of ``shape``, drawn in float32 (four times
    faster than float64 on a CPU) and returned as float64 for the arithmetic."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(DTYPE)


def _random_dot_products(d_k: int, num_samples: int, generator: torch.Generator) -> torch.Tensor:
    """``q . k`` for ``num_samples`` independent random pairs: ``(num_samples,)`` float64."""
    chunk = max(1, _CHUNK_NUMEL // d_k)
    dots = []
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        q = _standard_normal((size, d_k), generator)
        k = _standard_normal((size, d_k), generator)
        dots.append(torch.linalg.vecdot(q, k))  # (size,)
    return torch.cat(dots)


def random_queries_and_keys(
    d_k: int, num_tokens: int, num_samples: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``num_samples`` random queries, each with its own ``num_tokens`` random keys.

    Yields them in chunks of at most ``_CHUNK_NUMEL`` numbers: ``queries
    (size, 1, d_k)`` and ``keys (size, num_tokens, d_k)``, float64, every entry
    standard normal (the model of section 3.2.1 of Vaswani et al. 2017, "Attention
    Is All You Need", footnote 4: components independent with mean 0 and
    variance 1). Every experiment on attention weights in this module draws
    from here, so equal arguments and generator states give equal draws (the
    tests rebuild an experiment's draws with it). The arguments are the
    experiments' own, checked by them; this helper does not check them again.
    """
    chunk = max(1, _CHUNK_NUMEL // (num_tokens * d_k))
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        queries = _standard_normal((size, 1, d_k), generator)
        keys = _standard_normal((size, num_tokens, d_k), generator)
        yield queries, keys


def _random_attn_scores(
    d_k: int, num_tokens: int, num_samples: int, generator: torch.Generator
) -> torch.Tensor:
    """Unscaled scores ``q . k_j`` of one random query against ``num_tokens``
    random keys, ``num_samples`` times: ``(num_samples, num_tokens)`` float64."""
    attn_scores = []
    for queries, keys in random_queries_and_keys(d_k, num_tokens, num_samples, generator):
        scores = queries @ keys.transpose(-2, -1)  # (size, 1, num_tokens)
        attn_scores.append(scores.squeeze(-2))  # (size, num_tokens)
    return torch.cat(attn_scores)  # (num_samples, num_tokens)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class DotProductVariance:
    """What :func:`dot_product_variance` measured, one entry per ``d_k``.

    Attributes:
        d_ks: the key dimensions, in the order given.
        num_samples: independent ``(q, k)`` pairs drawn per ``d_k``.
        mean: ``(num_d_k,)`` float64, sample mean of ``q . k`` (theory: 0).
        unscaled_variance: ``(num_d_k,)`` float64, sample variance of ``q . k``
            (theory: ``d_k``).
        scaled_variance: ``(num_d_k,)`` float64, sample variance of
            ``q . k / sqrt(d_k)`` from the same pairs (theory: 1). It equals
            ``unscaled_variance / d_k`` up to rounding, since the scale is a constant.
    """

    d_ks: tuple[int, ...]
    num_samples: int
    mean: torch.Tensor
    unscaled_variance: torch.Tensor
    scaled_variance: torch.Tensor

    @property
    def relative_standard_error(self) -> torch.Tensor:
        """``(num_d_k,)`` float64: the theoretical standard error of each
        measured variance, as a fraction of the true variance.

        For Gaussian components ``q . k`` has excess kurtosis ``6 / d_k``, and
        the unbiased sample variance of ``n`` draws has relative variance
        ``2 / (n - 1) + (6 / d_k) / n``; this is its square root.
        """
        d_ks = torch.tensor(self.d_ks, dtype=DTYPE)
        n = self.num_samples
        return torch.sqrt(2 / (n - 1) + 6 / d_ks / n)


@dataclass(frozen=True)
class SoftmaxPeakiness:
    """What :func:`softmax_peakiness` measured, one entry per ``d_k``.

    Attributes:
        d_ks: the key dimensions, in the order given.
        num_tokens: keys each query attends over.
        num_samples: independent queries (each with its own keys) per ``d_k``.
        unscaled_max_weight, scaled_max_weight: ``(num_d_k,)`` float64, mean
            over samples of the largest attention weight (between
            ``1 / num_tokens`` for uniform weights and 1 for one-hot weights).
        unscaled_entropy, scaled_entropy: ``(num_d_k,)`` float64, mean over
            samples of the entropy of the weights in nats (between 0 for
            one-hot weights and ``log(num_tokens)`` for uniform weights).
    """

    d_ks: tuple[int, ...]
    num_tokens: int
    num_samples: int
    unscaled_max_weight: torch.Tensor
    scaled_max_weight: torch.Tensor
    unscaled_entropy: torch.Tensor
    scaled_entropy: torch.Tensor

    @property
    def max_entropy(self) -> float:
        """``log(num_tokens)``: the entropy of uniform weights, in nats."""
        return math.log(self.num_tokens)


@dataclass(frozen=True)
class QueryGradientNorm:
    """What :func:`query_gradient_norm` measured: one norm per query and ``d_k``.

    The norms are kept, not only their averages, because without the scale
    their distribution is heavy-tailed: its mean and its median tell different
    stories, and percentiles or a histogram show both.

    Attributes:
        d_ks: the key dimensions, in the order given.
        num_tokens: keys each query attends over.
        num_samples: independent queries (each with its own keys) per ``d_k``.
        unscaled: ``(num_d_k, num_samples)`` float64, the Frobenius norm of
            ``d w / d q`` for ``w = softmax(q . k_j)``.
        scaled: ``(num_d_k, num_samples)`` float64, the same for
            ``w = softmax(q . k_j / sqrt(d_k))``, from the same queries and keys.
        top_two_gap: ``(num_d_k, num_samples)`` float64, for each query the
            unscaled score of its best key minus that of its second best
            (``>= 0``; divide by ``sqrt(d_k)`` for the scaled arm). A small gap
            is a near tie: the softmax keeps two weights large, so ``J`` does
            not vanish.
    """

    d_ks: tuple[int, ...]
    num_tokens: int
    num_samples: int
    unscaled: torch.Tensor
    scaled: torch.Tensor
    top_two_gap: torch.Tensor

    def _norms(self, scaled: object) -> torch.Tensor:
        return self.scaled if check_bool("scaled", scaled) else self.unscaled

    def percentile(self, p: float, *, scaled: bool) -> torch.Tensor:
        """The ``p``-th percentile of the norms at each ``d_k``.

        Args:
            p: a number from 0 to 100 (50 is the median). Linear interpolation
                between samples, as :func:`torch.quantile`.
            scaled: True for the scaled arm, False for the unscaled one.

        Returns:
            ``(num_d_k,)`` float64.

        Raises:
            TypeError: ``p`` is not a real number, or ``scaled`` is not a bool.
            ValueError: ``p`` is outside ``[0, 100]``.
        """
        norms = self._norms(scaled)
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(f"p must be a number from 0 to 100, got {type_name(p)} p={p!r}")
        if not 0 <= p <= 100:
            raise ValueError(f"p must be from 0 to 100, got p={p}")
        return torch.quantile(norms, float(p) / 100, dim=-1)

    def median(self, *, scaled: bool) -> torch.Tensor:
        """``(num_d_k,)`` float64: the median norm at each ``d_k`` (the typical query)."""
        return self.percentile(50, scaled=scaled)

    def mean(self, *, scaled: bool) -> torch.Tensor:
        """``(num_d_k,)`` float64: the mean norm at each ``d_k``."""
        return self._norms(scaled).mean(dim=-1)

    def fraction_below(self, threshold: float, *, scaled: bool) -> torch.Tensor:
        """``(num_d_k,)`` float64: the fraction of queries whose norm is below ``threshold``.

        Raises:
            TypeError: ``threshold`` is not a real number, or ``scaled`` is not a bool.
            ValueError: ``threshold`` is not positive and finite.
        """
        norms = self._norms(scaled)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise TypeError(
                f"threshold must be a positive number, got {type_name(threshold)} "
                f"threshold={threshold!r}"
            )
        if not 0 < threshold < math.inf:
            raise ValueError(f"threshold must be positive and finite, got threshold={threshold}")
        return (norms < threshold).to(DTYPE).mean(dim=-1)


# --------------------------------------------------------------------------- experiments


def dot_product_variance(
    d_ks: Sequence[int], num_samples: int = 10_000, *, seed: int = 0
) -> DotProductVariance:
    """Measure the variance of ``q . k``, unscaled and divided by ``sqrt(d_k)``.

    For each ``d_k`` draws ``num_samples`` independent pairs of vectors ``q``
    and ``k`` of shape ``(d_k,)`` whose components are independent standard
    normal numbers, and measures the sample mean and the (unbiased) sample
    variance of their dot products. Theory: mean 0, variance ``d_k``, and
    variance 1 after dividing by ``sqrt(d_k)``. With Gaussian components the
    sample variance has a relative standard error of about
    ``sqrt((2 + 6 / d_k) / num_samples)``: 1.4 % for large ``d_k`` at the
    default 10 000 samples (see :attr:`DotProductVariance.relative_standard_error`).

    Args:
        d_ks: key dimensions to measure, e.g. ``[1, 2, 4, ..., 1024]``; positive ints.
        num_samples: pairs drawn per ``d_k``; at least 2. Default 10 000.
        seed: seeds one ``torch.Generator``, which draws for each ``d_k`` in
            the order given. Default 0.

    Returns:
        A :class:`DotProductVariance` of ``(num_d_k,)`` float64 tensors.

    Raises:
        TypeError: ``d_ks`` is not a sequence of ints, or ``num_samples`` or
            ``seed`` is not an int.
        ValueError: ``d_ks`` is empty or holds a ``d_k < 1``; ``num_samples < 2``;
            ``seed < 0``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1
    and its footnote 4: if the components of ``q`` and ``k`` are independent
    random variables with mean 0 and variance 1, then ``q . k`` has mean 0 and
    variance ``d_k``.
    """
    d_ks = _check_d_ks(d_ks)
    num_samples = _check_int("num_samples", num_samples, 2)
    generator = _generator(seed)

    means, unscaled, scaled = [], [], []
    for d_k in d_ks:
        dots = _random_dot_products(d_k, num_samples, generator)  # (num_samples,)
        means.append(dots.mean())
        unscaled.append(dots.var())
        scaled.append((dots / math.sqrt(d_k)).var())
    return DotProductVariance(
        d_ks=d_ks,
        num_samples=num_samples,
        mean=torch.stack(means),
        unscaled_variance=torch.stack(unscaled),
        scaled_variance=torch.stack(scaled),
    )


def softmax_peakiness(
    d_ks: Sequence[int], num_tokens: int = 16, num_samples: int = 1_000, *, seed: int = 0
) -> SoftmaxPeakiness:
    """Measure how peaked the attention weights become as ``d_k`` grows.

    For each ``d_k`` draws ``num_samples`` queries, each with its own
    ``num_tokens`` keys (all components independent standard normal), computes
    the attention weights ``softmax(q . k_j)`` (unscaled) and
    ``softmax(q . k_j / sqrt(d_k))`` (scaled) from the same scores, and
    averages over samples the largest weight and the entropy
    ``-sum_j w_j log w_j`` (nats, with ``0 log 0 = 0``).

    With equal arguments, :func:`query_gradient_norm` draws exactly the same
    queries and keys, so the two experiments describe the same samples.

    Args:
        d_ks: key dimensions to measure; positive ints.
        num_tokens: keys per query; at least 2. Default 16.
        num_samples: queries per ``d_k``; at least 2. Default 1 000.
        seed: seeds one ``torch.Generator``, which draws for each ``d_k`` in
            the order given. Default 0.

    Returns:
        A :class:`SoftmaxPeakiness` of ``(num_d_k,)`` float64 tensors.

    Raises:
        TypeError: ``d_ks`` is not a sequence of ints, or ``num_tokens``,
            ``num_samples`` or ``seed`` is not an int.
        ValueError: ``d_ks`` is empty or holds a ``d_k < 1``; ``num_tokens < 2``;
            ``num_samples < 2``; ``seed < 0``.

    Source: Vaswani et al. (2017), section 3.2.1: for large ``d_k`` the dot
    products "grow large in magnitude, pushing the softmax function into
    regions where it has extremely small gradients".
    """
    d_ks = _check_d_ks(d_ks)
    num_tokens = _check_int("num_tokens", num_tokens, 2)
    num_samples = _check_int("num_samples", num_samples, 2)
    generator = _generator(seed)

    stats: dict[str, list[torch.Tensor]] = {
        key: [] for key in ("max_u", "max_s", "ent_u", "ent_s")
    }
    for d_k in d_ks:
        attn_scores = _random_attn_scores(d_k, num_tokens, num_samples, generator)
        for tag, scores in (("u", attn_scores), ("s", attn_scores / math.sqrt(d_k))):
            attn_weights = softmax(scores, dim=-1)  # (num_samples, num_tokens)
            entropy = -torch.special.xlogy(attn_weights, attn_weights).sum(dim=-1)
            stats[f"max_{tag}"].append(attn_weights.amax(dim=-1).mean())
            stats[f"ent_{tag}"].append(entropy.mean())
    return SoftmaxPeakiness(
        d_ks=d_ks,
        num_tokens=num_tokens,
        num_samples=num_samples,
        unscaled_max_weight=torch.stack(stats["max_u"]),
        scaled_max_weight=torch.stack(stats["max_s"]),
        unscaled_entropy=torch.stack(stats["ent_u"]),
        scaled_entropy=torch.stack(stats["ent_s"]),
    )


def softmax_jacobian(attn_weights: torch.Tensor) -> torch.Tensor:
    """The Jacobian of softmax, from its output: ``diag(w) - w w^T``.

    If ``w = softmax(s)`` then ``d w_i / d s_j = w_i * (delta_ij - w_j)``. The
    matrix depends on the weights only, so it is computed from them directly,
    with no autograd. Its rows (and columns) sum to 0; it is symmetric and
    positive semi-definite, and it is all zeros when ``w`` is one-hot.

    Args:
        attn_weights: ``(..., num_tokens)`` floating-point tensor of softmax
            outputs (each slice along the last dimension sums to 1; this is
            not checked).

    Returns:
        ``(..., num_tokens, num_tokens)`` tensor of the dtype of
        ``attn_weights``: entry ``[..., i, j]`` is ``d w_i / d s_j``.

    Raises:
        TypeError: ``attn_weights`` is not a floating-point tensor.
        ValueError: ``attn_weights`` has no dimensions.

    Source: the softmax derivative, e.g. Goodfellow, Bengio and Courville
    (2016), *Deep Learning*, section 6.2.2.3.
    """
    check_float_tensor("attn_weights", attn_weights)
    # w w^T, one outer product per slice: (..., num_tokens, num_tokens)
    outer = attn_weights.unsqueeze(-1) * attn_weights.unsqueeze(-2)
    return torch.diag_embed(attn_weights) - outer


def query_gradient_norm(
    d_ks: Sequence[int], num_tokens: int = 16, num_samples: int = 1_000, *, seed: int = 0
) -> QueryGradientNorm:
    """Measure, per query, the gradient of the attention weights that reaches the query.

    Training moves ``W_q`` (and ``W_k``) only through how the attention weights
    respond to the query (and the keys). For one query ``q`` of shape ``(d_k,)``
    and its keys ``K`` of shape ``(num_tokens, d_k)``, the scores are
    ``s = K q / c`` with ``c = 1`` (unscaled) or ``c = sqrt(d_k)`` (scaled), the
    weights are ``w = softmax(s)``, and by the chain rule

    ``d w / d q = J(w) K / c``, of shape ``(num_tokens, d_k)``,

    where ``J(w) = diag(w) - w w^T`` is the softmax Jacobian
    (:func:`softmax_jacobian`). Both factors matter: a saturated softmax makes
    ``J`` vanish, and the scale divides the rest by ``sqrt(d_k)``. This function
    returns the Frobenius norm of ``d w / d q`` for every query, in both arms,
    computed from the same queries and keys, and the gap between each query's
    two best scores, which decides whether its softmax has saturated. (The
    gradient reaching a key ``k_j`` is ``J[:, j] q^T / c``, of the same make-up.)

    Precision: where the largest weight rounds to 1 in float64 (norms below
    about ``1e-14``), ``J``'s diagonal entry ``w (1 - w)`` rounds to 0 and the
    norm comes out too small, by up to about a third (checked against 60-digit
    arithmetic); such a query has no usable gradient either way. Norms above
    ``1e-6`` agree with autograd to about ``1e-8`` relative.

    With equal arguments it draws exactly the same queries and keys as
    :func:`softmax_peakiness`, so the two experiments describe the same samples.

    Args:
        d_ks: key dimensions to measure; positive ints.
        num_tokens: keys per query; at least 2. Default 16.
        num_samples: queries per ``d_k``; at least 2. Default 1 000.
        seed: seeds one ``torch.Generator``, which draws for each ``d_k`` in
            the order given. Default 0.

    Returns:
        A :class:`QueryGradientNorm` holding ``(num_d_k, num_samples)`` float64
        norms per arm and the top-two score gaps, with methods for the mean,
        median, percentiles and the fraction of queries below a threshold.

    Raises:
        TypeError: ``d_ks`` is not a sequence of ints, or ``num_tokens``,
            ``num_samples`` or ``seed`` is not an int.
        ValueError: ``d_ks`` is empty or holds a ``d_k < 1``; ``num_tokens < 2``;
            ``num_samples < 2``; ``seed < 0``.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.1
    and footnote 4 (large dot products push the softmax into regions with
    extremely small gradients; the ``1 / sqrt(d_k)`` scale counteracts it).
    """
    d_ks = _check_d_ks(d_ks)
    num_tokens = _check_int("num_tokens", num_tokens, 2)
    num_samples = _check_int("num_samples", num_samples, 2)
    generator = _generator(seed)

    unscaled, scaled, gaps = [], [], []
    for d_k in d_ks:
        norms: dict[float, list[torch.Tensor]] = {1.0: [], math.sqrt(d_k): []}
        gap = []
        for queries, keys in random_queries_and_keys(d_k, num_tokens, num_samples, generator):
            attn_scores = (queries @ keys.transpose(-2, -1)).squeeze(-2)  # (size, num_tokens)
            best_two = attn_scores.topk(2, dim=-1).values  # (size, 2), largest first
            gap.append(best_two[:, 0] - best_two[:, 1])  # (size,)
            for c, found in norms.items():
                attn_weights = softmax(attn_scores / c, dim=-1)  # (size, num_tokens)
                jac = softmax_jacobian(attn_weights)  # (size, num_tokens, num_tokens)
                grad = jac @ keys / c  # d w / d q: (size, num_tokens, d_k)
                found.append(torch.linalg.matrix_norm(grad))  # Frobenius, (size,)
        unscaled.append(torch.cat(norms[1.0]))
        scaled.append(torch.cat(norms[math.sqrt(d_k)]))
        gaps.append(torch.cat(gap))
    return QueryGradientNorm(
        d_ks=d_ks,
        num_tokens=num_tokens,
        num_samples=num_samples,
        unscaled=torch.stack(unscaled),  # (num_d_k, num_samples)
        scaled=torch.stack(scaled),
        top_two_gap=torch.stack(gaps),  # (num_d_k, num_samples)
    )
