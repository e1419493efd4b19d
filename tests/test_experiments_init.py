"""attnlib.experiments, chapter 4's section: does the initialisation decide how
attention learns? (marked_token_batch, train_marked_token)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnlib
from attnlib.experiments import (
    INITIALISATIONS,
    MarkedTokenTraining,
    marked_token_batch,
    train_marked_token,
)

CLASSES = {"torch.rand": attnlib.SelfAttention_v1, "nn.Linear": attnlib.SelfAttention_v2}


def readable_loop(cls, seed, num_steps, *, optimizer="adam", lr=0.01, data_seed=1000,
                  transform=None, value_cls=None, beta2=0.999, all_grads=False):
    """The loop train_marked_token's docstring promises, with the real module.

    value_cls: take W_value from this class, built with the same seed.
    all_grads: return the gradient norms of every step, (num_steps, 3)."""
    torch.manual_seed(seed)
    model = cls(16, 16)
    if transform is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(transform(param))
    if value_cls is not None:
        torch.manual_seed(seed)
        other = value_cls(16, 16)
        value = other.W_value if isinstance(other, attnlib.SelfAttention_v1) else (
            other.W_value.weight.T)
        with torch.no_grad():
            if isinstance(model, attnlib.SelfAttention_v1):
                model.W_value.copy_(value)
            else:
                model.W_value.weight.copy_(value.T)
    if optimizer == "adam":
        optim = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, beta2))
    else:
        optim = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(data_seed + seed)
    losses, grads = [], []
    for _ in range(num_steps):
        x, targets, _ = marked_token_batch(64, 8, 16, generator=generator)
        loss = F.mse_loss(model(x), targets)
        optim.zero_grad()
        loss.backward()
        grads.append([p.grad.norm().item() for p in model.parameters()])
        optim.step()
        losses.append(loss.item())
    grads = torch.tensor(grads, dtype=torch.float64)  # (num_steps, 3)
    return torch.tensor(losses, dtype=torch.float64), grads if all_grads else grads[0]


# --------------------------------------------------------------------------- the task


def test_marked_token_batch_shapes_and_content():
    x, targets, marked = marked_token_batch(5, 7, 6, generator=torch.Generator().manual_seed(0))
    assert x.shape == targets.shape == (5, 7, 6) and marked.shape == (5,)
    assert x.dtype == targets.dtype == torch.float32 and marked.dtype == torch.int64
    assert torch.equal(x[..., -2], torch.ones(5, 7))  # the constant feature
    assert torch.equal(x[..., -1], F.one_hot(marked, 7).float())  # the marker
    for b in range(5):  # every position's target is the marked token's embedding
        assert torch.equal(targets[b], x[b, marked[b]].expand(7, 6))


def test_marked_token_batch_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    first = marked_token_batch(generator=torch.Generator().manual_seed(3))
    second = marked_token_batch(generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    other = marked_token_batch(generator=torch.Generator().manual_seed(4))
    assert not torch.equal(first[0], other[0])


def test_marked_positions_cover_every_token():
    _, _, marked = marked_token_batch(512, 8, 16, generator=torch.Generator().manual_seed(0))
    assert set(marked.tolist()) == set(range(8))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"num_tokens": 1}, ValueError, "num_tokens must be >= 2"),
        ({"d_in": 2}, ValueError, "d_in must be >= 3"),
        ({"d_in": 4.0}, TypeError, "d_in must be an int"),
        ({"generator": 0}, TypeError, "generator must be a torch.Generator or None, got int"),
    ],
)
def test_marked_token_batch_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        marked_token_batch(**kwargs)


# --------------------------------------------------------------------------- training


# About 12 s each on one core (two seeds of 80 steps against the readable loop): left to
# make test; the controls below run the same comparison for 30 steps in make unit.
@pytest.mark.slow
@pytest.mark.parametrize("init", ["torch.rand", "nn.Linear"])
def test_training_is_the_readable_loop_with_the_real_class(init):
    result = train_marked_token(init, seeds=[0, 2], num_steps=80)
    for row, seed in enumerate((0, 2)):
        losses, grads = readable_loop(CLASSES[init], seed, 80)
        torch.testing.assert_close(result.losses[row], losses, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.initial_grad_norm[row], grads, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    ("init", "transform"),
    [("torch.rand - 0.5", lambda w: w - 0.5),
     ("torch.rand / sqrt(d_in)", lambda w: w / math.sqrt(16))],
)
def test_the_controls_change_torch_rand_draws_in_one_respect(init, transform):
    result = train_marked_token(init, seeds=[1], num_steps=30)
    losses, grads = readable_loop(attnlib.SelfAttention_v1, 1, 30, transform=transform)
    torch.testing.assert_close(result.losses[0], losses, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(result.initial_grad_norm[0], grads, rtol=1e-4, atol=1e-7)


def test_sgd_is_the_readable_loop_and_its_first_step_is_lr_times_the_gradient():
    result = train_marked_token("torch.rand", seeds=[0], num_steps=20, optimizer="sgd", lr=0.5)
    losses, grads = readable_loop(attnlib.SelfAttention_v1, 0, 20, optimizer="sgd", lr=0.5)
    torch.testing.assert_close(result.losses[0], losses, rtol=1e-4, atol=1e-6)
    # An SGD step is -lr * gradient: its RMS over the 16 x 16 entries is lr * |g|_F / 16.
    torch.testing.assert_close(result.first_update_rms[0], 0.5 * grads / 16, rtol=1e-4, atol=0)


def test_update_rms_records_every_step():
    result = train_marked_token("nn.Linear", seeds=[2], num_steps=15, optimizer="sgd", lr=0.5)
    _, grads = readable_loop(attnlib.SelfAttention_v2, 2, 15, optimizer="sgd", lr=0.5,
                             all_grads=True)
    assert result.update_rms.shape == (1, 15, 3) and result.update_rms.dtype == torch.float64
    # Every SGD step, not only the first, is -lr * that step's gradient.
    torch.testing.assert_close(result.update_rms[0], 0.5 * grads / 16, rtol=1e-4, atol=1e-9)
    assert torch.equal(result.first_update_rms, result.update_rms[:, 0])


@pytest.mark.parametrize(
    ("init", "value_init", "cls", "value_cls"),
    [("torch.rand", "nn.Linear", attnlib.SelfAttention_v1, attnlib.SelfAttention_v2),
     ("nn.Linear", "torch.rand", attnlib.SelfAttention_v2, attnlib.SelfAttention_v1)],
)
def test_value_init_swaps_w_value_only(init, value_init, cls, value_cls):
    result = train_marked_token(init, seeds=[0, 3], num_steps=40, value_init=value_init)
    assert (result.init, result.value_init) == (init, value_init)
    for row, seed in enumerate((0, 3)):
        losses, grads = readable_loop(cls, seed, 40, value_cls=value_cls)
        torch.testing.assert_close(result.losses[row], losses, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result.initial_grad_norm[row], grads, rtol=1e-4, atol=1e-7)
    # W_query and W_key are init's: the scores at the start are those of init alone.
    alone = train_marked_token(init, seeds=[0, 3], num_steps=1)
    assert alone.value_init == init
    torch.testing.assert_close(result.score_margin[:, 0], alone.score_margin[:, 0])
    assert not torch.allclose(result.losses[:, 0], alone.losses[:, 0])


def test_adam_beta2_is_passed_to_adam():
    result = train_marked_token("torch.rand", seeds=[1], num_steps=30, adam_beta2=0.9)
    assert result.adam_beta2 == 0.9
    losses, _ = readable_loop(attnlib.SelfAttention_v1, 1, 30, beta2=0.9)
    torch.testing.assert_close(result.losses[0], losses, rtol=1e-4, atol=1e-6)
    default, _ = readable_loop(attnlib.SelfAttention_v1, 1, 30)
    assert not torch.allclose(losses, default, rtol=1e-3, atol=0)


@pytest.mark.parametrize("init", INITIALISATIONS)
def test_adams_first_step_moves_every_weight_by_about_lr_whatever_the_gradient(init):
    result = train_marked_token(init, seeds=[0], num_steps=1, lr=0.01)
    # Adam's first update is lr * g / (|g| + eps), element by element.
    assert torch.all(result.first_update_rms <= 0.01 + 1e-7)
    assert torch.all(result.first_update_rms > 0.009)


def test_each_seed_trains_as_if_alone():
    together = train_marked_token("nn.Linear", seeds=[4, 1], num_steps=40)
    alone = train_marked_token("nn.Linear", seeds=[1], num_steps=40)
    torch.testing.assert_close(together.losses[1], alone.losses[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(together.final_loss[1], alone.final_loss[0], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(together.losses[0], together.losses[1])


def test_result_shapes_dtypes_and_ranges():
    result = train_marked_token("nn.Linear", seeds=range(3), num_steps=25)
    assert isinstance(result, MarkedTokenTraining)
    assert result.num_steps == 25 and result.seeds == (0, 1, 2)
    for series in (result.losses, result.weight_on_marked, result.score_margin):
        assert series.shape == (3, 25) and series.dtype == torch.float64
    for per_seed in (result.initial_max_weight, result.final_loss, result.final_weight_on_marked):
        assert per_seed.shape == (3,) and per_seed.dtype == torch.float64
    assert result.initial_grad_norm.shape == result.first_update_rms.shape == (3, 3)
    assert torch.all((result.weight_on_marked > 0) & (result.weight_on_marked < 1))
    # A weight between 1/num_tokens (uniform) and 1 (one-hot).
    assert torch.all((result.initial_max_weight >= 1 / 8) & (result.initial_max_weight <= 1))


def test_training_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    state = torch.get_rng_state()
    train_marked_token("torch.rand", seeds=[0], num_steps=3)
    assert torch.equal(torch.get_rng_state(), state)


def test_steps_to_threshold_counts_steps_before_the_first_loss_below_it():
    losses = torch.tensor([[1.0, 0.5, 0.005, 0.2], [1.0, 1.0, 1.0, 1.0], [0.001, 1, 1, 1]],
                          dtype=torch.float64)
    zeros = torch.zeros(3, dtype=torch.float64)
    result = MarkedTokenTraining(
        init="nn.Linear", value_init="nn.Linear", optimizer="adam", lr=0.01, adam_beta2=0.999,
        seeds=(0, 1, 2), threshold=0.01, losses=losses, weight_on_marked=losses,
        score_margin=losses, initial_max_weight=zeros, initial_grad_norm=torch.zeros(3, 3),
        update_rms=torch.zeros(3, 4, 3),
        final_loss=zeros, final_weight_on_marked=zeros,
    )
    assert result.steps_to_threshold.tolist() == [2, -1, 0]


def test_the_nn_linear_start_learns_the_lookup_and_the_torch_rand_start_not_yet():
    """The chapter's result in small: after 200 Adam steps nn.Linear has solved
    the task and torch.rand has not; torch.rand starts with its softmax far
    more saturated and the marked key further behind."""
    linear = train_marked_token("nn.Linear", seeds=[0, 1], num_steps=200)
    rand = train_marked_token("torch.rand", seeds=[0, 1], num_steps=200)
    assert torch.all(linear.steps_to_threshold >= 0)
    assert torch.all(linear.final_weight_on_marked > 0.9)
    assert torch.all(rand.steps_to_threshold == -1)
    assert torch.all(rand.initial_max_weight > 2 * linear.initial_max_weight)
    assert torch.all(rand.score_margin[:, 0] < 10 * linear.score_margin[:, 0])  # both negative


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"init": "rand"}, ValueError, r"init must be one of .*got init='rand'"),
        ({"init": 3}, TypeError, "init must be a str"),
        ({"value_init": "linear"}, ValueError, r"value_init must be one of .*got value_init="),
        ({"value_init": 1}, TypeError, "value_init must be a str"),
        ({"adam_beta2": 1.0}, ValueError, r"adam_beta2 must be in \[0, 1\), got adam_beta2=1.0"),
        ({"adam_beta2": -0.1}, ValueError, r"adam_beta2 must be in \[0, 1\)"),
        ({"adam_beta2": "0.9"}, TypeError, "adam_beta2 must be a real number, got str"),
        ({"adam_beta2": True}, TypeError, "adam_beta2 must be a real number, got bool"),
        ({"optimizer": "adamw"}, ValueError, r"optimizer must be one of \('adam', 'sgd'\)"),
        ({"seeds": []}, ValueError, "at least one seed"),
        ({"seeds": [1, 1]}, ValueError, "different from one another"),
        ({"seeds": [-1]}, ValueError, "each seed must be >= 0"),
        ({"seeds": "01"}, TypeError, "seeds must be a sequence of ints"),
        ({"seeds": [0.5]}, TypeError, "each seed must be an int"),
        ({"num_steps": 0}, ValueError, "num_steps must be >= 1"),
        ({"lr": 0}, ValueError, "lr must be finite and > 0"),
        ({"lr": float("nan")}, ValueError, "lr must be finite and > 0"),
        ({"lr": "0.1"}, TypeError, "lr must be a real number"),
        ({"threshold": -1.0}, ValueError, "threshold must be finite and > 0"),
        ({"d_in": 2}, ValueError, "d_in must be >= 3"),
        ({"num_tokens": 1}, ValueError, "num_tokens must be >= 2"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"data_seed": -5}, ValueError, "data_seed must be >= 0"),
    ],
)
def test_train_marked_token_refuses_bad_arguments(kwargs, error, match):
    arguments = {"init": "nn.Linear", "num_steps": 1} | kwargs
    with pytest.raises(error, match=match):
        train_marked_token(**arguments)


def test_training_runs_on_one_thread_and_restores_the_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train_marked_token("nn.Linear", seeds=[0], num_steps=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
