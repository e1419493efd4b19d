"""Checkers for chapter 8's exercises: online softmax and tiled (flash) attention.

* :func:`check_online_softmax` - ``fn(x)``: a one-pass softmax over the last
  dimension that keeps a running maximum and a running sum.
* :func:`check_flash_attention` - ``fn(query, key, value, is_causal=..., block_size=...)``:
  attention computed one tile of keys at a time, with a running maximum, sum
  and output per query.

Both probe with seeded float64 inputs whose sizes all differ, whose maxima grow
as the row is read (so a missing rescale shows), and with large entries (so an
overflow shows). Each typical wrong answer is computed and compared, so that
the message can name it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    max_difference,
    name_wrong_answer,
    passed,
    probe_device,
    require_callable,
    require_tensor,
)

__all__ = ["check_online_softmax", "check_flash_attention"]

_DTYPE = torch.float64


def _overflowed(out: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool((~torch.isfinite(out)).any() and torch.isfinite(expected).all())


# ---------------------------------------------------------------------------------------
# online softmax


def _online_softmax_variant(x: torch.Tensor, *, rescale: str = "right",
                            final_max: bool = True, initial_max: float = -math.inf,
                            clamp_sum: float | None = None) -> torch.Tensor:
    """A one-pass softmax over the last dim, right or with one typical slip.

    ``rescale``: ``"right"`` multiplies the running sum by ``exp(old_max - new_max)``,
    ``"none"`` forgets it, ``"inverted"`` uses ``exp(new_max - old_max)``.
    ``final_max=False`` exponentiates each entry with the maximum known when it
    was read instead of the final one. ``initial_max=0.0`` starts the running
    maximum at 0 instead of ``-inf`` (rows far below 0 then give 0 / 0 = nan);
    ``clamp_sum`` divides by ``running_sum.clamp(min=clamp_sum)``, which turns that
    0 / 0 into 0.
    """
    running_max = torch.full(x.shape[:-1], initial_max, dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    max_when_read = []
    for j in range(x.shape[-1]):
        new_max = torch.maximum(running_max, x[..., j])
        if rescale == "right":
            factor = torch.exp(running_max - new_max)
        elif rescale == "inverted":
            factor = torch.exp(new_max - running_max).nan_to_num(posinf=0.0)  # 0 * inf at j = 0
        else:
            factor = torch.ones_like(new_max)
        running_sum = running_sum * factor + torch.exp(x[..., j] - new_max)
        running_max = new_max
        max_when_read.append(new_max)
    shift = running_max.unsqueeze(-1) if final_max else torch.stack(max_when_read, dim=-1)
    if clamp_sum is not None:
        running_sum = running_sum.clamp(min=clamp_sum)
    return torch.exp(x - shift) / running_sum.unsqueeze(-1)


def _online_softmax_wrong_answers(x: torch.Tensor) -> dict[str, torch.Tensor]:
    shifted = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return {
        "forgets to rescale the running sum when the maximum grows: when a new entry raises "
        "the maximum from m_old to m_new, every exp(x_i - m_old) already summed must become "
        "exp(x_i - m_new), so multiply the running sum by exp(m_old - m_new) before adding the "
        "new term. (Without it the result is right only when the first entry is the largest. "
        "A common cause: updating the running maximum BEFORE computing the factor, which "
        "makes it exp(m_new - m_new) = 1.)":
            _online_softmax_variant(x, rescale="none"),
        "starts the running maximum at 0 instead of -inf: in a row whose entries are all far "
        "below 0 every exp(x_j - 0) underflows to 0, and the result is 0 / 0 = nan. Start at "
        "-inf (torch.full(..., -math.inf)), so that the first entry becomes the maximum":
            _online_softmax_variant(x, initial_max=0.0),
        "starts the running maximum at 0 instead of -inf, and clamps the sum away from 0: in "
        "a row whose entries are all far below 0 every exp(x_j - 0) underflows to 0, so the "
        "sum is 0 and the clamp turns 0 / 0 into a row of zeros, which does not sum to 1. "
        "Start at -inf (torch.full(..., -math.inf)): the first entry then becomes the "
        "maximum, the sum is at least 1, and no clamp is needed":
            _online_softmax_variant(x, initial_max=0.0, clamp_sum=1e-30),
        "rescales the running sum by exp(m_new - m_old), the inverse of the right factor: the "
        "sum must SHRINK when the maximum grows, so multiply by exp(m_old - m_new) <= 1":
            _online_softmax_variant(x, rescale="inverted"),
        "divides each exp(x_j - m_j) by the final sum, where m_j is the maximum known when "
        "x_j was read: the numerators must use the FINAL maximum too, exp(x_j - m_final), the "
        "same shift the sum ends up with": _online_softmax_variant(x, final_max=False),
        "normalises over the wrong dimension: the softmax runs along the last dimension "
        "(x[..., j], j = 0, 1, ...), one running maximum and sum per row":
            torch.softmax(x, dim=0),
        "returns exp(x - max) without dividing by the running sum: the entries of each row "
        "must sum to 1": shifted,
    }


@checker
def check_online_softmax(fn: Callable[[torch.Tensor], torch.Tensor], *,
                         device: torch.device | str | None = None) -> bool:
    """Check a learner's one-pass softmax ``fn(x)`` over the last dimension.

    ``fn(x)`` must return ``softmax(x, dim=-1)`` for ``x`` of shape
    ``(..., num_items)``, computed the online way: one pass along the last
    dimension keeping a running maximum and a running sum per row, the sum
    rescaled whenever the maximum grows. The probes are float64 tensors of
    shapes ``(3, 9)``, ``(2, 4, 7)`` and ``(5, 1)`` whose rows rise
    (so the maximum grows while a row is read), and ``(2, 6)`` rows near
    +1000 and -1000 (which overflow without the maximum). Only the result is
    compared: whether the answer makes one pass is the exercise's job.

    Recognised mistakes: no rescale of the running sum when the maximum grows
    (for example the maximum updated before the factor is computed); the
    inverse rescale factor; numerators shifted by the maximum known when each
    entry was read instead of the final maximum; the running maximum started
    at 0 instead of ``-inf`` (nan on rows far below 0, or zeros where the sum
    is clamped away from 0); overflow (no running maximum); softmax over the
    wrong dimension; no division by the sum; changing ``x`` in place.

    Args:
        fn: the learner's function, called as ``fn(x)``; it must return a
            tensor of ``x``'s shape and dtype.
        device: where to probe (keyword only; ``"cuda"`` for a GPU); default
            the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns the wrong shape
            or dtype, or computes something else; the message names the
            mistake where it is a typical one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Milakov and Gimelshein (2018), "Online normalizer calculation for
    softmax", Algorithm 3.
    """
    require_callable(fn, "a one-pass softmax function fn(x)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    gen = torch.Generator().manual_seed(1805)

    def rising(*shape: int) -> torch.Tensor:
        steps = torch.linspace(0.0, 6.0, shape[-1], dtype=_DTYPE)  # the maximum keeps growing
        noise = torch.randn(*shape, generator=gen, dtype=_DTYPE)
        return (steps + noise).to(device)

    far = torch.randn(2, 6, generator=gen, dtype=_DTYPE) * 3.0
    far = (far + torch.tensor([[1000.0], [-1000.0]], dtype=_DTYPE)).to(device)
    probes = [
        (rising(3, 9), "a (3, 9) tensor whose rows mostly rise from left to right"),
        (rising(2, 4, 7), "a (2, 4, 7) tensor whose rows mostly rise"),
        (rising(5, 1), "a (5, 1) tensor: rows of one entry, each softmax is 1"),
        (far, "a (2, 6) tensor whose rows lie near +1000 and near -1000"),
    ]
    for x, probe in probes:
        before = x.clone()
        what = f"{name}(x)"
        out = call_answer(fn, x, what=what)
        if not torch.equal(before, x):
            raise CheckFailed(f"{what} changed x in place; compute into new tensors instead.")
        require_tensor(out, what, tuple(x.shape), dtype=_DTYPE, device=device)
        expected = torch.softmax(x, dim=-1)
        if is_close(out, expected):
            continue
        mistake = name_wrong_answer(out, _online_softmax_wrong_answers(x))
        if mistake is not None:
            raise CheckFailed(f"{what} on {probe} {mistake}.")
        if _overflowed(out, expected):
            raise CheckFailed(
                f"{what} on {probe} gives inf or nan: exp overflows float64 above about 709. "
                "Subtract the running maximum inside every exp, as chapter 1's stable softmax "
                "subtracts the row maximum.")
        raise CheckFailed(
            f"{what} on {probe} differs from torch.softmax(x, dim=-1) by up to "
            f"{max_difference(out, expected):.3g}. Check each row's entries sum to 1 and "
            "compare with attnlib.softmax(x) on a small row.")
    return passed(f"{name} equals softmax on rising rows of 3 shapes and on rows near "
                  "+-1000, without overflow.")


# ---------------------------------------------------------------------------------------
# tiled (flash) attention


_MASKS = ("top-left", "no-diagonal", "flipped", "flipped-strict", "tile-local")


def _hidden(mask: str, cols: torch.Tensor, rows: torch.Tensor, start: int,
            causal_offset: int) -> torch.Tensor:
    """Bool ``(N_q, Bk)``: True where the variant ``mask`` hides key ``cols[c]`` from ``i``."""
    if mask == "top-left":
        return cols > rows + causal_offset
    if mask == "no-diagonal":
        return cols >= rows
    if mask == "flipped":
        return cols <= rows
    if mask == "flipped-strict":
        return cols < rows
    if mask == "tile-local":
        return cols - start > rows
    raise ValueError(f"mask must be one of {_MASKS}, got {mask!r}")


def _tiled_variant(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   is_causal: bool, block_size: int, *, rescale_acc: bool = True,
                   rescale_sum: bool = True, scale: float | None = None,
                   causal_offset: int = 0, mask: str = "top-left",
                   initial_max: float = -math.inf, divide: bool = True, safe: bool = True,
                   fill: float = -math.inf) -> torch.Tensor:
    """Tiled attention over key blocks (queries vectorised), right or with one slip.

    ``mask`` (with ``is_causal``) hides key ``j`` from query ``i`` where:
    ``"top-left"`` ``j > i + causal_offset`` (right with offset 0);
    ``"no-diagonal"`` ``j >= i``; ``"flipped"`` ``j <= i`` (the may-attend mask
    used as the hide mask); ``"flipped-strict"`` ``j < i``; ``"tile-local"``
    ``c > i`` with ``c`` the key's index inside its tile (0 .. block_size - 1).
    ``safe=False`` computes as a learner's plain loop would, nan included: no
    guard for a row whose running maximum is still ``-inf``, and ``acc /
    row_sum`` without a guard for a zero sum. ``fill`` is the score a hidden key
    gets: a finite one such as ``-1e9`` or ``-torch.finfo(dtype).max`` gives
    a query that sees no key at all the mean of every value instead of nan.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    n_q, n_kv = query.shape[-2], key.shape[-2]
    lead = query.shape[:-2]
    row_max = torch.full((*lead, n_q, 1), initial_max, dtype=query.dtype, device=query.device)
    row_sum = torch.zeros((*lead, n_q, 1), dtype=query.dtype, device=query.device)
    acc = torch.zeros((*lead, n_q, value.shape[-1]), dtype=query.dtype, device=query.device)
    rows = torch.arange(n_q, device=query.device).unsqueeze(-1)
    for start in range(0, n_kv, block_size):
        end = min(start + block_size, n_kv)
        scores = (query @ key[..., start:end, :].transpose(-2, -1)) * scale
        if is_causal:
            cols = torch.arange(start, end, device=query.device)
            scores = scores.masked_fill(_hidden(mask, cols, rows, start, causal_offset),
                                        fill)
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        if safe:  # rows that saw nothing yet: subtract 0 instead of -inf
            new_max_used = new_max.masked_fill(new_max == -math.inf, 0.0)
        else:
            new_max_used = new_max
        probs = torch.exp(scores - new_max_used)
        factor = torch.exp(row_max - new_max_used)
        row_sum = (row_sum * factor if rescale_sum else row_sum) + probs.sum(-1, keepdim=True)
        acc = (acc * factor if rescale_acc else acc) + probs @ value[..., start:end, :]
        row_max = new_max
    if not divide:
        return acc
    return acc / torch.where(row_sum > 0, row_sum, 1.0) if safe else acc / row_sum


def _per_tile_softmax(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      is_causal: bool, block_size: int) -> torch.Tensor:
    """The misconception: softmax each tile of scores on its own and add the tiles."""
    n_q = query.shape[-2]
    rows = torch.arange(n_q, device=query.device).unsqueeze(-1)
    out = torch.zeros((*query.shape[:-1], value.shape[-1]), dtype=query.dtype,
                      device=query.device)
    for start in range(0, key.shape[-2], block_size):
        end = min(start + block_size, key.shape[-2])
        scores = query @ key[..., start:end, :].transpose(-2, -1) / math.sqrt(query.shape[-1])
        if is_causal:
            cols = torch.arange(start, end, device=query.device)
            scores = scores.masked_fill(cols > rows, -math.inf)
        out = out + torch.softmax(scores, dim=-1).nan_to_num(0.0) @ value[..., start:end, :]
    return out


def _flash_wrong_answers(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         is_causal: bool, block_size: int) -> list[tuple[str, torch.Tensor]]:
    """(message, wrong result) pairs; a message may come with a plain and a guarded form."""
    d_k, d_v = query.shape[-1], value.shape[-1]
    n_q, n_kv = query.shape[-2], key.shape[-2]
    args = (query, key, value, is_causal, block_size)
    max_first = ("(A common cause: updating the running maximum BEFORE computing the factor, "
                 "which makes it exp(m_new - m_new) = 1.)")
    wrong = [
        ("forgets to rescale the running OUTPUT when the maximum grows: the accumulated "
         "sum of exp(s - m_old) * v must be multiplied by exp(m_old - m_new), exactly like the "
         "running sum, before the new tile is added", _tiled_variant(*args, rescale_acc=False)),
        ("forgets to rescale the running SUM when the maximum grows: multiply it by "
         "exp(m_old - m_new) before adding the new tile's exp(s - m_new).sum(-1)",
         _tiled_variant(*args, rescale_sum=False)),
        ("rescales neither the running sum nor the running output when the maximum grows: "
         "both were computed under the old maximum and must be multiplied by "
         f"exp(m_old - m_new). {max_first}",
         _tiled_variant(*args, rescale_acc=False, rescale_sum=False)),
        ("does not scale the scores: multiply query @ key^T by 1/sqrt(d_k)",
         _tiled_variant(*args, scale=1.0)),
        ("returns the running output without dividing it by the running sum at the end: "
         "the weights of each query must sum to 1, so return acc / row_sum",
         _tiled_variant(*args, divide=False)),
        ("takes a softmax of each tile on its own and adds the tiles' results: the weights "
         "of a query are normalised over ALL its keys, so keep one running maximum and sum "
         "across the tiles and divide once, at the end",
         _per_tile_softmax(*args)),
    ]
    initial_zero = ("starts the running maximum at 0 instead of -inf: when all of a query's "
                    "scores are far below 0, every exp(s - 0) underflows to 0 and the result "
                    "is 0 / 0 = nan. Start at -inf (torch.full(..., -math.inf)), so that the "
                    "first tile sets the maximum")
    wrong += [(initial_zero, _tiled_variant(*args, initial_max=0.0, safe=False)),
              (initial_zero, _tiled_variant(*args, initial_max=0.0))]
    if d_v != d_k:
        wrong.append((f"scales by 1/sqrt(d_v) = 1/sqrt({d_v}); the scale is 1/sqrt(d_k) = "
                      f"1/sqrt({d_k}), the size of the query and key vectors",
                      _tiled_variant(*args, scale=1.0 / math.sqrt(d_v))))
    if is_causal:
        wrong.append(("ignores is_causal=True: query i must not see keys j > i (hide them "
                      "with -inf before the running maximum)",
                      _tiled_variant(query, key, value, False, block_size)))
        if n_q != n_kv:
            wrong.append((
                "aligns the causal mask at the bottom-right corner (query i sees keys up to "
                "i + num_tokens_kv - num_tokens_q); is_causal=True here means the top-left "
                "alignment of torch.nn.functional.scaled_dot_product_attention and "
                "attnlib.causal_mask: query i sees keys j <= i",
                _tiled_variant(*args, causal_offset=n_kv - n_q)))
        masks = {
            "no-diagonal": "hides the diagonal too: query i must see key i itself, so hide "
                           "the keys j > i, not j >= i (query 0 then sees no key at all "
                           "and gives nan or 0)",
            "flipped": "flips the causal mask: it hides the keys j <= i and lets query i see "
                       "the FUTURE keys j > i (a may-attend mask such as attnlib.causal_mask "
                       "is True where a key is allowed; masked_fill needs its negation, ~mask)",
            "flipped-strict": "flips the causal mask: it hides the keys j < i and lets query "
                              "i see itself and the FUTURE keys; hide j > i instead",
            "tile-local": "builds each tile's causal mask from the key's index INSIDE the "
                          "tile (0 .. block_size - 1) instead of its position in the sequence "
                          "(start .. start + block_size - 1): compare "
                          "torch.arange(start, end) with the query positions",
        }
        finite = ("; hidden with a finite score such as -1e9 or -torch.finfo(dtype).max, "
                  "a query that then sees no key spreads its weight evenly over all of "
                  "them instead of giving nan")
        for mask, message in masks.items():
            wrong += [(message, _tiled_variant(*args, mask=mask, safe=False)),
                      (message, _tiled_variant(*args, mask=mask)),
                      (message + finite, _tiled_variant(*args, mask=mask, fill=-1e9))]
    return wrong


def _name_flash_mistake(out: torch.Tensor, wrong: list[tuple[str, torch.Tensor]]) -> str | None:
    for message, candidate in wrong:
        if is_close(out, candidate):
            return message
    return None


def _judge_flash(out: torch.Tensor,
                 args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, int],
                 what: str) -> None:
    """Return if ``out`` is attention of ``args = (query, key, value, is_causal,
    block_size)``; otherwise name the mistake, an overflow, or the difference."""
    expected = _reference_attention(*args[:4])
    if is_close(out, expected):
        return
    mistake = _name_flash_mistake(out, _flash_wrong_answers(*args))
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake}.")
    if _overflowed(out, expected):
        raise CheckFailed(
            f"{what} gives inf or nan: exp of large scores overflows. Keep a running "
            "maximum per query and subtract it inside every exp.")
    raise CheckFailed(
        f"{what} differs from softmax(q k^T / sqrt(d_k)) v by up to "
        f"{max_difference(out, expected):.3g}. Compare with "
        "attnlib.functional.flash_attention(query, key, value, is_causal, "
        "block_size=...) on a small input, tile by tile.")


def _reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         is_causal: bool) -> torch.Tensor:
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if is_causal:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    return torch.softmax(scores, dim=-1) @ value


@checker
def check_flash_attention(fn: Callable[..., torch.Tensor], *,
                          device: torch.device | str | None = None) -> bool:
    """Check a learner's tiled attention ``fn(query, key, value, is_causal=..., block_size=...)``.

    ``fn`` must return ``softmax(query @ key^T / sqrt(d_k)) @ value`` (with
    the top-left causal mask when ``is_causal=True``, as torch's) while
    reading the keys and values ``block_size`` rows at a time. The probes are
    float64, queries ``(2, 3, 7, 5)`` against keys ``(2, 3, 11, 5)`` and
    values ``(2, 3, 11, 4)`` (so ``N_q != N_kv`` and ``d_v != d_k``), then 11
    queries against 7 keys, block sizes 3, 4, 1 and 16 (none divides both
    lengths; 16 is larger than both), causal and not, keys whose scores rise
    along the sequence (so the running maximum grows from tile to tile), large
    scores (which overflow without the running maximum) and scores all far
    below 0 (which underflow when the running maximum starts at 0).

    Recognised mistakes: no rescale of the running output, of the running sum,
    or of both, when the maximum grows; no ``1/sqrt(d_k)`` scale, or
    ``1/sqrt(d_v)``; no division by the running sum at the end; a softmax per
    tile, added up; the running maximum started at 0 (nan where every score
    is far below 0); ``is_causal`` ignored; the causal mask aligned at the
    bottom-right, hiding the diagonal, flipped (hiding the past), or built
    from the key's index inside its tile; overflow; changing an input in
    place. A mistake that gives nan where a plain loop would is recognised
    with or without the nan, and a wrong mask also when it hides keys with a
    finite score (``-1e9`` or ``-torch.finfo(dtype).max``) instead of
    ``-inf``. A right mask with a finite fill is accepted: every query of the
    probes sees at least key 0.

    Args:
        fn: the learner's function, called as
            ``fn(query, key, value, is_causal=..., block_size=...)``.
        device: where to probe (keyword only; ``"cuda"`` for a GPU); default
            the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns the wrong shape
            or dtype, or computes something else; the message names the
            mistake where it is a typical one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Dao et al. (2022), "FlashAttention", Algorithm 1; Dao (2023),
    "FlashAttention-2", Algorithm 1.
    """
    require_callable(fn, "a tiled attention function fn(query, key, value, is_causal, "
                         "block_size)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    gen = torch.Generator().manual_seed(2205)

    def probe_tensors(n_q: int, n_kv: int, big: float = 1.0,
                      apart: float = 0.0) -> tuple[torch.Tensor, ...]:
        query = torch.randn(2, 3, n_q, 5, generator=gen, dtype=_DTYPE)
        key = torch.randn(2, 3, n_kv, 5, generator=gen, dtype=_DTYPE)
        # apart > 0 pushes queries and keys to opposite sides of the first axis, so
        # every score is about -apart**2 / sqrt(5): far below 0.
        query[..., 0] += apart
        key[..., 0] -= apart
        # Keys drift along the sequence towards the mean query direction, so the
        # scores of later tiles tend to be larger: the running maximum grows.
        drift = torch.linspace(0.0, 2.5, n_kv, dtype=_DTYPE).unsqueeze(-1)
        key = key + drift * query.mean(dim=-2, keepdim=True).sign()
        value = torch.randn(2, 3, n_kv, 4, generator=gen, dtype=_DTYPE)
        return tuple(t.to(device) for t in (query * big, key, value))

    probes = [  # (tensors, is_causal, block_size, description)
        (probe_tensors(7, 11), False, 3, "7 queries, 11 keys, block_size=3"),
        (probe_tensors(7, 11), True, 4, "7 queries, 11 keys, is_causal=True, block_size=4"),
        (probe_tensors(11, 7), True, 3, "11 queries, 7 keys, is_causal=True, block_size=3"),
        (probe_tensors(7, 11), True, 1, "7 queries, 11 keys, is_causal=True, block_size=1"),
        (probe_tensors(11, 7), False, 16, "11 queries, 7 keys, block_size=16 (one tile)"),
        (probe_tensors(7, 11, big=300.0), True, 3,
         "7 queries, 11 keys, is_causal=True, block_size=3, scores in the hundreds"),
        (probe_tensors(7, 11, apart=60.0), False, 3,
         "7 queries, 11 keys, block_size=3, every score below -1000"),
    ]
    for (query, key, value), is_causal, block_size, probe in probes:
        before = [t.clone() for t in (query, key, value)]
        what = f"{name}(query, key, value, is_causal={is_causal}, block_size={block_size})"
        out = call_answer(fn, query, key, value, is_causal=is_causal, block_size=block_size,
                          what=what)
        for label, t, b in zip(("query", "key", "value"), (query, key, value), before,
                               strict=True):
            if not torch.equal(t, b):
                raise CheckFailed(f"{what} changed {label} in place; leave the inputs alone.")
        shape = (*query.shape[:-1], value.shape[-1])
        out = require_tensor(out, what, shape, dtype=_DTYPE, device=device)
        _judge_flash(out, (query, key, value, is_causal, block_size), f"{what} on {probe}")
    return passed(f"{name} matches attention for 4 block sizes, N_q != N_kv both ways, causal "
                  "and not, with growing scores, scores in the hundreds and scores far below "
                  "0.")
