"""A small, seeded training loop that records what chapter 10 plots.

:func:`train` fits a model such as :class:`attnlib.models.TinyTransformer` to
a toy task from :mod:`attnlib.data` with AdamW and next-token cross-entropy.
Every step draws a fresh batch from a generator seeded by ``seed``, so the
accuracy on that batch, measured before the update, is an honest estimate on
unseen data. Along the way it records the loss and accuracy of every step and,
at the steps asked for, snapshots of every layer's attention weights on a fixed
probe batch.

What the chapter measures on the heads: :func:`previous_token_score` and
:func:`prefix_matching_score` the two halves of the induction circuit, and
:func:`copying_score` the copying that, with prefix matching, defines an
induction head. :func:`ablate_head_into` removes one head's output from
what a later layer's queries, keys or values read, to show which of them the
induction circuit composes through. (:func:`attnlib.experiments.learning_phases`
measures the accuracy curves.)

Shape legend: ``batch`` sequences of ``num_tokens`` token ids; ``vocab_size``
logits per position; ``num_heads`` heads per layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._head_hooks import PROJECTIONS, cutting_inputs, recording_heads
from ._validation import check_bool, check_int, check_positive_int, type_name
from .data import IGNORE_INDEX
from .functional import causal_mask
from .models import TinyTransformer, TransformerBlock
from .multihead import MultiHeadAttention

__all__ = [
    "ABLATION_TARGETS",
    "TrainingHistory",
    "ablate_head_into",
    "accuracy",
    "copying_score",
    "prefix_matching_score",
    "previous_token_score",
    "train",
]


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of the scored positions where the most likely token is the target.

    Args:
        logits: ``(batch, num_tokens, vocab_size)``, float.
        targets: int64 ``(batch, num_tokens)``; positions holding
            :data:`attnlib.data.IGNORE_INDEX` are not scored.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        TypeError: ``logits`` is not a floating-point tensor or ``targets`` is
            not an int64 tensor.
        ValueError: the shapes do not match, or no position is scored.

    Source: top-1 accuracy of next-token prediction, as in the toy-task
    evaluations of Olsson et al. (2022), "In-context Learning and Induction
    Heads".
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point torch.Tensor, got {type_name(logits)}")
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.long:
        raise TypeError(f"targets must be an int64 torch.Tensor, got {type_name(targets)}")
    if logits.ndim != 3 or tuple(logits.shape[:2]) != tuple(targets.shape):
        raise ValueError(
            "logits must be (batch, num_tokens, vocab_size) and targets (batch, num_tokens), "
            f"got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    scored = targets != IGNORE_INDEX  # (batch, num_tokens)
    count = int(scored.sum())
    if count == 0:
        raise ValueError("targets has no scored position (all are IGNORE_INDEX)")
    correct = (logits.argmax(dim=-1) == targets) & scored  # (batch, num_tokens)
    return int(correct.sum()) / count


def _check_weights(attn_weights: object) -> None:
    if not isinstance(attn_weights, torch.Tensor) or not attn_weights.is_floating_point():
        raise TypeError(
            f"attn_weights must be a floating-point torch.Tensor, got {type_name(attn_weights)}"
        )
    if attn_weights.ndim != 4 or attn_weights.shape[-1] != attn_weights.shape[-2]:
        raise ValueError(
            "attn_weights must be (batch, num_heads, num_tokens, num_tokens), "
            f"got shape {tuple(attn_weights.shape)}"
        )


def _check_inputs_like(inputs: object, batch: int, num_tokens: int, against: str) -> None:
    if not isinstance(inputs, torch.Tensor) or inputs.dtype != torch.long:
        raise TypeError(f"inputs must be an int64 torch.Tensor, got {type_name(inputs)}")
    if tuple(inputs.shape) != (batch, num_tokens):
        raise ValueError(
            f"inputs must be (batch, num_tokens) = {(batch, num_tokens)} to match "
            f"{against}, got {tuple(inputs.shape)}"
        )


def _repeated_queries(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The targets and the counted queries of :func:`prefix_matching_score`.

    Returns ``(after, counted)``: bool ``(batch, num_tokens, num_tokens)``,
    ``after[b, t, j]`` true when ``j = s + 1`` for an ``s < t`` holding the
    token of ``t``; and bool ``(batch, num_tokens)``, true where a query has
    such a ``j``.

    Raises:
        ValueError: no token of ``inputs`` occurs twice in a sequence.
    """
    num_tokens = inputs.shape[1]
    same = inputs[:, :, None] == inputs[:, None, :]  # (batch, t, s): token s equals token t
    earlier = causal_mask(num_tokens, device=inputs.device).tril(-1)  # (t, s): s < t
    match = same & earlier  # (batch, t, s): s < t holds the current token
    after = torch.zeros_like(match)
    after[:, :, 1:] = match[:, :, :-1]  # (batch, t, j): j = s + 1 for such an s
    counted = after.any(dim=-1)  # (batch, t)
    if not counted.any():
        raise ValueError("no token of inputs occurs twice, so no query has an earlier match")
    return after, counted


def previous_token_score(attn_weights: torch.Tensor) -> torch.Tensor:
    """How much each head attends from every token to the token just before it.

    For head ``h`` the score is the mean, over the batch and the query
    positions ``t = 1 .. num_tokens - 1``, of ``attn_weights[b, h, t, t - 1]``:
    1 for a perfect previous-token head, about ``1 / (t + 1)`` on average for
    a head that spreads its weight evenly.

    Args:
        attn_weights: ``(batch, num_heads, num_tokens, num_tokens)``, rows are
            queries; ``num_tokens >= 2``.

    Returns:
        ``(num_heads,)``, in the dtype of ``attn_weights``.

    Raises:
        TypeError: ``attn_weights`` is not a floating-point tensor.
        ValueError: ``attn_weights`` is not 4-D with square last dimensions,
            or has fewer than 2 tokens.

    Source: the previous-token heads of Olsson et al. (2022), "In-context
    Learning and Induction Heads", section 2 (the first half of the induction
    circuit) and Elhage et al. (2021), "A Mathematical Framework for
    Transformer Circuits" (two-layer attention-only models).
    """
    _check_weights(attn_weights)
    if attn_weights.shape[-1] < 2:
        raise ValueError(
            f"previous_token_score needs num_tokens >= 2, got shape {tuple(attn_weights.shape)}"
        )
    below_diagonal = attn_weights.diagonal(offset=-1, dim1=-2, dim2=-1)
    # below_diagonal: (batch, num_heads, num_tokens - 1), entry t - 1 is weight[t, t - 1]
    return below_diagonal.mean(dim=(0, 2))  # (num_heads,)


def prefix_matching_score(attn_weights: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """How much each head attends to the token that followed an earlier copy of the query's.

    Let ``A(b, t)`` be the set of key positions ``s + 1`` such that ``s < t``
    and ``inputs[b, s] == inputs[b, t]``: the tokens that came right after an
    earlier occurrence of the current token. A query ``(b, t)`` counts when
    ``A(b, t)`` is not empty. For head ``h`` the score is the mean over the
    counted queries of ``sum(attn_weights[b, h, t, j] for j in A(b, t))``:
    1 for a perfect induction head, which puts all its weight there.

    Args:
        attn_weights: ``(batch, num_heads, num_tokens, num_tokens)``, rows are
            queries.
        inputs: the token ids the weights were computed on, int64
            ``(batch, num_tokens)``.

    Returns:
        ``(num_heads,)``, in the dtype of ``attn_weights``.

    Raises:
        TypeError: ``attn_weights`` is not a floating-point tensor, or
            ``inputs`` is not an int64 tensor.
        ValueError: the shapes do not agree, or no token of ``inputs`` occurs
            twice (no query counts).

    Source: Olsson et al. (2022), "In-context Learning and Induction Heads",
    section 2: an induction head's "prefix matching" (attending to the token
    that followed the current token earlier), measured on repeated random
    tokens.
    """
    _check_weights(attn_weights)
    batch, _, num_tokens, _ = attn_weights.shape
    _check_inputs_like(inputs, batch, num_tokens, f"attn_weights {tuple(attn_weights.shape)}")
    after, counted = _repeated_queries(inputs)  # (batch, t, j), (batch, t)
    num_counted = int(counted.sum())
    on_target = (attn_weights * after[:, None].to(attn_weights.dtype)).sum(dim=-1)
    # on_target: (batch, num_heads, num_tokens)
    counted_weights = on_target * counted[:, None].to(attn_weights.dtype)
    return counted_weights.sum(dim=(0, 2)) / num_counted  # (num_heads,)


def _attention(model: TinyTransformer, layer: int, needed_by: str) -> MultiHeadAttention:
    """Block ``layer``'s attention, checked to be (a subclass of) MultiHeadAttention."""
    # nn.ModuleList's items are typed nn.Module; TinyTransformer's are TransformerBlocks.
    attn = cast(TransformerBlock, model.blocks[layer]).attn
    if not isinstance(attn, MultiHeadAttention):
        raise ValueError(
            f"{needed_by} needs blocks of attnlib.MultiHeadAttention (or a subclass); "
            f"block {layer} has {type_name(attn)}"
        )
    return attn


@torch.no_grad()
def _head_outputs(
    model: TinyTransformer, inputs: torch.Tensor, layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What each head of block ``layer`` adds to the residual stream, and its weights.

    Returns ``(head_out, attn_weights)``: ``(batch, num_heads, num_tokens,
    d_model)``, recorded by :func:`recording_heads` (a hook on ``out_proj``'s
    input), and ``(batch, num_heads, num_tokens, num_tokens)``, from one forward
    pass of the model.
    """
    record: list[torch.Tensor] = []
    with recording_heads(_attention(model, layer, "_head_outputs"), record):
        _, attn_weights = model(inputs, return_weights=True)
    return record[0], attn_weights[layer]


def copying_score(model: TinyTransformer, inputs: torch.Tensor, layer: int) -> torch.Tensor:
    """How often each head's output raises most the logit of the token it attends to.

    For every query ``(b, t)`` that :func:`prefix_matching_score` counts (its
    token occurred before), take the key ``j`` that head ``h`` of block
    ``layer`` attends to most and the head's *direct* effect on the logits:
    its output ``o`` (its context vector times its columns of ``W^O``) sent
    through the final LayerNorm and the unembedding, ``W_U (gamma * (o -
    mean(o))) / sigma``. The score is the fraction of those queries at which
    the token ``inputs[b, j]`` gets the largest of these logits: 1 for a head
    that copies what it attends to, about ``1 / vocab_size`` for a head
    whose output is unrelated to it, 0 for one that suppresses it.

    The direct effect leaves out LayerNorm's shift ``beta`` and what later
    blocks do with the head's output. ``sigma``, the final LayerNorm's scale
    at that position, is the same for every token of the vocabulary, so it
    does not change which token is largest and the score does not need it.
    In an attention-only model the last block's heads reach the logits only
    by this path.

    Args:
        model: an :class:`attnlib.models.TinyTransformer` whose block
            ``layer`` uses :class:`attnlib.MultiHeadAttention` or a subclass of
            it. Run in ``eval()`` mode and left in the mode it was in.
        inputs: token ids, int64 ``(batch, num_tokens)``, in which some token
            occurs twice in a sequence.
        layer: the block whose heads are scored, ``0 .. num_layers - 1``.

    Returns:
        ``(num_heads,)`` float32, each in ``[0, 1]``.

    Raises:
        TypeError: ``model`` is not a ``TinyTransformer``, ``inputs`` is not
            an int64 tensor, or ``layer`` is not an int.
        ValueError: ``layer`` is out of range, its attention is not a
            ``MultiHeadAttention``, ``inputs`` is not accepted by the model's
            ``forward``, or no token of ``inputs`` occurs twice.

    Source: Olsson et al. (2022), "In-context Learning and Induction Heads",
    "Key Concepts": an induction head does prefix matching and *copying*
    ("the head's output increases the logit corresponding to the attended-to
    token"); the direct path from a head to the logits of Elhage et al.
    (2021), "A Mathematical Framework for Transformer Circuits". Olsson et al.
    summarise copying by the eigenvalues of the head's OV circuit; this score
    measures it on the head's actual outputs instead.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be an attnlib.models.TinyTransformer, got {type_name(model)}")
    layer = check_int("layer", layer)
    if not 0 <= layer < model.num_layers:
        raise ValueError(
            f"layer must lie in 0 .. num_layers - 1 = {model.num_layers - 1}, got layer={layer}"
        )
    _attention(model, layer, "copying_score")
    was_training = model.training
    model.eval()
    try:
        head_out, attn_weights = _head_outputs(model, inputs, layer)  # checks inputs
        centred = head_out - head_out.mean(dim=-1, keepdim=True)  # (b, heads, tokens, d_model)
        direct = (centred * model.final_norm.weight) @ model.out_head.weight.T
        # direct: (b, num_heads, num_tokens, vocab_size), up to the positive 1 / sigma
    finally:
        model.train(was_training)
    _, counted = _repeated_queries(inputs)  # (batch, num_tokens)
    attended = attn_weights.argmax(dim=-1)  # (b, num_heads, num_tokens): the key j
    attended_token = torch.gather(
        inputs[:, None, :].expand_as(attended), 2, attended
    )  # (b, num_heads, num_tokens): inputs[b, j]
    copies = (direct.argmax(dim=-1) == attended_token) & counted[:, None]
    return copies.sum(dim=(0, 2)).float() / counted.sum()  # (num_heads,)


#: The inputs of an attention layer that :func:`ablate_head_into` can cut.
ABLATION_TARGETS = tuple(PROJECTIONS)  # ("queries", "keys", "values")


def _check_heads(source_head: object, num_heads: int) -> list[int]:
    heads = list(source_head) if isinstance(source_head, (tuple, list)) else [source_head]
    checked = [check_int("source_head", h) for h in heads]
    if not checked or any(not 0 <= h < num_heads for h in checked):
        raise ValueError(
            f"source_head must be a head in 0 .. num_heads - 1 = {num_heads - 1} (or a "
            f"non-empty tuple of them), got source_head={source_head!r}"
        )
    return checked


@torch.no_grad()
def ablate_head_into(
    model: TinyTransformer,
    inputs: torch.Tensor,
    source_layer: int,
    source_head: int | tuple[int, ...],
    target_layer: int,
    into: Iterable[str] = ABLATION_TARGETS,
    *,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Logits with one head's output removed from what a later layer's Q, K or V read.

    Head ``h = source_head`` of block ``source_layer`` adds ``o_h = c_h
    W^O_h`` to the residual stream (its context vectors times its columns of
    ``out_proj``; the bias is not the head's and stays). Block
    ``target_layer`` normally computes its queries, keys and values all from
    ``norm_1(x)``. Here, for each name in ``into``, that projection reads
    ``norm_1(x - o_h)`` instead, while the others read ``norm_1(x)`` and the
    residual stream itself, which carries ``o_h`` on to the later blocks and
    the unembedding, is left alone. So ``into={"keys"}`` asks: what if the
    target layer's keys could not see this head (K-composition cut), with
    everything else as before? ``into=()`` is the ordinary forward pass.

    The head is removed by subtracting its output (zero ablation) from the
    direct path only: when blocks lie between the two layers, what they made
    of ``o_h`` stays. Everything runs in the model's own forward pass (with
    ``return_weights=True``): hooks read ``o_h`` where the source layer's
    ``out_proj`` reads its heads, and replace the output of the target
    layer's cut projections (``W_query``, ``W_key``, ``W_value``). Those hooks
    run because that pass takes the readable path, under ``torch.no_grad()``:
    the fused path of :meth:`attnlib.MultiHeadAttention.project` applies the
    three weights without calling the projections, and their hooks would not
    run (a forward that skips them raises the RuntimeError below).

    Args:
        model: an :class:`attnlib.models.TinyTransformer` whose blocks use
            :class:`attnlib.MultiHeadAttention` or a subclass of it (not the
            variants of :mod:`attnlib.variants`, nor KV sharing). Run in
            ``eval()`` mode and left in the mode it was in.
        inputs: token ids, int64 ``(batch, num_tokens)``.
        source_layer: the block of the removed head, ``0 .. num_layers - 2``.
        source_head: the head, ``0 .. num_heads - 1``, or a tuple of heads of
            that block, all removed.
        target_layer: the block whose inputs lose it, ``source_layer + 1 ..
            num_layers - 1``.
        into: the target block's projections that read the stream without the
            head, a subset of :data:`ABLATION_TARGETS` (``"queries"``,
            ``"keys"``, ``"values"``). Default: all three.
        return_weights: keyword-only; also return block ``target_layer``'s
            attention weights under the ablation. Default ``False``.

    Returns:
        ``logits``: ``(batch, num_tokens, vocab_size)``; with
        ``return_weights=True``, ``(logits, attn_weights)`` with
        ``attn_weights`` ``(batch, num_heads, num_tokens, num_tokens)``.

    Raises:
        TypeError: ``model`` is not a ``TinyTransformer``, ``inputs`` is not an
            int64 tensor, a layer or head is not an int, ``into`` is a string,
            or ``return_weights`` is not a bool.
        ValueError: a layer or head is out of range, ``target_layer`` is not
            after ``source_layer``, ``into`` names something other than
            ``"queries"``, ``"keys"`` or ``"values"``, the two blocks' attention
            is not a ``MultiHeadAttention``, the model shares keys and values
            between blocks, or ``inputs`` is not accepted by the model's
            ``forward``.
        RuntimeError: the target layer's forward did not call a cut
            projection as a module, so its hook could not cut it.

    Source: Elhage et al. (2021), "A Mathematical Framework for Transformer
    Circuits", section "Two-Layer Attention-Only Transformers": Q-, K- and
    V-composition, and induction heads formed by K-composition with a
    previous-token head; ablations of this kind in Olsson et al. (2022),
    "In-context Learning and Induction Heads".
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be an attnlib.models.TinyTransformer, got {type_name(model)}")
    source_layer = check_int("source_layer", source_layer)
    target_layer = check_int("target_layer", target_layer)
    if not 0 <= source_layer < target_layer < model.num_layers:
        raise ValueError(
            f"need 0 <= source_layer < target_layer <= num_layers - 1 = {model.num_layers - 1}, "
            f"got source_layer={source_layer}, target_layer={target_layer}"
        )
    if isinstance(into, str) or not isinstance(into, Iterable):
        raise TypeError(
            f"into must be a collection of names from {ABLATION_TARGETS}, got {type_name(into)}"
            f" into={into!r}"
        )
    cut = set(into)
    if not cut <= set(ABLATION_TARGETS):
        raise ValueError(
            f"into may only name {ABLATION_TARGETS}, got {sorted(cut - set(ABLATION_TARGETS))}"
        )
    check_bool("return_weights", return_weights)
    if model.kv_sharing > 1:
        raise ValueError("ablate_head_into needs kv_sharing=1 (every block its own keys)")
    source_attn = _attention(model, source_layer, "ablate_head_into")
    target_attn = _attention(model, target_layer, "ablate_head_into")
    heads = _check_heads(source_head, source_attn.num_heads)
    head_outputs: list[torch.Tensor] = []  # (b, num_heads, num_tokens, d_model)
    was_training = model.training
    model.eval()
    try:  # the readable path (return_weights=True) runs each projection as a module
        with recording_heads(source_attn, head_outputs), cutting_inputs(
            model.blocks[target_layer], target_attn, cut,
            lambda: head_outputs[-1][:, heads].sum(dim=1),  # (b, num_tokens, d_model)
        ) as ran:
            logits, weights = model(inputs, return_weights=True)
    finally:
        model.train(was_training)
    if sorted(ran) != sorted(cut):
        raise RuntimeError(f"{type_name(target_attn)}'s forward did not call its projections "
                           f"{sorted(cut)} as modules, so they could not be cut")
    if return_weights:
        return logits, weights[target_layer]
    return logits


@dataclass
class TrainingHistory:
    """What :func:`train` recorded.

    Attributes:
        losses: the cross-entropy of each step's batch, before the update
            (``num_steps`` floats).
        accuracies: :func:`accuracy` on each step's batch, before the update.
        snapshot_steps: the steps at which snapshots were taken (``0`` =
            before training, ``num_steps`` = after the last update).
        snapshots: for each snapshot step, a list with one tensor per layer
            of attention weights on the probe batch,
            ``(batch, num_heads, num_tokens, num_tokens)``, float32 on the CPU.
        seconds: wall-clock time of the whole run (varies between machines).
    """

    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    snapshot_steps: list[int] = field(default_factory=list)
    snapshots: list[list[torch.Tensor]] = field(default_factory=list)
    seconds: float = 0.0

    def snapshot_at(self, step: int) -> list[torch.Tensor]:
        """The per-layer attention weights recorded at ``step``.

        Raises:
            ValueError: no snapshot was taken at ``step``.
        """
        if step not in self.snapshot_steps:
            raise ValueError(f"no snapshot at step={step}; snapshots: {self.snapshot_steps}")
        return self.snapshots[self.snapshot_steps.index(step)]


def _snapshot(model: nn.Module, probe: torch.Tensor) -> list[torch.Tensor]:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        _, weights = model(probe, return_weights=True)
    model.train(was_training)
    return [w.detach().float().cpu().clone() for w in weights]


def train(
    model: nn.Module,
    make_batch: Callable[[torch.Generator], tuple[torch.Tensor, ...]],
    num_steps: int,
    *,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    seed: int = 0,
    probe: torch.Tensor | None = None,
    snapshot_steps: Iterable[int] = (),
    progress: bool = False,
) -> TrainingHistory:
    """Train ``model`` on fresh seeded batches and record losses, accuracy and attention.

    Each step draws ``inputs, targets = make_batch(generator)[:2]`` from one
    ``torch.Generator`` seeded with ``seed``, computes the next-token
    cross-entropy ``F.cross_entropy(logits, targets)`` (positions holding
    :data:`attnlib.data.IGNORE_INDEX` are skipped) and takes one AdamW step.
    The model's initial weights are not touched by ``seed``: seed torch before
    building the model. Nothing here draws from torch's global generator
    unless the model does (dropout).

    Args:
        model: maps int64 ``(batch, num_tokens)`` token ids to logits
            ``(batch, num_tokens, vocab_size)``, and with
            ``return_weights=True`` also returns a list of per-layer attention
            weights (as :class:`attnlib.models.TinyTransformer` does). Trained
            in place and left in training mode.
        make_batch: called with the generator; returns a tuple whose first two
            items are ``inputs`` and ``targets``, int64 ``(batch, num_tokens)``
            (e.g. ``lambda g: attnlib.data.reversal_batch(64, 8, 16, generator=g)``).
        num_steps: number of optimisation steps.
        lr: keyword-only; AdamW's learning rate. Default 1e-2 (toy models).
        weight_decay: keyword-only; AdamW's weight decay. Default 0.0.
        seed: keyword-only; seeds the batches. Default 0.
        probe: keyword-only; int64 ``(batch, num_tokens)`` token ids on which
            to record the attention weights. Required when ``snapshot_steps``
            is not empty.
        snapshot_steps: keyword-only; steps in ``0 .. num_steps`` at which to
            record the weights (step ``s`` = after ``s`` updates). Default none.
        progress: keyword-only; show a tqdm progress bar. Default ``False``,
            so that tests and notebooks stay quiet.

    Returns:
        A :class:`TrainingHistory`.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``make_batch`` is not
            callable, ``num_steps`` or ``seed`` is not an int, ``lr`` or
            ``weight_decay`` is not a number, ``progress`` is not a bool, or
            ``probe`` is not an int64 tensor.
        ValueError: ``num_steps`` is not positive, ``lr`` is not positive,
            ``weight_decay`` is negative, a snapshot step is outside
            ``0 .. num_steps``, or snapshots are asked for without a probe.

    Source: Loshchilov and Hutter (2019), "Decoupled Weight Decay
    Regularization" (AdamW); the next-token objective of Radford et al.
    (2018), "Improving Language Understanding by Generative Pre-Training",
    eq. (1).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type_name(model)}")
    if not callable(make_batch):
        raise TypeError(f"make_batch must be callable, got {type_name(make_batch)}")
    check_positive_int("num_steps", num_steps)
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float, got {type_name(value)} {name}={value!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got lr={lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got weight_decay={weight_decay}")
    check_int("seed", seed)
    check_bool("progress", progress)
    steps = sorted({check_int("snapshot step", s) for s in snapshot_steps})
    if steps and not (0 <= steps[0] and steps[-1] <= num_steps):
        raise ValueError(f"snapshot_steps must lie in 0 .. num_steps={num_steps}, got {steps}")
    if steps and probe is None:
        raise ValueError("snapshot_steps were given but no probe batch to record them on")
    if probe is not None and (not isinstance(probe, torch.Tensor) or probe.dtype != torch.long):
        raise TypeError(f"probe must be an int64 torch.Tensor of token ids, got {type_name(probe)}")

    generator = torch.Generator().manual_seed(int(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history = TrainingHistory()
    wanted = set(steps)
    model.train()
    start = time.perf_counter()
    if probe is not None and 0 in wanted:  # (wanted is empty without a probe)
        history.snapshot_steps.append(0)
        history.snapshots.append(_snapshot(model, probe))
    step_range = range(1, num_steps + 1)
    bar = None  # the tqdm progress bar over step_range, when asked for
    if progress:  # imported only when shown: tqdm.auto warns in a kernel without widgets
        from tqdm.auto import tqdm

        bar = tqdm(step_range, desc="training", leave=False)
    for step in step_range if bar is None else bar:
        inputs, targets = make_batch(generator)[:2]
        logits = model(inputs)  # (batch, num_tokens, vocab_size)
        loss = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
        )  # logits flattened to (batch * num_tokens, vocab_size)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.losses.append(float(loss.detach()))
        history.accuracies.append(accuracy(logits.detach(), targets))
        if bar is not None and step % 10 == 0:
            bar.set_postfix(loss=f"{history.losses[-1]:.3f}", acc=f"{history.accuracies[-1]:.2f}")
        if probe is not None and step in wanted:
            history.snapshot_steps.append(step)
            history.snapshots.append(_snapshot(model, probe))
    history.seconds = time.perf_counter() - start
    return history
