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
from collections.abc import Callable, Sequence

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
    same_or_both_nonfinite,
)

__all__ = ["check_lse_merge", "check_causal_ring_steps", "check_zigzag_shard"]

_DTYPE = torch.float64


# ---------------------------------------------------------------------------------------
# the log-sum-exp merge


#: Where chapter 12 derives the merge; every message of check_lse_merge points there.
_SEE_MERGE = "See 'The merge is the online softmax' in this chapter"


def _stabilised_merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                      lse_b: torch.Tensor, m: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge with the exponentials shifted by ``m``: right for any finite ``m`` in exact
    arithmetic, and what a learner's shift gives in float64 (nan or inf where it fails)."""
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    return (w_a * out_a + w_b * out_b) / (w_a + w_b), m + torch.log(w_a + w_b)


def _merge_wrong_answers(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                         lse_b: torch.Tensor
                         ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """(message, (wrong out, wrong lse or None)); None: the lse is not what is wrong."""
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    right_out = (w_a * out_a + w_b * out_b) / (w_a + w_b)
    return {
        "averages the two outputs with equal weights: a part whose keys hold more of the "
        "softmax's mass must count for more": ((out_a + out_b) / 2, None),
        "weights the outputs by the log-sum-exps themselves, which are logarithms of what "
        "each part contributes":
            ((lse_a * out_a + lse_b * out_b) / (lse_a + lse_b), None),
        "does not divide by the sum of the weights: each part's output is already "
        "normalised by its own denominator, so the weighted sum must be normalised by the "
        "merged one": (w_a * out_a + w_b * out_b, None),
        "swaps the weights: out_a gets the weight of part b and out_b that of part a":
            ((w_b * out_a + w_a * out_b) / (w_a + w_b), None),
        "returns max(lse_a, lse_b) as the merged log-sum-exp: the denominators of the two "
        "parts add, so the merged one is larger than either": (right_out, m),
        "adds the two log-sum-exps, which multiplies the two denominators instead of adding "
        "them": (right_out, lse_a + lse_b),
        "returns the log of the mean of the two denominators, where the merged denominator "
        "is their sum": (right_out, m + torch.log((w_a + w_b) / 2)),
        "exponentiates the log-sum-exps without subtracting anything first: exp overflows "
        "float64 above about 709 and underflows to 0 below about -745, so shift them as the "
        "exercise says": _stabilised_merge(
            out_a, lse_a, out_b, lse_b, torch.zeros_like(m)),
        "shifts the exponentials by lse_a, not by the larger of the two log-sum-exps: when "
        "the first part saw no key (lse_a = -inf) or lse_b exceeds lse_a by more than about "
        "709, exp overflows or gives nan":
            _stabilised_merge(out_a, lse_a, out_b, lse_b, lse_a),
        "shifts the exponentials by lse_b, not by the larger of the two log-sum-exps: when "
        "the second part saw no key (lse_b = -inf) or lse_a exceeds lse_b by more than about "
        "709, exp overflows or gives nan":
            _stabilised_merge(out_a, lse_a, out_b, lse_b, lse_b),
        "shifts the exponentials by the smaller of the two log-sum-exps, not the larger: "
        "the other exponential then overflows when they are far apart, and a part that saw "
        "no key gives nan":
            _stabilised_merge(out_a, lse_a, out_b, lse_b, torch.minimum(lse_a, lse_b)),
        "shifts the exponentials by one maximum for the whole tensor, not by each row's: "
        "rows whose log-sum-exps lie far below it underflow to 0 / 0, where the exercise "
        "asks for the larger of the two log-sum-exps of each row":
            _stabilised_merge(out_a, lse_a, out_b, lse_b, m.max()),
    }


def _or(tensor: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return default if tensor is None else tensor


def _merge_pair(result: object, what: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (out, lse): a tuple, a list or any other sequence of two tensors."""
    if isinstance(result, torch.Tensor) or not isinstance(result, Sequence) or isinstance(
            result, (str, bytes)) or len(result) != 2:
        raise CheckFailed(f"{what} returned {type_name(result)}; expected a pair (out, lse), "
                          "such as a tuple of two tensors")
    out = require_tensor(result[0], f"{what}[0], the merged output", shapes[0], dtype=_DTYPE)
    lse = require_tensor(result[1], f"{what}[1], the merged log-sum-exp", shapes[1],
                         dtype=_DTYPE)
    return out, lse


def _merge_probes() -> list[tuple[tuple[torch.Tensor, ...], str]]:
    """(out_a, lse_a, out_b, lse_b) and a description, for every probe of check_lse_merge."""
    gen = torch.Generator().manual_seed(2310)

    def halves(shift_a: float | torch.Tensor, shift_b: float | torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
        query = torch.randn(2, 3, 5, 6, generator=gen, dtype=_DTYPE)
        parts = []
        for shift in (shift_a, shift_b):
            key = torch.randn(2, 3, 4, 6, generator=gen, dtype=_DTYPE)
            value = torch.randn(2, 3, 4, 4, generator=gen, dtype=_DTYPE)
            scores = query @ key.transpose(-2, -1) / math.sqrt(6) + shift
            parts += [torch.softmax(scores, dim=-1) @ value,
                      torch.logsumexp(scores, dim=-1, keepdim=True)]
        return tuple(parts)

    def empty(parts: tuple[torch.Tensor, ...], which: int) -> tuple[torch.Tensor, ...]:
        """``parts`` with part ``which`` (0 for a, 1 for b) replaced by one that saw no key."""
        emptied = list(parts)
        emptied[2 * which] = torch.zeros_like(parts[2 * which])
        emptied[2 * which + 1] = torch.full_like(parts[2 * which + 1], -math.inf)
        return tuple(emptied)

    # Rows 0-1 of every sequence and head near +800, rows 2-4 near -800.
    apart = torch.tensor([800.0, 800.0, -800.0, -800.0, -800.0], dtype=_DTYPE)[:, None]
    return [
        (halves(0.0, 1.5), "the results of attention over two halves of the keys"),
        (halves(800.0, 795.0), "two halves whose log-sum-exps are near +800"),
        (halves(-800.0, -803.0), "two halves whose log-sum-exps are near -800"),
        (empty(halves(0.0, 0.0), 1), "a first half of keys and a second part that saw no "
                                     "key (lse_b = -inf, out_b = 0)"),
        (empty(halves(0.0, 0.0), 0), "a first part that saw no key (lse_a = -inf, out_a = 0) "
                                     "and a second half of keys"),
        (halves(0.0, 750.0), "two halves whose log-sum-exps differ by about 750, the "
                             "second the larger"),
        (halves(750.0, 0.0), "two halves whose log-sum-exps differ by about 750, the first "
                             "the larger"),
        (halves(apart, apart - 2.0), "two halves whose rows lie near +800 (rows 0 and 1) "
                                     "and near -800 (rows 2 to 4)"),
    ]


@checker
def check_lse_merge(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check a learner's merge ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

    ``out_a`` ``(..., n, d_v)`` is attention over one set of keys and ``lse_a``
    ``(..., n, 1)`` the log of each row's softmax denominator; likewise ``out_b``,
    ``lse_b`` for a disjoint set. ``fn`` must return the attention over both sets and its
    log-sum-exp: ``lse = log(e^lse_a + e^lse_b)``, ``out = e^(lse_a - lse) out_a +
    e^(lse_b - lse) out_b``, as a tuple, a list or another sequence of the two tensors.
    The probes are float64: the results of real attention over two halves of the keys
    (shapes ``(2, 3, 5, 4)`` and ``(2, 3, 5, 1)``), the same with log-sum-exps near
    +800 and near -800 (``exp`` overflows float64 above about 709), a second and a first
    part that saw no key (``lse = -inf``, output 0), log-sum-exps 750 apart either way,
    and rows near +800 beside rows near -800. Every probe is compared by value.

    Recognised mistakes: equal weights; the log-sum-exps as weights; no division by the
    sum of the weights; swapped weights; the maximum, the sum or the log of the mean as
    the merged log-sum-exp; the exponentials shifted by nothing (overflow), by ``lse_a``,
    by ``lse_b``, by the smaller of the two or by one maximum for the whole tensor; nan
    where a part saw no key; changing an input in place. A mistake is named only when it
    gives the learner's results on every probe. No message states the formula: each
    names the mistake and the section that derives the merge.

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
    what = f"{name}(out_a, lse_a, out_b, lse_b)"
    probes = _merge_probes()
    results = []
    for args, _ in probes:
        saved = [t.clone() for t in args]
        result = call_answer(fn, *args, what=what)
        require_unchanged(what, saved, args, ["out_a", "lse_a", "out_b", "lse_b"])
        results.append(_merge_pair(result, what, (tuple(args[0].shape),
                                                  tuple(args[1].shape))))
    expected = [(_stabilised_merge(out_a, lse_a, out_b, lse_b, torch.maximum(lse_a, lse_b))[0],
                 torch.logaddexp(lse_a, lse_b)) for (out_a, lse_a, out_b, lse_b), _ in probes]
    wrong_at = [i for i, ((out, lse), (right_out, right_lse)) in enumerate(
        zip(results, expected, strict=True))
        if not (is_close(out, right_out) and is_close(lse, right_lse))]
    if not wrong_at:
        return passed(f"{name} merges attention over two sets of keys, also with "
                      "log-sum-exps near +-800 or 750 apart, rows far apart, and a part "
                      "that saw no key.")
    first = wrong_at[0]
    variants = [_merge_wrong_answers(*args) for args, _ in probes]
    for message in variants[0]:
        if all(same_or_both_nonfinite(out, variant[message][0])
               and same_or_both_nonfinite(lse, _or(variant[message][1], right_lse))
               for (out, lse), variant, (_, right_lse) in zip(results, variants, expected,
                                                              strict=True)):
            raise CheckFailed(f"{what} {message} (seen on {probes[first][1]}). {_SEE_MERGE}.")
    out, lse = results[first]
    right_out, right_lse = expected[first]
    probe = probes[first][1]
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        cause = ("A part that saw no key must get weight 0; an expression such as "
                 "lse_a - lse_b, or exp(lse) / exp(lse), then becomes inf - inf or 0 / 0"
                 if "saw no key" in probe else
                 "exp overflows float64 above about 709 and underflows to 0 below about "
                 "-745: is every exponential shifted by the larger log-sum-exp of its row?")
        raise CheckFailed(f"{what} gives nan or inf on {probe}. {cause} {_SEE_MERGE}.")
    if 0 not in wrong_at:
        raise CheckFailed(
            f"{what} is right on ordinary log-sum-exps but not on {probe}, and its results "
            "there are finite: a patch such as nan_to_num or a clamp hides an overflow "
            "instead of avoiding it. Shift the exponentials as the exercise says. "
            f"{_SEE_MERGE}.")
    part = "output" if not is_close(out, right_out) else "log-sum-exp"
    diff = max_difference(*((out, right_out) if part == "output" else (lse, right_lse)))
    raise CheckFailed(
        f"{what} returns a merged {part} that differs from the right one by up to "
        f"{diff:.3g} on {probe}, and matches none of the typical mistakes this check "
        f"knows. {_SEE_MERGE}, and merge two halves of a small softmax by hand.")


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

    see = "See 'The causal imbalance, before and after zigzag' in this chapter"
    return {
        "ignores the causal mask: every block is computed in full, the own block without "
        f"its diagonal mask and the blocks whose keys all lie in the future. {see}":
            _ring_table(world_size, back, lambda r, s, src: "full"),
        "computes the blocks of later ranks, whose keys all come after every query of this "
        f"rank: under the causal mask nothing of them is visible. {see}":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if src == r else "full"),
        "swaps 'full' and 'skip': it computes the blocks whose keys every query must not "
        f"see and skips those every query may see. {see}":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if src == r else (
                "skip" if src < r else "full")),
        "turns the ring the wrong way: it takes the block a rank holds at step s from "
        "rank (rank + s) mod world_size, while the exercise says whose block it is. "
        "See 'The ring, step by step'":
            _ring_table(world_size, forward, _right_kind),
        "skips the block of rank 0 when it arrives, at step s = rank: the comparison that "
        f"decides between 'full' and 'skip' is off by one. {see}":
            _ring_table(world_size, back, lambda r, s, src: "diagonal" if s == 0 else (
                "full" if s < r else "skip")),
        "marks the step-0 block 'full' instead of 'diagonal': a rank's own block holds "
        "queries and keys of the same tokens, so a query there must not see the keys "
        f"after it. {see}":
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
    ``step == rank``; the own block marked ``"full"``. No message gives the expected
    answer or points to ``ring_schedule``, which the exercise forbids.

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
            f"{name}(rank={rank}, step={step}, world_size={world_size}) returned {got!r}, "
            "which is not what that rank does with the block it holds then, and the "
            "answers match none of the typical mistakes this check knows. Work out whose "
            "block it holds (the exercise says how) and where that rank's tokens lie "
            "beside this rank's; see 'The ring, step by step' and 'The causal imbalance, "
            "before and after zigzag'.")
    return passed(f"{name} gives the causal ring's schedule for every rank and step, "
                  "world_size 1 to 6.")


# ---------------------------------------------------------------------------------------
# the zigzag shard


def _chunks(x: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    size = x.shape[-2] // parts
    return x[..., index * size:(index + 1) * size, :]


def _pair(x: torch.Tensor, parts: int, first: int, second: int, dim: int = -2
          ) -> torch.Tensor:
    """Chunks ``first`` and ``second`` of ``parts`` along the tokens, joined along ``dim``."""
    return torch.cat([_chunks(x, parts, first), _chunks(x, parts, second)], dim=dim)


#: Where chapter 12 shows the zigzag layout; every message of check_zigzag_shard points there.
_SEE_ZIGZAG = "See 'The causal imbalance, before and after zigzag' in this chapter"


def _zigzag_wrong_answers(x: torch.Tensor, rank: int, world_size: int
                          ) -> dict[str, Callable[[], object]]:
    """(message, what that mistake returns, as a function that may raise where the mistake
    cannot run on this probe, such as a chunk index past the end)."""
    p = world_size
    late = 2 * p - 1 - rank
    return {
        "returns the contiguous shard, one of world_size equal parts of the tokens, where "
        "zigzag gives each rank two chunks of 2 * world_size":
            lambda: _chunks(x, p, rank),
        "puts the late chunk first: the shard's tokens then are not in the order of the "
        "sequence, and the causal mask of the rank's own block would no longer be a lower "
        "triangle": lambda: _pair(x, 2 * p, late, rank),
        "takes every world_size-th token (x[..., rank::world_size, :]): that is striped "
        "attention's layout (Brandon et al. 2023), balanced too, but this exercise asks for "
        "zigzag's two chunks": lambda: x[..., rank::p, :],
        "mirrors the rank within world_size chunks, not within all 2 * world_size: its "
        "late chunk lies in the first half of the sequence":
            lambda: _pair(x, 2 * p, rank, p - 1 - rank),
        "takes the late chunk one too early (chunk 2 * world_size - 2 - rank): rank 0's "
        "late chunk must be the very last one":
            lambda: _pair(x, 2 * p, rank, 2 * p - 2 - rank),
        "takes chunk world_size + rank as the late chunk: the late chunks run backwards, "
        "rank 0 getting the last one":
            lambda: _pair(x, 2 * p, rank, p + rank),
        "cuts the tokens into world_size chunks, not 2 * world_size, so each chunk is twice "
        "too long": lambda: _pair(x, p, rank, p - 1 - rank),
        "returns only the early chunk: a zigzag shard holds two chunks, an early and a late "
        "one": lambda: _chunks(x, 2 * p, rank),
        "returns only the late chunk: a zigzag shard holds two chunks, an early and a late "
        "one": lambda: _chunks(x, 2 * p, late),
        "joins the two chunks along the last dimension (the features), not along the "
        "tokens, dimension -2": lambda: _pair(x, 2 * p, rank, late, dim=-1),
        "stacks the two chunks along a new dimension instead of joining them along the "
        "tokens (torch.stack for torch.cat)":
            lambda: torch.stack([_chunks(x, 2 * p, rank), _chunks(x, 2 * p, late)]),
    }


def _zigzag_probes() -> list[tuple[torch.Tensor, int, int]]:
    """(x, rank, world_size) for every probe: x (2, 3, num_tokens, 4) whose row t holds
    t, t + 1/6, t + 1/3, t + 1/2; world_size 1 to 4, chunks of 1 and 3 tokens."""
    probes = []
    for world_size in range(1, 5):
        for chunk in (1, 3):
            num_tokens = 2 * world_size * chunk
            x = torch.arange(num_tokens, dtype=_DTYPE).view(1, 1, -1, 1).expand(2, 3, -1, 4)
            x = x + torch.linspace(0, 0.5, 4, dtype=_DTYPE)
            probes += [(x, rank, world_size) for rank in range(world_size)]
    return probes


def _as_shard(out: object, what: str) -> torch.Tensor:
    """The learner's shard must be one tensor; two chunks in a list or tuple are named."""
    if isinstance(out, (list, tuple)) and len(out) == 2 and all(
            isinstance(part, torch.Tensor) for part in out):
        raise CheckFailed(
            f"{what} returned a {type_name(out)} of two tensors, the two chunks apart: the "
            "shard is one tensor, the two chunks joined along the tokens (dimension -2).")
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{what} returned {type_name(out)}; expected a torch.Tensor")
    if out.dtype != _DTYPE:
        raise CheckFailed(f"{what} returned dtype {out.dtype}; expected {_DTYPE}, x's dtype")
    return out


@checker
def check_zigzag_shard(fn: Callable[..., torch.Tensor]) -> bool:
    """Check a learner's ``fn(x, rank, world_size)``: the rank's zigzag shard of ``x``.

    ``x`` is ``(..., num_tokens, d)`` with ``num_tokens`` divisible by ``2 * world_size``;
    ``fn`` must cut the tokens into ``2 * world_size`` equal chunks and return chunks
    ``rank`` and ``2 * world_size - 1 - rank``, in that order, along dimension ``-2``.
    The probes are float64 ``(2, 3, num_tokens, 4)`` tensors whose entries encode each
    token's position, for ``world_size`` 1 to 4, chunks of 1 and 3 tokens, every
    rank. A mistake is named only when it gives the learner's shard on every probe.

    Recognised mistakes: the contiguous shard; the late chunk first; striped attention's
    every-``world_size``-th token; the rank mirrored within ``world_size`` chunks; the
    late chunk ``2 * world_size - 2 - rank`` or ``world_size + rank``; ``world_size``
    chunks instead of ``2 * world_size``; the early or the late chunk alone; the chunks
    joined along the features, stacked, or returned as a pair; changing ``x`` in
    place. No message gives the expected positions.

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
    probes = _zigzag_probes()
    shards = []
    for x, rank, world_size in probes:
        what = f"{name}(x, rank={rank}, world_size={world_size})"
        saved = [x.clone()]
        out = call_answer(fn, x, rank, world_size, what=what)
        require_unchanged(what, saved, [x], ["x"])
        shards.append(_as_shard(out, what))
    expected = [_pair(x, 2 * world_size, rank, 2 * world_size - 1 - rank)
                for x, rank, world_size in probes]
    wrong_at = [i for i, (out, right) in enumerate(zip(shards, expected, strict=True))
                if not (out.shape == right.shape and torch.equal(out, right))]
    if not wrong_at:
        return passed(f"{name} gives every rank its two zigzag chunks, world_size 1 to 4.")
    first = wrong_at[0]
    x, rank, world_size = probes[first]
    what = f"{name}(x, rank={rank}, world_size={world_size})"
    probe = f"x of shape {tuple(x.shape)}"
    for message in _zigzag_wrong_answers(x, rank, world_size):
        if all(_gives(out, _zigzag_wrong_answers(*args)[message])
               for out, args in zip(shards, probes, strict=True)):
            hint = "" if "dimension" in message or "torch.stack" in message else (
                f" {_SEE_ZIGZAG}.")
            raise CheckFailed(f"{what} {message} (seen on {probe}).{hint}")
    out = shards[first]
    require_tensor(out, what, tuple(expected[first].shape), dtype=_DTYPE)
    got = out[0, 0, :, 0].round().long().tolist()
    raise CheckFailed(
        f"{what} returns the tokens at positions {got} on {probe} (token t's row holds t), "
        "which is not that rank's zigzag shard, and the answers match none of the typical "
        f"mistakes this check knows. {_SEE_ZIGZAG}, and draw the 2 * world_size chunks "
        "for world_size = 2.")


def _gives(out: torch.Tensor, mistake: Callable[[], object]) -> bool:
    """Whether ``mistake()`` returns exactly ``out``; False where it cannot run here."""
    try:
        wrong = mistake()
    except (IndexError, RuntimeError):
        return False
    return isinstance(wrong, torch.Tensor) and wrong.shape == out.shape and torch.equal(
        out, wrong)
