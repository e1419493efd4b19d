"""Chapter 10's measurement of a training curve: its plateau and its rise.

A run that learns suddenly has a flat start (the *plateau*) and then a steep
climb (the *rise*). :func:`learning_phases` measures both on the accuracies
that :func:`attnlib.training.train` records, so that runs can be compared on
each: on chapter 10's induction task both runs rise steeply, and what tells
them apart is how long they stay on the plateau.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._validation import check_positive_int, type_name

__all__ = ["LearningPhases", "learning_phases", "steps_to_accuracy"]


def _check_accuracies(accuracies: object) -> list[float]:
    if isinstance(accuracies, torch.Tensor):
        if accuracies.ndim != 1:
            raise ValueError(
                f"accuracies must be 1-D (one value per step), got shape {tuple(accuracies.shape)}"
            )
        accuracies = accuracies.tolist()
    if isinstance(accuracies, (str, bytes)) or not isinstance(accuracies, Sequence):
        raise TypeError(
            f"accuracies must be a sequence of floats (TrainingHistory.accuracies), "
            f"got {type_name(accuracies)}"
        )
    values = []
    for step, value in enumerate(accuracies, start=1):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"accuracies must hold numbers, got {type_name(value)} {value!r} at step {step}"
            )
        number = float(value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"accuracies must lie in [0, 1], got {value} at step {step}")
        values.append(number)
    if not values:
        raise ValueError("accuracies is empty: pass at least one step's accuracy")
    return values


def _check_threshold(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type_name(value)} {name}={value!r}")
    number = float(value)
    if not 0.0 <= number < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {name}={value}")
    return number


def _first_step_above(values: list[float], threshold: float, window: int) -> int | None:
    for step in range(1, len(values) + 1):
        # the mean of the last min(step, window) values, steps max(1, step - window + 1) .. step
        mean = math.fsum(values[max(0, step - window):step]) / min(step, window)
        if mean > threshold:
            return step
    return None


def steps_to_accuracy(
    accuracies: Sequence[float] | torch.Tensor, threshold: float, *, window: int = 10
) -> int | None:
    """The first step at which the running mean of the accuracy passes ``threshold``.

    Step ``s`` (counted from 1, as :attr:`attnlib.training.TrainingHistory.accuracies` is)
    passes when the mean of the accuracies of steps ``max(1, s - window + 1)
    .. s`` is *greater* than ``threshold``. The running mean smooths out the
    noise of single batches; over the first steps it averages the steps there
    are.

    Args:
        accuracies: one accuracy per step, each in ``[0, 1]``: a list of
            floats or a 1-D tensor.
        threshold: in ``[0, 1)``.
        window: keyword-only; steps in the running mean. Default 10.

    Returns:
        The step, or None when the running mean never passes ``threshold``.

    Raises:
        TypeError: ``accuracies`` is not a sequence of numbers, ``threshold``
            is not a number, or ``window`` is not an int.
        ValueError: ``accuracies`` is empty, not 1-D, or holds a value outside
            ``[0, 1]``; ``threshold`` is outside ``[0, 1)``; ``window`` is not
            positive.

    Source: the running-mean training curves of Olsson et al. (2022),
    "In-context Learning and Induction Heads"; a plain moving average.
    """
    values = _check_accuracies(accuracies)
    threshold = _check_threshold("threshold", threshold)
    window = check_positive_int("window", window)
    return _first_step_above(values, threshold, window)


@dataclass(frozen=True)
class LearningPhases:
    """How a training run's accuracy left its plateau, from :func:`learning_phases`.

    Attributes:
        plateau: steps until the running mean accuracy first passes ``low``,
            or None if it never does.
        rise: steps from there until it first passes ``high``, or None if it
            never passes both.
        low, high, window: the thresholds and the running mean's window used.
    """

    plateau: int | None
    rise: int | None
    low: float
    high: float
    window: int


def learning_phases(
    accuracies: Sequence[float] | torch.Tensor,
    *,
    low: float = 0.2,
    high: float = 0.8,
    window: int = 10,
) -> LearningPhases:
    """Split an accuracy curve into its plateau and its rise.

    The *plateau* is :func:`steps_to_accuracy` ``(accuracies, low)``, the
    steps until the running mean first passes ``low``; the *rise* is the steps
    from there until it first passes ``high``. A sudden phase change has a
    short rise; what comes before it, a long or a short plateau, is measured
    separately, so two runs can be compared on each.

    Args:
        accuracies: one accuracy per step, each in ``[0, 1]``: a list of
            floats (:attr:`attnlib.training.TrainingHistory.accuracies`) or a 1-D tensor.
        low: keyword-only; the accuracy that ends the plateau, in ``[0, 1)``.
            Default 0.2.
        high: keyword-only; the accuracy that ends the rise, in ``(low, 1)``.
            Default 0.8.
        window: keyword-only; steps in the running mean. Default 10.

    Returns:
        A :class:`LearningPhases`.

    Raises:
        TypeError: as :func:`steps_to_accuracy`, for ``low`` and ``high`` too.
        ValueError: as :func:`steps_to_accuracy`; or ``high`` is not above
            ``low``.

    Source: the phase change of Olsson et al. (2022), "In-context Learning and
    Induction Heads", Argument 1 (induction heads form in a short window early
    in training, visible in language models as a bump in the loss); plateau
    and rise as this course's chapter 10 measures them on a toy task.
    """
    values = _check_accuracies(accuracies)
    low = _check_threshold("low", low)
    high = _check_threshold("high", high)
    if not high > low:
        raise ValueError(f"high must be above low, got low={low} and high={high}")
    window = check_positive_int("window", window)
    plateau = _first_step_above(values, low, window)
    to_high = _first_step_above(values, high, window)
    rise = None if plateau is None or to_high is None else to_high - plateau
    return LearningPhases(plateau, rise, low, high, window)
