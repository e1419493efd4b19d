"""Checkers for chapter 11's exercises: Triton kernels, run as the learner wrote them.

* :func:`check_logsumexp_kernel` - ``kernel[(num_rows,)](x, out, num_cols, row_stride,
  BLOCK=...)``: each row's log-sum-exp, read ``BLOCK`` entries at a time with an
  online maximum and sum, the last block masked at the row's end.
* :func:`check_delta_kernel` - ``kernel[(cdiv(num_rows, BLOCK_M),)](out, grad_out, delta,
  num_rows, HEAD_DIM=..., BLOCK_M=...)``: FlashAttention-2's ``D = rowsum(dO * O)``,
  one block of rows per program, the last block masked.
* :func:`check_block_size` - ``fn(head_dim, element_size, num_stages,
  shared_memory_bytes)``: the largest power-of-two tile whose forward-pass tiles
  fit in shared memory.

The two kernel checkers launch the learner's ``@triton.jit`` function themselves:
on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton's first import), or compiled on CUDA tensors. Each tensor lies inside a
larger buffer whose extra entries hold known guard values, so a load without its
edge mask reads numbers the checker can name, and a store without it changes
entries the checker watches, instead of touching memory outside the tensors.
Triton is imported only when a kernel checker runs: ``import attnlib`` does not
need it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .._validation import type_name
from ..flash_triton import _import_triton, _imported_interpreted
from ._common import (
    CheckFailed,
    answer_name,
    call_answer,
    checker,
    is_close,
    max_difference,
    passed,
    probe_device,
    require_callable,
)

__all__ = ["check_logsumexp_kernel", "check_delta_kernel", "check_block_size"]

#: Tolerances for a float32 kernel against a float64 reference.
_ATOL = 1e-4
_RTOL = 1e-5
_LOG2_E = math.log2(math.e)


# ---------------------------------------------------------------------------------------
# launching the learner's kernel


def _kernel_device(device: torch.device | str | None) -> torch.device:
    """Where the learner's kernel can run: the CPU under Triton's interpreter, or CUDA.

    Raises:
        ImportError: Triton is not installed.
        RuntimeError: Triton was imported without ``TRITON_INTERPRET=1`` and there
            is no CUDA GPU, or ``device`` asks for the CPU in that case.
    """
    triton = _import_triton()
    interpreted = _imported_interpreted(triton)
    if device is None:
        if interpreted:
            return torch.device("cpu")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = probe_device(device)
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "a Triton kernel runs on CPU tensors only under Triton's interpreter: set "
            "os.environ['TRITON_INTERPRET'] = '1' before anything imports triton (at the top "
            "of the notebook; then restart the kernel), or run on a CUDA GPU"
        )
    return device


def _require_kernel(kernel: object, what: str) -> None:
    """``kernel`` must be a function decorated with ``@triton.jit``."""
    # Triton ships no type hints (no py.typed): both classes are Any to mypy.
    from triton.runtime.interpreter import InterpretedFunction  # type: ignore[import-untyped]
    from triton.runtime.jit import JITFunction  # type: ignore[import-untyped]

    if isinstance(kernel, (JITFunction, InterpretedFunction)):
        return
    if callable(kernel) and not isinstance(kernel, type):
        raise CheckFailed(
            f"expected {what}, a Triton kernel, but got the plain Python function "
            f"{answer_name(kernel, 'fn')}: put @triton.jit on the line above its def, run "
            "that cell again, and pass the decorated function."
        )
    require_callable(kernel, what)  # raises: a string, a tensor, a class, ...
    raise CheckFailed(f"expected {what}, a function decorated with @triton.jit, "
                      f"got {type_name(kernel)}")


def _kernel_name(kernel: Any) -> str:
    return answer_name(getattr(kernel, "fn", kernel), "kernel")


def _launch(kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict, what: str) -> None:
    """Run ``kernel[grid](*args, **kwargs)``; an error in it becomes a CheckFailed.

    Triton's interpreter wraps an exception raised inside a kernel in its own
    ``InterpreterError``; the learner's exception (a ``NotImplementedError`` from
    the stub, a shape error from ``tl.store``) is reported instead.
    """
    def run() -> None:
        try:
            with warnings.catch_warnings():  # NumPy's overflow warnings: the check explains
                warnings.simplefilter("ignore", RuntimeWarning)
                kernel[grid](*args, **kwargs)
            if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
                torch.cuda.synchronize()
        except Exception as exc:
            cause = exc.__cause__
            if type(exc).__name__ == "InterpreterError" and isinstance(cause, Exception):
                raise cause from None
            raise

    call_answer(run, what=what)


def _named_mistake(out: torch.Tensor, wrong: list[tuple[str, torch.Tensor]]) -> str | None:
    for message, candidate in wrong:
        if is_close(out, candidate, atol=_ATOL, rtol=_RTOL):
            return message
    return None


# ---------------------------------------------------------------------------------------
# log-sum-exp of long rows, block by block


#: The value of every entry past a row's end in the checker's buffers: a load that
#: forgets the edge mask reads it, and a large value moves the log-sum-exp visibly.
_LSE_GUARD = 30.0


def _logsumexp_probes(device: torch.device) -> list[tuple[torch.Tensor, int, int, str]]:
    """(buffer, num_cols, BLOCK, description): rows of ``num_cols`` real entries at the
    start of each row of ``buffer`` (num_rows, row_stride); the rest is the guard."""
    gen = torch.Generator().manual_seed(1114)

    def rows(num_rows: int, num_cols: int, block: int, shift: float = 0.0,
             rise: float = 0.0) -> torch.Tensor:
        last_end = math.ceil(num_cols / block) * block  # the end of the last block
        row_stride = last_end + 3  # not a multiple of the block
        buffer = torch.full((num_rows, row_stride), _LSE_GUARD, dtype=torch.float32)
        real = torch.randn(num_rows, num_cols, generator=gen)
        real = real + rise * torch.linspace(0.0, 1.0, num_cols)  # the maximum keeps growing
        buffer[:, :num_cols] = real + shift
        return buffer.to(device)

    return [
        (rows(3, 37, 16, rise=6.0), 37, 16,
         "3 rows of 37 entries that rise along the row, BLOCK=16 (the last block holds 5)"),
        (rows(2, 64, 16, rise=6.0), 64, 16, "2 rows of 64 entries, BLOCK=16 (4 full blocks)"),
        (rows(4, 5, 32), 5, 32, "4 rows of 5 entries, BLOCK=32 (one block, 27 lanes past "
                                "the end)"),
        (torch.cat([rows(1, 45, 16, shift=100.0), rows(1, 45, 16, shift=-120.0)]).to(device),
         45, 16, "2 rows of 45 entries near +100 and near -120, BLOCK=16"),
    ]


def _lse(x: torch.Tensor) -> torch.Tensor:
    """Row-wise log-sum-exp of a float64 (num_rows, n) tensor; -inf for n = 0."""
    if x.shape[-1] == 0:
        return torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    return torch.logsumexp(x, dim=-1)


def _lse_without_rescale(x: torch.Tensor, block: int) -> torch.Tensor:
    """The online log-sum-exp whose running sum is never rescaled when the maximum grows."""
    row_max = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    row_sum = torch.zeros_like(row_max)
    for start in range(0, x.shape[-1], block):
        part = x[:, start:start + block]
        row_max = torch.maximum(row_max, part.amax(dim=-1))
        row_sum = row_sum + torch.exp(part - row_max.unsqueeze(-1)).sum(dim=-1)
    return row_max + torch.log(row_sum)


def _logsumexp_wrong_answers(buffer: torch.Tensor, num_cols: int, block: int
                             ) -> list[tuple[str, torch.Tensor]]:
    """(message, what that mistake returns) for one probe, in float64."""
    x = buffer.double()
    num_rows = x.shape[0]
    real = x[:, :num_cols]
    last_end = math.ceil(num_cols / block) * block
    pad = last_end - num_cols
    flat = x.flatten()
    by_num_cols = torch.stack([flat[r * num_cols:(r + 1) * num_cols] for r in range(num_rows)])
    ln_sum_pow2 = _lse(real * math.log(2.0))  # ln(sum_j 2**x_j): exp2 of the raw x
    wrong = [
        ("loads past the row's end: the last block's lanes beyond num_cols read whatever "
         "follows the row (here the checker's guard values, 30.0). Load with "
         "mask=cols < num_cols", _lse(x[:, :last_end])),
        ("fills the masked lanes of the last block with 0.0 (other=0.0): each of them adds "
         "exp(0 - max) to the sum. Use other=float('-inf'), whose exp is 0 (without "
         "other, the masked lanes are undefined)",
         _lse(torch.cat([real, torch.zeros(num_rows, pad, dtype=x.dtype,
                                           device=x.device)], dim=-1))),
        ("reads one entry past the row's end: the mask must be cols < num_cols, not "
         "cols <= num_cols", _lse(x[:, :num_cols + 1])),
        ("skips the last, partial block: loop over range(0, num_cols, BLOCK), which "
         "includes a start that leaves fewer than BLOCK entries, and mask that block",
         _lse(real[:, :(num_cols // block) * block])),
        ("forgets to rescale the running sum when the maximum grows: multiply it by "
         "exp(m_old - m_new) before adding the new block, as in chapter 8's online "
         "softmax", _lse_without_rescale(real, block)),
        ("returns the log-sum-exp in base 2, log2(sum exp(x)): with exp2 and log2 the "
         "result must still be multiplied by ln 2 = 0.6931... at the end",
         _lse(real) * _LOG2_E),
        ("calls exp2 on x itself: exp(x) is exp2(x * log2(e)), so multiply x by "
         "log2(e) = 1.4427 first (or use tl.exp)", ln_sum_pow2),
        ("calls exp2 on x itself and returns base-2 units: exp(x) is "
         "exp2(x * log2(e)), and the result must be multiplied by ln 2 at the end",
         ln_sum_pow2 / math.log(2.0)),
        ("ignores row_stride: row r starts at x_ptr + r * row_stride, which need not be "
         "r * num_cols (the rows of a strided tensor, or of a padded buffer as here)",
         _lse(by_num_cols)),
    ]
    return [(message, answer) for message, answer in wrong
            if not is_close(answer, _lse(real), atol=_ATOL, rtol=_RTOL)]


def _judge_logsumexp(out_buffer: torch.Tensor, num_rows: int, buffer: torch.Tensor,
                     num_cols: int, block: int, what: str) -> None:
    out = out_buffer[:num_rows].double()
    if not torch.isnan(out_buffer[num_rows:]).all():
        raise CheckFailed(
            f"{what} writes past the end of out, which has one entry per row: store "
            "out_ptr + row, with row = tl.program_id(0).")
    unwritten = torch.isnan(out).nonzero().flatten().tolist()
    expected = _lse(buffer.double()[:, :num_cols])
    if unwritten:
        raise CheckFailed(
            f"{what} leaves out[{unwritten[0]}] unwritten (still nan): each program stores "
            "one number, the log-sum-exp of row tl.program_id(0), at out_ptr + row.")
    if is_close(out, expected, atol=_ATOL, rtol=_RTOL):
        return
    mistake = _named_mistake(out, _logsumexp_wrong_answers(buffer, num_cols, block))
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake}.")
    if (out == math.inf).any() or (out.isnan().any() and torch.isfinite(expected).all()):
        raise CheckFailed(
            f"{what} gives inf or nan on rows near +100, where exp overflows float32 (above "
            "about 88): subtract the running maximum inside every exp.")
    if (out == -math.inf).any():
        raise CheckFailed(
            f"{what} gives -inf on rows near -120, where every exp(x) underflows to 0 in "
            "float32: start the running maximum at -inf (tl.full([], float('-inf'), "
            "tl.float32)), not at 0, and subtract it inside every exp.")
    raise CheckFailed(
        f"{what} differs from torch.logsumexp by up to {max_difference(out, expected):.3g}, "
        "and it matches none of the typical mistakes this check knows. Print your "
        "running maximum and sum for one row, block by block, and compare with "
        "torch.logsumexp of the entries read so far.")


@checker
def check_logsumexp_kernel(kernel: Any, *, device: torch.device | str | None = None) -> bool:
    """Check a learner's Triton kernel for the log-sum-exp of each row, block by block.

    The checker launches ``kernel[(num_rows,)](x, out, num_cols, row_stride,
    BLOCK=block)``: program ``row`` must read row ``row`` of ``x`` (float32, its
    ``num_cols`` entries starting at ``x_ptr + row * row_stride``) ``BLOCK``
    entries at a time, keep a running maximum and sum (natural base, or base 2
    with ``exp2``), and store ``log(sum_j exp(x[row, j]))`` at ``out_ptr + row``.
    The probes have 37, 64, 5 and 45 columns with ``BLOCK`` 16 or 32 (a partial
    last block, whole blocks only, a row shorter than one block), rows whose
    maximum grows from block to block, and rows near +100 and -120 (where exp
    overflows or underflows float32). Past each row's end the buffer holds the
    guard value 30.0, and ``out`` has guard entries after its last row.

    Recognised mistakes: a load without the edge mask (reads the guard); masked
    lanes filled with 0.0 instead of ``-inf``; the mask ``cols <= num_cols``;
    the last, partial block skipped; the running sum not rescaled; a base-2
    result not multiplied by ln 2; ``exp2`` without the factor ``log2(e)``;
    ``row_stride`` ignored; overflow (no running maximum) and underflow (a
    running maximum started at 0); rows left unwritten or stores past ``out``;
    a plain Python function without ``@triton.jit``.

    Args:
        kernel: the learner's ``@triton.jit`` function
            ``kernel(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr)``.
        device: where to run it (keyword only); default the CPU when Triton was
            imported with ``TRITON_INTERPRET=1``, else CUDA.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``kernel`` is not a Triton kernel, raises (the stub's
            ``NotImplementedError`` included), or computes something else; the
            message names the mistake where it is a typical one.
        ImportError: Triton is not installed.
        RuntimeError: there is no CUDA GPU and Triton was imported without
            ``TRITON_INTERPRET=1``.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Milakov and Gimelshein (2018), "Online normalizer calculation for
    softmax", Algorithm 3; Dao (2023), "FlashAttention-2", Algorithm 1 (the
    log-sum-exp the forward pass saves).
    """
    device = _kernel_device(device)
    _require_kernel(kernel, "a log-sum-exp kernel(x_ptr, out_ptr, num_cols, row_stride, "
                            "BLOCK)")
    name = _kernel_name(kernel)
    for buffer, num_cols, block, probe in _logsumexp_probes(device):
        num_rows, row_stride = buffer.shape
        out = torch.full((num_rows + 4,), math.nan, dtype=torch.float32, device=device)
        before = buffer.clone()
        what = (f"{name}[({num_rows},)](x, out, num_cols={num_cols}, row_stride={row_stride}, "
                f"BLOCK={block}) on {probe}")
        _launch(kernel, (num_rows,), (buffer, out, num_cols, row_stride), {"BLOCK": block},
                what)
        if not torch.equal(before, buffer):
            raise CheckFailed(f"{what} changes x; store only into out.")
        _judge_logsumexp(out.cpu(), num_rows, buffer.cpu(), num_cols, block, what)
    return passed(f"{name} gives each row's log-sum-exp for rows of 5 to 64 entries, with a "
                  "partial last block, whole blocks only, a row shorter than one block, and "
                  "rows near +100 and -120.")


# ---------------------------------------------------------------------------------------
# D = rowsum(dO * O), FlashAttention-2's preprocessing


#: The value of every entry of the delta buffer before the launch: an entry past
#: num_rows that changes was written without the edge mask; a row still holding it
#: was never written.
_DELTA_SENTINEL = math.nan
#: The value of the guard rows after O and dO.
_DELTA_GUARD = 5.0


def _delta_probes(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, int, int,
                                                      str]]:
    """(out_buffer, grad_buffer, num_rows, BLOCK_M, description): O and dO are the first
    num_rows rows of buffers (num_rows + BLOCK_M, HEAD_DIM) whose other rows are guards."""
    gen = torch.Generator().manual_seed(2307)
    probes = []
    for num_rows, head_dim, block_m, probe in (
            (50, 16, 16, "50 rows of 16, BLOCK_M=16 (the last block holds 2 rows)"),
            (64, 32, 16, "64 rows of 32, BLOCK_M=16 (4 full blocks)"),
            (7, 64, 16, "7 rows of 64, BLOCK_M=16 (one block, 9 rows past the end)"),
            (40, 16, 32, "40 rows of 16, BLOCK_M=32")):
        buffers = []
        for _ in range(2):
            buffer = torch.full((num_rows + block_m, head_dim), _DELTA_GUARD)
            buffer[:num_rows] = torch.randn(num_rows, head_dim, generator=gen)
            buffers.append(buffer.to(device))
        probes.append((buffers[0], buffers[1], num_rows, block_m, probe))
    return probes


def _delta_wrong_answers(o: torch.Tensor, do: torch.Tensor, num_rows: int, block_m: int
                         ) -> list[tuple[str, torch.Tensor]]:
    """(message, what that mistake returns) in float64; o and do are the whole buffers."""
    o, do = o.double(), do.double()
    head_dim = o.shape[1]
    flat_o, flat_do = o.flatten(), do.flatten()
    index = torch.arange(num_rows).unsqueeze(-1) + torch.arange(head_dim)  # rows + dims
    wrong = []
    if head_dim == block_m:  # tl.sum(..., axis=0) then has the shape of a block of rows
        products = o[:num_rows] * do[:num_rows]
        column_sums = torch.cat([products[start:start + block_m].sum(0)
                                 for start in range(0, num_rows, block_m)])[:num_rows]
        wrong.append(("sums along axis 0, over the rows of the block: D_i sums row i of "
                      "dO * O over its HEAD_DIM entries, tl.sum(o * do, axis=1)", column_sums))
    return wrong + [
        ("sums dO alone: D_i = sum_k dO_ik * O_ik needs the product with the output O "
         "(the forward's output, out_ptr)", do[:num_rows].sum(-1)),
        ("sums O alone: D_i = sum_k dO_ik * O_ik needs the product with the upstream "
         "gradient dO (grad_out_ptr)", o[:num_rows].sum(-1)),
        ("steps from row to row by 1 instead of HEAD_DIM: the entry (i, k) of a "
         "contiguous (num_rows, HEAD_DIM) tensor is at i * HEAD_DIM + k, so the offsets "
         "are rows[:, None] * HEAD_DIM + dims[None, :]",
         (flat_o[index] * flat_do[index]).sum(-1)),
        ("sums the squares of dO: D_i is the dot product of row i of dO with row i of "
         "O", (do[:num_rows] ** 2).sum(-1)),
    ]


def _judge_delta(delta: torch.Tensor, o: torch.Tensor, do: torch.Tensor, num_rows: int,
                 block_m: int, what: str) -> None:
    if not torch.isnan(delta[num_rows:]).all():
        written = (~torch.isnan(delta[num_rows:])).nonzero().flatten()
        raise CheckFailed(
            f"{what} writes past the end of delta, at row {num_rows + int(written[0])}: the "
            "last program's block runs past num_rows, so tl.store needs "
            "mask=rows < num_rows (on a GPU this overwrites other memory).")
    unwritten = torch.isnan(delta[:num_rows]).nonzero().flatten().tolist()
    if unwritten:
        raise CheckFailed(
            f"{what} leaves delta[{unwritten[0]}] unwritten (and {len(unwritten) - 1} other "
            "rows): program p handles rows p * BLOCK_M ... p * BLOCK_M + BLOCK_M - 1, "
            "rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M).")
    out = delta[:num_rows].double()
    expected = (o[:num_rows].double() * do[:num_rows].double()).sum(-1)
    if is_close(out, expected, atol=_ATOL, rtol=_RTOL):
        return
    mistake = _named_mistake(out, _delta_wrong_answers(o, do, num_rows, block_m))
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake}.")
    raise CheckFailed(
        f"{what} differs from (O * dO).sum(-1) by up to {max_difference(out, expected):.3g}, "
        "and it matches none of the typical mistakes this check knows. Load a "
        "(BLOCK_M, HEAD_DIM) block of each, multiply them entry by entry, and sum along "
        "axis 1.")


@checker
def check_delta_kernel(kernel: Any, *, device: torch.device | str | None = None) -> bool:
    """Check a learner's Triton kernel for FlashAttention-2's ``D = rowsum(dO * O)``.

    The checker launches ``kernel[(cdiv(num_rows, BLOCK_M),)](out, grad_out, delta,
    num_rows, HEAD_DIM=head_dim, BLOCK_M=block_m)`` with ``out`` (O) and
    ``grad_out`` (dO) contiguous float32 ``(num_rows, HEAD_DIM)`` tensors and
    ``delta`` float32 ``(num_rows,)``: program ``p`` must load rows
    ``p * BLOCK_M`` to ``p * BLOCK_M + BLOCK_M - 1`` of both (masked past
    ``num_rows``), and store each row's ``sum_k dO_ik * O_ik``. The probes have
    50, 64, 7 and 40 rows of 16, 32 or 64, ``BLOCK_M`` 16 or 32 and never equal
    to ``HEAD_DIM`` twice; past ``num_rows`` each buffer has ``BLOCK_M`` guard
    rows, and ``delta``'s guard entries are watched.

    Recognised mistakes: a store without the edge mask (writes past
    ``num_rows``); rows never written (program ``p`` not offset by
    ``p * BLOCK_M``); the sum of dO alone, of O alone, or of dO squared; rows
    stepped by 1 instead of ``HEAD_DIM``; a changed input; a plain Python
    function without ``@triton.jit``.

    Args:
        kernel: the learner's ``@triton.jit`` function ``kernel(out_ptr,
            grad_out_ptr, delta_ptr, num_rows, HEAD_DIM: tl.constexpr,
            BLOCK_M: tl.constexpr)``.
        device: where to run it (keyword only); default the CPU when Triton was
            imported with ``TRITON_INTERPRET=1``, else CUDA.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``kernel`` is not a Triton kernel, raises (the stub's
            ``NotImplementedError`` included), or computes something else; the
            message names the mistake where it is a typical one.
        ImportError: Triton is not installed.
        RuntimeError: there is no CUDA GPU and Triton was imported without
            ``TRITON_INTERPRET=1``.
        TypeError, ValueError: ``device`` is not a device, or names CUDA on a
            machine without it.

    Source: Dao (2023), "FlashAttention-2", Algorithm 2, line 4 and Section
    3.1.2 (``D_i = rowsum(dO_i * O_i)``, which equals ``rowsum(P_i * dP_i)``).
    """
    device = _kernel_device(device)
    _require_kernel(kernel, "a kernel(out_ptr, grad_out_ptr, delta_ptr, num_rows, HEAD_DIM, "
                            "BLOCK_M)")
    name = _kernel_name(kernel)
    for o, do, num_rows, block_m, probe in _delta_probes(device):
        head_dim = o.shape[1]
        delta = torch.full((num_rows + block_m,), _DELTA_SENTINEL, device=device)
        before = [o.clone(), do.clone()]
        grid = (math.ceil(num_rows / block_m),)
        what = (f"{name}[{grid}](out, grad_out, delta, num_rows={num_rows}, "
                f"HEAD_DIM={head_dim}, BLOCK_M={block_m}) on {probe}")
        _launch(kernel, grid, (o, do, delta, num_rows),
                {"HEAD_DIM": head_dim, "BLOCK_M": block_m}, what)
        if not (torch.equal(before[0], o) and torch.equal(before[1], do)):
            raise CheckFailed(f"{what} changes out or grad_out; store only into delta.")
        _judge_delta(delta.cpu(), o.cpu(), do.cpu(), num_rows, block_m, what)
    return passed(f"{name} gives D = rowsum(dO * O) for 7 to 64 rows, with a partial last "
                  "block, whole blocks only and fewer rows than one block, and writes nothing "
                  "past the end.")


# ---------------------------------------------------------------------------------------
# a block size that fits shared memory


_BLOCKS = (16, 32, 64, 128, 256)


def _largest_block(head_dim: int, element_size: int, num_stages: int,
                   shared_memory_bytes: int, *, q_tiles: str = "once", kv_tiles: int = 2,
                   stages: bool = True, scale: int = 1, strict: bool = False,
                   powers_of_two: bool = True) -> int | None:
    """The largest block B (B_M = B_N = B) whose tiles fit, by the chapter's model
    ``element_size * head_dim * (B + num_stages * 2 * B)`` bytes, or by one slip of it.

    The slips: ``q_tiles`` ``"none"`` or ``"per_stage"`` (the Q tile left out, or
    counted once per stage); ``kv_tiles=1`` (K counted, V not); ``stages=False``
    (one K and one V tile whatever ``num_stages``); ``scale=8`` (bits, not bytes);
    ``strict`` (``<`` instead of ``<=``); ``powers_of_two=False`` (the largest
    integer B that fits).
    """
    q_rows = {"once": 1, "none": 0, "per_stage": num_stages}[q_tiles]
    rows_per_b = q_rows + (num_stages if stages else 1) * kv_tiles
    bytes_per_b = scale * element_size * head_dim * rows_per_b  # bytes of the tiles per B

    def fits(block: int) -> bool:
        used = block * bytes_per_b
        return used < shared_memory_bytes if strict else used <= shared_memory_bytes

    candidates = _BLOCKS if powers_of_two else range(1, shared_memory_bytes // bytes_per_b + 1)
    fitting = [block for block in candidates if fits(block)]
    return max(fitting) if fitting else None


#: (head_dim, element_size, num_stages, shared_memory_bytes) of each probe. 232448
#: bytes (227 KiB) is what one program may use on an H100; 229376 is exactly the
#: tiles of B = 128 at head_dim 128, bfloat16, 3 stages; at 73728 B = 128 fits only
#: without its Q tile.
_BLOCK_PROBES = (
    (64, 2, 3, 232448),
    (128, 2, 3, 232448),
    (128, 2, 4, 232448),
    (128, 4, 3, 232448),
    (64, 2, 2, 73728),
    (128, 2, 3, 229376),
    (32, 2, 1, 6144),
    (128, 4, 4, 32768),
)


def _block_wrong_answers() -> list[tuple[str, list[int | None]]]:
    """(message, the answers of that mistake on every probe)."""
    variants: list[tuple[str, dict[str, Any]]] = [
        ("counts one K tile and one V tile, whatever num_stages is: with num_stages "
         "stages, num_stages K tiles and num_stages V tiles are in shared memory at once, "
         "B * (1 + 2 * num_stages) rows of head_dim numbers in all", {"stages": False}),
        ("counts the K tiles but not the V tiles: each stage holds a tile of each, "
         "B * (1 + 2 * num_stages) rows in all", {"kv_tiles": 1}),
        ("leaves out the Q tile, which the program keeps for its whole loop: "
         "B * (1 + 2 * num_stages) rows in all", {"q_tiles": "none"}),
        ("multiplies the Q tile by num_stages too: Q is loaded once, before the loop, "
         "and only K and V are multi-buffered", {"q_tiles": "per_stage"}),
        ("counts bits, not bytes: element_size is already in bytes (2 for bfloat16, 4 "
         "for float32)", {"scale": 8}),
        ("rejects a block whose tiles fill shared memory exactly: it fits when its bytes "
         "are <= shared_memory_bytes, not only <", {"strict": True}),
        ("returns a block size that is not a power of two: tl.arange(0, BLOCK) needs a "
         "power of two, so choose among 16, 32, 64, 128 and 256",
         {"powers_of_two": False}),
    ]
    return [(message, [_largest_block(*probe, **slip) for probe in _BLOCK_PROBES])
            for message, slip in variants]


@checker
def check_block_size(fn: Callable[[int, int, int, int], int | None]) -> bool:
    """Check a learner's ``fn(head_dim, element_size, num_stages, shared_memory_bytes)``.

    ``fn`` must return the largest block ``B`` among 16, 32, 64, 128 and 256
    (a power of two, as ``tl.arange`` needs; ``B_M = B_N = B``) for which the
    forward kernel's tiles fit in ``shared_memory_bytes``, or ``None`` when
    none does. The chapter's model, which Triton's compiler matched byte for
    byte: one Q tile and ``num_stages`` K tiles and ``num_stages`` V tiles,
    ``element_size * head_dim * (B + 2 * num_stages * B)`` bytes. The probes
    cover bfloat16 and float32, 1 to 4 stages, head_dim 32 to 128, the 227 KiB
    a program may use on an H100, a limit met exactly, and one where nothing
    fits.

    Recognised mistakes: the stages forgotten; the V tiles forgotten; the Q
    tile forgotten, or counted once per stage; bits instead of bytes; ``<``
    instead of ``<=``; a block that is not a power of two; a result that is not
    an int or None.

    Args:
        fn: the learner's function, called with four ints.

    Returns:
        True, after printing one line, when every probe matches.

    Raises:
        CheckFailed: ``fn`` is not a function, raises, returns something other
            than an int or None, or computes another block; the message names
            the mistake where it is a typical one.

    Source: Triton 2's ``triton.ops.matmul``, which discarded configurations
    by shared memory, ``(BLOCK_M + BLOCK_N) * BLOCK_K * num_stages *
    element_size``; NVIDIA's Hopper tuning guide (227 KB per thread block);
    chapter 11, where Triton's compiler confirms the count for the forward
    kernel byte for byte.
    """
    require_callable(fn, "a function fn(head_dim, element_size, num_stages, "
                         "shared_memory_bytes)")
    name = answer_name(fn, "fn")
    answers: list[int | None] = []
    for probe in _BLOCK_PROBES:
        what = (f"{name}(head_dim={probe[0]}, element_size={probe[1]}, "
                f"num_stages={probe[2]}, shared_memory_bytes={probe[3]})")
        out = call_answer(fn, *probe, what=what)
        if isinstance(out, torch.Tensor) and out.numel() == 1 and not out.is_floating_point():
            out = int(out)
        if out is not None and (isinstance(out, bool) or not isinstance(out, int)):
            raise CheckFailed(
                f"{what} returned {type_name(out)} {out!r:.40}; expected an int, the block "
                "size (such as 64), or None when no block fits.")
        answers.append(out)
    expected = [_largest_block(*probe) for probe in _BLOCK_PROBES]
    if answers == expected:
        return passed(f"{name} picks the largest block that fits for 8 settings, bfloat16 "
                      "and float32, 1 to 4 stages, and says None when none fits.")
    for message, wrong in _block_wrong_answers():
        if answers == wrong:
            raise CheckFailed(f"{name} {message}.")
    first = next(i for i, (a, e) in enumerate(zip(answers, expected, strict=True)) if a != e)
    head_dim, element_size, num_stages, limit = _BLOCK_PROBES[first]
    right = expected[first]
    needed = ("" if right is None else
              f" (its tiles take {element_size * head_dim * right * (1 + 2 * num_stages)} "
              "bytes)")
    raise CheckFailed(
        f"{name}(head_dim={head_dim}, element_size={element_size}, num_stages={num_stages}, "
        f"shared_memory_bytes={limit}) returned {answers[first]!r}; the largest block that "
        f"fits is {right!r}{needed}. Count element_size * head_dim * (B + 2 * num_stages * "
        "B) bytes for each B and keep the largest that is <= shared_memory_bytes.")
