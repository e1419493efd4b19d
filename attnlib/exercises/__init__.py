"""Checkers for the course's exercises: they test what an answer *does*.

A checker takes the learner's answer (a function, a module class or a
tensor), probes its behaviour with seeded inputs of unequal sizes, and either
prints one short line and returns ``True``, or raises :class:`CheckFailed`
(an ``AssertionError``) whose message names the likely mistake. It never reads
the answer's source and never changes the global random state.

Usage in a notebook::

    from attnlib.exercises import check_softmax
    check_softmax(my_softmax)

In an instructor's pytest file, call the checker inside a test: a failed check
is a failed test. The page "Using attnlib in your own exercises" of the book
shows both and how to add a checker.

Checkers are grouped by concept in the submodules of this package and all
re-exported here.
"""

from ._common import CheckFailed
from .basics import (
    check_qkv_projection,
    check_scaled_dot_product_attention,
    check_simplified_attention,
    check_softmax,
)
from .beyond import check_absorbed_query, check_delta_rule_step, check_sink_softmax
from .distributed import check_causal_ring_steps, check_lse_merge, check_zigzag_shard
from .efficient import check_flash_attention, check_online_softmax
from .kernel import check_delta_kernel, check_logsumexp_kernel
from .kernel_tiles import check_block_size, check_causal_stages, check_kv_pair
from .learning import check_prefix_matching_score
from .llm import check_kv_cache_mask, check_repeat_kv, check_rope
from .masks import check_causal_attention, check_causal_mask
from .modules import check_self_attention_v2, check_weight_transfer
from .multihead import check_merge_heads, check_multi_head_attention
from .padding import check_cross_attention, check_padding_mask
from .position import check_sinusoidal_encoding
from .scaling import check_query_jacobian, check_scaled_scores

__all__ = [
    "CheckFailed",
    "check_absorbed_query",
    "check_block_size",
    "check_causal_attention",
    "check_causal_mask",
    "check_cross_attention",
    "check_causal_ring_steps",
    "check_causal_stages",
    "check_delta_kernel",
    "check_delta_rule_step",
    "check_flash_attention",
    "check_kv_cache_mask",
    "check_kv_pair",
    "check_logsumexp_kernel",
    "check_lse_merge",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_online_softmax",
    "check_padding_mask",
    "check_prefix_matching_score",
    "check_qkv_projection",
    "check_query_jacobian",
    "check_repeat_kv",
    "check_rope",
    "check_scaled_dot_product_attention",
    "check_scaled_scores",
    "check_self_attention_v2",
    "check_simplified_attention",
    "check_sink_softmax",
    "check_sinusoidal_encoding",
    "check_softmax",
    "check_weight_transfer",
    "check_zigzag_shard",
]
