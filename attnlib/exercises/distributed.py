"""Checkers for chapter 12's exercises: ring attention across devices.

* :func:`check_lse_merge` - ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the
  attention over two disjoint sets of keys from each set's result and log-sum-exp.
* :func:`check_causal_ring_steps` - ``fn(rank, step, world_size) -> str``: what a rank
  does with the block it holds at a step of the ring, under a causal mask, with the
  contiguous layout: ``"diagonal"``, ``"full"`` or ``"skip"``.
* :func:`check_zigzag_shard` - ``fn(x, rank, world_size) -> tensor``: a rank's zigzag
  shard of a sequence, chunks ``rank`` and ``2 * world_size - 1 - rank`` of ``2 *
  world_size``.

Each computes the typical wrong answers and compares, so that the message can name
the mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .._validation import type_name
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    max_difference,
    passed,
    require_callable,
    require_tensor,
    require_unchanged,
)

__all__ = ["check_lse_merge", "check_causal_ring_steps", "check_zigzag_shard"]

_DTYPE = torch.float64


# ---------------------------------------------------------------------------------------
# the log-sum-exp merge


def _merge_wrong_answers(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                         lse_b: torch.Tensor
                         ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """(message, (wrong out, wrong lse or None)); None: the lse is not what is wrong."""
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    right_out = (w_a * out_a + w_b * out_b) / (w_a + w_b)
    return {
        "averages the two outputs with equal weights: each part must count in proportion to "
        "its softmax denominator, exp(lse), so weight out_a by exp(lse_a - lse) and out_b by "
        "exp(lse_b - lse)": ((out_a + out_b) / 2, None),
        "weights the outputs by the log-sum-exps themselves: the weights are exp(lse_a) and "
        "exp(lse_b), computed as exp(lse_a - m) and exp(lse_b - m) with m their maximum":
            ((lse_a * out_a + lse_b * out_b) / (lse_a + lse_b), None),
        "does not divide by the sum of the weights: with w_a = exp(lse_a - m) and w_b = "
        "exp(lse_b - m), the output is (w_a * out_a + w_b * out_b) / (w_a + w_b), because "
        "each part's output is already normalised by its own denominator":
            (w_a * out_a + w_b * out_b, None),
        "swaps the weights: out_a goes with exp(lse_a - lse), out_b with exp(lse_b - lse)":
            ((w_b * out_a + w_a * out_b) / (w_a + w_b), None),
        "returns max(lse_a, lse_b) as the merged log-sum-exp: it is log(e^lse_a + e^lse_b) "
        "= m + log(w_a + w_b), larger than the maximum": (right_out, m),
        "adds the two log-sum-exps: the denominators add, so it is log(e^lse_a + e^lse_b), "
        "not lse_a + lse_b (that would multiply them)": (right_out, lse_a + lse_b),
        "returns the log of the mean of the denominators, log((e^lse_a + e^lse_b) / 2): "
        "the merged denominator is their sum": (right_out, m + torch.log((w_a + w_b) / 2)),
    }


def _check_pair(result: object, what: str, shapes: tuple[tuple, tuple]) -> tuple:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"{what} returned {type_name(result)}; expected a tuple (out, lse)")
    out = require_tensor(result[0], f"{what}[0], the merged output", shapes[0], dtype=_DTYPE)
    lse = require_tensor(result[1], f"{what}[1], the merged log-sum-exp", shapes[1],
                         dtype=_DTYPE)
    return out, lse


@checker
def check_lse_merge(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check a learner's merge ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

    ``out_a`` ``(..., n, d_v)`` is attention over one set of keys and ``lse_a``
    ``(..., n, 1)`` the log of each row's softmax denominator; likewise ``out_b``,
    ``lse_b`` for a disjoint set. ``fn`` must return the attention over both sets and its
    log-sum-exp: ``lse = log(e^lse_a + e^lse_b)``, ``out = e^(lse_a - lse) out_a +
    e^(lse_b - lse) out_b``. The probes are float64: the results of real attention over
    two halves of the keys (shapes ``(2, 3, 5, 4)`` and ``(2, 3, 5, 1)``), the same with
    log-sum-exps near +800 and -800 (``exp`` overflows float64 above about 709), and a
    part that saw no key (``lse = -inf``, output 0), which must get weight 0.

    Recognised mistakes: equal weights; the log-sum-exps as weights; no division by the
    sum of the weights; swapped weights; the maximum, the sum or the log of the mean as
    the merged log-sum-exp; overflow (``exp(lse)`` without subtracting the maximum); nan
    where a part saw no key; changing an input in place.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other than a
            pair of tensors of the right shapes and dtype, or computes something else.

    Source: Milakov and Gimelshein (2018), Algorithm 3; Liu et al. (2023), "Ring Attention
    with Blockwise Transformers", section 3.
    """
    require_callable(fn, "a merge function fn(out_a, lse_a, out_b, lse_b)")
    name = answer_name(fn, "fn")
    gen = torch.Generator().manual_seed(2310)

    def halves(shift_a: float, shift_b: float) -> tuple[torch.Tensor, ...]:
        query = torch.randn(2, 3, 5, 6, generator=gen, dtype=_DTYPE)
        parts = []
        for shift in (shift_a, shift_b):
            key = torch.randn(2, 3, 4, 6, generator=gen, dtype=_DTYPE)
            value = torch.randn(2, 3, 4, 4, generator=gen, dtype=_DTYPE)
            scores = query @ key.transpose(-2, -1) / math.sqrt(6) + shift
            parts += [torch.softmax(scores, dim=-1) @ value,
                      torch.logsumexp(scores, dim=-1, keepdim=True)]
        return tuple(parts)

    empty = halves(0.0, 0.0)
    empty = (empty[0], empty[1], torch.zeros_like(empty[2]),
             torch.full_like(empty[3], -math.inf))
    probes = [
        (halves(0.0, 1.5), "the results of attention over two halves of the keys"),
        (halves(800.0, 795.0), "two halves whose log-sum-exps are near +800"),
        (halves(-800.0, -803.0), "two halves whose log-sum-exps are near -800"),
        (empty, "a first half of keys and a second part that saw no key (lse_b = -inf, "
                "out_b = 0)"),
    ]
    for args, probe in probes:
        saved = [t.clone() for t in args]
        what = f"{name}(out_a, lse_a, out_b, lse_b)"
        result = call_answer(fn, *args, what=what)
        require_unchanged(what, saved, args, ["out_a", "lse_a", "out_b", "lse_b"])
        out, lse = _check_pair(result, what, (tuple(args[0].shape), tuple(args[1].shape)))
        out_a, lse_a, out_b, lse_b = args
        expected_lse = torch.logaddexp(lse_a, lse_b)
        expected_out = (torch.exp(lse_a - expected_lse) * out_a
                        + torch.exp(lse_b - expected_lse) * out_b)
        if is_close(out, expected_out) and is_close(lse, expected_lse):
            continue
        if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
            if "-inf" in probe:
                raise CheckFailed(
                    f"{what} gives nan or inf on {probe}. A part that saw no key has weight "
                    "exp(-inf - m) = 0 when m is the maximum of the two log-sum-exps; avoid "
                    "expressions such as lse_a - lse_b or exp(lse) / exp(lse) that become "
                    "inf - inf or 0 / 0.")
            raise CheckFailed(
                f"{what} gives nan or inf on {probe}: exp(lse) overflows float64 above about "
                "709 and underflows to 0 below about -745. Subtract the larger of the two "
                "log-sum-exps, m, before exponentiating: "
                "w_a = exp(lse_a - m), w_b = exp(lse_b - m), as chapter 8's online softmax "
                "rescales by exp(m_old - m_new).")
        for message, (wrong_out, wrong_lse) in _merge_wrong_answers(*args).items():
            lse_matches = is_close(lse, expected_lse if wrong_lse is None else wrong_lse)
            if is_close(out, wrong_out) and lse_matches:
                raise CheckFailed(f"{what} {message} (seen on {probe}).")
        part = "output" if not is_close(out, expected_out) else "log-sum-exp"
        diff = max_difference(*((out, expected_out) if part == "output"
                                else (lse, expected_lse)))
        raise CheckFailed(
            f"{what} returns a merged {part} that differs from the right one by up to "
            f"{diff:.3g} on {probe}, and matches none of the typical mistakes this check "
            "knows. Compare with attnlib.distributed.merge_partials on a small input.")
    return passed(f"{name} merges attention over two sets of keys, also with log-sum-exps "
                  "near +-800 and with a part that saw no key.")


# ---------------------------------------------------------------------------------------
# which blocks a rank computes under a causal mask


_KINDS = ("diagonal", "full", "skip")


def _ring_table(world_size: int, source_of: Callable[[int, int], int],
                kind_of: Callable[[int, int, int], str]) -> dict[tuple[int, int], str]:
    return {(r, s): kind_of(r, s, source_of(r, s))
            for r in range(world_size) for s in range(world_size)}


def _source_at(world_size: int) -> Callable[[int, int], int]:
    """The rank whose block rank ``r`` holds at step ``s``: blocks move to ``r + 1``."""
    def source(r: int, s: int) -> int:
        return (r - s) % world_size
    return source


def _right_kind(rank: int, step: int, source: int) -> str:
    if source == rank:
        return "diagonal"
    return "full" if source < rank else "skip"


def _ring_wrong_tables(world_size: int) -> dict[str, dict[tuple[int, int], str]]:
    back = _source_at(world_size)  # the ring's real direction

    def forward(r: int, s: int) -> int:
        return (r + s) % world_size

    return {
        "ignores the causal mask: every block is computed in full, the own block without "
        "its diagonal mask and the blocks of later ranks, whose keys are all in the future":
            _ring_table(world_size, back, lambda r, s, src: "full"),
        "computes the blocks of later ranks: their keys all come after every query of this "
        "rank, so under the causal mask they are skipped":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if src == r else "full"),
        "swaps 'full' and 'skip': the blocks of EARLIER ranks (source < rank) hold keys "
        "every query may see; those of later ranks are skipped":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if src == r else (
                "skip" if src < r else "full")),
        "turns the ring the wrong way: blocks move from rank r to rank r + 1, so at step s "
        "rank r holds the block of rank (r - s) mod world_size, not (r + s)":
            _ring_table(world_size, forward, _right_kind),
        "skips the block of rank 0 when it arrives at step s = rank: the block a rank holds "
        "comes from an earlier rank while step <= rank (step < rank misses the last one)":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if s == 0 else (
                "full" if s < r else "skip")),
        "marks the step-0 block 'full' instead of 'diagonal': a rank's own block holds "
        "queries and keys of the same tokens, so it needs the causal mask inside":
            _ring_table(world_size, back, lambda r, s, src: "full" if src == r else
                        _right_kind(r, s, src)),
    }


@checker
def check_causal_ring_steps(fn: Callable[[int, int, int], str]) -> bool:
    """Check a learner's ``fn(rank, step, world_size)``: what a rank computes at a step.

    The sequence is split contiguously (rank ``r`` holds tokens ``r*n ... (r+1)*n - 1``),
    the mask is causal, and blocks move one rank forward per step, so at step ``s`` rank
    ``r`` holds the key/value block of rank ``(r - s) mod world_size``. ``fn`` must
    return ``"diagonal"`` for the rank's own block (a causal mask inside), ``"full"`` for
    a block of an earlier rank (every key visible) and ``"skip"`` for a block of a later
    rank (every key in the future). Checked for every rank and step with ``world_size``
    from 1 to 6.

    Recognised mistakes: the mask ignored; later ranks' blocks computed; ``"full"`` and
    ``"skip"`` swapped; the ring turned the wrong way; the block of rank 0 skipped at
    ``step == rank``; the own block marked ``"full"``.

    Returns:
        True, after printing one line, when every answer is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other than one
            of the three strings, or gives a wrong table.

    Source: Liu et al. (2023), "Ring Attention", section 3; Brandon et al. (2023),
    "Striped Attention" (the causal workload of ring attention).
    """
    require_callable(fn, "a function fn(rank, step, world_size)")
    name = answer_name(fn, "fn")
    for world_size in range(6, 0, -1):  # the largest first: there every mistake differs
        table = {}
        for rank in range(world_size):
            for step in range(world_size):
                what = f"{name}(rank={rank}, step={step}, world_size={world_size})"
                kind = call_answer(fn, rank, step, world_size, what=what)
                if kind not in _KINDS:
                    raise CheckFailed(f"{what} returned {kind!r}; expected one of {_KINDS}")
                table[(rank, step)] = kind
        right = _ring_table(world_size, _source_at(world_size), _right_kind)
        if table == right:
            continue
        for message, wrong in _ring_wrong_tables(world_size).items():
            if table == wrong:
                raise CheckFailed(f"{name} {message} (seen with world_size={world_size}).")
        (rank, step), got = next((k, v) for k, v in table.items() if v != right[k])
        raise CheckFailed(
            f"{name}(rank={rank}, step={step}, world_size={world_size}) returned {got!r}; "
            f"that step holds the block of rank {(rank - step) % world_size}, so the answer "
            f"is {right[(rank, step)]!r}. Compare with attnlib.distributed.ring_schedule("
            f"{world_size}).")
    return passed(f"{name} gives the causal ring's schedule for every rank and step, "
                  "world_size 1 to 6.")


# ---------------------------------------------------------------------------------------
# the zigzag shard


def _chunks(x: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    size = x.shape[-2] // parts
    return x[..., index * size:(index + 1) * size, :]


def _zigzag_wrong_answers(x: torch.Tensor, rank: int, world_size: int) -> dict:
    late = 2 * world_size - 1 - rank
    return {
        "returns the contiguous shard, tokens rank*n ... (rank+1)*n - 1: zigzag cuts the "
        "sequence into 2 * world_size chunks and gives rank r chunks r and "
        "2*world_size - 1 - r": _chunks(x, world_size, rank),
        "puts the late chunk first: the shard is chunk rank, then chunk "
        "2*world_size - 1 - rank, so that its tokens stay in sequence order (the causal "
        "mask of the rank's own block then stays a lower triangle)":
            torch.cat([_chunks(x, 2 * world_size, late), _chunks(x, 2 * world_size, rank)],
                      dim=-2),
        "takes every world_size-th token (x[..., rank::world_size, :]): that is striped "
        "attention's layout (Brandon et al. 2023), balanced too, but this exercise asks for "
        "zigzag's two chunks": x[..., rank::world_size, :],
        "mirrors the rank within world_size chunks, not 2 * world_size: the late chunk is "
        "2*world_size - 1 - rank":
            torch.cat([_chunks(x, 2 * world_size, rank),
                       _chunks(x, 2 * world_size, world_size - 1 - rank)], dim=-2),
    }


@checker
def check_zigzag_shard(fn: Callable[..., torch.Tensor]) -> bool:
    """Check a learner's ``fn(x, rank, world_size)``: the rank's zigzag shard of ``x``.

    ``x`` is ``(..., num_tokens, d)`` with ``num_tokens`` divisible by ``2 * world_size``;
    ``fn`` must cut the tokens into ``2 * world_size`` equal chunks and return chunks
    ``rank`` and ``2 * world_size - 1 - rank``, in that order, along dimension ``-2``.
    The probes are float64 ``(2, 3, num_tokens, 4)`` tensors whose entries encode each
    token's position, for ``world_size`` 1 to 4, chunks of 1 and 3 tokens, every rank.

    Recognised mistakes: the contiguous shard; the late chunk first; striped attention's
    every-``world_size``-th token; the rank mirrored within ``world_size`` chunks;
    changing ``x`` in place.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns the wrong shape or dtype,
            or returns other tokens.

    Source: ring-flash-attention's ``zigzag_ring_flash_attn``; Llama Team (2024), "The
    Llama 3 Herd of Models", section 3.3.2.
    """
    require_callable(fn, "a function fn(x, rank, world_size)")
    name = answer_name(fn, "fn")
    for world_size in range(1, 5):
        for chunk in (1, 3):
            num_tokens = 2 * world_size * chunk
            x = torch.arange(num_tokens, dtype=_DTYPE).view(1, 1, -1, 1).expand(2, 3, -1, 4)
            x = x + torch.linspace(0, 0.5, 4, dtype=_DTYPE)  # token t's row: t, t + 1/6, ...
            for rank in range(world_size):
                what = f"{name}(x, rank={rank}, world_size={world_size})"
                probe = f"x of shape {tuple(x.shape)}"
                saved = [x.clone()]
                out = call_answer(fn, x, rank, world_size, what=what)
                require_unchanged(what, saved, [x], ["x"])
                out = require_tensor(out, what, (2, 3, 2 * chunk, 4), dtype=_DTYPE)
                late = 2 * world_size - 1 - rank
                expected = torch.cat([_chunks(x, 2 * world_size, rank),
                                      _chunks(x, 2 * world_size, late)], dim=-2)
                if torch.equal(out, expected):
                    continue
                for message, wrong in _zigzag_wrong_answers(x, rank, world_size).items():
                    if wrong.shape == out.shape and torch.equal(out, wrong):
                        raise CheckFailed(f"{what} {message} (seen on {probe}).")
                got = out[0, 0, :, 0].round().long().tolist()
                want = expected[0, 0, :, 0].round().long().tolist()
                raise CheckFailed(
                    f"{what} returns the tokens at positions {got} on {probe}; expected "
                    f"{want}: chunks {rank} and {late} of {2 * world_size}.")
    return passed(f"{name} gives every rank its two zigzag chunks, world_size 1 to 4.")
