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
  causal mask the blocks from later ranks are entirely in the future and a rank's own
  block is half masked: rank 0 computes half an ``(n, n)`` block of scores, rank ``P-1``
  computes ``P - 1/2`` blocks.
* ``"zigzag"``: the sequence is cut into ``2P`` chunks and rank ``r`` holds chunks ``r``
  and ``2P-1-r``, so every rank has one early and one late chunk and, under a causal mask,
  the same work, ``P/2`` blocks (:func:`ring_schedule`; each diagonal block also computes
  the ``n/2`` scores of its diagonal, :meth:`RingStep.scores`).

:func:`ring_attention` runs inside an initialised process group (its forward loop is
:func:`ring_forward`; its backward reuses chapter 8's
:func:`attnlib.flash.flash_attention_backward` step by step); :func:`run_on_ranks`
starts one (``P`` fresh processes on this machine) and :func:`run_ring_demo` is the
measurement the chapter makes with it. Shapes: ``query``, ``key`` and ``value`` are
``(batch, num_heads, n, head_dim)`` shards (``value`` may have its own ``head_dim``).

Source: Liu, Zaharia and Abbeel (2023), "Ring Attention with Blockwise Transformers for
Near-Infinite Context", arXiv:2310.01889, section 3; Brandon et al.
(2023), "Striped Attention: Faster Ring Attention for Causal Transformers",
arXiv:2311.09431 (the causal imbalance); the zigzag layout of ring-flash-attention
(github.com/zhuzilin/ring-flash-attention, ``zigzag_ring_flash_attn``) and of
Megatron-LM's context parallelism (github.com/NVIDIA/Megatron-LM,
``get_batch_on_this_cp_rank``). Llama 3's training cut its sequences the same way but
all-gathered the keys and values instead of passing them round a ring (Llama Team 2024,
"The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.2).
"""

from __future__ import annotations

from ._launch import demo_inputs, run_on_ranks, run_ring_demo
from ._ring import RingNeighbours, RingStats, merge_partials, ring_attention, ring_forward
from ._schedule import RingStep, ring_bytes_per_rank, ring_schedule
from ._sharding import (
    LAYOUTS,
    shard_positions,
    shard_sequence,
    unshard_sequence,
    zigzag_shard,
    zigzag_unshard,
)

__all__ = [
    "LAYOUTS",
    "RingNeighbours",
    "RingStats",
    "RingStep",
    "merge_partials",
    "ring_attention",
    "ring_bytes_per_rank",
    "ring_forward",
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
