"""Checkers for chapter 9's exercises: rotary embeddings, shared key/value heads
and the mask a KV cache needs.

* :func:`check_rope` - ``fn(x)`` rotates queries or keys by their positions
  (RoPE, half-split layout).
* :func:`check_repeat_kv` - ``fn(x, group_size)`` gives every query head its
  key/value head (grouped-query attention).
* :func:`check_kv_cache_mask` - ``fn(num_tokens, num_tokens_kv)`` is the
  causal mask of new queries after cached tokens (aligned bottom-right).

Each tests what the answer computes on seeded float64 probes of unequal sizes
and names the typical wrong answers by computing each one and comparing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from ._common import (
    CheckFailed,
    call_answer,
    checker,
    is_close,
    max_difference,
    name_wrong_answer,
    passed,
    probe_device,
    require_callable,
    require_tensor,
)

__all__ = ["check_rope", "check_repeat_kv", "check_kv_cache_mask"]

_BASE = 10000.0
# Differences up to this are float32 rounding of angles below ~12 rad (the probes' largest).
_FLOAT32_ATOL = 1e-5


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------


def _angles(num_tokens: int, head_dim: int, first_position: int, exponent_step: float,
            device: torch.device, first_pair: int = 0, base: float = _BASE) -> torch.Tensor:
    """``(num_tokens, head_dim // 2)`` angles ``m * base^(-exponent_step * i / head_dim)``,
    pairs ``i = first_pair ... first_pair + head_dim / 2 - 1``."""
    i = torch.arange(first_pair, first_pair + head_dim // 2, dtype=torch.float64,
                     device=device)
    theta = base ** (-exponent_step * i / head_dim)
    positions = torch.arange(first_position, first_position + num_tokens, dtype=torch.float64,
                             device=device)
    return torch.outer(positions, theta)


def _rope_half_split(x: torch.Tensor, angles: torch.Tensor, sign: float = 1.0,
                     swap_only: bool = False, interleaved_angles: bool = False,
                     swap_cos_sin: bool = False) -> torch.Tensor:
    if interleaved_angles:  # each angle twice in a row: the adjacent layout's cos and sin
        cos = angles.cos().repeat_interleave(2, dim=-1)  # (num_tokens, head_dim)
        sin = angles.sin().repeat_interleave(2, dim=-1)
    else:
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (num_tokens, head_dim)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    if swap_cos_sin:
        cos, sin = sin, cos
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([x2, x1], dim=-1) if swap_only else torch.cat([-x2, x1], dim=-1)
    return x * cos + sign * rotated * sin


def _rope_adjacent_with_half_angles(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Adjacent pairs turned, but with the half-split layout's cos/sin (cat of two halves)."""
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # (num_tokens, head_dim)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def _rope_adjacent(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # pairs (2i, 2i + 1)
    cos, sin = angles.cos(), angles.sin()
    out = torch.empty_like(x)
    out[..., 0::2] = x_even * cos - x_odd * sin
    out[..., 1::2] = x_even * sin + x_odd * cos
    return out


def _rope_wrong_answers(x: torch.Tensor, base: float = _BASE) -> dict[str, torch.Tensor]:
    n, d = x.shape[-2], x.shape[-1]

    def angles(first_position: int = 0, exponent_step: float = 2, first_pair: int = 0,
               angle_base: float = base) -> torch.Tensor:
        return _angles(n, d, first_position, exponent_step, x.device, first_pair, angle_base)

    right = angles()
    wrong = {}
    if base != _BASE:
        wrong[
            f"ignores its base argument: called with base={base:g}, it turned the pairs as "
            f"with base = {_BASE:g}. Use the argument in theta_i = base ** (-2 * i / "
            "head_dim) instead of a fixed 10000 (models choose other bases: Llama 3 uses "
            "500000)"
        ] = _rope_half_split(x, angles(angle_base=_BASE))
    wrong.update({
        "you rotated ADJACENT pairs (components 2i and 2i + 1, the paper's layout). This "
        "exercise asks for the half-split layout: pair i is components i and i + head_dim/2, "
        "x1, x2 = x.chunk(2, dim=-1). The two are the same map up to a permutation of "
        "components, but a model's weights only work with the layout they were trained "
        "with.": _rope_adjacent(x, right),
        "your positions start at 1: the first token must sit at position 0 and be left "
        "unchanged (angle 0). Use torch.arange(num_tokens), not torch.arange(1, num_tokens + "
        "1). Check: fn(x)[..., 0, :] should equal x[..., 0, :].": _rope_half_split(
            x, angles(first_position=1)),
        "a sign is missing in rotate_half: it must return cat([-x2, x1]), not cat([x2, x1]). "
        "Without the minus sign the map is not a rotation: the norms of the vectors "
        "change (compare fn(x).norm(dim=-1) with x.norm(dim=-1)).": _rope_half_split(
            x, right, swap_only=True),
        "you rotate by the negative angle (clockwise): rotate_half must return "
        "cat([-x2, x1]), and the result is x * cos + rotate_half(x) * sin. You have "
        "cat([x2, -x1]) or a minus before the sine term.": _rope_half_split(x, right, -1.0),
        "the frequencies are wrong: theta_i = base ** (-2 * i / head_dim) for i = 0 .. "
        "head_dim/2 - 1 (note the 2). You used base ** (-i / head_dim), so the slow pairs "
        "turn too fast.": _rope_half_split(x, angles(exponent_step=1)),
        "the frequencies are wrong: theta_i = base ** (-2 * i / head_dim) with i counted "
        "over the head_dim/2 PAIRS. You divided by head_dim/2 (base ** (-2 * i / "
        "(head_dim // 2)), or base ** (-4 * i / head_dim)), so the slow pairs turn too "
        "slowly.": _rope_half_split(x, angles(exponent_step=4)),
        "the minus sign of the exponent is missing: theta_i = base ** (-2 * i / head_dim) "
        "is at most 1 radian per position and shrinks with i; base ** (2 * i / head_dim) "
        "grows up to about base.": _rope_half_split(x, angles(exponent_step=-2)),
        "your pair index starts at 1: the first pair must turn by 1 radian per position, "
        "theta_0 = base ** 0. The paper writes theta_i = 10000 ** (-2 (i - 1) / d) for i = 1 "
        ".. d/2; counting from 0 that is base ** (-2 * i / head_dim) with "
        "i = torch.arange(head_dim // 2).": _rope_half_split(
            x, angles(first_pair=1)),
        "cos and sin are swapped: the rotation is x * cos + rotate_half(x) * sin, so that "
        "position 0 (angle 0: cos = 1, sin = 0) leaves x unchanged.": _rope_half_split(
            x, right, swap_cos_sin=True),
        "you mixed the two layouts: your cos and sin repeat each angle twice in a row "
        "(repeat_interleave(2), the ADJACENT layout's order) but you rotate the two halves "
        "(rotate_half). In the half-split layout pair i is components i and i + head_dim/2, "
        "so both need angle i: cos = torch.cat([cos, cos], dim=-1), likewise sin.":
            _rope_half_split(x, right, interleaved_angles=True),
        "you mixed the two layouts: you turn ADJACENT pairs (2i, 2i + 1) but your cos and "
        "sin are the half-split layout's (torch.cat of two copies), so components 2i and "
        "2i + 1 get different angles. Use the half-split layout throughout: x1, x2 = "
        "x.chunk(2, dim=-1), rotate_half(x) = cat([-x2, x1]).":
            _rope_adjacent_with_half_angles(x, right),
    })
    return wrong


def _takes_base(fn: Callable[..., torch.Tensor]) -> bool:
    """Whether ``fn`` can be called with ``base=...`` (True where its signature is unknown)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return "base" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


@checker
def check_rope(fn: Callable[..., torch.Tensor], *,
               device: torch.device | str | None = None) -> bool:
    """Check ``fn(x, base=10000.0)``: rotary position embedding, half-split layout.

    ``x`` is ``(..., num_tokens, head_dim)`` (queries or keys; ``head_dim``
    even); token ``m`` (counting from 0) has each pair ``(x[i], x[i + head_dim/2])``
    rotated by the angle ``m * theta_i``, ``theta_i = base^(-2i / head_dim)``:
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half([x1, x2]) = [-x2, x1]``,
    as :class:`attnlib.RotaryPositionalEmbedding` computes. Probed on float64
    inputs of shapes ``(2, 3, 7, 8)``, ``(5, 6)`` and ``(1, 1, 12, 4)`` as
    ``fn(x)`` (base 10000), then ``(3, 9, 6)`` as ``fn(x, base=500.0)``.

    Recognised wrong answers: ``base`` ignored (10000 written into the
    answer) or missing from the signature, adjacent pairs instead of halves, the two
    layouts mixed (angles repeated with ``repeat_interleave`` but halves
    rotated, or adjacent pairs rotated with the halves' angles), positions
    starting at 1, a missing minus sign in ``rotate_half``, rotating the other
    way, cos and sin swapped, frequencies without the factor 2 or divided by
    ``head_dim / 2``, the exponent's minus sign missing, the pair index
    starting at 1, angles computed in float32 (right to about 1e-7 only), a
    wrong shape or dtype, a mutated input.

    Args:
        fn: the learner's function, ``fn(x, base=10000.0) -> Tensor``.
        device: where to probe (keyword only); default the CPU.

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or computes something
            else; the message names the likely mistake.

    Source: Su et al. (2021), "RoFormer", eq. (34); half-split layout of GPT-NeoX.
    """
    device = probe_device(device)
    require_callable(fn, "your RoPE function fn(x)")
    generator = torch.Generator().manual_seed(9)
    # The last probe passes base=500: an answer that keeps 10000 fixed fails there.
    for shape, base in (((2, 3, 7, 8), None), ((5, 6), None), ((1, 1, 12, 4), None),
                        ((3, 9, 6), 500.0)):
        x = torch.randn(*shape, generator=generator, dtype=torch.float64).to(device)
        x_before = x.clone()
        if base is None:
            what, kwargs, base = f"fn(x) for x of shape {shape}", {}, _BASE
        else:
            what, kwargs = f"fn(x, base={base:g}) for x of shape {shape}", {"base": base}
            if not _takes_base(fn):
                raise CheckFailed(
                    "your function takes no argument base: the exercise asks for "
                    "my_rope(x, base=10000.0), since models choose other bases (Llama 3 "
                    "uses 500000). Add it and use it in theta_i = base ** (-2 * i / "
                    "head_dim)."
                )
        out = call_answer(fn, x, what=what, **kwargs)
        out = require_tensor(out, what, shape, torch.float64, device)
        if not torch.equal(x, x_before):
            raise CheckFailed(f"{what} changed its input x in place: return a new tensor "
                              "(x * cos + ... creates one; avoid x *= ... or x[...] = ...)")
        expected = _rope_half_split(x, _angles(shape[-2], shape[-1], 0, 2, device, base=base))
        if is_close(out, expected, atol=1e-10, rtol=1e-8):
            continue
        # Named at float32's tolerance, so that a slip made in float32 is still named.
        message = name_wrong_answer(out, _rope_wrong_answers(x, base), atol=_FLOAT32_ATOL,
                                    rtol=0.0)
        if message is not None:
            raise CheckFailed(f"{what}: {message}")
        if is_close(out, expected, atol=_FLOAT32_ATOL, rtol=0.0):
            raise CheckFailed(
                f"{what} is right only to about float32's precision (off by up to "
                f"{max_difference(out, expected):.1e}): your angles, cos or sin are computed "
                "in float32. torch.arange(...) without dtype= gives integers, and dividing "
                "them gives float32; create them with dtype=x.dtype (and device=x.device)."
            )
        raise CheckFailed(
            f"{what} differs from RoPE by up to {max_difference(out, expected):.3g}. Compare "
            "fn(x) with attnlib.RotaryPositionalEmbedding(head_dim, num_tokens)(x) position by "
            "position: position 0 must be unchanged."
        )
    return passed("RoPE in the half-split layout: right angles, right pairs, norms kept.")


# ---------------------------------------------------------------------------
# Sharing key/value heads
# ---------------------------------------------------------------------------


@checker
def check_repeat_kv(fn: Callable[[torch.Tensor, int], torch.Tensor], *,
                    device: torch.device | str | None = None) -> bool:
    """Check ``fn(x, group_size)``: give each query head its key/value head.

    ``x`` is ``(batch, num_kv_groups, num_tokens, head_dim)``; the result is
    ``(batch, num_kv_groups * group_size, num_tokens, head_dim)`` in which
    key/value head ``j`` fills heads ``j * group_size ... (j + 1) * group_size - 1``,
    as ``x.repeat_interleave(group_size, dim=1)`` and torch's ``enable_gqa=True``
    arrange them. Probed with float64 inputs, ``num_kv_groups`` 3 and 1,
    ``group_size`` 2, 4 and 1.

    Recognised wrong answers: ``x.repeat(1, group_size, 1, 1)`` (the heads
    tiled: head ``h`` gets key/value head ``h % num_kv_groups``), repeating
    along the token, batch or last dimension, a result with an extra
    dimension (``expand`` without ``reshape``), a wrong dtype.

    Args:
        fn: the learner's function, ``fn(x, group_size) -> Tensor``.
        device: where to probe (keyword only); default the CPU.

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or arranges the heads
            otherwise; the message names the likely mistake.

    Source: Ainslie et al. (2023), "GQA", section 2.2.
    """
    device = probe_device(device)
    require_callable(fn, "your function fn(x, group_size)")
    generator = torch.Generator().manual_seed(10)
    for batch, groups, num_tokens, head_dim, group_size in (
        (2, 3, 5, 4, 2), (1, 1, 3, 6, 4), (2, 3, 2, 4, 1),
    ):
        x = torch.randn(batch, groups, num_tokens, head_dim, generator=generator,
                        dtype=torch.float64).to(device)
        what = f"fn(x, group_size={group_size}) for x of shape {tuple(x.shape)}"
        out = call_answer(fn, x, group_size, what=what)
        shape = (batch, groups * group_size, num_tokens, head_dim)
        if isinstance(out, torch.Tensor) and tuple(out.shape) != shape:
            hint = ""
            if tuple(out.shape) == (batch, groups, num_tokens * group_size, head_dim):
                hint = (" You repeated along the token dimension (dim=2); the heads are "
                        "dim=1.")
            elif tuple(out.shape) == (batch * group_size, groups, num_tokens, head_dim):
                hint = (" You repeated along the batch dimension (dim=0); the heads are "
                        "dim=1.")
            elif tuple(out.shape) == (batch, groups, num_tokens, head_dim * group_size):
                hint = (" You repeated along the last dimension (head_dim); the heads are "
                        "dim=1.")
            elif out.ndim == 5:
                hint = (" An expand gives an extra dimension: reshape it to "
                        "(batch, num_kv_groups * group_size, num_tokens, head_dim).")
            raise CheckFailed(f"{what} returned shape {tuple(out.shape)}; expected {shape}."
                              + hint)
        out = require_tensor(out, what, shape, torch.float64, device)
        expected = x.repeat_interleave(group_size, dim=1)
        if torch.equal(out, expected):
            continue
        wrong = {
            "you tiled the heads (x.repeat(1, group_size, 1, 1) or torch.cat([x] * group_size, "
            "dim=1)): query head h then reads key/value head h % num_kv_groups, but grouped-"
            "query attention gives CONSECUTIVE query heads the same key/value head, "
            "h // group_size. Use x.repeat_interleave(group_size, dim=1).": x.repeat(
                1, group_size, 1, 1),
        }
        message = name_wrong_answer(out, wrong, atol=0.0, rtol=0.0)
        if message is not None:
            raise CheckFailed(f"{what}: {message}")
        raise CheckFailed(
            f"{what} does not give head h the key/value head h // group_size: compare "
            "fn(x, 2)[:, h] with x[:, h // 2] for each h."
        )
    return passed("each key/value head serves group_size consecutive query heads.")


# ---------------------------------------------------------------------------
# The mask of a KV cache
# ---------------------------------------------------------------------------


def _bottom_right(n: int, n_kv: int, device: torch.device,
                  diagonal_shift: int = 0) -> torch.Tensor:
    ones = torch.ones(n, n_kv, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=n_kv - n + diagonal_shift)


@checker
def check_kv_cache_mask(fn: Callable[[int, int], torch.Tensor], *,
                        device: torch.device | str | None = None) -> bool:
    """Check ``fn(num_tokens, num_tokens_kv)``: causal mask of new tokens after cached ones.

    The ``num_tokens`` queries are the *last* of ``num_tokens_kv`` positions,
    so query ``i`` may attend to keys ``0 ... num_tokens_kv - num_tokens + i``:
    a bool ``(num_tokens, num_tokens_kv)`` mask, **True where a query may
    attend**, aligned at the bottom-right, as
    :func:`attnlib.functional.bottom_right_causal_mask`. Probed with
    ``(3, 7)``, ``(1, 6)``, ``(4, 4)`` and ``(2, 9)``.

    Recognised wrong answers: the top-left alignment of
    ``attnlib.causal_mask(num_tokens, num_tokens_kv)`` (the new tokens would
    not see most of the cache), the polarity flipped, the diagonal missing (a
    token cannot see itself), one future token visible (the diagonal one too
    high), a mask over the new tokens only, the square mask of all positions,
    a transposed mask, a non-bool mask (an additive one of 0 and -inf named as
    such).

    Args:
        fn: the learner's function, ``fn(num_tokens, num_tokens_kv) -> Tensor``.
        device: keyword only; accepted for symmetry with the other checkers
            (the mask is compared on the device it comes back on).

    Returns:
        True, after printing one line, if ``fn`` is right.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, or returns another
            mask; the message names the likely mistake.

    Source: incremental decoding with a KV cache (Shazeer 2019, section 2.4);
    PyTorch's ``causal_lower_right``.
    """
    probe_device(device)
    require_callable(fn, "your mask function fn(num_tokens, num_tokens_kv)")
    for n, n_kv in ((3, 7), (1, 6), (4, 4), (2, 9)):
        what = f"fn({n}, {n_kv})"
        out = call_answer(fn, n, n_kv, what=what)
        if isinstance(out, torch.Tensor) and n != n_kv and tuple(out.shape) == (n, n):
            raise CheckFailed(
                f"{what} returned shape {(n, n)}, a mask over the new tokens only; the new "
                f"queries attend to all {n_kv} keys (cached and new): expected shape "
                f"{(n, n_kv)}."
            )
        if isinstance(out, torch.Tensor) and n != n_kv and tuple(out.shape) == (n_kv, n_kv):
            raise CheckFailed(
                f"{what} returned shape {(n_kv, n_kv)}, the square mask of all positions; "
                f"the rows are the {n} NEW queries only: keep its last {n} rows "
                f"(expected shape {(n, n_kv)})."
            )
        if isinstance(out, torch.Tensor) and n != n_kv and tuple(out.shape) == (n_kv, n):
            raise CheckFailed(
                f"{what} returned shape {(n_kv, n)}: rows must be the queries and columns "
                f"the keys, expected shape {(n, n_kv)} (is your mask transposed?)."
            )
        out = require_tensor(out, what, (n, n_kv))
        if out.dtype != torch.bool:
            hint = ""
            if out.is_floating_point() and bool(torch.isneginf(out).any()):
                hint = (" Yours looks like an additive mask (0 and -inf, added to the "
                        "scores), which is another convention: return the bool mask itself.")
            raise CheckFailed(f"{what} returned dtype {out.dtype}; expected a bool mask, True "
                              "where a query may attend." + hint)
        expected = _bottom_right(n, n_kv, out.device)
        if torch.equal(out, expected):
            continue
        ones = torch.ones(n, n_kv, dtype=torch.bool, device=out.device)
        wrong = {
            "your mask is aligned at the TOP-LEFT, like attnlib.causal_mask(num_tokens, "
            "num_tokens_kv): new query 0 then sees only key 0. The new queries are the LAST "
            "positions: query i sits at position num_tokens_kv - num_tokens + i and sees every "
            "key up to there (torch.tril(..., diagonal=num_tokens_kv - num_tokens)).":
                torch.tril(ones),
            "the polarity is flipped: True must mean 'may attend' (the course's and "
            "torch.nn.functional.scaled_dot_product_attention's convention).": ~expected,
            "the diagonal is missing: a new token may attend to itself, so query i sees key "
            "num_tokens_kv - num_tokens + i too.": _bottom_right(n, n_kv, out.device, -1),
            "a future token leaks: query i sits at position num_tokens_kv - num_tokens + i "
            "and may see keys up to that position only, but your mask lets it see the next "
            "one too (the diagonal of torch.tril is one too high).": _bottom_right(
                n, n_kv, out.device, 1),
        }
        wrong = {m: w.to(torch.float64) for m, w in wrong.items()}
        message = name_wrong_answer(out.to(torch.float64), wrong, atol=0.0, rtol=0.0)
        if message is not None:
            raise CheckFailed(f"{what}: {message}")
        raise CheckFailed(f"{what} returned\n{out.int()}\nbut the mask is\n{expected.int()}\n"
                          "(1 = may attend).")
    return passed("new queries see every cached key and the new keys up to their own.")
