"""Weights from Hugging Face ``transformers``: attention layers in and out of attnlib.

Each function is named for the model family whose layout it converts; none
imports ``transformers`` (it reads the module's attributes, so attnlib does
not depend on it; the tests build tiny random models with it):

* :func:`gqa_from_llama_attention` / :func:`gqa_to_llama_attention`: the
  attention of Llama, Mistral, Qwen2 and Qwen3 (``LlamaAttention``,
  ``MistralAttention``, ``Qwen2Attention``, ``Qwen3Attention``) and an
  :class:`attnlib.GroupedQueryAttention` with RoPE (Qwen3's ``q_norm``/``k_norm``:
  an :class:`attnlib.QKNormSinkAttention` with ``qk_norm=True``);
* :func:`gqa_from_gpt_oss_attention` / :func:`gqa_to_gpt_oss_attention`:
  gpt-oss's ``GptOssAttention``, whose per-head ``sinks`` become an
  :class:`attnlib.QKNormSinkAttention` with ``sinks=True``;
* :func:`mha_from_gpt2_attention` / :func:`mha_to_gpt2_attention`: GPT-2's
  ``GPT2Attention`` and an :class:`attnlib.MultiHeadAttention`.

**The layouts converted.**

*Llama family.* ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` are
``nn.Linear`` layers, weights ``(out_features, in_features)`` as attnlib's:
``q_proj (num_heads * head_dim, hidden)``, ``k_proj``/``v_proj``
``(num_key_value_heads * head_dim, hidden)``, ``o_proj (hidden, num_heads *
head_dim)``; they are copied as they are into ``W_query``, ``W_key``,
``W_value`` and ``out_proj``. Heads are consecutive blocks of ``head_dim``
rows, and query head ``h`` uses key/value head ``h // (num_heads //
num_key_value_heads)`` (``repeat_kv``), which is attnlib's grouping. The
rotary embedding is not part of HF's attention module (the model computes
``cos`` and ``sin`` once and passes them in); it is rebuilt from the module's
``config``: ``rope_theta`` and the ``rope_type`` scaling (see
:class:`attnlib.RotaryPositionalEmbedding`). HF's checkpoints use the
*half-split* RoPE layout (pair ``(i, i + head_dim/2)``, ``rotate_half``),
which is attnlib's, so no permutation is needed. Meta's *original* LLaMA
checkpoints (``consolidated.*.pth``) pair *adjacent* components ``(2i, 2i +
1)``: HF's conversion script permutes the rows of ``wq`` and ``wk`` within each
head (even components first, then odd ones) before they reach
``q_proj``/``k_proj``; a model loaded through ``transformers`` is already
permuted, and loading Meta's files directly needs that permutation first
(chapter 9 shows it).

*QK-norm (Qwen3).* ``q_norm`` and ``k_norm`` are RMSNorms over ``head_dim``
(weight ``(head_dim,)``, ``weight * x / rms(x)``), applied per head before
RoPE: copied into ``qk_norm.q_norm`` and ``qk_norm.k_norm`` with their
epsilon. Gemma 3's norms (``(1 + weight) * x / rms(x)``) and OLMo 2's (over
all heads at once) are other functions, and are refused.

*gpt-oss.* The Llama layout with biases everywhere, plus ``sinks``
``(num_heads,)``, one logit per query head, copied into ``sinks.sinks``.
Its layers alternate a 128-token sliding window with full attention: a
sliding-window layer becomes a ``QKNormSinkAttention`` with ``window`` (when
the window is shorter than ``context_length``), as does a Mistral layer with a
``sliding_window``. HF's window ``kv > q - window`` and ``kv <= q`` is
:func:`attnlib.functional.sliding_window_mask`'s.

*GPT-2.* ``c_attn`` and ``c_proj`` are ``Conv1D`` layers, whose weight is
``(in_features, out_features)``: the transpose of ``nn.Linear``'s.
``c_attn.weight`` is ``(d, 3 d)``, columns ``[W_q | W_k | W_v]``, and
``c_attn.bias`` ``(3 d,)`` likewise; ``c_proj.weight`` is ``(d, d)``. So
``W_query.weight = c_attn.weight[:, :d].T`` and ``out_proj.weight =
c_proj.weight.T``.

Source: the parameter layouts of ``transformers``' ``modeling_llama.py``,
``modeling_mistral.py``, ``modeling_qwen2.py``, ``modeling_qwen3.py``,
``modeling_gpt_oss.py`` and ``modeling_gpt2.py``, and
``convert_llama_weights_to_hf.py`` (its ``permute``); Touvron et al. (2023),
"LLaMA"; Radford et al. (2019), GPT-2.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn as nn

from ._heads import check_plain_multi_head
from ._validation import check_positive_int, type_name
from .gqa import GroupedQueryAttention
from .multihead import MultiHeadAttention
from .positional import RotaryPositionalEmbedding
from .sinks import AttentionSinks, QKNorm, QKNormSinkAttention

__all__ = [
    "gqa_from_llama_attention",
    "gqa_to_llama_attention",
    "gqa_from_gpt_oss_attention",
    "gqa_to_gpt_oss_attention",
    "mha_from_gpt2_attention",
    "mha_to_gpt2_attention",
]

_LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _config(hf_attn: object) -> Any:
    config = getattr(hf_attn, "config", None)
    if config is None:
        raise TypeError(f"expected a transformers attention module with a config, got "
                        f"{type_name(hf_attn)}")
    return config


def _check_llama_like(hf_attn: object, sinks: bool = False) -> bool:
    """Check the Llama layout (with ``sinks``: gpt-oss's); returns whether it has QK-norm.

    Raises:
        TypeError: not the layout (or, ``sinks=True``, no ``sinks`` parameter).
        NotImplementedError: ``sinks=False`` and the module has sinks; q_norm
            and k_norm that are not per-head RMSNorms ``weight * x / rms(x)``;
            a score scale other than ``1/sqrt(head_dim)``.
    """
    family = ("gpt-oss attention module (GptOssAttention)" if sinks else
              "Llama-family attention module (LlamaAttention, MistralAttention, "
              "Qwen2Attention, Qwen3Attention)")
    if not isinstance(hf_attn, nn.Module) or not all(
        isinstance(getattr(hf_attn, n, None), nn.Linear) for n in _LLAMA_PROJECTIONS
    ):
        raise TypeError(f"hf_attn must be a {family} with nn.Linear q_proj, k_proj, v_proj, "
                        f"o_proj; got {type_name(hf_attn)}")
    has_sinks = isinstance(getattr(hf_attn, "sinks", None), torch.Tensor)
    if sinks and not has_sinks:
        raise TypeError(f"hf_attn must be a {family} with a sinks parameter; "
                        f"got {type_name(hf_attn)} without one")
    if has_sinks and not sinks:
        raise NotImplementedError(
            f"{type_name(hf_attn)} has attention sinks (gpt-oss): use "
            "attnlib.interop.gqa_from_gpt_oss_attention"
        )
    head_dim = _head_dim_of(hf_attn)
    scaling = getattr(hf_attn, "scaling", None)
    if scaling is not None and abs(float(scaling) * head_dim**0.5 - 1.0) > 1e-6:
        raise NotImplementedError(
            f"{type_name(hf_attn)} scales scores by {scaling}, not 1/sqrt(head_dim="
            f"{head_dim}); attnlib always scales by 1/sqrt(head_dim)"
        )
    norms = [getattr(hf_attn, n, None) for n in ("q_norm", "k_norm")]
    if all(n is None for n in norms):
        return False
    for name, norm in zip(("q_norm", "k_norm"), norms, strict=True):
        if not _is_head_rms_norm(norm, head_dim):
            raise NotImplementedError(
                f"{type_name(hf_attn)}.{name} is not an RMSNorm over each head "
                f"(weight ({head_dim},), weight * x / rms(x), as Qwen3's): Gemma 3's "
                "(1 + weight) and OLMo 2's norm over all heads are not attnlib's QK-norm"
            )
    return True


def _head_dim_of(hf_attn: Any) -> int:
    return int(getattr(hf_attn, "head_dim", 0) or _config(hf_attn).head_dim)


def _norm_eps(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(getattr(norm, "eps", 1e-6) if eps is None else eps)


def _is_head_rms_norm(norm: object, head_dim: int) -> bool:
    """Whether ``norm`` computes ``weight * x / sqrt(mean(x**2) + eps)`` over ``head_dim``."""
    weight = getattr(norm, "weight", None)
    if not isinstance(norm, nn.Module) or not isinstance(weight, torch.Tensor) or (
        tuple(weight.shape) != (head_dim,)
    ):
        return False
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(3, head_dim, generator=generator).to(weight)  # (3, head_dim)
    with torch.no_grad():
        expected = weight * probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True)
                                                + _norm_eps(norm))
        got = norm(probe)
    return bool(torch.allclose(got, expected, rtol=1e-4, atol=1e-5))


def _rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE's parameters from a config: ``rope_parameters`` (transformers >= 5), else
    ``rope_theta`` and ``rope_scaling`` (4.x)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return dict(params)
    params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = float(getattr(config, "rope_theta", 10000.0))
    return params


def gqa_from_llama_attention(hf_attn: Any, context_length: int) -> GroupedQueryAttention:
    """Build an :class:`attnlib.GroupedQueryAttention` equal to a Llama-family attention.

    Works for ``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention`` and
    ``Qwen3Attention`` (and any module with their ``q_proj``/``k_proj``/``v_proj``/``o_proj``
    layout and a ``config``; Qwen3's ``q_norm``/``k_norm`` give an
    :class:`attnlib.QKNormSinkAttention` with ``qk_norm=True`` and their weights
    and epsilon); the weights are copied (no memory shared), see the module
    docstring for the layout. The result has ``rope=True`` with the
    config's ``rope_theta`` and ``rope_type`` (``"default"``, ``"linear"``,
    ``"dynamic"`` is refused, ``"yarn"``, ``"llama3"``: the scaling options of
    :class:`attnlib.RotaryPositionalEmbedding`), ``head_dim`` from the module
    (Qwen3-like shapes, where ``num_heads * head_dim != hidden_size``, are
    kept), the module's dtype, device, dropout and training mode. Called on
    the same hidden states, with ``cos``/``sin`` from the model's rotary
    embedding at positions ``0 .. num_tokens - 1``, the two agree to rounding,
    with and without a KV cache (``tests/test_interop.py``).

    Args:
        hf_attn: the transformers attention module (e.g.
            ``model.model.layers[0].self_attn``).
        context_length: the most positions the new module accepts.

    Returns:
        ``GroupedQueryAttention(hidden_size, hidden_size, context_length,
        attention_dropout, num_attention_heads, num_key_value_heads,
        qkv_bias, out_bias=..., rope=True, head_dim=head_dim)``; with QK-norm
        (Qwen3) or a sliding window shorter than ``context_length`` (Mistral's
        ``sliding_window``, Qwen2's sliding layers) a ``QKNormSinkAttention``
        with the same arguments and ``qk_norm=True`` or ``window=W``.

    Raises:
        TypeError: ``hf_attn`` lacks the Llama layout or a config.
        NotImplementedError: the layer has a QK-norm other than Qwen3's
            (Gemma 3, OLMo 2), attention sinks (use
            :func:`gqa_from_gpt_oss_attention`), a score scale other than
            ``1/sqrt(head_dim)``, or a ``rope_type`` attnlib does not implement.
        ValueError: ``context_length`` is not positive.

    Source: ``transformers``' ``LlamaAttention`` and ``Qwen3Attention`` (see
    the module docstring).
    """
    return _from_llama_layout(hf_attn, context_length, sinks=False)


def gqa_from_gpt_oss_attention(hf_attn: Any, context_length: int) -> QKNormSinkAttention:
    """Build an :class:`attnlib.QKNormSinkAttention` equal to gpt-oss's attention.

    ``GptOssAttention`` is the Llama layout (with biases) plus one learned sink
    logit per query head: the result is built as by
    :func:`gqa_from_llama_attention`, as a ``QKNormSinkAttention`` with
    ``sinks=True`` and ``sinks.sinks`` copied from ``hf_attn.sinks``; RoPE from
    the config (gpt-oss uses YaRN, ``truncate=False``). Called on the same
    hidden states the two agree to rounding, with and without a KV cache
    (``tests/test_interop.py``).

    Args:
        hf_attn: a ``GptOssAttention`` (``model.model.layers[i].self_attn``).
        context_length: the most positions the new module accepts.

    Returns:
        ``QKNormSinkAttention(..., rope=True, head_dim=head_dim, sinks=True)``,
        with ``window=W`` for a sliding-window layer whose window (128 in
        gpt-oss) is shorter than ``context_length``.

    Raises:
        TypeError: ``hf_attn`` lacks the layout, the ``sinks`` or a config.
        NotImplementedError: a ``rope_type`` attnlib does not implement.
        ValueError: ``context_length`` is not positive.

    Source: ``transformers``' ``GptOssAttention``; OpenAI (2025), "gpt-oss-120b
    & gpt-oss-20b Model Card", section 2.1.
    """
    return cast(QKNormSinkAttention, _from_llama_layout(hf_attn, context_length, sinks=True))


def _from_llama_layout(hf_attn: Any, context_length: int, *, sinks: bool) -> GroupedQueryAttention:
    qk_norm = _check_llama_like(hf_attn, sinks)
    check_positive_int("context_length", context_length)
    config = _config(hf_attn)
    window = _window(hf_attn, context_length)
    q_proj, k_proj, v_proj, o_proj = (getattr(hf_attn, n) for n in _LLAMA_PROJECTIONS)
    head_dim = _head_dim_of(hf_attn)
    num_heads = q_proj.out_features // head_dim
    num_kv = k_proj.out_features // head_dim
    hidden = q_proj.in_features
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", "default")
    qkv_bias = q_proj.bias is not None
    args = (hidden, o_proj.out_features, context_length,
            float(getattr(config, "attention_dropout", 0.0)), num_heads, num_kv, qkv_bias)
    options: dict[str, Any] = dict(out_bias=o_proj.bias is not None, rope=True,
                                   rope_base=float(params["rope_theta"]), head_dim=head_dim)
    new: GroupedQueryAttention
    if qk_norm or sinks or window:  # chapter 13's parts, created after the layers
        new = QKNormSinkAttention(
            *args, **options, qk_norm=qk_norm, sinks=sinks, window=window,
            qk_norm_eps=_norm_eps(hf_attn.q_norm) if qk_norm else 1e-6,
        )
    else:
        new = GroupedQueryAttention(*args, **options)
    qk_norm_module, sinks_module = _qk_norm_and_sinks(new)
    if rope_type != "default":
        new.rope = RotaryPositionalEmbedding(
            head_dim, context_length, float(params["rope_theta"]), scaling=params
        )
    ref = q_proj.weight
    new.to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        for mine, theirs in zip(
            (new.W_query, new.W_key, new.W_value, new.out_proj), (q_proj, k_proj, v_proj, o_proj),
            strict=True,
        ):
            mine.weight.copy_(theirs.weight)  # both (out_features, in_features)
            if theirs.bias is not None:
                mine.bias.copy_(theirs.bias)
        if qk_norm_module is not None:
            qk_norm_module.q_norm.weight.copy_(hf_attn.q_norm.weight)  # (head_dim,)
            qk_norm_module.k_norm.weight.copy_(hf_attn.k_norm.weight)  # (head_dim,)
        if sinks_module is not None:
            sinks_module.sinks.copy_(hf_attn.sinks)  # (num_heads,)
    new.train(hf_attn.training)
    return new


def _window(hf_attn: Any, context_length: int) -> int | None:
    """The layer's sliding window if shorter than ``context_length`` (else None: a
    window no shorter changes no output)."""
    if hasattr(hf_attn, "sliding_window"):  # the layer's own (None: a full-attention layer)
        window = hf_attn.sliding_window
    else:  # Mistral: the config's
        window = getattr(_config(hf_attn), "sliding_window", None)
    return None if window is None or window >= context_length else int(window)


def _qk_norm_and_sinks(
    module: GroupedQueryAttention,
) -> tuple[QKNorm | None, AttentionSinks | None]:
    """``module``'s QK-norm and sinks parts (a :class:`QKNormSinkAttention`'s), or None."""
    if isinstance(module, QKNormSinkAttention):
        return module.qk_norm, module.sinks
    return None, None


def gqa_to_llama_attention(module: GroupedQueryAttention, hf_attn: Any) -> Any:
    """Copy an :class:`attnlib.GroupedQueryAttention`'s weights into a Llama-family attention.

    The reverse of :func:`gqa_from_llama_attention`, into an existing
    ``LlamaAttention``/``MistralAttention``/``Qwen2Attention``/``Qwen3Attention``
    (build it from a config with the same sizes; its biases decide which
    biases must exist, and its ``q_norm``/``k_norm`` whether ``module`` must
    be an :class:`attnlib.QKNormSinkAttention` with ``qk_norm``).
    RoPE is the model's, not the layer's: give the model a config with the
    same ``rope_theta`` and scaling.

    Args:
        module: the attnlib layer, built with ``rope=True``.
        hf_attn: the transformers attention module to fill, in place.

    Returns:
        ``hf_attn``.

    Raises:
        TypeError: ``module`` is not a GroupedQueryAttention, or ``hf_attn``
            lacks the Llama layout.
        ValueError: a weight's shape differs, one module has a bias (or
            QK-norm) where the other has none, or their sliding windows
            (within ``module.context_length``) differ.
        NotImplementedError: ``hf_attn`` has a QK-norm other than Qwen3's,
            or sinks.
    """
    return _to_llama_layout(module, hf_attn, sinks=False)


def gqa_to_gpt_oss_attention(module: GroupedQueryAttention, hf_attn: Any) -> Any:
    """Copy an :class:`attnlib.QKNormSinkAttention` built with ``sinks=True`` into gpt-oss's
    attention: the reverse of :func:`gqa_from_gpt_oss_attention`, in place.

    Returns:
        ``hf_attn``.

    Raises:
        TypeError: ``module`` is not a GroupedQueryAttention, or ``hf_attn``
            is not a ``GptOssAttention``.
        ValueError: a weight's shape differs, a bias is missing on one side,
            ``module`` has no sinks, or the sliding windows differ.
    """
    return _to_llama_layout(module, hf_attn, sinks=True)


def _to_llama_layout(module: GroupedQueryAttention, hf_attn: Any, *, sinks: bool) -> Any:
    if not isinstance(module, GroupedQueryAttention):
        raise TypeError(f"module must be an attnlib.GroupedQueryAttention, got "
                        f"{type_name(module)}")
    qk_norm = _check_llama_like(hf_attn, sinks)
    qk_norm_module, sinks_module = _qk_norm_and_sinks(module)
    for name, theirs, mine in (("QK-norm (q_norm, k_norm)", qk_norm, qk_norm_module),
                               ("sinks", sinks, sinks_module)):
        if theirs != (mine is not None):
            raise ValueError(f"{type_name(hf_attn)} has {'' if theirs else 'no '}{name} "
                             f"but the attnlib module has {'none' if mine is None else 'it'}")
    window = module.window if isinstance(module, QKNormSinkAttention) else None
    if window is not None and window >= module.context_length:
        window = None  # a window that reaches every key masks nothing
    if _window(hf_attn, module.context_length) != window:
        raise ValueError(f"{type_name(hf_attn)} has the sliding window "
                         f"{_window(hf_attn, module.context_length)} within context_length="
                         f"{module.context_length}, the attnlib module {window}")
    _copy_linears(
        (module.W_query, module.W_key, module.W_value, module.out_proj),
        tuple(getattr(hf_attn, n) for n in _LLAMA_PROJECTIONS),
        _LLAMA_PROJECTIONS,
    )
    with torch.no_grad():
        if qk_norm_module is not None:
            hf_attn.q_norm.weight.copy_(qk_norm_module.q_norm.weight)
            hf_attn.k_norm.weight.copy_(qk_norm_module.k_norm.weight)
        if sinks_module is not None:
            hf_attn.sinks.copy_(sinks_module.sinks)
    return hf_attn


def _copy_linears(
    source: tuple[nn.Linear, ...], target: tuple[nn.Linear, ...], names: tuple[str, ...]
) -> None:
    for src, dst, name in zip(source, target, names, strict=True):
        if src.weight.shape != dst.weight.shape:
            raise ValueError(f"{name}.weight is {tuple(dst.weight.shape)} but attnlib's is "
                             f"{tuple(src.weight.shape)}")
        if (src.bias is None) != (dst.bias is None):
            raise ValueError(f"{name} has {'no ' if dst.bias is None else 'a '}bias but "
                             f"attnlib's has {'none' if src.bias is None else 'one'}")
    with torch.no_grad():
        for src, dst in zip(source, target, strict=True):
            dst.weight.copy_(src.weight)
            if src.bias is not None and dst.bias is not None:
                dst.bias.copy_(src.bias)


def _check_gpt2(hf_attn: object) -> Any:
    c_attn, c_proj = getattr(hf_attn, "c_attn", None), getattr(hf_attn, "c_proj", None)
    if not isinstance(hf_attn, nn.Module) or c_attn is None or c_proj is None:
        raise TypeError(f"hf_attn must be a GPT2Attention (c_attn, c_proj), got "
                        f"{type_name(hf_attn)}")
    if getattr(hf_attn, "is_cross_attention", False):
        raise NotImplementedError("GPT2Attention built with is_cross_attention=True is not "
                                  "converted (its queries come from q_attn)")
    config = _config(hf_attn)
    if not getattr(config, "scale_attn_weights", True):
        raise NotImplementedError("scale_attn_weights=False: attnlib always scales by "
                                  "1/sqrt(head_dim)")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise NotImplementedError("scale_attn_by_inverse_layer_idx=True: attnlib has no "
                                  "per-layer score scale")
    return config


def mha_from_gpt2_attention(hf_attn: Any, context_length: int) -> MultiHeadAttention:
    """Build an :class:`attnlib.MultiHeadAttention` equal to GPT-2's attention.

    ``c_attn`` (a ``Conv1D``, weight ``(d, 3 d)``) is split into three
    ``(d, d)`` column blocks ``W_q | W_k | W_v``, each transposed into the
    ``nn.Linear`` layout ``(out, in)``; ``c_proj.weight`` is transposed into
    ``out_proj``. Biases are copied (``qkv_bias=True``, ``out_bias=True``).
    Dtype, device, ``attn_pdrop`` and training mode are copied (GPT-2's
    ``resid_pdrop``, applied after ``c_proj``, is the block's business and is
    not). Called on the same hidden states the two agree to rounding
    (``tests/test_interop.py``).

    Args:
        hf_attn: a ``GPT2Attention`` (e.g. ``model.transformer.h[0].attn``).
        context_length: the most positions the new module accepts
            (GPT-2's ``n_positions`` is 1024).

    Returns:
        ``MultiHeadAttention(d, d, context_length, attn_pdrop, n_head,
        qkv_bias=True)``.

    Raises:
        TypeError: ``hf_attn`` is not GPT-2's attention.
        NotImplementedError: cross-attention, ``scale_attn_weights=False`` or
            ``scale_attn_by_inverse_layer_idx=True``.
        ValueError: ``context_length`` is not positive.

    Source: ``transformers``' ``GPT2Attention`` and ``Conv1D``; Radford et al. (2019).
    """
    config = _check_gpt2(hf_attn)
    check_positive_int("context_length", context_length)
    c_attn, c_proj = hf_attn.c_attn, hf_attn.c_proj
    d = int(c_proj.weight.shape[0])
    new = MultiHeadAttention(
        d, d, context_length, float(getattr(config, "attn_pdrop", 0.0)), int(hf_attn.num_heads),
        qkv_bias=True,
    )
    ref = c_attn.weight
    new.to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        w_q, w_k, w_v = c_attn.weight.split(d, dim=1)  # (d, 3d) -> three (d, d): (in, out)
        b_q, b_k, b_v = c_attn.bias.split(d, dim=0)  # (3d,) -> three (d,)
        for layer, w, b in ((new.W_query, w_q, b_q), (new.W_key, w_k, b_k),
                            (new.W_value, w_v, b_v)):
            layer.weight.copy_(w.T)  # Conv1D (in, out) -> nn.Linear (out, in)
            layer.bias.copy_(b)
        new.out_proj.weight.copy_(c_proj.weight.T)
        new.out_proj.bias.copy_(c_proj.bias)
    new.train(hf_attn.training)
    return new


def mha_to_gpt2_attention(module: MultiHeadAttention, hf_attn: Any) -> Any:
    """Copy an :class:`attnlib.MultiHeadAttention`'s weights into GPT-2's attention.

    The reverse of :func:`mha_from_gpt2_attention`: the three weights are
    transposed and placed side by side in ``c_attn.weight`` ``(d, 3 d)``,
    ``out_proj.weight`` transposed into ``c_proj.weight``. GPT-2 has every
    bias, so a bias the attnlib module lacks is written as zeros.

    Args:
        module: an attnlib MultiHeadAttention with ``d_in == d_out`` and the
            same number of heads as ``hf_attn``.
        hf_attn: a ``GPT2Attention``, filled in place.

    Returns:
        ``hf_attn``.

    Raises:
        TypeError: wrong module types.
        ValueError: the sizes or the numbers of heads differ, or ``module``
            shares key/value heads or has RoPE (a
            :class:`attnlib.GroupedQueryAttention`, a subclass).
    """
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"module must be an attnlib.MultiHeadAttention, got {type_name(module)}")
    check_plain_multi_head(module, "module", "GPT-2's attention")
    _check_gpt2(hf_attn)
    d = int(hf_attn.c_proj.weight.shape[0])
    if (module.d_in, module.d_out, module.num_heads * module.head_dim) != (d, d, d) or (
        module.num_heads != hf_attn.num_heads
    ):
        raise ValueError(
            f"GPT2Attention has d={d} and {hf_attn.num_heads} heads; the attnlib module has "
            f"d_in={module.d_in}, d_out={module.d_out}, {module.num_heads} heads of "
            f"{module.head_dim}"
        )
    with torch.no_grad():
        layers = (module.W_query, module.W_key, module.W_value)
        weights: list[torch.Tensor] = [layer.weight.T for layer in layers]
        hf_attn.c_attn.weight.copy_(torch.cat(weights, dim=1))  # (d, 3d)
        biases: list[torch.Tensor] = [
            layer.bias if layer.bias is not None else torch.zeros_like(hf_attn.c_proj.bias)
            for layer in (module.W_query, module.W_key, module.W_value)
        ]
        hf_attn.c_attn.bias.copy_(torch.cat(biases, dim=0))  # (3d,)
        hf_attn.c_proj.weight.copy_(module.out_proj.weight.T)
        if module.out_proj.bias is not None:
            hf_attn.c_proj.bias.copy_(module.out_proj.bias)
        else:
            hf_attn.c_proj.bias.zero_()
    return hf_attn
