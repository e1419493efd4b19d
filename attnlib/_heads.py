"""Plumbing of the attention modules that no chapter prints (private).

:mod:`attnlib.attention`, :mod:`attnlib.multihead` and :mod:`attnlib.gqa`
import these helpers from here, below all three of them, so that none of
those modules imports another for a helper:

* :func:`_register_causal_mask`: the bool ``mask`` buffer and its loading rule;
* :func:`_pack_qkv` and :func:`_fused_qkv_projection`: the query, key and value
  projections as ONE matrix product (the fast path), with the ATen operators
  of a layer whose three weights are one tensor (:class:`_ReadStacked`);
* :func:`_num_cached`: how many tokens a KV cache holds, checked before any
  computation;
* :func:`_sdpa_shared_kv`: torch's fused attention with fewer key/value heads
  than query heads.

The names keep their leading underscore (no module outside attnlib imports
them), which is also how the chapters' printed code shows them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ._validation import check_positive_int, type_name
from .functional import causal_mask
from .kv_cache import KVCache
from .sinks import AttentionSinks, softmax_with_sinks


def _register_causal_mask(module: nn.Module, context_length: int) -> None:
    """Give ``module`` a bool ``mask`` buffer (True = may attend) that survives loading.

    The buffer is persistent, so state_dict keys match the reference
    implementation's (Raschka 2024, ch. 3, which also calls it ``mask``). That
    reference stores a *float* mask that is 1 where attention is **blocked**;
    copied into a bool buffer it would flip the mask. The mask is fully
    determined by ``context_length``, so loading keeps the module's own mask:
    an incoming ``mask`` of the right shape is replaced by it (a wrong shape
    still fails with torch's usual size-mismatch error).
    """
    module.register_buffer("mask", causal_mask(context_length), persistent=True)
    module.register_load_state_dict_pre_hook(_keep_own_mask)


def _keep_own_mask(
    module: nn.Module,
    state_dict: dict[str, object],
    prefix: str,
    local_metadata: dict[str, object],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    # ``load_state_dict`` hands hooks its own shallow copy of the caller's dict,
    # so replacing an entry here does not change the caller's state_dict.
    key = prefix + "mask"
    incoming = state_dict.get(key)
    own = module.get_buffer("mask")
    if incoming is None or (isinstance(incoming, torch.Tensor) and incoming.shape == own.shape):
        # (A state_dict without a mask, saved by a module built with
        # mask_buffer=False, loads too: the mask is the module's own either way.)
        state_dict[key] = own


def _drop_incoming_mask(
    module: nn.Module,
    state_dict: dict[str, object],
    prefix: str,
    local_metadata: dict[str, object],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    # A module built with mask_buffer=False has no mask: a saved one (fully
    # determined by context_length) is not an unexpected key, it is ignored.
    state_dict.pop(prefix + "mask", None)


def _register_no_mask(module: nn.Module) -> None:
    """Register ``mask = None`` (no buffer, no state_dict entry); saved masks are ignored."""
    module.register_buffer("mask", None)
    module.register_load_state_dict_pre_hook(_drop_incoming_mask)


def _head_dim(d_out: int, num_heads: int, head_dim: object) -> int:
    """``head_dim``, checked, or ``d_out // num_heads`` when it is None.

    Raises:
        TypeError: ``head_dim`` is neither None nor an int.
        ValueError: ``head_dim`` is not positive; or it is None and ``d_out``
            is not divisible by ``num_heads``.
    """
    if head_dim is None:
        if d_out % num_heads != 0:
            raise ValueError(
                f"d_out={d_out} is not divisible by num_heads={num_heads} "
                "(or give head_dim, and the heads need not fill d_out)"
            )
        return d_out // num_heads
    return check_positive_int("head_dim", head_dim)


def _check_key_padding_mask(
    key_padding_mask: object, batch: int, num_tokens_kv: int, device: torch.device
) -> None:
    """Check a ``(batch, num_tokens_kv)`` bool key-padding mask (None passes).

    Raises:
        TypeError: not a tensor, or not bool.
        ValueError: wrong shape or device.
    """
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a bool tensor or None, got "
                        f"{type_name(key_padding_mask)}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be bool (True where a key is padding), got "
            f"{key_padding_mask.dtype}"
        )
    if tuple(key_padding_mask.shape) != (batch, num_tokens_kv):
        raise ValueError(
            f"key_padding_mask must be (batch, num_tokens_kv) = ({batch}, {num_tokens_kv}), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    if key_padding_mask.device != device:
        raise ValueError(f"key_padding_mask is on {key_padding_mask.device}, x on {device}")


def _allowed_keys(
    module: nn.Module,
    num_cached: int,
    num_tokens_kv: int,
    fast: bool,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
) -> tuple[torch.Tensor | None, bool]:
    """The mask of one attention call: ``(allowed, is_causal)``.

    ``allowed`` is True where a query may attend to a key, for the new queries
    at positions ``num_cached ... num_tokens_kv - 1`` (the bottom-right rows
    of the causal mask) and the keys ``0 ... num_tokens_kv - 1``:
    ``(N_q, num_tokens_kv)``, or ``(batch, 1, N_q, num_tokens_kv)`` with a
    ``key_padding_mask`` (``(batch, num_tokens_kv)``, True where a key is
    **padding**, torch's polarity, so it is inverted here). Rows come from the
    module's ``mask`` buffer where it has one, else they are built for this
    call only (``N_q x num_tokens_kv`` bools, not ``context_length**2``).

    On the fast path (``fast=True``) from position 0 with no padding the
    result is ``(None, True)``: torch's ``is_causal=True`` applies the same
    mask without one being stored. Without causality (``causal=False``) and
    without padding it is ``(None, False)``: every query sees every key.
    """
    if causal and fast and num_cached == 0 and key_padding_mask is None:
        return None, True
    allowed: torch.Tensor | None = None
    if causal:
        mask = module.get_buffer("mask") if "mask" in module._buffers else None
        if mask is not None:
            allowed = mask[num_cached:num_tokens_kv, :num_tokens_kv]  # (N_q, N_kv)
        else:
            device = next(module.parameters()).device
            allowed = torch.ones(
                num_tokens_kv - num_cached, num_tokens_kv, dtype=torch.bool, device=device
            ).tril(diagonal=num_cached)  # (N_q, N_kv): key j <= num_cached + i
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (batch, 1, 1, N_kv), True = real key
        allowed = keep if allowed is None else keep & allowed  # (batch, 1, N_q, N_kv)
    return allowed, False


def _pack_qkv(W_query: nn.Linear, W_key: nn.Linear, W_value: nn.Linear) -> None:
    """Store the three weights (and biases) side by side in one tensor each.

    Each parameter stays its own ``nn.Parameter`` (same object, same values,
    same ``state_dict`` key, its own gradient); only its storage becomes a
    slice of a shared ``(d_q + 2 * d_kv, d_in)`` tensor, so that
    :func:`_fused_qkv_projection` can read the stacked weight without copying
    it. ``.to()``, ``.double()`` and the like give parameters new storage;
    :class:`attnlib.GroupedQueryAttention` (and so
    :class:`attnlib.MultiHeadAttention`) calls this again after them, in its
    ``_apply``.

    Why not simply ``torch.cat`` the three weights on every call, as the
    path with gradients does? Because the copy is not free: for GPT-2 small's
    three ``768 x 768`` float32 weights it takes about 0.3 ms on the course's
    2-core CPU, about as long as the whole layer takes for one token. Measured on
    one :class:`attnlib.MultiHeadAttention` (``qkv_bias=True``, forward
    without gradients, one thread, torch 2.13), the no-copy view against the
    same module with ``torch.cat`` per call, interleaved call by call (median
    of 60; the ratio is the median of the per-repetition ratios, with its
    quartiles)::

        N      no copy   torch.cat   torch.cat / no copy
        1      0.34 ms    0.67 ms    1.89  [1.57, 2.55]
        16     1.36 ms    1.77 ms    1.30  [1.20, 1.36]
        64     4.25 ms    4.58 ms    1.11  [1.08, 1.15]
        256    15.9 ms    16.5 ms    1.04  [1.03, 1.05]
        1024   80.1 ms    85.9 ms    1.07  [1.01, 1.09]

    ``python -m attnlib.bench --threads 1 --modes forward --contestants
    attnlib bare_kernels --seq-lens 64 256 1024 --reps 30`` agrees: attnlib's
    paired time over the bare kernels' (which pack their weight once) is
    1.02, 1.00 and 1.01 with the view, 1.12-1.14, 1.03-1.05 and 1.01-1.02
    with ``torch.cat`` (two runs each), against the benchmark's target of
    1.03. Decoding one token at a time with a KV cache (chapter 9) is where
    the copy would hurt most.

    The stacked tensors themselves are remembered (in ``_STACKED``, keyed
    weakly by ``W_query.weight``), so that the fast path passes them to
    :func:`torch.nn.functional.linear` as they are, without a single view
    operator per call: see :func:`_stacked_parameters`.
    """
    layers = (W_query, W_key, W_value)
    stacked: dict[str, torch.Tensor] = {}
    for name in ("weight", "bias"):
        params = [getattr(layer, name) for layer in layers]
        if any(p is None for p in params):
            continue
        with torch.no_grad():
            packed = torch.cat([p.detach() for p in params], dim=0)  # (d_q + 2 * d_kv, ...)
        start = 0
        for p in params:
            p.data = packed[start : start + p.shape[0]]  # same Parameter, new storage
            start += p.shape[0]
        stacked[name] = packed
    _STACKED[W_query.weight] = (stacked["weight"], stacked.get("bias"))


#: ``W_query.weight`` -> the ``(weight, bias)`` that :func:`_pack_qkv` stacked
#: (``bias`` None without biases). Weak keys: an entry goes with its module;
#: the stacked tensors are the parameters' own storage, so they cost no memory.
_STACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _lies_in(stacked: torch.Tensor, params: Sequence[torch.Tensor]) -> bool:
    """Whether ``params`` are, in order, the contiguous row blocks of ``stacked``'s memory."""
    ptr, itemsize, trailing = stacked.data_ptr(), stacked.element_size(), stacked.shape[1:]
    for p in params:
        if (
            p.data_ptr() != ptr
            or p.dtype != stacked.dtype
            or p.shape[1:] != trailing
            or not p.is_contiguous()
        ):
            return False
        ptr += p.numel() * itemsize
    return ptr == stacked.data_ptr() + stacked.numel() * itemsize


def _stacked_parameters(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The ``(weight, bias)`` that :func:`_pack_qkv` stacked from these parameters, if still theirs.

    None when the parameters were not packed together (cross-attention's
    ``W_key`` and ``W_value``, layers of another module) or when one no
    longer lies in the stacked storage (``p.data = ...``,
    ``load_state_dict(assign=True)``); such a stale entry is dropped, so that
    it does not keep the old storage alive. The check reads data pointers,
    dtypes and shapes only: no tensor operation.
    """
    entry = _STACKED.get(weights[0])
    if entry is None:
        return None
    weight, bias = entry
    if (
        weights[0].device == weight.device
        and _lies_in(weight, weights)
        and (bias is None) == (biases is None)
        and (biases is None or (bias is not None and _lies_in(bias, biases)))
    ):
        return weight, bias
    del _STACKED[weights[0]]
    return None


class _ReadStacked(torch.autograd.Function):
    """The stacked weight and bias, read in place, as a function of the separate parameters.

    ``_ReadStacked.apply(weight, bias, *params)``: ``weight`` ``(d_q + 2 *
    d_kv, d_in)`` and ``bias`` ``(d_q + 2 * d_kv,)`` (or None) are
    :func:`_pack_qkv`'s stacked tensors, ``params`` the layers' weights, then
    their biases, which lie in them. The forward returns the stacked tensors
    as they are; the backward hands each parameter its rows of the gradient,
    as ``torch.cat``'s backward would. ``torch.cat`` itself would copy
    ``(d_q + 2 * d_kv) * (d_in + 1)`` numbers on every call, with two more
    kernels than a layer whose three weights are one tensor (the benchmark's
    bare kernels). A parameter changed in place between the forward and the
    backward makes the backward fail, as it does for :class:`torch.nn.Linear`.
    """

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, bias: torch.Tensor | None, *params: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        num_layers = len(params) if bias is None else len(params) // 2
        ctx.rows = [p.shape[0] for p in params[:num_layers]]
        ctx.save_for_backward(*params)  # for autograd's check of in-place changes
        return weight, bias  # returned inputs become views: nothing is copied

    @staticmethod
    def backward(
        ctx: Any, grad_weight: torch.Tensor, grad_bias: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        ctx.saved_tensors  # noqa: B018 (raises if a parameter was changed in place)
        grads = list(grad_weight.split(ctx.rows, dim=0))  # each layer's rows: views
        if grad_bias is not None:
            grads += grad_bias.split(ctx.rows, dim=0)
        return (None, None, *grads)


def _stacked_view(params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.cat(params)`` as a view, if they lie side by side in one storage; else None."""
    first = params[0]
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for p in params:
        if (
            p.dtype != first.dtype
            or not p.is_contiguous()
            or p.untyped_storage().data_ptr() != storage
            or p.storage_offset() != offset
        ):
            return None
        offset += p.numel()
    shape = (sum(p.shape[0] for p in params), *first.shape[1:])
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))  # contiguous
    return first.as_strided(shape, strides, first.storage_offset())


def _fused_qkv_projection(
    x: torch.Tensor,
    W_query: nn.Linear,
    W_key: nn.Linear,
    W_value: nn.Linear,
    context: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of ``x`` from ONE matrix multiplication.

    With a ``context`` (cross-attention) the queries come from ``x`` and the
    keys and values from ``context``: two products, ``W_query`` on ``x`` and
    the stacked ``(2 * d_kv, d_in)`` key/value weight on ``context``.

    The three weights are stacked into one ``(d_q + 2 * d_kv, d_in)`` matrix
    (and the biases into one vector) and applied with a single
    :func:`torch.nn.functional.linear`: one large GEMM instead of three
    smaller ones. The stack is read in place from the storage that
    :func:`_pack_qkv` gave the three parameters, with no copy (its docstring
    has the numbers): without gradients (``torch.no_grad``, inference mode,
    frozen weights) as it is, with gradients through :class:`_ReadStacked`,
    so that each of ``W_query``, ``W_key`` and ``W_value`` receives its own
    gradient. The operators are then those of a layer whose three weights are
    one tensor (the benchmark's bare kernels), forward and backward. Where
    the parameters no longer lie side by side (one was given new storage),
    ``torch.cat`` stacks them on each call. Either way the current values of
    the parameters are used.

    Returns:
        ``(queries, keys, values)``: ``(..., num_tokens, d_q)``,
        ``(..., num_tokens, d_kv)``, ``(..., num_tokens, d_kv)``; views into
        the one projected tensor.
    """
    if context is not None:  # cross-attention: queries from x, keys and values from context
        keys, values = _stacked_projection(context, (W_key, W_value))
        return W_query(x), keys, values
    queries, keys, values = _stacked_projection(x, (W_query, W_key, W_value))
    return queries, keys, values


def _stacked_projection(
    x: torch.Tensor, layers: tuple[nn.Linear, ...]
) -> tuple[torch.Tensor, ...]:
    """``tuple(layer(x) for layer in layers)`` from one GEMM (see :func:`_fused_qkv_projection`).

    While the parameters lie in the tensors :func:`_pack_qkv` stacked (the
    usual case), the ATen operators are those of ONE ``nn.Linear`` with
    ``sum(out_features)`` outputs followed by a ``split``, forward and
    backward: without gradients the stacked tensors go to ``F.linear`` as
    they are, with gradients through :class:`_ReadStacked`, whose backward
    only slices the gradient. Otherwise the weights are stacked on each call:
    as a view (:func:`_stacked_view`) without gradients where they lie side
    by side, else by ``torch.cat``, which autograd differentiates.
    """
    weights: list[torch.Tensor] = [layer.weight for layer in layers]
    biases: list[torch.Tensor] | None = None
    if layers[0].bias is not None:
        biases = [layer.bias for layer in layers]
    params = weights if biases is None else weights + biases
    needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in params)
    stacked = _stacked_parameters(weights, biases)
    if stacked is not None:
        weight, bias = _ReadStacked.apply(*stacked, *params) if needs_grad else stacked
    else:
        weight = None if needs_grad else _stacked_view(weights)
        if weight is None:
            weight = torch.cat(weights, dim=0)
        bias = None
        if biases is not None:
            bias = None if needs_grad else _stacked_view(biases)
            if bias is None:
                bias = torch.cat(biases, dim=0)  # (sum of out_features,)
    # weight: (sum of out_features, d_in), e.g. (d_q + 2 * d_kv, d_in)
    projected = F.linear(x, weight, bias)  # (..., num_tokens, sum of out_features)
    sizes = [layer.out_features for layer in layers]
    if sizes.count(sizes[0]) == len(sizes):  # q, k and v alike (multi-head attention)
        return projected.split(sizes[0], dim=-1)  # the bare kernels' split
    return projected.split(sizes, dim=-1)


def _num_cached(kv_cache: object, num_tokens: int, context_length: int) -> int:
    """Tokens already in ``kv_cache`` (0 without one); checks before any computation.

    Raises:
        TypeError: ``kv_cache`` is neither None nor a :class:`attnlib.KVCache`.
        ValueError: the cached and the new tokens together exceed ``context_length``.
    """
    if kv_cache is None:
        return 0
    if not isinstance(kv_cache, KVCache):
        raise TypeError(f"kv_cache must be an attnlib.KVCache or None, got {type_name(kv_cache)}")
    cached = kv_cache.num_tokens
    if cached + num_tokens > context_length:
        raise ValueError(
            f"the KV cache holds {cached} tokens and x adds num_tokens={num_tokens}: "
            f"{cached + num_tokens} tokens exceed context_length={context_length}"
        )
    return cached


#: torch >= 2.5 lets scaled_dot_product_attention share key/value heads itself.
_SDPA_HAS_ENABLE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


def _sdpa_shared_kv(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    sinks: AttentionSinks | None = None,
) -> torch.Tensor:
    """torch's fused attention with fewer key/value heads than query heads.

    With ``sinks`` (an :class:`attnlib.AttentionSinks`), each head's sink
    logit joins its softmax's denominator: see :func:`_sdpa_with_sinks`.

    ``queries``: ``(b, num_heads, N_q, head_dim)``; ``keys``, ``values``:
    ``(b, num_kv_groups, N_kv, head_dim)``, ``num_kv_groups`` dividing
    ``num_heads``; key/value head ``j`` serves query heads
    ``j * r ... j * r + r - 1`` (``r = num_heads // num_kv_groups``). Uses
    ``enable_gqa=True`` where torch has it (>= 2.5, no copies), else
    ``repeat_interleave``. Returns ``(b, num_heads, N_q, head_dim)``.
    """
    if sinks is not None:
        return _sdpa_with_sinks(queries, keys, values, attn_mask, is_causal, dropout_p, sinks)
    out = _sdpa_grouped(queries, keys, values, attn_mask, is_causal, dropout_p)
    if attn_mask is not None and attn_mask.ndim == 4:  # a key-padding mask: (b, 1, N_q, N_kv)
        # Rows with no key at all: zeros, as attnlib.scaled_dot_product_attention gives
        # (torch's CPU kernel does too; other backends may give NaN).
        out = out.masked_fill(~attn_mask.any(dim=-1, keepdim=True), 0.0)
    return out


def _sdpa_grouped(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
) -> torch.Tensor:
    if keys.shape[1] == queries.shape[1]:
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )
    if _SDPA_HAS_ENABLE_GQA:
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, enable_gqa=True,
        )
    group_size = queries.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
    values = values.repeat_interleave(group_size, dim=1)  # (b, num_heads, N_kv, head_dim)
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )


def _sdpa_with_sinks(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    sinks: AttentionSinks,
) -> torch.Tensor:
    """:func:`_sdpa_shared_kv` with a sink logit per head, still in torch's fused kernel.

    The sink is one extra key whose score is the head's ``sink`` logit and
    whose value is zero: a zero key (score ``q . 0 = 0``) plus an additive
    float mask equal to ``sink`` in its column. So the kernel computes
    ``exp(s) / (exp(sink) + sum exp(s))`` and the sink adds nothing to the
    output, which is :func:`attnlib.sinks.sink_attention`; gradients reach
    ``sinks`` through the float mask. A row whose keys are all masked gives
    zeros (only the sink is left).
    """
    b, num_heads, num_tokens, head_dim = queries.shape
    num_tokens_kv = keys.shape[-2]
    if is_causal:  # from position 0: the top-left causal rows
        attn_mask = torch.ones(
            num_tokens, num_tokens_kv, dtype=torch.bool, device=queries.device
        ).tril()
    if attn_mask is None:
        attn_mask = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool,
                               device=queries.device)
    # attn_mask: (N_q, N_kv) or (b, 1, N_q, N_kv), True = may attend
    bias = torch.zeros(attn_mask.shape, dtype=queries.dtype, device=queries.device)
    bias = bias.masked_fill(~attn_mask, float("-inf")).view(
        -1, 1, num_tokens, num_tokens_kv
    )  # (1 or b, 1, N_q, N_kv): 0 where a query may attend, -inf elsewhere
    sink = sinks.sinks.to(queries.dtype)[None, :, None, None]  # (1, num_heads, 1, 1)
    bias = torch.cat(
        [bias.expand(-1, num_heads, -1, -1), sink.expand(bias.shape[0], -1, num_tokens, 1)],
        dim=-1,
    )  # (1 or b, num_heads, N_q, N_kv + 1): the sink is the last column
    zero = keys.new_zeros(b, keys.shape[1], 1, head_dim)  # (b, num_kv_groups, 1, head_dim)
    keys = torch.cat([keys, zero], dim=2)  # (b, num_kv_groups, N_kv + 1, head_dim)
    values = torch.cat([values, zero.new_zeros(b, values.shape[1], 1, values.shape[-1])],
                       dim=2)  # (b, num_kv_groups, N_kv + 1, head_dim_v)
    return _sdpa_grouped(queries, keys, values, bias, False, dropout_p)


def _sink_attention_weights(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    sinks: AttentionSinks,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable path's attention with sinks: ``(context_vec, attn_weights)``.

    ``queries``, ``keys``, ``values``: ``(b, num_heads, N, head_dim)`` (keys
    and values already repeated per query head); ``attn_mask`` True where a
    query may attend. The weights are :func:`attnlib.sinks.softmax_with_sinks`
    of the scaled, masked scores (rows sum to less than 1), then dropout as
    in :func:`attnlib.scaled_dot_product_attention`.
    """
    attn_scores = queries @ keys.transpose(-2, -1) * queries.shape[-1] ** -0.5
    # attn_scores: (b, num_heads, N_q, N_kv)
    if attn_mask is not None:
        attn_scores = attn_scores.masked_fill(~attn_mask, float("-inf"))
    attn_weights = softmax_with_sinks(attn_scores, sinks.sinks)  # (b, num_heads, N_q, N_kv)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, dropout_p)
    return attn_weights @ values, attn_weights  # (b, num_heads, N_q, head_dim_v), weights


def _check_context(
    module: nn.Module,
    context: object,
    x: torch.Tensor,
    kv_cache: object,
) -> torch.Tensor:
    """The tensor keys and values come from: ``x``, or ``context`` (cross-attention), checked.

    Raises:
        TypeError: ``context`` is not a tensor of ``x``'s dtype.
        ValueError: a causal module, or one with RoPE, is given a context; a
            context with a KV cache; ``context`` is not ``(batch, num_tokens_kv,
            d_in)`` with ``x``'s batch and at least one token, or on another device.
    """
    if context is None:
        return x
    if getattr(module, "causal", True):
        raise ValueError(
            "context was given to a causal module: in cross-attention every query may see "
            "every key of the context, so a causal mask there is a mistake; build the "
            "module with causal=False"
        )
    if getattr(module, "rope", None) is not None:
        raise ValueError(
            "context was given to a module with rope=True: the positions of queries and of "
            "the context's keys belong to different sequences; build it with rope=False"
        )
    if kv_cache is not None:
        raise ValueError(
            "context and kv_cache together are not supported: the context's keys and values "
            "are recomputed on each call (the queries need no cache)"
        )
    if not isinstance(context, torch.Tensor):
        raise TypeError(f"context must be a torch.Tensor or None, got {type_name(context)}")
    if context.dtype != x.dtype:
        raise TypeError(f"context has dtype {context.dtype}, x has {x.dtype}")
    d_in = x.shape[-1]  # checked against the module's d_in already
    if context.ndim != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != d_in:
        raise ValueError(
            f"context must be (batch, num_tokens_kv, d_in) = ({x.shape[0]}, num_tokens_kv, "
            f"{d_in}), got shape {tuple(context.shape)}"
        )
    if context.shape[1] == 0:
        raise ValueError("context has no tokens (num_tokens_kv = 0)")
    if context.device != x.device:
        raise ValueError(f"context is on {context.device}, x on {x.device}")
    return context


def _uses_general_forward(
    module: nn.Module, kv_cache: object, key_padding_mask: object, context: object
) -> bool:
    """Whether :class:`attnlib.MultiHeadAttention` hands a call to
    :meth:`attnlib.GroupedQueryAttention.forward`: a cache, padding, a context,
    or an option chapter 6's ``forward`` does not show (``causal=False``,
    QK-norm, sinks; the caller also checks for a missing mask buffer)."""
    return (
        kv_cache is not None
        or key_padding_mask is not None
        or context is not None
        or not getattr(module, "causal", True)
        or getattr(module, "qk_norm", None) is not None
        or getattr(module, "sinks", None) is not None
    )
