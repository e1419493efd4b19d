"""attnlib.exercises.position: check_sinusoidal_encoding accepts the right
tables and names each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch

import attnlib
from attnlib.exercises import CheckFailed, check_sinusoidal_encoding


def book_sinusoidal_encoding(num_positions, d_model):
    """The book's solution to the exercise (chapter 7)."""
    positions = torch.arange(num_positions, dtype=torch.float32)  # (num_positions,)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # 0, 2, 4, ...
    omegas = 10000.0 ** (-two_i / d_model)  # (d_model // 2,)
    angles = positions[:, None] * omegas[None, :]  # (num_positions, d_model // 2)
    encoding = torch.zeros(num_positions, d_model)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles)
    return encoding


def exp_log_form(num_positions, d_model):
    """The exp-log form of many tutorials, also right."""
    position = torch.arange(num_positions).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(num_positions, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def make(*, first=torch.sin, second=torch.cos, exponent=lambda two_i, i: two_i, base=10000.0,
         start=0, halves=False, sign=-1, own_index=False):
    """A sinusoidal table with one deliberate mistake."""

    def encoding(num_positions, d_model):
        positions = torch.arange(start, start + num_positions, dtype=torch.float64)
        i = torch.arange(d_model // 2, dtype=torch.float64)
        omegas = base ** (sign * exponent(2 * i, i) / d_model)
        angles = positions[:, None] * omegas[None, :]
        if halves:
            return torch.cat((first(angles), second(angles)), dim=-1)
        table = torch.empty(num_positions, d_model, dtype=torch.float64)
        table[:, 0::2] = first(angles)
        if own_index:
            column = torch.arange(1, d_model, 2, dtype=torch.float64)
            table[:, 1::2] = second(positions[:, None] * base ** (-column / d_model))
        else:
            table[:, 1::2] = second(angles)
        return table

    return encoding


def two_pi(num_positions, d_model):
    """Angles in cycles rather than radians: sin(2 pi pos omega_i)."""
    positions = torch.arange(num_positions, dtype=torch.float64)
    omegas = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = 2 * math.pi * positions[:, None] * omegas[None, :]
    table = torch.empty(num_positions, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angles), torch.cos(angles)
    return table


def test_the_reference_and_right_answers_pass(capsys):
    assert check_sinusoidal_encoding(lambda n, d: attnlib.sinusoidal_encoding(n, d)) is True
    assert check_sinusoidal_encoding(book_sinusoidal_encoding) is True
    assert check_sinusoidal_encoding(exp_log_form) is True
    assert check_sinusoidal_encoding(make()) is True  # the factory without a mistake
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (make(first=torch.cos, second=torch.sin), "puts the cosine in the even columns"),
        (make(halves=True), "all the sines in the first half"),
        (make(exponent=lambda two_i, i: i), "uses the pair index i in the exponent"),
        (make(own_index=True), "uses the column index in the exponent for the cosines too"),
        (make(base=math.e), "uses base e instead of 10000"),
        (make(start=1), "starts the positions at 1"),
        (make(sign=+1), "forgets the minus sign"),
        (make(exponent=lambda two_i, i: 2 * two_i), "doubles the exponent"),
        (two_pi, "multiplies the angles by 2 pi"),
        (lambda n, d: book_sinusoidal_encoding(n, d).half(), "float16 keeps only about three"),
        (lambda n, d: book_sinusoidal_encoding(n, d).bfloat16(), "bfloat16 table"),
    ],
    ids=["sin_cos_swapped", "halves", "i_not_2i", "own_index", "base_missing", "start_at_1",
         "sign", "doubled_exponent", "two_pi", "float16", "bfloat16"],
)
def test_each_wrong_answer_is_named(answer, named):
    with pytest.raises(CheckFailed) as failure:
        check_sinusoidal_encoding(answer)
    assert named in str(failure.value)


def test_an_unknown_mistake_reports_where():
    with pytest.raises(CheckFailed, match="matches none of the typical mistakes"):
        check_sinusoidal_encoding(lambda n, d: 2 * book_sinusoidal_encoding(n, d))


def test_nonsense_gets_a_clear_message():
    with pytest.raises(CheckFailed, match="a function, but got str"):
        check_sinusoidal_encoding("sinusoidal_encoding")
    with pytest.raises(CheckFailed, match=r"returned shape \(6, 7\); expected \(7, 6\)"):
        check_sinusoidal_encoding(lambda n, d: book_sinusoidal_encoding(n, d).T)
    with pytest.raises(CheckFailed, match="returned numpy.ndarray"):
        check_sinusoidal_encoding(lambda n, d: book_sinusoidal_encoding(n, d).numpy())
    with pytest.raises(CheckFailed, match="floating-point"):
        check_sinusoidal_encoding(lambda n, d: torch.zeros(n, d, dtype=torch.int64))
    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_sinusoidal_encoding(lambda n, d: (_ for _ in ()).throw(NotImplementedError()))


def test_the_check_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    check_sinusoidal_encoding(book_sinusoidal_encoding)
    with pytest.raises(CheckFailed):
        check_sinusoidal_encoding(make(start=1))
    assert torch.equal(torch.get_rng_state(), state)


def test_bad_device_is_refused():
    with pytest.raises(TypeError, match="device must be"):
        check_sinusoidal_encoding(book_sinusoidal_encoding, device=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_the_check_on_cuda():
    assert check_sinusoidal_encoding(book_sinusoidal_encoding, device="cuda") is True
