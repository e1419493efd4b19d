"""Which tokens each rank holds: the contiguous and zigzag layouts (see
:mod:`attnlib.distributed`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validation import (
    check_int,
    check_positive_int,
    type_name,
)

LAYOUTS = ("contiguous", "zigzag")
"""The ways a sequence is split across the ranks (see the module's docstring)."""

DEFAULT_BLOCK_SIZE = 128
"""Rows per tile of ring attention's local loop when none is given."""


def check_layout(layout: object) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`.

    Raises:
        TypeError: ``layout`` is not a str.
        ValueError: it is another string.
    """
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type_name(layout)} layout={layout!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got layout={layout!r}")
    return layout


# ---------------------------------------------------------------------------------------
# Which tokens a rank holds


def check_split(num_tokens: int, rank: object, world_size: object, layout: str
                ) -> tuple[int, int, int]:
    """``(rank, world_size, part)``: the checked rank and world size and the tokens in
    each of the sequence's equal parts (``world_size`` parts, ``2 * world_size`` zigzag).

    Raises:
        TypeError: ``rank`` or ``world_size`` is not an int; ``layout`` not a str.
        ValueError: ``world_size < 1``; ``rank`` outside ``[0, world_size)``; an unknown
            layout; ``num_tokens`` not divisible into the parts.
    """
    world_size = check_positive_int("world_size", world_size)
    rank = check_int("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got rank={rank}")
    parts = world_size * (2 if check_layout(layout) == "zigzag" else 1)
    if num_tokens % parts:
        raise ValueError(
            f"num_tokens={num_tokens} does not split into {parts} equal parts "
            f"(world_size={world_size}, layout={layout!r}): ring attention needs equal "
            f"shards, and this function does not pad; use a length divisible by {parts}")
    return rank, world_size, num_tokens // parts


def shard_positions(num_tokens: int, rank: int, world_size: int,
                    layout: str = "contiguous") -> torch.Tensor:
    """The positions in the whole sequence of the tokens rank ``rank`` holds, in order.

    Returns:
        An int64 tensor of ``num_tokens // world_size`` positions: ``r*n ... (r+1)*n - 1``
        for ``"contiguous"``; chunk ``r`` then chunk ``2P-1-r`` of ``2P`` chunks for
        ``"zigzag"``.

    Raises:
        TypeError: ``rank`` or ``world_size`` is not an int, ``layout`` not a str.
        ValueError: ``rank`` is outside ``[0, world_size)``; ``layout`` is unknown;
            ``num_tokens`` is not divisible by ``world_size`` (by ``2 * world_size``
            for ``"zigzag"``).

    Source: Liu et al. (2023), section 3 (contiguous); ring-flash-attention's
    ``zigzag_ring_flash_attn`` and Megatron-LM's ``get_batch_on_this_cp_rank`` (zigzag).
    """
    rank, world_size, part = check_split(num_tokens, rank, world_size, layout)
    if layout == "contiguous":
        return torch.arange(rank * part, (rank + 1) * part)
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * part, (rank + 1) * part),
                      torch.arange(late * part, (late + 1) * part)])


def shard_sequence(x: torch.Tensor, rank: int, world_size: int,
                   layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (the tokens), as a new tensor.

    Args:
        x: any tensor, e.g. ``(batch, num_heads, num_tokens, head_dim)``.
        rank, world_size: which of ``world_size`` equal shards.
        layout: ``"contiguous"`` or ``"zigzag"`` (:func:`shard_positions`).
        dim: the token dimension; default ``-2``.

    Returns:
        ``x`` with ``num_tokens // world_size`` tokens along ``dim``.

    Raises:
        TypeError, ValueError: as :func:`shard_positions`; ``dim`` out of range.
    """
    dim = _token_dim(x, dim)
    index = shard_positions(x.shape[dim], rank, world_size, layout).to(x.device)
    return x.index_select(dim, index)


def unshard_sequence(shards: Sequence[torch.Tensor], layout: str = "contiguous",
                     dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's shard (``shards[r]`` from rank ``r``).

    The inverse of :func:`shard_sequence`: ``unshard_sequence([shard_sequence(x, r, P,
    layout) for r in range(P)], layout)`` equals ``x``.

    Raises:
        TypeError: ``shards`` is not a non-empty sequence of tensors.
        ValueError: the shards differ in shape, or (zigzag) hold an odd number of tokens.
    """
    check_layout(layout)
    if isinstance(shards, torch.Tensor) or not isinstance(shards, Sequence) or not shards \
            or not all(isinstance(s, torch.Tensor) for s in shards):
        raise TypeError(f"shards must be a non-empty list of tensors, got {type_name(shards)}")
    dim = _token_dim(shards[0], dim)
    if len({tuple(s.shape) for s in shards}) != 1:
        raise ValueError(f"shards must share one shape, got {[tuple(s.shape) for s in shards]}")
    if layout == "contiguous":
        return torch.cat(list(shards), dim=dim)
    if shards[0].shape[dim] % 2:
        raise ValueError(f"a zigzag shard holds two equal chunks, got {shards[0].shape[dim]} "
                         "tokens")
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=dim)


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s zigzag shard: chunks ``rank`` and ``2*world_size - 1 - rank`` of ``x``.

    ``shard_sequence(x, rank, world_size, "zigzag", dim)``. With a causal mask every rank
    then holds one early and one late chunk, which balances the work.

    Raises:
        TypeError, ValueError: as :func:`shard_sequence` (``x.shape[dim]`` must be
            divisible by ``2 * world_size``).

    Source: ring-flash-attention (``zigzag_ring_flash_attn``) and Megatron-LM's context
    parallelism (``get_batch_on_this_cp_rank``), both ring implementations; the same split
    in Llama 3's training (arXiv:2407.21783, section 3.3.2), which all-gathers the keys and
    values instead, and in ``torch.distributed.tensor.experimental``'s head-tail load
    balancer.
    """
    return shard_sequence(x, rank, world_size, "zigzag", dim)


def zigzag_unshard(shards: Sequence[torch.Tensor], dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's zigzag shard; inverse of :func:`zigzag_shard`.

    Raises:
        TypeError, ValueError: as :func:`unshard_sequence`.
    """
    return unshard_sequence(shards, "zigzag", dim)


def _token_dim(x: object, dim: object) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim!r} is not a dimension of a {x.ndim}-D tensor")
    return dim % x.ndim
