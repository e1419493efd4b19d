"""Chapter 13's streaming experiment: a model trained on short sequences, run on a
stream several times as long with a sliding window, with the first tokens kept
(StreamingLLM), or with a learned sink logit (gpt-oss).

The model is chapter 10's two-layer :class:`attnlib.TinyTransformer` with RoPE
(:func:`rope_transformer`, whose attention layers are
:class:`attnlib.QKNormSinkAttention`, with QK-norm or sink logits if asked),
trained (:func:`train_stream_model`) on a stream of chapter 10's induction
episodes (:func:`induction_stream`: a prefix of distinct tokens, a
stretch of it again, then the next episode). :func:`streaming_logits` then
runs it on a longer stream as a decoder with a bounded KV cache would:

* ``window=W``: each token attends to the last ``W`` tokens (itself
  included), each of whose keys and values was computed once, when that
  token arrived, from its own window (StreamingLLM's "window attention");
* ``num_sink_tokens=s`` as well: the first ``s`` tokens of the stream stay in
  the cache, and positions are counted inside the cache, as StreamingLLM does:
  the ``s`` kept tokens at ``0 .. s - 1``, the window after them, so no query
  sees a distance it did not see in training;
* ``window=None``: every earlier token, at its position in the stream, beyond
  any trained length ("dense attention").

:func:`position_accuracy` scores each position of the stream.

Shape legend: ``batch`` streams of ``num_tokens`` token ids; ``num_layers``
blocks of ``num_heads`` heads of ``head_dim``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import torch

from .._validation import check_bool, check_int, check_positive_int, type_name
from ..data import IGNORE_INDEX, induction_batch
from ..functional import causal_mask, sliding_window_mask
from ..gqa import GroupedQueryAttention
from ..models import TinyTransformer, TransformerBlock
from ..positional import RotaryPositionalEmbedding
from ..sinks import QKNormSinkAttention, softmax_with_sinks
from ..training import train

__all__ = [
    "induction_stream",
    "rope_transformer",
    "StreamTraining",
    "train_stream_model",
    "streaming_logits",
    "attention_logit_max",
    "position_accuracy",
]


def induction_stream(
    batch_size: int,
    num_tokens: int,
    *,
    prefix_len: int = 16,
    repeat_len: int = 8,
    vocab_size: int = 32,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Streams of induction episodes, back to back, cut to ``num_tokens``.

    Each episode is a row of :func:`attnlib.data.induction_batch`: ``P =
    prefix_len`` distinct tokens, then ``R = repeat_len`` of them again from a
    random offset; the next episode follows at once, so a stream's episodes
    start at multiples of ``P + R``. An episode's tokens may occur in the
    episodes before it, so the model must find the *latest* occurrence of the
    current token.

    Args:
        batch_size: streams.
        num_tokens: tokens per stream.
        prefix_len, repeat_len, vocab_size: keyword-only; the episodes' shape
            (defaults 16, 8, 32: chapter 10's task).
        generator: keyword-only; the ``torch.Generator`` to draw from.

    Returns:
        ``(inputs, targets)``, int64 ``(batch_size, num_tokens)``: ``targets``
        holds the next token where the episode fixes it (inside a repetition)
        and :data:`attnlib.data.IGNORE_INDEX` elsewhere.

    Raises:
        TypeError, ValueError: a size is not a positive int, or as
            :func:`attnlib.data.induction_batch` for the episodes' shape.

    Source: Olsson et al. (2022), "In-context Learning and Induction Heads"
    (repeated random tokens).
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("num_tokens", num_tokens)
    episode = prefix_len + repeat_len
    num_episodes = -(-num_tokens // episode)  # ceil
    inputs, targets, _ = induction_batch(
        batch_size * num_episodes, prefix_len, repeat_len, vocab_size, generator=generator
    )  # (batch_size * num_episodes, episode) each
    inputs = inputs.reshape(batch_size, num_episodes * episode)[:, :num_tokens]
    targets = targets.reshape(batch_size, num_episodes * episode)[:, :num_tokens]
    return inputs, targets.clone()  # (batch_size, num_tokens) each


def rope_transformer(
    seed: int,
    context_length: int,
    *,
    vocab_size: int = 32,
    d_model: int = 32,
    num_heads: int = 2,
    num_layers: int = 2,
    sinks: bool = False,
    qk_norm: bool = False,
) -> TinyTransformer:
    """Chapter 10's attention-only model with RoPE, and optionally sinks or QK-norm.

    A :class:`attnlib.TinyTransformer` with ``positional="rope"`` whose
    attention layers are replaced by :class:`attnlib.QKNormSinkAttention`
    built with ``rope=True``, ``sinks`` and ``qk_norm`` (one key/value head per
    query head: multi-head attention). The projections draw the same initial weights with
    and without these options, so models that differ only in them start alike.

    Args:
        seed: seeds the initial weights (``torch.manual_seed``).
        context_length: the longest sequence the model's own ``forward`` takes.
        vocab_size, d_model, num_heads, num_layers: keyword-only; defaults 32,
            32, 2, 2 (heads of 16).
        sinks: keyword-only; a learned sink logit per head (gpt-oss).
        qk_norm: keyword-only; RMS-normalise each query and key head.

    Returns:
        The model, in training mode.

    Raises:
        TypeError, ValueError: as :class:`attnlib.TinyTransformer`, or a flag
            is not a bool.

    Source: OpenAI (2025), "gpt-oss-120b & gpt-oss-20b Model Card", section
    2.1 (sinks); Dehghani et al. (2023), "Scaling Vision Transformers to 22
    Billion Parameters", section 3.1 (QK-norm).
    """
    check_int("seed", seed)
    check_bool("sinks", sinks)
    check_bool("qk_norm", qk_norm)
    torch.manual_seed(seed)
    model = TinyTransformer(vocab_size, context_length, d_model, num_heads, num_layers,
                            positional="rope")
    for block in model.blocks:
        cast(TransformerBlock, block).attn = QKNormSinkAttention(
            d_model, d_model, context_length, 0.0, num_heads, num_heads, rope=True,
            sinks=sinks, qk_norm=qk_norm,
        )
    return model


@dataclass
class StreamTraining:
    """What :func:`train_stream_model` returns.

    Attributes:
        model: the trained model, in evaluation mode.
        losses: the cross-entropy of each step's batch, before the update.
        record_steps: the steps at which ``max_logits`` were recorded (0 =
            before training).
        max_logits: :func:`attention_logit_max` on the probe, the largest over
            the layers, at each of ``record_steps``.
    """

    model: TinyTransformer
    losses: list[float] = field(default_factory=list)
    record_steps: list[int] = field(default_factory=list)
    max_logits: list[float] = field(default_factory=list)


def train_stream_model(
    seed: int,
    *,
    context_length: int = 48,
    sinks: bool = False,
    qk_norm: bool = False,
    lr: float = 1e-2,
    num_steps: int = 300,
    batch_size: int = 64,
    record_every: int | None = None,
) -> StreamTraining:
    """Train :func:`rope_transformer` on :func:`induction_stream` windows.

    Each step draws ``batch_size`` fresh streams of ``context_length`` tokens
    (chapter 10's episodes, 16 + 8 tokens) and takes one AdamW step
    (:func:`attnlib.training.train`) on the repetitions' next tokens.

    Args:
        seed: seeds the initial weights and the batches.
        context_length: keyword-only; the training length. Default 48 (two
            episodes).
        sinks, qk_norm: keyword-only; as :func:`rope_transformer`.
        lr: keyword-only; AdamW's learning rate. Default 1e-2.
        num_steps, batch_size: keyword-only; defaults 300 and 64.
        record_every: keyword-only; record :func:`attention_logit_max` on a
            fixed probe of 64 streams every this many steps (and after the
            last). Default None: no record.

    Returns:
        A :class:`StreamTraining`.

    Raises:
        TypeError, ValueError: a size is not a positive int, a flag not a
            bool, or as :func:`attnlib.training.train` for ``lr``.

    Source: the induction task of Olsson et al. (2022); AdamW (Loshchilov and
    Hutter 2019).
    """
    check_positive_int("context_length", context_length)
    check_positive_int("batch_size", batch_size)
    check_positive_int("num_steps", num_steps)
    if record_every is not None:
        check_positive_int("record_every", record_every)
    model = rope_transformer(seed, context_length, sinks=sinks, qk_norm=qk_norm)
    result = StreamTraining(model)
    probe, _ = induction_stream(64, context_length, generator=torch.Generator().manual_seed(7))
    step = 0

    def make_batch(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        nonlocal step
        if record_every is not None and step % record_every == 0:
            result.record_steps.append(step)
            result.max_logits.append(float(attention_logit_max(model, probe).max()))
        step += 1
        return induction_stream(batch_size, context_length, generator=generator)

    history = train(model, make_batch, num_steps, lr=lr, seed=seed)
    if record_every is not None:
        result.record_steps.append(num_steps)
        result.max_logits.append(float(attention_logit_max(model, probe).max()))
    result.losses = history.losses
    model.eval()
    return result


def _check_model(model: object) -> TinyTransformer:
    if not isinstance(model, TinyTransformer) or not all(
        isinstance(attn, GroupedQueryAttention) and attn.rope is not None
        for attn in (cast(TransformerBlock, block).attn for block in model.blocks)
    ):
        raise TypeError(
            "model must be an attnlib.TinyTransformer with positional='rope' "
            f"(rope_transformer), got {type_name(model)}"
        )
    return model


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation in the half-split layout of :class:`attnlib.RotaryPositionalEmbedding`."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def _stream_forward(
    model: TinyTransformer, idx: torch.Tensor, window: int | None, num_sink_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, max_logit)``: ``(batch, num_tokens, vocab_size)`` and ``(num_layers,)``."""
    b, n = idx.shape
    x = model.tok_emb(idx)  # (b, n, d_model); RoPE adds nothing here
    allowed = sliding_window_mask(n, n if window is None else window, device=idx.device)
    positions = torch.arange(n, device=idx.device)
    if num_sink_tokens > 0 and window is not None:
        allowed = allowed.clone()  # (n, n), True = may attend
        # the sink columns see causal attention: key j < s for queries t >= j
        allowed[:, :num_sink_tokens] = causal_mask(n, device=idx.device)[:, :num_sink_tokens]
        # Inside the cache the query sits at position min(t, s + W - 1).
        query_positions = positions.clamp(max=num_sink_tokens + window - 1)
    max_logits = []
    for module in model.blocks:
        block = cast(TransformerBlock, module)  # ModuleList items are typed nn.Module
        attn = cast(GroupedQueryAttention, block.attn)  # as _check_model checked
        assert attn.rope is not None  # (the same)
        h, d = attn.num_heads, attn.head_dim
        normed = block.norm_1(x)  # (b, n, d_model)
        queries = attn.W_query(normed).view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)
        keys = attn.W_key(normed).view(b, n, attn.num_kv_groups, d).transpose(1, 2)
        values = attn.W_value(normed).view(b, n, attn.num_kv_groups, d).transpose(1, 2)
        keys = keys.repeat_interleave(attn.group_size, dim=1)  # (b, h, n, d)
        values = values.repeat_interleave(attn.group_size, dim=1)  # (b, h, n, d)
        parts = attn if isinstance(attn, QKNormSinkAttention) else None  # chapter 13's
        if parts is not None and parts.qk_norm is not None:
            queries, keys = parts.qk_norm(queries, keys)
        rope = RotaryPositionalEmbedding(d, n, attn.rope.base).to(idx.device)
        cos, sin = rope.cos.to(x.dtype), rope.sin.to(x.dtype)  # (n, d) each
        rotated_keys = _rotate(keys, cos, sin)  # (b, h, n, d)
        attn_scores = _rotate(queries, cos, sin) @ rotated_keys.transpose(-2, -1)
        # attn_scores: (b, h, n, n), query t at position t, key j at j
        if num_sink_tokens > 0 and window is not None:
            sink_queries = _rotate(queries, cos[query_positions], sin[query_positions])
            sink_scores = sink_queries @ rotated_keys[:, :, :num_sink_tokens].transpose(-2, -1)
            # sink_scores: (b, h, n, num_sink_tokens), at the positions inside the cache
            attn_scores = torch.cat((sink_scores, attn_scores[..., num_sink_tokens:]), dim=-1)
        attn_scores = attn_scores / math.sqrt(d)
        max_logits.append(attn_scores.masked_fill(~allowed, 0.0).abs().amax())
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
        if parts is not None and parts.sinks is not None:
            attn_weights = softmax_with_sinks(attn_scores, parts.sinks.sinks)
        else:
            attn_weights = attn_scores.softmax(dim=-1)  # (b, h, n, n)
        context_vec = (attn_weights @ values).transpose(1, 2).reshape(b, n, h * d)
        x = x + attn.out_proj(context_vec)  # (b, n, d_model)
        if block.mlp is not None and block.norm_2 is not None:
            x = x + block.mlp(block.norm_2(x))
    logits = model.out_head(model.final_norm(x))  # (b, n, vocab_size)
    return logits, torch.stack(max_logits)


def _check_policy(
    model: object, idx: object, window: int | None, num_sink_tokens: int
) -> TinyTransformer:
    checked = _check_model(model)
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long or idx.ndim != 2:
        raise TypeError(f"idx must be an int64 (batch, num_tokens) tensor, got {type_name(idx)}")
    if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= checked.vocab_size:
        raise ValueError(f"idx must hold token ids in 0 .. {checked.vocab_size - 1}")
    if window is not None:
        check_positive_int("window", window)
    check_int("num_sink_tokens", num_sink_tokens, minimum=0)
    if num_sink_tokens > 0 and window is None:
        raise ValueError(
            f"num_sink_tokens={num_sink_tokens} needs a window: without one every token is kept"
        )
    return checked


def streaming_logits(
    model: TinyTransformer,
    idx: torch.Tensor,
    *,
    window: int | None = None,
    num_sink_tokens: int = 0,
) -> torch.Tensor:
    """Next-token logits of a stream of any length, as a decoder with a bounded cache gives.

    For the query at position ``t`` each layer attends to:

    * ``window=None``: keys ``0 .. t``, rotated by their own positions (dense
      attention, past the trained length once ``t >= context_length``);
    * ``window=W``: the last ``W`` keys, ``t - W + 1 .. t``, which with RoPE
      is the same as counting positions inside the cache (the scores depend
      only on distances);
    * and ``num_sink_tokens=s``: also keys ``0 .. s - 1``, at the positions
      they hold in StreamingLLM's cache: the query at ``min(t, s + W - 1)``,
      the kept tokens at ``0 .. s - 1``. The cache then holds ``s + W``
      tokens.

    Every token's keys and values in a layer are those it got when it arrived
    (computed from its own window below), as in a KV cache; nothing is
    recomputed. With ``window=None`` and ``num_tokens <= context_length``, the
    logits are the model's own ``forward``.

    Args:
        model: a :func:`rope_transformer` (a ``TinyTransformer`` with RoPE
            whose attention layers are :class:`attnlib.GroupedQueryAttention`
            or its subclass :class:`attnlib.QKNormSinkAttention`), with or
            without sinks and QK-norm.
        idx: token ids, int64 ``(batch, num_tokens)``; any ``num_tokens``.
        window: keyword-only; recent tokens each query sees, itself included.
            Default None (all).
        num_sink_tokens: keyword-only; first tokens kept. Default 0.

    Returns:
        ``logits``: ``(batch, num_tokens, vocab_size)``.

    Raises:
        TypeError: ``model`` is not such a model, or ``idx`` is not an int64
            2-D tensor.
        ValueError: ``idx`` holds an id outside the vocabulary or no token;
            ``window`` is not positive; ``num_sink_tokens`` is negative, or
            positive without a ``window``.

    Source: Xiao et al. (2023), "Efficient Streaming Language Models with
    Attention Sinks", sections 3.2 (window attention and StreamingLLM) and
    3.3 (positions assigned within the cache).
    """
    checked = _check_policy(model, idx, window, num_sink_tokens)
    return _stream_forward(checked, idx, window, num_sink_tokens)[0]


def attention_logit_max(model: TinyTransformer, idx: torch.Tensor) -> torch.Tensor:
    """The largest attention logit of each layer on ``idx``, with dense causal attention.

    The logit is the scaled score ``q . k / sqrt(head_dim)`` before the
    softmax (after QK-norm and RoPE where the model has them); the largest
    absolute value over the batch, the heads and the visible pairs.

    Args:
        model: as :func:`streaming_logits`.
        idx: token ids, int64 ``(batch, num_tokens)``.

    Returns:
        ``(num_layers,)``, float, detached.

    Raises:
        TypeError, ValueError: as :func:`streaming_logits`.

    Source: Dehghani et al. (2023), "Scaling Vision Transformers to 22 Billion
    Parameters", section 3.1; Wortsman et al. (2023), "Small-scale proxies for
    large-scale Transformer training instabilities", section 3.1 (attention
    logit growth).
    """
    checked = _check_policy(model, idx, None, 0)
    with torch.no_grad():
        return _stream_forward(checked, idx, None, 0)[1]


def position_accuracy(
    model: TinyTransformer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    window: int | None = None,
    num_sink_tokens: int = 0,
) -> torch.Tensor:
    """Accuracy at each position of a stream under :func:`streaming_logits`' policy.

    Args:
        model, inputs, window, num_sink_tokens: as :func:`streaming_logits`
            (``inputs`` is its ``idx``).
        targets: int64 ``(batch, num_tokens)``; positions holding
            :data:`attnlib.data.IGNORE_INDEX` are not scored.

    Returns:
        float64 ``(num_tokens,)``: the fraction of the batch whose most likely
        token is the target, NaN where no row is scored.

    Raises:
        TypeError, ValueError: as :func:`streaming_logits`, or ``targets`` is
            not an int64 tensor of ``inputs``' shape.

    Source: as :func:`streaming_logits`.
    """
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.long:
        raise TypeError(f"targets must be an int64 torch.Tensor, got {type_name(targets)}")
    checked = _check_policy(model, inputs, window, num_sink_tokens)
    if targets.shape != inputs.shape:
        raise ValueError(
            f"targets {tuple(targets.shape)} must have inputs' shape {tuple(inputs.shape)}"
        )
    with torch.no_grad():
        logits = _stream_forward(checked, inputs, window, num_sink_tokens)[0]
    scored = targets != IGNORE_INDEX  # (batch, num_tokens)
    correct = (logits.argmax(dim=-1) == targets) & scored  # (batch, num_tokens)
    counts = scored.sum(dim=0).double()  # (num_tokens,)
    return correct.sum(dim=0).double() / counts  # NaN where counts == 0

