"""Chapter 4's experiment: does the initialisation decide how attention learns?

``SelfAttention_v1`` draws its weights with ``torch.rand``, ``SelfAttention_v2``
with ``nn.Linear``'s default. :func:`train_marked_token` trains several seeds at
once on a task that attention must solve by finding one token
(:func:`marked_token_batch`), and records what the chapter needs to explain the
answer: the loss, where the attention goes, the gradients at the start
(:class:`MarkedTokenTraining`). Import the public names from
:mod:`attnlib.experiments`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validation import check_int, type_name
from ..attention import SelfAttention_v1, SelfAttention_v2
from ._common import DTYPE

# Described where attnlib.experiments re-exports them (the API page reads them there).
INITIALISATIONS = ("torch.rand", "nn.Linear", "torch.rand - 0.5", "torch.rand / sqrt(d_in)")

OPTIMIZERS = ("adam", "sgd")

__all__ = [
    "INITIALISATIONS",
    "OPTIMIZERS",
    "MarkedTokenTraining",
    "marked_token_batch",
    "train_marked_token",
]

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
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")
    return number


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
            v2 = SelfAttention_v2(d_in, d_in)
            layers = (v2.W_query, v2.W_key, v2.W_value)
            weights = torch.stack([layer.weight.detach().T for layer in layers])
        else:
            v1 = SelfAttention_v1(d_in, d_in)
            weights = torch.stack([v1.W_query, v1.W_key, v1.W_value]).detach()
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
    optim: torch.optim.Optimizer
    if optimizer == "adam":
        optim = torch.optim.Adam([weights], lr=lr, betas=(0.9, adam_beta2))
    else:
        optim = torch.optim.SGD([weights], lr=lr)
    generators = [torch.Generator().manual_seed(data_seed + s) for s in seeds]

    series: dict[str, list[torch.Tensor]] = {"loss": [], "weight": [], "margin": [], "update": []}
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
        return values.detach().to(DTYPE)

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
