"""Checkers for chapter 5's exercises: the causal mask and a causal attention module.

* :func:`check_causal_mask` - ``fn(num_tokens)`` returns the bool causal mask.
* :func:`check_causal_attention` - a class like :class:`attnlib.CausalAttention`:
  causal mask before the softmax, ``1/sqrt(d_out)`` scale, dropout on the
  weights.

Both test what the answer computes, on seeded float64 probes, and name the
typical wrong answers by computing each one and comparing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

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

__all__ = ["check_causal_mask", "check_causal_attention"]

#: Sizes every mask probe uses: 5 first (every wrong mask differs there), then
#: 1 (only the diagonal), 2 and 7.
_MASK_SIZES = (5, 1, 2, 7)


def _reference_mask(num_tokens: int, device: torch.device) -> torch.Tensor:
    return torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device))


def _wrong_masks(num_tokens: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The typical wrong bool masks, each keyed by the message that names it."""
    ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device)
    return {
        "the polarity is flipped: your mask is True where attention is BLOCKED (the upper "
        "triangle above the diagonal). The course's convention, and that of "
        "torch.nn.functional.scaled_dot_product_attention, is True = may attend; "
        "torch.nn.MultiheadAttention uses the opposite one. Print fn(4) and compare with "
        "attnlib.causal_mask(4).": torch.triu(ones, diagonal=1),
        "the diagonal is missing: token i may attend to itself, so mask[i, i] must be True. "
        "Your mask is the strict lower triangle (torch.tril(..., diagonal=-1)); its first row is "
        "all False, and a softmax over a row of -inf scores gives nan.": torch.tril(
            ones, diagonal=-1
        ),
        "you built the UPPER triangle (torch.triu) instead of the lower one (torch.tril): "
        "row i must be True for the keys j <= i, the tokens up to and including i.": torch.triu(
            ones
        ),
        "your mask is True everywhere, so it masks nothing: every token sees the future, the "
        "tokens after it, as in a model without a mask. Keep only the lower triangle, "
        "diagonal included: torch.tril(torch.ones(n, n, dtype=torch.bool)).": ones,
    }


@checker
def check_causal_mask(fn: Callable[[int], torch.Tensor], *,
                      device: torch.device | str | None = None) -> bool:
    """Check ``fn(num_tokens)``: the causal mask, bool, **True where a query may attend**.

    ``fn(num_tokens)`` must return a bool tensor of shape
    ``(num_tokens, num_tokens)`` whose entry ``[i, j]`` is True exactly when
    ``j <= i`` (the lower triangle, diagonal included), as
    :func:`attnlib.causal_mask` does. It is probed with ``num_tokens`` = 5, 1,
    2 and 7, and the mask is then used to hide the future in a softmax on
    ``device``.

    Recognised wrong answers: the polarity flipped (True = blocked), the
    diagonal missing (strict lower triangle), the upper triangle instead of
    the lower, a mask that is True everywhere (every token sees the future), a
    float or int mask instead of bool (including an additive mask of 0 and
    -inf), and a wrong shape (an extra batch dimension, not square, or a fixed
    size). Any other wrong mask is shown beside the right one, with the
    entries that let a token see the future and those that hide its past.

    Args:
        fn: the learner's function, ``fn(num_tokens) -> Tensor``.
        device: where to use the mask (keyword only); default the CPU.
            ``"cuda"`` checks that the mask works with tensors on the GPU.

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns a wrong mask;
            the message names the likely mistake.
        TypeError: ``device`` is not a device, a string or None.
        ValueError: ``device`` names CUDA on a machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.2.3.
    """
    device = probe_device(device)
    require_callable(fn, "your causal-mask function fn(num_tokens)")
    for num_tokens in _MASK_SIZES:
        what = f"fn({num_tokens})"
        out = call_answer(fn, num_tokens, what=what)
        shape = (num_tokens, num_tokens)
        if isinstance(out, torch.Tensor) and tuple(out.shape) != shape:
            _name_wrong_mask_shape(fn, out, num_tokens, what)
        out = require_tensor(out, what, shape)
        reference = _reference_mask(num_tokens, out.device)
        if out.dtype != torch.bool:
            _name_non_bool_mask(out, reference, what)
        if torch.equal(out, reference):
            continue
        wrong = {message: mask.to(torch.float64)
                 for message, mask in _wrong_masks(num_tokens, out.device).items()}
        message = name_wrong_answer(out.to(torch.float64), wrong, atol=0.0, rtol=0.0)
        if message is not None:
            raise CheckFailed(f"{what}: {message}")
        raise CheckFailed(
            f"{what} returned\n{out.int()}\nbut the causal mask is\n{reference.int()}\n"
            f"(1 = True = may attend): row i is True in columns 0 to i.{_mask_errors(out)}"
        )
    _use_mask_on_device(fn, device)
    return passed("a bool causal mask, True on and below the diagonal, at every size.")


def _mask_errors(out: torch.Tensor) -> str:
    """What a wrong square bool mask gets wrong: the future it shows, the past it hides."""
    rows, cols = torch.ones_like(out).nonzero(as_tuple=True)
    future = [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if j > i and out[i, j]]
    hidden = [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if j <= i and not out[i, j]]
    text = ""
    if future:
        text += (f" Your mask lets tokens see the future: True above the diagonal at (query, key) "
                 f"= {', '.join(map(str, future[:4]))}{', ...' if len(future) > 4 else ''}.")
    if hidden:
        text += (f" It hides tokens a query may see (False on or below the diagonal) at "
                 f"{', '.join(map(str, hidden[:4]))}{', ...' if len(hidden) > 4 else ''}.")
    return text


def _name_wrong_mask_shape(fn: Callable[[int], torch.Tensor], out: torch.Tensor,
                          num_tokens: int, what: str) -> None:
    """A mask of the wrong shape: an extra dimension, not square, or a fixed size."""
    shape = (num_tokens, num_tokens)
    got = f"{what} returned shape {tuple(out.shape)}; expected {shape}"
    if out.dim() != 2:
        raise CheckFailed(
            f"{got}: a 2-D mask, one row per query and one column per key. Leave out any batch "
            "or head dimension: a (num_tokens, num_tokens) mask broadcasts over them when it "
            "is used."
        )
    if out.shape[0] != out.shape[1]:
        raise CheckFailed(
            f"{got}: the mask must be square, one row per query and one column per key, "
            "num_tokens of each."
        )
    other = num_tokens + 3
    again = call_answer(fn, other, what=f"fn({other})")
    if isinstance(again, torch.Tensor) and tuple(again.shape) == tuple(out.shape):
        raise CheckFailed(
            f"{got}, and fn({other}) has the same shape: the size is fixed. Use the argument "
            "num_tokens, not a size from outside the function (such as a notebook variable or "
            "context_length)."
        )
    raise CheckFailed(
        f"{got}: one row per query and one column per key, exactly num_tokens of each "
        f"(is the size off by {out.shape[0] - num_tokens:+d}?)."
    )


def _name_non_bool_mask(out: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """A mask of the wrong dtype: say which kind it is."""
    kind = "float" if out.is_floating_point() else str(out.dtype).replace("torch.", "")
    values = out.to(torch.float64)
    if out.is_floating_point() and torch.equal(values, torch.where(
        reference, torch.zeros((), dtype=torch.float64, device=out.device),
        torch.full((), float("-inf"), dtype=torch.float64, device=out.device),
    )):
        raise CheckFailed(
            f"{what} returned an additive float mask (0 where allowed, -inf where blocked). That "
            "form is valid where a mask is added to the scores, but this exercise asks for the "
            "bool form: return a tensor of dtype torch.bool, True where a query may attend."
        )
    if torch.equal(values, reference.to(torch.float64)):
        hint = "its 1s and 0s are in the right places"
    elif torch.equal(values, (~reference).to(torch.float64)):
        hint = "and its 1s mark the BLOCKED entries: the polarity is flipped as well"
    else:
        hint = "and its values are not the causal pattern either"
    raise CheckFailed(
        f"{what} returned a {kind} mask of dtype {out.dtype}, not bool ({hint}). masked_fill and "
        "torch.nn.functional.scaled_dot_product_attention read a bool mask as 'may attend' / "
        "'blocked', but treat a float mask as numbers to add to the scores. Create it bool: "
        "torch.ones(n, n, dtype=torch.bool), or convert with .bool()."
    )


def _use_mask_on_device(fn: Callable[[int], torch.Tensor], device: torch.device) -> None:
    """Hide the future with the learner's mask on ``device``, as attention does."""
    num_tokens = 5
    mask = call_answer(fn, num_tokens, what=f"fn({num_tokens})").to(device)
    generator = torch.Generator().manual_seed(5)
    scores = torch.randn(num_tokens, num_tokens, generator=generator, dtype=torch.float64)
    scores = scores.to(device)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    expected = torch.softmax(
        scores.masked_fill(~_reference_mask(num_tokens, device), float("-inf")), dim=-1
    )
    if not is_close(weights, expected):
        raise CheckFailed(
            f"used on {device}, your mask gives weights that differ from the causal ones by "
            f"{max_difference(weights, expected):.3g}"
        )


# ---------------------------------------------------------------------------
# A causal attention module
# ---------------------------------------------------------------------------

#: Sizes of the module probe: d_in != d_out, batch > 1, several num_tokens; the
#: batch differs from d_out, so a scale read from the wrong dimension cannot pass.
_D_IN, _D_OUT, _CONTEXT_LENGTH, _BATCH = 5, 3, 8, 2
_NUM_TOKENS = (7, 4, 1, 8)
_LAYERS = {name: ((_D_OUT, _D_IN), "nn.Linear(d_in, d_out, bias=qkv_bias)") for name in QKV}
_LEAK_ADVICE = ("Token i may only attend to tokens 0..i: fill the scores above the diagonal "
                "with -inf before the softmax.")


def _build(cls: type, dropout: float, qkv_bias: bool, device: torch.device,
           what: str) -> nn.Module:
    call = (f"{what}(d_in={_D_IN}, d_out={_D_OUT}, context_length={_CONTEXT_LENGTH}, "
            f"dropout={dropout}, qkv_bias={qkv_bias})")
    return build_module(cls, (_D_IN, _D_OUT, _CONTEXT_LENGTH, dropout),
                        {"qkv_bias": qkv_bias}, call, _LAYERS, device)


def _runner(module: nn.Module) -> Forward:
    return functools.partial(run_module, module, d_out=_D_OUT)


def _causal_attention(
    x: torch.Tensor,
    weights: dict[str, torch.Tensor],
    *,
    scale: float | None = None,
    mask: str = "causal",
    softmax_dim: int = -1,
    scale_after_softmax: bool = False,
) -> torch.Tensor:
    """The reference (defaults) and its typical wrong variants, in float64.

    ``mask``: ``"causal"``, ``"none"``, ``"flipped"``, ``"no_diagonal"``,
    ``"after_softmax"`` (weights zeroed, not renormalised) or ``"zero_fill"``
    (forbidden scores set to 0 instead of -inf). ``scale_after_softmax``:
    divide the weights, not the scores, by ``sqrt(d_k)``.
    """
    queries = _linear(x, weights, "W_query")  # (b, num_tokens, d_out)
    keys = _linear(x, weights, "W_key")  # (b, num_tokens, d_out)
    values = _linear(x, weights, "W_value")  # (b, num_tokens, d_out)
    num_tokens, d_k = x.shape[-2], keys.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    allowed = _reference_mask(num_tokens, x.device)
    attn_scores = queries @ keys.transpose(-2, -1)  # (b, num_tokens, num_tokens)
    if not scale_after_softmax:
        attn_scores = attn_scores * scale
    if mask == "causal":
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
    elif mask == "flipped":
        attn_scores = attn_scores.masked_fill(allowed, float("-inf"))
    elif mask == "no_diagonal":
        attn_scores = attn_scores.masked_fill(~torch.tril(allowed, diagonal=-1), float("-inf"))
    elif mask == "zero_fill":
        attn_scores = attn_scores.masked_fill(~allowed, 0.0)
    attn_weights = torch.softmax(attn_scores, dim=softmax_dim)
    if mask == "after_softmax":
        attn_weights = attn_weights * allowed
    if scale_after_softmax:
        attn_weights = attn_weights * scale
    return attn_weights @ values  # (b, num_tokens, d_out)


def _wrong_causal_attention(
    x: torch.Tensor, weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    d_k = _D_OUT
    num_tokens = x.shape[-2]
    return {
        "the scores are not scaled: divide them by sqrt(d_k) = sqrt(d_out) before the softmax "
        "(d_k is the size of the keys, keys.shape[-1]).": _causal_attention(x, weights, scale=1.0),
        "the scores are divided by d_k instead of sqrt(d_k): use keys.shape[-1] ** 0.5.":
            _causal_attention(x, weights, scale=1.0 / d_k),
        "the scores are MULTIPLIED by sqrt(d_k) instead of divided by it: use "
        "attn_scores / keys.shape[-1] ** 0.5.": _causal_attention(x, weights, scale=d_k**0.5),
        f"the scores are divided by sqrt(d_in) = sqrt({_D_IN}), the size of the INPUTS "
        f"(x.shape[-1]), instead of sqrt(d_k) = sqrt(d_out) = sqrt({_D_OUT}), the size of the "
        "keys: use keys.shape[-1] ** 0.5.": _causal_attention(x, weights, scale=_D_IN**-0.5),
        f"the scores are divided by sqrt(num_tokens) = sqrt({num_tokens}) instead of sqrt(d_k): "
        "for a batch, keys is (batch, num_tokens, d_out), so keys.shape[1] is the number of "
        "tokens. Use keys.shape[-1], the last dimension.":
            _causal_attention(x, weights, scale=num_tokens**-0.5),
        "the attention WEIGHTS are divided by sqrt(d_k), after the softmax, so each row sums to "
        "1/sqrt(d_k): divide the scores before the softmax.":
            _causal_attention(x, weights, scale_after_softmax=True),
        "the softmax runs over the wrong dimension (dim=-2, over the queries): each ROW of "
        "weights, one query's weights over the keys, must sum to 1, so use dim=-1.":
            _causal_attention(x, weights, softmax_dim=-2),
        "there is no causal mask: every token attends to the tokens after it as well. Fill the "
        "scores above the diagonal with -inf before the softmax.":
            _causal_attention(x, weights, mask="none"),
        "the mask's polarity is flipped: you filled the ALLOWED scores with -inf, so each token "
        "sees only the tokens after it (and the last row is all -inf, giving nan). With a mask "
        "that is True where a query may attend, fill where it is False: masked_fill(~mask, ...).":
            _causal_attention(x, weights, mask="flipped"),
        "the mask hides the diagonal too: token i may attend to itself. The first row is then all "
        "-inf and its softmax is nan; use torch.tril (diagonal included), not diagonal=-1.":
            _causal_attention(x, weights, mask="no_diagonal"),
        "the weights are masked AFTER the softmax and not renormalised, so rows no longer sum to "
        "1. Fill the scores with -inf before the softmax (or divide each row by its sum).":
            _causal_attention(x, weights, mask="after_softmax"),
        "the forbidden scores are set to 0 instead of -inf: exp(0) = 1, so future tokens still get "
        "weight. Use masked_fill(..., float('-inf')).":
            _causal_attention(x, weights, mask="zero_fill"),
    }


def _check_causal_dropout(cls: type, device: torch.device, what: str) -> None:
    """Dropout on the weights: random in training mode, off in eval mode, mean kept."""
    module = _build(cls, DROPOUT_P, False, device, what)
    weights = set_weights(module, QKV, device, seed=2024)
    x = probe_input(1, 6, _D_IN, seed=11, device=device)
    reference = _causal_attention(x, weights)[0]  # (num_tokens, d_out)
    # the first token attends only to itself: its context vector is its value
    check_dropout(module, _runner(module), x, reference, reference[:1], what,
                  after_projection=False)


@checker
def check_causal_attention(cls: type, *, device: torch.device | str | None = None) -> bool:
    """Check a causal self-attention class that behaves like :class:`attnlib.CausalAttention`.

    ``cls(d_in, d_out, context_length, dropout, qkv_bias=False)`` must build an
    ``nn.Module`` with ``nn.Linear(d_in, d_out, bias=qkv_bias)`` layers
    ``W_query``, ``W_key``, ``W_value``; ``module(x)`` maps ``x`` of shape
    ``(batch, num_tokens, d_in)``, ``num_tokens <= context_length``, to context
    vectors ``(batch, num_tokens, d_out)``: scores scaled by ``1/sqrt(d_out)``,
    the future hidden by ``-inf`` before the softmax (row-wise), dropout on the
    attention weights in training mode only.

    The checker builds the class with ``d_in=5, d_out=3, context_length=8``,
    gives it seeded float64 weights (with and without bias), and compares its
    output with the reference for a batch of 2 and ``num_tokens`` = 7, 4, 1, 8;
    it perturbs each token to find a future token leaking; and with
    ``dropout=0.2`` it compares the mean output in training mode over 4,000
    draws (1/(1-p) = 1.25 and 1/p = 5 differ) and the output in eval mode.

    Recognised wrong answers: scores not scaled, divided by ``d_k`` instead of
    ``sqrt(d_k)``, multiplied by ``sqrt(d_k)``, divided by ``sqrt(d_in)`` or
    ``sqrt(num_tokens)``, the weights (not the scores) divided by
    ``sqrt(d_k)``, softmax over the wrong dimension, no mask (a future token
    leaks), mask with flipped polarity, mask without the diagonal, mask applied
    after the softmax without renormalising, forbidden scores set to 0 instead
    of ``-inf``, the mask kept as a plain attribute instead of a buffer, the
    whole ``(context_length, context_length)`` mask used without cutting it to
    ``num_tokens``, ``qkv_bias`` ignored, no dropout in training mode, dropout
    on the values, context vectors or output instead of the weights, dropout
    on the scores before the softmax, ``nn.Dropout(1 - p)``, dropout scaled by
    ``1/p`` or not scaled, dropout still active in eval mode.

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

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1) and
    section 3.2.3; Raschka (2024), *Build a Large Language Model (From
    Scratch)*, section 3.5.
    """
    device = probe_device(device)
    require_class(cls, "your causal attention class")
    what = answer_name(cls, "cls")
    for qkv_bias in (False, True):
        module = _build(cls, 0.0, qkv_bias, device, what).eval()
        weights = set_weights(module, QKV, device, seed=2024)
        forward = _runner(module)
        for index, num_tokens in enumerate(_NUM_TOKENS):
            x = probe_input(_BATCH, num_tokens, _D_IN, seed=100 + index, device=device)
            call = f"{what}(...)(x) with x of shape {tuple(x.shape)}"
            out = forward_or_name_unsliced_mask(forward, x, call, _CONTEXT_LENGTH)
            judge_module_output(
                out, _causal_attention(x, weights),
                functools.partial(_wrong_causal_attention, x, weights), forward, x, call,
                leak_advice=_LEAK_ADVICE, reference_name="causal attention",
                steps="Check the order: project, scores queries @ keys^T, -inf above the "
                      "diagonal, scale by 1/sqrt(d_out), softmax over dim=-1, dropout, "
                      "weights @ values.")
        x = probe_input(2, _CONTEXT_LENGTH, _D_IN, seed=7, device=device)
        check_no_future_leak(forward, x, what, _LEAK_ADVICE)
    _check_causal_dropout(cls, device, what)
    return passed(f"{what} computes causal attention: outputs, causality and dropout are right.")
