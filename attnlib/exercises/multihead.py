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

import math

import torch
import torch.nn as nn

from ._common import (
    CheckFailed,
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
    name_nan_output as _name_nan_output,
    linear_from_weights as _linear,
)

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
def check_merge_heads(fn, *, device=None) -> bool:
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
    ``view`` straight to ``(b, num_tokens, d_out)``), heads in the wrong order,
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
#: Dropout probability of the dropout probe: 1/p = 5 and 1/(1-p) = 1.25 differ.
_P = 0.2
_DROPOUT_COPIES = 4000
_ROLES = ("W_query", "W_key", "W_value", "out_proj")


def _build(cls, config: dict, dropout: float, qkv_bias: bool, device: torch.device, what: str):
    d_in, d_out, num_heads = config["d_in"], config["d_out"], config["num_heads"]
    call = (f"{what}(d_in={d_in}, d_out={d_out}, context_length={_CONTEXT_LENGTH}, "
            f"dropout={dropout}, num_heads={num_heads}, qkv_bias={qkv_bias})")
    module = call_answer(cls, d_in, d_out, _CONTEXT_LENGTH, dropout, num_heads,
                         qkv_bias=qkv_bias, what=call)
    if not isinstance(module, nn.Module):
        raise CheckFailed(f"{call} did not build an nn.Module")
    for name in _ROLES:
        shape = (d_out, d_out) if name == "out_proj" else (d_out, d_in)
        layer = getattr(module, name, None)
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor):
            size = "d_out, d_out" if name == "out_proj" else "d_in, d_out"
            raise CheckFailed(
                f"{call} has no {name} with a .weight: create self.{name} = nn.Linear({size}) "
                "(one projection for all heads together)"
            )
        if tuple(weight.shape) != shape:
            raise CheckFailed(
                f"{call}: {name}.weight has shape {tuple(weight.shape)}, expected {shape} "
                f"(nn.Linear stores (out_features, in_features); d_out={d_out} is the size of "
                "ALL heads together)"
            )
        if name != "out_proj" and (getattr(layer, "bias", None) is not None) != qkv_bias:
            raise CheckFailed(f"{call}: {name} must have a bias exactly when qkv_bias=True")
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            raise CheckFailed(
                f"self.{name} is a plain tensor attribute: module.to(device) does not move it. "
                f"Register it: self.register_buffer({name!r}, ...)."
            )
    return module.to(device=device, dtype=torch.float64)


def _set_weights(module: nn.Module, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights with scores of order 1 to 3 (differences in scale show)."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    with torch.no_grad():
        for name in _ROLES:
            layer = getattr(module, name)
            w = torch.randn(tuple(layer.weight.shape), generator=generator, dtype=torch.float64)
            layer.weight.copy_(w.to(device))
            weights[name] = layer.weight.detach().clone()
            if layer.bias is not None:
                b = 0.5 * torch.randn(tuple(layer.bias.shape), generator=generator,
                                      dtype=torch.float64)
                layer.bias.copy_(b.to(device))
                weights[name + ".bias"] = layer.bias.detach().clone()
    return weights


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

    def variant(**kwargs) -> torch.Tensor:
        return _multi_head_attention(x, weights, num_heads, **kwargs)

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


def _probe_input(batch: int, num_tokens: int, d_in: int, seed: int,
                 device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, num_tokens, d_in, generator=generator, dtype=torch.float64)
    return x.to(device)


def _forward(module: nn.Module, x: torch.Tensor, d_out: int, what: str) -> torch.Tensor:
    try:
        with torch.no_grad():
            out = call_answer(module, x, what=what)
    except CheckFailed as failure:
        text = str(failure)
        if "view" in text and ("stride" in text or "contiguous" in text):
            raise CheckFailed(
                f"{text}\nAfter transpose(1, 2) the context vectors are not contiguous, so view "
                "cannot merge the heads: use .contiguous().view(...) or .reshape(...)."
            ) from None
        if "invalid for input of size" in text:
            raise CheckFailed(
                f"{text}\nThe sizes of a view/reshape do not multiply out to the tensor's size: "
                "head_dim is d_out // num_heads (not d_in // num_heads), and b and num_tokens "
                "come from x.shape."
            ) from None
        raise
    return require_tensor(out, what, (x.shape[0], x.shape[1], d_out), device=x.device)


def _forward_or_name_unsliced_mask(
    module: nn.Module, x: torch.Tensor, d_out: int, what: str, device: torch.device
) -> torch.Tensor:
    """``module(x)``; if it fails only below ``context_length`` tokens, say why."""
    try:
        return _forward(module, x, d_out, what)
    except CheckFailed as failure:
        if x.shape[1] == _CONTEXT_LENGTH:
            raise
        full = _probe_input(x.shape[0], _CONTEXT_LENGTH, x.shape[2], 0, device)
        try:
            _forward(module, full, d_out, what)
        except CheckFailed:
            raise failure from None
        raise CheckFailed(
            f"{failure}\nYour module works with num_tokens = context_length = {_CONTEXT_LENGTH} "
            f"but not with {x.shape[1]} tokens: the mask is (context_length, context_length). "
            "Cut it to the input's length: self.mask[:num_tokens, :num_tokens]."
        ) from None


def _check_no_future_leak(module: nn.Module, x: torch.Tensor, d_out: int, what: str) -> None:
    base = _forward(module, x, d_out, what)
    for t in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, t] += 1.5
        moved = (_forward(module, changed, d_out, what)[:, :t] - base[:, :t]).abs().amax().item()
        if not moved <= 1e-12:
            raise CheckFailed(
                f"a future token leaks: changing the input at position {t} changed the outputs "
                f"at positions before {t} by up to {moved:.3g}. Each head must hide the future: "
                "-inf above the diagonal of its scores, before the softmax."
            )


def _dropout_site_problem(
    first_token: torch.Tensor, x: torch.Tensor, weights: dict[str, torch.Tensor], num_heads: int
) -> str | None:
    """What is wrong with the dropout, seen in the first token's outputs; None if nothing.

    The first token attends only to itself, with weight 1 in every head, so
    dropout on the attention weights makes each head's part of its merged
    context vector either 0 (dropped, with probability p) or ``c * value_h``
    (kept and scaled by ``c``). ``out_proj`` (its bias zeroed) is undone with
    its inverse. Dropout on the values, the context vectors or the output
    zeroes features one by one instead; dropout on the scores never zeroes a
    head's part; ``nn.Dropout(1 - p)`` zeroes it with probability 1 - p.

    Args:
        first_token: ``(draws, d_out)`` the module's outputs for the first token.
        x: ``(1, num_tokens, d_in)`` the probe; ``weights``: the module's weights.
    """
    merged = torch.linalg.solve(weights["out_proj"], first_token.T).T  # (draws, d_out)
    value = _linear(x, weights, "W_value")[0, 0]  # (d_out,): the first token's value
    head_dim = value.shape[0] // num_heads
    coefficients, worst = [], 0.0
    for h in range(num_heads):
        block = slice(h * head_dim, (h + 1) * head_dim)
        part, value_h = merged[:, block], value[block]  # (draws, head_dim), (head_dim,)
        c = part @ value_h / (value_h @ value_h)  # (draws,)
        residual = (part - c[:, None] * value_h).norm(dim=-1).amax() / value_h.norm()
        coefficients.append(c)
        worst = max(worst, float(residual))
    if worst > 1e-6:
        return (
            "the first token's output is not what dropout on the attention weights gives. "
            "That token attends only to itself, with weight 1 in every head, so dropping "
            "attention weights either zeroes a head's whole part of its context vector or "
            "scales the whole of it by 1/(1-p); in your module features are zeroed one by one. "
            "Apply the dropout to attn_weights right after the softmax, not to the values, "
            "the context vectors or the output."
        )
    dropped = float((torch.cat(coefficients).abs() < 1e-9).double().mean())
    if dropped == 0.0:
        return (
            "no head's part of the first token's context vector is ever zeroed, so its one "
            "attention weight (1, on itself) is never dropped. Dropout on the scores, before "
            "the softmax, does not cut a link: a dropped score becomes 0 and the softmax still "
            "gives it weight. Apply the dropout to attn_weights, after the softmax."
        )
    if abs(dropped - (1 - _P)) < 0.05:
        return (
            f"your module drops {dropped:.0%} of the attention weights instead of "
            f"p = {_P:.0%}: nn.Dropout(p) and torch.nn.functional.dropout take the "
            "probability of DROPPING a weight, not of keeping it. Pass dropout, not 1 - dropout."
        )
    if abs(dropped - _P) > 0.05:
        return (
            f"your module drops {dropped:.0%} of the attention weights instead of "
            f"p = {_P:.0%}: each weight must be dropped with probability p."
        )
    return None


def _check_dropout(cls, device: torch.device, what: str) -> None:
    config = _CONFIGS[0]
    d_out, num_heads = config["d_out"], config["num_heads"]
    module = _build(cls, config, _P, False, device, what)
    weights = _set_weights(module, device, seed=77)
    with torch.no_grad():
        if module.out_proj.bias is not None:
            module.out_proj.bias.zero_()  # the output is then linear in the weights
    weights.pop("out_proj.bias", None)
    x = _probe_input(1, 6, config["d_in"], seed=13, device=device)
    reference = _multi_head_attention(x, weights, num_heads)[0]
    copies = x.expand(_DROPOUT_COPIES, -1, -1).contiguous()
    torch.manual_seed(0)  # inside the checker's fork of the RNG
    module.train()
    out = _forward(module, copies, d_out, f"{what}(..., dropout={_P}) in training mode")
    if is_close(out, reference.expand_as(out)):
        raise CheckFailed(
            f"with dropout={_P}, training mode gives the dropout-free output: the attention "
            "weights are never dropped. Apply dropout to attn_weights (nn.Dropout, or dropout_p "
            "of scaled_dot_product_attention when self.training)."
        )
    problem = _dropout_site_problem(out[:, 0, :], x, weights, num_heads)
    if problem is not None:
        raise CheckFailed(f"with dropout={_P}, {problem}")
    factor = float((out.mean(dim=0) * reference).sum() / (reference * reference).sum())
    if abs(factor - 1.0) > 0.1:
        if abs(factor - (1 - _P) / _P) < 0.4:
            problem = (f"the kept weights are scaled by 1/p = {1 / _P:g} instead of "
                       f"1/(1-p) = {1 / (1 - _P):g}")
        elif abs(factor - (1 - _P)) < 0.05:
            problem = "the kept weights are not scaled by 1/(1-p)"
        else:
            problem = "the dropout does not keep the expected value of the weights"
        raise CheckFailed(
            f"with dropout={_P}, the mean output over {_DROPOUT_COPIES} draws is {factor:.2f} "
            f"times the dropout-free output instead of 1: {problem}. Inverted dropout keeps each "
            "weight with probability 1-p and scales it by 1/(1-p); nn.Dropout(p) does this."
        )
    module.eval()
    evaluated = _forward(module, copies[:2], d_out, f"{what}(..., dropout={_P}) in eval mode")
    if not is_close(evaluated, reference.expand(2, -1, -1)):
        raise CheckFailed(
            f"with dropout={_P}, eval mode does not give the dropout-free output: dropout must be "
            "off after module.eval() (pass dropout_p=0.0 when not self.training)."
        )


@checker
def check_multi_head_attention(cls, *, device=None) -> bool:
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
    weights in training mode only.

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
    no dropout in training mode, dropout on the values, context vectors or
    output instead of the weights, dropout on the scores before the softmax,
    ``nn.Dropout(1 - p)``, dropout scaled by ``1/p`` or not scaled, dropout
    active in eval mode. An output with nan is reported with its positions.

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
    what = cls.__name__
    for config_index, config in enumerate(_CONFIGS):
        d_in, d_out, num_heads = config["d_in"], config["d_out"], config["num_heads"]
        for qkv_bias in (False, True):
            module = _build(cls, config, 0.0, qkv_bias, device, what).eval()
            weights = _set_weights(module, device, seed=31 + config_index)
            for index, num_tokens in enumerate(_NUM_TOKENS):
                x = _probe_input(_BATCH, num_tokens, d_in, seed=200 + index, device=device)
                call = (f"{what}(d_in={d_in}, d_out={d_out}, num_heads={num_heads}, "
                        f"qkv_bias={qkv_bias}) on x of shape {tuple(x.shape)}")
                out = _forward_or_name_unsliced_mask(module, x, d_out, call, device)
                reference = _multi_head_attention(x, weights, num_heads)
                if is_close(out, reference):
                    continue
                wrong = _wrong_multi_head_attention(x, weights, num_heads)
                message = name_wrong_answer(out, wrong)
                if message is not None:
                    raise CheckFailed(f"{call}: {message}")
                _name_nan_output(out, call)
                _check_no_future_leak(module, x, d_out, call)
                raise CheckFailed(
                    f"{call} differs from the reference multi-head attention by up to "
                    f"{max_difference(out, reference):.3g}. Check each step's shape: project, "
                    "view(b, num_tokens, num_heads, head_dim).transpose(1, 2), causal scores / "
                    "sqrt(head_dim), softmax(dim=-1), weights @ values, transpose(1, 2) and "
                    "reshape to (b, num_tokens, d_out), out_proj."
                )
            x = _probe_input(2, _CONTEXT_LENGTH, d_in, seed=9, device=device)
            _check_no_future_leak(module, x, d_out, what)
    _check_dropout(cls, device, what)
    return passed(f"{what} computes causal multi-head attention: outputs, causality and "
                  "dropout are right.")
