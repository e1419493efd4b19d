"""Checkers for chapter 11's exercises on the grown-up kernel: which tiles run how, and
which key/value head a query head reads.

* :func:`check_causal_stages` - ``fn(start_m, block_m, block_n, num_tokens_kv)``
  returns ``(unmasked_stop, masked_stop)``, the bounds of the causal forward's two
  stages for one block of queries: key tiles ``range(0, unmasked_stop, block_n)``
  run without a mask, ``range(unmasked_stop, masked_stop, block_n)`` with it, and
  the tiles from ``masked_stop`` on are skipped.
* :func:`check_kv_pair` - ``fn(bh, num_heads, num_kv_groups)`` returns the
  (batch, key/value head) pair that the (batch, query head) pair ``bh`` reads in
  grouped-query attention: the kernels' ``kv_bh``.

Both are plain Python functions of integers, checked against the mask itself
(every tile of each stage is classified from the causal mask) and, for the
grouped heads, against ``torch.nn.functional.scaled_dot_product_attention`` with
``enable_gqa=True``. No message states the answer: each names what the answer
did and the section of chapter 11 that shows the step.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._validation import type_name
from ._common import CheckFailed, answer_name, call_answer, checker, passed, require_callable

__all__ = ["check_causal_stages", "check_kv_pair"]

_STAGES_SECTION = "chapter 11, section \"The kernel grows up\", the two causal stages"
_GQA_SECTION = "chapter 11, section \"The kernel grows up\", grouped-query heads"

#: (start_m, block_m, block_n, num_tokens_kv): square and unequal blocks, a last
#: partial key tile, more queries than keys (blocks past the keys' end), one key.
_STAGE_PROBES = tuple(
    (start_m, block_m, block_n, n_kv)
    for block_m, block_n, n_kv, n_q in ((64, 64, 256, 256), (32, 64, 200, 200),
                                        (64, 16, 100, 160), (16, 32, 77, 128),
                                        (32, 32, 1, 64))
    for start_m in range(0, n_q, block_m)
)


def _int(value: object, what: str) -> int:
    """``value`` as an int (Python, NumPy or a one-element integer tensor), else CheckFailed."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        return int(value.item())
    if isinstance(value, bool):
        raise CheckFailed(f"{what} returned the bool {value}, not an integer.")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # refused below if not
    except TypeError:
        raise CheckFailed(
            f"{what} returned {type_name(value)} {value!r:.60}, not an integer."
        ) from None


def _stage_answer(fn: Callable[..., object], probe: tuple[int, int, int, int],
                  name: str) -> tuple[int, int, str]:
    start_m, block_m, block_n, n_kv = probe
    what = (f"{name}(start_m={start_m}, block_m={block_m}, block_n={block_n}, "
            f"num_tokens_kv={n_kv})")
    answer = call_answer(fn, *probe, what=what)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise CheckFailed(
            f"{what} returned {type_name(answer)} {answer!r:.60}: expected a pair "
            "(unmasked_stop, masked_stop)."
        )
    return _int(answer[0], what), _int(answer[1], what), what


def _judge_stages(unmasked_stop: int, masked_stop: int, probe: tuple[int, int, int, int],
                  what: str) -> None:
    """CheckFailed naming the first thing wrong with the two stages of one query block."""
    start_m, block_m, block_n, n_kv = probe
    first_query, last_query = start_m, start_m + block_m - 1
    where = f"See {_STAGES_SECTION}."
    if unmasked_stop < 0 or unmasked_stop % block_n:
        raise CheckFailed(
            f"{what} gave unmasked_stop={unmasked_stop}, not a multiple of "
            f"block_n={block_n} from 0: the masked stage would start inside a tile, and its "
            f"tiles would not be the unmasked stage's neighbours. {where}"
        )
    for start_n in range(0, unmasked_stop, block_n):
        last_key = start_n + block_n - 1
        if last_key >= n_kv:
            raise CheckFailed(
                f"{what} runs the key tile {start_n}..{last_key} without a mask, but "
                f"there are only {n_kv} keys: the unmasked stage must stop before the "
                f"last, partial tile, whose loads need the mask. {where}"
            )
        if last_key > first_query:
            raise CheckFailed(
                f"{what} runs the key tile {start_n}..{last_key} without a mask, but "
                f"query {first_query}, the block's first, may not see key {last_key}: "
                f"that tile is cut by the causal diagonal. {where}"
            )
    for start_n in range(unmasked_stop, masked_stop, block_n):
        if start_n >= n_kv:
            raise CheckFailed(
                f"{what} loads the key tile starting at {start_n}, past the last of the "
                f"{n_kv} keys: the masked stage must end at the last key. {where}"
            )
        if start_n > last_query:
            raise CheckFailed(
                f"{what} loads the key tile {start_n}..{start_n + block_n - 1}, above the "
                f"diagonal: no query of the block ({first_query}..{last_query}) sees "
                f"any of its keys, so it should be skipped. {where}"
            )
    covered: set[int] = set()  # the keys of every tile either stage loads
    for start_n in [*range(0, unmasked_stop, block_n),
                    *range(unmasked_stop, masked_stop, block_n)]:
        covered.update(range(start_n, start_n + block_n))
    missing = [j for j in range(min(last_query + 1, n_kv)) if j not in covered]
    if missing:
        raise CheckFailed(
            f"{what} skips key {missing[0]}, which query {max(missing[0], first_query)} "
            f"of the block sees: the masked stage must reach the diagonal's last tile. "
            f"{where}"
        )
    full_stop = min(first_query + 1, n_kv) // block_n * block_n  # tiles fully seen
    if unmasked_stop < full_stop:
        raise CheckFailed(
            f"{what} masks the key tile {unmasked_stop}..{unmasked_stop + block_n - 1}, "
            f"which every query of the block sees in full: it is right, but the point of "
            f"the two stages is to run such tiles without the mask. {where}"
        )


@checker
def check_causal_stages(fn: Callable[[int, int, int, int], tuple[int, int]]) -> bool:
    """Check a learner's two-stage causal loop bounds for one block of queries.

    ``fn(start_m, block_m, block_n, num_tokens_kv)`` must return
    ``(unmasked_stop, masked_stop)`` for the queries ``start_m`` to
    ``start_m + block_m - 1`` of causal attention aligned at the top-left
    (query ``i`` sees keys ``j <= i``), with key tiles starting at multiples of
    ``block_n``: the tiles of ``range(0, unmasked_stop, block_n)`` must each be
    seen in full by every query of the block and lie wholly before the last
    key (they run without a mask); ``range(unmasked_stop, masked_stop,
    block_n)`` must hold every other tile that any query of the block sees, and
    no tile that none sees (they run with the mask); the rest are skipped. The
    probes cover square and unequal blocks, a last partial key tile, more
    queries than keys and a single key.

    Recognised mistakes: a diagonal tile run without the mask; the last,
    partial tile run without it; a tile above the diagonal loaded; a tile
    past the last key loaded; keys the block sees skipped; a fully seen tile
    left in the masked stage; an unmasked stop that is not a multiple of
    ``block_n``; a result that is not a pair of integers (NumPy integers and
    one-element integer tensors are accepted).

    Args:
        fn: the learner's function, called with four ints.

    Returns:
        True, after printing one line, when every probe is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than a pair of integers, or gets a stage wrong; the message names
            the tile and what is wrong with it.

    Source: Triton's fused-attention tutorial (``06-fused-attention.py``): the
    causal forward's ``STAGE`` 1 (off-diagonal tiles, no mask) and 2 (the
    diagonal block, masked); Dao (2023), "FlashAttention-2", Section 3.1.1
    (blocks above the diagonal skipped).
    """
    require_callable(fn, "a function fn(start_m, block_m, block_n, num_tokens_kv)")
    name = answer_name(fn, "fn")
    for probe in _STAGE_PROBES:
        unmasked_stop, masked_stop, what = _stage_answer(fn, probe, name)
        _judge_stages(unmasked_stop, masked_stop, probe, what)
    return passed(f"{name} runs every tile below the diagonal unmasked, masks only the "
                  f"diagonal and the last partial tile, and skips the rest, for "
                  f"{len(_STAGE_PROBES)} query blocks.")


# --- grouped-query heads -------------------------------------------------------------------

#: (batch, num_heads, num_kv_groups): groups of 4 and 2, one key head (MQA), none grouped.
_GQA_PROBES = ((2, 8, 2), (3, 6, 3), (2, 4, 1), (2, 4, 4), (1, 12, 4))


def _gqa_wrong(bh: int, batch: int, num_heads: int, num_kv_groups: int) -> dict[str, int]:
    group = num_heads // num_kv_groups
    b, h = divmod(bh, num_heads)
    return {
        "pairs query heads with key heads round-robin (head h reads key head "
        "h % num_kv_groups), as torch.Tensor.repeat would lay them out; SDPA's "
        "enable_gqa=True and repeat_interleave give each key head consecutive "
        "query heads": b * num_kv_groups + h % num_kv_groups,
        "forgets the batch: every sequence reads the key and value heads of the "
        "first sequence": h // group,
        "divides by num_kv_groups, the number of key heads, where the group's size "
        "is num_heads // num_kv_groups": bh // num_kv_groups,
        "reads as if there were as many key heads as query heads": bh,
    }


@checker
def check_kv_pair(fn: Callable[[int, int, int], int]) -> bool:
    """Check a learner's grouped-query indexing: the key/value pair of a query pair.

    ``fn(bh, num_heads, num_kv_groups)`` must return the index ``kv_bh`` of the
    (batch, key/value head) pair that the (batch, query head) pair
    ``bh = b * num_heads + h`` reads, in tensors laid out
    ``(batch, heads, ...)``: consecutive query heads share a key/value head,
    as ``repeat_interleave`` and SDPA's ``enable_gqa=True`` pair them. The
    checker compares every pair of five shapes (groups of 4, 3 and 2, one key
    head, none grouped), then computes attention with the learner's pairing
    and compares it with ``scaled_dot_product_attention(..., enable_gqa=True)``.

    Recognised mistakes: round-robin pairing (``h % num_kv_groups``, as
    ``repeat`` would give); the batch forgotten; a division by the number of
    key heads instead of the group size; no mapping at all; an index out of
    range; a result that is not an integer (NumPy integers and one-element
    integer tensors are accepted).

    Args:
        fn: the learner's function, called with three ints.

    Returns:
        True, after printing one line, when every pair is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than an integer, or pairs a query head with the wrong key head; the
            message names the mistake where it is a typical one.

    Source: Ainslie et al. (2023), "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints", Section 2; PyTorch's
    ``scaled_dot_product_attention(..., enable_gqa=True)``.
    """
    require_callable(fn, "a function fn(bh, num_heads, num_kv_groups)")
    name = answer_name(fn, "fn")
    where = f"See {_GQA_SECTION}."
    for batch, num_heads, num_kv_groups in _GQA_PROBES:
        answers, expected = [], []
        for bh in range(batch * num_heads):
            what = f"{name}(bh={bh}, num_heads={num_heads}, num_kv_groups={num_kv_groups})"
            answers.append(_int(call_answer(fn, bh, num_heads, num_kv_groups, what=what),
                                what))
            expected.append(bh // (num_heads // num_kv_groups))
        if answers == expected:
            continue
        shape = f"batch={batch}, num_heads={num_heads}, num_kv_groups={num_kv_groups}"
        for message in _gqa_wrong(0, batch, num_heads, num_kv_groups):
            wrong = [_gqa_wrong(bh, batch, num_heads, num_kv_groups)[message]
                     for bh in range(batch * num_heads)]
            if answers == wrong:
                raise CheckFailed(f"{name} {message} ({shape}). {where}")
        for bh, got in enumerate(answers):
            if not 0 <= got < batch * num_kv_groups:
                raise CheckFailed(
                    f"{name}(bh={bh}, num_heads={num_heads}, num_kv_groups="
                    f"{num_kv_groups}) returned {got}, but with batch={batch} there are "
                    f"only {batch * num_kv_groups} key/value pairs (0 to "
                    f"{batch * num_kv_groups - 1}). {where}"
                )
        bh = next(i for i, (a, e) in enumerate(zip(answers, expected, strict=True)) if a != e)
        raise CheckFailed(
            f"{name}(bh={bh}, num_heads={num_heads}, num_kv_groups={num_kv_groups}) "
            f"returned {answers[bh]}: query head {bh % num_heads} of sequence "
            f"{bh // num_heads} does not read that key/value pair. {where}"
        )
    _attention_agrees(fn, name)
    return passed(f"{name} pairs every query head with its key/value head for "
                  f"{len(_GQA_PROBES)} shapes, and attention with it equals SDPA's "
                  "enable_gqa=True.")


def _attention_agrees(fn: Callable[[int, int, int], int], name: str) -> None:
    """Attention computed pair by pair with fn's pairing equals SDPA with enable_gqa."""
    gen = torch.Generator().manual_seed(30)
    batch, num_heads, num_kv_groups = 2, 6, 2
    query = torch.randn(batch, num_heads, 5, 8, generator=gen, dtype=torch.float64)
    key, value = (torch.randn(batch, num_kv_groups, 7, 8, generator=gen, dtype=torch.float64)
                  for _ in range(2))
    q_pairs = query.reshape(batch * num_heads, 5, 8)  # (b * num_heads, N_q, d)
    k_pairs = key.reshape(batch * num_kv_groups, 7, 8)  # (b * num_kv_groups, N_kv, d)
    v_pairs = value.reshape(batch * num_kv_groups, 7, 8)
    rows = [_int(fn(bh, num_heads, num_kv_groups), name) for bh in range(batch * num_heads)]
    ours = torch.stack([
        torch.softmax(q_pairs[bh] @ k_pairs[kv].T / 8**0.5, dim=-1) @ v_pairs[kv]
        for bh, kv in enumerate(rows)
    ]).reshape(batch, num_heads, 5, 8)  # (b, num_heads, N_q, d)
    theirs = F.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    if not torch.allclose(ours, theirs, rtol=1e-10, atol=1e-10):  # pragma: no cover
        raise CheckFailed(f"attention with {name}'s pairing differs from SDPA's "
                          f"enable_gqa=True. See {_GQA_SECTION}.")
