"""attnlib.exercises.kernel_tiles: check_causal_stages and check_kv_pair.

Each checker accepts the book's solution and right alternatives, and rejects each
typical wrong answer with a message that names it (one learner's function per
mistake); the global random state is unchanged after every check. Plain Python:
no Triton needed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlib import flash_triton
from attnlib.exercises import CheckFailed, check_causal_stages, check_kv_pair

# --- check_causal_stages -----------------------------------------------------------------


def causal_stages(start_m, block_m, block_n, num_tokens_kv):
    """The solution printed in chapter 11."""
    masked_stop = min(start_m + block_m, num_tokens_kv)  # no query sees keys past it
    full_stop = min(start_m + 1, num_tokens_kv)  # keys every query of the block sees
    unmasked_stop = full_stop // block_n * block_n  # whole tiles only
    return unmasked_stop, masked_stop


def test_causal_stages_accepts_the_book_solution(capsys):
    assert check_causal_stages(causal_stages) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_causal_stages_accepts_numpy_integers_a_list_and_the_kernels_bounds():
    def numpy_ints(start_m, block_m, block_n, n_kv):
        u, m = causal_stages(start_m, block_m, block_n, n_kv)
        return [np.int64(u), torch.tensor(m)]

    def from_the_kernel(start_m, block_m, block_n, n_kv):  # attnlib's own schedule
        lo, mid_lo, mid_hi, hi = flash_triton.key_tile_bounds(
            start_m, n_kv, 0, None, True, block_m, block_n)
        assert lo == mid_lo == 0
        return mid_hi, hi

    def rounded_up(start_m, block_m, block_n, n_kv):  # a stop inside the last tile is fine
        u, m = causal_stages(start_m, block_m, block_n, n_kv)
        return u, min(-(-m // block_n) * block_n, n_kv)

    for fn in (numpy_ints, from_the_kernel, rounded_up):
        assert check_causal_stages(fn) is True


def _diagonal_unmasked(start_m, block_m, block_n, n_kv):
    return min(start_m + block_m, n_kv) // block_n * block_n, min(start_m + block_m, n_kv)


def _partial_unmasked(start_m, block_m, block_n, n_kv):
    return (start_m + 1) // block_n * block_n, min(start_m + block_m, n_kv)


def _no_skip(start_m, block_m, block_n, n_kv):
    return causal_stages(start_m, block_m, block_n, n_kv)[0], n_kv


def _past_the_end(start_m, block_m, block_n, n_kv):
    return causal_stages(start_m, block_m, block_n, n_kv)[0], start_m + block_m


def _stops_short(start_m, block_m, block_n, n_kv):
    return causal_stages(start_m, block_m, block_n, n_kv)[0], min(start_m + 1, n_kv)


def _all_masked(start_m, block_m, block_n, n_kv):
    return 0, min(start_m + block_m, n_kv)


def _not_aligned(start_m, block_m, block_n, n_kv):
    return min(start_m + 1, n_kv) - 1 if start_m else 0, min(start_m + block_m, n_kv)


@pytest.mark.parametrize("fn, named", [
    (_diagonal_unmasked, "cut by the causal diagonal"),
    (_partial_unmasked, "the last, partial tile"),
    (_no_skip, "above the diagonal"),
    (_past_the_end, "past the last of the"),
    (_stops_short, "skips key"),
    (_all_masked, "sees in full"),
    (_not_aligned, "not a multiple of block_n"),
])
def test_causal_stages_names_each_wrong_answer(fn, named):
    state = torch.random.get_rng_state()
    with pytest.raises(CheckFailed, match=named):
        check_causal_stages(fn)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("answer, named", [
    (causal_stages(0, 64, 64, 64), "a function"),
    (lambda *a: 3, "expected a pair"),
    (lambda *a: (0.0, 64), "not an integer"),
    (lambda *a: (True, 64), "bool"),
    (lambda *a: (_ for _ in ()).throw(ValueError("nope")), "raised ValueError"),
])
def test_causal_stages_nonsense(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_causal_stages(answer)


def test_causal_stages_stub_is_named_as_a_stub():
    def stub(start_m, block_m, block_n, num_tokens_kv):
        raise NotImplementedError("compute the two stops")

    with pytest.raises(CheckFailed, match="replace the stub"):
        check_causal_stages(stub)


# --- check_kv_pair -------------------------------------------------------------------------


def kv_pair(bh, num_heads, num_kv_groups):
    """The solution printed in chapter 11."""
    return bh // (num_heads // num_kv_groups)


def test_kv_pair_accepts_the_book_solution_and_an_explicit_one(capsys):
    assert check_kv_pair(kv_pair) is True
    assert capsys.readouterr().out.startswith("Correct:")

    def explicit(bh, num_heads, num_kv_groups):
        batch, head = divmod(bh, num_heads)
        return np.int64(batch * num_kv_groups + head // (num_heads // num_kv_groups))

    assert check_kv_pair(explicit) is True


@pytest.mark.parametrize("fn, named", [
    (lambda bh, h, g: (bh // h) * g + (bh % h) % g, "round-robin"),
    (lambda bh, h, g: (bh % h) // (h // g), "forgets the batch"),
    (lambda bh, h, g: bh // g, "divides by num_kv_groups"),
    (lambda bh, h, g: bh, "as many key heads as query heads"),
    (lambda bh, h, g: 0, "does not read that key/value pair"),
])
def test_kv_pair_names_each_wrong_answer(fn, named):
    with pytest.raises(CheckFailed, match=named):
        check_kv_pair(fn)


@pytest.mark.parametrize("answer, named", [
    (3, "a function"),
    (lambda *a: 1.0, "not an integer"),
    (lambda *a: [0], "not an integer"),
])
def test_kv_pair_nonsense(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_kv_pair(answer)
