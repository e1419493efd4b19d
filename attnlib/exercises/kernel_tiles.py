"""Checkers for chapter 11's exercises on a kernel's tiles: how large they may be, which
tiles run how, and which key/value head a query head reads.

* :func:`check_block_size` - ``fn(head_dim, element_size, num_stages,
  shared_memory_bytes)`` returns the largest power-of-two block whose forward-pass
  tiles fit in shared memory, or None when none does.
* :func:`check_causal_stages` - ``fn(start_m, block_m, block_n, num_tokens_kv)``
  returns ``(unmasked_stop, masked_stop)``, the bounds of the causal forward's two
  stages for one block of queries: key tiles ``range(0, unmasked_stop, block_n)``
  run without a mask, ``range(unmasked_stop, masked_stop, block_n)`` with it, and
  the tiles from ``masked_stop`` on are skipped.
* :func:`check_kv_pair` - ``fn(bh, num_heads, num_kv_groups)`` returns the
  (batch, key/value head) pair that the (batch, query head) pair ``bh`` reads in
  grouped-query attention: the kernels' ``kv_bh``.

All three are plain Python functions of integers, checked against the chapter's count
of the tiles' bytes, against the mask itself (every tile of each stage is classified
from the causal mask) and, for the grouped heads, against
``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa=True``. No
message states the answer: each names what the answer did and the section of chapter
11 that shows the step.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import type_name
from ._common import CheckFailed, answer_name, call_answer, checker, passed, require_callable

__all__ = ["check_block_size", "check_causal_stages", "check_kv_pair"]

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


# ---------------------------------------------------------------------------------------
# a block size that fits shared memory


_BLOCKS = (16, 32, 64, 128, 256)
_BLOCKS_SECTION = "'Block sizes, warps and stages'"


def _largest_block(head_dim: int, element_size: int, num_stages: int,
                   shared_memory_bytes: int, *, q_tiles: str = "once", kv_tiles: int = 2,
                   stages: bool = True, scale: int = 1, strict: bool = False,
                   powers_of_two: bool = True) -> int | None:
    """The largest block B (B_M = B_N = B) whose tiles fit, by the chapter's model
    ``element_size * head_dim * (B + num_stages * 2 * B)`` bytes, or by one slip of it.

    The slips: ``q_tiles`` ``"none"`` or ``"per_stage"`` (the Q tile left out, or
    counted once per stage); ``kv_tiles=1`` (K counted, V not); ``stages=False``
    (one K and one V tile whatever ``num_stages``); ``scale=8`` (bits, not bytes);
    ``strict`` (``<`` instead of ``<=``); ``powers_of_two=False`` (the largest
    integer B that fits).
    """
    q_rows = {"once": 1, "none": 0, "per_stage": num_stages}[q_tiles]
    rows_per_b = q_rows + (num_stages if stages else 1) * kv_tiles
    bytes_per_b = scale * element_size * head_dim * rows_per_b  # bytes of the tiles per B

    def fits(block: int) -> bool:
        used = block * bytes_per_b
        return used < shared_memory_bytes if strict else used <= shared_memory_bytes

    candidates = _BLOCKS if powers_of_two else range(1, shared_memory_bytes // bytes_per_b + 1)
    fitting = [block for block in candidates if fits(block)]
    return max(fitting) if fitting else None


#: (head_dim, element_size, num_stages, shared_memory_bytes) of each probe. 232448
#: bytes (227 KiB) is what one program may use on an H100; 229376 is exactly the
#: tiles of B = 128 at head_dim 128, bfloat16, 3 stages; at 73728 B = 128 fits only
#: without its Q tile.
_BLOCK_PROBES = (
    (64, 2, 3, 232448),
    (128, 2, 3, 232448),
    (128, 2, 4, 232448),
    (128, 4, 3, 232448),
    (64, 2, 2, 73728),
    (128, 2, 3, 229376),
    (32, 2, 1, 6144),
    (128, 4, 4, 32768),
)


def _block_wrong_answers() -> list[tuple[str, list[int | None]]]:
    """(message, the answers of that mistake on every probe)."""
    see = f"See the count in {_BLOCKS_SECTION}"
    variants: list[tuple[str, dict[str, Any]]] = [
        ("counts one K tile and one V tile, whatever num_stages is: each stage in flight "
         f"has buffers of its own. {see}", {"stages": False}),
        (f"counts the K tiles but not the V tiles: each stage holds a tile of each. {see}",
         {"kv_tiles": 1}),
        ("leaves out the Q tile, which the program keeps in shared memory for its whole "
         f"loop. {see}", {"q_tiles": "none"}),
        ("multiplies the Q tile by num_stages too: Q is loaded once, before the loop, "
         f"and only K and V are multi-buffered. {see}", {"q_tiles": "per_stage"}),
        ("counts bits, not bytes: element_size is already in bytes (2 for bfloat16, 4 "
         "for float32)", {"scale": 8}),
        ("rejects a block whose tiles fill shared memory exactly: a block fits when its "
         "tiles take no more than shared_memory_bytes, equality included", {"strict": True}),
        ("returns a block size that is not a power of two: tl.arange(0, BLOCK) needs a "
         "power of two, so the exercise lets you choose among 16, 32, 64, 128 and 256",
         {"powers_of_two": False}),
    ]
    return [(message, [_largest_block(*probe, **slip) for probe in _BLOCK_PROBES])
            for message, slip in variants]


@checker
def check_block_size(fn: Callable[[int, int, int, int], int | None]) -> bool:
    """Check a learner's ``fn(head_dim, element_size, num_stages, shared_memory_bytes)``.

    ``fn`` must return the largest block ``B`` among 16, 32, 64, 128 and 256
    (a power of two, as ``tl.arange`` needs; ``B_M = B_N = B``) for which the
    forward kernel's tiles fit in ``shared_memory_bytes``, or ``None`` when
    none does. The chapter's model, which Triton's compiler matched byte for
    byte: one Q tile and ``num_stages`` K tiles and ``num_stages`` V tiles,
    ``element_size * head_dim * (B + 2 * num_stages * B)`` bytes. The probes
    cover bfloat16 and float32, 1 to 4 stages, head_dim 32 to 128, the 227 KiB
    a program may use on an H100, a limit met exactly, and one where nothing
    fits.

    Recognised mistakes: the stages forgotten; the V tiles forgotten; the Q
    tile forgotten, or counted once per stage; bits instead of bytes; ``<``
    instead of ``<=``; a block that is not a power of two; a result that is not
    an integer or None. Any integer type is accepted (``int``, a NumPy
    integer, a one-element integer tensor). The message for an unknown
    mistake says whether the block is too large or too small, not which it is.

    Args:
        fn: the learner's function, called with four ints.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than an integer or None, or computes another block; the message names
            the mistake where it is a typical one.

    Source: Triton 2's ``triton.ops.matmul``, which discarded configurations
    by shared memory, ``(BLOCK_M + BLOCK_N) * BLOCK_K * num_stages *
    element_size``; NVIDIA's Hopper tuning guide (227 KB per thread block);
    chapter 11, where Triton's compiler confirms the count for the forward
    kernel byte for byte.
    """
    require_callable(fn, "a function fn(head_dim, element_size, num_stages, "
                         "shared_memory_bytes)")
    name = answer_name(fn, "fn")
    answers: list[int | None] = []
    for probe in _BLOCK_PROBES:
        what = (f"{name}(head_dim={probe[0]}, element_size={probe[1]}, "
                f"num_stages={probe[2]}, shared_memory_bytes={probe[3]})")
        answers.append(_block_answer(call_answer(fn, *probe, what=what), what))
    expected = [_largest_block(*probe) for probe in _BLOCK_PROBES]
    if answers == expected:
        return passed(f"{name} picks the largest block that fits for 8 settings, bfloat16 "
                      "and float32, 1 to 4 stages, and says None when none fits.")
    for message, wrong in _block_wrong_answers():
        if answers == wrong:
            raise CheckFailed(f"{name} {message}.")
    first = next(i for i, (a, e) in enumerate(zip(answers, expected, strict=True)) if a != e)
    head_dim, element_size, num_stages, limit = _BLOCK_PROBES[first]
    got, right = answers[first], expected[first]
    if got is None:
        verdict = "but a block among 16, 32, 64, 128 and 256 fits there"
    elif got not in _BLOCKS:
        verdict = "which is not one of the blocks 16, 32, 64, 128 and 256"
    elif right is None or got > right:
        verdict = "but the tiles of that block do not fit there"
    else:
        verdict = "but a larger block still fits there"
    raise CheckFailed(
        f"{name}(head_dim={head_dim}, element_size={element_size}, num_stages={num_stages}, "
        f"shared_memory_bytes={limit}) returned {got!r}, {verdict}; the answers match none "
        "of the typical mistakes this check knows. Count the bytes of the tiles as "
        f"{_BLOCKS_SECTION} does, for each block, and print them beside "
        "shared_memory_bytes.")


def _block_answer(out: object, what: str) -> int | None:
    """The learner's block as an int: any integer type (int, a NumPy integer, an integer
    tensor of one element) or None; a float, a bool or anything else is a CheckFailed."""
    if isinstance(out, torch.Tensor) and out.numel() == 1 and not (
            out.is_floating_point() or out.is_complex() or out.dtype == torch.bool):
        return int(out)
    if out is None:
        return None
    if not isinstance(out, torch.Tensor) and type(out).__name__ not in ("bool", "bool_"):
        try:
            return operator.index(out)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise CheckFailed(
        f"{what} returned {type_name(out)} {out!r:.40}; expected an integer, the block "
        "size (such as 64), or None when no block fits.")
