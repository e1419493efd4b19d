"""The passes, the autograd function and the public functions of
:mod:`attnlib.flash_triton`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..flash import differentiable_once
from ._launch import (
    LOG2_E,
    LaunchSettings,
    cdiv,
    check_inputs,
    check_variants,
    launch_settings,
    on_device,
)


class _Variant:
    """The mask and the extras of one call: causal and its alignment, window, sinks."""

    __slots__ = ("is_causal", "offset", "window", "sinks")

    def __init__(self, is_causal: bool, offset: int, window: int | None,
                 sinks: torch.Tensor | None) -> None:
        self.is_causal, self.offset, self.window = is_causal, offset, window
        self.sinks = sinks  # (num_heads,) float32, in base-2 units, or None

    def constants(self) -> dict[str, Any]:
        return {"IS_CAUSAL": self.is_causal, "HAS_WINDOW": self.window is not None}

    def scalars(self) -> tuple[int, int]:
        return self.offset, self.window or 1  # (OFFSET, WINDOW); WINDOW unread if none


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             variant: _Variant, scale: float, settings: LaunchSettings
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous inputs -> output ``(B, H, N_q, d)`` and base-2 LSE ``(B, H, N_q)``."""
    batch, num_heads, num_tokens_q, head_dim = query.shape
    num_kv_groups, num_tokens_kv = key.shape[1], key.shape[2]
    context_vec = torch.empty_like(query)  # (B, H, N_q, head_dim)
    lse = torch.empty((batch, num_heads, num_tokens_q), dtype=torch.float32,
                      device=query.device)  # (B, H, N_q), log2 of each row's denominator
    if num_tokens_q == 0:
        return context_vec, lse
    if num_tokens_kv == 0:  # no keys: zeros, as in torch; only the sink in the sum
        if variant.sinks is None:
            return context_vec.zero_(), lse.fill_(-math.inf)
        return context_vec.zero_(), lse.copy_(variant.sinks[None, :, None].expand_as(lse))
    sinks = variant.sinks if variant.sinks is not None else lse  # unread without sinks
    args = (query, key, value, sinks, context_vec, lse, scale * LOG2_E, num_tokens_q,
            num_tokens_kv, num_heads, num_heads // num_kv_groups, *variant.scalars())
    kernels = settings["kernels"]
    with on_device(query.device):
        if settings["autotune"]:
            kernels.forward_autotuned[
                lambda meta: (cdiv(num_tokens_q, meta["BLOCK_M"]), batch * num_heads)
            ](*args, **variant.constants(), HAS_SINKS=variant.sinks is not None,
              HEAD_DIM=head_dim, DOT_PRECISION=settings["precision"])
        else:
            block_m, block_n = settings["block_m"], settings["block_n"]
            grid = (cdiv(num_tokens_q, block_m), batch * num_heads)
            kernels.forward[grid](
                *args, **variant.constants(), HAS_SINKS=variant.sinks is not None,
                HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
                DOT_PRECISION=settings["precision"], **settings["launch"])
    return context_vec, lse


def _backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              context_vec: torch.Tensor, lse: torch.Tensor, grad_context: torch.Tensor,
              variant: _Variant, scale: float, settings: LaunchSettings
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the query, key and value (Dao 2023, Algorithm 2), each in the
    input dtype, and ``D = rowsum(dO * O)`` ``(B, H, N_q)`` in float32."""
    batch, num_heads, num_tokens_q, head_dim = query.shape
    num_kv_groups, num_tokens_kv = key.shape[1], key.shape[2]
    grad_query = torch.zeros_like(query)
    grad_key = torch.zeros_like(key)
    grad_value = torch.zeros_like(value)
    delta = torch.zeros_like(lse)  # (B, H, N_q), float32
    if num_tokens_q == 0 or num_tokens_kv == 0:
        return grad_query, grad_key, grad_value, delta
    grad_context = grad_context.contiguous()
    kernels, precision = settings["kernels"], settings["precision"]
    group = num_heads // num_kv_groups
    common = {**variant.constants(), "HEAD_DIM": head_dim, "DOT_PRECISION": precision}
    kv_args = (query, key, value, grad_context, lse, delta, grad_key, grad_value, scale,
               scale * LOG2_E, num_tokens_q, num_tokens_kv, group, *variant.scalars())
    q_args = (query, key, value, grad_context, lse, delta, grad_query, scale,
              scale * LOG2_E, num_tokens_q, num_tokens_kv, group, *variant.scalars())
    with on_device(query.device):
        delta_block = 64 if not kernels.interpret else settings["block_m"]
        kernels.delta[(cdiv(num_tokens_q, delta_block), batch * num_heads)](
            context_vec, grad_context, delta, num_tokens_q, HEAD_DIM=head_dim,
            BLOCK_M=delta_block)
        if settings["autotune"]:
            kernels.grad_key_value_autotuned[
                lambda meta: (cdiv(num_tokens_kv, meta["BLOCK_N"]), batch * num_kv_groups)
            ](*kv_args, **common)
            kernels.grad_query_autotuned[
                lambda meta: (cdiv(num_tokens_q, meta["BLOCK_M"]), batch * num_heads)
            ](*q_args, **common)
        else:
            block_m, block_n = settings["block_m"], settings["block_n"]
            blocks = {"BLOCK_M": block_m, "BLOCK_N": block_n, **settings["launch"]}
            kernels.grad_key_value[(cdiv(num_tokens_kv, block_n), batch * num_kv_groups)](
                *kv_args, **common, **blocks)
            kernels.grad_query[(cdiv(num_tokens_q, block_m), batch * num_heads)](
                *q_args, **common, **blocks)
    return grad_query, grad_key, grad_value, delta


class _FlashAttentionTritonFunction(torch.autograd.Function):
    """Autograd wrapper: saves the inputs, the output and the log-sum-exp, nothing N x N."""

    # ctx is Any, as in torch's own signatures: FunctionCtx declares neither
    # saved_tensors nor the attributes set on it here.
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                sinks: torch.Tensor | None, variant: _Variant, scale: float,
                settings: LaunchSettings) -> torch.Tensor:
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        context_vec, lse = _forward(query, key, value, variant, scale, settings)
        ctx.save_for_backward(query, key, value, context_vec, lse)
        ctx.variant, ctx.scale, ctx.settings = variant, scale, settings
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        return context_vec

    @staticmethod
    @differentiable_once("attnlib.flash_triton.flash_attention_triton")
    def backward(ctx: Any, grad_context: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        query, key, value, context_vec, lse = ctx.saved_tensors
        variant = ctx.variant
        *grads, delta = _backward(query, key, value, context_vec, lse, grad_context,
                                  variant, ctx.scale, ctx.settings)
        grad_sinks = None
        if variant.sinks is not None and ctx.needs_input_grad[3]:
            # The sink's weight in row i is P_i,sink = 2^(sink - L_i); its value is 0, so
            # dP_i,sink = 0 and d sink = sum_i P_i,sink (0 - D_i), summed over b and i.
            sink_weight = torch.exp2(variant.sinks[None, :, None] - lse)  # (B, H, N_q)
            grad_sinks = -(sink_weight * delta).sum(dim=(0, 2)).to(ctx.sinks_dtype)
        return (*grads, grad_sinks, None, None, None)


def _prepare(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
             scale: float | None, window: object, sinks: object, causal_alignment: object,
             block_m: object, block_n: object, num_warps: object, num_stages: object,
             autotune: object = False) -> tuple[_Variant, float, LaunchSettings]:
    asked = check_inputs(query, key, value, is_causal, scale, block_m, block_n, num_warps,
                         num_stages)
    window = check_variants(query, key, value, window, sinks, causal_alignment)
    from .._validation import check_bool

    check_bool("autotune", autotune)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    causal = bool(is_causal) or window is not None
    offset = key.shape[2] - query.shape[2] if causal_alignment == "bottom_right" else 0
    sinks_base2 = None
    if isinstance(sinks, torch.Tensor):  # (num_heads,) float32 in base-2 units
        sinks_base2 = (sinks.detach().float() * LOG2_E).contiguous()
    variant = _Variant(causal, offset, window, sinks_base2)
    return variant, scale, launch_settings(query, *asked, autotune=bool(autotune))


# --- public functions ------------------------------------------------------------------------
# Both take the same arguments and check them alike: their Args and Raises are written once,
# here, and filled into each docstring (as torch's documentation shares its common args).

_ARGS = """\
    Args:
        query: ``(batch, num_heads, num_tokens_q, head_dim)``.
        key: ``(batch, num_kv_groups, num_tokens_kv, head_dim)``, with
            ``num_kv_groups`` dividing ``num_heads`` (grouped-query attention:
            query head ``h`` reads key head ``h // (num_heads // num_kv_groups)``,
            as ``repeat_interleave`` would give; nothing is repeated in memory,
            and the key's and value's gradients are summed over each group).
        value: ``(batch, num_kv_groups, num_tokens_kv, head_dim)``. All three
            share one dtype (float16, bfloat16 or float32), one device and
            ``batch``; ``head_dim`` is 16, 32, 64 or 128. The token counts are
            any, not only multiples of a block.
        is_causal: query ``i`` sees keys ``j <= i`` (``causal_alignment``
            moves the corner). Default ``False``.
        scale: multiplier of the scores; default ``1 / sqrt(head_dim)``.
        window: keyword-only; a causal sliding window, chapter 9's
            :func:`attnlib.functional.sliding_window_mask`: the query at
            position ``p`` sees keys ``j`` with ``0 <= p - j < window``, itself
            and the ``window - 1`` before it. Implies the causal mask. An int
            ``>= 1``, or None (default) for none.
        sinks: keyword-only; ``(num_heads,)`` floating-point tensor, each
            head's sink logit (gpt-oss): it joins each row's softmax
            denominator without a value, as in
            :func:`attnlib.sinks.sink_attention`, and gets its gradient. Default
            None.
        causal_alignment: keyword-only; where the causal triangle (and the
            window) sit when ``num_tokens_q != num_tokens_kv``: ``"top_left"``
            (default), query ``i`` at position ``i``, as torch's
            ``is_causal=True`` and :func:`attnlib.functional.causal_mask`; or
            ``"bottom_right"``, query ``i`` at position
            ``num_tokens_kv - num_tokens_q + i``, the queries being the last
            tokens (a KV cache; :func:`attnlib.functional.bottom_right_causal_mask`,
            torch's ``causal_lower_right``). A query that sees no key at all
            (there are more queries than keys, bottom-right, or the window lies
            past the keys) gets zeros and no gradient, as FlashAttention gives.
        block_m: keyword-only; query rows per program, a power of two from 16
            to 256. Default 32 under the interpreter; on a GPU 64 for half
            precision and 32 for float32.
        block_n: keyword-only; key rows per inner-loop tile, the same choices
            and defaults as ``block_m``.
        num_warps: keyword-only; warps (of 32 threads) per program on a GPU, a
            power of two from 1 to 32; default 4. The interpreter ignores it.
        num_stages: keyword-only; how many key/value tiles a program keeps in
            flight on a GPU (software pipelining), 1 to 8; default 3 for half
            precision and 2 for float32. The interpreter ignores it.
        autotune: keyword-only; on a GPU, let ``triton.autotune`` time the
            configurations of ``flash_triton.AUTOTUNE_CONFIGS`` that fit in
            shared memory, once per ``(num_tokens_q, num_tokens_kv, head_dim)``
            and dtype, and launch the fastest (:func:`autotuned_configs` says
            which); the first call of each shape takes the timing. It excludes
            the four launch settings above. Under the interpreter nothing is
            timed and the defaults run. Default ``False``."""

_RAISES = """\
    Raises:
        ImportError: Triton is not installed (``pip install attnlib[triton]``).
        RuntimeError: CPU tensors while ``TRITON_INTERPRET=1`` is not set; the
            variable set now but not when Triton was first imported, or the
            other way round.
        TypeError: a tensor is not a floating-point tensor; the dtypes differ
            or are not float16, bfloat16 or float32; bfloat16 under the
            interpreter; ``is_causal`` or ``autotune`` is not a bool; ``scale``
            is not a number; ``window``, a block size, ``num_warps`` or
            ``num_stages`` is not an int; ``sinks`` is not a floating-point
            tensor; ``causal_alignment`` is not a str.
        ValueError: a tensor is not 4-D; query and key disagree on
            ``head_dim``, key and value on ``num_tokens_kv`` or
            ``num_kv_groups``, or value on ``head_dim``; ``batch`` differs;
            ``num_kv_groups`` does not divide ``num_heads``; ``head_dim`` is not
            16, 32, 64 or 128; the tensors are on different devices or on a
            device other than CPU or CUDA; ``scale`` is not finite;
            ``window < 1``; ``sinks`` is not ``(num_heads,)`` or is on another
            device; ``causal_alignment`` is another string; a block size is
            not a power of two from 16 to 256, ``num_warps`` not one from 1 to
            32, or ``num_stages`` not from 1 to 8; ``autotune=True`` with a
            launch setting."""

_F = TypeVar("_F", bound=Callable[..., Any])


def _documented(doc: str) -> Callable[[_F], _F]:
    """Give the decorated function ``doc``, with ``{args}`` and ``{raises}`` filled in."""
    def decorate(fn: _F) -> _F:
        fn.__doc__ = doc.replace("{args}", _ARGS).replace("{raises}", _RAISES)
        return fn
    return decorate


@_documented("""``softmax(query @ key^T * scale) @ value`` by FlashAttention-2's Triton kernels.

    Gives the result of :func:`torch.nn.functional.scaled_dot_product_attention`
    (no mask or causal, no dropout; ``enable_gqa=True`` for grouped heads) and
    its gradients, as :func:`attnlib.functional.flash_attention` does, but each
    pass is fused into Triton kernels: the forward writes only the output and
    one log-sum-exp per query row, and the backward recomputes the attention
    weights tile by tile from them (Dao 2023, Algorithms 1 and 2), with the
    formulas of :func:`attnlib.flash.flash_attention_backward`. Memory is
    linear in the number of tokens in both passes.

    Every kernel runs the tiles of the score matrix in three stages: those no
    query-key pair of which is attended are skipped (above the causal
    diagonal, outside the window), those every pair of which is attended run
    without a mask, and only those cut by the diagonal, the window's edge or
    the sequence's end apply one (:func:`tile_counts` counts them).

    On CUDA tensors the kernels are compiled for the GPU. On CPU tensors they
    run under Triton's interpreter, which is switched on by the environment
    variable ``TRITON_INTERPRET=1``, set before Triton is first imported in the
    process (``os.environ`` at the top of a notebook); it is slow but runs the
    same kernel code, which is how the tests check it without a GPU. bfloat16
    needs the GPU: the interpreter's ``tl.dot`` does not support it.

    It is differentiable once: the backward kernels run outside autograd,
    so the gradients have no graph of their own. With
    ``torch.autograd.grad(..., create_graph=True)`` they come back, but
    differentiating them again (double backward) raises a RuntimeError
    that says so; torch's ``scaled_dot_product_attention`` supports it.

{args}

    Returns:
        ``context_vec`` ``(batch, num_heads, num_tokens_q, head_dim)``, the
        dtype of the input. Products are summed and the softmax kept in
        float32; float32 inputs get full float32 products on the GPU (not
        TF32). With no keys it is zeros, as in torch.

{raises}
        RuntimeError: also raised later, by a backward pass through the
            gradients this function's backward returned (differentiable once).

    Source: Dao (2023), "FlashAttention-2: Faster Attention with Better
    Parallelism and Work Partitioning", Algorithm 1 (forward, Section 3.1.1),
    Algorithm 2 (backward, Section 3.1.2) and Section 3.2 (one program per
    row block in the forward, per column block in the backward; causal blocks
    skipped); Triton's fused-attention tutorial (the causal loop in two
    stages); Ainslie et al. (2023), "GQA", Section 2 (grouped heads);
    Beltagy, Peters and Cohan (2020), "Longformer", Section 3.1 (sliding
    window); OpenAI (2025), "gpt-oss-120b & gpt-oss-20b Model Card", Section
    2.1 (sinks); Tillet, Kung and Cox (2019), "Triton: An Intermediate
    Language and Compiler for Tiled Neural Network Computations".
    """)
def flash_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    causal_alignment: str = "top_left",
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    autotune: bool = False,
) -> torch.Tensor:
    variant, scale, settings = _prepare(query, key, value, is_causal, scale, window, sinks,
                                        causal_alignment, block_m, block_n, num_warps,
                                        num_stages, autotune)
    out: torch.Tensor = _FlashAttentionTritonFunction.apply(query, key, value, sinks,
                                                            variant, scale, settings)
    return out


@_documented("""The forward kernel alone, returning the log-sum-exp it saves for the backward.

    Nothing is recorded for autograd. The kernel keeps the log-sum-exp in base
    2 (``exp2`` with ``log2(e)`` folded into the scale); it is returned here in
    natural log, as :func:`attnlib.flash.flash_attention_forward` returns it.
    The arguments are :func:`flash_attention_triton`'s.

{args}

    Returns:
        ``(context_vec, logsumexp)``: ``context_vec``
        ``(batch, num_heads, num_tokens_q, head_dim)`` in the input's dtype, and
        ``logsumexp`` ``(batch, num_heads, num_tokens_q, 1)`` in float32, the
        log of each row's softmax denominator ``sum_j exp(score_ij)``, the
        sink's ``exp(sink)`` included (``-inf`` for a row that sees no key and
        has no sink).

{raises}

    Source: Dao (2023), "FlashAttention-2", Algorithm 1 and Section 3.1.1.
    """)
def flash_attention_triton_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    causal_alignment: str = "top_left",
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    autotune: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    variant, scale, settings = _prepare(query, key, value, is_causal, scale, window, sinks,
                                        causal_alignment, block_m, block_n, num_warps,
                                        num_stages, autotune)
    with torch.no_grad():
        context_vec, lse = _forward(query.contiguous(), key.contiguous(), value.contiguous(),
                                    variant, scale, settings)
    return context_vec, (lse * math.log(2.0)).unsqueeze(-1)  # (B, H, N_q, 1), natural log
