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
        m = {True: torch.maximum(lse_a, lse_b), False: torch.zeros_like(lse_a),
             "global": torch.maximum(lse_a.max(), lse_b.max()).expand_as(lse_a),
             "min": torch.minimum(lse_a, lse_b)}[stable]
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


def stabilised_by_lse_a(out_a, lse_a, out_b, lse_b):
    """The learner's merge of the issue: the shift is lse_a, not the larger one."""
    w_b = torch.exp(lse_b - lse_a)
    return (out_a + w_b * out_b) / (1 + w_b), lse_a + torch.log1p(w_b)


def test_lse_merge_accepts_a_list_and_other_right_forms():
    # The exercise says "returns (out, lse)": any sequence of the two tensors is that pair.
    assert check_lse_merge(lambda *parts: list(book_merge(*parts))) is True

    def with_softmax_weights(out_a, lse_a, out_b, lse_b):
        weights = torch.softmax(torch.stack([lse_a, lse_b]), dim=0)  # stable, no nan at -inf
        lse = torch.maximum(lse_a, lse_b) + torch.log(
            torch.exp(lse_a - torch.maximum(lse_a, lse_b))
            + torch.exp(lse_b - torch.maximum(lse_a, lse_b)))
        return weights[0] * out_a + weights[1] * out_b, lse

    assert check_lse_merge(with_softmax_weights) is True


def test_lse_merge_accepts_logaddexp():
    def with_logaddexp(out_a, lse_a, out_b, lse_b):
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse

    assert check_lse_merge(with_logaddexp) is True


#: The mistakes check_lse_merge recognises, one each, with the words of its message.
RECOGNISED_MERGES = [
    pytest.param(learner_merge(weights="equal"), "averages the two outputs", id="equal"),
    pytest.param(learner_merge(weights="lse"), "log-sum-exps themselves", id="lse-weights"),
    pytest.param(learner_merge(normalise=False), "does not divide by the sum of the weights",
                 id="not-normalised"),
    pytest.param(learner_merge(weights="swapped"), "swaps the weights", id="swapped"),
    pytest.param(learner_merge(lse="max"), r"returns max\(lse_a, lse_b\)", id="lse-max"),
    pytest.param(learner_merge(lse="sum"), "adds the two log-sum-exps", id="lse-sum"),
    pytest.param(learner_merge(lse="mean"), "log of the mean", id="lse-mean"),
    pytest.param(learner_merge(stable=False), "without subtracting anything first.*"
                                              "overflows float64", id="overflow"),
    pytest.param(stabilised_by_lse_a, "shifts the exponentials by lse_a, not by the larger.*"
                                      r"seen on a first part that saw no key", id="shift-lse-a"),
    pytest.param(lambda oa, la, ob, lb: (
        (torch.exp(la - lb) * oa + ob) / (torch.exp(la - lb) + 1),
        lb + torch.log1p(torch.exp(la - lb))), "shifts the exponentials by lse_b.*seen on a "
                                               "first half of keys and a second part that saw "
                                               "no key", id="shift-lse-b"),
    pytest.param(learner_merge(stable="global"), "one maximum for the whole tensor.*seen on "
                                                 "two halves whose rows lie near",
                 id="global-max"),
    pytest.param(learner_merge(stable="min"), "by the smaller of the two log-sum-exps",
                 id="shift-min"),
]


@pytest.mark.parametrize(("wrong", "named"), [
    *RECOGNISED_MERGES,
    pytest.param(lambda oa, la, ob, lb: (
        torch.nan_to_num((torch.exp(la) * oa + torch.exp(lb) * ob) / (torch.exp(la)
                                                                      + torch.exp(lb))),
        torch.logaddexp(la, lb)), "right on ordinary log-sum-exps but not on two halves "
                                  "whose log-sum-exps are near \\+800.*nan_to_num",
                 id="nan-to-num"),
    pytest.param(lambda oa, la, ob, lb: (oa.mul_(2.0), la), "changed its argument out_a",
                 id="in-place"),
    pytest.param(lambda oa, la, ob, lb: oa, "expected a pair \\(out, lse\\)", id="not-a-pair"),
    pytest.param(lambda oa, la, ob, lb: torch.cat(book_merge(oa, la, ob, lb), dim=-1),
                 "returned torch.Tensor; expected a pair", id="one-tensor"),
    pytest.param(lambda oa, la, ob, lb: (oa, la.squeeze(-1)), "returned shape", id="lse-shape"),
    pytest.param(lambda oa, la, ob, lb: book_merge(oa * 2, la, ob, lb),
                 "differs from the right one", id="something-else"),
])
def test_lse_merge_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_lse_merge(wrong)
    # No message spells out the merge or points to the function the exercise forbids.
    assert "merge_partials" not in str(failure.value)
    assert "exp(lse_a - lse)" not in str(failure.value)
    assert "/ (w_a + w_b)" not in str(failure.value)


def test_lse_merge_names_each_recognised_mistake_apart_and_points_to_the_section():
    # Twelve mistakes, twelve messages: no two recognised mistakes get the same one, and
    # none spells out the merge's weights; each sends the learner to the section.
    messages = set()
    for param in RECOGNISED_MERGES:
        with pytest.raises(CheckFailed) as failure:
            check_lse_merge(param.values[0])
        message = str(failure.value)
        assert message.endswith("See 'The merge is the online softmax' in this chapter."), (
            param.id)
        assert "w_a * out_a" not in message and "exp(lse_b - m)" not in message, param.id
        # The mistake's words, without the answer's name before them or the probe after.
        messages.add(message.split("(out_a, lse_a, out_b, lse_b) ", 1)[1].split(" (seen on ")[0])
    assert len(RECOGNISED_MERGES) == 12
    assert len(messages) == 12


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
                 r"rank=4, step=2, world_size=6\) returned 'skip', which is not what",
                 id="one-wrong-entry"),
    pytest.param(lambda r, s: "full", "TypeError", id="wrong-signature"),
])
def test_ring_steps_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_causal_ring_steps(wrong)
    # Neither the expected kind nor the forbidden ring_schedule appears.
    assert "ring_schedule" not in str(failure.value)
    assert "so the answer is" not in str(failure.value)


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
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, r),
                                            _chunk(x, 2 * p, 2 * p - 2 - r)], dim=-2),
                 "late chunk one too early", id="late-2p-2-r"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, r), _chunk(x, 2 * p, p + r)],
                                           dim=-2), "chunk world_size \\+ rank", id="p-plus-r"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, p, r), _chunk(x, p, p - 1 - r)], dim=-2),
                 "into world_size chunks, not 2 \\* world_size", id="p-chunks"),
    pytest.param(lambda x, r, p: _chunk(x, 2 * p, r), "only the early chunk", id="early-only"),
    pytest.param(lambda x, r, p: _chunk(x, 2 * p, 2 * p - 1 - r), "only the late chunk",
                 id="late-only"),
    pytest.param(lambda x, r, p: torch.cat([_chunk(x, 2 * p, r), _chunk(x, 2 * p, 2 * p - 1 - r)],
                                           dim=-1), "along the last dimension",
                 id="cat-features"),
    pytest.param(lambda x, r, p: torch.stack([_chunk(x, 2 * p, r),
                                              _chunk(x, 2 * p, 2 * p - 1 - r)]),
                 "stacks the two chunks", id="stack"),
    pytest.param(lambda x, r, p: [_chunk(x, 2 * p, r), _chunk(x, 2 * p, 2 * p - 1 - r)],
                 "returned a list of two tensors", id="list-of-chunks"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.transpose(-2, -1), r, p),
                 "IndexError", id="wrong-dim"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.float(), r, p), "dtype torch.float32",
                 id="float32"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.sub_(0.0), r, p) + 1.0,
                 "tokens at positions", id="other-values"),
    pytest.param(lambda x, r, p: book_zigzag_shard(x.mul_(2.0), r, p),
                 "changed its argument x", id="in-place"),
])
def test_zigzag_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named) as failure:
        check_zigzag_shard(wrong)
    assert "expected [" not in str(failure.value)  # the expected positions stay unsaid


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
