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
from typing import Any

import torch

from ._common import (
    CheckFailed,
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


def _name(fn: Callable[..., Any], default: str) -> str:
    name = getattr(fn, "__name__", "")
    return name if name.isidentifier() else default


def _overflowed(out: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool((~torch.isfinite(out)).any() and torch.isfinite(expected).all())


# ---------------------------------------------------------------------------------------
# online softmax


def _online_softmax_variant(x: torch.Tensor, *, rescale: str = "right",
                            final_max: bool = True) -> torch.Tensor:
    """A one-pass softmax over the last dim, right or with one typical slip.

    ``rescale``: ``"right"`` multiplies the running sum by ``exp(old_max - new_max)``,
    ``"none"`` forgets it, ``"inverted"`` uses ``exp(new_max - old_max)``.
    ``final_max=False`` exponentiates each entry with the maximum known when it
    was read instead of the final one.
    """
    running_max = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
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
    return torch.exp(x - shift) / running_sum.unsqueeze(-1)


def _online_softmax_wrong_answers(x: torch.Tensor) -> dict[str, torch.Tensor]:
    shifted = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return {
        "forgets to rescale the running sum when the maximum grows: when a new entry raises "
        "the maximum from m_old to m_new, every exp(x_i - m_old) already summed must become "
        "exp(x_i - m_new), so multiply the running sum by exp(m_old - m_new) before adding the "
        "new term. (Without it the result is right only when the first entry is the largest.)":
            _online_softmax_variant(x, rescale="none"),
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

    Recognised mistakes: no rescale of the running sum when the maximum grows;
    the inverse rescale factor; numerators shifted by the maximum known when
    each entry was read instead of the final maximum; overflow (no running
    maximum); softmax over the wrong dimension; no division by the sum;
    changing ``x`` in place.

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
    name = _name(fn, "fn")
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


def _tiled_variant(query, key, value, is_causal, block_size, *, rescale_acc=True,
                   rescale_sum=True, scale=None, causal_offset=0):
    """Tiled attention over key blocks (queries vectorised), right or with one slip."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    n_q, n_kv = query.shape[-2], key.shape[-2]
    lead = query.shape[:-2]
    row_max = torch.full((*lead, n_q, 1), -math.inf, dtype=query.dtype, device=query.device)
    row_sum = torch.zeros((*lead, n_q, 1), dtype=query.dtype, device=query.device)
    acc = torch.zeros((*lead, n_q, value.shape[-1]), dtype=query.dtype, device=query.device)
    rows = torch.arange(n_q, device=query.device).unsqueeze(-1)
    for start in range(0, n_kv, block_size):
        end = min(start + block_size, n_kv)
        scores = (query @ key[..., start:end, :].transpose(-2, -1)) * scale
        if is_causal:
            cols = torch.arange(start, end, device=query.device)
            scores = scores.masked_fill(cols > rows + causal_offset, -math.inf)
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        safe_max = new_max.masked_fill(new_max == -math.inf, 0.0)  # rows that saw nothing yet
        probs = torch.exp(scores - safe_max)
        factor = torch.exp(row_max - safe_max)
        row_sum = (row_sum * factor if rescale_sum else row_sum) + probs.sum(-1, keepdim=True)
        acc = (acc * factor if rescale_acc else acc) + probs @ value[..., start:end, :]
        row_max = new_max
    return acc / torch.where(row_sum > 0, row_sum, 1.0)


def _flash_wrong_answers(query, key, value, is_causal, block_size) -> dict[str, torch.Tensor]:
    d_k, d_v = query.shape[-1], value.shape[-1]
    n_q, n_kv = query.shape[-2], key.shape[-2]
    args = (query, key, value, is_causal, block_size)
    wrong = {
        "forgets to rescale the running OUTPUT when the maximum grows: the accumulated "
        "sum of exp(s - m_old) * v must be multiplied by exp(m_old - m_new), exactly like the "
        "running sum, before the new tile is added":
            _tiled_variant(*args, rescale_acc=False),
        "forgets to rescale the running SUM when the maximum grows: multiply it by "
        "exp(m_old - m_new) before adding the new tile's exp(s - m_new).sum(-1)":
            _tiled_variant(*args, rescale_sum=False),
        "rescales neither the running sum nor the running output when the maximum grows: "
        "both were computed under the old maximum and must be multiplied by "
        "exp(m_old - m_new)": _tiled_variant(*args, rescale_acc=False, rescale_sum=False),
        "does not scale the scores: multiply query @ key^T by 1/sqrt(d_k)":
            _tiled_variant(*args, scale=1.0),
    }
    if d_v != d_k:
        wrong[f"scales by 1/sqrt(d_v) = 1/sqrt({d_v}); the scale is 1/sqrt(d_k) = "
              f"1/sqrt({d_k}), the size of the query and key vectors"] = (
            _tiled_variant(*args, scale=1.0 / math.sqrt(d_v)))
    if is_causal:
        wrong["ignores is_causal=True: query i must not see keys j > i (hide them with -inf "
              "before the running maximum)"] = _tiled_variant(query, key, value, False,
                                                               block_size)
        if n_q != n_kv:
            wrong["aligns the causal mask at the bottom-right corner (query i sees keys up to "
                  "i + num_tokens_kv - num_tokens_q); is_causal=True here means the top-left "
                  "alignment of torch.nn.functional.scaled_dot_product_attention and "
                  "attnlib.causal_mask: query i sees keys j <= i"] = _tiled_variant(
                *args, causal_offset=n_kv - n_q)
    return wrong


def _reference_attention(query, key, value, is_causal):
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
    along the sequence (so the running maximum grows from tile to tile), and
    large scores (which overflow without the running maximum).

    Recognised mistakes: no rescale of the running output, of the running sum,
    or of both, when the maximum grows; no ``1/sqrt(d_k)`` scale, or
    ``1/sqrt(d_v)``; ``is_causal`` ignored; the causal mask aligned at the
    bottom-right; overflow; changing an input in place.

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
    name = _name(fn, "fn")
    gen = torch.Generator().manual_seed(2205)

    def probe_tensors(n_q: int, n_kv: int, big: float = 1.0):
        query = torch.randn(2, 3, n_q, 5, generator=gen, dtype=_DTYPE)
        key = torch.randn(2, 3, n_kv, 5, generator=gen, dtype=_DTYPE)
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
        expected = _reference_attention(query, key, value, is_causal)
        if is_close(out, expected):
            continue
        mistake = name_wrong_answer(
            out, _flash_wrong_answers(query, key, value, is_causal, block_size))
        if mistake is not None:
            raise CheckFailed(f"{what} on {probe} {mistake}.")
        if _overflowed(out, expected):
            raise CheckFailed(
                f"{what} on {probe} gives inf or nan: exp of large scores overflows. Keep a "
                "running maximum per query and subtract it inside every exp.")
        raise CheckFailed(
            f"{what} on {probe} differs from softmax(q k^T / sqrt(d_k)) v by up to "
            f"{max_difference(out, expected):.3g}. Compare with "
            "attnlib.functional.flash_attention(query, key, value, is_causal, "
            "block_size=...) on a small input, tile by tile.")
    return passed(f"{name} matches attention for 4 block sizes, N_q != N_kv both ways, causal "
                  "and not, with growing and with large scores.")
