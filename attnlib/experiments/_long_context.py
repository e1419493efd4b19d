"""Chapter 9's measurements on a trained model: RoPE past the trained length,
and grouped-query attention made from a multi-head checkpoint.

Both start from the same models: :func:`train_rope_induction` trains a small
:class:`attnlib.TinyTransformer` with ``positional="rope"`` (multi-head: its
attention layers are :class:`attnlib.GroupedQueryAttention` with one key/value
head per query head) on chapter 10's induction task at one length ``L``.

* :func:`long_context_accuracy` evaluates such a model at longer lengths with
  each of :data:`ROPE_METHODS` (no scaling, position interpolation, NTK-aware,
  YaRN, Llama 3.1's rule), then fine-tunes a copy briefly at the longest
  length with each method and evaluates again: a :class:`LongContextAccuracy`.
* :func:`gqa_from_mha_accuracy` converts the same model to fewer key/value
  heads by mean-pooling the key and value projections within each group
  (:func:`mean_pool_kv_heads`), uptrains briefly, and compares with key/value
  heads that start at random: a :class:`GQAConversion`.

Every run is seeded and runs on one CPU thread in a few seconds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._validation import check_int, check_positive_int, type_name
from ..data import induction_batch
from ..gqa import GroupedQueryAttention
from ..models import TinyTransformer
from ..positional import RotaryPositionalEmbedding
from ..training import accuracy, train

__all__ = [
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
]

#: The RoPE variants :func:`long_context_accuracy` compares: ``"none"`` (the
#: trained rotation, extrapolated), then the ``rope_type`` names of
#: :class:`attnlib.RotaryPositionalEmbedding`'s ``scaling``.
ROPE_METHODS = ("none", "linear", "ntk", "yarn", "llama3")


def _check_model(model: object) -> TinyTransformer:
    if not isinstance(model, TinyTransformer) or model.positional != "rope":
        raise TypeError(
            "model must be an attnlib.TinyTransformer with positional='rope' "
            f"(train_rope_induction), got {type_name(model)}"
        )
    if model.kv_sharing != 1 or model.attention != "softmax":
        raise ValueError("model must use softmax attention with kv_sharing=1")
    return model


def _check_shape(prefix_len: int, repeat_len: int) -> None:
    check_positive_int("prefix_len", prefix_len)
    check_positive_int("repeat_len", repeat_len)
    if not 2 <= repeat_len <= prefix_len:
        raise ValueError(
            f"repeat_len must be in 2 .. prefix_len={prefix_len}, got repeat_len={repeat_len}"
        )


def _task(batch_size: int, prefix_len: int, repeat_len: int,
          vocab_size: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """The ``make_batch`` of :func:`attnlib.training.train` for one induction shape."""

    def make_batch(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return induction_batch(batch_size, prefix_len, repeat_len, vocab_size,
                               generator=generator)

    return make_batch


def train_rope_induction(
    seed: int,
    *,
    prefix_len: int = 12,
    repeat_len: int = 8,
    vocab_size: int = 64,
    max_factor: int = 4,
    d_model: int = 32,
    num_heads: int = 4,
    num_layers: int = 2,
    num_steps: int = 200,
    batch_size: int = 64,
    lr: float = 1e-2,
) -> TinyTransformer:
    """Train a RoPE :class:`attnlib.TinyTransformer` on induction at one length.

    The sequences have ``L = prefix_len + repeat_len`` tokens (a prefix of
    distinct tokens, then a stretch of it again at a random offset:
    :func:`attnlib.data.induction_batch`). The model is built for
    ``max_factor * L`` tokens, which RoPE allows without any new weight (its
    rotation tables are computed, not learned), so that it can later be run on
    longer sequences; it never sees one during training.

    Args:
        seed: seeds the initial weights (``torch.manual_seed``) and the batches.
        prefix_len, repeat_len: keyword-only; the task at length ``L``
            (defaults 12 and 8: ``L = 20``).
        vocab_size: keyword-only; default 64; must be at least
            ``max_factor * prefix_len`` (longer prefixes are evaluated later).
        max_factor: keyword-only; the longest evaluation length in units of
            ``L``. Default 4.
        d_model, num_heads, num_layers: keyword-only; the model (defaults 32,
            4, 2: head size 8, attention only).
        num_steps, batch_size, lr: keyword-only; AdamW training (defaults 200,
            64, 1e-2).

    Returns:
        The trained model, in evaluation mode.

    Raises:
        TypeError, ValueError: a size is not a positive int, ``repeat_len`` is
            outside ``2 .. prefix_len``, or ``vocab_size < max_factor *
            prefix_len``.

    Source: Olsson et al. (2022), "In-context Learning and Induction Heads"
    (the task); Su et al. (2021), RoFormer (RoPE).
    """
    check_int("seed", seed)
    _check_shape(prefix_len, repeat_len)
    for name, value in (("vocab_size", vocab_size), ("max_factor", max_factor),
                        ("batch_size", batch_size)):
        check_positive_int(name, value)
    if vocab_size < max_factor * prefix_len:
        raise ValueError(
            f"vocab_size={vocab_size} must be >= max_factor * prefix_len = "
            f"{max_factor * prefix_len}: the longest prefix holds distinct tokens"
        )
    length = prefix_len + repeat_len
    torch.manual_seed(seed)
    model = TinyTransformer(vocab_size, max_factor * length, d_model, num_heads, num_layers,
                            positional="rope")
    train(model, _task(batch_size, prefix_len, repeat_len, vocab_size), num_steps, lr=lr,
          seed=seed)
    return model.eval()


def rope_scaling(method: str, factor: float, original_length: int) -> dict[str, object] | None:
    """The ``scaling`` dict of one of :data:`ROPE_METHODS` for a context ``factor`` times longer.

    ``"none"``, and any method with ``factor <= 1``, give None (the trained
    rotation). ``"llama3"`` uses Llama 3.1's ``low_freq_factor=1``,
    ``high_freq_factor=4``; ``"yarn"`` its defaults.

    Raises:
        ValueError: ``method`` is not in :data:`ROPE_METHODS`, or ``factor``
            is not a positive number.
    """
    if method not in ROPE_METHODS:
        raise ValueError(f"method must be one of {ROPE_METHODS}, got method={method!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"factor must be a positive number, got factor={factor!r}")
    check_positive_int("original_length", original_length)
    if method == "none" or factor <= 1:
        return None
    scaling: dict[str, object] = {"rope_type": method, "factor": float(factor)}
    if method in ("yarn", "llama3"):
        scaling["original_max_position_embeddings"] = int(original_length)
    if method == "llama3":
        scaling.update(low_freq_factor=1.0, high_freq_factor=4.0)
    return scaling


def set_rope_scaling(model: TinyTransformer, scaling: dict[str, object] | None) -> None:
    """Give every attention layer of ``model`` a new RoPE with ``scaling`` (in place).

    The new :class:`attnlib.RotaryPositionalEmbedding` keeps the layer's
    ``head_dim``, ``context_length`` and ``base``; no weight changes.

    Raises:
        TypeError: ``model`` is not a RoPE ``TinyTransformer``.
    """
    _check_model(model)
    for block in model.blocks:
        attn: Any = block.attn
        old: RotaryPositionalEmbedding = attn.rope
        attn.rope = RotaryPositionalEmbedding(
            old.head_dim, old.context_length, old.base, scaling=scaling
        ).to(old.cos.device)


@torch.no_grad()
def evaluate_induction(
    model: nn.Module, prefix_len: int, repeat_len: int, *, num_sequences: int = 128,
    seed: int = 1000,
) -> float:
    """Next-token accuracy of ``model`` on ``num_sequences`` new induction sequences.

    Only the positions whose next token the prefix determines count
    (:func:`attnlib.training.accuracy`). The batch is drawn from a generator
    seeded with ``seed`` (default 1000, away from the training seeds). The
    model is left in evaluation mode.

    Raises:
        TypeError, ValueError: as :func:`attnlib.data.induction_batch`.
    """
    vocab_size = model.vocab_size if isinstance(model, TinyTransformer) else None
    if vocab_size is None:
        raise TypeError(f"model must be an attnlib.TinyTransformer, got {type_name(model)}")
    generator = torch.Generator().manual_seed(int(seed))
    inputs, targets, _ = induction_batch(num_sequences, prefix_len, repeat_len, vocab_size,
                                         generator=generator)
    model.eval()
    return accuracy(model(inputs), targets)


@dataclass(frozen=True)
class LongContextAccuracy:
    """What :func:`long_context_accuracy` measured.

    Attributes:
        train_length: ``L``, the training length.
        lengths: the evaluation lengths, ``factor * L`` for each factor.
        methods: the RoPE variants, rows of the tables (:data:`ROPE_METHODS`).
        finetune_steps: fine-tuning steps at the longest length.
        before: float64 ``(num_seeds, num_methods, num_lengths)``: accuracy
            of the trained model with each method, at each length, its factor
            ``length / L``.
        after: float64, same shape: accuracy after fine-tuning a copy with
            each method at the longest length (factor ``max(lengths) / L``),
            evaluated at each length with that same factor.
    """

    train_length: int
    lengths: tuple[int, ...]
    methods: tuple[str, ...]
    finetune_steps: int
    before: torch.Tensor
    after: torch.Tensor


def long_context_accuracy(
    models: Sequence[TinyTransformer],
    *,
    prefix_len: int = 12,
    repeat_len: int = 8,
    factors: Sequence[int] = (1, 2, 4),
    methods: Sequence[str] = ROPE_METHODS,
    finetune_steps: int = 20,
    finetune_batch: int = 16,
    lr: float = 1e-2,
) -> LongContextAccuracy:
    """Accuracy of RoPE models past their training length, per scaling method.

    For each model (trained at ``L = prefix_len + repeat_len`` by
    :func:`train_rope_induction` with the same ``prefix_len`` and
    ``repeat_len``) and each method, the model is evaluated on sequences of
    ``factor * L`` tokens (``factor * prefix_len`` prefix, ``factor *
    repeat_len`` repetition), its RoPE replaced by :func:`rope_scaling` for
    that factor. Then a copy with the scaling of the largest factor is
    fine-tuned for ``finetune_steps`` steps on sequences of the longest length
    (batches seeded by the method's index) and evaluated at every length with
    that scaling. The models passed in are not changed.

    Args:
        models: trained RoPE models (one per seed).
        prefix_len, repeat_len: keyword-only; the training task.
        factors: keyword-only; lengths in units of ``L``, each a positive int.
        methods: keyword-only; a subset of :data:`ROPE_METHODS`.
        finetune_steps, finetune_batch, lr: keyword-only; the fine-tune
            (defaults 20 steps of 16 sequences: at four times the length,
            as many tokens per step as :func:`train_rope_induction`'s 64).

    Returns:
        A :class:`LongContextAccuracy`.

    Raises:
        TypeError: a model is not a RoPE ``TinyTransformer``.
        ValueError: no model or factor; a factor or step count is not a
            positive int; an unknown method; a length past a model's
            ``context_length``.

    Source: Chen et al. (2023), "Extending Context Window of Large Language
    Models via Positional Interpolation" (interpolation, then fine-tuning);
    Peng et al. (2023), "YaRN", section 3; bloc97 (2023), NTK-aware scaling.
    """
    _check_shape(prefix_len, repeat_len)
    models = list(models)
    if not models:
        raise ValueError("models is empty: pass at least one trained model")
    for model in models:
        _check_model(model)
    factors = [check_positive_int("factor", f) for f in factors]
    if not factors:
        raise ValueError("factors is empty")
    methods = list(methods)
    for method in methods:
        rope_scaling(method, 1, 1)  # checks the name
    check_positive_int("finetune_steps", finetune_steps)
    check_positive_int("finetune_batch", finetune_batch)
    length = prefix_len + repeat_len
    longest = max(factors)
    for model in models:
        if longest * length > model.context_length:
            raise ValueError(
                f"length {longest * length} exceeds the model's context_length="
                f"{model.context_length}"
            )
    before = torch.zeros(len(models), len(methods), len(factors), dtype=torch.float64)
    after = torch.zeros_like(before)
    for s, model in enumerate(models):
        for m, method in enumerate(methods):
            work = copy.deepcopy(model)
            for f, factor in enumerate(factors):
                set_rope_scaling(work, rope_scaling(method, factor, length))
                before[s, m, f] = evaluate_induction(work, factor * prefix_len,
                                                     factor * repeat_len)
            set_rope_scaling(work, rope_scaling(method, longest, length))
            task = _task(finetune_batch, longest * prefix_len, longest * repeat_len,
                         work.vocab_size)
            train(work, task, finetune_steps, lr=lr, seed=m)
            for f, factor in enumerate(factors):
                after[s, m, f] = evaluate_induction(work, factor * prefix_len,
                                                    factor * repeat_len)
    return LongContextAccuracy(
        train_length=length, lengths=tuple(f * length for f in factors),
        methods=tuple(methods), finetune_steps=int(finetune_steps), before=before, after=after,
    )


def mean_pool_kv_heads(attn: GroupedQueryAttention, num_kv_groups: int) -> GroupedQueryAttention:
    """A copy of ``attn`` with ``num_kv_groups`` key/value heads, each the mean of its group's.

    Query heads ``g * group_size .. (g + 1) * group_size - 1`` share key/value
    head ``g`` (the ``repeat_interleave`` arrangement of
    :class:`attnlib.GroupedQueryAttention`), so the new ``W_key`` rows of head
    ``g`` are the mean of the old rows of those heads, and likewise for
    ``W_value`` (and their biases). Queries, output projection and RoPE are
    copied unchanged.

    Args:
        attn: a :class:`attnlib.GroupedQueryAttention` of exactly that class
            (with ``num_kv_groups = num_heads`` it is multi-head attention); a
            subclass such as :class:`attnlib.QKNormSinkAttention` is refused,
            since its parts (QK-norm, sinks, window) would be lost.
        num_kv_groups: the new number of key/value heads; must divide
            ``attn.num_kv_groups``.

    Returns:
        A new ``GroupedQueryAttention`` in ``attn``'s mode, dtype and device.

    Raises:
        TypeError: ``attn``'s type is not exactly ``GroupedQueryAttention``.
        ValueError: ``num_kv_groups`` is not a positive divisor of
            ``attn.num_kv_groups``.

    Source: Ainslie et al. (2023), "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints", section 2.1 (mean pooling).
    """
    if type(attn) is not GroupedQueryAttention:  # a subclass's own parts would be dropped
        raise TypeError(
            f"attn must be an attnlib.GroupedQueryAttention (not a subclass, whose parts the "
            f"pooled copy would drop), got {type_name(attn)}"
        )
    check_positive_int("num_kv_groups", num_kv_groups)
    if attn.num_kv_groups % num_kv_groups != 0:
        raise ValueError(
            f"num_kv_groups={num_kv_groups} must divide attn.num_kv_groups={attn.num_kv_groups}"
        )
    pooled = copy.deepcopy(attn)  # keeps rope, dropout, mask, dtype, device, mode
    new = GroupedQueryAttention(
        attn.d_in, attn.d_out, attn.context_length, attn.dropout_p, attn.num_heads,
        num_kv_groups, qkv_bias=attn.W_key.bias is not None,
        out_bias=attn.out_proj.bias is not None, head_dim=attn.head_dim,
        rope=attn.rope is not None,
        rope_base=attn.rope.base if attn.rope is not None else 10000.0,
    )
    merge = attn.num_kv_groups // num_kv_groups  # old key/value heads per new one
    with torch.no_grad():
        for name in ("W_key", "W_value"):
            old_linear, new_linear = getattr(attn, name), getattr(new, name)
            weight = old_linear.weight.reshape(num_kv_groups, merge, attn.head_dim, attn.d_in)
            new_linear.weight.copy_(weight.mean(dim=1).reshape(-1, attn.d_in))
            if old_linear.bias is not None:
                bias = old_linear.bias.reshape(num_kv_groups, merge, attn.head_dim)
                new_linear.bias.copy_(bias.mean(dim=1).reshape(-1))
        for name in ("W_query", "out_proj"):
            getattr(new, name).load_state_dict(getattr(attn, name).state_dict())
    new.rope = pooled.rope  # the same rotation, scaling included
    new = new.to(device=attn.W_query.weight.device, dtype=attn.W_query.weight.dtype)
    return new.train(attn.training)


def _convert(model: TinyTransformer, num_kv_groups: int, random_kv: bool,
             seed: int) -> TinyTransformer:
    """A copy of ``model`` whose attention layers have ``num_kv_groups`` key/value heads."""
    new = copy.deepcopy(model)
    torch.manual_seed(seed)
    block: Any
    for block in new.blocks:
        attn = mean_pool_kv_heads(block.attn, num_kv_groups)
        if random_kv:  # nn.Linear's own initialisation, as a model built from scratch
            attn.W_key.reset_parameters()
            attn.W_value.reset_parameters()
        block.attn = attn
    return new


@dataclass(frozen=True)
class GQAConversion:
    """What :func:`gqa_from_mha_accuracy` measured.

    Attributes:
        num_heads: query heads per layer of the multi-head model.
        num_kv_groups: the key/value head counts converted to (columns).
        uptrain_steps: steps of uptraining after the conversion.
        mha: float64 ``(num_seeds,)``: accuracy of the multi-head model.
        pooled_before, pooled_after: float64 ``(num_seeds, num_groups)``:
            mean-pooled key/value heads, before and after uptraining.
        random_before, random_after: float64 ``(num_seeds, num_groups)``: the
            same model with its key/value projections drawn afresh.
        cache_bytes_per_token: int64 ``(num_groups,)``: float32 KV-cache
            bytes per token of the whole model (all layers) for each column;
            ``mha_cache_bytes_per_token`` is the multi-head model's.
    """

    num_heads: int
    num_kv_groups: tuple[int, ...]
    uptrain_steps: int
    mha: torch.Tensor
    pooled_before: torch.Tensor
    pooled_after: torch.Tensor
    random_before: torch.Tensor
    random_after: torch.Tensor
    cache_bytes_per_token: torch.Tensor
    mha_cache_bytes_per_token: int


def gqa_from_mha_accuracy(
    models: Sequence[TinyTransformer],
    *,
    num_kv_groups: Sequence[int] = (2, 1),
    prefix_len: int = 12,
    repeat_len: int = 8,
    uptrain_steps: int = 10,
    batch_size: int = 64,
    lr: float = 1e-2,
) -> GQAConversion:
    """Induction accuracy of multi-head models converted to GQA and MQA.

    Each model (multi-head, from :func:`train_rope_induction`) is copied with
    every attention layer converted by :func:`mean_pool_kv_heads`, and once
    more with the same layers but key/value projections freshly initialised
    (``nn.Linear.reset_parameters``, seeded by the model's index); each copy
    is evaluated at the training length, uptrained for ``uptrain_steps`` steps
    on the training task (the same batches for both), and evaluated again.

    Args:
        models: trained multi-head RoPE models (one per seed).
        num_kv_groups: keyword-only; key/value head counts to convert to, each
            dividing the models' ``num_heads`` (1 is multi-query attention).
        prefix_len, repeat_len: keyword-only; the training task.
        uptrain_steps, batch_size, lr: keyword-only; the uptraining (default
            10 steps: 5 % of :func:`train_rope_induction`'s 200, the share
            Ainslie et al. found enough).

    Returns:
        A :class:`GQAConversion`.

    Raises:
        TypeError: a model is not a RoPE ``TinyTransformer``.
        ValueError: no model, a count that does not divide ``num_heads``, or a
            step count that is not a positive int.

    Source: Ainslie et al. (2023), "GQA", sections 2.1 (mean pooling, then
    uptraining for a fraction alpha = 0.05 of the pre-training steps) and the
    ablation of conversion methods (mean pooling, the first head, random).
    """
    _check_shape(prefix_len, repeat_len)
    models = list(models)
    if not models:
        raise ValueError("models is empty: pass at least one trained model")
    for model in models:
        _check_model(model)
    groups = [check_positive_int("num_kv_groups", g) for g in num_kv_groups]
    num_heads = models[0].num_heads
    for g in groups:
        if num_heads % g != 0:
            raise ValueError(f"num_kv_groups={g} does not divide num_heads={num_heads}")
    check_positive_int("uptrain_steps", uptrain_steps)
    check_positive_int("batch_size", batch_size)
    shape = (len(models), len(groups))
    results = {name: torch.zeros(shape, dtype=torch.float64)
               for name in ("pooled_before", "pooled_after", "random_before", "random_after")}
    mha = torch.zeros(len(models), dtype=torch.float64)
    for s, model in enumerate(models):
        mha[s] = evaluate_induction(model, prefix_len, repeat_len)
        for j, g in enumerate(groups):
            for kind in ("pooled", "random"):
                new = _convert(model, g, kind == "random", seed=s)
                results[f"{kind}_before"][s, j] = evaluate_induction(new, prefix_len, repeat_len)
                task = _task(batch_size, prefix_len, repeat_len, new.vocab_size)
                train(new, task, uptrain_steps, lr=lr, seed=10_000 + s)
                results[f"{kind}_after"][s, j] = evaluate_induction(new, prefix_len, repeat_len)
    first: Any = models[0].blocks[0]
    head_dim = int(first.attn.head_dim)
    layers = models[0].num_layers

    def cache(g: int) -> int:  # keys and values, float32, every layer
        return 2 * g * head_dim * 4 * layers

    return GQAConversion(
        num_heads=num_heads, num_kv_groups=tuple(groups), uptrain_steps=int(uptrain_steps),
        mha=mha, **results,
        cache_bytes_per_token=torch.tensor([cache(g) for g in groups], dtype=torch.int64),
        mha_cache_bytes_per_token=cache(num_heads),
    )
