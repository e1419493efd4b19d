"""Ring attention: the merge of partial results and the ring's forward and backward passes
(see :mod:`attnlib.distributed`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .._validation import (
    check_bool,
    check_positive_int,
    check_sdpa_inputs,
    type_name,
)
from ..flash import (
    compute_dtype,
    differentiable_once,
    flash_attention_backward,
    flash_attention_forward,
)
from ._schedule import ring_schedule
from ._sharding import DEFAULT_BLOCK_SIZE, check_layout

# ---------------------------------------------------------------------------------------
# The merge


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor, *, in_place: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
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
        in_place: keyword-only; write the result into ``out_a`` and ``lse_a`` (a running
            result, views allowed) and return them, with no temporary of ``out_a``'s
            size, as :func:`ring_forward` does every step. Default False: new tensors.

    Returns:
        ``(out, lse)`` of the same shapes (``out_a`` and ``lse_a`` when ``in_place``).

    Raises:
        TypeError: an argument is not a floating-point tensor; ``in_place`` not a bool.
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
    in_place = check_bool("in_place", in_place)
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.masked_fill(lse == -math.inf, 0.0)  # rows that saw no key at all
    if in_place:
        out_a.mul_(torch.exp(lse_a - safe)).addcmul_(torch.exp(lse_b - safe), out_b)
        return out_a, lse_a.copy_(lse)
    out = torch.exp(lse_a - safe) * out_a + torch.exp(lse_b - safe) * out_b
    return out, lse


# ---------------------------------------------------------------------------------------
# The ring


@dataclass
class RingStats:
    """What one rank did in :func:`ring_attention` calls: pass one as ``stats=`` to count.

    ``bytes_sent`` (forward) and ``backward_bytes_sent`` count the bytes of every tensor
    this rank sends point to point (not the small shape check before the ring);
    ``scores`` and ``backward_scores`` the scores (query-key pairs, per batch element and
    head) its steps compute, the pairs the mask leaves (:meth:`RingStep.scores`);
    ``score_blocks`` and ``backward_score_blocks`` the same in ``(n, n)`` blocks, so that
    a diagonal block counts ``(n + 1) / (2 n)`` and a half step 0.5; ``skipped_blocks``
    the forward steps it skips.
    """

    bytes_sent: int = 0
    backward_bytes_sent: int = 0
    scores: int = 0
    backward_scores: int = 0
    score_blocks: float = 0.0
    backward_score_blocks: float = 0.0
    skipped_blocks: int = 0
    steps: list[str] = field(default_factory=list)


Pending = tuple[list[Any], list[torch.Tensor], int]
"""An exchange in flight: ``(requests, receive buffers, bytes sent)``."""


class RingNeighbours:
    """Point-to-point exchanges with the ring's neighbours: send to ``rank + 1``,
    receive from ``rank - 1``, several tensors in one ``batch_isend_irecv``.

    Built by :func:`ring_attention` once its checks have passed, inside an initialised
    process group; :func:`ring_forward` takes one.

    Args:
        group: the process group, or None for the default group.
        rank: this process's rank in ``group``.
        world_size: the number of ranks in ``group``.

    Raises:
        RuntimeError: no process group is initialised (torch's ``get_global_rank``).
    """

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        world: Any = group if group is not None else dist.group.WORLD
        self.group, self.rank, self.world_size = group, rank, world_size
        self.next = dist.get_global_rank(world, (rank + 1) % world_size)
        self.prev = dist.get_global_rank(world, (rank - 1) % world_size)

    def start(self, tensors: Sequence[torch.Tensor]) -> Pending:
        """Post the sends of ``tensors`` and the receives of as many of their shapes;
        return ``(requests, receive buffers, bytes sent)``, for :meth:`finish`."""
        buffers = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]
        sent = sum(t.numel() * t.element_size() for t in tensors)
        return dist.batch_isend_irecv(ops), buffers, sent

    @staticmethod
    def finish(pending: Pending) -> list[torch.Tensor]:
        """Wait for the exchange :meth:`start` posted; return the received tensors."""
        for request in pending[0]:
            request.wait()
        return pending[1]


def ring_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 is_causal: bool, scale: float, ring: RingNeighbours, layout: str,
                 block_size: int, stats: RingStats | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward loop of :func:`ring_attention`: this rank's output and log-sum-exp.

    Each step: post the exchange of the key/value block, compute with the block held,
    merge, then wait for the next block (the transfer overlaps the computation). Every
    rank of ``ring`` calls it at once; :func:`ring_attention` checks the arguments first
    (and that the ranks agree) and records nothing for autograd here.

    Args:
        query, key: ``(batch, num_heads, n, head_dim)``, this rank's shard.
        value: ``(batch, num_heads, n, d_v)``.
        is_causal, scale, layout, block_size, stats: as for :func:`ring_attention`
            (``scale`` given, not None).
        ring: this rank's :class:`RingNeighbours`.

    Returns:
        ``(out, lse)``: ``(batch, num_heads, n, d_v)`` in the input's dtype and
        ``(batch, num_heads, n, 1)`` in the compute dtype (float32 for half precision).

    Raises:
        TypeError: ``ring`` is not a RingNeighbours.

    Source: Liu, Zaharia and Abbeel (2023), "Ring Attention", section 3.
    """
    if not isinstance(ring, RingNeighbours):
        raise TypeError(f"ring must be a RingNeighbours, got {type_name(ring)}")
    dtype = compute_dtype(query.dtype)
    n = query.shape[-2]
    out = torch.zeros((*query.shape[:-1], value.shape[-1]), dtype=dtype, device=query.device)
    lse = torch.full((*query.shape[:-1], 1), -math.inf, dtype=dtype, device=query.device)
    k_block, v_block = key.contiguous(), value.contiguous()
    for step, planned in enumerate(ring_schedule(ring.world_size, is_causal, layout)[ring.rank]):
        pending = ring.start([k_block, v_block]) if step + 1 < ring.world_size else None
        if stats is not None:
            stats.bytes_sent += pending[2] if pending else 0
            stats.scores += planned.scores(n)  # the (query, key) pairs the mask leaves
            stats.score_blocks += planned.scores(n) / n**2
            stats.skipped_blocks += planned.kind == "skip"
            stats.steps.append(planned.kind)
        if planned.kind != "skip":
            rows, cols, causal = planned.slices(n)
            part_out, part_lse = flash_attention_forward(
                query[..., rows, :].to(dtype), k_block[..., cols, :].to(dtype),
                v_block[..., cols, :].to(dtype), causal, scale, block_size=block_size)
            # Into the running result's rows, with no temporary of their size.
            merge_partials(out[..., rows, :], lse[..., rows, :], part_out, part_lse,
                           in_place=True)
            del part_out, part_lse  # not alive during the next step's computation
        if pending is not None:
            k_block, v_block = ring.finish(pending)
            # The finished sends still hold the block just sent: let it go now, not when
            # the next step's exchange replaces them.
            pending = None
    return out.to(query.dtype), lse


def _ring_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
                   is_causal: bool, scale: float, ring: RingNeighbours, layout: str,
                   block_size: int, stats: RingStats | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key/value blocks go round the ring again; each block's gradient travels with
    it, gathering every rank's share, and reaches its owner after the last step.

    The key/value exchange is posted before a step's computation and overlaps it, as in
    the forward pass; the gradients' exchange is posted after it and waited on at once,
    so it does not overlap. The gradients travel in the compute dtype (float32 for
    half-precision inputs)."""
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
        if planned.kind != "skip":  # chapter 8's tile loop, with L of the whole sequence
            rows, cols, causal = planned.slices(n)
            step_grads = flash_attention_backward(
                query[..., rows, :], k_block[..., cols, :], v_block[..., cols, :],
                lse[..., rows, :], grad_out[..., rows, :], delta[..., rows, :], causal,
                scale, block_size=block_size)
            grad_query[..., rows, :] += step_grads[0]
            target_key[..., cols, :] += step_grads[1]
            target_value[..., cols, :] += step_grads[2]
            del step_grads
        sent = pending[2] if pending else 0
        if step >= 1:  # pass the gradient on; receive the next block's
            grads = ring.start([acc_key, acc_value])
            sent += grads[2]
            acc_key, acc_value = ring.finish(grads)
            del grads
        if stats is not None:
            stats.backward_bytes_sent += sent
            stats.backward_scores += planned.scores(n)
            stats.backward_score_blocks += planned.scores(n) / n**2
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
                is_causal: bool, scale: float, ring: RingNeighbours, layout: str,
                block_size: int, stats: RingStats | None) -> torch.Tensor:
        out, lse = ring_forward(query, key, value, is_causal, scale, ring, layout,
                                block_size, stats)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.args = (is_causal, scale, ring, layout, block_size, stats)
        return out

    @staticmethod
    @differentiable_once("attnlib.distributed.ring_attention")
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
        if check_layout(layout) == "zigzag" and query.shape[-2] % 2:
            raise ValueError(f"layout='zigzag' needs an even number of tokens per rank (two "
                             f"equal chunks), got {query.shape[-2]}")
        check_positive_int("block_size", block_size)
        if stats is not None and not isinstance(stats, RingStats):
            raise TypeError(f"stats must be a RingStats or None, got {type_name(stats)}")
    except (TypeError, ValueError) as exc:
        return exc
    return None


def _agree(metas: list[dict[str, Any]], rank: int) -> None:
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
                   layout: str = "contiguous", *, block_size: int = DEFAULT_BLOCK_SIZE,
                   stats: RingStats | None = None) -> torch.Tensor:
    """This rank's rows of ``softmax(Q K^T * scale) V`` over the whole sequence, by a ring.

    Call it on every rank of ``group`` at once, each with its own shard of one sequence
    (see :func:`shard_sequence`); the result is this rank's shard of
    :func:`torch.nn.functional.scaled_dot_product_attention` on the whole sequence. At
    each of ``P`` steps the rank computes its queries against the key/value block it
    holds, with chapter 8's tiled loop (:func:`ring_forward`), merges the partial result
    into its running one (:func:`merge_partials`), and passes the block to ``rank + 1``
    while receiving the next from ``rank - 1`` (``batch_isend_irecv``, posted before the
    computation: gloo and NCCL overlap the two). Under a causal mask a block entirely in
    the future of every query is skipped (:func:`ring_schedule`).

    The backward pass (a custom ``autograd.Function``) recomputes each step's weights
    from the saved log-sum-exp with chapter 8's tile loop
    (:func:`attnlib.flash.flash_attention_backward`, ``D = rowsum(dO * O)``), and sends
    the key/value blocks round the ring again rather than keep the ``P - 1`` visitors
    (the whole sequence's keys and values on every rank, the memory the ring avoids).
    Each block's gradient travels with it, in the compute dtype (float32 for half
    precision), and reaches its owner after the last step; that exchange waits at each
    step (:func:`ring_bytes_per_rank` counts both passes' bytes). Every rank must call
    ``backward``. Gradients equal the single-device ones up to rounding. Once
    differentiable: the backward pass cannot itself be differentiated.

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
        stats: keyword-only; a :class:`RingStats` that counts what this call sends and does.

    Returns:
        ``(batch, num_heads, n, d_v)``, this rank's rows of the output, in the input's
        dtype (half precision is computed in float32).

    Raises:
        RuntimeError: ``torch.distributed`` is unavailable or no process group is
            initialised (call ``torch.distributed.init_process_group`` first, or use
            :func:`run_on_ranks`); later, a backward pass through the gradients
            that this function's backward returned (it is differentiable once).
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
    ring-flash-attention and Megatron-LM's context parallelism; Dao (2023),
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
    ring = RingNeighbours(group, rank, world_size)
    out: torch.Tensor = _RingAttentionFunction.apply(
        query, key, value, bool(is_causal), meta["scale"], ring, layout, int(block_size),
        stats)
    return out
