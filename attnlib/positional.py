"""Positional encodings: telling attention where each token sits.

Self-attention on its own treats its input as a set: permute the tokens and the
outputs are permuted the same way (it is *permutation-equivariant*). Adding a
vector that depends on the position to each token's embedding breaks that
symmetry. Three choices live here:

* fixed sinusoidal encodings (Vaswani et al., 2017, section 3.5):
  :func:`sinusoidal_encoding` and the module :class:`SinusoidalPositionalEncoding`;
* learned absolute position embeddings, one trainable vector per position, as in
  GPT-2 (Radford et al., 2019): :class:`LearnedPositionalEmbedding`.
* rotary position embeddings (RoPE; Su et al., 2021), which rotate queries and
  keys inside attention instead of adding anything to the embeddings:
  :class:`RotaryPositionalEmbedding`.

Shape legend used in every docstring here:

* ``batch``: sequences in a batch (optional where stated).
* ``num_tokens``: tokens in each sequence; at most ``context_length``.
* ``num_positions``: rows of an encoding table (positions ``0 .. num_positions - 1``).
* ``d_model``: size of each token embedding, and so of each position vector.
* ``head_dim``: size of one head's query and key vectors (what RoPE rotates).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ._validation import check_int, check_positive_int, type_name

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_encoding",
    "sinusoidal_offset_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryPositionalEmbedding",
    "yarn_mscale",
    "check_base",
    "check_float_dtype",
    "check_tokens",
]


def check_base(base: object) -> None:
    """The ``base`` of a sinusoidal or rotary encoding: a finite positive real number.

    Raises:
        TypeError: ``base`` is not a real number (bools are refused).
        ValueError: ``base`` is not finite, or not positive.
    """
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a float, got {type_name(base)}")
    if not (math.isfinite(base) and float(base) > 0):
        raise ValueError(f"base must be a finite positive number, got {base}")


def check_float_dtype(dtype: object) -> None:
    """The ``dtype`` of an encoding table: a floating-point ``torch.dtype``.

    Raises:
        TypeError: ``dtype`` is not a ``torch.dtype``, or not a floating-point one.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")


def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The angular frequency of each sin/cos pair: ``omega_i = 1 / base^(2i / d_model)``.

    :func:`sinusoidal_encoding` turns pair ``i`` by ``omega_i`` radians per
    position; :class:`RotaryPositionalEmbedding` rotates pair ``i`` of a query or
    key by the same angles (its ``theta_i``, with ``head_dim`` for ``d_model``).

    Args:
        d_model: size of the vectors whose pairs turn (``head_dim`` for RoPE).
        base: the constant that sets the longest wavelength. Default 10000.

    Returns:
        A float64 tensor ``(ceil(d_model / 2),)``: ``1, base^(-2 / d_model), ...``,
        on the CPU.

    Raises:
        TypeError: ``d_model`` is not an int, or ``base`` is not a real number.
        ValueError: ``d_model`` is not positive, or ``base`` is not finite and
            positive.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.5;
    Su et al. (2021), "RoFormer", eq. (15).
    """
    check_positive_int("d_model", d_model)
    check_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ...
    return base ** (-two_i / d_model)  # omega_i = 1 / base^(2i / d_model)


def check_tokens(x: object, d_model: int, context_length: int) -> None:
    """The input of a positional module's ``forward``, checked before any computation.

    Args:
        x: token embeddings, ``(batch, num_tokens, d_model)`` or
            ``(num_tokens, d_model)``, of a floating-point dtype.
        d_model: the module's embedding size.
        context_length: the most tokens ``x`` may have.

    Raises:
        TypeError: ``x`` is not a tensor, or not of a floating-point dtype.
        ValueError: ``x`` is not 2- or 3-dimensional, its last dimension is
            not ``d_model``, or it has more than ``context_length`` tokens.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
    if not x.is_floating_point():
        raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
    if x.ndim not in (2, 3):
        raise ValueError(
            "x must be (num_tokens, d_model) or (batch, num_tokens, d_model), "
            f"got shape {tuple(x.shape)}"
        )
    if x.shape[-1] != d_model:
        raise ValueError(
            f"x has last dimension {x.shape[-1]} but the module was built for "
            f"d_model={d_model} (x has shape {tuple(x.shape)})"
        )
    num_tokens = x.shape[-2]
    if num_tokens > context_length:
        raise ValueError(
            f"x has num_tokens={num_tokens}, more than context_length={context_length}"
        )


def sinusoidal_encoding(
    num_positions: int,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The fixed sine/cosine position table of the original Transformer.

    Row ``pos`` is the encoding of position ``pos``; columns come in pairs that
    share one frequency ``omega_i = 1 / base^(2i / d_model)``
    (:func:`sinusoidal_frequencies`)::

        PE[pos, 2i]     = sin(pos * omega_i)
        PE[pos, 2i + 1] = cos(pos * omega_i)

    The first pair turns fastest (``omega_0 = 1`` radian per position); the
    wavelengths grow geometrically from ``2*pi`` to almost ``2*pi * base``.
    Every entry lies in ``[-1, 1]``, and row 0 is ``[0, 1, 0, 1, ...]``.

    An odd ``d_model`` is accepted: the formula still defines every column, and
    the last column is a sine with no cosine partner. The relative-position
    property (see :func:`sinusoidal_offset_matrix`) holds for the complete
    sin/cos pairs only, so use an even ``d_model`` where that matters.

    The angles are computed in float64 and then converted to ``dtype``, so
    large positions keep their accuracy.

    Args:
        num_positions: number of positions (rows), ``0 .. num_positions - 1``.
        d_model: size of each position vector (columns).
        base: the constant that sets the longest wavelength. Default 10000,
            as in the paper.
        dtype: floating-point dtype of the result. Default ``torch.float32``.
        device: where to put the result. Default: the current default device.

    Returns:
        A new ``(num_positions, d_model)`` tensor.

    Raises:
        TypeError: a size is not an int, ``base`` is not a real number, or
            ``dtype`` is not a floating-point dtype.
        ValueError: ``num_positions`` or ``d_model`` is not positive, or
            ``base`` is not finite and positive.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.5
    (the ``PE`` equations).
    """
    check_positive_int("num_positions", num_positions)
    check_positive_int("d_model", d_model)
    check_base(base)
    check_float_dtype(dtype)
    positions = torch.arange(num_positions, dtype=torch.float64)
    omegas = sinusoidal_frequencies(d_model, base)  # (ceil(d_model / 2),)
    angles = positions[:, None] * omegas[None, :]  # (num_positions, ceil(d_model / 2))
    encoding = torch.empty(num_positions, d_model, dtype=torch.float64)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return encoding.to(dtype=dtype, device=device)


def sinusoidal_offset_matrix(
    offset: int,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The fixed linear map that moves a sinusoidal encoding ``offset`` positions on.

    For every position ``pos``, with ``PE = sinusoidal_encoding(..., d_model, base)``::

        PE[pos + offset] == M @ PE[pos]   # M = sinusoidal_offset_matrix(offset, d_model, base)

    and for a whole table ``PE[offset:] == PE[:-offset] @ M.T``. ``M`` is
    block-diagonal: pair ``i`` (columns ``2i, 2i + 1``) is turned by the angle
    ``offset * omega_i`` with the 2 x 2 rotation ``[[cos, sin], [-sin, cos]]``,
    by the angle-sum identities. ``M`` depends on the offset only, never on
    ``pos``: this is the paper's reason for choosing sinusoids, that "PE_{pos+k}
    can be represented as a linear function of PE_{pos}".

    Args:
        offset: how many positions to move (negative moves back).
        d_model: size of each position vector; must be even, so that every
            sine has its cosine partner.
        base: as in :func:`sinusoidal_encoding`. Default 10000.
        dtype: floating-point dtype of the result. Default ``torch.float32``.
        device: where to put the result. Default: the current default device.

    Returns:
        A new ``(d_model, d_model)`` orthogonal, block-diagonal tensor.

    Raises:
        TypeError: ``offset`` or ``d_model`` is not an int, ``base`` is not a
            real number, or ``dtype`` is not a floating-point dtype.
        ValueError: ``d_model`` is not positive or is odd, or ``base`` is not
            finite and positive.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.5.
    """
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {type_name(offset)}")
    check_positive_int("d_model", d_model)
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model={d_model} is odd: the last sine has no cosine partner, so no "
            "linear map moves it; use an even d_model"
        )
    check_base(base)
    check_float_dtype(dtype)
    angles = offset * sinusoidal_frequencies(d_model, base)  # (d_model / 2,)
    cos, sin = torch.cos(angles), torch.sin(angles)
    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)
    idx = torch.arange(0, d_model, 2)
    # [sin(a + b), cos(a + b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
    matrix[idx, idx] = cos
    matrix[idx, idx + 1] = sin
    matrix[idx + 1, idx] = -sin
    matrix[idx + 1, idx + 1] = cos
    return matrix.to(dtype=dtype, device=device)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of each position to token embeddings.

    ``forward(x)`` returns ``x + PE[:num_tokens]``, where ``PE`` is
    :func:`sinusoidal_encoding` ``(context_length, d_model)``. The table is a
    buffer, not a parameter: it moves with ``.to(device)`` but is never
    trained, and it is not saved in the ``state_dict`` (it is rebuilt from the
    constructor's arguments).

    Args:
        d_model: size of each token embedding.
        context_length: the most tokens a sequence may have.
        base: as in :func:`sinusoidal_encoding`. Default 10000.
        dtype: dtype of the stored table. Default ``torch.float32``. The table
            is converted to the input's dtype in ``forward``.
        device: where to store the table. Default: the current default device.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_model)`` or ``(num_tokens, d_model)``,
          with ``num_tokens <= context_length``.
        - Output: the shape and dtype of ``x``.

    Attributes:
        encoding: the buffer ``(context_length, d_model)``.

    Raises:
        TypeError: (constructor) a size is not an int, ``base`` is not a real
            number, ``dtype`` is not floating point; (forward) ``x`` is not a
            floating-point tensor.
        ValueError: (constructor) a size is not positive or ``base`` is not
            finite and positive; (forward) ``x`` is not 2- or 3-dimensional, its
            last dimension is not ``d_model``, it has more than
            ``context_length`` tokens, or it is on another device than the table.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.5
    (added to the embeddings at the bottom of the encoder and decoder stacks).
    """

    encoding: torch.Tensor

    def __init__(
        self,
        d_model: int,
        context_length: int,
        base: float = 10000.0,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("context_length", context_length)
        table = sinusoidal_encoding(context_length, d_model, base, dtype=dtype, device=device)
        self.d_model = d_model
        self.context_length = context_length
        self.base = float(base)
        self.register_buffer("encoding", table, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, self.d_model, self.context_length)
        if x.device != self.encoding.device:
            raise ValueError(
                f"x is on {x.device} but the encoding is on {self.encoding.device}; "
                "move the module with .to(device)"
            )
        num_tokens = x.shape[-2]
        return x + self.encoding[:num_tokens].to(x.dtype)  # (batch, num_tokens, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, context_length={self.context_length}, base={self.base}"


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trainable vector for each position, 0, 1, 2, ..., to token embeddings.

    A lookup table ``nn.Embedding(context_length, d_model)``: ``forward(x)``
    returns ``x + weight[:num_tokens]``, the embeddings of positions
    ``0 .. num_tokens - 1``. The table has ``context_length * d_model``
    parameters, initialised as ``nn.Embedding`` does (standard normal), and is
    learned with the rest of the model. Unlike the sinusoidal table, it has
    nothing to say about positions at or beyond ``context_length``.

    Args:
        context_length: the most tokens a sequence may have (rows of the table).
        d_model: size of each token embedding.
        dtype: dtype of the table. Default: PyTorch's default dtype.
        device: where to create the table. Default: the current default device.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_model)`` or ``(num_tokens, d_model)``,
          with ``num_tokens <= context_length``, in the table's dtype.
        - Output: the shape of ``x``.

    Attributes:
        embedding: the ``nn.Embedding``; its ``weight`` is
            ``(context_length, d_model)``.

    Raises:
        TypeError: (constructor) a size is not an int; (forward) ``x`` is not a
            floating-point tensor, or its dtype differs from the table's.
        ValueError: (constructor) a size is not positive; (forward) ``x`` is
            not 2- or 3-dimensional, its last dimension is not ``d_model``, it
            has more than ``context_length`` tokens, or it is on another device
            than the table.

    Source: Radford et al. (2019), "Language Models are Unsupervised Multitask
    Learners" (GPT-2: a learned position embedding ``wpe`` added to the token
    embedding); learned positional embeddings were compared with sinusoids in
    Vaswani et al. (2017), section 3.5.
    """

    def __init__(
        self,
        context_length: int,
        d_model: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        check_positive_int("context_length", context_length)
        check_positive_int("d_model", d_model)
        if dtype is not None:
            check_float_dtype(dtype)
        self.context_length = context_length
        self.d_model = d_model
        self.embedding = nn.Embedding(context_length, d_model, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tokens(x, self.d_model, self.context_length)
        weight = self.embedding.weight
        if x.dtype != weight.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the embedding table has {weight.dtype}")
        if x.device != weight.device:
            raise ValueError(
                f"x is on {x.device} but the embedding table is on {weight.device}; "
                "move the module with .to(device)"
            )
        positions = torch.arange(x.shape[-2], device=x.device)  # (num_tokens,)
        return x + self.embedding(positions)  # (batch, num_tokens, d_model)

    def extra_repr(self) -> str:
        return f"context_length={self.context_length}, d_model={self.d_model}"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension, whose halves are x1 and x2.

    Rotating each pair ``(x1[i], x2[i])`` by 90 degrees: the "rotate_half" of
    the half-split RoPE layout.
    """
    x1, x2 = x.chunk(2, dim=-1)  # each (..., head_dim // 2)
    return torch.cat([-x2, x1], dim=-1)  # (..., head_dim)


class RotaryPositionalEmbedding(nn.Module):
    r"""Rotary position embedding (RoPE): rotate queries and keys by their position.

    Each query or key vector of ``head_dim`` components is cut into
    ``head_dim / 2`` pairs, and pair ``i`` of the vector at position ``m`` is
    rotated by the angle ``m * theta_i``, with ``theta_i = base^(-2i / head_dim)``
    (the frequencies of :func:`sinusoidal_encoding`). A rotation keeps a
    vector's norm, and two rotations compose by adding angles, so

    ``rope(q, m) . rope(k, n) = q . R((n - m) theta) k``

    depends on the positions only through the offset ``m - n``: attention
    scores become relative, although each vector is rotated by its absolute
    position. Unlike the sinusoidal encoding, nothing is added to the token
    embeddings; RoPE is applied to queries and keys inside attention (not to
    values).

    **Layout.** attnlib uses the *half-split* layout of GPT-NeoX and most
    libraries ("rotate_half"): pair ``i`` is components ``(i, i + head_dim/2)``::

        out = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]

    with ``cos`` and ``sin`` of the angles ``m * theta_i`` repeated for both
    halves. The paper (and Meta's original LLaMA code) pairs *adjacent*
    components ``(2i, 2i + 1)``. The two are the same map up to a fixed
    permutation of the components (even ones first, then odd ones), so a
    model's weights must be used with the layout they were trained with.

    Args:
        head_dim: size of each query and key vector; must be even.
        context_length: the most positions (``0 .. context_length - 1``).
        base: the constant of the frequencies. Default 10000, as in the paper
            (Llama 3 uses 500 000: lower frequencies, longer wavelengths).
        scaling: keyword-only; how to stretch the rotation for contexts longer
            than the trained one, a dict with ``rope_type`` and that type's
            options, under the names of transformers' ``rope_parameters`` (so
            a model's config can be passed on as it is; its ``rope_theta``, if
            present, must equal ``base``). Default None (``"default"``). With
            ``theta_i = base^(-2i / head_dim)`` and ``L`` the original context
            (``original_max_position_embeddings``):

            * ``"linear"`` (``factor``): position interpolation, ``theta_i /
              factor`` for every pair, so that ``factor * L`` positions span
              the angles ``L`` did (Chen et al. 2023);
            * ``"ntk"`` (``factor``): NTK-aware scaling, the base raised to
              ``base * factor^(head_dim / (head_dim - 2))``: the fastest pair
              is unchanged and the slowest is divided by ``factor`` (bloc97,
              2023; transformers' ``"dynamic"`` applies it with a factor that
              grows with each call's length, at the call's length
              ``seq_len``: ``factor_eff = factor * seq_len / L - (factor - 1)``);
            * ``"yarn"`` (``factor``, ``original_max_position_embeddings``;
              optional ``beta_fast=32``, ``beta_slow=1``, ``attention_factor``,
              ``mscale``, ``mscale_all_dim``, ``truncate=True``): pairs that
              turn more than ``beta_fast`` times over ``L`` are kept, pairs
              that turn fewer than ``beta_slow`` times are interpolated,
              linearly blended between; and cos, sin are multiplied by
              ``attention_factor`` (default ``0.1 ln(factor) + 1``), which
              sharpens the softmax (Peng et al. 2023, sections 3.2-3.4);
            * ``"llama3"`` (``factor``, ``original_max_position_embeddings``,
              ``low_freq_factor``, ``high_freq_factor``): Llama 3.1's rule:
              wavelengths ``2 pi / theta_i`` shorter than ``L /
              high_freq_factor`` kept, longer than ``L / low_freq_factor``
              divided by ``factor``, a smooth blend between (Meta's
              ``apply_scaling``; Llama 3.1 uses 8, 8192, 1, 4).

            ``inv_freq`` and ``attention_scaling`` equal transformers'
            ``ROPE_INIT_FUNCTIONS[rope_type]`` for the same parameters
            (``tests/test_positional.py``), which compute in float32 where
            attnlib computes in float64.

    Shape:
        - Input ``x``: ``(..., num_tokens, head_dim)``, e.g.
          ``(batch, num_heads, num_tokens, head_dim)``; floating point.
        - Output: the shape and dtype of ``x``; token ``t`` is rotated to
          position ``offset + t``.

    Attributes:
        cos, sin: buffers ``(context_length, head_dim)`` of ``cos(m theta_i)``
            and ``sin(m theta_i)`` (each frequency twice, once per half),
            computed and kept in float64 (``.to(dtype)`` converts them); cast
            to the input's dtype in ``forward``. Not saved in the ``state_dict``.
            Both are multiplied by ``attention_scaling``.
        inv_freq: ``(head_dim // 2,)`` float64 tensor, the angle per position
            of each pair after scaling (a plain attribute, not a buffer).
        attention_scaling: float, 1 except for YaRN.
        scaling: the checked options, a dict with ``rope_type``.

    Raises:
        TypeError: (constructor) a size is not an int, ``base`` is not a real
            number or ``scaling`` is not a dict; (forward) ``x`` is not a
            floating-point tensor, or ``offset`` is not an int.
        ValueError: (constructor) ``head_dim`` is odd or not positive,
            ``context_length`` is not positive, ``base`` is not finite and
            positive, or ``scaling`` names an unknown ``rope_type``, lacks a
            required option, has an unknown one or a non-positive value;
            (forward) ``x`` has fewer than 2 dimensions or
            ``x.shape[-1] != head_dim``, ``offset`` is negative,
            ``offset + num_tokens > context_length``, or ``x`` is on another
            device than the buffers.

    Source: Su et al. (2021), "RoFormer: Enhanced Transformer with Rotary
    Position Embedding", section 3.4, eq. (34) (adjacent-pair layout); the
    half-split layout of GPT-NeoX (Black et al. 2022). Scaling: Chen et al.
    (2023), "Extending Context Window of Large Language Models via Positional
    Interpolation", section 2.3; bloc97 (2023), "NTK-Aware Scaled RoPE"
    (Reddit r/LocalLLaMA); Peng et al. (2023), "YaRN: Efficient Context Window
    Extension of Large Language Models", section 3; Meta's Llama 3.1
    ``apply_scaling`` (llama-models); transformers' ``modeling_rope_utils``.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        context_length: int,
        base: float = 10000.0,
        *,
        scaling: Mapping[str, object] | None = None,
    ) -> None:
        check_positive_int("head_dim", head_dim)
        check_positive_int("context_length", context_length)
        check_base(base)
        if head_dim % 2 != 0:
            raise ValueError(
                f"head_dim={head_dim} must be even: RoPE rotates pairs of components"
            )
        super().__init__()
        self.head_dim = int(head_dim)
        self.context_length = int(context_length)
        self.base = float(base)
        self.scaling = _check_scaling(scaling, self.base)
        theta, self.attention_scaling = _scaled_frequencies(self.head_dim, self.base, self.scaling)
        self.inv_freq = theta  # (head_dim // 2,), float64: the angle per position of each pair
        positions = torch.arange(self.context_length, dtype=torch.float64)  # (context_length,)
        angles = torch.outer(positions, theta)  # (context_length, head_dim // 2)
        angles = torch.cat([angles, angles], dim=-1)  # (context_length, head_dim): both halves
        # YaRN's attention factor scales cos and sin (so q.k by its square), as in transformers.
        self.register_buffer("cos", angles.cos() * self.attention_scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * self.attention_scaling, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate each vector of ``x`` by the angle of its position.

        Args:
            x: ``(..., num_tokens, head_dim)`` queries or keys.
            offset: position of the first token (``x[..., t, :]`` is at
                position ``offset + t``). Default 0; with a KV cache, the
                number of tokens already cached.

        Returns:
            A new tensor of the shape and dtype of ``x``.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type_name(x)}")
        if not x.is_floating_point():
            raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
        if x.ndim < 2:
            raise ValueError(
                f"x must be (..., num_tokens, head_dim), got {x.ndim}-D shape {tuple(x.shape)}"
            )
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x.shape[-1]={x.shape[-1]} does not match head_dim={self.head_dim} "
                f"(x has shape {tuple(x.shape)})"
            )
        offset = check_int("offset", offset, minimum=0)
        num_tokens = x.shape[-2]
        if offset + num_tokens > self.context_length:
            raise ValueError(
                f"positions offset={offset} to {offset + num_tokens - 1} "
                f"(num_tokens={num_tokens}) reach past context_length={self.context_length}"
            )
        if x.device != self.cos.device:
            raise ValueError(
                f"x is on {x.device} but the rotation tables are on {self.cos.device}; "
                "move the module with .to(device)"
            )
        cos = self.cos[offset : offset + num_tokens].to(x.dtype)  # (num_tokens, head_dim)
        sin = self.sin[offset : offset + num_tokens].to(x.dtype)  # (num_tokens, head_dim)
        return x * cos + _rotate_half(x) * sin  # (..., num_tokens, head_dim)

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling["rope_type"] != "default" else ""
        return (
            f"head_dim={self.head_dim}, context_length={self.context_length}, "
            f"base={self.base}{scaling}"
        )


#: The keys each ``rope_type`` accepts (transformers' names), required ones first.
_SCALING_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "ntk": (("factor",), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    ),
    "llama3": (
        ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
        (),
    ),
}


def _check_scaling(scaling: object, base: float) -> dict[str, object]:
    """The scaling options as a dict with ``rope_type``; checks names and values."""
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be a dict or None, got {type_name(scaling)}")
    options = dict(scaling)
    rope_type = options.pop("rope_type", options.pop("type", "default"))
    if rope_type not in _SCALING_KEYS:
        raise ValueError(
            f"scaling's rope_type={rope_type!r} is not one of {sorted(_SCALING_KEYS)} "
            "(transformers' 'dynamic' NTK changes the frequencies with each call's length: "
            "use 'ntk', its static form, with the factor you need)"
        )
    theta = options.pop("rope_theta", base)
    if float(theta) != base:
        raise ValueError(f"scaling has rope_theta={theta} but base={base}")
    if options.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            "partial_rotary_factor != 1 is not supported: RoPE rotates all of head_dim"
        )
    required, optional = _SCALING_KEYS[str(rope_type)]
    missing = [k for k in required if options.get(k) is None]
    unknown = sorted(set(options) - set(required) - set(optional))
    if missing or unknown:
        raise ValueError(
            f"scaling for rope_type={rope_type!r} needs {list(required)} and accepts "
            f"{list(optional)}; missing {missing}, unknown {unknown}"
        )
    for key, value in options.items():
        if key == "truncate" or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and float(value) > 0
        ):
            raise ValueError(f"scaling's {key} must be a finite positive number, got {value!r}")
    if rope_type == "llama3" and not (
        float(options["high_freq_factor"]) > float(options["low_freq_factor"])
    ):
        raise ValueError("scaling's high_freq_factor must exceed low_freq_factor")
    return {"rope_type": rope_type, **options}


def _scaled_frequencies(
    head_dim: int, base: float, scaling: Mapping[str, Any]
) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_scaling)``: the ``(head_dim // 2,)`` float64 angle per
    position of each pair, and the factor on cos and sin, for a checked ``scaling``."""
    rope_type = scaling["rope_type"]
    theta = sinusoidal_frequencies(head_dim, base)  # base^(-2i / head_dim)
    if rope_type == "default":
        return theta, 1.0
    factor = float(scaling["factor"])
    if rope_type == "linear":  # position interpolation: position m acts as m / factor
        return theta / factor, 1.0
    if rope_type == "ntk":  # NTK-aware: a larger base, so the lowest frequency is divided by factor
        return sinusoidal_frequencies(head_dim, base * factor ** (head_dim / (head_dim - 2))), 1.0
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / theta  # positions per turn of each pair
    if rope_type == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        # Short wavelengths (< original / high) unchanged, long ones (> original / low)
        # interpolated (divided by factor), a smooth blend between the two.
        smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - smooth) * theta / factor + smooth * theta, 1.0
    # yarn: pairs turning more than beta_fast times over the original context are
    # unchanged, fewer than beta_slow times interpolated, a linear ramp between.
    beta_fast = float(scaling.get("beta_fast") or 32.0)
    beta_slow = float(scaling.get("beta_slow") or 1.0)

    def pair_index(turns: float) -> float:  # the (fractional) pair turning `turns` times
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers, against a division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv_freq = theta / factor * ramp + theta * (1 - ramp)
    attention = scaling.get("attention_factor")
    if attention is None:
        m_, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if m_ and m_all:
            attention = yarn_mscale(factor, float(m_)) / yarn_mscale(factor, float(m_all))
        else:
            attention = yarn_mscale(factor)
    return inv_freq, float(attention)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature factor, ``0.1 * mscale * ln(factor) + 1``.

    1 for ``factor <= 1`` (no stretch). YaRN multiplies the attention logits
    by its square (in transformers and here, by scaling RoPE's cos and sin by
    it, or, for DeepSeek's MLA with ``mscale_all_dim``, the softmax scale by its
    square): the longer the context is stretched, the sharper the softmax.

    Args:
        factor: the context's stretch factor (``rope_scaling["factor"]``).
        mscale: the multiplier of the logarithm. Default 1.

    Returns:
        The factor, a float.

    Raises:
        TypeError: an argument is not a real number (a bool is refused).
        ValueError: an argument is not finite and positive.

    Source: Peng et al. (2023), "YaRN: Efficient Context Window Extension of
    Large Language Models", section 3.4, eq. (22) (``sqrt(1/t) = 0.1 ln(s) +
    1``); DeepSeek-V2/V3's ``yarn_get_mscale``.
    """
    for name, value in (("factor", factor), ("mscale", mscale)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type_name(value)}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be finite and positive, got {name}={value!r}")
    return 1.0 if factor <= 1 else 0.1 * float(mscale) * math.log(factor) + 1.0
