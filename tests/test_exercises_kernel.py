"""attnlib.exercises.kernel: check_logsumexp_kernel and check_delta_kernel.

Each checker accepts the book's solution and rejects each typical wrong answer with a
message that names it (one learner's kernel per mistake, written here as a learner
would write it); the global random state is unchanged after every check.

The kernel checkers run Triton kernels: on the CPU this file sets TRITON_INTERPRET=1
before Triton's first import, as tests/test_flash_triton.py does, and the kernels run in
Triton's interpreter (the whole file takes seconds); where CUDA exists they run compiled.
The file is skipped where Triton is not installed.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from _triton_helpers import CUDA, import_triton  # sets TRITON_INTERPRET first

triton, _ = import_triton(reason="Triton is not installed: kernel checkers untested")
import triton.language as tl  # noqa: E402

from attnlib.exercises import (  # noqa: E402
    CheckFailed,
    check_delta_kernel,
    check_logsumexp_kernel,
)

# ---------------------------------------------------------------------------
# check_logsumexp_kernel: the book's solution and one kernel per mistake
# ---------------------------------------------------------------------------


@triton.jit
def logsumexp_kernel(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """The solution printed in chapter 11."""
    row = tl.program_id(0)
    row_max = tl.full([], float("-inf"), tl.float32)  # m, in base-2 units
    row_sum = tl.zeros([], tl.float32)  # l
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))
        x = x * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        row_sum = row_sum * tl.exp2(row_max - new_max) + tl.sum(tl.exp2(x - new_max), axis=0)
        row_max = new_max
    tl.store(out_ptr + row, (row_max + tl.log2(row_sum)) * 0.6931471805599453)  # ln 2


@triton.jit
def lse_natural_base(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Right, with tl.exp and tl.log and a running maximum started at -1e30."""
    row = tl.program_id(0)
    m = tl.full([], -1e30, tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols, other=-1e30)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_no_mask(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        x = tl.load(x_ptr + row * row_stride + start + tl.arange(0, BLOCK))
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_other_zero(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols, other=0.0)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_off_by_one(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols <= num_cols,
                    other=float("-inf"))
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_whole_blocks_only(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for b in range(0, num_cols // BLOCK):
        cols = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_no_rescale(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=0))  # updated first: the old maximum is lost
        s = s + tl.sum(tl.exp(x - m), axis=0)
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_base_two(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf")) * 1.4426950408889634
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp2(m - new_m) + tl.sum(tl.exp2(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log2(s))  # no * ln 2


@triton.jit
def lse_exp2_unscaled(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))  # no * log2(e)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp2(m - new_m) + tl.sum(tl.exp2(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, (m + tl.log2(s)) * 0.6931471805599453)


@triton.jit
def lse_exp2_unscaled_base_two(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp2(m - new_m) + tl.sum(tl.exp2(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log2(s))


@triton.jit
def lse_ignores_row_stride(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * num_cols + cols, mask=cols < num_cols, other=float("-inf"))
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_no_max(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))
        s = s + tl.sum(tl.exp(x), axis=0)
    tl.store(out_ptr + row, tl.log(s))


@triton.jit
def lse_max_starts_at_zero(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.zeros([], tl.float32)
    s = tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols,
                    other=float("-inf"))
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    tl.store(out_ptr + row, m + tl.log(s))


@triton.jit
def lse_stores_one_row_later(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols, other=float("-inf"))
    m = tl.max(x, axis=0)
    tl.store(out_ptr + row + 1, m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


@triton.jit
def lse_first_block_only(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * row_stride + cols, mask=cols < num_cols, other=float("-inf"))
    m = tl.max(x, axis=0)
    tl.store(out_ptr + row, m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


@triton.jit
def lse_writes_into_x(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(x_ptr + row * row_stride + cols, tl.zeros([BLOCK], tl.float32),
             mask=cols < num_cols)
    tl.store(out_ptr + row, 0.0)


LOG2_E = math.log2(math.e)  # a plain Python float, as chapter 11's second code cell has it
LN_2 = tl.constexpr(math.log(2.0))  # a constexpr global: the compiler accepts it
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def lse_python_global(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Right under the interpreter, but compiled Triton refuses the float global LOG2_E."""
    base = x_ptr + tl.program_id(0) * row_stride
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    for b in range(0, tl.cdiv(num_cols, BLOCK)):
        cols = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < num_cols, other=float("-inf")) * LOG2_E
        m_next = tl.maximum(m, tl.max(x, axis=0))
        total = tl.exp2(m - m_next) * total + tl.sum(tl.exp2(x - m_next), axis=0)
        m = m_next
    tl.store(out_ptr + tl.program_id(0), (m + tl.log2(total)) * LN_2)


def natural_log(x):
    return x * 0.6931471805599453


@triton.jit
def lse_plain_helper(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Calls a plain Python function inside the kernel (refused before any launch)."""
    tl.store(out_ptr + tl.program_id(0), natural_log(tl.load(x_ptr)))


@triton.jit
def to_natural_log(x):
    return x * LN_2_FLOAT


LN_2_FLOAT = 0.6931471805599453


@triton.jit
def lse_global_in_jitted_helper(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Calls a @triton.jit helper, which reads a float global (refused before any launch)."""
    tl.store(out_ptr + tl.program_id(0), to_natural_log(tl.load(x_ptr)))


@triton.jit
def online_step(m, total, x):
    m_next = tl.maximum(m, tl.max(x, axis=0))
    return m_next, total * tl.exp(m - m_next) + tl.sum(tl.exp(x - m_next), axis=0)


@triton.jit
def lse_jitted_helper(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Right: it reads a tl.constexpr global and calls a @triton.jit helper, both of which
    the compiler accepts."""
    row = tl.program_id(0)
    m, total = tl.full([], NEG_INF, tl.float32), tl.zeros([], tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m, total = online_step(m, total, tl.load(x_ptr + row * row_stride + cols,
                                                 mask=cols < num_cols, other=NEG_INF))
    tl.store(out_ptr + row, m + tl.log(total))


@triton.jit
def lse_inverted_rescale(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """The rescale factor the wrong way round: exp(new - old), inf at the first block."""
    row_ptr = x_ptr + tl.program_id(0) * row_stride
    running = tl.zeros([], tl.float32)
    biggest = tl.full([], float("-inf"), tl.float32)
    for start in range(0, num_cols, BLOCK):
        lanes = start + tl.arange(0, BLOCK)
        block = tl.load(row_ptr + lanes, mask=lanes < num_cols, other=float("-inf"))
        grown = tl.maximum(biggest, tl.max(block, axis=0))
        running = running * tl.exp(grown - biggest) + tl.sum(tl.exp(block - grown), axis=0)
        biggest = grown
    tl.store(out_ptr + tl.program_id(0), biggest + tl.log(running))


@triton.jit
def lse_stores_nothing_for_row_one(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    """Row 1 is never stored (the others get a wrong value: unwritten is named first)."""
    row = tl.program_id(0)
    tl.store(out_ptr + row, tl.load(x_ptr + row * row_stride), mask=row != 1)


@triton.jit
def lse_stub(x_ptr, out_ptr, num_cols, row_stride, BLOCK: tl.constexpr):
    raise NotImplementedError("write the kernel")


def test_logsumexp_accepts_the_book_solution(capsys):
    assert check_logsumexp_kernel(logsumexp_kernel) is True
    assert capsys.readouterr().out.startswith("Correct: logsumexp_kernel gives")


def test_logsumexp_accepts_natural_base_and_a_finite_start():
    assert check_logsumexp_kernel(lse_natural_base) is True


def test_logsumexp_accepts_constexpr_globals_and_jitted_helpers():
    # What compiled Triton accepts inside a kernel: a tl.constexpr global, a @triton.jit
    # function; the check must not refuse them with the Python globals.
    assert check_logsumexp_kernel(lse_jitted_helper) is True


def test_the_python_global_kernel_is_right_under_the_interpreter():
    # The kernel the check refuses computes the right numbers here: only the compiler
    # would refuse it, so the check must find it without running it.
    if CUDA:
        pytest.skip("compiled, the kernel does not build")
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    out = torch.empty(3)
    lse_python_global[(3,)](x, out, 40, 40, BLOCK=16)
    torch.testing.assert_close(out, torch.logsumexp(x, dim=-1))


@pytest.mark.parametrize(
    ("kernel", "named"),
    [
        # The guard values past the row's end are finite: a load without its mask moves
        # the log-sum-exp by a number the checker can name, not to inf or nan.
        pytest.param(lse_no_mask, r"loads past the row's end.*guard values, [0-9.]+\).*"
                                  "no edge mask", id="no-mask"),
        pytest.param(lse_other_zero, r"fills the masked lanes .* with 0\.0", id="other-zero"),
        pytest.param(lse_off_by_one, "reads one entry past.*cols <= num_cols",
                     id="off-by-one"),
        pytest.param(lse_whole_blocks_only, "skips the last, partial block", id="last-block"),
        pytest.param(lse_no_rescale, "forgets to rescale the running sum", id="no-rescale"),
        pytest.param(lse_base_two, "returns the log-sum-exp in base 2", id="base-two"),
        pytest.param(lse_exp2_unscaled, r"calls exp2 on x itself, which is 2\*\*x",
                     id="exp2-unscaled"),
        pytest.param(lse_exp2_unscaled_base_two, r"calls exp2 on x itself \(2\*\*x, not e\*\*x\) "
                                                 "and returns base-2",
                     id="exp2-unscaled-base-two"),
        pytest.param(lse_ignores_row_stride, "ignores row_stride", id="row-stride"),
        pytest.param(lse_no_max, "inf or nan on the row near \\+100.*without the running "
                                 "maximum subtracted", id="overflow"),
        pytest.param(lse_max_starts_at_zero, "-inf on the row near -120.*starts at 0",
                     id="max-starts-at-0"),
        pytest.param(lse_stores_one_row_later, "writes past the end of out", id="store-past-out"),
        pytest.param(lse_first_block_only, "differs from torch.logsumexp by up to",
                     id="something-else"),
        pytest.param(lse_writes_into_x, "changes x", id="in-place"),
        pytest.param(lse_stub, "raised NotImplementedError: replace the stub", id="stub"),
        pytest.param(lse_python_global, "reads the Python global LOG2_E \\(float\\) inside "
                                        "the kernel.*fails to compile", id="python-global"),
        pytest.param(lse_plain_helper, "calls the plain Python function natural_log \\("
                                       "function\\) inside the kernel", id="plain-helper"),
        pytest.param(lse_global_in_jitted_helper, r"reads the Python global LN_2_FLOAT .*"
                                                  r"\(in to_natural_log, which "
                                                  r"lse_global_in_jitted_helper calls\)",
                     id="global-in-jitted-helper"),
        pytest.param(lse_inverted_rescale, r"stores nan for row 0 \(it wrote that nan: the "
                                           r"entry is not unwritten\).*rescale factor",
                     id="computed-nan"),
        pytest.param(lse_stores_nothing_for_row_one, r"leaves out\[1\] unwritten",
                     id="unwritten"),
    ],
)
def test_logsumexp_names_each_wrong_answer(kernel, named):
    with pytest.raises(CheckFailed, match=named):
        check_logsumexp_kernel(kernel)


def test_logsumexp_message_names_the_launch_and_the_probe():
    with pytest.raises(CheckFailed, match=r"lse_no_mask\[\(3,\)\]\(x, out, num_cols=37, "
                                          r"row_stride=51, BLOCK=16\) on 3 rows of 37"):
        check_logsumexp_kernel(lse_no_mask)


def plain_logsumexp(x_ptr, out_ptr, num_cols, row_stride, BLOCK):
    return None


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param(plain_logsumexp, "plain Python function plain_logsumexp: put @triton.jit",
                     id="not-jitted"),
        pytest.param("logsumexp_kernel", "a function, but got str", id="string"),
        pytest.param(torch.zeros(3), "but got torch.Tensor", id="tensor"),
        pytest.param(torch.nn.Linear, "a function, but got type", id="class"),
    ],
)
def test_logsumexp_nonsense(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_logsumexp_kernel(answer)


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [(3, TypeError, "device must be a torch.device"),
     pytest.param("cuda", ValueError, "no CUDA GPU",
                  marks=pytest.mark.skipif(CUDA, reason="CUDA is here"))],
)
def test_kernel_checkers_reject_a_bad_device(device, error, match):
    for check in (check_logsumexp_kernel, check_delta_kernel):
        with pytest.raises(error, match=match):
            check(logsumexp_kernel, device=device)


# ---------------------------------------------------------------------------
# check_delta_kernel
# ---------------------------------------------------------------------------


@triton.jit
def delta_kernel(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The solution printed in chapter 11."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    row_ok = rows < num_rows  # the edge mask of the last block
    offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=row_ok)


@triton.jit
def delta_store_unmasked(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets)
    do = tl.load(grad_out_ptr + offsets)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1))


@triton.jit
def delta_no_block_offset(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=row_ok)


@triton.jit
def delta_grad_only(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(do, axis=1), mask=row_ok)


@triton.jit
def delta_out_only(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(o, axis=1), mask=row_ok)


@triton.jit
def delta_grad_squared(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(do * do, axis=1), mask=row_ok)


@triton.jit
def delta_row_step_one(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] + tl.arange(0, HEAD_DIM)[None, :]  # no * HEAD_DIM
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=row_ok)


@triton.jit
def delta_wrong_axis(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=0), mask=row_ok)


@triton.jit
def delta_writes_into_out(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(grad_out_ptr + offsets, mask=row_ok[:, None], other=0.0)
    tl.store(out_ptr + offsets, o * do, mask=row_ok[:, None])
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=row_ok)


@triton.jit
def block_offsets(BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A learner's helper: this program's rows and its (BLOCK_M, HEAD_DIM) offsets."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows, rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def delta_loads_unmasked(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Only the store is masked: the loads of the last block read past the tensors."""
    rows, offsets = block_offsets(BLOCK_M, HEAD_DIM)
    o = tl.load(out_ptr + offsets).to(tl.float32)
    do = tl.load(grad_out_ptr + offsets).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < num_rows)


@triton.jit
def delta_no_cast(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Right in float32; in float16 the products overflow."""
    rows, offsets = block_offsets(BLOCK_M, HEAD_DIM)
    o = tl.load(out_ptr + offsets, mask=(rows < num_rows)[:, None], other=0.0)
    do = tl.load(grad_out_ptr + offsets, mask=(rows < num_rows)[:, None], other=0.0)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < num_rows)


@triton.jit
def delta_cast_after_product(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    rows, offsets = block_offsets(BLOCK_M, HEAD_DIM)
    keep = (rows < num_rows)[:, None]
    product = (tl.load(out_ptr + offsets, mask=keep, other=0.0)
               * tl.load(grad_out_ptr + offsets, mask=keep, other=0.0))
    tl.store(delta_ptr + rows, tl.sum(product.to(tl.float32), axis=1), mask=rows < num_rows)


@triton.jit
def delta_float64_inside(out_ptr, grad_out_ptr, delta_ptr, num_rows,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Right: converted to float64 instead of float32, with tl.where for the edge."""
    rows, offsets = block_offsets(BLOCK_M, HEAD_DIM)
    row_ok = rows < num_rows
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None]).to(tl.float64)
    products = tl.where(row_ok[:, None], o * tl.load(grad_out_ptr + offsets,
                                                     mask=row_ok[:, None]).to(tl.float64), 0.0)
    tl.store(delta_ptr + rows, tl.sum(products, axis=1).to(tl.float32), mask=row_ok)


@triton.jit
def delta_stub(out_ptr, grad_out_ptr, delta_ptr, num_rows,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    raise NotImplementedError("compute D = rowsum(dO * O)")


def test_delta_accepts_the_book_solution(capsys):
    assert check_delta_kernel(delta_kernel) is True
    assert capsys.readouterr().out.startswith("Correct: delta_kernel gives D = rowsum(dO * O)")


def test_delta_accepts_float64_inside_and_a_mask_by_tl_where():
    assert check_delta_kernel(delta_float64_inside) is True


@pytest.mark.parametrize(
    ("kernel", "named"),
    [
        pytest.param(delta_store_unmasked, "writes past the end of delta, at row 50.*"
                                           "store has no edge mask", id="store-unmasked"),
        pytest.param(delta_loads_unmasked, "loads row 50 of out, which has 50 rows: the loads "
                                           "of the last block have no edge mask",
                     id="loads-unmasked"),
        pytest.param(delta_no_cast, "computes in float16, not float32.*.to\\(tl.float32\\)",
                     id="no-cast"),
        pytest.param(delta_cast_after_product, "computes in float16, not float32",
                     id="cast-after-product"),
        pytest.param(delta_no_block_offset, r"leaves delta\[19\] unwritten.*p-th block",
                     id="no-offset"),
        pytest.param(delta_grad_only, "sums dO alone", id="grad-only"),
        pytest.param(delta_out_only, "sums O alone", id="out-only"),
        pytest.param(delta_grad_squared, "sums the squares of dO", id="grad-squared"),
        pytest.param(delta_row_step_one, "steps from row to row by 1 instead of HEAD_DIM",
                     id="row-step"),
        pytest.param(delta_wrong_axis, "sums along axis 0", id="wrong-axis"),
        pytest.param(delta_writes_into_out, "changes out or grad_out", id="in-place"),
        pytest.param(delta_stub, "raised NotImplementedError: replace the stub", id="stub"),
    ],
)
def test_delta_names_each_wrong_answer(kernel, named):
    with pytest.raises(CheckFailed, match=named):
        check_delta_kernel(kernel)


def test_delta_reports_a_kernel_that_fails_to_run():
    # The log-sum-exp kernel has other arguments: the launch fails inside Triton, and the
    # check says so instead of showing Triton's stack.
    with pytest.raises(CheckFailed, match=r"^logsumexp_kernel\[\(4,\)\]\(out, grad_out, delta, "
                                          r"num_rows=50, .* raised "):
        check_delta_kernel(logsumexp_kernel)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param(lambda *args: None, "plain Python function fn: put @triton.jit",
                     id="not-jitted"),
        pytest.param(None, "a function, but got NoneType", id="none"),
    ],
)
def test_delta_nonsense(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_delta_kernel(answer)


# ---------------------------------------------------------------------------
# every checker
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("check, answer", [
    (check_logsumexp_kernel, logsumexp_kernel), (check_logsumexp_kernel, lse_no_mask),
    (check_delta_kernel, delta_kernel)])
def test_checkers_leave_the_random_state_alone(check, answer):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    try:
        check(answer)
    except CheckFailed:
        pass
    torch.testing.assert_close(torch.rand(3), expected)


_FRESH_PROCESS = """
import os, torch
os.environ.pop("TRITON_INTERPRET", None)
import triton, triton.language as tl
from attnlib.exercises import check_delta_kernel

@triton.jit
def kernel(out_ptr, grad_out_ptr, delta_ptr, num_rows, HEAD_DIM: tl.constexpr,
           BLOCK_M: tl.constexpr):
    pass

try:
    check_delta_kernel(kernel)
except RuntimeError as err:
    print("RuntimeError:", err)
"""


@pytest.mark.skipif(CUDA, reason="with CUDA the kernel runs compiled")
def test_without_the_interpreter_a_cpu_check_says_how_to_switch_it_on(tmp_path):
    script = tmp_path / "check_without_interpreter.py"  # @triton.jit needs a source file
    script.write_text(_FRESH_PROCESS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "RuntimeError: a Triton kernel runs on CPU tensors only under Triton's " \
           "interpreter: set os.environ['TRITON_INTERPRET'] = '1'" in result.stdout
