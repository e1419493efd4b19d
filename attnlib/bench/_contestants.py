"""The contestants of :func:`attnlib.bench.run_benchmark`: six ways to compute (or
part of) one causal self-attention layer, built with the same weights
(:func:`make_contestants`), checked to agree (:func:`check_agreement`), and
the FLOPs of the layer (:func:`attention_flops`). Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._validation import check_bool as _check_bool
from .._validation import check_positive_int as _check_positive_int
from .._validation import type_name
from ..device import get_device
from ..flash import DEFAULT_BLOCK_SIZE, flash_attention
from ..functional import causal_mask
from ..multihead import MultiHeadAttention
from ._constants import CONTESTANTS


@dataclass(frozen=True)
class Contestant:
    """One way of computing causal self-attention, ready to be timed.

    Attributes:
        name: one of :data:`CONTESTANTS`.
        description: one line saying what is called.
        fn: ``fn(*inputs)`` returns the output tensor; for a full-layer
            contestant ``inputs`` is ``(x,)`` and the output is
            ``(batch, num_tokens, d_model)``; for ``sdpa_only`` and
            ``flash_only`` the inputs are the projected ``(queries, keys, values)``, each
            ``(batch, num_tokens, d_model)``, and the output is
            ``(batch, num_heads, num_tokens, head_dim)``.
        make_inputs: maps ``x`` ``(batch, num_tokens, d_model)`` to new leaf
            tensors (requiring gradients) that ``fn`` takes.
        params: the parameter tensors whose gradients the backward computes.
        full_layer: True when ``fn`` computes the whole layer (projections
            included); False for ``sdpa_only`` and ``flash_only``.
    """

    name: str
    description: str
    fn: Callable[..., torch.Tensor]
    make_inputs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    params: tuple[torch.Tensor, ...]
    full_layer: bool = True


def _check_heads(d_model: int, num_heads: int) -> None:
    _check_positive_int("d_model", d_model)
    _check_positive_int("num_heads", num_heads)
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")


def attention_flops(
    batch: int,
    num_tokens: int,
    d_model: int,
    num_heads: int,
    *,
    backward: bool = False,
    projections: bool = True,
) -> int:
    """Floating-point operations of one causal multi-head self-attention layer.

    One multiply-add counts as 2 FLOPs; biases, softmax, scaling and masking
    are left out (they are O(N*d) and O(h*N^2) against the matmuls' O(N*d^2)
    and O(N^2*d)). With ``b = batch``, ``N = num_tokens``, ``d = d_model``,
    ``h = num_heads`` and ``head_dim = d / h``::

        projections  = 4 * (2 * b * N * d * d)          # Q, K, V and out_proj
        attention    = 2 * (2 * b * h * N * N * head_dim)
                     = 4 * b * N * N * d                # Q @ K^T and weights @ V
        forward      = projections + attention
        forward+backward = 3 * forward                  # backward ~ 2 x forward

    The attention term is **dense**: the causal mask makes half of ``Q @ K^T``
    and of ``weights @ V`` unnecessary, and a kernel that skips the masked
    blocks does about half that work, but the same dense count is used for
    every contestant, so GFLOP/s compare like with like (they are "useful
    dense-equivalent FLOP/s", not the hardware's).

    Args:
        batch: number of sequences ``b``.
        num_tokens: tokens per sequence ``N``.
        d_model: embedding size ``d`` (``d_in == d_out``).
        num_heads: number of heads ``h``; must divide ``d_model``.
        backward: count forward and backward (3x the forward).
        projections: include the four projections; ``False`` counts the
            attention kernel alone (the ``sdpa_only`` contestant).

    Returns:
        The FLOP count, an int.

    Raises:
        TypeError: a size is not an int, or a flag is not a bool.
        ValueError: a size is not positive, or ``num_heads`` does not divide
            ``d_model``.

    Source: Kaplan et al. (2020), "Scaling Laws for Neural Language Models",
    Table 1 (2 FLOPs per multiply-add of each projection) and section 2.1
    (backward ~ twice the forward); the dense attention term as in Chowdhery
    et al. (2022), "PaLM", Appendix B (``12 * L * H * Q * T`` per token for
    forward+backward). Kaplan et al. count ``2 * n_ctx * d_attn`` per token for
    the attention, i.e. causal-halved; we do not halve.
    """
    for name, value in (("batch", batch), ("num_tokens", num_tokens)):
        _check_positive_int(name, value)
    _check_heads(d_model, num_heads)
    for name, flag in (("backward", backward), ("projections", projections)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type_name(flag)}")
    head_dim = d_model // num_heads
    proj = 4 * 2 * batch * num_tokens * d_model * d_model if projections else 0
    attn = 2 * 2 * batch * num_heads * num_tokens * num_tokens * head_dim
    forward = proj + attn
    return 3 * forward if backward else forward


def _leaf(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (t.detach().clone().requires_grad_(True),)


def _check_names(names: object) -> tuple[str, ...]:
    if isinstance(names, str):
        raise TypeError(f"names must be a sequence of names, not the string {names!r}")
    if not isinstance(names, Sequence):
        raise TypeError(f"names must be a sequence of names, got {type_name(names)}")
    if not names:
        raise ValueError("names must name at least one contestant, got none")
    for name in names:
        if name not in CONTESTANTS:
            raise ValueError(f"unknown contestant {name!r}; expected one of {CONTESTANTS}")
    return tuple(names)


@dataclass(frozen=True)
class _Weights:
    """Detached leaf copies of one MultiHeadAttention's weights (biases may be None)."""

    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    b_q: torch.Tensor | None
    b_k: torch.Tensor | None
    b_v: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None

    @classmethod
    def copy_of(cls, mha: MultiHeadAttention) -> _Weights:
        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().clone().requires_grad_(True)

        layers = (mha.W_query, mha.W_key, mha.W_value, mha.out_proj)
        w_q, w_k, w_v, w_o = (layer.weight.detach().clone().requires_grad_(True)
                              for layer in layers)
        b_q, b_k, b_v, b_o = (copy(layer.bias) for layer in layers)
        return cls(w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o)

    def packed_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One ``(3 * d_model, d_model)`` weight (rows q, k, v) and bias, new leaves."""
        weight = torch.cat([self.w_q, self.w_k, self.w_v], dim=0).detach().requires_grad_(True)
        if self.b_q is None or self.b_k is None or self.b_v is None:
            return weight, None
        bias = torch.cat([self.b_q, self.b_k, self.b_v], dim=0).detach().requires_grad_(True)
        return weight, bias


def _split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(b, num_tokens, d_model)`` to ``(b, num_heads, num_tokens, head_dim)``, a view."""
    b, num_tokens, d_model = t.shape
    return t.view(b, num_tokens, num_heads, d_model // num_heads).transpose(1, 2)


def _reference(mha: MultiHeadAttention) -> Contestant:
    return Contestant(
        "reference", "attnlib.MultiHeadAttention(x, return_weights=True): readable, N x N weights",
        lambda x: mha(x, return_weights=True)[0], _leaf, tuple(mha.parameters()))


def _attnlib(mha: MultiHeadAttention) -> Contestant:
    return Contestant(
        "attnlib", "attnlib.MultiHeadAttention(x): fast path (scaled_dot_product_attention)",
        lambda x: mha(x), _leaf, tuple(mha.parameters()))


def _torch_mha(w: _Weights, num_heads: int, device: torch.device,
               dtype: torch.dtype) -> Contestant:
    d_model = w.w_q.shape[1]
    torch_mha = torch.nn.MultiheadAttention(
        d_model, num_heads, dropout=0.0, bias=True, batch_first=True,
        device=device, dtype=dtype).eval()
    weight, bias = w.packed_qkv()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(weight)
        if bias is not None:
            torch_mha.in_proj_bias.copy_(bias)
        else:  # qkv_bias=False: torch's input bias fixed at zero
            torch_mha.in_proj_bias.zero_()
        torch_mha.out_proj.weight.copy_(w.w_o)
        if w.b_o is not None:  # MultiHeadAttention's out_proj has a bias by default
            torch_mha.out_proj.bias.copy_(w.b_o)
    masks: dict[int, torch.Tensor] = {}

    def torch_fn(x: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[1]
        if num_tokens not in masks:
            # torch.nn.MultiheadAttention's polarity: True = masked out.
            masks[num_tokens] = ~causal_mask(num_tokens, device=x.device)
        return torch_mha(x, x, x, attn_mask=masks[num_tokens], is_causal=True,
                         need_weights=False)[0]

    return Contestant(
        "torch_mha", "torch.nn.MultiheadAttention(x, x, x, is_causal=True, need_weights=False)",
        torch_fn, _leaf, tuple(torch_mha.parameters()))


def _bare_kernels(w: _Weights, num_heads: int) -> Contestant:
    w_qkv, b_qkv = w.packed_qkv()  # the floor's ONE projection, packed once
    d_model = w.w_q.shape[0]

    def bare_kernels(x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = x.shape
        qkv = F.linear(x, w_qkv, b_qkv)  # ONE GEMM: (b, num_tokens, 3 * d_model)
        queries, keys, values = qkv.split(d_model, dim=-1)  # views, each (b, N, d_model)
        context_vec = F.scaled_dot_product_attention(
            _split_heads(queries, num_heads), _split_heads(keys, num_heads),
            _split_heads(values, num_heads), is_causal=True,
        )  # (b, num_heads, num_tokens, head_dim)
        # reshape copies (the transposed tensor is not contiguous), as in attnlib.
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, d_model)
        return F.linear(context_vec, w.w_o, w.b_o)

    params = tuple(t for t in (w_qkv, b_qkv, w.w_o, w.b_o) if t is not None)
    return Contestant(
        "bare_kernels", "1 fused F.linear (packed QKV) + scaled_dot_product_attention("
        "is_causal=True) + F.linear", bare_kernels, _leaf, params)


def _kernel_inputs(w: _Weights) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """``make_inputs`` of the attention-only contestants: projected q, k, v as leaves."""

    def sdpa_inputs(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            projected = (F.linear(x, weight, bias)
                         for weight, bias in ((w.w_q, w.b_q), (w.w_k, w.b_k), (w.w_v, w.b_v)))
            return tuple(p.detach().requires_grad_(True) for p in projected)

    return sdpa_inputs


def _sdpa_only(w: _Weights, num_heads: int) -> Contestant:
    def sdpa_only(queries: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(t, num_heads) for t in (queries, keys, values))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return Contestant(
        "sdpa_only", "F.scaled_dot_product_attention(is_causal=True) on projected q, k, v",
        sdpa_only, _kernel_inputs(w), (), full_layer=False)


def _flash_only(w: _Weights, num_heads: int) -> Contestant:
    def flash_only(queries: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(t, num_heads) for t in (queries, keys, values))
        return flash_attention(q, k, v, is_causal=True)

    return Contestant(
        "flash_only", "attnlib.functional.flash_attention(is_causal=True) on projected q, k, v "
        f"(block_size={DEFAULT_BLOCK_SIZE})", flash_only, _kernel_inputs(w), (),
        full_layer=False)


def make_contestants(
    d_model: int = 768,
    num_heads: int = 12,
    context_length: int = 2048,
    *,
    names: Sequence[str] = CONTESTANTS,
    qkv_bias: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, Contestant]:
    """Build the contestants with one shared set of weights.

    The weights are those of one :class:`attnlib.MultiHeadAttention`
    (``d_in = d_out = d_model``, dropout 0, evaluation mode) created after
    ``torch.manual_seed(seed)``; ``torch_mha`` gets them copied into its packed
    ``in_proj_weight`` (rows: query, key, value), ``bare_kernels`` gets them
    packed once into one detached ``(3 * d_model, d_model)`` weight (and one
    bias), and ``sdpa_only``/``flash_only`` get detached copies, so no two
    contestants share a gradient.

    Args:
        d_model: embedding size. Default 768 (GPT-2 small).
        num_heads: number of heads; must divide ``d_model``. Default 12.
        context_length: the longest sequence the attnlib module will see.
        names: which contestants to build, a subset of :data:`CONTESTANTS`.
        qkv_bias: biases on the query, key and value projections (see the
            module docstring for how torch's module is matched). Default True.
        device: where the weights live; default :func:`attnlib.get_device`.
        dtype: floating-point dtype of the weights. Default float32.
        seed: seed for the weights.

    Returns:
        A dict from name to :class:`Contestant`, in the order of :data:`CONTESTANTS`.

    Raises:
        TypeError: a size is not an int, ``qkv_bias`` is not a bool, or
            ``dtype`` is not a floating-point dtype.
        ValueError: a size is not positive, ``num_heads`` does not divide
            ``d_model``, ``names`` is empty or names an unknown contestant.

    Source: GPT-2 small's attention size: Radford et al. (2019), "Language
    Models are Unsupervised Multitask Learners", Table 2.
    """
    _check_heads(d_model, num_heads)
    _check_positive_int("context_length", context_length)
    wanted = _check_names(names)
    _check_bool("qkv_bias", qkv_bias)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    device = torch.device(device) if device is not None else get_device()

    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads, qkv_bias=qkv_bias)
    mha = mha.to(device=device, dtype=dtype).eval()
    weights = _Weights.copy_of(mha)
    build: dict[str, Callable[[], Contestant]] = {
        "reference": lambda: _reference(mha),
        "attnlib": lambda: _attnlib(mha),
        "torch_mha": lambda: _torch_mha(weights, num_heads, device, dtype),
        "bare_kernels": lambda: _bare_kernels(weights, num_heads),
        "sdpa_only": lambda: _sdpa_only(weights, num_heads),
        "flash_only": lambda: _flash_only(weights, num_heads),
    }
    return {name: build[name]() for name in CONTESTANTS if name in wanted}


def agreement_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """The ``(rtol, atol)`` within which two implementations of attention agree in ``dtype``.

    Two correct implementations round differently: they sum in another order,
    and one may keep an intermediate (the scores, the weights) in ``dtype``
    where the other keeps it in float32. Their outputs, of magnitude about 1,
    then differ by a unit or two in the last place. The tolerance is two units
    in the last place at 1 (``2 * torch.finfo(dtype).eps``), and never tighter
    than ``rtol=1e-3, atol=1e-4``: float32 and float64 get ``(1e-3, 1e-4)``,
    float16 ``(1.95e-3, 1.95e-3)``, bfloat16 ``(1.56e-2, 1.56e-2)`` (its 8-bit
    significand: on the CPU attnlib's layer and the readable one differed by
    0.0039, one unit at 0.5-1, which float32's tolerance rejected).

    Args:
        dtype: a floating-point torch dtype.

    Returns:
        ``(rtol, atol)`` for :func:`torch.testing.assert_close`.

    Raises:
        TypeError: ``dtype`` is not a floating-point ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    two_ulps = 2 * torch.finfo(dtype).eps
    return max(1e-3, two_ulps), max(1e-4, two_ulps)


def check_agreement(
    contestants: dict[str, Contestant],
    x: torch.Tensor,
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Check that the full-layer contestants compute the same function.

    Every full-layer contestant's output on ``x`` is compared with the first
    one's by :func:`torch.testing.assert_close`; ``sdpa_only`` (which is not a
    full layer) is skipped.

    Args:
        contestants: from :func:`make_contestants`.
        x: input ``(batch, num_tokens, d_model)``.
        rtol: relative tolerance; None: :func:`agreement_tolerance` of ``x.dtype``.
        atol: absolute tolerance; None: :func:`agreement_tolerance` of ``x.dtype``.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``x`` is not 3-dimensional.
        RuntimeError: two contestants disagree (the message names them).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, num_tokens, d_model), got shape {tuple(x.shape)}")
    default_rtol, default_atol = agreement_tolerance(x.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    first_name, first = None, None
    with torch.no_grad():
        for name, c in contestants.items():
            if not c.full_layer:
                continue
            y = c.fn(*c.make_inputs(x))
            if first is None:
                first_name, first = name, y
                continue
            try:
                torch.testing.assert_close(y, first, rtol=rtol, atol=atol)
            except AssertionError as exc:
                raise RuntimeError(
                    f"contestants {name!r} and {first_name!r} disagree: {exc}") from None
