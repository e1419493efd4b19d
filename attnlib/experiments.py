"""Measured experiments behind the course's claims, starting with why attention
scores are divided by ``sqrt(d_k)``.

Each experiment draws queries and keys whose components are independent
standard normal numbers (mean 0, variance 1), the setting of Vaswani et al.
(2017), footnote 4, and measures what happens as the key dimension ``d_k``
grows, with and without the ``1 / sqrt(d_k)`` scale:

* :func:`dot_product_variance` - the variance of ``q . k`` (it grows like ``d_k``).
* :func:`softmax_peakiness` - the largest attention weight and the entropy of
  the weights (the softmax becomes one-hot).
* :func:`softmax_gradient_norm` - the size of the softmax's Jacobian (its
  gradients vanish), using :func:`softmax_jacobian`.

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
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._validation import check_float_tensor as _check_float_tensor
from .functional import softmax

__all__ = [
    "DotProductVariance",
    "SoftmaxPeakiness",
    "SoftmaxGradientNorm",
    "dot_product_variance",
    "softmax_peakiness",
    "softmax_gradient_norm",
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
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return int(value)


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


def _random_attn_scores(
    d_k: int, num_tokens: int, num_samples: int, generator: torch.Generator
) -> torch.Tensor:
    """Unscaled scores ``q . k_j`` of one random query against ``num_tokens``
    random keys, ``num_samples`` times: ``(num_samples, num_tokens)`` float64."""
    chunk = max(1, _CHUNK_NUMEL // (num_tokens * d_k))
    attn_scores = []
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        queries = _standard_normal((size, 1, d_k), generator)
        keys = _standard_normal((size, num_tokens, d_k), generator)
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
class SoftmaxGradientNorm:
    """What :func:`softmax_gradient_norm` measured, one entry per ``d_k``.

    Attributes:
        d_ks: the key dimensions, in the order given.
        num_tokens: keys each query attends over.
        num_samples: independent queries (each with its own keys) per ``d_k``.
        unscaled_mean, scaled_mean: ``(num_d_k,)`` float64, mean over samples
            of the Frobenius norm of the softmax Jacobian.
        unscaled_median, scaled_median: ``(num_d_k,)`` float64, the median of
            the same norms (the lower of the two middle values for an even
            ``num_samples``, as :func:`torch.median`): the typical sample,
            which a few near-ties between the two largest scores cannot pull up.
    """

    d_ks: tuple[int, ...]
    num_tokens: int
    num_samples: int
    unscaled_mean: torch.Tensor
    scaled_mean: torch.Tensor
    unscaled_median: torch.Tensor
    scaled_median: torch.Tensor


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

    With equal arguments, :func:`softmax_gradient_norm` draws exactly the same
    scores, so the two experiments describe the same samples.

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
    outer = attn_weights.unsqueeze(-1) * attn_weights.unsqueeze(-2)  # (..., num_tokens, num_tokens)
    return torch.diag_embed(attn_weights) - outer


def softmax_gradient_norm(
    d_ks: Sequence[int], num_tokens: int = 16, num_samples: int = 1_000, *, seed: int = 0
) -> SoftmaxGradientNorm:
    """Measure the size of softmax's gradient as ``d_k`` grows, scaled and unscaled.

    Draws the same scores as :func:`softmax_peakiness` with equal arguments.
    For each sample it computes the Jacobian of the attention weights with
    respect to the scores fed to softmax (:func:`softmax_jacobian`) and its
    Frobenius norm, then reports the mean and the median over samples. The
    norm is ``sqrt(num_tokens - 1) / num_tokens`` for uniform weights, 1/2
    for weights split evenly between two keys, and 0 for one-hot weights,
    where every gradient that flows back through the softmax vanishes.

    In the scaled case the Jacobian is taken with respect to the scaled scores
    ``q . k_j / sqrt(d_k)``, the softmax's own input, so that both cases
    measure the same function at the inputs it actually receives.

    Args:
        d_ks: key dimensions to measure; positive ints.
        num_tokens: keys per query; at least 2. Default 16.
        num_samples: queries per ``d_k``; at least 2. Default 1 000.
        seed: seeds one ``torch.Generator``, which draws for each ``d_k`` in
            the order given. Default 0.

    Returns:
        A :class:`SoftmaxGradientNorm` of ``(num_d_k,)`` float64 tensors.

    Raises:
        TypeError: ``d_ks`` is not a sequence of ints, or ``num_tokens``,
            ``num_samples`` or ``seed`` is not an int.
        ValueError: ``d_ks`` is empty or holds a ``d_k < 1``; ``num_tokens < 2``;
            ``num_samples < 2``; ``seed < 0``.

    Source: Vaswani et al. (2017), section 3.2.1 (small softmax gradients for
    large ``d_k``, the reason for the ``1 / sqrt(d_k)`` scale).
    """
    d_ks = _check_d_ks(d_ks)
    num_tokens = _check_int("num_tokens", num_tokens, 2)
    num_samples = _check_int("num_samples", num_samples, 2)
    generator = _generator(seed)

    stats = {key: [] for key in ("mean_u", "mean_s", "median_u", "median_s")}
    for d_k in d_ks:
        attn_scores = _random_attn_scores(d_k, num_tokens, num_samples, generator)
        for tag, scores in (("u", attn_scores), ("s", attn_scores / math.sqrt(d_k))):
            jacobian = softmax_jacobian(softmax(scores, dim=-1))  # (num_samples, N, N)
            norms = torch.linalg.matrix_norm(jacobian)  # Frobenius, (num_samples,)
            stats[f"mean_{tag}"].append(norms.mean())
            stats[f"median_{tag}"].append(norms.median())
    return SoftmaxGradientNorm(
        d_ks=d_ks,
        num_tokens=num_tokens,
        num_samples=num_samples,
        unscaled_mean=torch.stack(stats["mean_u"]),
        scaled_mean=torch.stack(stats["mean_s"]),
        unscaled_median=torch.stack(stats["median_u"]),
        scaled_median=torch.stack(stats["median_s"]),
    )
