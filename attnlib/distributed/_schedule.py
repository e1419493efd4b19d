"""The ring's schedule: which key/value block is where at each step, and what a rank computes
with it and sends (see :mod:`attnlib.distributed`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validation import (
    check_bool,
    check_positive_int,
)
from ..flash import compute_dtype
from ._sharding import check_layout

# ---------------------------------------------------------------------------------------
# The schedule: which block is where, and what a rank computes with it


class RingStep(NamedTuple):
    """What one rank does at one step of the ring.

    ``source``: the rank whose key/value block it holds. ``kind``: ``"full"`` (every
    query against every key), ``"diagonal"`` (its own block, causal mask inside),
    ``"skip"`` (every key is in every query's future), ``"early keys"`` (every query
    against the first half of the block's keys) or ``"late queries"`` (the second half
    of the queries against every key). ``work``: the step's scores in ``(n, n)`` blocks,
    counted in half blocks: 1, 0.5 or 0. A diagonal step counts 0.5: its causal mask
    leaves ``n (n + 1) / 2`` of the ``n^2`` scores, ``(n + 1) / (2 n)`` of a block, which
    is a half block plus ``n / 2`` scores; :meth:`scores` gives the exact count.
    """

    source: int
    kind: str
    work: float

    def scores(self, tokens_per_rank: int) -> int:
        """The scores (query-key pairs, per batch element and head) this step computes.

        Counted from the step's slices and mask for ``n = tokens_per_rank`` tokens per
        rank: ``n^2`` for ``"full"``, ``n (n + 1) / 2`` for ``"diagonal"`` (the lower
        triangle with its diagonal), ``n * (n // 2)`` and ``(n - n // 2) * n`` for the
        two half steps, 0 for ``"skip"``.

        Raises:
            TypeError: ``tokens_per_rank`` is not an int.
            ValueError: ``tokens_per_rank < 1``.
        """
        rows, cols, causal = self.slices(tokens_per_rank)
        num_rows, num_cols = int(rows.stop - rows.start), int(cols.stop - cols.start)
        return num_rows * (num_rows + 1) // 2 if causal else num_rows * num_cols

    def slices(self, tokens_per_rank: int) -> tuple[slice, slice, bool]:
        """``(query rows, key rows, causal)``: what this step computes, for ``n =
        tokens_per_rank`` tokens per rank, as slices of the local queries and of the
        visiting key/value block, and whether the causal mask (top-left) applies inside.

        ``"full"`` and ``"diagonal"``: every row of both (the diagonal with the mask);
        ``"early keys"``: every query, keys ``0 .. n // 2 - 1``; ``"late queries"``:
        queries ``n // 2 .. n - 1``, every key; ``"skip"``: empty slices.

        Raises:
            TypeError: ``tokens_per_rank`` is not an int.
            ValueError: ``tokens_per_rank < 1``.
        """
        n = check_positive_int("tokens_per_rank", tokens_per_rank)
        half = n // 2
        return {"full": (slice(0, n), slice(0, n), False),
                "diagonal": (slice(0, n), slice(0, n), True),
                "early keys": (slice(0, n), slice(0, half), False),
                "late queries": (slice(half, n), slice(0, n), False),
                "skip": (slice(0, 0), slice(0, 0), False)}[self.kind]


# In half blocks: a diagonal step computes (n + 1) / (2 n) of a block, 0.5 as n grows.
_WORK = {"full": 1.0, "diagonal": 0.5, "skip": 0.0, "early keys": 0.5, "late queries": 0.5}


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
    imbalance in half blocks: rank ``r`` computes ``r + 1/2`` blocks with
    ``"contiguous"`` (``1/2, 3/2, ..., P - 1/2``), every rank ``P / 2`` with
    ``"zigzag"``, ``P^2 / 2`` in all for both; without a mask every rank computes ``P``.
    Each diagonal step computes ``n / 2`` scores more than its half block
    (:meth:`RingStep.scores` counts them exactly for ``n`` tokens per rank).

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
    layout = check_layout(layout)
    schedule = []
    for rank in range(world_size):
        row = []
        for step in range(world_size):
            source = (rank - step) % world_size
            kind = _step_kind(rank, source, is_causal, layout)
            row.append(RingStep(source, kind, _WORK[kind]))
        schedule.append(row)
    return schedule


def _check_dtype(name: str, dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def ring_bytes_per_rank(num_tokens: int, world_size: int, *, batch: int = 1,
                        num_heads: int = 1, head_dim: int = 64,
                        value_head_dim: int | None = None,
                        dtype: torch.dtype = torch.float32,
                        grad_dtype: torch.dtype | None = None,
                        backward: bool = False) -> int:
    """Bytes one rank sends in one :func:`ring_attention` call: the formula.

    With ``n = num_tokens / P`` tokens per rank, a key block holds
    ``batch * num_heads * n * head_dim`` numbers and a value block
    ``batch * num_heads * n * value_head_dim``. The forward pass sends its key and value
    blocks on ``P - 1`` hops, in ``dtype``. The backward pass sends them again (``P - 1``
    hops, ``dtype``) and, on ``P - 1`` hops, the gradients of the visiting key and value
    blocks, which travel in ``grad_dtype``: float32 for float16 and bfloat16 inputs
    (the dtype :func:`ring_attention` computes in). When ``grad_dtype`` is ``dtype`` that
    is ``2 (P - 1)`` key-and-value pairs of blocks, twice the forward's; with bfloat16
    inputs it is three times the forward's (``6 (P - 1)`` bfloat16-sized blocks of keys
    or values), since each gradient block is twice the size of a bfloat16 block.
    Independent of the layout and of the mask.

    Args:
        num_tokens: ``N``, the whole sequence; world_size: ``P``.
        batch, num_heads: the shards' other sizes.
        head_dim: ``d_k``, the size of a query and key vector.
        value_head_dim: ``d_v``, the size of a value vector; default ``head_dim``.
        dtype: the dtype of ``query``, ``key`` and ``value``; default float32.
        grad_dtype: the dtype of the travelling gradients; default what
            :func:`ring_attention` uses: float32 for float16 and bfloat16, else ``dtype``.
        backward: the backward pass's bytes instead of the forward's.

    Returns:
        Bytes as an int; 0 for ``P = 1``.

    Raises:
        TypeError: a size is not an int, ``backward`` not a bool, a dtype not a
            floating-point ``torch.dtype``.
        ValueError: a size is below 1, or ``num_tokens`` is not divisible by ``P``.

    Source: Liu et al. (2023), section 3 (each device sends its key/value block on); the
    backward's gradient ring as in ring-flash-attention's ``ring_flash_attn_backward``
    (each visiting block's gradient is passed on with it).
    """
    if value_head_dim is None:
        value_head_dim = head_dim
    sizes = {"num_tokens": num_tokens, "world_size": world_size, "batch": batch,
             "num_heads": num_heads, "head_dim": head_dim, "value_head_dim": value_head_dim}
    sizes = {name: check_positive_int(name, value) for name, value in sizes.items()}
    dtype = _check_dtype("dtype", dtype)
    grad_dtype = compute_dtype(dtype) if grad_dtype is None else _check_dtype(
        "grad_dtype", grad_dtype)
    backward = check_bool("backward", backward)
    p = sizes["world_size"]
    if sizes["num_tokens"] % p:
        raise ValueError(f"num_tokens={num_tokens} is not divisible by world_size={p}")
    # Numbers in one key block plus one value block.
    key_and_value = (sizes["batch"] * sizes["num_heads"] * (sizes["num_tokens"] // p)
                     * (sizes["head_dim"] + sizes["value_head_dim"]))
    bytes_per_hop = key_and_value * dtype.itemsize
    if backward:
        bytes_per_hop += key_and_value * grad_dtype.itemsize
    return (p - 1) * bytes_per_hop
