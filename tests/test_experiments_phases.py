"""attnlib.experiments, chapter 10's measurement of a training curve: its plateau
and its rise (steps_to_accuracy, learning_phases, LearningPhases)."""

from __future__ import annotations

import pytest
import torch

from attnlib import data
from attnlib.experiments import LearningPhases, learning_phases, steps_to_accuracy
from attnlib.models import TinyTransformer
from attnlib.training import train


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is as fast as two and not slowed by a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def running_mean_reference(accuracies, window):
    """The running mean the chapter plots, by convolution: over the first steps it
    averages the steps there are."""
    values = torch.tensor(accuracies, dtype=torch.float64)
    sums = torch.cumsum(torch.cat((torch.zeros(1, dtype=torch.float64), values)), 0)
    steps = torch.arange(1, len(values) + 1)
    start = (steps - window).clamp(min=0)
    return (sums[steps] - sums[start]) / (steps - start)


def test_step_function_by_hand():
    """30 steps at 0, then 1: the 10-step mean is k / 10 at step 30 + k, so it
    passes 0.2 at step 33 (0.2 itself does not pass) and 0.8 at step 39."""
    accuracies = [0.0] * 30 + [1.0] * 20
    assert steps_to_accuracy(accuracies, 0.2) == 33
    assert steps_to_accuracy(accuracies, 0.8) == 39
    assert learning_phases(accuracies) == LearningPhases(
        plateau=33, rise=6, low=0.2, high=0.8, window=10
    )
    # a shorter window shortens both: the 4-step mean passes 0.2 at step 31
    # (0.25) and 0.8 at step 34 (1.0)
    phases = learning_phases(accuracies, window=4)
    assert (phases.plateau, phases.rise) == (31, 3)


def test_first_steps_average_the_steps_there_are():
    assert steps_to_accuracy([0.5, 0.0, 0.0], 0.2) == 1
    assert steps_to_accuracy([0.1, 0.4, 0.0], 0.2) == 2  # (0.1 + 0.4) / 2 = 0.25
    assert steps_to_accuracy([0.1, 0.3, 0.0], 0.2) is None  # 0.2 is not above 0.2


def test_a_slow_start_and_a_fast_one_differ_in_plateau_not_in_rise():
    """Two curves with the same sigmoid at different places: the plateaus differ
    by the shift, the rises are equal."""
    steps = torch.arange(1, 301, dtype=torch.float64)
    early = torch.sigmoid((steps - 30) / 4).tolist()
    late = torch.sigmoid((steps - 150) / 4).tolist()
    early_phases, late_phases = learning_phases(early), learning_phases(late)
    assert late_phases.plateau - early_phases.plateau == 120
    assert late_phases.rise == early_phases.rise


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_the_running_mean_by_convolution(seed):
    generator = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, 120, dtype=torch.float64)
    noisy = (ramp + 0.2 * torch.rand(120, generator=generator, dtype=torch.float64))
    accuracies = noisy.clamp(0, 1).tolist()
    for window in (1, 5, 10):
        means = running_mean_reference(accuracies, window)
        for threshold in (0.1, 0.2, 0.5, 0.8):
            above = (means > threshold).nonzero()
            expected = int(above[0]) + 1 if len(above) else None
            assert steps_to_accuracy(accuracies, threshold, window=window) == expected


def test_never_passing_gives_none():
    flat = [0.1] * 50
    assert learning_phases(flat) == LearningPhases(None, None, 0.2, 0.8, 10)
    halfway = [0.1] * 20 + [0.5] * 30
    # step 20 + k averages 10 - k steps at 0.1 and k at 0.5: 0.18 at k = 2, 0.22 at k = 3
    assert learning_phases(halfway).plateau == 23
    assert learning_phases(halfway).rise is None


def test_tensor_and_list_give_the_same():
    accuracies = [0.0] * 12 + [0.5] * 5 + [1.0] * 10
    assert learning_phases(torch.tensor(accuracies)) == learning_phases(accuracies)
    assert learning_phases(tuple(accuracies)) == learning_phases(accuracies)


def test_on_a_real_run_the_history_is_accepted():
    """The reversal task of chapter 10 learns within 60 steps: both phases are
    measured, and the accuracy is above 0.8 when the rise ends."""
    torch.manual_seed(0)
    model = TinyTransformer(16, 16, 32, 1, 1)
    history = train(model, lambda g: data.reversal_batch(32, 8, 16, generator=g), 60, seed=0)
    phases = learning_phases(history.accuracies)
    assert phases.plateau is not None and phases.rise is not None
    end = phases.plateau + phases.rise
    assert sum(history.accuracies[end - 10:end]) / 10 > 0.8
    assert sum(history.accuracies[end - 11:end - 1]) / 10 <= 0.8


@pytest.mark.parametrize(
    ("accuracies", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "empty"),
        (torch.zeros(2, 3), {}, ValueError, "1-D"),
        ([0.1, 1.5], {}, ValueError, r"\[0, 1\], got 1.5 at step 2"),
        ([0.1, float("nan")], {}, ValueError, "at step 2"),
        ("0.1", {}, TypeError, "sequence of floats"),
        (0.5, {}, TypeError, "sequence of floats"),
        ([0.1, "x"], {}, TypeError, "numbers"),
        ([0.1, True], {}, TypeError, "numbers"),
        ([0.1], {"low": 0.8, "high": 0.2}, ValueError, "high must be above low"),
        ([0.1], {"high": 1.0}, ValueError, r"high must lie in \[0, 1\)"),
        ([0.1], {"low": -0.1}, ValueError, r"low must lie in \[0, 1\)"),
        ([0.1], {"low": "0.2"}, TypeError, "low must be a float"),
        ([0.1], {"window": 0}, ValueError, "window must be a positive int"),
        ([0.1], {"window": 2.5}, TypeError, "window must be an int"),
    ],
)
def test_learning_phases_errors(accuracies, kwargs, error, match):
    with pytest.raises(error, match=match):
        learning_phases(accuracies, **kwargs)


def test_steps_to_accuracy_errors():
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\)"):
        steps_to_accuracy([0.5], 1.0)
    with pytest.raises(TypeError, match="threshold must be a float"):
        steps_to_accuracy([0.5], True)
    with pytest.raises(TypeError, match="window must be an int"):
        steps_to_accuracy([0.5], 0.2, window=None)
