"""Measured experiments behind the course's claims, starting with why attention
scores are divided by ``sqrt(d_k)``.

Chapter 3's experiments draw queries and keys whose components are independent
standard normal numbers (mean 0, variance 1), the setting of Vaswani et al.
(2017), footnote 4, and measure what happens as the key dimension ``d_k``
grows, with and without the ``1 / sqrt(d_k)`` scale:

* :func:`dot_product_variance` - the variance of ``q . k`` (it grows like ``d_k``).
* :func:`softmax_peakiness` - the largest attention weight and the entropy of
  the weights (the softmax becomes one-hot).
* :func:`query_gradient_norm` - the size of the gradient that reaches each
  query, ``d w / d q`` including the chain-rule factor of the scale (scaled,
  it keeps one size; unscaled, it becomes heavy-tailed), built on
  :func:`softmax_jacobian`.

Every function is seeded (``seed``) and deterministic: it draws its random
numbers in float32, computes with them in float64, and returns a small frozen
dataclass of float64 tensors with one entry per ``d_k``, ready to print or
plot. With the defaults and ``d_ks = [1, 2, 4, ..., 1024]`` each takes about a
second on a 2-core CPU, and memory stays at a few MB (draws are chunked).

Shape legend: ``num_d_k`` is ``len(d_ks)``; ``num_samples`` is the number of
independent draws per ``d_k``; ``num_tokens`` is the number of keys each query
attends over.

Chapter 4's experiment asks whether the initialisation decides how attention
learns: :func:`train_marked_token` trains ``SelfAttention_v1``'s forward from
each start in :data:`INITIALISATIONS`, several seeds at once, on
:func:`marked_token_batch`'s task, and returns a :class:`MarkedTokenTraining`.

Chapter 10's measurement of a training curve: :func:`learning_phases` splits
the accuracies that :func:`attnlib.training.train` records into a *plateau*
(steps until the running mean passes a low accuracy) and a *rise* (steps from
there to a high one), built on :func:`steps_to_accuracy`, and returns a
:class:`LearningPhases`.

Chapter 9's measurements on a trained RoPE model (:func:`train_rope_induction`):
:func:`long_context_accuracy` (accuracy past the trained length with each of
:data:`ROPE_METHODS`, before and after a short fine-tune) and
:func:`gqa_from_mha_accuracy` (multi-head attention converted to GQA and MQA by
:func:`mean_pool_kv_heads`, then uptrained).

Chapter 13's measurements: :func:`train_stream_model` trains
:func:`rope_transformer` (RoPE, optionally with sink logits or QK-norm) on
:func:`induction_stream`; :func:`streaming_logits` and :func:`position_accuracy`
run it on a longer stream with a sliding window, with the first tokens kept
(StreamingLLM), or densely; :func:`attention_logit_max` measures the logits
QK-norm bounds. :func:`decode_cost` counts the FLOPs and bytes per cached token
of a decoding step (MHA, GQA, MLA naive and absorbed) for the roofline of
:func:`attainable_flops`.

Chapter 13's DeepSeek Sparse Attention: :func:`train_dsa_induction` trains a
model whose attention is :class:`IndexedAttention` densely, warms its lightning
indexers up by a KL loss to the dense attention, then trains it with top-k
attention, measuring accuracy, :func:`indexer_agreement` and
:func:`captured_weight` at each stage (a :class:`DSATraining`); in ``_dsa``.

The code lives by concept in private modules (``_scaling`` for chapter 3,
``_initialisation`` for chapter 4, ``_long_context`` for chapter 9,
``_phase_change`` for chapter 10, ``_streaming`` and ``_decode_cost`` for
chapter 13,
``_common`` for what they share); every
public name is re-exported here, so use ``from attnlib import experiments`` and
``experiments.<name>``. The public constants are defined here, before those
modules are imported, so that they are documented in one place.
"""

from __future__ import annotations

from ._decode_cost import (
    DECODE_ATTENTION_KINDS as _DECODE_ATTENTION_KINDS,
)
from ._decode_cost import (
    DEEPSEEK_V3_ATTENTION as _DEEPSEEK_V3_ATTENTION,
)
from ._decode_cost import (
    H100_SXM as _H100_SXM,
)
from ._decode_cost import (
    DecodeCost,
    attainable_flops,
    decode_cost,
)
from ._dsa import (
    DSATraining,
    IndexedAttention,
    captured_weight,
    indexer_agreement,
    train_dsa_induction,
)
from ._initialisation import (
    INITIALISATIONS as _INITIALISATIONS,
)
from ._initialisation import (
    OPTIMIZERS as _OPTIMIZERS,
)
from ._initialisation import (
    MarkedTokenTraining,
    marked_token_batch,
    train_marked_token,
)
from ._long_context import (
    ROPE_METHODS as _ROPE_METHODS,
)
from ._long_context import (
    GQAConversion,
    LongContextAccuracy,
    evaluate_induction,
    gqa_from_mha_accuracy,
    long_context_accuracy,
    mean_pool_kv_heads,
    rope_scaling,
    set_rope_scaling,
    train_rope_induction,
)
from ._phase_change import (
    LearningPhases,
    learning_phases,
    steps_to_accuracy,
)
from ._scaling import (
    DotProductVariance,
    QueryGradientNorm,
    SoftmaxPeakiness,
    dot_product_variance,
    query_gradient_norm,
    softmax_jacobian,
    softmax_peakiness,
)
from ._streaming import (
    StreamTraining,
    attention_logit_max,
    induction_stream,
    position_accuracy,
    rope_transformer,
    streaming_logits,
    train_stream_model,
)

# Re-bound here so that the API page finds their descriptions (sphinx reads ``#:``
# comments in the module that lists the names); the values live in _initialisation.

#: The starts :func:`train_marked_token` compares. The first two are the
#: classes' own; the last two change ``torch.rand``'s draws in one respect each
#: (centred on zero; shrunk to the width of ``nn.Linear``'s range), to test
#: which property of the ``torch.rand`` start matters. ``value_init`` can give
#: ``W_value`` another of these starts than ``W_query`` and ``W_key``, to test
#: which matrices carry the difference.
INITIALISATIONS = _INITIALISATIONS

#: The optimisers :func:`train_marked_token` can train with.
OPTIMIZERS = _OPTIMIZERS

#: The RoPE variants :func:`long_context_accuracy` compares: ``"none"`` (the
#: trained rotation, run past the trained length), then the ``rope_type`` names
#: of :class:`attnlib.RotaryPositionalEmbedding`'s ``scaling``.
ROPE_METHODS = _ROPE_METHODS

#: The kinds of attention :func:`decode_cost` counts: ``"mha"``, ``"gqa"``,
#: ``"mla_naive"`` (the latent up-projected for every cached token) and
#: ``"mla_absorbed"`` (the up-projections moved onto the query and output).
DECODE_ATTENTION_KINDS = _DECODE_ATTENTION_KINDS

#: DeepSeek-V3's attention shapes, from ``deepseek-ai/DeepSeek-V3``'s
#: ``config.json``, 128 heads, query/key parts of 128 (no position) + 64 (RoPE), values of 128,
#: a latent of 512; keyword arguments of :func:`decode_cost`.
DEEPSEEK_V3_ATTENTION = _DEEPSEEK_V3_ATTENTION

#: An NVIDIA H100 SXM by its datasheet, ``peak_flops`` 989.5e12 (dense bfloat16
#: Tensor Cores, half the rate quoted with sparsity) and
#: ``hbm_bytes_per_second`` 3.35e12, the numbers of chapter 11's roofline.
H100_SXM = _H100_SXM

__all__ = [
    "DotProductVariance",
    "SoftmaxPeakiness",
    "QueryGradientNorm",
    "dot_product_variance",
    "softmax_peakiness",
    "query_gradient_norm",
    "softmax_jacobian",
    "INITIALISATIONS",
    "OPTIMIZERS",
    "MarkedTokenTraining",
    "marked_token_batch",
    "train_marked_token",
    "LearningPhases",
    "learning_phases",
    "steps_to_accuracy",
    "ROPE_METHODS",
    "LongContextAccuracy",
    "GQAConversion",
    "train_rope_induction",
    "rope_scaling",
    "set_rope_scaling",
    "evaluate_induction",
    "long_context_accuracy",
    "mean_pool_kv_heads",
    "gqa_from_mha_accuracy",
    "IndexedAttention",
    "indexer_agreement",
    "captured_weight",
    "DSATraining",
    "train_dsa_induction",
    "induction_stream",
    "rope_transformer",
    "StreamTraining",
    "train_stream_model",
    "streaming_logits",
    "attention_logit_max",
    "position_accuracy",
    "DECODE_ATTENTION_KINDS",
    "DEEPSEEK_V3_ATTENTION",
    "H100_SXM",
    "DecodeCost",
    "decode_cost",
    "attainable_flops",
]
