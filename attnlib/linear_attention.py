"""Linear attention and the gated delta rule: attention with a state of fixed size.

Softmax attention keeps every key and value (the KV cache grows with the
context). Drop the softmax and ``sum_j (q . k_j) v_j = q (sum_j k_j v_j^T)``:
the keys and values can be folded, token by token, into one matrix
``S = sum_j k_j v_j^T`` of ``head_dim x head_dim_v`` numbers, whatever the
number of tokens. That is *linear attention* (Katharopoulos et al. 2020), a
recurrent network in disguise. Its memory only ever adds; the *delta rule*
(DeltaNet; Schlag et al. 2021, Yang et al. 2024) first removes what ``S``
already stores under key ``k`` and writes the new value with a strength
``beta`` in (0, 1); the *gated* delta rule (Yang et al. 2024, used by
Qwen3-Next and Kimi Linear) also decays the whole state by ``alpha_t = exp(g_t)``:

.. code-block:: text

    S_t = alpha_t S_{t-1} + k_t (beta_t (v_t - alpha_t S_{t-1}^T k_t))^T
    o_t = scale * S_t^T q_t

Each function here computes the same outputs in three *forms*: recurrent
(one token at a time, what decoding does), parallel (a masked ``N x N``
matrix, what training can do) and chunked (parallel inside chunks of
``chunk_size`` tokens, recurrent between them: what fast kernels do).

Shape legend: ``(batch, num_heads, num_tokens, head_dim)`` for queries and
keys, ``(..., head_dim_v)`` for values; a state is
``(batch, num_heads, head_dim, head_dim_v)``; ``beta`` and ``g`` are
``(batch, num_heads, num_tokens)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import _delta_rule
from ._delta_rule import check_form, check_qkv, delta_rule_step, gated_delta_rule
from ._validation import (
    check_bool,
    check_float_tensor,
    check_input,
    check_positive_int,
    type_name,
)
from .functional import bottom_right_causal_mask
from .kv_cache import Cache

__all__ = [
    "FORMS",
    "linear_attention",
    "delta_rule_step",
    "gated_delta_rule",
    "RecurrentState",
    "GatedDeltaNet",
]

#: The values of ``form`` that :func:`linear_attention` and :func:`gated_delta_rule` take.
FORMS = _delta_rule.FORMS


def linear_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    form: str = "parallel",
    eps: float = 1e-6,
) -> torch.Tensor:
    r"""Causal linear attention with the feature map ``phi(x) = elu(x) + 1``.

    ``o_t = phi(q_t)^T S_t / (phi(q_t) . z_t)`` with ``S_t = sum_{j<=t}
    phi(k_j) v_j^T`` and ``z_t = sum_{j<=t} phi(k_j)``: softmax's
    ``exp(q . k)`` replaced by the kernel ``phi(q) . phi(k)``, which factorises.

    Args:
        queries, keys: ``(batch, num_heads, num_tokens, head_dim)``; with
            ``form="parallel"`` the queries may be the last ``num_tokens_q <
            num_tokens`` positions only (decoding with cached keys and values).
        values: ``(batch, num_heads, num_tokens, head_dim_v)``.
        form: keyword-only; ``"parallel"`` (default: the masked
            ``(num_tokens, num_tokens)`` matrix ``phi(Q) phi(K)^T``, normalised
            by its row sums) or ``"recurrent"`` (the state ``S_t``, ``z_t``
            updated token by token: memory constant in ``num_tokens``).
        eps: keyword-only; added to the normaliser. Default 1e-6.

    Returns:
        ``(batch, num_heads, num_tokens_q, head_dim_v)``.

    Raises:
        TypeError: a tensor is not floating point, the dtypes differ, or
            ``form`` is not a str.
        ValueError: a tensor is not 4-D, the shapes disagree, or ``form`` is
            not ``"parallel"`` or ``"recurrent"``.

    Source: Katharopoulos et al. (2020), "Transformers are RNNs: Fast
    Autoregressive Transformers with Linear Attention", eq. (4)-(7) and
    section 3.4 (causal masking; the RNN form, eq. (16)-(20)).
    """
    check_form(form, ("parallel", "recurrent"))
    check_qkv(queries, keys, values, fewer_queries=form == "parallel")
    phi_q = F.elu(queries) + 1.0  # (b, h, n, head_dim), positive
    phi_k = F.elu(keys) + 1.0  # (b, h, n, head_dim)
    if form == "parallel":
        allowed = bottom_right_causal_mask(queries.shape[2], keys.shape[2],
                                           device=queries.device)  # (n_q, n)
        attn_scores = (phi_q @ phi_k.transpose(-2, -1)).masked_fill(~allowed, 0.0)
        # attn_scores: (b, h, n_q, n), zero where a query may not look
        attn_weights = attn_scores / (attn_scores.sum(-1, keepdim=True) + eps)
        return attn_weights @ values  # (b, h, n, head_dim_v)
    b, h, n, d = queries.shape
    state = queries.new_zeros(b, h, d, values.shape[-1])  # S: (b, h, head_dim, head_dim_v)
    normaliser = queries.new_zeros(b, h, d)  # z: (b, h, head_dim)
    outputs = []
    for t in range(n):
        state = state + phi_k[:, :, t, :, None] * values[:, :, t, None, :]
        normaliser = normaliser + phi_k[:, :, t]
        numerator = (phi_q[:, :, t, :, None] * state).sum(-2)  # (b, h, head_dim_v)
        denominator = (phi_q[:, :, t] * normaliser).sum(-1, keepdim=True) + eps  # (b, h, 1)
        outputs.append(numerator / denominator)
    return torch.stack(outputs, dim=2)  # (b, h, n, head_dim_v)


def _check_range(name: str, pair: object) -> tuple[float, float]:
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)):
        raise TypeError(f"{name} must be a pair (low, high) of real numbers, got {pair!r}")
    return float(pair[0]), float(pair[1])


class RecurrentState(Cache):
    """What a :class:`GatedDeltaNet` keeps between decoding steps: constant in size.

    A :class:`attnlib.kv_cache.Cache` whose :meth:`update` does not append:
    it keeps the last ``conv_size - 1`` inputs of the short convolution and
    *replaces* the delta rule's state with the one after the new tokens.

    Args:
        conv_size: the layer's convolution kernel size (the layer's
            :meth:`GatedDeltaNet.new_cache` passes its own). Default 4.

    Attributes:
        conv_state: ``(batch, conv_channels, conv_size - 1)``: the last inputs
            of the short convolution, or None while empty.
        state: ``(batch, num_heads, head_dim, head_dim_v)``: the delta rule's
            memory, or None while empty.

    Raises:
        TypeError, ValueError: ``conv_size`` is not a positive int.

    Source: Yang et al. (2024), "Gated Delta Networks", section 3.
    """

    def __init__(self, conv_size: int = 4) -> None:
        self.conv_size = check_positive_int("conv_size", conv_size)
        self.conv_state: torch.Tensor | None = None
        self.state: torch.Tensor | None = None
        self._num_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Tokens seen so far."""
        return self._num_tokens

    def update(  # the Cache interface: (first, second) are (conv_inputs, state) here
        self, conv_inputs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the new tokens' convolution inputs and the state after them.

        Args:
            conv_inputs: ``(batch, conv_channels, num_new)``, the new tokens'
                inputs of the short convolution.
            state: ``(batch, num_heads, head_dim, head_dim_v)``, the delta
                rule's state after the new tokens.

        Returns:
            ``(conv_state, state)``: the last ``conv_size - 1`` convolution
            inputs (zeros before the first token) and ``state``.

        Raises:
            TypeError: a tensor is not floating point.
            ValueError: a tensor is not 3-D/4-D or does not fit what is held.
        """
        check_float_tensor("conv_inputs", conv_inputs, min_ndim=3)
        check_float_tensor("state", state, min_ndim=4)
        held = self.conv_state
        if held is None:
            held = conv_inputs.new_zeros(*conv_inputs.shape[:2], self.conv_size - 1)
        if conv_inputs.ndim != 3 or held.shape[:2] != conv_inputs.shape[:2]:
            raise ValueError(
                f"conv_inputs must be (batch, conv_channels, num_new) = {tuple(held.shape[:2])}"
                f" + (num_new,), got {tuple(conv_inputs.shape)}: use one state per layer"
            )
        if self.state is not None and self.state.shape != state.shape:
            raise ValueError(f"state must have shape {tuple(self.state.shape)}, "
                             f"got {tuple(state.shape)}")
        window = torch.cat([held, conv_inputs], dim=-1)  # (b, channels, conv_size - 1 + n)
        self.conv_state = window[:, :, window.shape[-1] - (self.conv_size - 1):].clone()
        self.state = state
        self._num_tokens += conv_inputs.shape[-1]
        return self.conv_state, self.state

    def reset(self) -> None:
        """Empty the state (to start a new sequence)."""
        self.conv_state = self.state = None
        self._num_tokens = 0

    def memory_bytes(self) -> int:
        """Bytes held; the same after 10 tokens as after 10 000."""
        return sum(t.nbytes for t in (self.conv_state, self.state) if t is not None)

    def __repr__(self) -> str:
        if self.state is None:
            return "RecurrentState(empty)"
        return f"RecurrentState(num_tokens={self.num_tokens}, state={tuple(self.state.shape)})"


class GatedDeltaNet(nn.Module):
    r"""A Gated DeltaNet layer as in Qwen3-Next: a drop-in replacement for attention.

    .. code-block:: text

        q, k, v = SiLU(causal_conv(x W_query, x W_key, x W_value))   # short conv, per channel
        q, k    = L2-normalise per head; each key head serves
                  num_heads // num_key_heads value heads
        beta    = sigmoid(x W_beta)                                  # writing strength
        g       = -exp(A_log) * softplus(x W_alpha + dt_bias)        # log decay, < 0
        o       = gated_delta_rule(q, k, v, beta, g)                 # per head
        out     = (RMSNorm(o) * SiLU(x W_gate)) W_out                # output gate

    Args:
        d_in: size of the residual stream (input and output).
        num_heads: value heads: each has its own state, ``beta`` and decay.
        head_dim: size of a query/key head.
        num_key_heads: keyword-only; query/key heads, a divisor of
            ``num_heads``: key head ``j`` serves value heads ``j * r`` to
            ``j * r + r - 1``, ``r = num_heads // num_key_heads`` (Qwen3-Next:
            16 key heads, 32 value heads). Default ``num_heads``.
        head_dim_v: keyword-only; size of a value head. Default ``head_dim``.
        conv_size: keyword-only; kernel size of the short causal convolution.
            Default 4.
        chunk_size: keyword-only; chunk size of the parallel pass. Default 64.
        eps: keyword-only; epsilon of the output RMSNorm. Default 1e-6.

    Attributes:
        W_query, W_key: ``nn.Linear(d_in, num_key_heads * head_dim, bias=False)``.
        W_value, W_gate: ``nn.Linear(d_in, num_heads * head_dim_v, bias=False)``.
        W_beta, W_alpha: ``nn.Linear(d_in, num_heads, bias=False)``.
        conv: depthwise ``nn.Conv1d`` over the ``2 * num_key_heads * head_dim +
            num_heads * head_dim_v`` channels ``[q, k, v]``, no bias.
        A_log, dt_bias: ``(num_heads,)`` parameters of the decay, drawn as the
            authors train by :meth:`reset_decay`.
        norm: ``nn.RMSNorm(head_dim_v)``; out_proj: ``nn.Linear(num_heads *
            head_dim_v, d_in, bias=False)``.

    Shape:
        - Input ``x``: ``(batch, num_tokens, d_in)``; output the same shape.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size is not positive, or ``num_key_heads`` does not
            divide ``num_heads``.

    Source: Yang et al. (2024), "Gated Delta Networks: Improving Mamba2 with
    Delta Rule", section 3.4 (the block: short convolution, L2-normalised
    queries and keys, output gate); Qwen team (2025), Qwen3-Next (the layer
    as released, in Hugging Face's ``Qwen3NextGatedDeltaNet``).
    """

    def __init__(
        self,
        d_in: int,
        num_heads: int,
        head_dim: int,
        *,
        num_key_heads: int | None = None,
        head_dim_v: int | None = None,
        conv_size: int = 4,
        chunk_size: int = 64,
        eps: float = 1e-6,
    ) -> None:
        check_positive_int("d_in", d_in)
        check_positive_int("num_heads", num_heads)
        check_positive_int("head_dim", head_dim)
        if num_key_heads is not None:
            check_positive_int("num_key_heads", num_key_heads)
            if num_heads % num_key_heads != 0:
                raise ValueError(
                    f"num_key_heads={num_key_heads} must divide num_heads={num_heads} (each "
                    "key head serves the same number of value heads)"
                )
        if head_dim_v is not None:
            check_positive_int("head_dim_v", head_dim_v)
        check_positive_int("conv_size", conv_size)
        check_positive_int("chunk_size", chunk_size)
        super().__init__()
        self.d_in, self.num_heads, self.head_dim = int(d_in), int(num_heads), int(head_dim)
        self.num_key_heads = self.num_heads if num_key_heads is None else int(num_key_heads)
        self.head_dim_v = self.head_dim if head_dim_v is None else int(head_dim_v)
        self.conv_size, self.chunk_size = int(conv_size), int(chunk_size)
        key_dim = self.num_key_heads * self.head_dim
        value_dim = self.num_heads * self.head_dim_v
        self.W_query = nn.Linear(d_in, key_dim, bias=False)
        self.W_key = nn.Linear(d_in, key_dim, bias=False)
        self.W_value = nn.Linear(d_in, value_dim, bias=False)
        self.W_gate = nn.Linear(d_in, value_dim, bias=False)
        self.W_beta = nn.Linear(d_in, self.num_heads, bias=False)
        self.W_alpha = nn.Linear(d_in, self.num_heads, bias=False)
        channels = 2 * key_dim + value_dim
        self.conv = nn.Conv1d(channels, channels, self.conv_size, groups=channels, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.reset_decay()
        self.norm = nn.RMSNorm(self.head_dim_v, eps=eps)
        self.out_proj = nn.Linear(value_dim, d_in, bias=False)

    def reset_decay(
        self,
        a_range: tuple[float, float] = (0.0, 16.0),
        dt_range: tuple[float, float] = (1e-3, 0.1),
    ) -> None:
        """Draw the decay's parameters ``A_log`` and ``dt_bias`` as the authors train.

        Per head, ``A ~ U(a_range)`` and a time step ``dt`` log-uniform in
        ``dt_range``; ``A_log = log A`` and ``dt_bias = softplus^-1(dt)``, so
        that for an input with ``x W_alpha = 0`` the log decay is
        ``g = -A * dt``: a state that keeps ``exp(-A dt)`` of itself per token,
        about 0.92 for the median head (``A = 8``, ``dt = 0.01``), between
        ``exp(-1.6)`` and 1 across heads. (Hugging Face's Qwen3-Next layer
        sets ``dt_bias = 1`` at construction, a placeholder for released
        weights: ``softplus(1) = 1.31``, which forgets most of the state at
        every token.) ``A`` is floored at 1e-4 so its logarithm is finite.
        Draws from torch's global generator; called by ``__init__``.

        Args:
            a_range: ``(low, high)`` of ``A``, ``0 <= low < high``. Default
                ``(0, 16)``.
            dt_range: ``(low, high)`` of ``dt``, ``0 < low <= high``. Default
                ``(1e-3, 0.1)``.

        Raises:
            TypeError: a range is not a pair of real numbers.
            ValueError: a range is empty or out of bounds.

        Source: Gu and Dao (2023), "Mamba", section 3.6 (the time step drawn
        log-uniform, the bias set to its inverse softplus); Yang et al. (2024),
        "Gated Delta Networks", whose released training code
        (flash-linear-attention's ``GatedDeltaNet`` layer) draws
        ``A ~ U(0, 16)`` and ``dt`` in ``[1e-3, 0.1]``.
        """
        a_low, a_high = _check_range("a_range", a_range)
        dt_low, dt_high = _check_range("dt_range", dt_range)
        if not 0.0 <= a_low < a_high:
            raise ValueError(f"a_range must satisfy 0 <= low < high, got {a_range!r}")
        if not 0.0 < dt_low <= dt_high:
            raise ValueError(f"dt_range must satisfy 0 < low <= high, got {dt_range!r}")
        h = self.A_log.shape[0]
        with torch.no_grad():
            a = torch.empty(h).uniform_(a_low, a_high).clamp_(min=1e-4)  # (h,)
            log_dt = torch.rand(h) * math.log(dt_high / dt_low) + math.log(dt_low)
            dt = log_dt.exp()  # (h,), log-uniform in dt_range
            self.A_log.copy_(a.log())
            self.dt_bias.copy_(dt.expm1().log())  # softplus(dt_bias) = dt

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """The gate's log decay ``g = -exp(A_log) * softplus(x W_alpha + dt_bias)``.

        The state is multiplied by ``exp(g)`` before each token's write: the
        fraction of itself it keeps per token, in (0, 1).

        Args:
            x: ``(batch, num_tokens, d_in)``, the layer's input.

        Returns:
            ``(batch, num_heads, num_tokens)``, negative.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the module's dtype.
            ValueError: ``x`` is not ``(batch, num_tokens, d_in)`` or is empty.

        Source: Yang et al. (2024), "Gated Delta Networks", section 3.4 (the
        gate ``alpha_t = exp(g_t)``, parameterised as in Mamba2: Dao and Gu 2024,
        "Transformers are SSMs"); as released in Qwen3-Next.
        """
        check_input(x, self.d_in, (3,), like=self.W_query.weight)
        g = -self.A_log.exp() * F.softplus(self.W_alpha(x) + self.dt_bias)  # (b, n, h)
        return g.transpose(1, 2)  # (b, h, n)

    @property
    def state_numbers(self) -> int:
        """How many numbers a decoder keeps per sequence (whatever its length), the
        delta rule's state plus the convolution's last ``conv_size - 1`` inputs."""
        channels = self.conv.in_channels
        return self.num_heads * self.head_dim * self.head_dim_v + channels * (self.conv_size - 1)

    def new_cache(self) -> RecurrentState:
        """An empty :class:`RecurrentState` for :meth:`forward`'s ``kv_cache``."""
        return RecurrentState(self.conv_size)

    def forward(
        self,
        x: torch.Tensor,
        return_weights: bool = False,
        *,
        kv_cache: RecurrentState | None = None,
    ) -> torch.Tensor:
        """The layer on ``x``, optionally continuing from (and updating) ``kv_cache``.

        Args:
            x: ``(batch, num_tokens, d_in)``; with a cache, only the new tokens.
            return_weights: must be ``False`` (the signature of attnlib's
                attention layers; this layer has no attention weights).
            kv_cache: keyword-only; a :class:`RecurrentState` (:meth:`new_cache`,
                empty at the start of a sequence), updated in place. Default None.
                (Called ``state`` before attnlib 0.5.)

        Returns:
            ``(batch, num_tokens, d_in)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the module's
                dtype, or the cache is not a :class:`RecurrentState`.
            ValueError: ``x`` is not ``(batch, num_tokens, d_in)`` or is empty,
                ``return_weights`` is True, or the cache's ``conv_size`` is not
                the layer's.
        """
        check_input(x, self.d_in, (3,), like=self.W_query.weight)
        if check_bool("return_weights", return_weights):
            raise ValueError("GatedDeltaNet has no attention weights: return_weights=False")
        if kv_cache is not None and not isinstance(kv_cache, RecurrentState):
            raise TypeError(
                f"kv_cache must be an attnlib.RecurrentState or None, got {type_name(kv_cache)}"
            )
        if kv_cache is not None and kv_cache.conv_size != self.conv_size:
            raise ValueError(f"the RecurrentState has conv_size={kv_cache.conv_size}, the "
                             f"layer {self.conv_size}: use layer.new_cache()")
        b, n, _ = x.shape
        h, hk, d, dv = self.num_heads, self.num_key_heads, self.head_dim, self.head_dim_v
        mixed = torch.cat([self.W_query(x), self.W_key(x), self.W_value(x)], dim=-1)
        mixed = mixed.transpose(1, 2)  # (b, channels, n)
        if kv_cache is not None and kv_cache.conv_state is not None:
            history = kv_cache.conv_state
        else:
            history = mixed.new_zeros(b, mixed.shape[1], self.conv_size - 1)
        padded = torch.cat([history, mixed], dim=-1)  # (b, channels, conv_size - 1 + n)
        conv_out = F.silu(self.conv(padded)).transpose(1, 2)  # (b, n, channels), causal
        queries, keys, values = conv_out.split([hk * d, hk * d, h * dv], dim=-1)
        queries = F.normalize(queries.view(b, n, hk, d), dim=-1).transpose(1, 2)
        # queries: (b, hk, n, d), unit norm
        keys = F.normalize(keys.view(b, n, hk, d), dim=-1).transpose(1, 2)  # (b, hk, n, d)
        if hk != h:  # key head j serves value heads j * r .. j * r + r - 1
            queries = queries.repeat_interleave(h // hk, dim=1)  # (b, h, n, d)
            keys = keys.repeat_interleave(h // hk, dim=1)  # (b, h, n, d)
        values = values.view(b, n, h, dv).transpose(1, 2)  # (b, h, n, dv)
        beta = torch.sigmoid(self.W_beta(x)).transpose(1, 2)  # (b, h, n)
        g = self.log_decay(x)  # (b, h, n)
        outputs, final_state = gated_delta_rule(
            queries, keys, values, beta, g,
            form="recurrent" if n == 1 else "chunked", chunk_size=self.chunk_size,
            initial_state=None if kv_cache is None else kv_cache.state,
        )  # (b, h, n, dv)
        if kv_cache is not None:
            kv_cache.update(mixed, final_state)
        outputs = self.norm(outputs.transpose(1, 2))  # (b, n, h, dv)
        gate = F.silu(self.W_gate(x)).view(b, n, h, dv)  # (b, n, h, dv)
        return self.out_proj((outputs * gate).reshape(b, n, h * dv))  # (b, n, d_in)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"num_key_heads={self.num_key_heads}, head_dim_v={self.head_dim_v}, "
            f"conv_size={self.conv_size}"
        )
