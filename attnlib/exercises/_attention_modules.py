"""What the checkers of attention modules share (chapter 5's causal attention and
chapter 6's multi-head attention): building the learner's class and checking its
``nn.Linear`` layers, seeded weights and inputs, running it, finding a future
token that leaks, and telling dropout on the attention weights from dropout
elsewhere.

Private to ``attnlib.exercises``; it builds on :mod:`attnlib.exercises._common`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from .._validation import type_name
from ._common import (
    CheckFailed,
    call_answer,
    is_close,
    max_difference,
    name_nan_output,
    name_wrong_answer,
    require_tensor,
)

__all__ = [
    "QKV",
    "DROPOUT_P",
    "DROPOUT_COPIES",
    "Forward",
    "build_module",
    "set_weights",
    "probe_input",
    "run_module",
    "forward_or_name_unsliced_mask",
    "check_no_future_leak",
    "judge_module_output",
    "dropout_site_problem",
    "check_dropout",
]

#: The query, key and value projections every attention-module exercise asks for.
QKV = ("W_query", "W_key", "W_value")
#: Dropout probability of the dropout probe: 1/p = 5 and 1/(1-p) = 1.25 differ.
DROPOUT_P = 0.2
#: Copies of one sequence in the dropout probe's batch; the mean over them is
#: within about 3 % of its expectation (so 1.0, 0.8 and 4.0 are far apart).
DROPOUT_COPIES = 4000


def build_module(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], call: str,
                 layers: Mapping[str, tuple[tuple[int, int], str]], device: torch.device,
                 note: str = "") -> nn.Module:
    """Build the learner's module, check its ``nn.Linear`` layers, move it to float64.

    Args:
        cls: the learner's class, called as ``cls(*args, **kwargs)``; ``kwargs``
            holds ``qkv_bias``, which W_query, W_key and W_value must follow.
        call: the call, as messages show it.
        layers: each layer's name -> its weight's shape ``(out_features,
            in_features)`` and how to create it (``"nn.Linear(d_in, d_out)"``).
        device: where the module goes.
        note: added to a message about a missing layer or a wrong shape.

    Returns:
        The module, float64, on ``device``.
    """
    module = call_answer(cls, *args, what=call, **kwargs)
    if not isinstance(module, nn.Module):
        raise CheckFailed(f"{call} did not build an nn.Module (got {type_name(module)})")
    qkv_bias = kwargs["qkv_bias"]
    for name, (shape, create) in layers.items():
        layer = getattr(module, name, None)
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise CheckFailed(
                f"{call} has no {name} with a .weight: create it as self.{name} = {create}{note}"
            )
        if tuple(weight.shape) != shape:
            raise CheckFailed(
                f"{call}: {name}.weight has shape {tuple(weight.shape)}, expected {shape} "
                "(nn.Linear(in_features, out_features) stores its weight as (out_features, "
                f"in_features)){note}"
            )
        has_bias = getattr(layer, "bias", None) is not None
        if name in QKV and has_bias != qkv_bias:
            raise CheckFailed(
                f"{call}: with qkv_bias={qkv_bias}, {name} {'has' if has_bias else 'has no'} "
                "bias: pass bias=qkv_bias to each nn.Linear of W_query, W_key and W_value"
            )
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            raise CheckFailed(
                f"self.{name} is a plain tensor attribute: module.to(device) does not move it "
                "and state_dict() does not save it, so on a GPU the forward pass fails with a "
                f"device mismatch. Register it: self.register_buffer({name!r}, ...)."
            )
    return module.to(device=device, dtype=torch.float64)


def set_weights(module: nn.Module, names: Sequence[str], device: torch.device,
                seed: int) -> dict[str, torch.Tensor]:
    """Copy seeded float64 weights into the layers ``names`` of ``module``.

    Weights are standard normal and biases half as large, so that the scores are
    of order 1 to 3 and a wrong scale changes the output visibly.

    Returns:
        The copied tensors: ``name`` -> weight and, where the layer has a bias,
        ``name + ".bias"`` -> bias.
    """
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    with torch.no_grad():
        for name in names:
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


def probe_input(batch: int, num_tokens: int, d_in: int, seed: int,
                device: torch.device) -> torch.Tensor:
    """A seeded float64 ``(batch, num_tokens, d_in)`` input."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, num_tokens, d_in, generator=generator, dtype=torch.float64)
    return x.to(device)


def run_module(module: nn.Module, x: torch.Tensor, what: str, *, d_out: int,
               explain: Callable[[str], str | None] | None = None) -> torch.Tensor:
    """``module(x)`` without autograd, checked to be ``(batch, num_tokens, d_out)``.

    ``explain`` maps the message of an error the module raised to a hint that
    is added to it (or None).
    """
    try:
        with torch.no_grad():
            out = call_answer(module, x, what=what)
    except CheckFailed as failure:
        hint = explain(str(failure)) if explain is not None else None
        if hint:
            raise CheckFailed(f"{failure}\n{hint}") from None
        raise
    return require_tensor(out, what, (x.shape[0], x.shape[1], d_out), device=x.device)


Forward = Callable[[torch.Tensor, str], torch.Tensor]


def forward_or_name_unsliced_mask(forward: Forward, x: torch.Tensor, what: str,
                                  context_length: int) -> torch.Tensor:
    """``forward(x, what)``; if it fails only below ``context_length`` tokens, say why."""
    try:
        return forward(x, what)
    except CheckFailed as failure:
        if x.shape[1] == context_length:
            raise
        try:
            forward(probe_input(x.shape[0], context_length, x.shape[2], 0, x.device), what)
        except CheckFailed:
            raise failure from None
        raise CheckFailed(
            f"{failure}\nYour module works with num_tokens = context_length = {context_length} "
            f"but not with {x.shape[1]} tokens: the mask is (context_length, context_length). "
            "Cut it to the input's length: self.mask[:num_tokens, :num_tokens]."
        ) from None


def check_no_future_leak(forward: Forward, x: torch.Tensor, what: str, advice: str) -> None:
    """Change each token ``t`` in turn: the outputs before ``t`` must not move."""
    base = forward(x, what)
    for t in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, t] += 1.5
        moved = (forward(changed, what)[:, :t] - base[:, :t]).abs().amax().item()
        if not moved <= 1e-12:
            raise CheckFailed(
                f"a future token leaks: changing the input at position {t} changed the outputs "
                f"at positions before {t} by up to {moved:.3g}. {advice}"
            )


def judge_module_output(out: torch.Tensor, reference: torch.Tensor,
                        wrong_answers: Callable[[], Mapping[str, torch.Tensor]],
                        forward: Forward, x: torch.Tensor, call: str, *, leak_advice: str,
                        reference_name: str, steps: str) -> None:
    """Return if ``out`` matches ``reference``; otherwise name the mistake: a typical
    wrong answer, nan rows, a future token leaking, or the largest difference."""
    if is_close(out, reference):
        return
    message = name_wrong_answer(out, wrong_answers())
    if message is not None:
        raise CheckFailed(f"{call}: {message}")
    name_nan_output(out, call)
    check_no_future_leak(forward, x, call, leak_advice)
    raise CheckFailed(
        f"{call} differs from the reference {reference_name} by up to "
        f"{max_difference(out, reference):.3g}. {steps}"
    )


def dropout_site_problem(outputs: torch.Tensor, reference: torch.Tensor, parts: torch.Tensor,
                         *, after_projection: bool) -> str | None:
    """What is wrong with the dropout, seen in training-mode outputs; None if nothing.

    The first token attends only to itself, with weight 1 in every head, so
    dropout on the attention weights makes its output ``sum_h c_h parts[h]``
    with each ``c_h`` either 0 (head h's weight dropped, with probability p) or
    ``1/(1-p)``. Dropout on the values or the context vectors zeroes features
    one by one instead, which no such sum gives; dropout on the scores never
    zeroes a head's part; ``nn.Dropout(1 - p)`` zeroes it with probability
    ``1 - p``. Where the output is an output projection's (``after_projection``),
    dropout after it (GPT-2's and nanoGPT's ``resid_dropout``) is allowed: its
    zeroed features are left out and ``c`` is fitted to the others.

    Args:
        outputs: ``(draws, num_tokens, d_out)`` training-mode outputs of one
            sequence (any output projection's bias zeroed).
        reference: ``(num_tokens, d_out)`` the dropout-free output.
        parts: ``(num_heads, d_out)`` each head's dropout-free share of the first
            token's output.
        after_projection: whether the output comes out of an output projection.
    """
    first = outputs[:, 0, :]  # (draws, d_out)
    num_heads = parts.shape[0]
    zero = first == 0
    resid_dropout = after_projection and bool((zero.any(-1) & ~zero.all(-1)).any())
    keep = (~zero).to(first.dtype) if resid_dropout else torch.ones_like(first)
    # least squares, draw by draw, over the features the output dropout kept
    basis = keep[:, :, None] * parts.T  # (draws, d_out, num_heads)
    c = (torch.linalg.pinv(basis) @ (keep * first)[:, :, None])[..., 0]  # (draws, num_heads)
    fitted = keep.sum(-1) >= num_heads + 1  # enough features left to see a misfit
    residual = (keep * (first - c @ parts)).norm(dim=-1)[fitted]
    p = DROPOUT_P
    heads = " in every head" if num_heads > 1 else ""
    unit = ("each head's part of its context vector as a whole" if num_heads > 1
            else "its whole context vector")
    if residual.numel() and residual.amax() > 1e-6 * parts.norm():
        where = (" before out_proj" if after_projection else "")
        allowed = (" (a dropout after out_proj, as GPT-2's and nanoGPT's resid_dropout, may "
                   "come on top)" if after_projection else "")
        return (
            "the first token's output is not what dropout on the attention weights gives. "
            f"That token attends only to itself, with weight 1{heads}, so dropping attention "
            f"weights either zeroes {unit} or scales it by 1/(1-p); in your module its "
            f"features are zeroed one by one{where}. Apply the dropout to attn_weights right "
            f"after the softmax, not to the values, the context vectors or the output{allowed}."
        )
    # A draw whose output is all 0 counts as every head dropped (c = 0). A dropout
    # after out_proj alone zeroes a whole output only with probability p**d_out, so
    # a rate below 1 % means that no attention weight is ever dropped.
    counted = (keep.sum(-1) >= num_heads) | zero.all(-1)
    dropped = float((c[counted].abs() < 1e-6).double().mean())
    if dropped < 0.01:
        kept = outputs != 0
        ratio = outputs[kept] / reference.expand_as(outputs)[kept]
        if resid_dropout and float(ratio.amax() - ratio.amin()) < 1e-9:
            return (
                "the only dropout in your module comes after out_proj: it zeroes features of "
                "the output one by one (as GPT-2's resid_dropout does), but the first token's "
                "context vector is never zeroed, so the attention weights are never dropped. "
                "Apply dropout to attn_weights right after the softmax as well (nanoGPT's "
                "attn_dropout)."
            )
        never = ("no head's part of the first token's context vector is ever zeroed"
                 if num_heads > 1 else "the first token's context vector is never zeroed")
        return (
            f"{never}, so its one attention weight (1, on itself) is never dropped. "
            "Dropout on the scores, before the softmax, does not cut a link: a dropped score "
            "becomes 0 and the softmax still gives it weight. Apply the dropout to "
            "attn_weights, after the softmax."
        )
    if abs(dropped - (1 - p)) < 0.05:
        return (
            f"your module drops {dropped:.0%} of the attention weights instead of "
            f"p = {p:.0%}: nn.Dropout(p) and torch.nn.functional.dropout take the "
            "probability of DROPPING a weight, not of keeping it. Pass dropout, not 1 - dropout."
        )
    if abs(dropped - p) > 0.05:
        return (
            f"your module drops {dropped:.0%} of the attention weights instead of "
            f"p = {p:.0%}: each weight must be dropped with probability p."
        )
    return None


def check_dropout(module: nn.Module, forward: Forward, x: torch.Tensor,
                  reference: torch.Tensor, parts: torch.Tensor, what: str, *,
                  after_projection: bool) -> None:
    """Dropout on the attention weights: random in training mode, off in eval mode,
    the mean kept.

    Args:
        module: the learner's module, built with dropout ``DROPOUT_P``.
        forward: ``forward(x, what)`` runs it.
        x: ``(1, num_tokens, d_in)`` the probe; ``reference``: ``(num_tokens,
            d_out)`` its dropout-free output; ``parts``: ``(num_heads, d_out)``
            each head's share of the first token's output.
        after_projection: whether dropout after an output projection is allowed.
    """
    p, draws = DROPOUT_P, DROPOUT_COPIES
    copies = x.expand(draws, -1, -1).contiguous()
    torch.manual_seed(0)  # inside the checker's fork of the RNG
    module.train()
    out = forward(copies, f"{what}(..., dropout={p}) in training mode")
    if is_close(out, reference.expand_as(out)):
        raise CheckFailed(
            f"with dropout={p}, training mode gives the dropout-free output: the attention "
            "weights are never dropped. Apply dropout to attn_weights in forward: "
            "self.dropout = nn.Dropout(dropout), or dropout_p of "
            "scaled_dot_product_attention when self.training."
        )
    problem = dropout_site_problem(out, reference, parts, after_projection=after_projection)
    if problem is not None:
        raise CheckFailed(f"with dropout={p}, {problem}")
    factor = float((out.mean(dim=0) * reference).sum() / (reference * reference).sum())
    if abs(factor - 1.0) > 0.1:
        if abs(factor - (1 - p) / p) < 0.4:
            problem = (f"the kept weights are scaled by 1/p = {1 / p:g} instead of "
                       f"1/(1-p) = {1 / (1 - p):g}")
        elif abs(factor - (1 - p)) < 0.05:
            problem = "the kept weights are not scaled by 1/(1-p)"
        else:
            problem = "the dropout does not keep the expected value of the weights"
        raise CheckFailed(
            f"with dropout={p}, the mean output over {draws} draws is {factor:.2f} times "
            f"the dropout-free output instead of 1: {problem}. Inverted dropout keeps each "
            "weight with probability 1-p and scales it by 1/(1-p); nn.Dropout(p) does this."
        )
    module.eval()
    evaluated = forward(copies[:2], f"{what}(..., dropout={p}) in eval mode")
    if not is_close(evaluated, reference.expand(2, -1, -1)):
        raise CheckFailed(
            f"with dropout={p}, eval mode does not give the dropout-free output (max "
            f"difference {max_difference(evaluated, reference.expand(2, -1, -1)):.3g}): "
            "dropout must be off after module.eval(). nn.Dropout switches itself off; "
            "torch.nn.functional.dropout needs training=self.training, and "
            "scaled_dot_product_attention dropout_p=0.0 when not self.training."
        )
