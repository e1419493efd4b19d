"""attnlib.exercises.kernel_tiles: check_block_size, check_causal_stages and check_kv_pair.

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
from attnlib.exercises import CheckFailed, check_block_size, check_causal_stages, check_kv_pair

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


# --- check_block_size --------------------------------------------------------------------


def book_largest_block(head_dim, element_size, num_stages, shared_memory_bytes):
    """The solution printed in chapter 11."""
    best = None
    for block in (16, 32, 64, 128, 256):
        tile_bytes = element_size * head_dim * (block + 2 * num_stages * block)
        if tile_bytes <= shared_memory_bytes:
            best = block
    return best


def learner_block(q=1, kv=2, stages=True, bits=False, strict=False, power_of_two=True):
    """A learner's answer written independently of the checker, right or with one slip."""
    def largest_block(head_dim, element_size, num_stages, shared_memory_bytes):
        limit = shared_memory_bytes
        q_tiles = num_stages if q == "per-stage" else q
        tiles = q_tiles + kv * (num_stages if stages else 1)
        width = element_size * head_dim * tiles  # bytes per row of the block
        if not power_of_two:
            block = limit // width
            if strict and block * width == limit:
                block -= 1
            return block or None
        best = None
        block = 16
        while block <= 256:
            needed = block * width * (8 if bits else 1)
            if (needed < limit) if strict else (needed <= limit):
                best = block
            block *= 2
        return best
    return largest_block


def test_block_size_accepts_the_book_solution(capsys):
    assert check_block_size(book_largest_block) is True
    assert capsys.readouterr().out.startswith("Correct: book_largest_block picks")
    assert check_block_size(learner_block()) is True


def block_probes():
    """The (head_dim, element_size, num_stages, shared_memory_bytes) check_block_size
    asks about, recorded by the book's solution through the checker's public call."""
    probes = []

    def recording(*probe):
        probes.append(probe)
        return book_largest_block(*probe)

    assert check_block_size(recording) is True
    return probes


def test_block_size_probes_match_the_compiler_numbers_in_the_chapter():
    # head_dim 128, bfloat16, 3 stages: 128 x 128 tiles take 229376 bytes (the compiler's
    # figure for the forward kernel on sm_90), within the 232448 bytes a program may use.
    probes = block_probes()
    assert (128, 2, 3, 232448) in probes and (128, 2, 3, 229376) in probes
    assert book_largest_block(128, 2, 3, 232448) == 128
    assert book_largest_block(128, 2, 4, 232448) == 64
    assert book_largest_block(128, 2, 3, 229375) == 64

    # The checker expects 128 there too: an answer wrong at that probe alone is refused.
    def one_step_short(*probe):
        return 64 if probe == (128, 2, 3, 232448) else book_largest_block(*probe)

    with pytest.raises(CheckFailed, match=r"\(head_dim=128, element_size=2, num_stages=3, "
                                          r"shared_memory_bytes=232448\) returned 64, but a "
                                          "larger block still fits"):
        check_block_size(one_step_short)


#: The mistakes check_block_size recognises, one learner's answer each.
RECOGNISED_BLOCK_MISTAKES = [
    pytest.param(learner_block(stages=False), "counts one K tile and one V tile",
                 id="no-stages"),
    pytest.param(learner_block(kv=1), "counts the K tiles but not the V tiles", id="no-v"),
    pytest.param(learner_block(q=0), "leaves out the Q tile", id="no-q"),
    pytest.param(learner_block(q="per-stage"), "multiplies the Q tile by num_stages",
                 id="q-per-stage"),
    pytest.param(learner_block(bits=True), "counts bits, not bytes", id="bits"),
    pytest.param(learner_block(strict=True), "fill shared memory exactly.*equality included",
                 id="strict"),
    pytest.param(learner_block(power_of_two=False), "not a power of two",
                 id="not-a-power-of-two"),
]


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        *RECOGNISED_BLOCK_MISTAKES,
        pytest.param(lambda d, e, s, limit: 64, r"returned 64, but a larger block still "
                                                r"fits there; the answers match none",
                     id="constant"),
        pytest.param(lambda d, e, s, limit: 256, r"num_stages=3, shared_memory_bytes=232448\) "
                                                 r"returned 256, but the tiles of that block do "
                                                 r"not fit", id="too-large"),
        pytest.param(lambda d, e, s, limit: None, r"returned None, but a block among",
                     id="always-none"),
        pytest.param(lambda d, e, s, limit: 64.0, "returned float 64.0; expected an integer",
                     id="float"),
        pytest.param(lambda d, e, s, limit: "64", "returned str '64'; expected an integer",
                     id="string"),
        pytest.param(lambda d, e, s, limit: True, "returned bool True", id="bool"),
        pytest.param(lambda d, e, s, limit: np.True_, "returned numpy.bool", id="numpy-bool"),
        pytest.param(lambda d, e, s, limit: torch.tensor(64.0), "returned torch.Tensor",
                     id="float-tensor"),
        pytest.param(lambda d, e, s, limit: e * d * 7 * 64, "returned 57344, which is not one "
                                                            "of the blocks", id="bytes-not-block"),
    ],
)
def test_block_size_names_each_wrong_answer(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_block_size(answer)


def test_block_size_accepts_an_integer_tensor():
    assert check_block_size(lambda *probe: (None if (b := book_largest_block(*probe)) is None
                                            else torch.tensor(b))) is True


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint16, int],
                         ids=["numpy-int64", "numpy-int32", "numpy-uint16", "int"])
def test_block_size_accepts_any_integer_type(integer):
    # A learner who picks the block with NumPy (np.array(blocks)[fits].max()) returns a
    # numpy.int64: an integer, as the exercise asks.
    def numpy_block(head_dim, element_size, num_stages, shared_memory_bytes):
        blocks = np.array([16, 32, 64, 128, 256])
        fits = element_size * head_dim * blocks * (1 + 2 * num_stages) <= shared_memory_bytes
        return integer(blocks[fits].max()) if fits.any() else None

    assert check_block_size(numpy_block) is True


def test_block_size_messages_give_away_neither_the_block_nor_the_count():
    # The fallback says too large or too small, and each named mistake points to the
    # chapter's count, without the count's formula or the expected block.
    messages = []
    for answer in [param.values[0] for param in RECOGNISED_BLOCK_MISTAKES] + [
            lambda d, e, s, limit: 64]:
        with pytest.raises(CheckFailed) as failure:
            check_block_size(answer)
        messages.append(str(failure.value))
    assert len(set(messages)) == len(messages)
    for message in messages:
        assert "2 * num_stages" not in message and "(B +" not in message
        assert "largest block that fits is" not in message
    assert all("Block sizes, warps and stages" in m for m in messages[:4])


def test_block_size_nonsense_and_stub():
    with pytest.raises(CheckFailed, match="a function, but got int"):
        check_block_size(64)

    def stub(head_dim, element_size, num_stages, shared_memory_bytes):
        raise NotImplementedError("count the bytes")

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_block_size(stub)


def test_block_size_probes_keep_every_mistake_apart():
    # Each message names one mistake: on the probes, no two mistakes give the same answers,
    # and none gives the right one.
    probes = block_probes()
    expected = tuple(book_largest_block(*probe) for probe in probes)
    answers = [tuple(param.values[0](*probe) for probe in probes)
               for param in RECOGNISED_BLOCK_MISTAKES]
    assert len(set(answers)) == len(answers) and expected not in answers


def test_block_size_leaves_the_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert check_block_size(book_largest_block) is True
    with pytest.raises(CheckFailed):
        check_block_size(learner_block(bits=True))
    torch.testing.assert_close(torch.rand(3), expected)
