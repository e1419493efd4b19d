"""attnlib.exercises.efficient: check_online_softmax and check_flash_attention.

Each checker accepts the reference and the book's solution, and rejects each
typical wrong answer with a message that names it (one test per wrong answer);
the global random state is unchanged after every check.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnlib
from attnlib.exercises import CheckFailed, check_flash_attention, check_online_softmax

# ---------------------------------------------------------------------------
# check_online_softmax
# ---------------------------------------------------------------------------


def book_online_softmax(x):
    """The solution printed in chapter 8."""
    running_max = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for j in range(x.shape[-1]):
        new_max = torch.maximum(running_max, x[..., j])
        rescale = torch.exp(running_max - new_max)  # 1 if the max did not grow
        running_sum = running_sum * rescale + torch.exp(x[..., j] - new_max)
        running_max = new_max
    return torch.exp(x - running_max.unsqueeze(-1)) / running_sum.unsqueeze(-1)


def learner_online_softmax(initial_max=-math.inf, max_first=False, clamp=None,
                           rescale="right", final_max=True):
    """A learner's one-pass softmax, right or with one slip. ``clamp``: divide by
    ``running_sum.clamp(min=clamp)``, a guard against 0 / 0 some learners add.
    ``rescale``: the factor of the running sum when the maximum grows, "right"
    exp(m_old - m_new), "none" 1, "inverted" exp(m_new - m_old). ``final_max=False``:
    each numerator uses the maximum known when its entry was read."""
    def my_online_softmax(x):
        running_max = torch.full(x.shape[:-1], initial_max, dtype=x.dtype)
        running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype)
        max_when_read = torch.empty_like(x)
        for j in range(x.shape[-1]):
            if max_first:  # the maximum is updated before the factor is computed
                running_max = torch.maximum(running_max, x[..., j])
                new_max = running_max
            else:
                new_max = torch.maximum(running_max, x[..., j])
            if rescale == "none":
                factor = torch.ones_like(new_max)
            elif rescale == "inverted":  # exp(m_new - -inf) = inf at j = 0, times a sum of 0
                factor = torch.exp(new_max - running_max).nan_to_num(posinf=0.0)
            else:
                factor = torch.exp(running_max - new_max)
            running_sum = running_sum * factor + torch.exp(x[..., j] - new_max)
            running_max = new_max
            max_when_read[..., j] = new_max
        if clamp is not None:
            running_sum = running_sum.clamp(min=clamp)
        shift = running_max.unsqueeze(-1) if final_max else max_when_read
        return torch.exp(x - shift) / running_sum.unsqueeze(-1)
    return my_online_softmax


def test_online_softmax_accepts_the_book_solution(capsys):
    assert check_online_softmax(book_online_softmax) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_online_softmax_accepts_the_references():
    assert check_online_softmax(lambda x: torch.softmax(x, dim=-1)) is True
    assert check_online_softmax(attnlib.softmax) is True
    assert check_online_softmax(learner_online_softmax()) is True


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(learner_online_softmax(rescale="none"),
                     "forgets to rescale the running sum", id="no-rescale"),
        pytest.param(learner_online_softmax(rescale="inverted"),
                     "inverse of the right factor", id="inverted-rescale"),
        pytest.param(learner_online_softmax(final_max=False),
                     "FINAL maximum", id="max-when-read"),
        pytest.param(lambda x: torch.softmax(x, dim=0), "wrong dimension", id="wrong-dim"),
        pytest.param(lambda x: torch.exp(x - x.amax(-1, keepdim=True)),
                     "without dividing by the running sum", id="not-normalised"),
        pytest.param(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
                     "exp overflows", id="overflow"),
        pytest.param(lambda x: x.sub_(x.amax(-1, keepdim=True)).exp_().div_(
            x.sum(-1, keepdim=True)), "changed x in place", id="in-place"),
        pytest.param(lambda x: torch.softmax(x, -1).float(), "dtype torch.float32",
                     id="wrong-dtype"),
        pytest.param(lambda x: torch.softmax(x, -1)[..., :-1], "returned shape", id="wrong-shape"),
        pytest.param(lambda x: torch.softmax(x / 2, -1), "differs from torch.softmax",
                     id="something-else"),
        pytest.param(learner_online_softmax(initial_max=0.0),
                     "starts the running maximum at 0 instead of -inf", id="max-starts-at-0"),
        pytest.param(learner_online_softmax(max_first=True),
                     "forgets to rescale.*updating the running maximum BEFORE",
                     id="max-updated-first"),
        pytest.param(learner_online_softmax(initial_max=0.0, clamp=1e-12),
                     "starts the running maximum at 0 instead of -inf, and clamps the sum",
                     id="max-starts-at-0-sum-clamped"),
        pytest.param(learner_online_softmax(initial_max=0.0,
                                            clamp=torch.finfo(torch.float64).eps),
                     "starts the running maximum at 0 instead of -inf, and clamps the sum",
                     id="max-starts-at-0-sum-clamped-eps"),
    ],
)
def test_online_softmax_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_online_softmax(wrong)


def test_online_softmax_accepts_harmless_variations():
    # A running sum started at 1 is multiplied by exp(-inf - m) = 0 at the first entry;
    # a running maximum started at -1e9 is overtaken by every probe's first entry.
    def sum_starts_at_one(x):
        running_max = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)
        running_sum = torch.ones(x.shape[:-1], dtype=x.dtype)
        for j in range(x.shape[-1]):
            new_max = torch.maximum(running_max, x[..., j])
            running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(
                x[..., j] - new_max)
            running_max = new_max
        return torch.exp(x - running_max.unsqueeze(-1)) / running_sum.unsqueeze(-1)

    assert check_online_softmax(sum_starts_at_one) is True
    assert check_online_softmax(learner_online_softmax(initial_max=-1e9)) is True


def test_online_softmax_nonsense_and_stub():
    with pytest.raises(CheckFailed, match="expected a one-pass softmax function"):
        check_online_softmax("softmax")

    def stub(x):
        raise NotImplementedError("write your online softmax here")

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_online_softmax(stub)
    with pytest.raises(CheckFailed, match="returned list"):
        check_online_softmax(lambda x: x.tolist())


# ---------------------------------------------------------------------------
# check_flash_attention
# ---------------------------------------------------------------------------


def book_tiled_attention(query, key, value, is_causal=False, block_size=4):
    """The solution printed in chapter 8 (queries all at once, keys in tiles)."""
    *lead, num_tokens_q, d_k = query.shape
    opts = {"dtype": query.dtype, "device": query.device}
    row_max = torch.full((*lead, num_tokens_q, 1), -math.inf, **opts)
    row_sum = torch.zeros((*lead, num_tokens_q, 1), **opts)
    acc = torch.zeros((*lead, num_tokens_q, value.shape[-1]), **opts)
    rows = torch.arange(num_tokens_q, device=query.device).unsqueeze(-1)  # (N_q, 1)
    for start in range(0, key.shape[-2], block_size):
        k_block = key[..., start:start + block_size, :]  # (..., Bk, d_k)
        v_block = value[..., start:start + block_size, :]  # (..., Bk, d_v)
        scores = query @ k_block.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, Bk)
        if is_causal:
            cols = torch.arange(start, start + k_block.shape[-2], device=query.device)
            scores = scores.masked_fill(cols > rows, -math.inf)
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        probs = torch.exp(scores - new_max)
        rescale = torch.exp(row_max - new_max)
        row_sum = row_sum * rescale + probs.sum(dim=-1, keepdim=True)
        acc = acc * rescale + probs @ v_block
        row_max = new_max
    return acc / row_sum


def learner_tiled(initial_max=-math.inf, hide="future", divide=True, max_first=False,
                  guard=False, fill=-math.inf, rescale_acc=True, rescale_sum=True, scale=None):
    """A learner's tiled attention written independently of the checker, right or with one slip.

    ``hide`` (with is_causal): "future" hides j > i (right); "diagonal-too" j >= i;
    "past" j <= i (the may-attend mask used as the hide mask); "past-strict" j < i;
    "tile-local" compares the key's index inside its tile with i; "bottom-right" hides
    j > i + num_tokens_kv - num_tokens_q. ``guard``: a row
    whose running maximum is still -inf subtracts 0 instead (no nan from -inf - -inf).
    ``fill``: the score a hidden key gets (a finite -1e9 in many kernels).
    ``rescale_acc``/``rescale_sum=False``: the running output/sum is not multiplied by
    exp(m_old - m_new). ``scale``: the scores' factor (default 1/sqrt(d_k)).
    """
    def my_tiled_attention(query, key, value, is_causal=False, block_size=4):
        *lead, num_tokens_q, d_k = query.shape
        row_max = torch.full((*lead, num_tokens_q, 1), initial_max, dtype=query.dtype)
        row_sum = torch.zeros((*lead, num_tokens_q, 1), dtype=query.dtype)
        acc = torch.zeros((*lead, num_tokens_q, value.shape[-1]), dtype=query.dtype)
        i = torch.arange(num_tokens_q).unsqueeze(-1)
        factor = 1 / math.sqrt(d_k) if scale is None else scale
        for start in range(0, key.shape[-2], block_size):
            k_block = key[..., start:start + block_size, :]
            v_block = value[..., start:start + block_size, :]
            scores = query @ k_block.transpose(-2, -1) * factor
            if is_causal:
                j = torch.arange(start, start + k_block.shape[-2])
                hidden = {"future": j > i, "diagonal-too": j >= i, "past": j <= i,
                          "past-strict": j < i,
                          "bottom-right": j > i + key.shape[-2] - num_tokens_q,
                          "tile-local": torch.arange(k_block.shape[-2]) > i}[hide]
                scores = scores.masked_fill(hidden, fill)
            if max_first:
                row_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            shift = new_max.nan_to_num(neginf=0.0) if guard else new_max
            probs = torch.exp(scores - shift)
            rescale = torch.exp(row_max - shift)
            row_sum = row_sum * (rescale if rescale_sum else 1) + probs.sum(dim=-1, keepdim=True)
            acc = acc * (rescale if rescale_acc else 1) + probs @ v_block
            row_max = new_max
        if not divide:
            return acc
        return acc / row_sum.clamp_min(1e-300) if guard else acc / row_sum
    return my_tiled_attention


#: A right tiled attention (the learner's loop without a slip).
RIGHT_TILED = learner_tiled()


def per_tile_softmax(query, key, value, is_causal=False, block_size=4):
    """The misconception: a softmax per tile of keys, the tiles' results added."""
    out = 0
    i = torch.arange(query.shape[-2]).unsqueeze(-1)
    for start in range(0, key.shape[-2], block_size):
        k_block = key[..., start:start + block_size, :]
        scores = query @ k_block.transpose(-2, -1) / math.sqrt(query.shape[-1])
        if is_causal:
            j = torch.arange(start, start + k_block.shape[-2])
            scores = scores.masked_fill(j > i, -math.inf)
        out = out + torch.softmax(scores, -1).nan_to_num() @ value[..., start:start + block_size, :]
    return out


def test_flash_accepts_the_book_solution(capsys):
    assert check_flash_attention(book_tiled_attention) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_flash_accepts_attnlib_and_torch():
    assert check_flash_attention(attnlib.functional.flash_attention) is True
    assert check_flash_attention(
        lambda q, k, v, is_causal, block_size: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal)) is True


def _no_max(query, key, value, is_causal=False, block_size=4):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if is_causal:
        scores = scores.masked_fill(
            torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    weights = torch.exp(scores)
    return weights / weights.sum(-1, keepdim=True) @ value


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(learner_tiled(rescale_acc=False), "rescale the running OUTPUT",
                     id="no-acc-rescale"),
        pytest.param(learner_tiled(rescale_sum=False), "rescale the running SUM",
                     id="no-sum-rescale"),
        pytest.param(learner_tiled(rescale_acc=False, rescale_sum=False), "rescales neither",
                     id="no-rescale"),
        pytest.param(learner_tiled(scale=1.0), "does not scale the scores", id="no-scale"),
        pytest.param(learner_tiled(scale=0.5), r"1/sqrt\(d_v\)", id="sqrt-d_v"),
        pytest.param(lambda q, k, v, is_causal, block_size: RIGHT_TILED(q, k, v, False,
                                                                        block_size),
                     "ignores is_causal=True", id="causal-ignored"),
        pytest.param(learner_tiled(hide="bottom-right"), "bottom-right", id="bottom-right"),
        pytest.param(_no_max, "overflows", id="overflow"),
        pytest.param(lambda q, k, v, is_causal, block_size: RIGHT_TILED(
            q.mul_(1.0), k.add_(0.0).mul_(1.0000001), v, is_causal, block_size),
            "changed key in place", id="in-place"),
        pytest.param(lambda q, k, v, is_causal, block_size: RIGHT_TILED(
            q, k, v, is_causal, block_size).transpose(-2, -1), "returned shape",
            id="wrong-shape"),
        pytest.param(lambda q, k, v, is_causal, block_size: (
            RIGHT_TILED(q, k, v, is_causal, block_size), None), "tuple", id="tuple"),
        pytest.param(lambda q, k, v, is_causal, block_size: RIGHT_TILED(
            q, k, v, is_causal, block_size) * 1.01, "differs from softmax", id="something-else"),
        pytest.param(learner_tiled(initial_max=0.0), "starts the running maximum at 0",
                     id="max-starts-at-0"),
        pytest.param(learner_tiled(initial_max=0.0, guard=True),
                     "starts the running maximum at 0", id="max-starts-at-0-guarded"),
        pytest.param(learner_tiled(max_first=True),
                     "rescales neither.*updating the running maximum BEFORE",
                     id="max-updated-first"),
        pytest.param(learner_tiled(divide=False), "without dividing it by the running sum",
                     id="no-final-division"),
        pytest.param(per_tile_softmax, "softmax of each tile on its own", id="per-tile-softmax"),
        pytest.param(learner_tiled(hide="diagonal-too"), "hides the diagonal too",
                     id="diagonal-hidden"),
        pytest.param(learner_tiled(hide="diagonal-too", guard=True), "hides the diagonal too",
                     id="diagonal-hidden-guarded"),
        pytest.param(learner_tiled(hide="past"), r"flips the causal mask: it hides the keys j <= i",
                     id="mask-flipped"),
        pytest.param(learner_tiled(hide="past", guard=True),
                     r"flips the causal mask: it hides the keys j <= i", id="mask-flipped-guarded"),
        pytest.param(learner_tiled(hide="past-strict"),
                     r"flips the causal mask: it hides the keys j < i", id="mask-flipped-strict"),
        pytest.param(learner_tiled(hide="tile-local"), "index INSIDE the tile",
                     id="mask-from-tile-index"),
        pytest.param(learner_tiled(hide="diagonal-too", fill=-1e9),
                     "hides the diagonal too.*finite score", id="diagonal-hidden-fill-1e9"),
        pytest.param(learner_tiled(hide="diagonal-too", fill=-torch.finfo(torch.float64).max),
                     "hides the diagonal too.*finite score", id="diagonal-hidden-fill-finfo-max"),
        pytest.param(learner_tiled(hide="past", fill=-1e9),
                     r"flips the causal mask: it hides the keys j <= i", id="mask-flipped-fill-1e9"),
    ],
)
def test_flash_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_flash_attention(wrong)


def test_flash_accepts_a_learners_right_loop_with_or_without_guards():
    assert check_flash_attention(learner_tiled()) is True
    assert check_flash_attention(learner_tiled(guard=True)) is True


@pytest.mark.parametrize("fill", [-1e9, -torch.finfo(torch.float64).max])
def test_flash_accepts_a_right_mask_with_a_finite_fill(fill):
    # Every query of the probes sees key 0, so a finite fill changes nothing there.
    assert check_flash_attention(learner_tiled(fill=fill)) is True


def test_flash_nonsense_and_stub():
    with pytest.raises(CheckFailed, match="expected a tiled attention function"):
        check_flash_attention(42)

    def stub(query, key, value, is_causal=False, block_size=4):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_flash_attention(stub)

    def no_block_size(query, key, value, is_causal=False):
        return RIGHT_TILED(query, key, value, is_causal, 4)

    with pytest.raises(CheckFailed, match="unexpected keyword argument 'block_size'"):
        check_flash_attention(no_block_size)


# ---------------------------------------------------------------------------
# both
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("check, answer", [
    (check_online_softmax, book_online_softmax),
    (check_online_softmax, lambda x: torch.softmax(x + 0.5 * torch.rand_like(x), -1)),
    (check_flash_attention, book_tiled_attention),
    (check_flash_attention, lambda q, k, v, is_causal, block_size: torch.nn.functional.
     scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=is_causal)),
])
def test_the_global_random_state_is_unchanged(check, answer):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    try:
        check(answer)
    except CheckFailed:
        pass  # the answers that draw random numbers fail; the state must still be kept
    assert torch.equal(torch.get_rng_state(), before)


def test_device_argument_is_validated():
    with pytest.raises(TypeError, match="device must be"):
        check_online_softmax(book_online_softmax, device=3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            check_flash_attention(book_tiled_attention, device="cuda")
