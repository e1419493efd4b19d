"""attnlib.exercises.learning: check_prefix_matching_score.

The checker accepts the reference and the book's solution, and rejects each
typical wrong answer with a message that names it (one test per wrong answer).
"""

from __future__ import annotations

import pytest
import torch

from attnlib.exercises import CheckFailed, check_prefix_matching_score
from attnlib.exercises._common import is_close
from attnlib.training import prefix_matching_score


def book_prefix_matching_score(attn_weights, inputs):
    """The solution printed in chapter 10."""
    # attn_weights: (batch, num_heads, num_tokens, num_tokens)
    # inputs: (batch, num_tokens), int64 token ids
    batch, num_heads, num_tokens, _ = attn_weights.shape
    total = torch.zeros(num_heads, dtype=attn_weights.dtype, device=attn_weights.device)
    num_counted = 0
    for b in range(batch):
        for t in range(num_tokens):
            # keys right after an earlier occurrence of the current token
            targets = [s + 1 for s in range(t) if inputs[b, s] == inputs[b, t]]
            if targets:
                total += attn_weights[b, :, t, targets].sum(dim=-1)  # (num_heads,)
                num_counted += 1
    return total / num_counted


def scored(attn_weights, inputs, *, key_shift=1, strict=True, last_only=False,
           first_only=False, later_too=False, reduce="sum", average="counted",
           transpose=False):
    """A loop version with one switch per typical mistake (written independently
    of the checker's own vectorised wrong answers)."""
    if transpose:
        attn_weights = attn_weights.transpose(-1, -2)
    batch, num_heads, num_tokens, _ = attn_weights.shape
    per_row, counts = [], []
    for b in range(batch):
        row_total = torch.zeros(num_heads, dtype=attn_weights.dtype)
        count = 0
        for t in range(num_tokens):
            candidates = range(num_tokens) if later_too else range(t if strict else t + 1)
            earlier = [s for s in candidates
                       if inputs[b, s] == inputs[b, t] and not (later_too and s == t)]
            if last_only:
                earlier = earlier[-1:]
            if first_only:
                earlier = earlier[:1]
            keys = [s + key_shift for s in earlier if s + key_shift < num_tokens]
            if keys:
                on_keys = attn_weights[b, :, t, keys]  # (num_heads, len(keys))
                if reduce == "max":
                    row_total += on_keys.max(dim=-1).values
                elif reduce == "mean":
                    row_total += on_keys.mean(dim=-1)
                else:
                    row_total += on_keys.sum(dim=-1)
                count += 1
        per_row.append(row_total)
        counts.append(count)
    total = torch.stack(per_row).sum(0)
    if average == "sum":
        return total
    if average == "all":
        return total / (batch * num_tokens)
    if average == "rows":
        return torch.stack([r / max(c, 1) for r, c in zip(per_row, counts, strict=True)]).mean(0)
    return total / sum(counts)


def test_accepts_the_reference(capsys):
    assert check_prefix_matching_score(prefix_matching_score) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_accepts_the_book_solution():
    assert check_prefix_matching_score(book_prefix_matching_score) is True


def test_the_loop_helper_without_mistakes_is_right():
    assert check_prefix_matching_score(scored) is True


#: Every wrong answer the checker recognises, with the words of its message.
RECOGNISED_WRONG_ANSWERS = [
    pytest.param(lambda w, x: scored(w, x, key_shift=0), "EARLIER OCCURRENCE itself",
                 id="duplicate-token-key"),
    pytest.param(lambda w, x: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)),
                 "previous-token score", id="previous-token"),
    pytest.param(lambda w, x: scored(w, x, average="all"), "averaged over EVERY query",
                 id="all-queries"),
    pytest.param(lambda w, x: scored(w, x, average="sum"), "divided by nothing",
                 id="sum-not-mean"),
    pytest.param(lambda w, x: scored(w, x, average="rows"), "averaged each sequence first",
                 id="per-row-mean"),
    pytest.param(lambda w, x: scored(w, x, last_only=True), "MOST RECENT earlier occurrence",
                 id="most-recent-only"),
    pytest.param(lambda w, x: scored(w, x, first_only=True), "FIRST earlier occurrence",
                 id="first-only"),
    pytest.param(lambda w, x: scored(w, x, reduce="max"), "LARGEST weight among",
                 id="max-over-targets"),
    pytest.param(lambda w, x: scored(w, x, reduce="mean"), "AVERAGED the weights on",
                 id="mean-over-targets"),
    pytest.param(lambda w, x: scored(w, x, strict=False), "its own earlier occurrence",
                 id="s-le-t"),
    pytest.param(lambda w, x: scored(w, x, later_too=True), "also matched LATER",
                 id="later-occurrences"),
    pytest.param(lambda w, x: scored(w, x, transpose=True), "rows and columns are swapped",
                 id="transposed"),
]


@pytest.mark.parametrize(("wrong", "named"), RECOGNISED_WRONG_ANSWERS)
def test_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_prefix_matching_score(wrong)


def probes_of_the_checker():
    """The (attn_weights, inputs) pairs the checker passes to an answer, recorded by a
    right answer through the checker's public call."""
    seen = []

    def recording(attn_weights, inputs):
        seen.append((attn_weights.clone(), inputs.clone()))
        return prefix_matching_score(attn_weights, inputs)

    assert check_prefix_matching_score(recording) is True
    return seen


def test_wrong_answers_are_told_apart_by_the_probes():
    """On the probes the checker uses, no two recognised wrong answers agree on every
    probe, and none agrees with the right score, so each message can only be the one
    that fits (a wrong answer's test above then checks that it gets that message)."""
    probes = probes_of_the_checker()
    assert len(probes) == 2
    right = [prefix_matching_score(w, x) for w, x in probes]
    answers = {param.id: [param.values[0](w, x) for w, x in probes]
               for param in RECOGNISED_WRONG_ANSWERS}
    names = list(answers)
    for i, first in enumerate(names):
        assert not all(is_close(a, r) for a, r in zip(answers[first], right, strict=True)), first
        for second in names[i + 1:]:
            assert not all(is_close(a, b) for a, b in zip(answers[first], answers[second],
                                                          strict=True)), (first, second)


def test_first_only_and_largest_weight_agree_on_one_probe_and_are_still_told_apart():
    # On the first probe both pick key 1 for query 6 of row 0; the second probe
    # separates them, so each gets its own message.
    (w1, x1), _ = probes_of_the_checker()
    torch.testing.assert_close(scored(w1, x1, first_only=True), scored(w1, x1, reduce="max"))
    with pytest.raises(CheckFailed, match="FIRST earlier occurrence"):
        check_prefix_matching_score(lambda w, x: scored(w, x, first_only=True))
    with pytest.raises(CheckFailed, match="LARGEST weight"):
        check_prefix_matching_score(lambda w, x: scored(w, x, reduce="max"))


def test_one_number_instead_of_one_per_head():
    with pytest.raises(CheckFailed, match=r"returned one number; expected one score per head"):
        check_prefix_matching_score(lambda w, x: prefix_matching_score(w, x).mean())


def test_an_unrecognised_wrong_answer_gets_the_numbers():
    with pytest.raises(CheckFailed, match="but the prefix-matching scores are"):
        check_prefix_matching_score(lambda w, x: prefix_matching_score(w, x) + 0.01)


def test_sizes_written_into_the_answer_fail_on_the_second_probe():
    def two_heads_only(w, x):
        return prefix_matching_score(w, x)[:2]

    with pytest.raises(CheckFailed, match=r"returned shape \(2,\); expected \(3,\)"):
        check_prefix_matching_score(two_heads_only)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ("prefix_matching_score", "expected your function fn"),
        (lambda w, x: "0.5", "returned str"),
        (lambda w, x: torch.zeros(2, dtype=torch.long), "expected a floating-point score"),
        (lambda w, x: (prefix_matching_score(w, x), 1), "returned a tuple of 2"),
    ],
)
def test_nonsense_gets_a_clear_message(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_prefix_matching_score(answer)


def test_the_stub_says_to_replace_it():
    def stub(attn_weights, inputs):
        raise NotImplementedError("compute the prefix-matching score")

    with pytest.raises(CheckFailed, match="raised NotImplementedError"):
        check_prefix_matching_score(stub)


def test_does_not_change_the_global_random_state():
    state = torch.get_rng_state()

    def draws(w, x):
        torch.rand(3)  # a learner's function that uses the global generator
        return prefix_matching_score(w, x)

    check_prefix_matching_score(draws)
    with pytest.raises(CheckFailed):
        check_prefix_matching_score(lambda w, x: scored(w, x, key_shift=0))
    assert torch.equal(torch.get_rng_state(), state)


def test_the_learners_tensors_cannot_change_the_probe():
    def mutating(w, x):
        score = prefix_matching_score(w, x)
        w.zero_()
        return score

    assert check_prefix_matching_score(mutating) is True


def test_device_argument():
    with pytest.raises(TypeError, match="device must be"):
        check_prefix_matching_score(prefix_matching_score, device=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda():
    assert check_prefix_matching_score(book_prefix_matching_score, device="cuda") is True
