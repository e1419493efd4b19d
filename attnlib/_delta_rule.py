"""The (gated) delta rule in three equal forms: recurrent, parallel and chunked.

Defined here and documented with :mod:`attnlib.linear_attention`, which
re-exports :data:`FORMS`, :func:`delta_rule_step` and :func:`gated_delta_rule`
(and whose :class:`~attnlib.linear_attention.GatedDeltaNet` runs them). Shapes
as there: ``(batch, num_heads, num_tokens, head_dim)`` for queries and keys,
``(..., head_dim_v)`` for values; a state is ``(batch, num_heads, head_dim,
head_dim_v)``; ``beta`` and ``g`` are ``(batch, num_heads, num_tokens)``.
"""

from __future__ import annotations

import math

import torch

from ._validation import check_float_tensor, check_positive_int, type_name
from .functional import causal_mask

__all__ = ["FORMS", "check_form", "check_qkv", "delta_rule_step", "gated_delta_rule"]

#: The values of ``form`` that :func:`linear_attention` and :func:`gated_delta_rule` take.
FORMS = ("recurrent", "parallel", "chunked")


def check_form(form: object, allowed: tuple[str, ...]) -> str:
    """Return ``form`` if it is one of ``allowed``.

    Raises:
        TypeError: ``form`` is not a str.
        ValueError: it is not one of ``allowed``.
    """
    if not isinstance(form, str):
        raise TypeError(f"form must be a str, got {type_name(form)}")
    if form not in allowed:
        raise ValueError(f"form must be one of {allowed}, got form={form!r}")
    return form


def check_qkv(
    queries: object, keys: object, values: object, *, fewer_queries: bool = False
) -> None:
    """Raise unless queries, keys and values are 4-D float tensors of one dtype whose
    shapes fit (with ``fewer_queries``, the queries may have fewer tokens).

    Raises:
        TypeError: a tensor is not floating point, or the dtypes differ.
        ValueError: a tensor is not 4-D, or the shapes disagree.
    """
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_float_tensor(name, t, min_ndim=4)
        assert isinstance(t, torch.Tensor)  # check_float_tensor raised otherwise
        if t.ndim != 4:
            raise ValueError(
                f"{name} must be (batch, num_heads, num_tokens, head_dim), got shape "
                f"{tuple(t.shape)}"
            )
    assert isinstance(queries, torch.Tensor) and isinstance(keys, torch.Tensor)
    assert isinstance(values, torch.Tensor)
    q_shape, k_shape = tuple(queries.shape), tuple(keys.shape)
    if fewer_queries and q_shape[2] <= k_shape[2]:
        q_shape, k_shape = q_shape[:2] + q_shape[3:], k_shape[:2] + k_shape[3:]
    if q_shape != k_shape:
        raise ValueError(
            f"queries and keys must have the same shape, got {tuple(queries.shape)} "
            f"and {tuple(keys.shape)}"
            + (" (or the queries fewer tokens)" if fewer_queries else "")
        )
    if values.shape[:3] != keys.shape[:3]:
        raise ValueError(
            "values must agree with keys on (batch, num_heads, num_tokens), got "
            f"{tuple(values.shape)} and {tuple(keys.shape)}"
        )
    if not (queries.dtype == keys.dtype == values.dtype):
        raise TypeError(
            f"queries, keys and values must share a dtype, got {queries.dtype}, "
            f"{keys.dtype}, {values.dtype}"
        )


def delta_rule_step(
    state: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One token of the (gated) delta rule: update the state, then read it.

    .. code-block:: text

        S = exp(g) S                          # the gate: forget a little of everything
        v_old = S^T k                         # what the state recalls for key k
        S = S + k (beta (v - v_old))^T        # move that recall towards v
        o = scale * S^T q

    With ``beta = 1`` and a unit-norm key the state then recalls exactly ``v``
    for ``k``; with ``g = 0`` (or None) there is no decay (DeltaNet).

    Args:
        state: ``(batch, num_heads, head_dim, head_dim_v)``.
        query, key: ``(batch, num_heads, head_dim)``; ``key`` normally of unit norm.
        value: ``(batch, num_heads, head_dim_v)``.
        beta: ``(batch, num_heads)``, the writing strength, normally in (0, 1).
        g: ``(batch, num_heads)``, the log of the decay (``<= 0``), or None for 0.
        scale: keyword-only; multiplies the output. Default ``1 / sqrt(head_dim)``.

    Returns:
        ``(output, new_state)``: ``(batch, num_heads, head_dim_v)`` and a new
        state of ``state``'s shape (``state`` is not modified).

    Raises:
        TypeError: a tensor argument is not a floating-point tensor.
        ValueError: the shapes do not fit together.

    Source: Yang et al. (2024), "Gated Delta Networks: Improving Mamba2 with
    Delta Rule", eq. (10) (the gated delta rule); Schlag et al. (2021),
    "Linear Transformers Are Secretly Fast Weight Programmers", section 4.2.
    """
    check_float_tensor("state", state, min_ndim=4)
    for name, t, nd in (("query", query, 3), ("key", key, 3), ("value", value, 3),
                        ("beta", beta, 2)):
        check_float_tensor(name, t, min_ndim=nd)
    b, h, d, dv = state.shape
    expected = {"query": (b, h, d), "key": (b, h, d), "value": (b, h, dv), "beta": (b, h)}
    given = {"query": query, "key": key, "value": value, "beta": beta}
    if g is not None:
        check_float_tensor("g", g, min_ndim=2)
        expected["g"], given["g"] = (b, h), g
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} for a state of shape {tuple(state.shape)}, "
                f"got {tuple(given[name].shape)}"
            )
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if g is not None:
        state = state * g.exp()[..., None, None]  # (b, h, d, dv)
    recalled = (state * key[..., :, None]).sum(-2)  # S^T k: (b, h, dv)
    delta = beta[..., None] * (value - recalled)  # (b, h, dv)
    state = state + key[..., :, None] * delta[..., None, :]  # (b, h, d, dv)
    output = scale * (state * query[..., :, None]).sum(-2)  # (b, h, dv)
    return output, state


def _chunk(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule on one chunk in parallel, from the state before it.

    With ``G_t = exp(g_1 + ... + g_t)`` (cumulative decay inside the chunk),
    the state after token ``t`` is ``G_t S_0 + sum_{i<=t} (G_t / G_i) k_i u_i^T``
    where the *pseudo-values* ``u`` solve the lower-triangular system
    ``u_t + beta_t sum_{j<t} (G_t / G_j)(k_t . k_j) u_j = beta_t (v_t - G_t S_0^T k_t)``.
    Queries come scaled. Returns outputs ``(b, h, n, dv)`` and the final state.
    """
    n = queries.shape[2]
    log_decay = g.cumsum(-1)  # (b, h, n): log G_t
    causal = causal_mask(n, device=queries.device)  # (n, n), True on and below the diagonal
    diff = log_decay[..., :, None] - log_decay[..., None, :]  # (b, h, n, n): log G_t / G_i
    decay = diff.masked_fill(~causal, float("-inf")).exp()  # zero above the diagonal
    key_key = keys @ keys.transpose(-2, -1)  # (b, h, n, n)
    strictly_lower = (decay * key_key).tril(-1) * beta[..., :, None]  # (b, h, n, n)
    system = strictly_lower + torch.eye(n, dtype=queries.dtype, device=queries.device)
    rhs = beta[..., None] * (values - log_decay.exp()[..., None] * (keys @ state))
    # rhs: (b, h, n, dv)
    pseudo_values = torch.linalg.solve_triangular(
        system, rhs, upper=False, unitriangular=True
    )  # (b, h, n, dv)
    attn_scores = (queries @ keys.transpose(-2, -1)) * decay  # (b, h, n, n), causal
    outputs = log_decay.exp()[..., None] * (queries @ state) + attn_scores @ pseudo_values
    total = log_decay[..., -1:]  # (b, h, 1): log G_n
    to_end = (total - log_decay).exp()  # (b, h, n): G_n / G_i
    new_state = total.exp()[..., None] * state + keys.transpose(-2, -1) @ (
        to_end[..., None] * pseudo_values
    )  # (b, h, d, dv)
    return outputs, new_state


def gated_delta_rule(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    form: str = "chunked",
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The gated delta rule over a sequence, in one of three equal forms.

    Token by token it is :func:`delta_rule_step`. ``form="parallel"`` computes
    all outputs at once: with ``D[t, i] = exp(g_{i+1} + ... + g_t)`` for
    ``i <= t`` (0 above the diagonal),

    .. code-block:: text

        (I + tril(beta * D * K K^T, -1)) U = beta * V      # pseudo-values, one triangular solve
        O = scale * (D * Q K^T) U                          # masked "attention" on U

    (plus the contribution of ``initial_state``). ``form="chunked"`` applies
    that to chunks of ``chunk_size`` tokens and carries the state from chunk
    to chunk: quadratic in ``chunk_size``, linear in ``num_tokens``.

    Args:
        queries, keys: ``(batch, num_heads, num_tokens, head_dim)``; the
            keys normally L2-normalised (so the delta rule is stable).
        values: ``(batch, num_heads, num_tokens, head_dim_v)``.
        beta: ``(batch, num_heads, num_tokens)``, writing strengths in (0, 1).
        g: ``(batch, num_heads, num_tokens)``, log decays (``<= 0``), or None
            for no decay (DeltaNet).
        form: keyword-only; ``"recurrent"``, ``"parallel"`` or ``"chunked"``
            (default).
        chunk_size: keyword-only; tokens per chunk for ``"chunked"``. Default 64.
        initial_state: keyword-only; ``(batch, num_heads, head_dim,
            head_dim_v)`` state before the first token, or None for zeros.
        scale: keyword-only; multiplies the queries. Default ``1 / sqrt(head_dim)``.

    Returns:
        ``(outputs, final_state)``: ``(batch, num_heads, num_tokens,
        head_dim_v)`` and ``(batch, num_heads, head_dim, head_dim_v)``; the
        state's size does not depend on ``num_tokens``.

    Raises:
        TypeError: a tensor is not floating point, the dtypes differ, or
            ``form`` is not a str.
        ValueError: a shape does not fit, ``form`` is not one of
            :data:`FORMS`, or ``chunk_size`` is not positive.

    Source: Yang et al. (2024), "Gated Delta Networks: Improving Mamba2 with
    Delta Rule", eq. (10) and section 3.3 (the chunkwise form with the WY
    representation); Yang et al. (2024), "Parallelizing Linear Transformers
    with the Delta Rule over Sequence Length", section 3.
    """
    check_qkv(queries, keys, values)
    check_form(form, FORMS)
    check_positive_int("chunk_size", chunk_size)
    b, h, n, d = keys.shape
    dv = values.shape[-1]
    check_float_tensor("beta", beta)
    if tuple(beta.shape) != (b, h, n):
        raise ValueError(f"beta must have shape {(b, h, n)}, got {tuple(beta.shape)}")
    if g is None:
        g = beta.new_zeros(b, h, n)
    check_float_tensor("g", g)
    if tuple(g.shape) != (b, h, n):
        raise ValueError(f"g must have shape {(b, h, n)}, got {tuple(g.shape)}")
    if initial_state is None:
        state = values.new_zeros(b, h, d, dv)
    else:
        check_float_tensor("initial_state", initial_state)
        if tuple(initial_state.shape) != (b, h, d, dv):
            raise ValueError(
                f"initial_state must have shape {(b, h, d, dv)}, got "
                f"{tuple(initial_state.shape)}"
            )
        state = initial_state
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if form == "recurrent":
        outputs = []
        for t in range(n):
            out, state = delta_rule_step(
                state, queries[:, :, t], keys[:, :, t], values[:, :, t], beta[:, :, t],
                g[:, :, t], scale=scale,
            )
            outputs.append(out)  # (b, h, dv)
        return torch.stack(outputs, dim=2), state  # (b, h, n, dv)
    size = n if form == "parallel" else chunk_size
    queries = queries * scale
    outputs = []
    for start in range(0, n, size):
        stop = min(start + size, n)
        out, state = _chunk(
            queries[:, :, start:stop], keys[:, :, start:stop], values[:, :, start:stop],
            beta[:, :, start:stop], g[:, :, start:stop], state,
        )
        outputs.append(out)  # (b, h, stop - start, dv)
    return torch.cat(outputs, dim=2), state  # (b, h, n, dv)
