"""Checkers for chapter 6's exercises: merging heads and multi-head attention.

* :func:`check_merge_heads` - ``fn(context_vec)`` puts the heads back side by
  side: ``(b, num_heads, num_tokens, head_dim) -> (b, num_tokens, d_out)``.
* :func:`check_multi_head_attention` - a class like
  :class:`attnlib.MultiHeadAttention` (causal, heads split from one projection
  per role, output projection).

Both test what the answer computes, on seeded float64 probes whose sizes all
differ (``d_in != d_out``, ``head_dim != d_out``, ``num_heads != head_dim``,
batch > 1), and name the typical wrong answers by computing each one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from ._attention_modules import (
    DROPOUT_P,
    QKV,
    Forward,
    build_module,
    check_dropout,
    check_no_future_leak,
    forward_or_name_unsliced_mask,
    judge_module_output,
    probe_input,
    run_module,
    set_weights,
)
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    max_difference,
    name_wrong_answer,
    passed,
    probe_device,
    require_callable,
    require_class,
    require_tensor,
)
from ._common import linear_from_weights as _linear

__all__ = ["check_merge_heads", "check_multi_head_attention"]


# ---------------------------------------------------------------------------
# Merging heads
# ---------------------------------------------------------------------------

_MERGE_HINT = (
    "Move the heads back behind the tokens first, then merge the last two dimensions: "
    "context_vec.transpose(1, 2).reshape(b, num_tokens, num_heads * head_dim)."
)


_SIZES_HINT = (
    "Read b, num_heads, num_tokens and head_dim from context_vec.shape inside the function: "
    "the check calls it with other sizes than the chapter's example, so variables from "
    "outside it (b, num_tokens, d_out, ...) do not fit."
)


def _merge(context_vec: torch.Tensor) -> torch.Tensor:
    b, num_heads, num_tokens, head_dim = context_vec.shape
    # (b, num_heads, num_tokens, head_dim) -> (b, num_tokens, num_heads * head_dim)
    return context_vec.transpose(1, 2).reshape(b, num_tokens, num_heads * head_dim)


def _wrong_merges(context_vec: torch.Tensor) -> dict[str, torch.Tensor]:
    b, num_heads, num_tokens, head_dim = context_vec.shape
    d_out = num_heads * head_dim
    return {
        "the heads are merged without moving them back: reshape/view of (b, num_heads, "
        "num_tokens, head_dim) straight to (b, num_tokens, d_out) mixes tokens and heads. "
        + _MERGE_HINT: context_vec.reshape(b, num_tokens, d_out),
        "the heads are concatenated in the wrong order (last head first): head 0 must fill "
        "features 0 to head_dim - 1. " + _MERGE_HINT: _merge(context_vec.flip(1)),
        "the features are interleaved across heads (feature 0 of every head, then feature 1, "
        "...): each head's head_dim features must stay together, head after head. "
        + _MERGE_HINT: context_vec.permute(0, 2, 3, 1).reshape(b, num_tokens, d_out),
    }


@checker
def check_merge_heads(fn: Callable[[torch.Tensor], torch.Tensor], *,
                      device: torch.device | str | None = None) -> bool:
    """Check ``fn(context_vec)``: the heads put back side by side, head after head.

    ``fn`` takes the per-head context vectors ``(b, num_heads, num_tokens,
    head_dim)`` and must return ``(b, num_tokens, num_heads * head_dim)`` in
    which features ``h * head_dim`` to ``(h + 1) * head_dim - 1`` of each token
    are head ``h``'s, as ``context_vec.transpose(1, 2).reshape(...)`` gives. It
    is probed with seeded float64 tensors of sizes (2, 3, 5, 4) and (3, 4, 2, 5)
    (``num_heads * head_dim`` = 12 and 20, so sizes taken from outside the
    function cannot fit both), non-contiguous inputs included, on ``device``;
    the input must not change.

    Recognised wrong answers: merged without the transpose (``reshape`` or
    ``view`` straight to ``(b, num_tokens, d_out)``, or to ``(b, num_heads,
    num_tokens * head_dim)`` as d2l's ``transpose_output`` without its
    ``permute``), heads in the wrong order,
    features interleaved across heads, ``view`` on a non-contiguous tensor,
    sizes not read from ``context_vec.shape``, a wrong shape or dtype, an input
    changed in place.

    Args:
        fn: the learner's function.
        device: where to probe (keyword only); default the CPU.

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns something
            else; the message names the likely mistake.
        TypeError: ``device`` is not a device, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    (``Concat(head_1, ..., head_h)``).
    """
    device = probe_device(device)
    require_callable(fn, "your function merge_heads(context_vec)")
    generator = torch.Generator().manual_seed(6)
    for shape in ((2, 3, 5, 4), (3, 4, 2, 5)):
        b, num_heads, num_tokens, head_dim = shape
        context_vec = torch.randn(shape, generator=generator, dtype=torch.float64).to(device)
        for contiguous in (True, False):
            if not contiguous:
                # the same values, laid out as they come out of attention: not contiguous
                context_vec = context_vec.transpose(1, 2).contiguous().transpose(1, 2)
            what = f"fn(context_vec) with context_vec of shape {shape}"
            original = context_vec.clone()
            try:
                out = call_answer(fn, context_vec, what=what)
            except CheckFailed as failure:
                if "view" in str(failure) and ("stride" in str(failure)
                                               or "contiguous" in str(failure)):
                    raise CheckFailed(
                        f"{failure}\nThe transposed tensor is not contiguous, so view cannot "
                        "merge its dimensions: use .contiguous().view(...) or .reshape(...)."
                    ) from None
                if "invalid for input of size" in str(failure):
                    raise CheckFailed(f"{failure}\n{_SIZES_HINT}") from None
                raise
            if not torch.equal(context_vec, original):
                raise CheckFailed(f"{what} changed its input in place; return a new tensor")
            expected_shape = (b, num_tokens, num_heads * head_dim)
            if (isinstance(out, torch.Tensor)
                    and tuple(out.shape) == (b, num_heads, num_tokens * head_dim)):
                raise CheckFailed(
                    f"{what} returned shape {tuple(out.shape)} = (b, num_heads, num_tokens * "
                    "head_dim): the heads are still in front of the tokens. A reshape keeps "
                    "the entries in their order, so reshaping (b, num_heads, num_tokens, "
                    "head_dim) to (b, num_heads, -1) lays each head's tokens side by side. "
                    "The heads must first move behind the tokens: d2l's transpose_output "
                    "does X.permute(0, 2, 1, 3) before its last reshape. " + _MERGE_HINT
                )
            if isinstance(out, torch.Tensor) and tuple(out.shape) != expected_shape:
                raise CheckFailed(
                    f"{what} returned shape {tuple(out.shape)}; expected {expected_shape} = "
                    f"(b, num_tokens, num_heads * head_dim). {_SIZES_HINT}"
                )
            out = require_tensor(out, what, expected_shape, dtype=context_vec.dtype,
                                 device=device)
            expected = _merge(context_vec)
            if is_close(out, expected, atol=0.0, rtol=0.0):
                continue
            message = name_wrong_answer(out, _wrong_merges(context_vec), atol=0.0, rtol=0.0)
            if message is not None:
                raise CheckFailed(f"{what}: {message}")
            raise CheckFailed(
                f"{what} returned the right shape but other values (max difference "
                f"{max_difference(out, expected):.3g}). " + _MERGE_HINT
            )
    return passed("the heads come back side by side, head 0 first, at every size.")


# ---------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------

#: Probe sizes: d_in != d_out, and head_dim differs from d_out and num_heads.
_CONFIGS = (
    {"d_in": 5, "d_out": 6, "num_heads": 2},  # head_dim 3
    {"d_in": 4, "d_out": 6, "num_heads": 3},  # head_dim 2
)
#: The batch (4) differs from every head_dim, num_heads and d_out above, so a
#: scale read from the wrong dimension cannot pass by accident.
_CONTEXT_LENGTH, _BATCH = 8, 4
_NUM_TOKENS = (7, 3, 1, 8)
_ROLES = (*QKV, "out_proj")
_LEAK_ADVICE = ("Each head must hide the future: -inf above the diagonal of its scores, before "
                "the softmax.")


def _build(cls: type, config: Mapping[str, int], dropout: float, qkv_bias: bool,
           device: torch.device, what: str) -> nn.Module:
    d_in, d_out, num_heads = config["d_in"], config["d_out"], config["num_heads"]
    call = (f"{what}(d_in={d_in}, d_out={d_out}, context_length={_CONTEXT_LENGTH}, "
            f"dropout={dropout}, num_heads={num_heads}, qkv_bias={qkv_bias})")
    layers = {name: ((d_out, d_in), "nn.Linear(d_in, d_out, bias=qkv_bias)") for name in QKV}
    layers["out_proj"] = ((d_out, d_out), "nn.Linear(d_out, d_out)")
    note = (f" (one projection for all heads together: d_out={d_out} is the size of ALL "
            "heads side by side)")
    return build_module(cls, (d_in, d_out, _CONTEXT_LENGTH, dropout, num_heads),
                        {"qkv_bias": qkv_bias}, call, layers, device, note)


def _multi_head_attention(
    x: torch.Tensor,
    weights: dict[str, torch.Tensor],
    num_heads: int,
    *,
    scale: float | None = None,
    mask: str = "causal",
    softmax_dim: int = -1,
    split: str = "transpose",
    merge: str = "transpose",
    out_proj: bool = True,
) -> torch.Tensor:
    """The reference (defaults) and its typical wrong variants, in float64."""
    b, num_tokens, _ = x.shape
    d_out = weights["W_query"].shape[0]
    head_dim = d_out // num_heads

    def heads(t: torch.Tensor) -> torch.Tensor:  # (b, num_tokens, d_out)
        if split == "no_transpose":
            return t.reshape(b, num_heads, num_tokens, head_dim)
        # (b, num_tokens, num_heads, head_dim) -> (b, num_heads, num_tokens, head_dim)
        return t.view(b, num_tokens, num_heads, head_dim).transpose(1, 2)

    queries = heads(_linear(x, weights, "W_query"))  # (b, num_heads, num_tokens, head_dim)
    keys = heads(_linear(x, weights, "W_key"))  # (b, num_heads, num_tokens, head_dim)
    values = heads(_linear(x, weights, "W_value"))  # (b, num_heads, num_tokens, head_dim)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    allowed = torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=x.device))
    attn_scores = queries @ keys.transpose(2, 3) * scale  # (b, num_heads, num_tokens, num_tokens)
    if mask == "causal":
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
    elif mask == "flipped":
        attn_scores = attn_scores.masked_fill(allowed, float("-inf"))
    elif mask == "no_diagonal":
        attn_scores = attn_scores.masked_fill(~torch.tril(allowed, diagonal=-1), float("-inf"))
    attn_weights = torch.softmax(attn_scores, dim=softmax_dim)
    context_vec = attn_weights @ values  # (b, num_heads, num_tokens, head_dim)
    if merge == "no_transpose":
        context_vec = context_vec.reshape(b, num_tokens, d_out)
    elif merge == "reversed":
        context_vec = _merge(context_vec.flip(1))
    else:
        context_vec = _merge(context_vec)  # (b, num_tokens, d_out)
    return _linear(context_vec, weights, "out_proj") if out_proj else context_vec


def _wrong_multi_head_attention(
    x: torch.Tensor, weights: dict[str, torch.Tensor], num_heads: int
) -> dict[str, torch.Tensor]:
    d_out = weights["W_query"].shape[0]
    head_dim = d_out // num_heads

    # variant(scale=..., mask=..., ...): the reference with one keyword changed
    variant = functools.partial(_multi_head_attention, x, weights, num_heads)

    return {
        "the scores are not scaled: divide each head's scores by sqrt(head_dim) before the "
        "softmax.": variant(scale=1.0),
        f"the scores are scaled by 1/sqrt(d_out) = 1/sqrt({d_out}), the size of the whole layer, "
        f"instead of 1/sqrt(head_dim) = 1/sqrt({head_dim}): each head's dot products run over "
        "its own head_dim features.": variant(scale=1.0 / math.sqrt(d_out)),
        "the softmax runs over the wrong dimension (dim=-2, over the queries): each query's "
        "weights over the keys must sum to 1, so use dim=-1.": variant(softmax_dim=-2),
        "the softmax runs over the heads (dim=1 of the (b, num_heads, num_tokens, num_tokens) "
        "scores): each query's weights over the keys must sum to 1, so use dim=-1.":
            variant(softmax_dim=1),
        f"the scores are scaled by 1/sqrt(d_in) = 1/sqrt({x.shape[-1]}), the size of the "
        f"INPUTS (x.shape[-1]), instead of 1/sqrt(head_dim) = 1/sqrt({head_dim}).":
            variant(scale=x.shape[-1] ** -0.5),
        "there is no causal mask: every token attends to the tokens after it as well (a future "
        "token leaks). Fill the scores above the diagonal with -inf before the softmax.":
            variant(mask="none"),
        "the mask's polarity is flipped: you filled the ALLOWED scores with -inf, so each token "
        "sees only later tokens (and the last row is all -inf, giving nan). With a mask that is "
        "True where a query may attend, fill where it is False: masked_fill(~mask, ...).":
            variant(mask="flipped"),
        "the mask hides the diagonal too: token i may attend to itself, so the first row is all "
        "-inf and its softmax is nan. Use torch.tril with the diagonal included.":
            variant(mask="no_diagonal"),
        "the heads are merged without moving them back: context_vec is (b, num_heads, "
        "num_tokens, head_dim), and reshaping it straight to (b, num_tokens, d_out) mixes tokens "
        "and heads. Use context_vec.transpose(1, 2) before reshape/view.":
            variant(merge="no_transpose"),
        "the heads are concatenated in the wrong order: head 0's features must come first "
        "(features 0 to head_dim - 1), then head 1's, and so on.": variant(merge="reversed"),
        "the heads are split without the transpose: view the projection as (b, num_tokens, "
        "num_heads, head_dim) and then .transpose(1, 2); viewing it straight as (b, num_heads, "
        "num_tokens, head_dim) mixes tokens and heads.": variant(split="no_transpose"),
        "the heads are split AND merged by reshape alone, without the transposes: view the "
        "projection as (b, num_tokens, num_heads, head_dim), transpose(1, 2) to split, and "
        "transpose(1, 2) back before merging.": variant(split="no_transpose", merge="no_transpose"),
        "out_proj is not applied: after merging the heads, pass the result through "
        "self.out_proj.": variant(out_proj=False),
    }


def _explain_view(message: str) -> str | None:
    """A hint for the errors that a view of the heads typically raises, or None."""
    if "view" in message and ("stride" in message or "contiguous" in message):
        return ("After transpose(1, 2) the context vectors are not contiguous, so view "
                "cannot merge the heads: use .contiguous().view(...) or .reshape(...).")
    if "invalid for input of size" in message:
        return ("The sizes of a view/reshape do not multiply out to the tensor's size: "
                "head_dim is d_out // num_heads (not d_in // num_heads), and b and num_tokens "
                "come from x.shape.")
    return None


def _runner(module: nn.Module, d_out: int) -> Forward:
    return functools.partial(run_module, module, d_out=d_out, explain=_explain_view)


def _head_parts(x: torch.Tensor, weights: dict[str, torch.Tensor],
                num_heads: int) -> torch.Tensor:
    """``(num_heads, d_out)``: each head's share of the first token's output, without
    dropout and with out_proj's bias left out. The first token attends only to itself,
    so head h's context vector is its part of the first token's value."""
    value = _linear(x, weights, "W_value")[0, 0]  # (d_out,)
    head_dim = value.shape[0] // num_heads
    parts = []
    for h in range(num_heads):
        block = slice(h * head_dim, (h + 1) * head_dim)
        parts.append(weights["out_proj"][:, block] @ value[block])  # (d_out,)
    return torch.stack(parts)


def _check_multi_head_dropout(cls: type, device: torch.device, what: str) -> None:
    config = _CONFIGS[0]
    d_out, num_heads = config["d_out"], config["num_heads"]
    module = _build(cls, config, DROPOUT_P, False, device, what)
    weights = set_weights(module, _ROLES, device, seed=77)
    bias = getattr(module.out_proj, "bias", None)  # set_weights has read it
    with torch.no_grad():
        if isinstance(bias, torch.Tensor):
            bias.zero_()  # the output is then linear in the weights
    weights.pop("out_proj.bias", None)
    x = probe_input(1, 6, config["d_in"], seed=13, device=device)
    reference = _multi_head_attention(x, weights, num_heads)[0]  # (num_tokens, d_out)
    check_dropout(module, _runner(module, d_out), x, reference,
                  _head_parts(x, weights, num_heads), what, after_projection=True)


@checker
def check_multi_head_attention(cls: type, *, device: torch.device | str | None = None) -> bool:
    """Check a causal multi-head attention class like :class:`attnlib.MultiHeadAttention`.

    ``cls(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)``
    must build an ``nn.Module`` with ``nn.Linear`` layers ``W_query``,
    ``W_key``, ``W_value`` (``d_in -> d_out``, bias exactly when ``qkv_bias``)
    and ``out_proj`` (``d_out -> d_out``, with or without bias); ``module(x)``
    maps ``x`` ``(batch, num_tokens, d_in)`` to ``(batch, num_tokens, d_out)``
    as :class:`attnlib.MultiHeadAttention` does with the same weights: each of
    the ``num_heads`` heads of ``head_dim = d_out // num_heads`` features
    attends causally with scale ``1/sqrt(head_dim)``, the heads are put back
    side by side (head 0 first) and mixed by ``out_proj``; dropout on the
    weights in training mode only. A second dropout after ``out_proj``, as
    GPT-2's and nanoGPT's ``resid_dropout``, is accepted on top of it.

    Probes (float64, seeded weights with scores of order 1 to 3):
    ``(d_in, d_out, num_heads)`` = (5, 6, 2) and (4, 6, 3), ``context_length=8``,
    with and without ``qkv_bias``; a batch of 4 with ``num_tokens`` = 7, 3, 1,
    8; each token perturbed in turn to find a future token leaking; with
    ``dropout=0.2``, the mean output over 4,000 draws in training mode (the
    factors 1/(1-p) = 1.25 and 1/p = 5 differ) and the output in eval mode.

    Recognised wrong answers: scores not scaled, scaled by ``1/sqrt(d_out)``
    or ``1/sqrt(d_in)`` instead of ``1/sqrt(head_dim)``, softmax over the
    queries or over the heads instead of the keys, no causal mask (a future
    token leaks), mask with flipped polarity, mask without the diagonal, the
    whole ``(context_length, context_length)`` mask used without cutting it to
    ``num_tokens``, heads merged without the transpose, heads concatenated in
    the wrong order, heads split without the transpose, ``out_proj`` not
    applied, ``view`` on the non-contiguous transpose, sizes that do not
    multiply out in a ``view``, a plain-attribute mask, ``qkv_bias`` ignored,
    no dropout in training mode, dropout on the values or context vectors
    instead of the weights, a dropout after ``out_proj`` only, dropout on the
    scores before the softmax, ``nn.Dropout(1 - p)``, dropout scaled by
    ``1/p`` or not scaled, dropout active in eval mode; the dropout mistakes
    are named with or without a dropout after ``out_proj``. An output with nan
    is reported with its positions.

    Args:
        cls: the learner's class (not an instance).
        device: where to probe (keyword only); default the CPU.

    Returns:
        True, after printing one line, if the class is right.

    Raises:
        CheckFailed: ``cls`` is not an ``nn.Module`` class, raises, or computes
            something else; the message names the likely mistake.
        TypeError: ``device`` is not a device, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.2
    and 3.2.3; Raschka (2024), *Build a Large Language Model (From Scratch)*,
    section 3.6.2.
    """
    device = probe_device(device)
    require_class(cls, "your multi-head attention class")
    what = answer_name(cls, "cls")
    for config_index, config in enumerate(_CONFIGS):
        d_in, d_out, num_heads = config["d_in"], config["d_out"], config["num_heads"]
        for qkv_bias in (False, True):
            module = _build(cls, config, 0.0, qkv_bias, device, what).eval()
            weights = set_weights(module, _ROLES, device, seed=31 + config_index)
            forward = _runner(module, d_out)
            for index, num_tokens in enumerate(_NUM_TOKENS):
                x = probe_input(_BATCH, num_tokens, d_in, seed=200 + index, device=device)
                call = (f"{what}(d_in={d_in}, d_out={d_out}, num_heads={num_heads}, "
                        f"qkv_bias={qkv_bias}) on x of shape {tuple(x.shape)}")
                out = forward_or_name_unsliced_mask(forward, x, call, _CONTEXT_LENGTH)
                judge_module_output(
                    out, _multi_head_attention(x, weights, num_heads),
                    functools.partial(_wrong_multi_head_attention, x, weights, num_heads),
                    forward, x, call, leak_advice=_LEAK_ADVICE,
                    reference_name="multi-head attention",
                    steps="Check each step's shape: project, view(b, num_tokens, num_heads, "
                          "head_dim).transpose(1, 2), causal scores / sqrt(head_dim), "
                          "softmax(dim=-1), weights @ values, transpose(1, 2) and reshape to "
                          "(b, num_tokens, d_out), out_proj.")
            x = probe_input(2, _CONTEXT_LENGTH, d_in, seed=9, device=device)
            check_no_future_leak(forward, x, what, _LEAK_ADVICE)
    _check_multi_head_dropout(cls, device, what)
    return passed(f"{what} computes causal multi-head attention: outputs, causality and "
                  "dropout are right.")
