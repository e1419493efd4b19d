"""Checkers for chapter 11's exercises: Triton kernels, run as the learner wrote them.

* :func:`check_logsumexp_kernel` - ``kernel[(num_rows,)](x, out, num_cols, row_stride,
  BLOCK=...)``: each row's log-sum-exp, read ``BLOCK`` entries at a time with an
  online maximum and sum, the last block masked at the row's end.
* :func:`check_delta_kernel` - ``kernel[(cdiv(num_rows, BLOCK_M),)](out, grad_out, delta,
  num_rows, HEAD_DIM=..., BLOCK_M=...)``: FlashAttention-2's ``D = rowsum(dO * O)``,
  one block of rows per program, the last block masked.
* :func:`check_block_size` - ``fn(head_dim, element_size, num_stages,
  shared_memory_bytes)``: the largest power-of-two tile whose forward-pass tiles
  fit in shared memory. A plain function of integers, it is checked in
  ``attnlib.exercises.kernel_tiles`` with the chapter's other such checkers, and
  importable from here too.

The two kernel checkers launch the learner's ``@triton.jit`` function themselves:
on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton's first import), or compiled on CUDA tensors. Each tensor lies inside a
larger buffer whose extra entries hold known guard values, so a load without its
edge mask reads numbers the checker can name (or, for the delta kernel, nan, and
under the interpreter the checker records the addresses every ``tl.load`` reads),
and a store without it changes entries the checker watches, instead of touching
memory outside the tensors. Output entries start with a finite fill value, so an
unwritten entry is told from a nan the kernel computed. Before any launch the
kernel's code is read for Python globals and plain functions, which the
interpreter runs but Triton's compiler refuses (``attnlib.exercises._triton_runner``
launches the kernels). Triton is imported only when a kernel checker runs:
``import attnlib`` does not need it.

No message states the answer: each names what the kernel did and the section of
chapter 11 (or chapter 8's online softmax) that shows the step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._common import CheckFailed, checker, is_close, max_difference, passed
from ._triton_runner import kernel_device, kernel_name, launch, reads_outside, require_kernel
from .kernel_tiles import check_block_size

__all__ = ["check_logsumexp_kernel", "check_delta_kernel", "check_block_size"]

#: Tolerances for a float32 kernel against a float64 reference.
_ATOL = 1e-4
_RTOL = 1e-5
_LOG2_E = math.log2(math.e)


def _named_mistake(out: torch.Tensor, wrong: list[tuple[str, torch.Tensor]]) -> str | None:
    """The message of the first mistake in ``wrong`` that gives ``out``, or None."""
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


#: Where chapter 11 shows each part of the log-sum-exp kernel.
_SEE_MASKS = "See the row-softmax kernel of 'Triton's model: programs and blocks'"
_SEE_ONLINE = "Compare your loop with chapter 8's online softmax"
_SEE_EXP2 = ("See why the row-softmax kernel of 'Triton's model: programs and blocks' "
             "calls exp2, and what it multiplies x by")


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
         f"follows the row (here the checker's guard values, {_LSE_GUARD}), because the "
         f"load has no edge mask. {_SEE_MASKS}", _lse(x[:, :last_end])),
        ("fills the masked lanes of the last block with 0.0 (other=0.0): each of them adds "
         "exp(0 - max) to the sum (without other, the masked lanes are undefined). "
         f"{_SEE_MASKS}, and what FILL=0.0 does to it",
         _lse(torch.cat([real, torch.zeros(num_rows, pad, dtype=x.dtype,
                                           device=x.device)], dim=-1))),
        ("reads one entry past the row's end: a mask cols <= num_cols keeps the lane "
         f"cols == num_cols, which is not in the row. {_SEE_MASKS}",
         _lse(x[:, :num_cols + 1])),
        ("skips the last, partial block: the loop stops before a block that holds fewer "
         f"than BLOCK entries. {_SEE_MASKS}, whose mask handles such a block",
         _lse(real[:, :(num_cols // block) * block])),
        ("forgets to rescale the running sum when the maximum grows: the sum of the earlier "
         f"blocks stays relative to the old maximum. {_SEE_ONLINE}",
         _lse_without_rescale(real, block)),
        ("returns the log-sum-exp in base 2, log2(sum exp(x)): with exp2 and log2 the "
         "result is in base-2 units. See 'The forward kernel', whose log-sum-exp is "
         "converted from base 2 to the natural log", _lse(real) * _LOG2_E),
        (f"calls exp2 on x itself, which is 2**x, not e**x. {_SEE_EXP2}", ln_sum_pow2),
        ("calls exp2 on x itself (2**x, not e**x) and returns base-2 units. "
         f"{_SEE_EXP2}", ln_sum_pow2 / math.log(2.0)),
        ("ignores row_stride: it steps from row to row by num_cols, but the rows of a "
         "strided tensor (or of the padded buffer here) start row_stride entries apart, "
         "as the exercise says", _lse(by_num_cols)),
    ]
    return [(message, answer) for message, answer in wrong
            if not is_close(answer, _lse(real), atol=_ATOL, rtol=_RTOL)]


def _judge_logsumexp(out_buffer: torch.Tensor, unwritten_value: torch.Tensor, num_rows: int,
                     buffer: torch.Tensor, num_cols: int, block: int, what: str,
                     extreme: bool) -> None:
    """Raise CheckFailed unless ``out_buffer[:num_rows]`` holds each row's log-sum-exp and
    the guard entries after it still hold ``unwritten_value``, the checker's fill."""
    out = out_buffer[:num_rows].double()
    if not torch.equal(out_buffer[num_rows:], unwritten_value.expand(len(out_buffer) - num_rows)):
        raise CheckFailed(
            f"{what} writes past the end of out, which has one entry per row: each program "
            "stores exactly one number, at the entry of its own row.")
    unwritten = (out_buffer[:num_rows] == unwritten_value).nonzero().flatten().tolist()
    expected = _lse(buffer.double()[:, :num_cols])
    if unwritten:
        raise CheckFailed(
            f"{what} leaves out[{unwritten[0]}] unwritten (it still holds the value the "
            "checker put there): each program stores one number, the log-sum-exp of its "
            "row, tl.program_id(0), at that row's entry of out.")
    if is_close(out, expected, atol=_ATOL, rtol=_RTOL):
        return
    mistake = _named_mistake(out, _logsumexp_wrong_answers(buffer, num_cols, block))
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake}.")
    if extreme and ((out == math.inf).any() or out.isnan().any()):
        raise CheckFailed(
            f"{what} gives inf or nan on the row near +100, where exp overflows float32 "
            "(above about 88): an exponential of an entry is taken without the running "
            f"maximum subtracted. {_SEE_ONLINE}.")
    if extreme and (out == -math.inf).any():
        raise CheckFailed(
            f"{what} gives -inf on the row near -120, where every exp(x) underflows to 0 in "
            "float32 if the running maximum starts at 0 instead of below every entry. "
            f"{_SEE_ONLINE}.")
    computed_nan = out.isnan().nonzero().flatten().tolist()
    if computed_nan:
        raise CheckFailed(
            f"{what} stores nan for row {computed_nan[0]} (it wrote that nan: the entry is "
            "not unwritten). A nan comes from 0 * inf, inf - inf or 0 / 0; at the first "
            "block the running sum is 0 and the running maximum below every entry, so look "
            "at the rescale factor of the running sum there: is it the wrong way round? "
            f"{_SEE_ONLINE}.")
    raise CheckFailed(
        f"{what} differs from torch.logsumexp by up to {max_difference(out, expected):.3g}, "
        "and it matches none of the typical mistakes this check knows. Print your "
        "running maximum and sum for one row, block by block, and compare with "
        "torch.logsumexp of the entries read so far.")


#: What every entry of ``out`` (and ``delta``) holds before the launch: an entry that
#: still holds it was never written; one past the end that lost it was written without
#: the edge mask. Finite, so that a nan the kernel computed is told apart from it.
_UNWRITTEN = -1.2345e37


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
    guard value 30.0; ``out`` and the guard entries after its last row start with
    a finite fill value, so that an unwritten entry is told from a computed nan.

    Recognised mistakes: a load without the edge mask (reads the guard); masked
    lanes filled with 0.0 instead of ``-inf``; the mask ``cols <= num_cols``;
    the last, partial block skipped; the running sum not rescaled; a base-2
    result not converted to the natural log; ``exp2`` of ``x`` itself;
    ``row_stride`` ignored; overflow (no running maximum) and underflow (a
    running maximum started at 0); a computed nan (such as a rescale factor
    the wrong way round); rows left unwritten or stores past ``out``; a plain
    Python function without ``@triton.jit``; a Python global such as
    ``LOG2_E = math.log2(math.e)`` or a plain function used inside the kernel,
    which the interpreter runs but Triton's compiler refuses. No message
    states the answer: each names the mistake and where the chapter shows
    the right way.

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
    device = kernel_device(device)
    require_kernel(kernel, "a log-sum-exp kernel(x_ptr, out_ptr, num_cols, row_stride, "
                            "BLOCK)")
    name = kernel_name(kernel)
    unwritten = torch.tensor(_UNWRITTEN, dtype=torch.float32)
    for buffer, num_cols, block, probe in _logsumexp_probes(device):
        num_rows, row_stride = buffer.shape
        out = torch.full((num_rows + 4,), _UNWRITTEN, dtype=torch.float32, device=device)
        before = buffer.clone()
        what = (f"{name}[({num_rows},)](x, out, num_cols={num_cols}, row_stride={row_stride}, "
                f"BLOCK={block}) on {probe}")
        launch(kernel, (num_rows,), (buffer, out, num_cols, row_stride), {"BLOCK": block},
                what)
        if not torch.equal(before, buffer):
            raise CheckFailed(f"{what} changes x; store only into out.")
        _judge_logsumexp(out.cpu(), unwritten, num_rows, buffer.cpu(), num_cols, block, what,
                         extreme="near +100" in probe)
    return passed(f"{name} gives each row's log-sum-exp for rows of 5 to 64 entries, with a "
                  "partial last block, whole blocks only, a row shorter than one block, and "
                  "rows near +100 and -120.")


# ---------------------------------------------------------------------------------------
# D = rowsum(dO * O), FlashAttention-2's preprocessing


#: The value of the guard rows after O and dO, outside the tensors the kernel gets: a
#: load without its edge mask reads them, and nan poisons whatever it enters.
_DELTA_GUARD = math.nan

_SEE_EDGE_MASKS = "See 'Masks at the edges' in 'The forward kernel'"
_SEE_LAYOUT = "See 'Where the data is' in 'The forward kernel'"
_SEE_BACKWARD = "See 'The backward pass, derived'"


def _delta_probes(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, int, int,
                                                      str]]:
    """(out_buffer, grad_buffer, num_rows, BLOCK_M, description): O and dO are the first
    num_rows rows of buffers (num_rows + BLOCK_M, HEAD_DIM) whose other rows are guards.

    The last two probes are float16 and bfloat16, as O and dO are in training: in
    float16 their entries' products pass 65504, float16's largest number, so a kernel
    that multiplies them without converting them to float32 first gets inf.
    """
    gen = torch.Generator().manual_seed(2307)
    probes = []
    for num_rows, head_dim, block_m, dtype, scale, probe in (
            (50, 16, 16, torch.float32, 1.0,
             "50 rows of 16, BLOCK_M=16 (the last block holds 2 rows)"),
            (64, 32, 16, torch.float32, 1.0, "64 rows of 32, BLOCK_M=16 (4 full blocks)"),
            (7, 64, 16, torch.float32, 1.0,
             "7 rows of 64, BLOCK_M=16 (one block, 9 rows past the end)"),
            (40, 16, 32, torch.float32, 1.0, "40 rows of 16, BLOCK_M=32"),
            (20, 32, 16, torch.float16, 300.0,
             "20 rows of 32 in float16, entries near +-300, BLOCK_M=16"),
            (20, 32, 16, torch.bfloat16, 1.0, "20 rows of 32 in bfloat16, BLOCK_M=16")):
        buffers = []
        for _ in range(2):
            buffer = torch.full((num_rows + block_m, head_dim), _DELTA_GUARD, dtype=dtype)
            buffer[:num_rows] = (torch.randn(num_rows, head_dim, generator=gen) * scale
                                 ).to(dtype)
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
                      "dO * O over its HEAD_DIM entries", column_sums))
    return wrong + [
        ("sums dO alone: D_i needs the product of dO with the output O (the forward's "
         f"output, out_ptr). {_SEE_BACKWARD}", do[:num_rows].sum(-1)),
        ("sums O alone: D_i needs the product of O with the upstream gradient dO "
         f"(grad_out_ptr). {_SEE_BACKWARD}", o[:num_rows].sum(-1)),
        ("steps from row to row by 1 instead of HEAD_DIM: in a contiguous (num_rows, "
         f"HEAD_DIM) tensor consecutive rows lie HEAD_DIM entries apart. {_SEE_LAYOUT}",
         (flat_o[index] * flat_do[index]).sum(-1)),
        ("sums the squares of dO: D_i multiplies row i of dO with row i of O. "
         f"{_SEE_BACKWARD}", (do[:num_rows] ** 2).sum(-1)),
    ]


def _judge_delta(delta: torch.Tensor, unwritten_value: torch.Tensor, o: torch.Tensor,
                 do: torch.Tensor, num_rows: int, block_m: int, what: str) -> None:
    """Raise CheckFailed unless ``delta[:num_rows]`` holds each row's sum of dO * O and the
    entries after it still hold ``unwritten_value``, the checker's fill."""
    past_end = delta[num_rows:] != unwritten_value
    if past_end.any():
        written = past_end.nonzero().flatten()
        raise CheckFailed(
            f"{what} writes past the end of delta, at row {num_rows + int(written[0])}: the "
            "last program's block runs past num_rows and its store has no edge mask (on a "
            f"GPU this overwrites other memory). {_SEE_EDGE_MASKS}.")
    unwritten = (delta[:num_rows] == unwritten_value).nonzero().flatten().tolist()
    if unwritten:
        raise CheckFailed(
            f"{what} leaves delta[{unwritten[0]}] unwritten (and {len(unwritten) - 1} other "
            "rows): no program stores those rows. Program p handles the p-th block of "
            "BLOCK_M rows, as the exercise says.")
    out = delta[:num_rows].double()
    expected = (o[:num_rows].double() * do[:num_rows].double()).sum(-1)
    if is_close(out, expected, atol=_ATOL, rtol=_RTOL):
        return
    mistake = _named_mistake(out, _delta_wrong_answers(o, do, num_rows, block_m))
    if mistake is not None:
        raise CheckFailed(f"{what} {mistake}.")
    if o.dtype in (torch.float16, torch.bfloat16):
        error = ("gives inf or nan" if not torch.isfinite(out).all() else
                 f"is off by up to {max_difference(out, expected):.3g}")
        raise CheckFailed(
            f"{what} computes in {str(o.dtype).replace('torch.', '')}, not float32, and "
            f"{error}: the loaded blocks are "
            "multiplied before they are converted with .to(tl.float32), as the exercise asks "
            "(in float16 products above 65504 become inf; bfloat16 keeps 8 bits of each "
            "product). The float32 probes before this one passed.")
    computed_nan = out.isnan().nonzero().flatten().tolist()
    if computed_nan:
        raise CheckFailed(
            f"{what} stores nan for row {computed_nan[0]} (it wrote that nan: the entry is "
            "not unwritten). The rows after num_rows in the checker's buffers hold nan: does "
            f"a load without its edge mask reach into them? {_SEE_EDGE_MASKS}.")
    raise CheckFailed(
        f"{what} differs from (O * dO).sum(-1) by up to {max_difference(out, expected):.3g}, "
        "and it matches none of the typical mistakes this check knows. Print the block of "
        "offsets of one program and check which entries of O and dO they address.")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` hold the same bytes (nan equal to nan, unlike torch.equal)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _name_unmasked_load(reads: list[Any], o: torch.Tensor, do: torch.Tensor,
                        delta: torch.Tensor, what: str) -> None:
    """Raise CheckFailed if the kernel loaded anything outside O, dO and delta."""
    outside = reads_outside(reads, [o, do, delta])
    if not outside.size:
        return
    row_bytes = o.shape[1] * o.element_size()
    place = "memory outside out, grad_out and delta"
    for name, tensor in (("out", o), ("grad_out", do)):
        rows = (outside.astype("int64") - tensor.data_ptr()) // row_bytes
        past_end = rows[(rows >= tensor.shape[0]) & (rows < 2 * tensor.shape[0])]
        if past_end.size:
            place = f"row {int(past_end.min())} of {name}, which has {tensor.shape[0]} rows"
            break
    raise CheckFailed(
        f"{what} loads {place}: the loads of the last block have no edge mask. The "
        "checker keeps such a read harmless (its values never reach a stored row), but on a "
        "GPU it reads memory outside the tensors, which compute-sanitizer reports as an "
        f"invalid global read. {_SEE_EDGE_MASKS}.")


@checker
def check_delta_kernel(kernel: Any, *, device: torch.device | str | None = None) -> bool:
    """Check a learner's Triton kernel for FlashAttention-2's ``D = rowsum(dO * O)``.

    The checker launches ``kernel[(cdiv(num_rows, BLOCK_M),)](out, grad_out, delta,
    num_rows, HEAD_DIM=head_dim, BLOCK_M=block_m)`` with ``out`` (O) and
    ``grad_out`` (dO) contiguous ``(num_rows, HEAD_DIM)`` tensors and ``delta``
    float32 ``(num_rows,)``: program ``p`` must load rows ``p * BLOCK_M`` to
    ``p * BLOCK_M + BLOCK_M - 1`` of both (masked past ``num_rows``), convert
    them to float32, and store each row's ``sum_k dO_ik * O_ik``. The probes have
    50, 64, 7 and 40 rows of 16, 32 or 64 in float32, ``BLOCK_M`` 16 or 32 and
    never equal to ``HEAD_DIM`` twice, then 20 rows in float16 (entries near
    +-300, whose products overflow float16) and in bfloat16. Each tensor is the
    start of a buffer whose ``BLOCK_M`` further rows hold nan; under the
    interpreter the checker records the addresses every ``tl.load`` reads, and
    ``delta``'s guard entries, like its own rows, start with a finite fill value
    that tells an unwritten entry from a computed nan.

    Recognised mistakes: a load without the edge mask (a read past ``num_rows``;
    recorded under the interpreter only, compiled kernels are not watched); a
    store without it (writes past ``num_rows``); rows never written (program
    ``p`` not offset by ``p * BLOCK_M``); the product taken in float16 or
    bfloat16 (no ``.to(tl.float32)``); the sum along axis 0; the sum of dO
    alone, of O alone, or of dO squared; rows stepped by 1 instead of
    ``HEAD_DIM``; a computed nan; a changed input; a plain Python function
    without ``@triton.jit``; a Python global or plain function used inside the
    kernel (accepted by the interpreter, refused by Triton's compiler).

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
    device = kernel_device(device)
    require_kernel(kernel, "a kernel(out_ptr, grad_out_ptr, delta_ptr, num_rows, HEAD_DIM, "
                            "BLOCK_M)")
    name = kernel_name(kernel)
    unwritten = torch.tensor(_UNWRITTEN, dtype=torch.float32)
    for o_buffer, do_buffer, num_rows, block_m, probe in _delta_probes(device):
        head_dim = o_buffer.shape[1]
        o, do = o_buffer[:num_rows], do_buffer[:num_rows]  # the guard rows lie after them
        delta_buffer = torch.full((num_rows + block_m,), _UNWRITTEN, dtype=torch.float32,
                                  device=device)
        delta = delta_buffer[:num_rows]
        before = [o_buffer.clone(), do_buffer.clone()]
        grid = (math.ceil(num_rows / block_m),)
        what = (f"{name}[{grid}](out, grad_out, delta, num_rows={num_rows}, "
                f"HEAD_DIM={head_dim}, BLOCK_M={block_m}) on {probe}")
        reads = launch(kernel, grid, (o, do, delta, num_rows),
                        {"HEAD_DIM": head_dim, "BLOCK_M": block_m}, what)
        if not (_same_bits(before[0], o_buffer) and _same_bits(before[1], do_buffer)):
            raise CheckFailed(f"{what} changes out or grad_out; store only into delta.")
        _judge_delta(delta_buffer.cpu(), unwritten, o_buffer.cpu(), do_buffer.cpu(),
                     num_rows, block_m, what)
        _name_unmasked_load(reads, o, do, delta, what)
    return passed(f"{name} gives D = rowsum(dO * O) for 7 to 64 rows, with a partial last "
                  "block, whole blocks only and fewer rows than one block, in float32, "
                  "float16 and bfloat16, and reads and writes nothing past the end.")
