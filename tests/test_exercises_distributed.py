"""attnlib.exercises.distributed: check_lse_merge, check_causal_ring_steps and
check_zigzag_shard.

Each checker accepts the reference and the book's solution, and rejects each typical
wrong answer with a message that names it (one test per wrong answer); the global
random state is unchanged after every check.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlib.distributed import merge_partials, ring_schedule, zigzag_shard
from attnlib.exercises.distributed import (
    CheckFailed,
    check_causal_ring_steps,
    check_lse_merge,
    check_zigzag_shard,
)

# ---------------------------------------------------------------------------
# check_lse_merge
# ---------------------------------------------------------------------------


def book_merge(out_a, lse_a, out_b, lse_b):
    """The solution printed in chapter 12."""
    m = torch.maximum(lse_a, lse_b)  # the larger log-sum-exp of each row
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)  # l_a, l_b rescaled to m
    out = (w_a * out_a + w_b * out_b) / (w_a + w_b)
    return out, m + torch.log(w_a + w_b)


def learner_merge(weights="right", normalise=True, lse="right", stable=True):
    def my_merge(out_a, lse_a, out_b, lse_b):
        m = torch.maximum(lse_a, lse_b) if stable else torch.zeros_like(lse_a)
        w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
        if weights == "equal":
            w_a, w_b = torch.ones_like(w_a), torch.ones_like(w_b)
        elif weights == "lse":
            w_a, w_b = lse_a, lse_b
        elif weights == "swapped":
            w_a, w_b = w_b, w_a
        out = w_a * out_a + w_b * out_b
        if normalise:
            out = out / (w_a + w_b)
        ww_a, ww_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
        merged = {"right": m + torch.log(ww_a + ww_b), "max": m, "sum": lse_a + lse_b,
                  "mean": m + torch.log((ww_a + ww_b) / 2)}[lse]
        return out, merged
    return my_merge


def test_lse_merge_accepts_the_book_solution_and_the_reference(capsys):
    assert check_lse_merge(book_merge) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_lse_merge(merge_partials) is True
    assert check_lse_merge(learner_merge()) is True


def test_lse_merge_accepts_logaddexp():
    def with_logaddexp(out_a, lse_a, out_b, lse_b):
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse

    assert check_lse_merge(with_logaddexp) is True


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(learner_merge(weights="equal"), "averages the two outputs", id="equal"),
    pytest.param(learner_merge(weights="lse"), "log-sum-exps themselves", id="lse-weights"),
    pytest.param(learner_merge(normalise=False), "does not divide by the sum of the weights",
                 id="not-normalised"),
    pytest.param(learner_merge(weights="swapped"), "swaps the weights", id="swapped"),
    pytest.param(learner_merge(lse="max"), r"returns max\(lse_a, lse_b\)", id="lse-max"),
    pytest.param(learner_merge(lse="sum"), "adds the two log-sum-exps", id="lse-sum"),
    pytest.param(learner_merge(lse="mean"), "log of the mean", id="lse-mean"),
    pytest.param(learner_merge(stable=False), "overflows float64", id="overflow"),
    pytest.param(lambda oa, la, ob, lb: (
        (torch.exp(la - lb) * oa + ob) / (torch.exp(la - lb) + 1),
        lb + torch.log1p(torch.exp(la - lb))), "part that saw no key has weight", id="nan-on-empty"),
    pytest.param(lambda oa, la, ob, lb: (oa.mul_(2.0), la), "changed its argument out_a",
                 id="in-place"),
    pytest.param(lambda oa, la, ob, lb: oa, "expected a tuple", id="not-a-pair"),
    pytest.param(lambda oa, la, ob, lb: (oa, la.squeeze(-1)), "returned shape", id="lse-shape"),
    pytest.param(lambda oa, la, ob, lb: book_merge(oa * 2, la, ob, lb),
                 "differs from the right one", id="something-else"),
])
def test_lse_merge_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_lse_merge(wrong)


# ---------------------------------------------------------------------------
# check_causal_ring_steps
# ---------------------------------------------------------------------------


def book_ring_step(rank, step, world_size):
    """The solution printed in chapter 12."""
    source = (rank - step) % world_size  # blocks move one rank forward per step
    if source == rank:
        return "diagonal"
    return "full" if source < rank else "skip"


def test_ring_steps_accepts_the_book_solution_and_the_library(capsys):
    assert check_causal_ring_steps(book_ring_step) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_causal_ring_steps(
        lambda r, s, p: ring_schedule(p, True, "contiguous")[r][s].kind) is True
    # Without the modulo: a block comes from an earlier rank exactly while step <= rank.
    assert check_causal_ring_steps(
        lambda r, s, p: "diagonal" if s == 0 else ("full" if s <= r else "skip")) is True


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(lambda r, s, p: "full", "ignores the causal mask", id="no-mask"),
    pytest.param(lambda r, s, p: "diagonal" if s == 0 else "full",
                 "computes the blocks of later ranks", id="later-computed"),
    pytest.param(lambda r, s, p: "diagonal" if s == 0 else (
        "skip" if (r - s) % p < r else "full"), "swaps 'full' and 'skip'", id="swapped"),
    pytest.param(lambda r, s, p: book_ring_step(r, -s, p), "turns the ring the wrong way",
                 id="wrong-direction"),
    pytest.param(lambda r, s, p: "diagonal" if s == 0 else ("full" if s < r else "skip"),
                 "skips the block of rank 0", id="off-by-one"),
    pytest.param(lambda r, s, p: "full" if s == 0 else book_ring_step(r, s, p),
                 "marks the step-0 block 'full'", id="own-full"),
    pytest.param(lambda r, s, p: "Skip" if book_ring_step(r, s, p) == "skip"
                 else book_ring_step(r, s, p), "expected one of", id="bad-string"),
    pytest.param(lambda r, s, p: "skip" if (r, s, p) == (4, 2, 6) else book_ring_step(r, s, p),
                 r"rank=4, step=2, world_size=6\) returned 'skip'", id="one-wrong-entry"),
    pytest.param(lambda r, s: "full", "TypeError", id="wrong-signature"),
])
def test_ring_steps_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_causal_ring_steps(wrong)


# ---------------------------------------------------------------------------
# check_zigzag_shard
# ---------------------------------------------------------------------------


def book_zigzag_shard(x, rank, world_size):
    """The solution printed in chapter 12."""
    chunks = x.chunk(2 * world_size, dim=-2)  # 2P equal chunks of the tokens
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=-2)


def test_zigzag_accepts_the_book_solution_and_the_library(capsys):
    assert check_zigzag_shard(book_zigzag_shard) is True
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_zigzag_shard(zigzag_shard) is True


def _chunk(x, parts, index):
    return x.chunk(parts, dim=-2)[index]


@pytest.mark.parametrize(("wrong", "named"), [
    pytest.param(lambda x, r, p: _chunk(x, p, r), "returns the contiguous shard",
                 id="contiguous"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, 2 * p - 1 - r),
                                            _chunk(x, 2 * p, r)], dim=-2),
                 "puts the late chunk first", id="late-first"),
    pytest.param(lambda x, r, p: x[..., r::p, :], "striped attention", id="striped"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, r), _chunk(x, 2 * p, p - 1 - r)],
                                           dim=-2), "mirrors the rank within world_size",
                 id="mirror-p"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, r), _chunk(x, 2 * p, 2 * p - r)],
                                           dim=-2), "IndexError", id="mirror-off-by-one"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.transpose(-2, -1), r, p),
                 "returned shape", id="wrong-dim"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.sub_(0.0), r, p) + 1.0,
                 "tokens at positions", id="other-values"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.mul_(2.0), r, p),
                 "changed its argument x", id="in-place"),
])
def test_zigzag_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_zigzag_shard(wrong)


@pytest.mark.parametrize("check", [check_lse_merge, check_causal_ring_steps,
                                   check_zigzag_shard])
def test_checkers_refuse_nonsense_and_report_a_stub(check):
    with pytest.raises(CheckFailed, match="a function"):
        check("answer")

    def stub(*args):
        raise NotImplementedError("fill me in")

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check(stub)


@pytest.mark.parametrize(("check", "answer"), [(check_lse_merge, book_merge),
                                               (check_causal_ring_steps, book_ring_step),
                                               (check_zigzag_shard, book_zigzag_shard)])
def test_checkers_leave_the_global_random_state_alone(check, answer):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check(answer)
    assert torch.equal(torch.rand(3), expected)
    assert math.isfinite(float(expected.sum()))
