"""Checkers for chapter 4: self-attention as a module, and moving weights
between ``SelfAttention_v1`` (``nn.Parameter`` matrices of shape
``(d_in, d_out)``) and ``SelfAttention_v2`` (``nn.Linear`` layers, whose
weight is ``(d_out, d_in)``).

Probes are seeded float64 modules and inputs with ``d_in != d_out`` and a batch
of more than one sequence, so that a transposed weight or a scale by the wrong
size cannot pass by accident; a square probe (``d_in == d_out``) is added where
a transposed weight would otherwise only crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._validation import type_name
from ..attention import SelfAttention_v1, SelfAttention_v2
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    judge,
    max_difference,
    passed,
    probe_device,
    require_callable,
    require_class,
    require_tensor,
)

__all__ = ["check_self_attention_v2", "check_weight_transfer"]

_DTYPE = torch.float64
_NAMES = ("W_query", "W_key", "W_value")


def _seeded_reference(d_in: int, d_out: int, qkv_bias: bool, seed: int,
                      device: torch.device, std: float = 0.6) -> SelfAttention_v2:
    """attnlib's SelfAttention_v2 in float64, its weights drawn from ``seed``
    with standard deviation ``std``. The default 0.6 gives scaled scores of
    about unit size, so that the weights are neither uniform nor one-hot and a
    wrong scale or softmax dimension changes them visibly; 30 gives scores in
    the thousands, where ``exp`` overflows without the softmax's max shift."""
    reference = SelfAttention_v2(d_in, d_out, qkv_bias=qkv_bias).to(dtype=_DTYPE)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(std * torch.randn(param.shape, generator=gen, dtype=_DTYPE))
    return reference.to(device)


def _naive_softmax(scores: torch.Tensor) -> torch.Tensor:
    """``exp(s) / exp(s).sum(-1)``: the softmax without the max shift (nan on overflow)."""
    exp_scores = torch.exp(scores)
    return exp_scores / exp_scores.sum(dim=-1, keepdim=True)


def _wrong_context_vecs(reference: SelfAttention_v2, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The typical wrong answers of a SelfAttention_v2 forward, computed on x."""
    queries = reference.W_query(x)  # (..., num_tokens, d_out)
    keys = reference.W_key(x)
    values = reference.W_value(x)
    d_in, d_k = x.shape[-1], keys.shape[-1]
    scores = queries @ keys.transpose(-2, -1)  # (..., num_tokens, num_tokens)

    def attend(attn_scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.softmax(attn_scores, dim=dim) @ values

    wrong = {
        "does not scale the scores: softmax(queries @ keys^T) without the division by "
        "sqrt(d_k). Divide the scores by keys.shape[-1] ** 0.5 before the softmax":
            attend(scores),
        "divides the scores by sqrt(d_in), the size of the inputs; the scale is sqrt(d_k), "
        "the size of the keys: keys.shape[-1] ** 0.5":
            attend(scores / math.sqrt(d_in)),
        "divides the scores by d_k instead of sqrt(d_k)":
            attend(scores / d_k),
        "applies the softmax over the queries (dim=-2, which is dim=0 on one sequence and "
        "dim=1 on a batch), so that columns sum to 1; each row (one query's weights over "
        "the keys) must sum to 1: use dim=-1":
            attend(scores / math.sqrt(d_k), dim=-2),
        "swaps queries and keys: keys @ queries^T is the transposed score matrix, so "
        "token i is scored with the key of i against the queries of the others. Compute "
        "queries @ keys.transpose(-2, -1)":
            attend(scores.transpose(-2, -1) / math.sqrt(d_k)),
        "multiplies the scores by sqrt(d_k) instead of dividing them by it":
            attend(scores * math.sqrt(d_k)),
        "divides the scores by sqrt(num_tokens) (keys.shape[0] or x.shape[-2] is the "
        "number of tokens on one sequence); the scale is sqrt(d_k), the size of the keys: "
        "keys.shape[-1] ** 0.5":
            attend(scores / math.sqrt(x.shape[-2])),
        "divides the attention weights by sqrt(d_k) after the softmax, so rows no longer "
        "sum to 1; the scale belongs to the scores, inside the softmax":
            torch.softmax(scores, dim=-1) / math.sqrt(d_k) @ values,
        "multiplies the values by the transposed weights (attn_weights^T @ values): "
        "row i of attn_weights holds query i's weights over the keys, so the context "
        "vectors are attn_weights @ values":
            torch.softmax(scores / math.sqrt(d_k), dim=-1).transpose(-2, -1) @ values,
        "leaves out the softmax: (scores / sqrt(d_k)) @ values is no longer a weighted "
        "average of the values. Turn the scores into weights with "
        "torch.softmax(..., dim=-1)":
            (scores / math.sqrt(d_k)) @ values,
        "overflows: its softmax is the naive exp(s) / exp(s).sum(), and exp of a score "
        "above about 709 is inf even in float64, so inf / inf = nan. Subtract each row's "
        "maximum before exp (the stable softmax of Chapter 1), or use torch.softmax":
            _naive_softmax(scores / math.sqrt(d_k)) @ values,
    }
    if d_in == reference.d_out:
        untransposed = [x @ layer.weight for layer in
                        (reference.W_query, reference.W_key, reference.W_value)]
        q, k, v = (p + layer.bias if layer.bias is not None else p for p, layer in
                   zip(untransposed, (reference.W_query, reference.W_key, reference.W_value),
                       strict=True))
        wrong["multiplies by the stored weight, x @ W.weight, but nn.Linear stores its weight "
              "as (d_out, d_in) and computes x @ W.weight.T (+ bias). Call the layer: "
              "self.W_query(x)"] = (
            torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v
        )
    return wrong


def _build(cls: type, d_in: int, d_out: int, qkv_bias: bool, what: str) -> nn.Module:
    module = call_answer(cls, d_in, d_out, qkv_bias=qkv_bias, what=what)
    if not isinstance(module, nn.Module):
        raise CheckFailed(f"{what} did not build an nn.Module (got {type_name(module)})")
    for layer_name in _NAMES:
        layer = getattr(module, layer_name, None)
        if not isinstance(layer, nn.Linear):
            raise CheckFailed(
                f"{what} has no nn.Linear attribute {layer_name} (found "
                f"{type_name(layer)}). Create it in __init__: "
                f"self.{layer_name} = nn.Linear(d_in, d_out, bias=qkv_bias)."
            )
        if tuple(layer.weight.shape) != (d_out, d_in):
            raise CheckFailed(
                f"{what}: {layer_name}.weight has shape {tuple(layer.weight.shape)}, expected "
                f"(d_out, d_in) = {(d_out, d_in)}. nn.Linear takes (in_features, out_features): "
                "nn.Linear(d_in, d_out)."
            )
        if qkv_bias and layer.bias is None:
            raise CheckFailed(
                f"{what}: {layer_name} has no bias although qkv_bias=True. Pass it on: "
                "nn.Linear(d_in, d_out, bias=qkv_bias)."
            )
        if not qkv_bias and layer.bias is not None:
            raise CheckFailed(
                f"{what}: {layer_name} has a bias although qkv_bias=False (nn.Linear's default "
                "is bias=True). Pass it on: nn.Linear(d_in, d_out, bias=qkv_bias)."
            )
    if type(module).forward is nn.Module.forward:
        raise CheckFailed(f"{what} has no forward method: define forward(self, x).")
    return module


def _works_on_other_ndim(module: nn.Module, reference: nn.Module, x: torch.Tensor) -> bool:
    """Does ``module`` match ``reference`` on ``x`` with a batch dimension added
    (``x`` is 2-d) or taken away (``x`` is 3-d)?"""
    other = x[0] if x.ndim == 3 else torch.stack((x, x.flip(0)))
    try:
        out = module(other)
    except Exception:  # only asking whether it works
        return False
    return isinstance(out, torch.Tensor) and is_close(out.cpu(), reference(other).cpu())


def _copy_weights(reference: SelfAttention_v2, module: nn.Module, what: str,
                  device: torch.device) -> None:
    """Move the learner's module to float64 on ``device`` and give it the reference's
    weights (and biases)."""
    try:
        module.to(device=device, dtype=_DTYPE)
    except Exception as exc:  # reported to the learner
        raise CheckFailed(f"{what}.to({device}, torch.float64) raised {exc!r}") from exc
    with torch.no_grad():
        for layer_name in _NAMES:
            mine, ref = getattr(module, layer_name), getattr(reference, layer_name)
            mine.weight.copy_(ref.weight)
            if ref.bias is not None:
                mine.bias.copy_(ref.bias)


def _forward(module: nn.Module, reference: SelfAttention_v2, x: torch.Tensor, what: str,
             probe: str) -> Any:
    """``module(x)`` without autograd; an error that works away on another number
    of dimensions, or that a weight used untransposed raises, is explained."""
    with torch.no_grad():
        try:
            return call_answer(module, x, what=f"{what}.forward(x)")
        except CheckFailed as failure:
            if _works_on_other_ndim(module, reference, x):
                where, fix = (
                    ("on one sequence but not on a batch", "Does your code use keys.T? On a "
                     "3-d tensor .T reverses every dimension; keys.transpose(-2, -1) swaps "
                     "the last two only.") if x.ndim == 3 else
                    ("on a batch but not on one sequence", "Index from the end (dim=-1, "
                     "transpose(-2, -1)), so that the code works for any number of leading "
                     "dimensions."))
                raise CheckFailed(f"{failure}. It works {where}, {probe}. {fix}") from None
            if "shapes cannot be multiplied" in str(failure) or "size mismatch" in str(
                    failure):
                raise CheckFailed(
                    f"{failure}, on {probe}. nn.Linear stores its weight as (d_out, d_in); "
                    "call the layer, self.W_query(x), rather than x @ self.W_query.weight."
                ) from None
            raise


@checker
def check_self_attention_v2(cls: type, *, device: torch.device | str | None = None) -> bool:
    """Check a self-attention class built like ``attnlib.SelfAttention_v2``.

    ``cls(d_in, d_out, qkv_bias=False)`` must have three ``nn.Linear(d_in,
    d_out, bias=qkv_bias)`` layers ``W_query``, ``W_key``, ``W_value``, and its
    ``forward(x)`` must return ``softmax(queries @ keys^T / sqrt(d_k)) @ values``
    row by row, for ``x`` of shape ``(num_tokens, d_in)`` or ``(batch,
    num_tokens, d_in)``. The check builds the class, gives it the weights of a
    seeded float64 reference (``attnlib.SelfAttention_v2``), and compares the
    outputs (tolerances ``atol=1e-6``, ``rtol=1e-5``) on four probes: ``(d_in,
    d_out) = (4, 4)`` (square, where ``x @ W.weight`` runs) on one sequence
    ``(3, 4)`` and a batch ``(2, 3, 4)``; ``(5, 3)`` on a batch ``(2, 4, 5)``
    and one sequence ``(4, 5)``; ``(5, 3)`` with ``qkv_bias=True``; and
    ``(5, 3)`` on a batch with weights 50 times larger, whose scores in the
    thousands overflow a softmax without the max shift.

    Recognised mistakes: scores not scaled, scaled by ``sqrt(d_in)``, by
    ``sqrt(num_tokens)`` or by ``d_k``, multiplied by ``sqrt(d_k)``; the
    weights divided by ``sqrt(d_k)`` after the softmax, transposed before they
    meet the values, or no softmax at all; softmax over the queries
    (``dim=-2``, or a fixed ``dim=0`` or ``dim=1`` that is wrong on one
    sequence or on a batch);
    queries and keys swapped (the transposed score matrix); ``x @ W.weight``
    instead of ``W(x)`` (the weight used untransposed); ``qkv_bias`` not passed
    on to ``nn.Linear``; ``nn.Linear(d_out, d_in)``; no ``forward``; code that
    works on one sequence but not a batch (``keys.T``) or the other way round;
    a softmax written without the max shift (nan on large scores).

    Args:
        cls: the learner's class (not an instance), a subclass of ``nn.Module``.
        device: where to probe (``"cuda"`` for a GPU); default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``cls`` is not an ``nn.Module`` class, its constructor or
            forward raises, the layers are missing or of the wrong shape, the
            output has the wrong shape, or it differs from the reference; the
            message names the mistake where it is a known one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", eq. (1);
    ``torch.nn.Linear`` computes ``x @ weight.T + bias``.
    """
    require_class(cls, "a self-attention class MySelfAttention(d_in, d_out, qkv_bias=False)")
    device = probe_device(device)
    name = answer_name(cls, "cls")
    gen = torch.Generator().manual_seed(404)
    # The square probe comes first: there x @ W.weight runs and can be named; with
    # d_in != d_out it would only crash. The last probe's weights are 50 times larger:
    # scores in the thousands, where a softmax without the max shift overflows.
    probes = [(4, 4, False, (3, 4), 0.6), (4, 4, False, (2, 3, 4), 0.6),
              (5, 3, False, (2, 4, 5), 0.6), (5, 3, False, (4, 5), 0.6),
              (5, 3, True, (2, 4, 5), 0.6), (5, 3, False, (2, 4, 5), 30.0)]
    for seed, (d_in, d_out, qkv_bias, shape, std) in enumerate(probes):
        what = f"{name}(d_in={d_in}, d_out={d_out}, qkv_bias={qkv_bias})"
        module = _build(cls, d_in, d_out, qkv_bias, what)
        reference = _seeded_reference(d_in, d_out, qkv_bias, seed, device, std)
        _copy_weights(reference, module, what, device)
        x = torch.randn(shape, generator=gen, dtype=_DTYPE).to(device)
        probe = f"x of shape {shape} and {what} (with the reference's weights" + (
            ", about 50 times larger than the others: scores in the thousands)"
            if std > 1 else ")")
        out = _forward(module, reference, x, what, probe)
        with torch.no_grad():
            expected = reference(x)
            wrong = _wrong_context_vecs(reference, x)
        out = require_tensor(out, f"{what}.forward(x) on {probe}", tuple(expected.shape),
                             dtype=_DTYPE, device=device)
        wrong = {message: tensor.cpu() for message, tensor in wrong.items()}
        judge(out.cpu(), expected.cpu(), wrong, what, probe,
              reference="attnlib.SelfAttention_v2 with the same weights",
              advice="Compare queries, keys, attn_scores and attn_weights with the "
                     "chapter's, one step at a time.")
    return passed(f"{name} computes what attnlib.SelfAttention_v2 computes, with and without "
                  "a bias, on one sequence and on a batch.")


def _transfer_probe(d_in: int, d_out: int, seed: int,
                    device: torch.device) -> tuple[SelfAttention_v1, SelfAttention_v2]:
    """A float64 SelfAttention_v1 and SelfAttention_v2 with different seeded weights."""
    gen = torch.Generator().manual_seed(seed)
    sa_v1 = SelfAttention_v1(d_in, d_out).to(dtype=_DTYPE)
    sa_v2 = SelfAttention_v2(d_in, d_out).to(dtype=_DTYPE)
    with torch.no_grad():
        for param in (*sa_v1.parameters(), *sa_v2.parameters()):
            param.copy_(torch.randn(param.shape, generator=gen, dtype=_DTYPE))
    return sa_v1.to(device), sa_v2.to(device)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _call_transfer(fn: Callable[..., Any], sa_v1: SelfAttention_v1, sa_v2: SelfAttention_v2,
                   what: str, probe: str) -> None:
    """``fn(sa_v1, sa_v2)``; an error that a typical mistake raises is explained."""
    d_in, d_out = sa_v1.W_query.shape
    try:
        call_answer(fn, sa_v1, sa_v2, what=what)
    except CheckFailed as failure:
        text = str(failure)
        if "leaf Variable that requires grad" in text:
            raise CheckFailed(
                f"{text}. Writing into a parameter must not be recorded by autograd: put "
                "the copies inside `with torch.no_grad():`."
            ) from None
        if d_in != d_out and ("must match the size" in text or "size mismatch" in text
                              or "shape" in text):
            raise CheckFailed(
                f"{text}, on {probe}. The shapes differ: sa_v1.W_query is (d_in, d_out), "
                "sa_v2.W_query.weight is (d_out, d_in). Copy the transpose, "
                "sa_v2.W_query.weight.T."
            ) from None
        raise


def _require_v2_unchanged(sa_v2: SelfAttention_v2, v1_before: dict[str, torch.Tensor],
                          v2_before: dict[str, torch.Tensor], what: str, probe: str) -> None:
    """sa_v2's weights must be as before the call: a copy the other way is named."""
    for n in _NAMES:
        weight = getattr(sa_v2, n).weight.detach()
        if torch.equal(weight, v2_before[n]):
            continue
        if is_close(weight, v1_before[n].T):
            raise CheckFailed(
                f"{what} copied in the wrong direction: sa_v2.{n}.weight now holds "
                f"sa_v1's old {n} (seen on {probe}). Copy from sa_v2 into sa_v1: "
                f"sa_v1.{n}.copy_(sa_v2.{n}.weight.T)."
            )
        raise CheckFailed(f"{what} changed sa_v2.{n}.weight; only sa_v1 should change "
                          f"(seen on {probe}).")


def _require_own_parameter(sa_v1: SelfAttention_v1, sa_v2: SelfAttention_v2, n: str,
                           original: nn.Parameter, what: str, probe: str) -> None:
    """sa_v1's matrix ``n`` must still be its own trainable parameter, ``original``,
    of shape ``(d_in, d_out)``, sharing no memory with sa_v2."""
    param, v2_weight = getattr(sa_v1, n), getattr(sa_v2, n).weight
    d_out, d_in = v2_weight.shape
    if not isinstance(param, nn.Parameter) or n not in dict(sa_v1.named_parameters()):
        raise CheckFailed(
            f"{what} replaced sa_v1.{n} by a {type_name(param)}, not a registered "
            f"nn.Parameter (seen on {probe}). Copy into the existing parameter: "
            f"sa_v1.{n}.copy_(...) under torch.no_grad()."
        )
    if tuple(param.shape) != (d_in, d_out):
        untransposed = tuple(param.shape) == (d_out, d_in)
        raise CheckFailed(
            f"{what} left sa_v1.{n} with shape {tuple(param.shape)}, expected "
            f"(d_in, d_out) = {(d_in, d_out)} (seen on {probe})."
            + (f" The transpose is missing: use sa_v2.{n}.weight.T." if untransposed else "")
        )
    if _same_storage(param, v2_weight):
        raise CheckFailed(
            f"{what} made sa_v1.{n} share memory with sa_v2.{n}.weight (seen on "
            f"{probe}), so training one module would change the other. Copy the "
            f"values into sa_v1's own parameter: sa_v1.{n}.copy_(sa_v2.{n}.weight.T)."
        )
    if param is not original:
        raise CheckFailed(
            f"{what} replaced sa_v1.{n} by a new nn.Parameter instead of copying into "
            f"the existing one (seen on {probe}). The exercise asks for a copy in place: "
            "an optimiser built on sa_v1.parameters() before the call would keep "
            f"updating the old tensor. Use sa_v1.{n}.copy_(sa_v2.{n}.weight.T) under "
            "torch.no_grad()."
        )
    if not param.requires_grad:
        raise CheckFailed(
            f"{what} left sa_v1.{n} with requires_grad=False (seen on {probe}): it "
            "would no longer train. Copy under torch.no_grad() instead of detaching."
        )


def _judge_copies(sa_v1: SelfAttention_v1, v1_before: dict[str, torch.Tensor],
                  v2_before: dict[str, torch.Tensor], what: str, probe: str) -> None:
    """Each of sa_v1's matrices must hold sa_v2's namesake, transposed; name what it holds."""
    expected = {n: v2_before[n].T for n in _NAMES}
    for n in _NAMES:
        got = getattr(sa_v1, n).detach()
        if is_close(got, expected[n]):
            continue
        if is_close(got, v1_before[n]):
            raise CheckFailed(f"{what} did not change sa_v1.{n} (seen on {probe}). Copy "
                              f"into it in place: sa_v1.{n}.copy_(sa_v2.{n}.weight.T).")
        if got.shape == v2_before[n].shape and is_close(got, v2_before[n]):
            raise CheckFailed(
                f"{what} forgot the transpose: sa_v1.{n} equals sa_v2.{n}.weight, but "
                "nn.Linear stores (d_out, d_in) and SelfAttention_v1 uses (d_in, d_out). "
                f"With a square matrix the copy runs and is silently wrong (seen on "
                f"{probe}). Use sa_v2.{n}.weight.T (reshape and view keep the numbers in "
                "their order; they do not transpose)."
            )
        for other in _NAMES:
            if other != n and is_close(got, expected[other]):
                raise CheckFailed(
                    f"{what} mixed up the matrices: sa_v1.{n} holds sa_v2.{other}.weight.T "
                    f"(seen on {probe}). Copy each matrix into its namesake."
                )
        raise CheckFailed(
            f"{what} left sa_v1.{n} different from sa_v2.{n}.weight.T by up to "
            f"{max_difference(got, expected[n]):.3g} (seen on {probe})."
        )


@checker
def check_weight_transfer(fn: Callable[..., Any], *,
                          device: torch.device | str | None = None) -> bool:
    """Check ``fn(sa_v1, sa_v2)`` that copies ``sa_v2``'s weights into ``sa_v1``.

    After the call, each of ``sa_v1.W_query``, ``W_key`` and ``W_value`` (an
    ``nn.Parameter`` of shape ``(d_in, d_out)``) must equal the transposed
    weight of the matching ``nn.Linear`` of ``sa_v2`` (shape ``(d_out,
    d_in)``), stay a trainable parameter of its own (not share memory with
    ``sa_v2``), and ``sa_v2`` must be unchanged, so that both modules compute
    the same context vectors. Probes: float64 modules with ``(d_in, d_out) =
    (5, 3)`` and, where a forgotten transpose would not crash, ``(4, 4)``.

    Recognised mistakes: the transpose forgotten; two matrices mixed up (for
    instance ``W_key`` copied into ``W_query``); the copy made in the other
    direction (``sa_v1`` into ``sa_v2``); parameters that share ``sa_v2``'s
    memory, or new parameters put in place of ``sa_v1``'s own (not a copy in
    place: an optimiser built earlier would keep the old ones); the copy written
    outside ``torch.no_grad()``.

    Args:
        fn: the learner's function; its return value is ignored.
        device: where to probe (``"cuda"`` for a GPU); default the CPU.

    Returns:
        True, after printing one line, when every probe passes.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or leaves ``sa_v1``
            different from ``sa_v2``; the message names the mistake.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: ``torch.nn.Linear`` stores ``weight`` as ``(out_features,
    in_features)`` and computes ``x @ weight.T``.
    """
    require_callable(fn, "a function fn(sa_v1, sa_v2)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    what = f"{name}(sa_v1, sa_v2)"
    gen = torch.Generator().manual_seed(77)
    for seed, (d_in, d_out) in enumerate(((4, 4), (5, 3))):
        probe = f"modules with d_in={d_in}, d_out={d_out}"
        sa_v1, sa_v2 = _transfer_probe(d_in, d_out, 100 + seed, device)
        v1_before = {n: getattr(sa_v1, n).detach().clone() for n in _NAMES}
        v1_params = {n: getattr(sa_v1, n) for n in _NAMES}
        v2_before = {n: getattr(sa_v2, n).weight.detach().clone() for n in _NAMES}
        _call_transfer(fn, sa_v1, sa_v2, what, probe)
        _require_v2_unchanged(sa_v2, v1_before, v2_before, what, probe)
        for n in _NAMES:
            _require_own_parameter(sa_v1, sa_v2, n, v1_params[n], what, probe)
        _judge_copies(sa_v1, v1_before, v2_before, what, probe)
        x = torch.randn(2, 3, d_in, generator=gen, dtype=_DTYPE).to(device)
        with torch.no_grad():
            if not is_close(sa_v1(x).cpu(), sa_v2(x).cpu()):
                raise CheckFailed(f"after {what} the two modules still differ on x of shape "
                                  f"(2, 3, {d_in}) (seen on {probe}).")
    return passed(f"{name} copies v2's weights into v1, transposed, and both modules then "
                  "compute the same context vectors.")
