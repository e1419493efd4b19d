"""Tiled attention that never stores the ``(num_tokens_q, num_tokens_kv)`` matrix.

The forward pass of FlashAttention (Dao et al. 2022, Algorithm 1) in readable
PyTorch, with the loop order of FlashAttention-2 (Dao 2023): an outer loop over
blocks of queries and an inner loop over blocks of keys and values. Each query
row keeps three running quantities while the key blocks stream past:

* ``row_max``: the largest score seen so far (the online softmax's maximum);
* ``row_sum``: the sum of ``exp(score - row_max)`` so far;
* ``acc``: the sum of ``exp(score - row_max) * value`` so far.

When a new block raises the maximum, the old sum and the old accumulator are
rescaled by ``exp(old_max - new_max)``; at the end ``acc / row_sum`` is the
softmax-weighted average of the values. This is the online softmax of Milakov
and Gimelshein (2018) carried over to the weighted sum.

:func:`flash_attention` is the function to call (also as
``attnlib.functional.flash_attention``). Its backward pass recomputes each
block's weights from the saved log-sum-exp instead of storing them (Dao et al.
2022, Algorithm 4; Dao 2023, section 3.1.1 and Algorithm 2), so a training step
too needs memory linear in the number of tokens. Unlike FlashAttention's, it
takes two passes over the tiles, the first to sum each row's recomputed weights
and their products with ``dP``, which keeps float32 gradients as accurate as
torch's at large scores; :func:`flash_attention_backward` is the tile loop it shares
with ring attention. :func:`flash_attention_forward`
is the bare loop; autograd can differentiate it, but then keeps every block's
tensors, which adds up to the full matrix again.

Shapes: ``...`` is any number of leading (batch, head) dimensions, equal for
query, key and value; ``d_k`` is the query/key size, ``d_v`` the value size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._masks import causal_mask
from ._validation import check_int, check_positive_int, check_sdpa_inputs, type_name

__all__ = ["DEFAULT_BLOCK_SIZE", "FlashAttentionFunction", "causal_tile_mask", "compute_dtype",
           "differentiable_once", "flash_attention", "flash_attention_backward",
           "flash_attention_forward"]

DEFAULT_BLOCK_SIZE = 256
"""Query and key/value block size used when none is given (tuned on a 2-core CPU)."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the tiled loops compute in for inputs of ``dtype``: float32 for float16
    and bfloat16 (FlashAttention's kernels keep their accumulators in float32), else
    ``dtype`` itself. Ring attention's running results and gradients use it too.

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type_name(dtype)}")
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def causal_tile_mask(q_start: int, q_end: int, kv_start: int, kv_end: int, *,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """The causal mask of one tile: queries ``q_start ... q_end - 1`` against keys
    ``kv_start ... kv_end - 1``.

    The block of :func:`attnlib.functional.causal_mask` (top-left alignment, torch's
    ``is_causal``) at rows ``q_start:q_end`` and columns ``kv_start:kv_end``: query
    ``i`` sees key ``j`` when ``j <= i``. It is ``causal_mask`` itself, built from the
    earlier of the two starts on, so the tiles that the loops here mask, those that
    cross the diagonal, whose first query and first key coincide
    (``q_start == kv_start``), get a mask of the tile's size and no more.

    Args:
        q_start, q_end: the tile's query positions, ``0 <= q_start <= q_end``.
        kv_start, kv_end: the tile's key positions, ``0 <= kv_start <= kv_end``.
        device: keyword-only; where to create the mask.

    Returns:
        Bool tensor ``(q_end - q_start, kv_end - kv_start)``, **True where attention is
        allowed** (the polarity of :mod:`attnlib.functional`'s masks).

    Raises:
        TypeError: a position is not an integer (bools are refused).
        ValueError: a position is negative, or an end lies before its start.

    Source: the decoder masking of Vaswani et al. (2017), section 3.2.3, cut into the
    tiles of Dao et al. (2022), "FlashAttention", Algorithm 1.
    """
    bounds = {name: check_int(name, v, minimum=0) for name, v in
              (("q_start", q_start), ("q_end", q_end), ("kv_start", kv_start),
               ("kv_end", kv_end))}
    for start, end in (("q_start", "q_end"), ("kv_start", "kv_end")):
        if bounds[end] < bounds[start]:
            raise ValueError(f"{end}={bounds[end]} lies before {start}={bounds[start]}: "
                             f"expected {start} <= {end}")
    # The block of causal_mask counted from the earlier start, so that a tile on the
    # diagonal (q_start == kv_start) gets the whole mask, of the tile's size only.
    first = min(bounds["q_start"], bounds["kv_start"])
    mask = causal_mask(bounds["q_end"] - first, bounds["kv_end"] - first, device=device)
    if bounds["q_start"] == bounds["kv_start"]:
        return mask
    return mask[bounds["q_start"] - first:, bounds["kv_start"] - first:]


def flash_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward loop of FlashAttention, returning the log-sum-exp too.

    Computes ``softmax(query @ key^T * scale) @ value`` one
    ``(block_size, block_size)`` tile of scores at a time, never holding the
    whole ``(num_tokens_q, num_tokens_kv)`` matrix. It is plain PyTorch, so
    autograd can differentiate it, but autograd then saves every tile's
    tensors (quadratic memory again); :func:`attnlib.flash.flash_attention` avoids that.

    Args:
        query: ``(..., num_tokens_q, d_k)``.
        key: ``(..., num_tokens_kv, d_k)``.
        value: ``(..., num_tokens_kv, d_v)``.
        is_causal: query ``i`` sees keys ``j <= i`` (top-left alignment, as
            :func:`attnlib.functional.causal_mask` and torch's ``is_causal``).
        scale: multiplier of the scores; default ``1 / sqrt(d_k)``.
        block_size: rows of queries and of keys/values per tile, any int >= 1;
            the sizes need not be multiples of it. Default
            :data:`attnlib.flash.DEFAULT_BLOCK_SIZE`.

    Returns:
        ``(context_vec, logsumexp)``: ``context_vec`` ``(..., num_tokens_q, d_v)``
        in the input's dtype, and ``logsumexp`` ``(..., num_tokens_q, 1)``, the
        log of each row's softmax denominator (``-inf`` for a row that sees no
        key), in float32 for half-precision inputs. With no keys at all the
        context vectors are zeros, as in torch.

    Raises:
        TypeError: a tensor is not floating point, the dtypes differ,
            ``is_causal`` is not a bool, ``scale`` is not a number or
            ``block_size`` is not an int.
        ValueError: a tensor has fewer than 2 dimensions; query and key
            disagree on ``d_k``; key and value on ``num_tokens_kv``; the
            leading dimensions differ; the tensors are on different devices;
            ``scale`` is not finite; ``block_size < 1``.

    Source: Dao et al. (2022), "FlashAttention", Algorithm 1 (tiling with
    running max and sum); the loop order of Dao (2023), "FlashAttention-2",
    Algorithm 1; Milakov and Gimelshein (2018), "Online normalizer calculation
    for softmax", Algorithm 3.
    """
    check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)  # the reference's checks
    block_size = check_positive_int("block_size", block_size)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    num_tokens_q, num_tokens_kv = query.shape[-2], key.shape[-2]
    dtype = compute_dtype(query.dtype)
    lead = query.shape[:-2]  # the (batch, head) dimensions

    # The outputs are allocated once and each block of query rows is written into its
    # slice, as FlashAttention writes O_i and L_i to main memory: nothing is concatenated.
    context_vec = torch.empty((*lead, num_tokens_q, value.shape[-1]), dtype=query.dtype,
                              device=query.device)  # (..., num_tokens_q, d_v)
    logsumexp = torch.empty((*lead, num_tokens_q, 1), dtype=dtype,
                            device=query.device)  # (..., num_tokens_q, 1)
    for q_start in range(0, num_tokens_q, block_size):
        q_end = min(q_start + block_size, num_tokens_q)
        q_block = query[..., q_start:q_end, :].to(dtype)  # (..., Bq, d_k)
        rows = q_end - q_start
        row_max = torch.full((*lead, rows, 1), -math.inf, dtype=dtype, device=query.device)
        row_sum = torch.zeros((*lead, rows, 1), dtype=dtype, device=query.device)
        acc = torch.zeros((*lead, rows, value.shape[-1]), dtype=dtype, device=query.device)
        # With a causal mask, no query of this block sees a key at or past q_end.
        kv_stop = min(num_tokens_kv, q_end) if is_causal else num_tokens_kv
        for kv_start in range(0, kv_stop, block_size):
            kv_end = min(kv_start + block_size, kv_stop)
            k_block = key[..., kv_start:kv_end, :].to(dtype)  # (..., Bk, d_k)
            v_block = value[..., kv_start:kv_end, :].to(dtype)  # (..., Bk, d_v)
            # Scaled after the product, as the readable path does (in place: no second
            # tile); the backward pass recomputes the scores with exactly these operations.
            scores = (q_block @ k_block.transpose(-2, -1)).mul_(scale)  # (..., Bq, Bk)
            if is_causal and kv_end - 1 > q_start:  # the tile crosses the diagonal
                seen = causal_tile_mask(q_start, q_end, kv_start, kv_end, device=query.device)
                scores = scores.masked_fill(~seen, -math.inf)  # (..., Bq, Bk)
            # Every row sees key 0 in the first tile, so new_max is finite from here on.
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (..., Bq, 1)
            probs = torch.exp(scores - new_max)  # (..., Bq, Bk), unnormalised
            rescale = torch.exp(row_max - new_max)  # shrinks what was summed under the old max
            row_sum = row_sum * rescale + probs.sum(dim=-1, keepdim=True)
            acc = acc * rescale + probs @ v_block  # (..., Bq, d_v)
            row_max = new_max
        # A row that saw no key (num_tokens_kv == 0) has acc == 0 and row_sum == 0: give 0.
        context_vec[..., q_start:q_end, :] = acc / torch.where(row_sum > 0, row_sum, 1.0)
        logsumexp[..., q_start:q_end, :] = row_max + torch.log(row_sum)
    return context_vec, logsumexp


class _SecondDerivativeError(torch.autograd.Function):
    """Passes the gradients of a once-differentiable backward on, unchanged, linked to the
    tensors they depend on; differentiating them raises ``RuntimeError(message)``. torch's
    ``once_differentiable`` returns gradients with no graph when the incoming gradient does
    not require grad, so that a second backward fails with torch's generic words."""

    @staticmethod
    def forward(ctx: Any, message: str, num_grads: int, *tensors: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        # tensors: the gradients, then the tensors they depend on (only linked to).
        ctx.message = message
        return tuple(g.clone() for g in tensors[:num_grads])

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[None, ...]:
        raise RuntimeError(ctx.message)


def differentiable_once(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate an ``autograd.Function.backward`` computed without a graph.

    The backward runs under ``torch.no_grad()``. With ``create_graph=True`` its
    gradients come back linked to the saved tensors and the incoming gradients through
    a node whose own backward raises a RuntimeError saying that ``name`` is
    differentiable once (torch's ``once_differentiable`` would let a second backward
    fail with torch's generic words). :func:`flash_attention`, ring attention and the
    Triton kernels' autograd functions use it.

    Args:
        name: the public function the message names, e.g. ``"attnlib.flash.flash_attention"``.

    Returns:
        The decorator.

    Raises:
        TypeError: ``name`` is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type_name(name)}")
    message = (f"{name} is differentiable once: its backward pass is computed outside "
               "autograd, so the gradients it returned with create_graph=True cannot be "
               "differentiated again. For second derivatives (double backward) use "
               "torch.nn.functional.scaled_dot_product_attention")

    def decorate(backward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(backward)
        def wrapper(ctx: Any, *grad_outputs: torch.Tensor) -> Any:
            with torch.no_grad():
                grads = backward(ctx, *grad_outputs)
            if not torch.is_grad_enabled():  # no create_graph: nothing to guard
                return grads
            where = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
            sources = [t for t in (*ctx.saved_tensors, *grad_outputs)
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            guarded = _SecondDerivativeError.apply(
                message, len(where), *(grads[i] for i in where), *sources)
            out = list(grads)
            for i, g in zip(where, guarded, strict=True):
                out[i] = g
            return tuple(out)
        return wrapper
    return decorate


class FlashAttentionFunction(torch.autograd.Function):
    """The autograd function behind :func:`attnlib.flash.flash_attention`: it saves only
    the inputs and each row's log-sum-exp, not the tiles' weights.

    Call it as ``FlashAttentionFunction.apply(query, key, value, is_causal, scale,
    block_size)`` with checked arguments (``scale`` a float, not None); to have them
    checked, call :func:`attnlib.flash.flash_attention`. The forward pass is
    :func:`attnlib.flash.flash_attention_forward`; the backward pass sums each row's
    recomputed weights and ``D`` in a first pass over the tiles, then runs
    :func:`attnlib.flash.flash_attention_backward` with them. It is differentiable once
    (:func:`attnlib.flash.differentiable_once`).

    Shapes: query ``(..., num_tokens_q, d_k)``, key ``(..., num_tokens_kv, d_k)``, value
    ``(..., num_tokens_kv, d_v)``; the output ``(..., num_tokens_q, d_v)``, in the input's
    dtype.

    Raises:
        RuntimeError: a backward pass through the gradients its backward returned with
            ``create_graph=True``.

    Source: Dao et al. (2022), "FlashAttention", Algorithms 1 and 4; Dao (2023),
    "FlashAttention-2", section 3.1.1 (the one log-sum-exp saved per row).
    """

    # ctx is Any, as in torch's own signatures: FunctionCtx declares neither
    # saved_tensors nor the attributes set on it here.
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                is_causal: bool, scale: float, block_size: int) -> torch.Tensor:
        """The context vectors ``(..., num_tokens_q, d_v)``; saves the inputs and the
        log-sum-exp ``(..., num_tokens_q, 1)`` on ``ctx``."""
        context_vec, logsumexp = flash_attention_forward(
            query, key, value, is_causal, scale, block_size=block_size)
        ctx.save_for_backward(query, key, value, logsumexp)
        ctx.is_causal, ctx.scale, ctx.block_size = is_causal, scale, block_size
        return context_vec

    @staticmethod
    @differentiable_once("attnlib.flash.flash_attention")
    def backward(ctx: Any, grad_context: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        """``(grad_query, grad_key, grad_value, None, None, None)``: the gradients shaped
        and typed as the inputs, none for the three settings."""
        query, key, value, logsumexp = ctx.saved_tensors
        grads = _flash_backward(query, key, value, logsumexp, grad_context, ctx.is_causal,
                                ctx.scale, ctx.block_size)
        return (*grads, None, None, None)


def _backward_tiles(num_tokens_q: int, num_tokens_kv: int, is_causal: bool,
                    block_size: int) -> Iterator[tuple[int, int, int, int]]:
    """The ``(q_start, q_end, kv_start, kv_end)`` of each tile the backward visits."""
    for kv_start in range(0, num_tokens_kv, block_size):
        kv_end = min(kv_start + block_size, num_tokens_kv)
        # With a causal mask, queries before kv_start do not see this block.
        for q_start in range(kv_start if is_causal else 0, num_tokens_q, block_size):
            yield q_start, min(q_start + block_size, num_tokens_q), kv_start, kv_end


def _recompute_tile(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    logsumexp: torch.Tensor, grad_context: torch.Tensor,
                    tile: tuple[int, int, int, int], is_causal: bool, scale: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tile's blocks, ``E = exp(S - L)`` and ``dP = dO @ V^T``, as the forward computed S.

    Every backward pass calls this, so all see the same bits. Returns
    ``(q_block, k_block, exp_scores, grad_weights)``; the last two are ``(..., Bq, Bk)``.
    """
    q_start, q_end, kv_start, kv_end = tile
    dtype = logsumexp.dtype
    q_block = query[..., q_start:q_end, :].to(dtype)  # (..., Bq, d_k)
    k_block = key[..., kv_start:kv_end, :].to(dtype)  # (..., Bk, d_k)
    v_block = value[..., kv_start:kv_end, :].to(dtype)  # (..., Bk, d_v)
    scores = (q_block @ k_block.transpose(-2, -1)).mul_(scale)  # (..., Bq, Bk), as forward
    if is_causal and kv_end - 1 > q_start:  # the tile crosses the diagonal
        seen = causal_tile_mask(q_start, q_end, kv_start, kv_end, device=query.device)
        scores = scores.masked_fill(~seen, -math.inf)
    exp_scores = torch.exp(scores - logsumexp[..., q_start:q_end, :])  # (..., Bq, Bk)
    grad_weights = grad_context[..., q_start:q_end, :] @ v_block.transpose(-2, -1)
    return q_block, k_block, exp_scores, grad_weights


def _check_row_terms(query: torch.Tensor, value: torch.Tensor, **rows: object) -> None:
    """Each of ``rows`` must be a floating-point tensor ``(..., num_tokens_q, width)``:
    ``grad_context`` as wide as the value, the others one column (or None, ``row_sum``)."""
    for name, t in rows.items():
        if t is None and name == "row_sum":
            continue
        width = value.shape[-1] if name == "grad_context" else 1
        expected = (*query.shape[:-1], width)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {type_name(t)}")
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape {expected} (the query's rows, "
                             f"{width} wide), got {tuple(t.shape)}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, the query on {query.device}")


def flash_attention_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    logsumexp: torch.Tensor,
    grad_context: torch.Tensor,
    delta: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    row_sum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of tiled attention, recomputing each tile's weights from ``L``.

    FlashAttention-2's backward loop (Dao 2023, Algorithm 2) in PyTorch: an outer loop
    over blocks of keys and values, an inner loop over the blocks of queries that see
    them. Each tile recomputes the scores ``S = Q K^T * scale`` exactly as
    :func:`attnlib.flash.flash_attention_forward` computed them (same mask), and from the
    saved log-sum-exp ``L`` the weights ``P = exp(S - L)``, divided by ``row_sum`` when
    it is given. Then, with ``dP = dO V^T`` and ``D`` the row term passed in::

        dS = P * (dP - D)              (the softmax's backward, per row)
        dV += P^T dO,   dQ += dS K * scale,   dK += dS^T Q * scale

    ``D_i = sum_j P_ij dP_ij``, which equals ``rowsum(dO_i * O_i)``: FlashAttention and
    ring attention pass that (:func:`attnlib.distributed.ring_attention`, with ``L``
    of the whole sequence), as the Triton kernels' ``delta_kernel`` computes it
    (``attnlib.flash_triton.kernels``, the same formulas in base 2).
    :func:`attnlib.flash.flash_attention` first sums each row's ``exp(S - L)``
    (``row_sum``) and ``D`` from the same recomputed tiles, which keeps float32 gradients
    as accurate as torch's at large scores.

    Args:
        query: ``(..., num_tokens_q, d_k)``.
        key: ``(..., num_tokens_kv, d_k)``.
        value: ``(..., num_tokens_kv, d_v)``.
        logsumexp: ``(..., num_tokens_q, 1)``, ``log sum_j exp(S_ij)`` as the forward
            returned it (its dtype is the compute dtype: float32 for half precision).
        grad_context: ``(..., num_tokens_q, d_v)``, the gradient of the output ``dO``.
        delta: ``(..., num_tokens_q, 1)``, ``D_i = rowsum(dO_i * O_i)``.
        is_causal: query ``i`` sees keys ``j <= i`` (top-left), as in the forward.
        scale: multiplier of the scores; default ``1 / sqrt(d_k)``.
        block_size: keyword-only; rows of queries and keys per tile, any int >= 1.
        row_sum: keyword-only; ``(..., num_tokens_q, 1)`` or None (default): each row's
            ``sum_j exp(S_ij - L_i)``, 1 up to rounding, to divide ``P`` by.

    Returns:
        ``(grad_query, grad_key, grad_value)``, shaped as the inputs, in the dtype of
        ``logsumexp`` (the caller casts them back).

    Raises:
        TypeError: a tensor is not floating point or the inputs' dtypes differ;
            ``is_causal`` is not a bool; ``scale`` not a number; ``block_size`` not an int.
        ValueError: as :func:`attnlib.flash.flash_attention_forward` raises them; or
            ``logsumexp``, ``grad_context``, ``delta`` or ``row_sum`` does not have the
            query's rows and its width, or is on another device.

    Source: Dao (2023), "FlashAttention-2", Algorithm 2 and section 3.1.2; Dao et al.
    (2022), "FlashAttention", Algorithm 4 and appendix B.2 (``D = rowsum(dO * O)``).
    """
    check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)  # the reference's checks
    block_size = check_positive_int("block_size", block_size)
    _check_row_terms(query, value, logsumexp=logsumexp, grad_context=grad_context,
                     delta=delta, row_sum=row_sum)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    dtype = logsumexp.dtype
    grad_context = grad_context.to(dtype)
    grad_query = torch.zeros(query.shape, dtype=dtype, device=query.device)
    grad_key = torch.zeros(key.shape, dtype=dtype, device=key.device)
    grad_value = torch.zeros(value.shape, dtype=dtype, device=value.device)
    for tile in _backward_tiles(query.shape[-2], key.shape[-2], is_causal, block_size):
        q_block, k_block, attn_weights, grad_weights = _recompute_tile(
            query, key, value, logsumexp, grad_context, tile, is_causal, scale)
        rows, cols = slice(tile[0], tile[1]), slice(tile[2], tile[3])
        if row_sum is not None:
            attn_weights = attn_weights / row_sum[..., rows, :]  # (..., Bq, Bk)
        grad_value[..., cols, :] += attn_weights.transpose(-2, -1) @ grad_context[..., rows, :]
        # dS = P * (dP - D), the gradient of the scaled scores; times scale, that of
        # query @ key^T.
        grad_scores = attn_weights * (grad_weights - delta[..., rows, :]) * scale
        grad_query[..., rows, :] += grad_scores @ k_block
        grad_key[..., cols, :] += grad_scores.transpose(-2, -1) @ q_block
    return grad_query, grad_key, grad_value


def _flash_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    logsumexp: torch.Tensor, grad_context: torch.Tensor, is_causal: bool,
                    scale: float, block_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`flash_attention_backward` after a first pass that sums, per query row,
    ``E_ij = exp(S_ij - L_i)`` and ``E_ij dP_ij``, for ``row_sum`` and ``D``.

    FlashAttention divides by nothing (``P = E``) and takes ``D_i = dO_i . O_i``,
    equal in exact arithmetic, which saves this pass. In float32 both lose
    accuracy where scores are large: ``L`` is rounded to float32, an error of up to
    ``|L| * 6e-8`` in every exponent (2e-5 at ``L = 300``), and ``D`` computed from
    ``O`` does not cancel the rounding of ``dP``, so ``sum_j dS_ij`` is not 0 and the
    error is multiplied by the size of the keys. Normalising by the recomputed sum
    makes each row of ``P`` sum to 1 whatever the rounding of ``L``, and ``D`` from
    the same ``P`` and ``dP`` makes each row of ``dS`` sum to 0, as in the softmax's
    own backward.
    """
    grad_context = grad_context.to(logsumexp.dtype)
    exp_sum = torch.zeros_like(logsumexp)  # (..., N_q, 1): sum_j E_ij, 1 up to rounding
    weighted = torch.zeros_like(logsumexp)  # (..., N_q, 1): sum_j E_ij dP_ij
    for tile in _backward_tiles(query.shape[-2], key.shape[-2], is_causal, block_size):
        _, _, exp_scores, grad_weights = _recompute_tile(
            query, key, value, logsumexp, grad_context, tile, is_causal, scale)
        rows = slice(tile[0], tile[1])
        exp_sum[..., rows, :] += exp_scores.sum(dim=-1, keepdim=True)
        weighted[..., rows, :] += (exp_scores * grad_weights).sum(dim=-1, keepdim=True)
    delta = weighted / exp_sum  # (..., N_q, 1): D_i = sum_j P_ij dP_ij
    grads = flash_attention_backward(query, key, value, logsumexp, grad_context, delta,
                                     is_causal, scale, block_size=block_size,
                                     row_sum=exp_sum)
    return grads[0].to(query.dtype), grads[1].to(key.dtype), grads[2].to(value.dtype)


def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> torch.Tensor:
    """``softmax(query @ key^T * scale) @ value`` in tiles: FlashAttention in PyTorch.

    Gives the result of :func:`torch.nn.functional.scaled_dot_product_attention`
    (no mask or causal, no dropout) while holding only one
    ``(block_size, block_size)`` tile of scores at a time: memory grows
    linearly with the number of tokens instead of quadratically. The forward
    pass is :func:`attnlib.flash.flash_attention_forward`. The backward pass does not
    store the tiles: it recomputes each tile's weights from the saved
    log-sum-exp of its rows, so a training step is linear in memory too. It
    visits the tiles twice, first to sum each row's recomputed weights, so that
    float32 gradients stay as accurate as the readable path's and torch's
    however large the scores (FlashAttention visits them once).

    It is written for reading, not speed: on a GPU a fused kernel does the
    same work without Python's loop (see ``torch.nn.attention.sdpa_kernel``).
    Unlike :func:`attnlib.functional.scaled_dot_product_attention` it cannot
    return the attention weights: they never exist at once.

    It is differentiable once. The backward pass is computed outside autograd,
    so the gradients it returns have no graph of their own: with
    ``torch.autograd.grad(..., create_graph=True)`` they come back, but
    differentiating them again (a gradient penalty, a Hessian-vector product)
    raises a RuntimeError that says so. torch's
    ``scaled_dot_product_attention`` supports second derivatives.

    Args:
        query: ``(..., num_tokens_q, d_k)``.
        key: ``(..., num_tokens_kv, d_k)``.
        value: ``(..., num_tokens_kv, d_v)``. The leading dimensions ``...``
            must be equal (no broadcasting).
        is_causal: query ``i`` sees keys ``j <= i``: the lower triangle
            aligned at the top-left corner, as torch's ``is_causal=True`` and
            :func:`attnlib.functional.causal_mask`. Default ``False``.
        scale: multiplier of the scores; default ``1 / sqrt(d_k)``.
        block_size: keyword-only; query and key/value rows per tile, any
            int >= 1 (the sizes need not be multiples of it). Default
            :data:`attnlib.flash.DEFAULT_BLOCK_SIZE` (256).

    Returns:
        ``context_vec`` ``(..., num_tokens_q, d_v)``, the dtype of the input.
        Half-precision inputs are computed with float32 running statistics.
        With no keys (``num_tokens_kv == 0``) it is zeros, as in torch.

    Raises:
        TypeError: a tensor is not floating point or the dtypes differ;
            ``is_causal`` is not a bool; ``scale`` is not a number;
            ``block_size`` is not an int.
        ValueError: a tensor has fewer than 2 dimensions; query and key
            disagree on ``d_k``; key and value disagree on ``num_tokens_kv``;
            the leading dimensions differ; the tensors are on different
            devices; ``scale`` is not finite; ``block_size < 1``.
        RuntimeError: raised later, by a backward pass through the gradients
            that this function's backward returned (differentiable once, above).

    Source: Dao et al. (2022), "FlashAttention: Fast and Memory-Efficient Exact
    Attention with IO-Awareness", Algorithm 1 (forward) and Algorithm 4
    (backward by recomputation); Dao (2023), "FlashAttention-2", Algorithms 1
    and 2 (loop order) and section 3.1.1 (the single log-sum-exp saved for the
    backward); Milakov and Gimelshein (2018), "Online normalizer calculation
    for softmax".
    """
    check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)  # the reference's checks
    block_size = check_positive_int("block_size", block_size)
    is_causal = bool(is_causal)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    return FlashAttentionFunction.apply(query, key, value, is_causal, float(scale), block_size)
