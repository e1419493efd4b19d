"""Attention across devices: ring attention on ``torch.distributed``.

When one sequence is too long for one device, context parallelism splits it along the
tokens. Each of ``P`` ranks (one process per device) holds the queries, keys and values
of ``n = N / P`` tokens. The queries stay at home; the key/value blocks travel around a
ring, one hop per step, so that after ``P`` steps every rank has seen every block, while
no rank holds more than two visiting blocks besides its own at any time. Each step gives
a partial result for the rank's queries, with the log-sum-exp of its scores, and partial
results are merged exactly as FlashAttention merges tiles (:func:`merge_partials`,
chapter 8's online softmax).

Layouts (which tokens rank ``r`` holds; :func:`shard_positions`):

* ``"contiguous"``: tokens ``r*n ... (r+1)*n - 1``, as in Liu et al. (2023). Under a
  causal mask the blocks from later ranks are entirely in the future: rank 0 computes
  one block of scores, rank ``P-1`` computes ``P`` of them.
* ``"zigzag"``: the sequence is cut into ``2P`` chunks and rank ``r`` holds chunks ``r``
  and ``2P-1-r``, so every rank has one early and one late chunk and, under a causal mask,
  the same work, ``(P+1)/2`` blocks (:func:`ring_schedule`).

:func:`ring_attention` runs inside an initialised process group; :func:`run_on_ranks`
starts one (``P`` fresh processes on this machine) and :func:`run_ring_demo` is the
measurement the chapter makes with it. Shapes: ``query``, ``key`` and ``value`` are
``(batch, num_heads, n, head_dim)`` shards (``value`` may have its own ``head_dim``).

Source: Liu, Zaharia and Abbeel (2023), "Ring Attention with Blockwise Transformers for
Near-Infinite Context", arXiv:2310.01889, section 3; Brandon et al.
(2023), "Striped Attention: Faster Ring Attention for Causal Transformers",
arXiv:2311.09431 (the causal imbalance); the zigzag layout of ring-flash-attention
(github.com/zhuzilin/ring-flash-attention, ``zigzag_ring_flash_attn``) and of Llama 3's
context parallelism (Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783,
section 3.3.2).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ._validation import (
    check_bool,
    check_int,
    check_positive_int,
    check_sdpa_inputs,
    type_name,
)
from .bench import peak_memory_bytes
from .flash import flash_attention_forward

__all__ = [
    "LAYOUTS",
    "RingStats",
    "RingStep",
    "merge_partials",
    "ring_attention",
    "ring_bytes_per_rank",
    "ring_schedule",
    "run_on_ranks",
    "run_ring_demo",
    "demo_inputs",
    "shard_positions",
    "shard_sequence",
    "unshard_sequence",
    "zigzag_shard",
    "zigzag_unshard",
]

LAYOUTS = ("contiguous", "zigzag")
"""The ways a sequence is split across the ranks (see the module's docstring)."""

_DEFAULT_BLOCK_SIZE = 128


def _check_layout(layout: object) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type_name(layout)} layout={layout!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got layout={layout!r}")
    return layout


# ---------------------------------------------------------------------------------------
# Which tokens a rank holds


def _check_split(num_tokens: int, rank: object, world_size: object, layout: str) -> tuple:
    world_size = check_positive_int("world_size", world_size)
    rank = check_int("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got rank={rank}")
    parts = world_size * (2 if _check_layout(layout) == "zigzag" else 1)
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
    ``zigzag_ring_flash_attn`` and Llama 3 (arXiv:2407.21783), section 3.3.2 (zigzag).
    """
    rank, world_size, part = _check_split(num_tokens, rank, world_size, layout)
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
    _check_layout(layout)
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

    Source: ring-flash-attention (``zigzag_ring_flash_attn``); Llama 3 (arXiv:2407.21783),
    section 3.3.2: "The i-th CP rank received both the i-th and the (2 x CP - 1 - i)-th
    chunks"; ``torch.distributed.tensor.experimental``'s head-tail load balancer.
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


# ---------------------------------------------------------------------------------------
# The merge


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the keys of two parts, from each part's result and log-sum-exp.

    If ``out_a`` is the attention of some queries over one set of keys and ``lse_a`` the
    log of each row's softmax denominator, ``log sum_j exp(s_ij)``, and likewise for a
    second, disjoint set of keys, then over both sets ``lse = log(e^lse_a + e^lse_b)``
    (``torch.logaddexp``, stable) and ``out = e^(lse_a - lse) out_a + e^(lse_b - lse)
    out_b``. In chapter 8's terms ``lse = m + log l``: the weights rescale each part's
    sum to the joint maximum. A part that saw no key (``lse = -inf``) gets weight 0;
    if neither did, the row is 0 with ``lse = -inf``.

    Args:
        out_a, out_b: ``(..., num_tokens_q, d_v)``, floating point.
        lse_a, lse_b: ``(..., num_tokens_q, 1)``, the dtype of the outputs (or float32).

    Returns:
        ``(out, lse)`` of the same shapes.

    Raises:
        TypeError: an argument is not a floating-point tensor.
        ValueError: the shapes disagree.

    Source: Milakov and Gimelshein (2018), "Online normalizer calculation for softmax",
    Algorithm 3; Liu et al. (2023), section 3 (blockwise attention across devices).
    """
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {type_name(t)}")
    lse_shape = (*out_a.shape[:-1], 1)
    if out_a.ndim < 1 or out_b.shape != out_a.shape or tuple(lse_a.shape) != lse_shape \
            or tuple(lse_b.shape) != lse_shape:
        raise ValueError(
            f"expected out_a and out_b of one shape (..., n, d_v) and lse_a, lse_b of shape "
            f"(..., n, 1), got {tuple(out_a.shape)}, {tuple(lse_a.shape)}, "
            f"{tuple(out_b.shape)}, {tuple(lse_b.shape)}")
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.masked_fill(lse == -math.inf, 0.0)  # rows that saw no key at all
    out = torch.exp(lse_a - safe) * out_a + torch.exp(lse_b - safe) * out_b
    return out, lse


# ---------------------------------------------------------------------------------------
# The ring


@dataclass
class RingStats:
    """What one rank did in :func:`ring_attention` calls: pass one as ``stats=`` to count.

    ``bytes_sent`` (forward) and ``backward_bytes_sent`` count the bytes of every tensor
    this rank sends point to point (not the small shape check before the ring);
    ``score_blocks`` and ``backward_score_blocks`` the ``(n, n)`` blocks of scores it
    computes (a half block counts 0.5); ``skipped_blocks`` the forward steps it skips.
    """

    bytes_sent: int = 0
    backward_bytes_sent: int = 0
    score_blocks: float = 0.0
    backward_score_blocks: float = 0.0
    skipped_blocks: int = 0
    steps: list[str] = field(default_factory=list)


class _Ring:
    """Point-to-point exchanges with the ring's neighbours: send to ``rank + 1``,
    receive from ``rank - 1``, several tensors in one ``batch_isend_irecv``."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        world: Any = group if group is not None else dist.group.WORLD
        self.group, self.rank, self.world_size = group, rank, world_size
        self.next = dist.get_global_rank(world, (rank + 1) % world_size)
        self.prev = dist.get_global_rank(world, (rank - 1) % world_size)

    def start(self, tensors: Sequence[torch.Tensor]) -> tuple[list, list[torch.Tensor], int]:
        """Post the sends and receives; return (requests, receive buffers, bytes sent)."""
        buffers = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]
        sent = sum(t.numel() * t.element_size() for t in tensors)
        return dist.batch_isend_irecv(ops), buffers, sent

    @staticmethod
    def finish(pending: tuple[list, list[torch.Tensor], int]) -> list[torch.Tensor]:
        for request in pending[0]:
            request.wait()
        return pending[1]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _merge_into(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor,
                part_lse: torch.Tensor) -> None:
    """:func:`merge_partials` written into the running ``out`` and ``lse`` (views), with no
    temporary of ``out``'s size: the ring's working memory stays two such tensors."""
    new_lse = torch.logaddexp(lse, part_lse)
    safe = new_lse.masked_fill(new_lse == -math.inf, 0.0)
    out.mul_(torch.exp(lse - safe)).addcmul_(torch.exp(part_lse - safe), part_out)
    lse.copy_(new_lse)


def _ring_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  is_causal: bool, scale: float, ring: _Ring, layout: str, block_size: int,
                  stats: RingStats | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step: post the exchange of the key/value block, compute with the block held,
    merge, then wait for the next block (the transfer overlaps the computation)."""
    dtype = _compute_dtype(query.dtype)
    n = query.shape[-2]
    out = torch.zeros((*query.shape[:-1], value.shape[-1]), dtype=dtype, device=query.device)
    lse = torch.full((*query.shape[:-1], 1), -math.inf, dtype=dtype, device=query.device)
    k_block, v_block = key.contiguous(), value.contiguous()
    for step, planned in enumerate(ring_schedule(ring.world_size, is_causal, layout)[ring.rank]):
        pending = ring.start([k_block, v_block]) if step + 1 < ring.world_size else None
        if stats is not None:
            stats.bytes_sent += pending[2] if pending else 0
            stats.score_blocks += planned.work
            stats.skipped_blocks += planned.kind == "skip"
            stats.steps.append(planned.kind)
        if planned.kind != "skip":
            rows, cols, causal = _step_slices(planned.kind, n)
            part_out, part_lse = flash_attention_forward(
                query[..., rows, :].to(dtype), k_block[..., cols, :].to(dtype),
                v_block[..., cols, :].to(dtype), causal, scale, block_size=block_size)
            _merge_into(out[..., rows, :], lse[..., rows, :], part_out, part_lse)
            del part_out, part_lse  # not alive during the next step's computation
        if pending is not None:
            k_block, v_block = ring.finish(pending)
            # The finished sends still hold the block just sent: let it go now, not when
            # the next step's exchange replaces them.
            pending = None
    return out.to(query.dtype), lse


def _block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    grad_out: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
                    causal: bool, scale: float, block_size: int, grad_q: torch.Tensor,
                    grad_k: torch.Tensor, grad_v: torch.Tensor) -> None:
    """Add one step's gradients into ``grad_q`` (query rows) and ``grad_k``, ``grad_v``
    (key rows), tile by tile, from ``P = exp(S - L)`` with the global log-sum-exp ``L``."""
    dtype = lse.dtype
    num_q, num_k = q.shape[-2], k.shape[-2]
    for k0 in range(0, num_k, block_size):
        k1 = min(k0 + block_size, num_k)
        k_t, v_t = k[..., k0:k1, :].to(dtype), v[..., k0:k1, :].to(dtype)
        for q0 in range(k0 if causal else 0, num_q, block_size):
            q1 = min(q0 + block_size, num_q)
            q_t, do_t = q[..., q0:q1, :].to(dtype), grad_out[..., q0:q1, :]
            scores = (q_t @ k_t.transpose(-2, -1)) * scale  # (..., Bq, Bk), as the forward's
            if causal and k1 - 1 > q0:  # the tile crosses the diagonal
                rows = torch.arange(q0, q1, device=q.device).unsqueeze(-1)
                scores = scores.masked_fill(torch.arange(k0, k1, device=q.device) > rows,
                                            -math.inf)
            probs = torch.exp(scores - lse[..., q0:q1, :])  # the final attention weights
            grad_v[..., k0:k1, :] += probs.transpose(-2, -1) @ do_t
            grad_scores = probs * (do_t @ v_t.transpose(-2, -1) - delta[..., q0:q1, :]) * scale
            grad_q[..., q0:q1, :] += grad_scores @ k_t
            grad_k[..., k0:k1, :] += grad_scores.transpose(-2, -1) @ q_t


def _ring_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
                   is_causal: bool, scale: float, ring: _Ring, layout: str, block_size: int,
                   stats: RingStats | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key/value blocks go round the ring again; each block's gradient travels with
    it, gathering every rank's share, and reaches its owner after the last step."""
    dtype = lse.dtype
    n = query.shape[-2]
    grad_out = grad_out.to(dtype)
    delta = (grad_out * out.to(dtype)).sum(dim=-1, keepdim=True)  # D_i = dO_i . O_i
    grad_query = torch.zeros(query.shape, dtype=dtype, device=query.device)
    grad_key = torch.zeros(key.shape, dtype=dtype, device=key.device)
    grad_value = torch.zeros(value.shape, dtype=dtype, device=value.device)
    k_block, v_block = key.contiguous(), value.contiguous()
    # The visiting block's gradient, summed over the ranks so far: from step 1 on.
    acc_key, acc_value = grad_key, grad_value
    for step, planned in enumerate(ring_schedule(ring.world_size, is_causal, layout)[ring.rank]):
        pending = ring.start([k_block, v_block]) if step + 1 < ring.world_size else None
        if step == 1:
            acc_key, acc_value = torch.zeros_like(grad_key), torch.zeros_like(grad_value)
        target_key, target_value = (grad_key, grad_value) if step == 0 else (acc_key, acc_value)
        if planned.kind != "skip":
            rows, cols, causal = _step_slices(planned.kind, n)
            _block_backward(query[..., rows, :], k_block[..., cols, :], v_block[..., cols, :],
                            grad_out[..., rows, :], lse[..., rows, :], delta[..., rows, :],
                            causal, scale, block_size, grad_query[..., rows, :],
                            target_key[..., cols, :], target_value[..., cols, :])
        sent = pending[2] if pending else 0
        if step >= 1:  # pass the gradient on; receive the next block's
            grads = ring.start([acc_key, acc_value])
            sent += grads[2]
            acc_key, acc_value = ring.finish(grads)
            del grads
        if stats is not None:
            stats.backward_bytes_sent += sent
            stats.backward_score_blocks += planned.work
        if pending is not None:
            k_block, v_block = ring.finish(pending)
            pending = None
    if ring.world_size > 1:  # after the last step: our own block's gradient from the others
        grad_key += acc_key
        grad_value += acc_value
    return grad_query, grad_key, grad_value


class _RingAttentionFunction(torch.autograd.Function):
    """Saves the local shards, the output and its log-sum-exp; the backward pass sends
    the key/value blocks round the ring again instead of keeping them (see
    :func:`ring_attention`)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                is_causal: bool, scale: float, ring: _Ring, layout: str, block_size: int,
                stats: RingStats | None) -> torch.Tensor:
        out, lse = _ring_forward(query, key, value, is_causal, scale, ring, layout,
                                 block_size, stats)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.args = (is_causal, scale, ring, layout, block_size, stats)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, out, lse = ctx.saved_tensors
        grads = _ring_backward(query, key, value, out, lse, grad_out, *ctx.args)
        cast = [g.to(t.dtype) for g, t in zip(grads, (query, key, value), strict=True)]
        return (*cast, None, None, None, None, None, None)


def _local_problem(query: Any, key: Any, value: Any, is_causal: Any, scale: Any,
                   layout: Any, block_size: Any, stats: Any) -> Exception | None:
    """Check this rank's arguments; return the exception instead of raising it."""
    try:
        check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 4:
                raise ValueError(f"{name} must be (batch, num_heads, num_tokens_local, "
                                 f"head_dim), got shape {tuple(t.shape)}")
        if query.shape != key.shape or query.shape[-2] == 0:
            raise ValueError(
                f"query {tuple(query.shape)} and key {tuple(key.shape)} must hold the same "
                "tokens (at least one): each rank passes the queries, keys and values of "
                "its own shard of one sequence")
        if _check_layout(layout) == "zigzag" and query.shape[-2] % 2:
            raise ValueError(f"layout='zigzag' needs an even number of tokens per rank (two "
                             f"equal chunks), got {query.shape[-2]}")
        check_positive_int("block_size", block_size)
        if stats is not None and not isinstance(stats, RingStats):
            raise TypeError(f"stats must be a RingStats or None, got {type_name(stats)}")
    except (TypeError, ValueError) as exc:
        return exc
    return None


def _agree(metas: list[dict], rank: int) -> None:
    """Raise the same ValueError on every rank if the ranks' calls do not match."""
    refused = [(r, m["error"]) for r, m in enumerate(metas) if m["error"]]
    if refused:
        r, message = refused[0]
        raise ValueError(f"rank {r} refused its input ({message}); every rank must call "
                         "ring_attention with valid shards")
    for name in ("query", "key", "value", "dtype", "is_causal", "layout", "scale", "grad"):
        values = [m[name] for m in metas]
        if len(set(values)) == 1:
            continue
        listed = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        hint = ""
        if name in ("query", "key", "value"):
            hint = (" (every rank must hold num_tokens / world_size tokens of the same batch, "
                    "heads and head_dim: a sequence must split into equal shards, divisible "
                    "by world_size, or 2 * world_size for layout='zigzag'; ring_attention "
                    "does not pad)")
        if name == "grad":
            hint = " (all ranks or none must need gradients, or the backward ring would hang)"
        raise ValueError(f"ring_attention was called with different {name} on different "
                         f"ranks: {listed}{hint}")


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   is_causal: bool = False, scale: float | None = None, group: Any = None,
                   layout: str = "contiguous", *, block_size: int = _DEFAULT_BLOCK_SIZE,
                   stats: RingStats | None = None) -> torch.Tensor:
    """This rank's rows of ``softmax(Q K^T * scale) V`` over the whole sequence, by a ring.

    Call it on every rank of ``group`` at once, each with its own shard of one sequence
    (see :func:`shard_sequence`); the result is this rank's shard of
    :func:`torch.nn.functional.scaled_dot_product_attention` on the whole sequence. At
    each of ``P`` steps the rank computes its queries against the key/value block it
    holds, with chapter 8's tiled loop (:func:`attnlib.flash.flash_attention_forward`,
    which returns the block's log-sum-exp), merges the partial result into its running
    one (:func:`merge_partials`), and passes the block to ``rank + 1`` while receiving the
    next from ``rank - 1`` (``torch.distributed.batch_isend_irecv``, posted before the
    computation so that the transfer overlaps it wherever the backend runs it in the
    background, as gloo and NCCL do). Under a causal mask a block entirely in the future
    of every query is skipped (:func:`ring_schedule`).

    The backward pass (a custom ``autograd.Function``) recomputes each step's attention
    weights from the saved log-sum-exp instead of storing them, and sends the key/value
    blocks round the ring a second time instead of keeping the ``P - 1`` visitors: keeping
    them would put the whole sequence's keys and values on every rank, the memory the
    ring exists to avoid. Each block's gradient travels with it and reaches its owner
    after the last step. Every rank must call ``backward`` (its loss must depend on its
    output). Gradients equal the single-device ones up to rounding.

    Args:
        query: ``(batch, num_heads, n, head_dim)``, this rank's ``n = N / P`` tokens.
        key: ``(batch, num_heads, n, head_dim)``, the same tokens.
        value: ``(batch, num_heads, n, d_v)``.
        is_causal: token ``i`` sees tokens ``j <= i`` of the whole sequence (positions as
            the layout assigns them). Default ``False``.
        scale: multiplier of the scores; default ``1 / sqrt(head_dim)``.
        group: the process group; default the default group. Tensors must be where its
            backend works: CPU for gloo, this rank's GPU for NCCL (the current device,
            ``torch.cuda.set_device``, which the shape check's ``all_gather_object`` uses).
        layout: ``"contiguous"`` or ``"zigzag"``, how the shards were cut (:data:`LAYOUTS`).
        block_size: keyword-only; rows per tile of the local loop. Default 128.
        stats: keyword-only; a :class:`RingStats` to which this call adds what it sent and
            computed.

    Returns:
        ``(batch, num_heads, n, d_v)``, this rank's rows of the output, in the input's
        dtype (half precision is computed in float32).

    Raises:
        RuntimeError: ``torch.distributed`` is unavailable or no process group is
            initialised (call ``torch.distributed.init_process_group`` first, or use
            :func:`run_on_ranks`).
        TypeError: ``group`` is not a process group; a tensor is not floating point or
            the dtypes differ; ``is_causal`` is not a bool; ``scale`` is not a number;
            ``layout`` not a str; ``block_size`` not an int; ``stats`` not a RingStats.
        ValueError: a tensor is not 4-D, query and key hold different tokens, ``layout``
            is unknown, zigzag shards hold an odd number of tokens, ``block_size < 1``;
            or the ranks disagree: the shapes (for instance a sequence that does not
            split evenly: this function does not pad), dtype, ``is_causal``, ``layout``,
            ``scale`` or whether gradients are needed differ from rank to rank (an
            ``all_gather_object`` of each rank's metadata checks this first, so that every
            rank raises the same error instead of waiting forever), or another rank
            refused its own input.

    Source: Liu, Zaharia and Abbeel (2023), "Ring Attention with Blockwise Transformers
    for Near-Infinite Context", arXiv:2310.01889, section 3; Brandon et al. (2023),
    "Striped Attention", arXiv:2311.09431 (causal load balance); the zigzag layout of
    ring-flash-attention and Llama 3 (arXiv:2407.21783, section 3.3.2); Dao (2023),
    "FlashAttention-2", Algorithm 2 (the backward pass from the log-sum-exp).
    """
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got "
                        f"{type_name(group)}")
    problem = _local_problem(query, key, value, is_causal, scale, layout, block_size, stats)
    if not (dist.is_available() and dist.is_initialized()):
        if problem is not None:
            raise problem
        raise RuntimeError(
            "ring_attention runs inside an initialised process group: call "
            "torch.distributed.init_process_group(...) in each of the P processes first "
            "(attnlib.distributed.run_on_ranks starts P processes on this machine)")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of the process group it was given")
    meta: dict[str, Any] = {"error": None if problem is None else
                            f"{type_name(problem)}: {problem}"}
    if problem is None:
        meta.update(
            query=tuple(query.shape), key=tuple(key.shape), value=tuple(value.shape),
            dtype=str(query.dtype), is_causal=bool(is_causal), layout=layout,
            scale=float(scale) if scale is not None else 1.0 / math.sqrt(query.shape[-1]),
            grad=torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))
    metas: list[Any] = [None] * world_size
    dist.all_gather_object(metas, meta, group=group)
    if problem is not None:
        raise problem
    _agree(metas, rank)
    ring = _Ring(group, rank, world_size)
    return _RingAttentionFunction.apply(query, key, value, bool(is_causal), meta["scale"],
                                        ring, layout, int(block_size), stats)


# ---------------------------------------------------------------------------------------
# Running P processes on this machine


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, backend: str, num_threads: int,
               timeout: float, fn: Callable[..., Any], args: tuple, path: str) -> None:
    """One worker: join the group on 127.0.0.1, run ``fn``, save its result or error."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(num_threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        result = {"result": fn(rank, world_size, *args)}
    except BaseException:  # reported to the parent, which raises it
        # The time tells the parent which rank failed first: the others' errors (a closed
        # connection, say) may be consequences. Exit without waiting for stuck ranks.
        _leave({"error": traceback.format_exc(), "time": time.time()}, path, 1)
    dist.destroy_process_group()
    _leave(result, path, 0)


def _leave(outcome: dict, path: str, code: int) -> None:
    """Save ``outcome`` and end the process at once: the interpreter's teardown of torch
    would add a few tenths of a second to every run and has nothing left to do."""
    torch.save(outcome, path)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                 timeout: float = 120.0, num_threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined in a group.

    The processes are started with the ``"spawn"`` method of ``torch.multiprocessing``
    (so ``fn`` must be importable: a module-level function, not one defined in a notebook),
    find each other on ``127.0.0.1`` at a free port (``MASTER_ADDR``, ``MASTER_PORT``),
    call ``torch.distributed.init_process_group(backend)``, run ``fn`` and return its
    result through a file. Each uses ``num_threads`` threads.

    Args:
        fn: called as ``fn(rank, world_size, *args)`` inside the group; its return value
            must be picklable (tensors are).
        world_size: the number of processes, ``P``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank: rank ``r`` uses
            ``cuda:r``).
        timeout: seconds before the processes are stopped and an error raised; also the
            process group's timeout.
        num_threads: ``torch.set_num_threads`` in each process.

    Returns:
        ``[fn's result on rank 0, ..., on rank P - 1]``.

    Raises:
        TypeError: ``fn`` is not callable or a count is not an int.
        ValueError: ``world_size`` or ``num_threads`` is below 1; unknown ``backend``.
        RuntimeError: a rank raised (the traceback of the first to fail is in the
            message; the others are stopped) or the run took longer than ``timeout``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type_name(fn)}")
    world_size = check_positive_int("world_size", world_size)
    num_threads = check_positive_int("num_threads", num_threads)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    context = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        paths = [os.path.join(folder, f"rank{r}.pt") for r in range(world_size)]
        port = _free_port()
        processes = [context.Process(target=_rank_main, daemon=True, args=(
            r, world_size, port, backend, num_threads, timeout, fn, args, paths[r]))
            for r in range(world_size)]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        while any(p.is_alive() for p in processes):
            stopped = any(p.exitcode not in (None, 0) for p in processes)
            if stopped or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        outcomes: list[Any] = [torch.load(p, weights_only=False) if os.path.exists(p)
                               else None for p in paths]
    failed = [(outcome["time"], r) for r, outcome in enumerate(outcomes)
              if outcome is not None and "error" in outcome]
    if failed:
        first = min(failed)[1]
        raise RuntimeError(f"rank {first} of {world_size} failed:\n"
                           f"{outcomes[first]['error']}")
    if any(outcome is None for outcome in outcomes):
        raise RuntimeError(f"the {world_size} processes did not finish within {timeout} s "
                           f"(exit codes {[p.exitcode for p in processes]})")
    return [outcome["result"] for outcome in outcomes]


# ---------------------------------------------------------------------------------------
# The chapter's measurement


def demo_inputs(num_tokens: int, *, batch: int = 1, num_heads: int = 4, head_dim: int = 64,
                dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded ``(query, key, value, grad_out)``, each ``(batch, num_heads, num_tokens,
    head_dim)``: drawn in float64 from ``torch.Generator().manual_seed(seed)`` and cast to
    ``dtype``, so every process (and the notebook) builds the same tensors.

    Raises:
        TypeError, ValueError: a size is not a positive int.
    """
    shape = [check_positive_int(name, v) for name, v in (
        ("batch", batch), ("num_heads", num_heads), ("num_tokens", num_tokens),
        ("head_dim", head_dim))]
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
                 for _ in range(4))


def _demo_run(rank: int, world_size: int, group: Any, tensors: tuple[torch.Tensor, ...],
              config: dict) -> dict:
    """Every case on one group of ``world_size`` ranks: forward, backward, timed, counted."""
    results: dict[str, Any] = {"cases": {}}
    for is_causal, layout in config["cases"]:
        q, k, v, g = (shard_sequence(t, rank, world_size, layout) for t in tensors)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        stats = RingStats()
        kwargs = {"group": group, "layout": layout, "block_size": config["block_size"],
                  "stats": stats}
        dist.barrier(group)
        start = time.perf_counter()
        out = ring_attention(q, k, v, is_causal, **kwargs)
        forward_seconds = time.perf_counter() - start
        start = time.perf_counter()
        out.backward(g)
        results["cases"][(is_causal, layout)] = {
            "output": out.detach(), "grads": (q.grad, k.grad, v.grad), "stats": stats,
            "forward_seconds": forward_seconds,
            "backward_seconds": time.perf_counter() - start}
    if config["measure_memory"]:
        is_causal, layout = config["cases"][0]
        q, k, v = (shard_sequence(t, rank, world_size, layout) for t in tensors[:3])
        results["input_bytes"] = sum(t.numel() * t.element_size() for t in (q, k, v))
        with torch.no_grad():
            results["peak_bytes"] = peak_memory_bytes(lambda: ring_attention(
                q, k, v, is_causal, group=group, layout=layout,
                block_size=config["block_size"]), "cpu")
    return results


def _demo_worker(rank: int, world_size: int, config: dict) -> dict:
    """One process of :func:`run_ring_demo`: a run on ranks ``0 .. P-1`` for each ``P``."""
    tensors = demo_inputs(
        config["num_tokens"], batch=config["batch"], num_heads=config["num_heads"],
        head_dim=config["head_dim"], dtype=config["dtype"], seed=config["seed"])
    warm = torch.ones(1, 1, 2, 2, requires_grad=True)  # the first backward pays start-up
    ring_attention(warm, warm, warm).sum().backward()
    results: dict[Any, Any] = {}
    for size in config["world_sizes"]:
        # Every process takes part in creating a group, members or not.
        group = None if size == world_size else dist.new_group(list(range(size)))
        if rank < size:
            results[size] = _demo_run(rank, size, group, tensors, config)
        dist.barrier()
    if config["try_context_parallel"]:
        query, key, value = tensors[:3]
        results["context_parallel"] = _try_context_parallel(query, key, value, world_size)
    return results


def _try_context_parallel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          world_size: int) -> str:
    """Run torch's ``context_parallel`` on these tensors; return what happened, in words."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(query.device.type, (world_size,))
    buffers = [query.clone(), key.clone(), value.clone()]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            # Looked up inside the context: context_parallel replaces F's attribute.
            F.scaled_dot_product_attention(buffers[0], buffers[1], buffers[2], is_causal=True)
    except Exception as exc:  # the outcome is the result
        return f"{type_name(exc)}: {exc}"
    return "ran"


def run_ring_demo(world_sizes: Sequence[int] = (1, 2, 4), *, num_tokens: int = 2048,
                  batch: int = 1, num_heads: int = 2, head_dim: int = 64,
                  dtype: torch.dtype = torch.float32,
                  cases: Sequence[tuple[bool, str]] = ((False, "contiguous"),),
                  block_size: int = _DEFAULT_BLOCK_SIZE, seed: int = 0,
                  measure_memory: bool = True, try_context_parallel: bool = False,
                  timeout: float = 180.0) -> dict[str, Any]:
    """Run :func:`ring_attention` on ``P`` gloo processes for each ``P`` in ``world_sizes``.

    One :func:`run_on_ranks` call starts ``max(world_sizes)`` processes (one thread each);
    the run for ``P`` uses ranks ``0 .. P-1`` in a group of their own. Every process builds
    :func:`demo_inputs` (seeded, the same everywhere) and takes its shard; for each
    ``(is_causal, layout)`` in ``cases`` it runs the forward pass, then the backward pass
    with ``grad_out`` as the output's gradient. If asked, it then measures the peak memory
    of one forward pass of the first case with :func:`attnlib.bench.peak_memory_bytes`
    (the allocations PyTorch's CPU allocator records: a deterministic count, not the
    process's resident size), and tries ``torch.distributed.tensor.experimental.
    context_parallel`` on the whole sequence with all the processes.

    Returns:
        ``{"runs": {P: run}, "context_parallel": outcome}``. Each ``run["cases"]`` maps
        ``(is_causal, layout)`` to ``"output"`` (the whole ``(batch, num_heads,
        num_tokens, head_dim)`` output, unsharded), ``"grads"`` (``(grad_query,
        grad_key, grad_value)``, unsharded), ``"stats"`` (a :class:`RingStats` per rank),
        ``"forward_seconds"`` and ``"backward_seconds"`` (per rank; they vary from run to
        run). With ``measure_memory``, ``run["peak_bytes"]`` (per rank, above its inputs)
        and ``run["input_bytes"]`` (per rank: its query, key and value shards). The
        outcome is ``None``, or per rank ``"ran"`` or the error ``context_parallel``
        raised.

    Raises:
        TypeError, ValueError: bad sizes or ``cases``, or a length that does not split.
        RuntimeError: a process failed or the run timed out.
    """
    if isinstance(world_sizes, (int, str)) or not world_sizes:
        raise TypeError(f"world_sizes must be a non-empty sequence of ints, got {world_sizes!r}")
    world_sizes = tuple(check_positive_int("world_size", p) for p in world_sizes)
    cases = tuple((check_bool("is_causal", c), _check_layout(lay)) for c, lay in cases)
    if not cases:
        raise ValueError("cases must name at least one (is_causal, layout) pair")
    for size in world_sizes:
        for _, layout in cases:
            _check_split(num_tokens, 0, size, layout)
    for name, value in (("batch", batch), ("num_heads", num_heads), ("head_dim", head_dim)):
        check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    config = {"num_tokens": num_tokens, "batch": batch, "num_heads": num_heads,
              "head_dim": head_dim, "dtype": dtype, "cases": cases, "seed": seed,
              "world_sizes": world_sizes,
              "block_size": check_positive_int("block_size", block_size),
              "measure_memory": check_bool("measure_memory", measure_memory),
              "try_context_parallel": check_bool("try_context_parallel", try_context_parallel)}
    ranks = run_on_ranks(_demo_worker, max(world_sizes), config, timeout=timeout)
    runs: dict[int, dict[str, Any]] = {}
    for size in world_sizes:
        members = [r[size] for r in ranks[:size]]
        run: dict[str, Any] = {"cases": {}}
        for case in cases:
            per_rank = [m["cases"][case] for m in members]
            run["cases"][case] = {
                "output": unshard_sequence([r["output"] for r in per_rank], case[1]),
                "grads": tuple(unshard_sequence([r["grads"][i] for r in per_rank], case[1])
                               for i in range(3)),
                **{name: [r[name] for r in per_rank]
                   for name in ("stats", "forward_seconds", "backward_seconds")}}
        for name in ("peak_bytes", "input_bytes"):
            if name in members[0]:
                run[name] = [m[name] for m in members]
        runs[size] = run
    outcome = [r["context_parallel"] for r in ranks] if try_context_parallel else None
    return {"runs": runs, "context_parallel": outcome}
