"""Chapter 13's DeepSeek Sparse Attention at toy scale: a lightning indexer taught
to follow a trained model's attention, then top-k training.

DeepSeek-V3.2-Exp is DeepSeek-V3.1-Terminus with a lightning indexer in every attention
layer and trained in two stages (DeepSeek-AI 2025, section 2.1, "continued pre-training"):

1. *dense warm-up*: the model keeps its dense attention and is frozen; only the
   indexer learns, by the KL divergence from the main attention's distribution
   (summed over the heads, L1-normalised over the keys) to the softmax of its
   index scores;
2. *sparse training*: each query attends to its ``top_k`` keys by the index;
   the model learns from the language-model loss, the indexer from the same KL
   divergence restricted to the chosen keys, its input detached so that the
   two are optimised separately.

:func:`train_dsa_induction` does both on the induction task with
:class:`attnlib.TinyTransformer` whose attention is :class:`IndexedAttention`
(after a dense stage that stands for the pre-trained model), and measures the
held-out accuracy with dense and top-k attention and the indexer's agreement with
the dense attention's own top-k (:func:`indexer_agreement`) at each stage.

Shapes: ``(batch, num_tokens, d_model)`` as in :mod:`attnlib.models`;
``num_heads`` attention heads of ``head_dim = d_model // num_heads``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._validation import check_bool, check_positive_int
from ..data import IGNORE_INDEX, induction_batch
from ..functional import causal_mask
from ..models import TinyTransformer
from ..sparse import LightningIndexer, top_k_mask
from ..training import accuracy, train

__all__ = [
    "IndexedAttention",
    "indexer_agreement",
    "captured_weight",
    "DSATraining",
    "train_dsa_induction",
]


class IndexedAttention(nn.Module):
    """Causal multi-head softmax attention with a lightning indexer beside it.

    ``mode`` decides what a forward does:

    * ``"dense"``: causal attention over every earlier key; the indexer is not run.
    * ``"warmup"``: the same attention, and the indexer's KL loss to it
      (:attr:`indexer_loss`) over every visible key.
    * ``"sparse"``: each query attends only to its ``top_k`` keys by the index
      (:func:`attnlib.sparse.top_k_mask`; computed as masked attention, which
      equals :func:`attnlib.sparse.sparse_attention`), and the indexer's KL
      loss over those keys.

    The KL loss is ``KL(p || softmax(I))`` averaged over the batch and the
    queries, where ``p`` is the attention weights (detached), summed over the
    heads and divided by their sum, and ``I`` the index scores, both over the
    keys the query attends to. The indexer reads the block's input detached,
    so the language-model loss never trains it and its loss never trains the
    model.

    Args:
        d_model: input and output size.
        context_length: the most tokens.
        num_heads: attention heads; must divide ``d_model``.
        top_k: keyword-only; keys per query in ``"sparse"`` mode. Default 4.
        num_index_heads: keyword-only; indexer heads. Default 2.
        index_head_dim: keyword-only; size of an indexer query and key. Default 8.
        rope_head_dim: keyword-only; the indexer's RoPE components. Default 4.

    Attributes:
        indexer: the :class:`attnlib.sparse.LightningIndexer` (queries from the
            token itself: ``q_lora_rank=None``).
        mode: ``"dense"`` (default), ``"warmup"`` or ``"sparse"``.
        indexer_loss: the last forward's KL loss (a scalar tensor), or None in
            ``"dense"`` mode.
        attn_weights: the last forward's attention weights, detached,
            ``(batch, num_heads, num_tokens, num_tokens)``.
        index_scores: the last forward's index scores, detached,
            ``(batch, num_tokens, num_tokens)``, or None in ``"dense"`` mode.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size is not positive or ``d_model`` is not divisible by
            ``num_heads``.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp", section 1 (the indexer
    and the top-k selection) and section 2.1 (the KL losses of the dense
    warm-up and of sparse training; the detached indexer input).
    """

    MODES = ("dense", "warmup", "sparse")

    def __init__(
        self,
        d_model: int,
        context_length: int,
        num_heads: int,
        *,
        top_k: int = 4,
        num_index_heads: int = 2,
        index_head_dim: int = 8,
        rope_head_dim: int = 4,
    ) -> None:
        for name, value in (("d_model", d_model), ("context_length", context_length),
                            ("num_heads", num_heads), ("top_k", top_k)):
            check_positive_int(name, value)
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        super().__init__()
        self.d_model, self.num_heads = int(d_model), int(num_heads)
        self.head_dim = self.d_model // self.num_heads
        self.top_k = int(top_k)
        self.W_query = nn.Linear(d_model, d_model, bias=False)
        self.W_key = nn.Linear(d_model, d_model, bias=False)
        self.W_value = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model)
        self.indexer = LightningIndexer(d_model, context_length, num_index_heads,
                                        index_head_dim, rope_head_dim=rope_head_dim)
        self.mode = "dense"
        self.indexer_loss: torch.Tensor | None = None
        self.attn_weights: torch.Tensor | None = None
        self.index_scores: torch.Tensor | None = None

    def forward(
        self, x: torch.Tensor, return_weights: bool = False, *, kv_cache: object = None
    ) -> torch.Tensor:
        """Attention of ``x``: ``(batch, num_tokens, d_model)`` in and out.

        Raises:
            ValueError: ``mode`` is not one of :attr:`MODES`, ``return_weights``
                is True or a ``kv_cache`` is given (run the whole sequence).
        """
        check_bool("return_weights", return_weights)
        if return_weights or kv_cache is not None:
            raise ValueError(
                "IndexedAttention supports neither return_weights nor a KV cache; read "
                "its attn_weights attribute after a forward of the whole sequence"
            )
        if self.mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got mode={self.mode!r}")
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        queries = self.W_query(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        keys = self.W_key(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        values = self.W_value(x).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        allowed = causal_mask(n, device=x.device)  # (n, n), True = may attend
        index_scores = None
        if self.mode != "dense":
            index_scores = self.indexer(x.detach())  # (b, n, n): its own optimisation
            if self.mode == "sparse":
                allowed = top_k_mask(index_scores.detach(), self.top_k)  # (b, n, n)
        attn_scores = queries @ keys.transpose(-2, -1) * d**-0.5  # (b, h, n, n)
        attn_scores = attn_scores.masked_fill(~allowed.unsqueeze(-3), float("-inf"))
        attn_weights = attn_scores.softmax(dim=-1)  # (b, h, n, n)
        self.attn_weights = attn_weights.detach()
        self.index_scores = None if index_scores is None else index_scores.detach()
        self.indexer_loss = None
        if index_scores is not None:
            target = self.attn_weights.sum(1)  # (b, n, n): summed over the heads
            target = target / target.sum(-1, keepdim=True)  # L1-normalised per query
            kept = allowed.expand(b, n, n)
            log_index = index_scores.masked_fill(~kept, float("-inf")).log_softmax(-1)
            log_index = log_index.masked_fill(~kept, 0.0)  # (b, n, n), 0 where unseen
            kl = (torch.xlogy(target, target) - target * log_index).sum(-1)  # (b, n)
            self.indexer_loss = kl.mean()
        context_vec = (attn_weights @ values).transpose(1, 2).reshape(b, n, self.d_model)
        # context_vec: (b, n, d_model)
        return self.out_proj(context_vec)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, top_k={self.top_k}, "
                f"mode={self.mode!r}")


def _check_agreement_inputs(
    attn_weights: torch.Tensor, index_scores: torch.Tensor, top_k: int
) -> int:
    if attn_weights.ndim != 4 or attn_weights.shape[:1] + attn_weights.shape[2:] != (
        index_scores.shape
    ):
        raise ValueError(
            "attn_weights must be (batch, num_heads, num_tokens, num_tokens) and index_scores "
            f"(batch, num_tokens, num_tokens), got {tuple(attn_weights.shape)} and "
            f"{tuple(index_scores.shape)}"
        )
    top_k = check_positive_int("top_k", top_k)
    n = index_scores.shape[1]
    if n <= top_k:
        raise ValueError(f"no query sees more than top_k={top_k} of num_tokens={n} keys")
    return top_k


def indexer_agreement(
    attn_weights: torch.Tensor, index_scores: torch.Tensor, top_k: int
) -> float:
    """Share of the dense attention's ``top_k`` keys that the index's ``top_k`` keeps too.

    The dense attention's ranking is its weights summed over the heads; both
    choices are causal (:func:`attnlib.sparse.top_k_mask`). Only queries that
    see more than ``top_k`` keys count (the others keep all they see).

    Args:
        attn_weights: ``(batch, num_heads, num_tokens, num_tokens)``, dense
            causal attention weights.
        index_scores: ``(batch, num_tokens, num_tokens)``.
        top_k: keys per query.

    Returns:
        The mean over those queries of ``|both| / top_k``, in ``[0, 1]``.

    Raises:
        TypeError, ValueError: as :func:`attnlib.sparse.top_k_mask`; a
            ``ValueError`` also when the shapes do not match or no query sees
            more than ``top_k`` keys.
    """
    top_k = _check_agreement_inputs(attn_weights, index_scores, top_k)
    dense = top_k_mask(attn_weights.sum(1), top_k)  # (b, n, n)
    chosen = top_k_mask(index_scores, top_k)  # (b, n, n)
    both = (dense & chosen).sum(-1)[:, top_k:]  # (b, n - top_k): queries past top_k keys
    return (both.double() / top_k).mean().item()


def captured_weight(
    attn_weights: torch.Tensor, index_scores: torch.Tensor, top_k: int
) -> float:
    """Share of the dense attention's weight that falls on the index's ``top_k`` keys.

    The weights are averaged over the heads; the index's choice is causal
    (:func:`attnlib.sparse.top_k_mask`). Only queries that see more than
    ``top_k`` keys count. Where the dense attention puts nearly all its weight
    on one or two keys, this is near 1 even when the lesser keys of the two
    top-``k`` lists differ (:func:`indexer_agreement`).

    Args:
        attn_weights: ``(batch, num_heads, num_tokens, num_tokens)``, dense
            causal attention weights.
        index_scores: ``(batch, num_tokens, num_tokens)``.
        top_k: keys per query.

    Returns:
        The mean over those queries, in ``[0, 1]``.

    Raises:
        TypeError, ValueError: as :func:`indexer_agreement`.
    """
    top_k = _check_agreement_inputs(attn_weights, index_scores, top_k)
    chosen = top_k_mask(index_scores, top_k)  # (b, n, n)
    weight = (attn_weights.mean(1) * chosen).sum(-1)[:, top_k:]  # (b, n - top_k)
    return weight.double().mean().item()


@dataclass(frozen=True)
class DSATraining:
    """What :func:`train_dsa_induction` measured, on held-out induction sequences.

    Attributes:
        dense_accuracy: after the dense stage, with dense attention.
        sparse_accuracy_untrained: the same model with top-k attention chosen
            by the untrained indexer.
        agreement_untrained: :func:`indexer_agreement` of the untrained
            indexer, averaged over the layers.
        weight_untrained: :func:`captured_weight` of the untrained indexer,
            averaged over the layers.
        sparse_accuracy_warmed_up: top-k attention after the dense warm-up
            (the model's weights are still the dense stage's).
        agreement_warmed_up: the agreement after the warm-up.
        weight_warmed_up: the captured weight after the warm-up.
        sparse_accuracy: top-k attention after sparse training.
        agreement_sparse: the agreement after sparse training (with the
            model's dense attention at that point).
        weight_sparse: the captured weight after sparse training.
        warmup_losses: the indexers' KL loss (summed over the layers) before
            each warm-up step and after the last.
    """

    dense_accuracy: float
    sparse_accuracy_untrained: float
    agreement_untrained: float
    weight_untrained: float
    sparse_accuracy_warmed_up: float
    agreement_warmed_up: float
    weight_warmed_up: float
    sparse_accuracy: float
    agreement_sparse: float
    weight_sparse: float
    warmup_losses: tuple[float, ...]


def _layers(model: TinyTransformer) -> list[IndexedAttention]:
    return [m for m in model.modules() if isinstance(m, IndexedAttention)]


def _indexer_loss(layers: list[IndexedAttention]) -> torch.Tensor:
    """The sum of the layers' last KL losses."""
    losses = [layer.indexer_loss for layer in layers if layer.indexer_loss is not None]
    return torch.stack(losses).sum()


def _evaluate(model: TinyTransformer, inputs: torch.Tensor, targets: torch.Tensor,
              top_k: int) -> tuple[float, float, float, float]:
    """(dense accuracy, top-k accuracy, agreement, captured weight) on a held-out batch."""
    layers = _layers(model)
    model.eval()
    with torch.no_grad():
        for layer in layers:
            layer.mode = "warmup"  # dense attention, and the index scores beside it
        dense = accuracy(model(inputs), targets)
        agreement = weight = 0.0
        for layer in layers:
            assert layer.attn_weights is not None and layer.index_scores is not None
            agreement += indexer_agreement(layer.attn_weights, layer.index_scores, top_k)
            weight += captured_weight(layer.attn_weights, layer.index_scores, top_k)
        agreement, weight = agreement / len(layers), weight / len(layers)
        for layer in layers:
            layer.mode = "sparse"
        sparse = accuracy(model(inputs), targets)
    model.train()
    return dense, sparse, agreement, weight


def train_dsa_induction(
    seed: int,
    *,
    prefix_len: int = 16,
    repeat_len: int = 8,
    vocab_size: int = 32,
    d_model: int = 32,
    num_heads: int = 2,
    num_layers: int = 2,
    top_k: int = 4,
    num_index_heads: int = 2,
    index_head_dim: int = 8,
    rope_head_dim: int = 4,
    dense_steps: int = 300,
    warmup_steps: int = 100,
    sparse_steps: int = 100,
    lr: float = 1e-2,
    batch_size: int = 64,
    test_size: int = 512,
) -> DSATraining:
    """Train a tiny model densely, warm its indexers up, then train it sparsely.

    An attention-only :class:`attnlib.TinyTransformer` (learned positions)
    with :class:`IndexedAttention` in every block is trained on
    :func:`attnlib.data.induction_batch` with dense attention for
    ``dense_steps`` AdamW steps (:func:`attnlib.training.train`; the stand-in
    for the pre-trained dense model). Then, as DeepSeek-V3.2:

    1. dense warm-up, ``warmup_steps`` AdamW steps on the indexers alone (the
       rest frozen) minimising their KL losses to the dense attention;
    2. sparse training, ``sparse_steps`` AdamW steps on everything with top-k
       attention, minimising the cross-entropy plus the indexers' KL losses
       over the chosen keys (the indexers' input detached, so each loss trains
       only its own part).

    Measured on ``test_size`` held-out sequences after the dense stage, after
    the warm-up and after sparse training. Seeded: the model from ``seed``,
    the batches from one generator seeded with ``seed`` per stage, the test
    set from ``seed + 1000``.

    Args:
        seed: the seed of the model, its batches and the test set.
        prefix_len, repeat_len, vocab_size: keyword-only; the task
            (:func:`attnlib.data.induction_batch`). Defaults 16, 8, 32.
        d_model, num_heads, num_layers: keyword-only; the model. Defaults 32, 2, 2.
        top_k: keyword-only; keys per query in sparse attention. Default 4.
        num_index_heads, index_head_dim, rope_head_dim: keyword-only; each
            layer's :class:`attnlib.sparse.LightningIndexer`. Defaults 2, 8, 4.
        dense_steps, warmup_steps, sparse_steps: keyword-only; the stages'
            AdamW steps. Defaults 300, 100, 100.
        lr: keyword-only; AdamW's learning rate in every stage. Default 1e-2.
        batch_size, test_size: keyword-only; sequences per step and in the
            test set. Defaults 64, 512.

    Returns:
        A :class:`DSATraining`.

    Raises:
        TypeError, ValueError: a size or step count is not a positive int
            (``warmup_steps`` and ``sparse_steps`` may be 0), or as
            :func:`attnlib.data.induction_batch` for the task's sizes.

    Source: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp: Boosting Long-Context
    Efficiency with DeepSeek Sparse Attention", section 2.1 (continued
    pre-training: dense warm-up stage, eq. (3); sparse training stage, eq. (4)).
    """
    for name, value in (("d_model", d_model), ("num_heads", num_heads),
                        ("num_layers", num_layers), ("dense_steps", dense_steps),
                        ("batch_size", batch_size), ("test_size", test_size)):
        check_positive_int(name, value)
    for name, value in (("warmup_steps", warmup_steps), ("sparse_steps", sparse_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {name}={value!r}")
    num_tokens = prefix_len + repeat_len
    test_inputs, test_targets, _ = induction_batch(
        test_size, prefix_len, repeat_len, vocab_size,
        generator=torch.Generator().manual_seed(seed + 1000),
    )
    torch.manual_seed(seed)
    model = TinyTransformer(vocab_size, num_tokens, d_model=d_model, num_heads=num_heads,
                            num_layers=num_layers)
    for block in model.blocks:
        block.attn = IndexedAttention(
            d_model, num_tokens, num_heads, top_k=top_k, num_index_heads=num_index_heads,
            index_head_dim=index_head_dim, rope_head_dim=rope_head_dim,
        )
    layers = _layers(model)

    def batches(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return induction_batch(batch_size, prefix_len, repeat_len, vocab_size,
                               generator=generator)

    # The dense model (the indexers are built but not run, so not trained).
    train(model, batches, dense_steps, lr=lr, seed=seed)
    dense, sparse_untrained, agree_untrained, weight_untrained = _evaluate(
        model, test_inputs, test_targets, top_k
    )

    # 1. Dense warm-up: only the indexers learn, from the dense attention.
    indexer_params = {id(p) for layer in layers for p in layer.indexer.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in indexer_params)  # the model frozen
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr
    )
    generator = torch.Generator().manual_seed(seed)
    for layer in layers:
        layer.mode = "warmup"
    losses = []
    for step in range(warmup_steps + 1):
        model(batches(generator)[0])
        loss = _indexer_loss(layers)
        losses.append(loss.item())
        if step == warmup_steps:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for p in model.parameters():
        p.requires_grad_(True)
    _, sparse_warm, agree_warm, weight_warm = _evaluate(model, test_inputs, test_targets,
                                                        top_k)

    # 2. Sparse training: the model from the cross-entropy, the indexers from their KL.
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + 1)
    for layer in layers:
        layer.mode = "sparse"
    for _ in range(sparse_steps):
        inputs, targets, *_ = batches(generator)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                               ignore_index=IGNORE_INDEX)
        loss = loss + _indexer_loss(layers)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    _, sparse, agree_sparse, weight_sparse = _evaluate(model, test_inputs, test_targets,
                                                       top_k)
    return DSATraining(dense, sparse_untrained, agree_untrained, weight_untrained,
                       sparse_warm, agree_warm, weight_warm, sparse, agree_sparse,
                       weight_sparse, tuple(losses))

