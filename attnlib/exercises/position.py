"""Checkers for chapter 7: the sinusoidal positional encoding.

The probes use tables of unequal sizes (more positions than dimensions, and
the other way round) and compare in float64 with attnlib's reference,
:func:`attnlib.sinusoidal_encoding`, and with the typical wrong tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..positional import sinusoidal_encoding
from ._common import (
    CheckFailed,
    answer_name,
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

__all__ = ["check_sinusoidal_encoding"]

_DTYPE = torch.float64
# float32 answers are accepted: sin and cos of angles up to ~60 rad are within
# 1e-5 of the float64 values.
_ATOL = 1e-5


def _table(positions: torch.Tensor, omegas: torch.Tensor, first: Callable[..., Any],
           second: Callable[..., Any], d_model: int, interleave: bool = True) -> torch.Tensor:
    """Columns ``first(angle)``, ``second(angle)`` per pair, interleaved or in two halves."""
    angles = positions[:, None] * omegas[None, :]  # (num_positions, d_model // 2)
    if interleave:
        table = torch.empty(len(positions), d_model, dtype=_DTYPE)
        table[:, 0::2] = first(angles)
        table[:, 1::2] = second(angles)
        return table
    return torch.cat((first(angles), second(angles)), dim=-1)


def _wrong_tables(num_positions: int, d_model: int) -> dict[str, torch.Tensor]:
    """The typical wrong encodings of shape ``(num_positions, d_model)``, even d_model."""
    positions = torch.arange(num_positions, dtype=_DTYPE)
    pair = torch.arange(d_model // 2, dtype=_DTYPE)  # i = 0, 1, ..., d_model / 2 - 1
    omegas = 10000.0 ** (-2 * pair / d_model)
    return {
        "puts the cosine in the even columns and the sine in the odd ones: PE[pos, 2i] is "
        "sin(pos * omega_i) and PE[pos, 2i + 1] is cos(pos * omega_i). Row 0 must be "
        "[0, 1, 0, 1, ...]":
            _table(positions, omegas, torch.cos, torch.sin, d_model),
        "puts all the sines in the first half of the columns and all the cosines in the "
        "second half; the paper interleaves them: column 2i is a sine, column 2i + 1 the "
        "cosine of the same angle. Write table[:, 0::2] = sin and table[:, 1::2] = cos":
            _table(positions, omegas, torch.sin, torch.cos, d_model, interleave=False),
        "uses the pair index i in the exponent, omega_i = 10000^(-i / d_model); the "
        "exponent is 2i / d_model (with i counting pairs), or the even column index "
        "2i itself, as in torch.arange(0, d_model, 2) / d_model":
            _table(positions, 10000.0 ** (-pair / d_model), torch.sin, torch.cos, d_model),
        "uses the column index in the exponent for the cosines too (2i + 1 instead of 2i): "
        "a sine and the cosine next to it share one frequency, omega_i = "
        "10000^(-2i / d_model)":
            _cosine_own_index(positions, d_model),
        "uses base e instead of 10000: omega_i = exp(-2i / d_model). In the exp-log form "
        "the factor ln(10000) is missing: omega_i = exp(-2i / d_model * math.log(10000))":
            _table(positions, torch.exp(-2 * pair / d_model), torch.sin, torch.cos, d_model),
        "starts the positions at 1; the first token has position 0, so row 0 must be "
        "[0, 1, 0, 1, ...]: use torch.arange(num_positions)":
            _table(positions + 1, omegas, torch.sin, torch.cos, d_model),
        "forgets the minus sign: omega_i = 10000^(+2i / d_model) grows instead of "
        "shrinking, so later pairs turn faster, not slower":
            _table(positions, 10000.0 ** (2 * pair / d_model), torch.sin, torch.cos, d_model),
        "doubles the exponent: with the even column index c = 2i (0, 2, 4, ...) the "
        "exponent is c / d_model, not 2c / d_model (torch.arange(0, d_model, 2) already "
        "holds the 2i)":
            _table(positions, 10000.0 ** (-4 * pair / d_model), torch.sin, torch.cos, d_model),
        "multiplies the angles by 2 pi: omega_i is already an angle per position, in "
        "radians, so the entry is sin(pos * omega_i), without a factor 2 pi":
            _table(positions, 2 * torch.pi * omegas, torch.sin, torch.cos, d_model),
    }


def _cosine_own_index(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    column = torch.arange(d_model, dtype=_DTYPE)
    angles = positions[:, None] * 10000.0 ** (-column / d_model)[None, :]
    table = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table


@checker
def check_sinusoidal_encoding(fn: Callable[..., Any], *,
                              device: torch.device | str | None = None) -> bool:
    """Check ``fn(num_positions, d_model)`` that returns the sinusoidal encoding table.

    The right answer is the table of Vaswani et al. (2017), section 3.5, with
    positions ``0 .. num_positions - 1``:
    ``PE[pos, 2i] = sin(pos * omega_i)``, ``PE[pos, 2i + 1] = cos(pos *
    omega_i)``, ``omega_i = 10000^(-2i / d_model)``, as
    :func:`attnlib.sinusoidal_encoding` computes it. The answer may return any
    floating-point dtype; it is compared in float64 with ``atol=1e-5`` (what
    float32 reaches). Probes: ``(num_positions, d_model) = (7, 6)`` and
    ``(50, 16)``, even ``d_model`` only (an odd one has a lone last sine).
    With ``device``, the answer is called inside ``with torch.device(device)``
    so that the tensors it creates land there.

    Recognised mistakes: sine and cosine swapped; sines and cosines in two
    halves instead of interleaved; the pair index ``i`` in the exponent instead
    of ``2i``; the cosine's own column index ``2i + 1`` in its exponent; base
    ``e`` instead of 10000 (``ln 10000`` missing in the exp form); positions
    starting at 1; the exponent's minus sign missing; the exponent doubled
    (``2c / d_model`` with the even column index ``c = 2i``); angles
    multiplied by ``2 pi``; a float16 or bfloat16 table, right only to about
    three digits.

    Args:
        fn: the learner's function.
        device: where to probe (``"cuda"`` for a GPU); default the CPU.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than a floating-point tensor of shape ``(num_positions, d_model)``,
            or the wrong numbers; the message names the mistake where it is a
            known one.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Vaswani et al. (2017), "Attention Is All You Need", section 3.5.
    """
    require_callable(fn, "a function fn(num_positions, d_model)")
    device = probe_device(device)
    name = answer_name(fn, "fn")
    for num_positions, d_model in ((7, 6), (50, 16)):
        what = f"{name}(num_positions={num_positions}, d_model={d_model})"
        with torch.device(device):
            out = call_answer(fn, num_positions, d_model, what=what)
        out = require_tensor(out, what, (num_positions, d_model))
        if not out.is_floating_point():
            raise CheckFailed(f"{what} returned dtype {out.dtype}; expected a floating-point "
                              "table (sines and cosines are fractions).")
        dtype = out.dtype
        out = out.detach().to(device="cpu", dtype=_DTYPE)
        expected = sinusoidal_encoding(num_positions, d_model, dtype=_DTYPE)
        if dtype in (torch.float16, torch.bfloat16) and not is_close(
                out, expected, atol=_ATOL, rtol=0.0) and is_close(out, expected, atol=1e-2):
            raise CheckFailed(
                f"{what} returned a {dtype} table, whose values differ from the encoding by "
                f"up to {max_difference(out, expected):.3g}: {dtype} keeps only about three "
                "decimal digits. Compute and return float32 (or float64)."
            )
        if is_close(out, expected, atol=_ATOL, rtol=0.0):
            continue
        mistake = name_wrong_answer(out, _wrong_tables(num_positions, d_model), atol=_ATOL,
                                    rtol=0.0)
        if mistake is not None:
            raise CheckFailed(f"{what} {mistake}.")
        row = int((out - expected).abs().amax(dim=-1).argmax())
        raise CheckFailed(
            f"{what} differs from the sinusoidal encoding by up to "
            f"{max_difference(out, expected):.3g} (first in row {row}, position {row}), and "
            "it matches none of the typical mistakes this check knows. Compare your row 1 "
            f"with attnlib.sinusoidal_encoding({num_positions}, {d_model})[1]."
        )
    return passed(f"{name} computes the sinusoidal encoding of Vaswani et al. (2017).")
