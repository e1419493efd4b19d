"""Measured experiments behind the course's claims, starting with why attention
scores are divided by ``sqrt(d_k)``.

Each experiment draws queries and keys whose components are independent
standard normal numbers (mean 0, variance 1), the setting of Vaswani et al.
(2017), footnote 4, and measures what happens as the key dimension ``d_k``
grows, with and without the ``1 / sqrt(d_k)`` scale:

* :func:`dot_product_variance` - the variance of ``q . k`` (it grows like ``d_k``).
* :func:`softmax_peakiness` - the largest attention weight and the entropy of
  the weights (the softmax becomes one-hot).
* :func:`query_gradient_norm` - the size of the gradient that reaches each
  query, ``d w / d q`` including the chain-rule factor of the scale (scaled,
  it keeps one size; unscaled, it becomes heavy-tailed), built on
  :func:`softmax_jacobian`.

Every function is seeded (``seed``) and deterministic: it draws its random
numbers in float32, computes with them in float64, and returns a small frozen
dataclass of float64 tensors with one entry per ``d_k``, ready to print or
plot. With the defaults and ``d_ks = [1, 2, 4, ..., 1024]`` each takes about a
second on a 2-core CPU, and memory stays at a few MB (draws are chunked).

Shape legend: ``num_d_k`` is ``len(d_ks)``; ``num_samples`` is the number of
independent draws per ``d_k``; ``num_tokens`` is the number of keys each query
attends over.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ._validation import check_bool, check_int, type_name
from ._validation import check_float_tensor as _check_float_tensor
from .attention import SelfAttention_v1, SelfAttention_v2
from .functional import softmax

__all__ = [
    "DotProductVariance",
    "SoftmaxPeakiness",
    "QueryGradientNorm",
    "dot_product_variance",
    "softmax_peakiness",
    "query_gradient_norm",
    "softmax_jacobian",
]

_DTYPE = torch.float64


# --------------------------------------------------------------------------- validation


def _check_d_ks(d_ks: object) -> tuple[int, ...]:
    if isinstance(d_ks, (str, bytes)) or not isinstance(d_ks, Sequence):
        raise TypeError(
            "d_ks must be a sequence of positive ints (a list, tuple or range), "
            f"got {type(d_ks).__name__}"
        )
    if len(d_ks) == 0:
        raise ValueError("d_ks must hold at least one key dimension, got an empty sequence")
    for d_k in d_ks:
        if isinstance(d_k, bool) or not isinstance(d_k, numbers.Integral):
            raise TypeError(f"each d_k must be an int, got {d_k!r} of type {type(d_k).__name__}")
        if d_k < 1:
            raise ValueError(f"each d_k must be >= 1, got d_k={d_k}")
    return tuple(int(d_k) for d_k in d_ks)


def _check_int(name: str, value: object, minimum: int) -> int:
    return check_int(name, value, minimum=minimum)


def _generator(seed: object) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r} of type {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got seed={seed}")
    return torch.Generator().manual_seed(int(seed))


# Draws are made this many numbers at a time, so memory stays small (a few MB)
# whatever num_samples and d_k are.
_CHUNK_NUMEL = 2**20


def _standard_normal(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Independent N(0, 1) numbers of ``shape``, drawn in float32 (four times
    faster than float64 on a CPU) and returned as float64 for the arithmetic."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(_DTYPE)


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


def _random_queries_and_keys(
    d_k: int, num_tokens: int, num_samples: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``num_samples`` random queries, each with its own ``num_tokens`` random
    keys, in chunks: yields ``queries (size, 1, d_k)`` and ``keys (size,
    num_tokens, d_k)``, float64. Every experiment on attention weights draws
    from here, so equal arguments give equal draws."""
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
    for queries, keys in _random_queries_and_keys(d_k, num_tokens, num_samples, generator):
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
        d_ks = torch.tensor(self.d_ks, dtype=_DTYPE)
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
        return (norms < threshold).to(_DTYPE).mean(dim=-1)


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

    stats = {key: [] for key in ("max_u", "max_s", "ent_u", "ent_s")}
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
    _check_float_tensor("attn_weights", attn_weights)
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
        norms = {1.0: [], math.sqrt(d_k): []}
        gap = []
        for queries, keys in _random_queries_and_keys(d_k, num_tokens, num_samples, generator):
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


# --------------------------------------------------------------------------- initialisation
#
# Chapter 4: SelfAttention_v1 draws its weights with torch.rand, SelfAttention_v2
# with nn.Linear's default. Does the start decide how fast attention learns?
# train_marked_token trains several seeds at once on a task that attention must
# solve by finding one token, and records what the chapter needs to explain the
# answer: the loss, where the attention goes, the gradients at the start.

__all__ += [
    "INITIALISATIONS",
    "OPTIMIZERS",
    "MarkedTokenTraining",
    "marked_token_batch",
    "train_marked_token",
]

#: The starts :func:`train_marked_token` compares. The first two are the
#: classes' own; the last two change ``torch.rand``'s draws in one respect each
#: (centred on zero; shrunk to the width of ``nn.Linear``'s range), to test
#: which property of the ``torch.rand`` start matters. ``value_init`` can give
#: ``W_value`` another of these starts than ``W_query`` and ``W_key``, to test
#: which matrices carry the difference.
INITIALISATIONS = ("torch.rand", "nn.Linear", "torch.rand - 0.5", "torch.rand / sqrt(d_in)")

#: The optimisers :func:`train_marked_token` can train with.
OPTIMIZERS = ("adam", "sgd")

# The evaluation batch after training is the same for every seed and start.
_EVAL_SEED = 999
_EVAL_BATCH_SIZE = 256


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {choices}, got {type_name(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {name}={value!r}")
    return value


def _check_positive_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type_name(value)} {name}={value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")
    return float(value)


def _check_seeds(seeds: object) -> tuple[int, ...]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(
            f"seeds must be a sequence of ints (a list, tuple or range), got {type_name(seeds)}"
        )
    if len(seeds) == 0:
        raise ValueError("seeds must hold at least one seed, got an empty sequence")
    checked = tuple(check_int("each seed", seed, minimum=0) for seed in seeds)
    if len(set(checked)) != len(checked):
        raise ValueError(f"seeds must be different from one another, got {list(checked)}")
    return checked


def marked_token_batch(
    batch_size: int = 64,
    num_tokens: int = 8,
    d_in: int = 16,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of the "find the marked token" task of chapter 4.

    Each sequence has ``num_tokens`` tokens of ``d_in`` features: ``d_in - 2``
    independent standard normal features, then a feature that is 1 for every
    token, then a marker feature that is 1 for one token chosen uniformly at
    random and 0 for the others. The target at **every** position is the
    embedding of the marked token, so a self-attention layer solves the task
    exactly when every query puts all its weight on the marked token and the
    value projection is the identity. The constant feature lets every query
    look in the same direction; the marker lets the marked key stand out.

    Args:
        batch_size: sequences in the batch. Default 64.
        num_tokens: tokens per sequence; at least 2. Default 8.
        d_in: features per token; at least 3. Default 16.
        generator: the ``torch.Generator`` to draw from (first the features,
            then the marked positions); the global generator when None.

    Returns:
        ``(x, targets, marked)``: ``x`` and ``targets`` of shape
        ``(batch_size, num_tokens, d_in)``, float32; ``marked`` of shape
        ``(batch_size,)``, int64, the index of each sequence's marked token.

    Raises:
        TypeError: a size is not an int, or ``generator`` is not a
            ``torch.Generator`` or None.
        ValueError: ``batch_size < 1``, ``num_tokens < 2`` or ``d_in < 3``.

    Source: a toy retrieval task written for this course; the constant and the
    marker feature play the roles of the query and the key that Vaswani et al.
    (2017), section 3.2, match by dot product.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    num_tokens = check_int("num_tokens", num_tokens, minimum=2)
    d_in = check_int("d_in", d_in, minimum=3)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type_name(generator)}")
    x = torch.randn(batch_size, num_tokens, d_in, generator=generator)
    marked = torch.randint(num_tokens, (batch_size,), generator=generator)  # (batch_size,)
    x[..., -2] = 1.0  # the constant feature
    x[..., -1] = torch.nn.functional.one_hot(marked, num_tokens).to(x.dtype)  # the marker
    rows = torch.arange(batch_size)
    targets = x[rows, marked].unsqueeze(1).expand(-1, num_tokens, -1)  # (b, num_tokens, d_in)
    return x, targets.clone(), marked


@dataclass(frozen=True)
class MarkedTokenTraining:
    """What :func:`train_marked_token` measured: one start, one optimiser, several seeds.

    Every per-step series is measured on that step's training batch, before
    the step's update. Scores are the scaled scores ``q . k / sqrt(d_k)`` that
    enter the softmax.

    Attributes:
        init: the start of ``W_query`` and ``W_key``, one of
            :data:`INITIALISATIONS`.
        value_init: the start of ``W_value`` (the same as ``init`` unless
            :func:`train_marked_token` was given another).
        optimizer: ``"adam"`` or ``"sgd"``.
        lr: the learning rate.
        adam_beta2: Adam's ``beta2``, the decay of its running average of
            squared gradients (unused by SGD).
        seeds: the seeds, one run each.
        threshold: the loss that :attr:`steps_to_threshold` waits for.
        losses: ``(num_seeds, num_steps)`` float64, the mean squared error of
            each step's batch.
        weight_on_marked: ``(num_seeds, num_steps)`` float64, the attention
            weight that the queries give the marked token, averaged over the
            queries of the batch (``1 / num_tokens`` is chance, 1 is solved).
        score_margin: ``(num_seeds, num_steps)`` float64, the score of the
            marked key minus the largest score of the other keys, averaged over
            the queries: negative while the queries prefer another token.
        initial_max_weight: ``(num_seeds,)`` float64, the largest attention
            weight of each query at the start, averaged (1 is one-hot).
        initial_grad_norm: ``(num_seeds, 3)`` float64, the Frobenius norms of
            the gradients of the first batch's loss with respect to
            ``W_query``, ``W_key`` and ``W_value``.
        update_rms: ``(num_seeds, num_steps, 3)`` float64, the root mean
            square of the change that each optimiser step made to ``W_query``,
            ``W_key`` and ``W_value``.
        final_loss: ``(num_seeds,)`` float64, the loss after training on one
            fixed evaluation batch of 256 sequences, the same for every run.
        final_weight_on_marked: ``(num_seeds,)`` float64, the weight on the
            marked token on that batch after training.
    """

    init: str
    value_init: str
    optimizer: str
    lr: float
    adam_beta2: float
    seeds: tuple[int, ...]
    threshold: float
    losses: torch.Tensor
    weight_on_marked: torch.Tensor
    score_margin: torch.Tensor
    initial_max_weight: torch.Tensor
    initial_grad_norm: torch.Tensor
    update_rms: torch.Tensor
    final_loss: torch.Tensor
    final_weight_on_marked: torch.Tensor

    @property
    def num_steps(self) -> int:
        """The number of optimiser steps each run took."""
        return self.losses.shape[-1]

    @property
    def first_update_rms(self) -> torch.Tensor:
        """``(num_seeds, 3)`` float64: :attr:`update_rms` of the first step."""
        return self.update_rms[:, 0]

    @property
    def steps_to_threshold(self) -> torch.Tensor:
        """``(num_seeds,)`` int64: the number of optimiser steps a run took
        before its batch loss first fell below :attr:`threshold` (the index of
        that batch in :attr:`losses`), or -1 where it never did."""
        below = self.losses < self.threshold  # (num_seeds, num_steps)
        first = below.to(torch.int64).argmax(dim=-1)  # 0 where never below
        return torch.where(below.any(dim=-1), first, torch.full_like(first, -1))


def _initial_weights(init: str, seed: int, d_in: int) -> torch.Tensor:
    """``W_query``, ``W_key``, ``W_value`` of the class behind ``init``, built
    after ``torch.manual_seed(seed)`` in a forked RNG: ``(3, d_in, d_in)``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if init == "nn.Linear":
            module = SelfAttention_v2(d_in, d_in)
            layers = (module.W_query, module.W_key, module.W_value)
            weights = torch.stack([layer.weight.detach().T for layer in layers])
        else:
            module = SelfAttention_v1(d_in, d_in)
            weights = torch.stack([module.W_query, module.W_key, module.W_value]).detach()
    if init == "torch.rand - 0.5":
        weights = weights - 0.5
    elif init == "torch.rand / sqrt(d_in)":
        weights = weights / math.sqrt(d_in)
    return weights.clone()  # (3, d_in, d_out), x @ W as in SelfAttention_v1


def _seedwise_attention(
    weights: torch.Tensor, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SelfAttention_v1's forward for every seed at once.

    ``weights``: ``(num_seeds, 3, d_in, d_out)``; ``x``: ``(num_seeds, batch,
    num_tokens, d_in)``. Returns the scaled scores and the weights,
    ``(num_seeds, batch, num_tokens, num_tokens)``, and the context vectors,
    ``(num_seeds, batch, num_tokens, d_out)``.
    """
    W_query, W_key, W_value = (w.unsqueeze(1) for w in weights.unbind(dim=1))
    queries = x @ W_query  # (num_seeds, batch, num_tokens, d_out)
    keys = x @ W_key
    values = x @ W_value
    attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
    attn_weights = torch.softmax(attn_scores, dim=-1)  # rows sum to 1
    return attn_scores, attn_weights, attn_weights @ values


def _on_marked(
    attn_scores: torch.Tensor, attn_weights: torch.Tensor, marked: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per seed: mean weight on the marked key, and mean score margin of the
    marked key over the best other key. ``marked``: ``(num_seeds, batch)``."""
    is_marked = torch.nn.functional.one_hot(marked, attn_scores.shape[-1]).bool()
    is_marked = is_marked.unsqueeze(-2)  # (num_seeds, batch, 1, num_tokens)
    weight = (attn_weights * is_marked).sum(dim=-1)  # (num_seeds, batch, num_tokens)
    marked_score = (attn_scores * is_marked).sum(dim=-1)
    best_other = attn_scores.masked_fill(is_marked, -math.inf).amax(dim=-1)
    return weight.mean(dim=(1, 2)), (marked_score - best_other).mean(dim=(1, 2))


def train_marked_token(
    init: str,
    seeds: Sequence[int] = range(5),
    num_steps: int = 600,
    *,
    value_init: str | None = None,
    optimizer: str = "adam",
    lr: float = 0.01,
    adam_beta2: float = 0.999,
    threshold: float = 0.01,
    d_in: int = 16,
    num_tokens: int = 8,
    batch_size: int = 64,
    data_seed: int = 1000,
) -> MarkedTokenTraining:
    """Train self-attention from one start on the marked-token task, for several seeds.

    For each seed ``s``, builds the weights of the class behind ``init`` after
    ``torch.manual_seed(s)`` (``SelfAttention_v1(d_in, d_in)`` for the
    ``torch.rand`` starts, ``SelfAttention_v2(d_in, d_in)`` for
    ``"nn.Linear"``), then takes ``num_steps`` optimiser steps on batches of
    :func:`marked_token_batch` drawn from ``torch.Generator().manual_seed(
    data_seed + s)``, minimising the mean squared error between the context
    vectors and the targets. This is exactly the loop::

        torch.manual_seed(s)
        model = SelfAttention_v2(d_in, d_in)  # or v1
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, adam_beta2))
        generator = torch.Generator().manual_seed(data_seed + s)
        for step in range(num_steps):
            x, targets, _ = marked_token_batch(batch_size, num_tokens, d_in,
                                               generator=generator)
            loss = torch.nn.functional.mse_loss(model(x), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    run for all seeds at once: the seeds' weights are stacked into one tensor
    and the seeds' losses summed, so each seed's slice gets its own gradient,
    and Adam and SGD, which update every number on its own, move each slice
    as the loop would (up to float32 rounding). The global random state is
    left unchanged. The loop runs on one CPU thread (the tensors are too small
    for more to help; the thread count is restored afterwards): with the
    defaults, about two seconds.

    ``"torch.rand - 0.5"`` and ``"torch.rand / sqrt(d_in)"`` take
    ``SelfAttention_v1``'s draws for the same seed and shift them to mean 0,
    or shrink them to ``[0, 1/sqrt(d_in))``: the same random numbers, changed
    in one respect. With ``value_init``, ``W_value`` is instead the
    ``W_value`` that start gives for the same seed, and ``W_query`` and
    ``W_key`` stay those of ``init``: one matrix swapped, the others unchanged.

    Args:
        init: the start of ``W_query`` and ``W_key`` (and of ``W_value`` unless
            ``value_init`` is given), one of :data:`INITIALISATIONS`.
        seeds: one run per seed; different non-negative ints. Default 0 to 4.
        num_steps: optimiser steps per run; at least 1. Default 600.
        value_init: the start of ``W_value``, one of :data:`INITIALISATIONS`,
            or None (default) for ``init``.
        optimizer: ``"adam"`` (``torch.optim.Adam``, ``betas=(0.9,
            adam_beta2)``) or ``"sgd"`` (``torch.optim.SGD``, no momentum).
            Default ``"adam"``.
        lr: the learning rate, finite and > 0. Default 0.01.
        adam_beta2: Adam's ``beta2``, in ``[0, 1)``: its running average of
            squared gradients reaches back about ``1 / (1 - adam_beta2)``
            steps. Default 0.999, PyTorch's. Ignored by SGD.
        threshold: the loss that :attr:`MarkedTokenTraining.steps_to_threshold`
            waits for, > 0. Default 0.01.
        d_in: features per token (``d_out = d_in``); at least 3. Default 16.
        num_tokens: tokens per sequence; at least 2. Default 8.
        batch_size: sequences per step; at least 1. Default 64.
        data_seed: seed ``s`` draws its batches from a generator seeded with
            ``data_seed + s``, so its data do not depend on ``init``; >= 0.
            Default 1000.

    Returns:
        A :class:`MarkedTokenTraining` of float64 tensors with one row per seed.

    Raises:
        TypeError: ``init``, ``value_init`` (unless None) or ``optimizer`` is
            not a str; ``seeds`` is not a sequence of ints; a size or
            ``data_seed`` is not an int; ``lr``, ``adam_beta2`` or
            ``threshold`` is not a real number.
        ValueError: ``init``, ``value_init`` or ``optimizer`` is not one of
            the choices; ``seeds`` is empty, holds a negative seed or a seed
            twice; ``num_steps < 1``; ``lr`` or ``threshold`` is not finite and
            positive; ``adam_beta2`` is not in ``[0, 1)``; ``d_in < 3``;
            ``num_tokens < 2``; ``batch_size < 1``; ``data_seed < 0``.

    Source: the initialisations are those of ``torch.rand`` and of
    ``torch.nn.Linear`` (uniform on ``±1/sqrt(d_in)``, He et al. (2015),
    "Delving Deep into Rectifiers", with ``a = sqrt(5)``); Adam is Kingma and
    Ba (2015), "Adam: A Method for Stochastic Optimization", algorithm 1.
    """
    init = _check_choice("init", init, INITIALISATIONS)
    seeds = _check_seeds(seeds)
    num_steps = check_int("num_steps", num_steps, minimum=1)
    value_init = init if value_init is None else _check_choice(
        "value_init", value_init, INITIALISATIONS)
    optimizer = _check_choice("optimizer", optimizer, OPTIMIZERS)
    lr = _check_positive_real("lr", lr)
    if isinstance(adam_beta2, bool) or not isinstance(adam_beta2, numbers.Real):
        raise TypeError(f"adam_beta2 must be a real number, got {type_name(adam_beta2)} "
                        f"adam_beta2={adam_beta2!r}")
    if not 0 <= adam_beta2 < 1:
        raise ValueError(f"adam_beta2 must be in [0, 1), got adam_beta2={adam_beta2!r}")
    adam_beta2 = float(adam_beta2)
    threshold = _check_positive_real("threshold", threshold)
    d_in = check_int("d_in", d_in, minimum=3)
    num_tokens = check_int("num_tokens", num_tokens, minimum=2)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    data_seed = check_int("data_seed", data_seed, minimum=0)

    # The tensors are tiny: threads only add overhead (tenfold on a busy 2-core CPU).
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_seedwise(init, value_init, seeds, num_steps, optimizer, lr, adam_beta2,
                               threshold, d_in, num_tokens, batch_size, data_seed)
    finally:
        torch.set_num_threads(num_threads)


def _train_seedwise(init: str, value_init: str, seeds: tuple[int, ...], num_steps: int,
                    optimizer: str, lr: float, adam_beta2: float, threshold: float, d_in: int,
                    num_tokens: int, batch_size: int, data_seed: int) -> MarkedTokenTraining:
    """The body of :func:`train_marked_token`, on checked arguments."""
    weights = torch.stack([_initial_weights(init, s, d_in) for s in seeds])  # (S, 3, d, d)
    if value_init != init:  # W_value from the other start, for the same seeds
        weights[:, 2] = torch.stack([_initial_weights(value_init, s, d_in)[2] for s in seeds])
    weights.requires_grad_(True)
    if optimizer == "adam":
        optim = torch.optim.Adam([weights], lr=lr, betas=(0.9, adam_beta2))
    else:
        optim = torch.optim.SGD([weights], lr=lr)
    generators = [torch.Generator().manual_seed(data_seed + s) for s in seeds]

    series = {"loss": [], "weight": [], "margin": [], "update": []}
    for step in range(num_steps):
        batches = [marked_token_batch(batch_size, num_tokens, d_in, generator=g)
                   for g in generators]
        x, targets, marked = (torch.stack(parts) for parts in zip(*batches, strict=True))
        attn_scores, attn_weights, context_vec = _seedwise_attention(weights, x)
        losses = ((context_vec - targets) ** 2).mean(dim=(1, 2, 3))  # (num_seeds,)
        optim.zero_grad()
        losses.sum().backward()  # seed s's slice of weights.grad: d losses[s] / d weights[s]
        if step == 0:
            initial_grad_norm = torch.linalg.matrix_norm(weights.grad)  # (num_seeds, 3)
            initial_max_weight = attn_weights.detach().amax(dim=-1).mean(dim=(1, 2))
        before = weights.detach().clone()
        optim.step()
        # (num_seeds, 3): RMS of this step's change of W_query, W_key, W_value
        series["update"].append((weights.detach() - before).pow(2).mean(dim=(-2, -1)).sqrt())
        with torch.no_grad():
            weight, margin = _on_marked(attn_scores, attn_weights, marked)
        series["loss"].append(losses.detach())
        series["weight"].append(weight)
        series["margin"].append(margin)

    with torch.no_grad():
        x, targets, marked = marked_token_batch(
            _EVAL_BATCH_SIZE, num_tokens, d_in, generator=torch.Generator().manual_seed(_EVAL_SEED)
        )
        x, targets, marked = (t.expand(len(seeds), *t.shape) for t in (x, targets, marked))
        attn_scores, attn_weights, context_vec = _seedwise_attention(weights, x)
        final_loss = ((context_vec - targets) ** 2).mean(dim=(1, 2, 3))
        final_weight, _ = _on_marked(attn_scores, attn_weights, marked)

    def as_result(values: torch.Tensor) -> torch.Tensor:
        return values.detach().to(_DTYPE)

    return MarkedTokenTraining(
        init=init,
        value_init=value_init,
        optimizer=optimizer,
        lr=lr,
        adam_beta2=adam_beta2,
        seeds=seeds,
        threshold=threshold,
        losses=as_result(torch.stack(series["loss"], dim=-1)),  # (num_seeds, num_steps)
        weight_on_marked=as_result(torch.stack(series["weight"], dim=-1)),
        score_margin=as_result(torch.stack(series["margin"], dim=-1)),
        initial_max_weight=as_result(initial_max_weight),
        initial_grad_norm=as_result(initial_grad_norm),
        update_rms=as_result(torch.stack(series["update"], dim=1)),  # (S, num_steps, 3)
        final_loss=as_result(final_loss),
        final_weight_on_marked=as_result(final_weight),
    )
