"""The ring's schedule: which key/value block is where at each step, and what a rank computes
with it and sends (see :mod:`attnlib.distributed`)."""

from __future__ import annotations

from typing import NamedTuple

from .._validation import (
    check_bool,
    check_positive_int,
)
from ._sharding import _check_layout

# ---------------------------------------------------------------------------------------
# The schedule: which block is where, and what a rank computes with it


class RingStep(NamedTuple):
    """What one rank does at one step of the ring.

    ``source``: the rank whose key/value block it holds. ``kind``: ``"full"`` (every
    query against every key), ``"diagonal"`` (its own block, causal mask inside),
    ``"skip"`` (every key is in every query's future), ``"early keys"`` (every query
    against the first half of the block's keys) or ``"late queries"`` (the second half
    of the queries against every key). ``work``: the fraction of an ``(n, n)`` block of
    scores computed, 1, 0.5 or 0.
    """

    source: int
    kind: str
    work: float


_WORK = {"full": 1.0, "diagonal": 1.0, "skip": 0.0, "early keys": 0.5, "late queries": 0.5}


def _step_kind(rank: int, source: int, is_causal: bool, layout: str) -> str:
    if source == rank:
        return "diagonal" if is_causal else "full"
    if not is_causal:
        return "full"
    if layout == "contiguous":
        return "full" if source < rank else "skip"
    # Zigzag: an earlier rank's early chunk precedes both of ours and its late chunk
    # follows both; a later rank's two chunks both lie between our two.
    return "early keys" if source < rank else "late queries"


def ring_schedule(world_size: int, is_causal: bool = True,
                  layout: str = "contiguous") -> list[list[RingStep]]:
    """For each rank and step, which block it holds and how much of it it computes.

    At step ``s`` rank ``r`` holds the key/value block of rank ``(r - s) mod P``: blocks
    move one rank forward per step. Summing ``work`` over the steps gives the causal
    imbalance: ``[1, 2, ..., P]`` blocks for ``"contiguous"``, ``(P + 1) / 2`` for every
    rank with ``"zigzag"``; without a mask every rank computes ``P``.

    Returns:
        ``schedule[rank][step]``, a :class:`RingStep`.

    Raises:
        TypeError: ``world_size`` is not an int, ``is_causal`` not a bool, ``layout`` not
            a str.
        ValueError: ``world_size < 1``; unknown ``layout``.

    Source: Liu et al. (2023), section 3; Brandon et al. (2023), arXiv:2311.09431 (the
    causal workload); ring-flash-attention's ``zigzag_ring_flash_attn_forward``.
    """
    world_size = check_positive_int("world_size", world_size)
    is_causal = check_bool("is_causal", is_causal)
    layout = _check_layout(layout)
    schedule = []
    for rank in range(world_size):
        row = []
        for step in range(world_size):
            source = (rank - step) % world_size
            kind = _step_kind(rank, source, is_causal, layout)
            row.append(RingStep(source, kind, _WORK[kind]))
        schedule.append(row)
    return schedule


def _step_slices(kind: str, n: int) -> tuple[slice, slice, bool]:
    """(query rows, key rows, causal mask inside) of one step's computation."""
    half = n // 2
    return {"full": (slice(0, n), slice(0, n), False),
            "diagonal": (slice(0, n), slice(0, n), True),
            "early keys": (slice(0, n), slice(0, half), False),
            "late queries": (slice(half, n), slice(0, n), False)}[kind]


def ring_bytes_per_rank(num_tokens: int, world_size: int, *, batch: int = 1,
                        num_heads: int = 1, head_dim: int = 64, bytes_per_number: int = 4,
                        backward: bool = False) -> int:
    """Bytes one rank sends in one :func:`ring_attention` call: the formula.

    A key or value block holds ``batch * num_heads * (num_tokens / P) * head_dim``
    numbers. The forward pass sends its key and value blocks on ``P - 1`` hops:
    ``2 (P - 1)`` blocks. The backward pass sends them again (``2 (P - 1)``) and the
    gradients of the visiting blocks on ``P - 1`` hops (``2 (P - 1)``), so
    ``4 (P - 1)`` blocks. Independent of the layout and of the mask.

    Args:
        num_tokens: ``N``, the whole sequence; world_size: ``P``.
        batch, num_heads, head_dim: the shards' other sizes (keys and values alike).
        bytes_per_number: 4 for float32, 2 for bfloat16, 8 for float64.
        backward: the backward pass's bytes instead of the forward's.

    Returns:
        Bytes as an int; 0 for ``P = 1``.

    Raises:
        TypeError: an argument is not an int (``backward`` not a bool).
        ValueError: a size is below 1, or ``num_tokens`` is not divisible by ``P``.

    Source: Liu et al. (2023), section 3 (each device sends its key/value block on).
    """
    sizes = {"num_tokens": num_tokens, "world_size": world_size, "batch": batch,
             "num_heads": num_heads, "head_dim": head_dim, "bytes_per_number": bytes_per_number}
    sizes = {name: check_positive_int(name, value) for name, value in sizes.items()}
    backward = check_bool("backward", backward)
    p = sizes["world_size"]
    if sizes["num_tokens"] % p:
        raise ValueError(f"num_tokens={num_tokens} is not divisible by world_size={p}")
    block = (sizes["batch"] * sizes["num_heads"] * (sizes["num_tokens"] // p)
             * sizes["head_dim"] * sizes["bytes_per_number"])
    return (4 if backward else 2) * (p - 1) * block
