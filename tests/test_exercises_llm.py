"""attnlib.exercises.llm: check_rope, check_repeat_kv and check_kv_cache_mask.

Each checker accepts the reference and the book's solution (chapter 9), and
rejects each typical wrong answer with a message that names it (one test per
wrong answer); none changes the global random state.
"""

from __future__ import annotations

import pytest
import torch

import attnlib
from attnlib.exercises import CheckFailed, check_kv_cache_mask, check_repeat_kv, check_rope
from attnlib.functional import bottom_right_causal_mask, causal_mask

# ---------------------------------------------------------------------------
# The book's solutions (chapter 9), verbatim
# ---------------------------------------------------------------------------


def my_rope(x, base=10000.0):
    num_tokens, head_dim = x.shape[-2], x.shape[-1]
    i = torch.arange(head_dim // 2, dtype=x.dtype, device=x.device)
    theta = base ** (-2 * i / head_dim)  # (head_dim // 2,)
    positions = torch.arange(num_tokens, dtype=x.dtype, device=x.device)
    angles = torch.outer(positions, theta)  # (num_tokens, head_dim // 2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (num_tokens, head_dim)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated_half * sin


def my_repeat_kv(x, group_size):
    return x.repeat_interleave(group_size, dim=1)  # (b, num_kv_groups * group_size, n, d)


def my_cache_mask(num_tokens, num_tokens_kv):
    num_cached = num_tokens_kv - num_tokens
    ones = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool)
    return torch.tril(ones, diagonal=num_cached)


# ---------------------------------------------------------------------------
# check_rope
# ---------------------------------------------------------------------------


def _reference_rope(x, base=10000.0):
    return attnlib.RotaryPositionalEmbedding(x.shape[-1], x.shape[-2], base=base)(x)


def test_check_rope_accepts_the_reference_and_the_book(capsys):
    assert check_rope(_reference_rope) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_rope(my_rope) is True


def _rope_variant(x, *, first=0, two=2, sign=1.0, swap_only=False, adjacent=False,
                  first_pair=0, interleave_angles=False, swap_cos_sin=False,
                  adjacent_with_cat=False):
    n, d = x.shape[-2], x.shape[-1]
    i = torch.arange(first_pair, first_pair + d // 2, dtype=x.dtype)
    theta = 10000.0 ** (-two * i / d)
    angles = torch.outer(torch.arange(first, first + n, dtype=x.dtype), theta)
    if adjacent:
        out = x.clone()
        xe, xo = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = xe * angles.cos() - xo * angles.sin()
        out[..., 1::2] = xe * angles.sin() + xo * angles.cos()
        return out
    if interleave_angles:
        cos = angles.cos().repeat_interleave(2, dim=-1)
        sin = angles.sin().repeat_interleave(2, dim=-1)
    else:
        cos = torch.cat([angles.cos()] * 2, dim=-1)
        sin = torch.cat([angles.sin()] * 2, dim=-1)
    if swap_cos_sin:
        cos, sin = sin, cos
    if adjacent_with_cat:
        rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * cos + rot * sin
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([x2, x1], dim=-1) if swap_only else torch.cat([-x2, x1], dim=-1)
    return x * cos + sign * rot * sin


def _rope_in_float32(x, base=10000.0):
    """The book's solution written the way many learners do: torch.arange without a
    dtype, so the angles are float32 (right to about 1e-7 only)."""
    num_tokens, head_dim = x.shape[-2], x.shape[-1]
    theta = 1.0 / base ** (torch.arange(0, head_dim, 2) / head_dim)  # float32
    angles = torch.outer(torch.arange(num_tokens), theta)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(lambda x: _rope_variant(x, adjacent=True), "ADJACENT pairs", id="adjacent"),
        pytest.param(lambda x: _rope_variant(x, first=1), "positions start at 1", id="from-1"),
        pytest.param(lambda x: _rope_variant(x, swap_only=True), "sign is missing",
                     id="missing-sign"),
        pytest.param(lambda x: _rope_variant(x, sign=-1.0), "negative angle", id="clockwise"),
        pytest.param(lambda x: _rope_variant(x, two=1),
                     r"You used base \*\* \(-i / head_dim\)", id="frequencies"),
        pytest.param(lambda x: _rope_variant(x, two=4), "divided by head_dim/2",
                     id="frequencies-over-half"),
        pytest.param(lambda x: _rope_variant(x, two=-2), "minus sign of the exponent",
                     id="exponent-sign"),
        pytest.param(lambda x: _rope_variant(x, first_pair=1), "pair index starts at 1",
                     id="pair-from-1"),
        pytest.param(lambda x: _rope_variant(x, swap_cos_sin=True), "cos and sin are swapped",
                     id="cos-sin-swapped"),
        pytest.param(lambda x: _rope_variant(x, interleave_angles=True),
                     "repeat each angle twice in a row", id="mixed-interleaved-angles"),
        pytest.param(lambda x: _rope_variant(x, adjacent_with_cat=True),
                     "you turn ADJACENT pairs", id="mixed-adjacent-with-halves-angles"),
        pytest.param(lambda x: _rope_variant(x.float(), first=1).double(),
                     "positions start at 1", id="from-1-in-float32"),
        pytest.param(_rope_in_float32, "float32's precision", id="float32-angles"),
        pytest.param(lambda x: x.float(), "dtype torch.float32", id="dtype"),
        pytest.param(lambda x: x[..., :-1], "returned shape", id="shape"),
        pytest.param(lambda x: x.mul_(2.0), "changed its input", id="mutates"),
        pytest.param(lambda x: x * 1.5, "differs from RoPE", id="other"),
    ],
)
def test_check_rope_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_rope(wrong)


def test_check_rope_names_a_base_written_into_the_answer():
    # Right for base 10000, but base is ignored: fails on the probe called with base=500.
    def fixed_base(x, base=10000.0):
        return my_rope(x)

    with pytest.raises(CheckFailed, match=r"fn\(x, base=500\) for x of shape \(3, 9, 6\): "
                                          "ignores its base argument"):
        check_rope(fixed_base)


def test_check_rope_names_a_function_without_base():
    def rope_without_base(x):
        return my_rope(x)

    with pytest.raises(CheckFailed, match="takes no argument base"):
        check_rope(rope_without_base)


def test_check_rope_answers_nonsense_clearly():
    with pytest.raises(CheckFailed, match="a function"):
        check_rope("my_rope")

    def stub(x):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_rope(stub)


# ---------------------------------------------------------------------------
# check_repeat_kv
# ---------------------------------------------------------------------------


def test_check_repeat_kv_accepts_the_book_and_an_expand():
    assert check_repeat_kv(my_repeat_kv) is True

    def by_expand(x, group_size):
        b, g, n, d = x.shape
        return x[:, :, None].expand(b, g, group_size, n, d).reshape(b, g * group_size, n, d)

    assert check_repeat_kv(by_expand) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(lambda x, r: x.repeat(1, r, 1, 1), "tiled the heads", id="repeat"),
        pytest.param(lambda x, r: torch.cat([x] * r, dim=1), "tiled the heads", id="cat"),
        pytest.param(lambda x, r: x.repeat_interleave(r, dim=2), "token dimension",
                     id="token-dim"),
        pytest.param(lambda x, r: x.repeat_interleave(r, dim=0), "batch dimension",
                     id="batch-dim"),
        pytest.param(lambda x, r: x.repeat_interleave(r, dim=-1), "last dimension",
                     id="last-dim"),
        pytest.param(lambda x, r: x[:, :, None].expand(-1, -1, r, -1, -1), "extra dimension",
                     id="expand-without-reshape"),
        pytest.param(lambda x, r: x.repeat_interleave(r, dim=1).float(), "dtype", id="dtype"),
        pytest.param(lambda x, r: x.repeat_interleave(r, dim=1).flip(1),
                     "h // group_size", id="other"),
    ],
)
def test_check_repeat_kv_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_repeat_kv(wrong)


def test_check_repeat_kv_answers_nonsense_clearly():
    with pytest.raises(CheckFailed, match="a function"):
        check_repeat_kv(torch.zeros(2))


# ---------------------------------------------------------------------------
# check_kv_cache_mask
# ---------------------------------------------------------------------------


def test_check_kv_cache_mask_accepts_the_reference_and_the_book():
    assert check_kv_cache_mask(bottom_right_causal_mask) is True
    assert check_kv_cache_mask(my_cache_mask) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(causal_mask, "TOP-LEFT", id="top-left"),
        pytest.param(lambda n, m: ~bottom_right_causal_mask(n, m), "polarity is flipped",
                     id="flipped"),
        pytest.param(lambda n, m: torch.tril(torch.ones(n, m, dtype=torch.bool),
                                             diagonal=m - n - 1),
                     "diagonal is missing", id="no-diagonal"),
        pytest.param(lambda n, m: torch.tril(torch.ones(n, m, dtype=torch.bool),
                                             diagonal=m - n + 1),
                     "a future token leaks", id="future-leak"),
        pytest.param(lambda n, m: causal_mask(n), "new tokens only", id="square"),
        pytest.param(lambda n, m: causal_mask(m), "square mask of all positions",
                     id="square-all-positions"),
        pytest.param(lambda n, m: bottom_right_causal_mask(n, m).T, "transposed",
                     id="transposed"),
        pytest.param(lambda n, m: bottom_right_causal_mask(n, m).float(), "bool mask",
                     id="float"),
        pytest.param(lambda n, m: torch.zeros(n, m).masked_fill(
                         ~bottom_right_causal_mask(n, m), float("-inf")),
                     "additive mask", id="additive"),
        pytest.param(lambda n, m: torch.ones(n, m, dtype=torch.bool), "but the mask is",
                     id="other"),
    ],
)
def test_check_kv_cache_mask_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_kv_cache_mask(wrong)


# ---------------------------------------------------------------------------
# The global random state
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "answer"),
    [(check_rope, my_rope), (check_repeat_kv, my_repeat_kv),
     (check_kv_cache_mask, my_cache_mask)],
)
def test_checkers_leave_the_global_random_state_alone(check, answer):
    torch.manual_seed(0)
    before = torch.get_rng_state()

    def noisy(*args, **kwargs):
        torch.rand(3)  # an answer that draws random numbers
        return answer(*args, **kwargs)

    check(noisy)
    assert torch.equal(torch.get_rng_state(), before)
