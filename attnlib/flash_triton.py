"""FlashAttention-2 as Triton kernels: the forward and the backward pass, fused.

:mod:`attnlib.flash` writes FlashAttention's loops in PyTorch, one tile per
Python iteration and one kernel launch per tile operation. Here the same
algorithm is written as Triton kernels (Tillet et al. 2019): a Triton *program*
handles one block of rows, holds its tiles in on-chip memory and loops over the
other sequence on its own, so a whole pass is one launch and the
``(num_tokens_q, num_tokens_kv)`` scores never reach main memory.

Four kernels, each one program per block and per (batch, head) pair:

* forward (Dao 2023, Algorithm 1): one program per block of ``BLOCK_M`` queries
  loops over blocks of ``BLOCK_N`` keys with the online softmax, and writes the
  output and each row's log-sum-exp;
* the backward's preprocessing: ``D = rowsum(dO * O)`` per query row;
* dK and dV (Algorithm 2): one program per block of keys loops over the query
  blocks that see it, recomputing the weights ``P`` from the saved
  log-sum-exp;
* dQ: one program per block of queries loops over the key blocks it sees and
  recomputes ``P`` the same way. Algorithm 2 instead updates dQ in main memory
  from inside the dK/dV loop, with atomic adds between thread blocks (Section
  3.2); this second kernel gives each query block to one program, which sums
  its dQ in registers and writes it once, at the cost of computing ``P`` twice.

The exponentials are base 2, as in FlashAttention-2's kernels: the scores are
multiplied by ``scale * log2(e)``, so ``exp2(s - m)`` equals ``exp(x - max)``
of the natural-base softmax, and the saved log-sum-exp is in base 2 too.

Triton is optional (``pip install attnlib[triton]``): ``import attnlib`` does
not import it; the first call here does, and only then are the kernels handed
to ``triton.jit``. On CUDA tensors they are compiled for the GPU. On CPU
tensors they run under Triton's interpreter, slowly but exactly as written,
with NumPy. The interpreter is switched on by the environment
variable ``TRITON_INTERPRET=1``, which Triton reads when it decorates a
function, its own library's included, at its first import: so the variable must
be set before anything in the process imports Triton (a notebook sets
``os.environ["TRITON_INTERPRET"] = "1"`` in its first cell). A call checks this
and says so when it is not the case.

Shapes: ``(batch, num_heads, num_tokens, head_dim)`` for query, key and value;
``num_tokens_q`` and ``num_tokens_kv`` may differ.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from ._validation import check_bool, type_name
from .flash import _once_differentiable

if TYPE_CHECKING:  # the kernels' `tl`; at run time _kernels() supplies it
    # Triton ships no type hints (no py.typed), so `tl` and `triton` are Any to mypy.
    import triton.language as tl  # type: ignore[import-untyped]

__all__ = ["HEAD_DIMS", "SUPPORTED_DTYPES", "flash_attention_triton",
           "flash_attention_triton_forward"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The input dtypes the kernels take; accumulation is always float32."""

HEAD_DIMS = (16, 32, 64, 128)
"""The head sizes the kernels take (``tl.arange`` needs a power of two, ``tl.dot`` at least 16)."""

LOG2_E = math.log2(math.e)  # exp(x) == exp2(x * LOG2_E)


# --- the kernels ----------------------------------------------------------------------
# Plain functions until _kernels() hands them to triton.jit. A program is one block of
# rows of one (batch, head) pair: grid axis 0 picks the block, axis 1 the pair `bh`. The
# tensors are contiguous, so row r of pair bh starts at element
# (bh * num_tokens + r) * HEAD_DIM. Scores are kept in base-2 units,
# s = q.k * scale * log2(e), so that exp2(s - m) is the softmax's exp(x - max).
# The annotations are the types the arguments have inside a kernel: every run-time
# argument, pointer or scalar, is a tl.tensor (a pointer's dtype is a pointer type), and a
# launch constant is a tl.constexpr. Triton ships no type hints, so mypy sees `tl` as Any
# and does not check the kernels' bodies.


def _forward_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                    out_ptr: tl.tensor, lse_ptr: tl.tensor, qk_scale: tl.tensor,
                    N_Q: tl.tensor, N_KV: tl.tensor,
                    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    DOT_PRECISION: tl.constexpr) -> None:
    """O_i and L_i for BLOCK_M query rows: Dao (2023), Algorithm 1."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * N * HEAD_DIM may pass 2**31
    q_ptr += bh * N_Q * HEAD_DIM
    out_ptr += bh * N_Q * HEAD_DIM
    lse_ptr += bh * N_Q
    k_ptr += bh * N_KV * HEAD_DIM
    v_ptr += bh * N_KV * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    row_ok = rows < N_Q  # the edge mask: False past the last query
    q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)  # m_i (base 2)
    row_sum = tl.zeros([BLOCK_M], tl.float32)  # l_i
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # O_i, not yet divided by l_i
    kv_stop = N_KV
    if IS_CAUSAL:  # no query here sees a key at or past start_m + BLOCK_M
        kv_stop = tl.minimum(N_KV, start_m + BLOCK_M)
    for start_n in range(0, kv_stop, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices
        key_ok = keys < N_KV
        kv_offsets = keys[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_N, HEAD_DIM)
        k = tl.load(k_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
        # S_ij = Q_i K_j^T, times scale * log2(e): (BLOCK_M, BLOCK_N)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = key_ok[None, :]  # keys past the end do not exist
        if IS_CAUSAL:  # query i sees keys j <= i (top-left aligned)
            visible = visible & (keys[None, :] <= rows[:, None])
        s = tl.where(visible, s, float("-inf"))
        # Online softmax. Every row sees key 0, in the first block, so
        # new_max is finite from the first block on.
        new_max = tl.maximum(row_max, tl.max(s, 1))
        p = tl.exp2(s - new_max[:, None])  # unnormalised weights
        rescale = tl.exp2(row_max - new_max)  # for what was summed under the old max
        row_sum = row_sum * rescale + tl.sum(p, 1)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * rescale[:, None] + pv
        row_max = new_max
    acc = acc / row_sum[:, None]  # divide once, at the end (Section 3.1.1)
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + q_offsets, out, mask=row_ok[:, None])
    # L_i = m_i + log2(l_i): all the backward needs to rebuild the weights.
    tl.store(lse_ptr + rows, row_max + tl.log2(row_sum), mask=row_ok)


def _delta_kernel(out_ptr: tl.tensor, dout_ptr: tl.tensor, delta_ptr: tl.tensor,
                  N_Q: tl.tensor, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr) -> None:
    """D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij for BLOCK_M rows (Algorithm 2)."""
    bh = tl.program_id(1).to(tl.int64)
    out_ptr += bh * N_Q * HEAD_DIM
    dout_ptr += bh * N_Q * HEAD_DIM
    delta_ptr += bh * N_Q
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < N_Q
    offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    o = tl.load(out_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(dout_ptr + offsets, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=row_ok)


def _grad_key_value_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                           dout_ptr: tl.tensor, lse_ptr: tl.tensor, delta_ptr: tl.tensor,
                           dk_ptr: tl.tensor, dv_ptr: tl.tensor, scale: tl.tensor,
                           qk_scale: tl.tensor, N_Q: tl.tensor, N_KV: tl.tensor,
                           IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           DOT_PRECISION: tl.constexpr) -> None:
    """dK_j and dV_j for BLOCK_N keys, looping over query blocks (Algorithm 2)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    q_ptr += bh * N_Q * HEAD_DIM
    dout_ptr += bh * N_Q * HEAD_DIM
    lse_ptr += bh * N_Q
    delta_ptr += bh * N_Q
    k_ptr += bh * N_KV * HEAD_DIM
    v_ptr += bh * N_KV * HEAD_DIM
    dk_ptr += bh * N_KV * HEAD_DIM
    dv_ptr += bh * N_KV * HEAD_DIM
    keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    dims = tl.arange(0, HEAD_DIM)
    key_ok = keys < N_KV
    kv_offsets = keys[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_N, HEAD_DIM)
    k = tl.load(k_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
    v = tl.load(v_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    q_start = 0
    if IS_CAUSAL:  # queries before start_n see none of these keys
        q_start = (start_n // BLOCK_M) * BLOCK_M
    for start_m in range(q_start, N_Q, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        row_ok = rows < N_Q
        q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
        q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
        do = tl.load(dout_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)  # L_i
        d_row = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)  # D_i
        # P_ij recomputed as the forward computed it: same scores, same mask.
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = row_ok[:, None] & key_ok[None, :]
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N), the softmax weights
        # dV_j += P^T dO_i
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO_i V_j^T
        ds = p * (dp - d_row[:, None])  # dS = P * (dP - D): the scores' gradient
        # dK_j += dS^T Q_i
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)
    dk = dk * scale  # the scores were Q K^T * scale
    tl.store(dk_ptr + kv_offsets, dk.to(dk_ptr.dtype.element_ty), mask=key_ok[:, None])
    tl.store(dv_ptr + kv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=key_ok[:, None])


def _grad_query_kernel(q_ptr: tl.tensor, k_ptr: tl.tensor, v_ptr: tl.tensor,
                       dout_ptr: tl.tensor, lse_ptr: tl.tensor, delta_ptr: tl.tensor,
                       dq_ptr: tl.tensor, scale: tl.tensor, qk_scale: tl.tensor,
                       N_Q: tl.tensor, N_KV: tl.tensor,
                       IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr) -> None:
    """dQ_i for BLOCK_M queries, looping over key blocks as the forward does."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    q_ptr += bh * N_Q * HEAD_DIM
    dout_ptr += bh * N_Q * HEAD_DIM
    dq_ptr += bh * N_Q * HEAD_DIM
    lse_ptr += bh * N_Q
    delta_ptr += bh * N_Q
    k_ptr += bh * N_KV * HEAD_DIM
    v_ptr += bh * N_KV * HEAD_DIM
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < N_Q
    q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_M, HEAD_DIM)
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(dout_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)  # L_i
    d_row = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)  # D_i
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_stop = N_KV
    if IS_CAUSAL:
        kv_stop = tl.minimum(N_KV, start_m + BLOCK_M)
    for start_n in range(0, kv_stop, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        key_ok = keys < N_KV
        kv_offsets = keys[:, None] * HEAD_DIM + dims[None, :]  # (BLOCK_N, HEAD_DIM)
        k = tl.load(k_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + kv_offsets, mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = row_ok[:, None] & key_ok[None, :]
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - d_row[:, None])
        # dQ_i += dS K_j, summed here instead of with atomic adds to main memory
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    dq = dq * scale
    tl.store(dq_ptr + q_offsets, dq.to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])


def _import_triton() -> types.ModuleType:
    """Import Triton on first use, or explain how to install it."""
    try:
        import triton
        import triton.language
    except ImportError as err:
        raise ImportError(
            "flash_attention_triton needs Triton, an optional dependency of attnlib: "
            "pip install 'attnlib[triton]' (or pip install triton)"
        ) from err
    return triton


@functools.cache
def _kernels(interpret: bool) -> types.SimpleNamespace:
    """The four kernels through ``triton.jit``, built once per interpreter setting.

    ``triton.jit`` returns an interpreted function when ``TRITON_INTERPRET=1``
    is set at the moment it decorates, and a GPU kernel otherwise; ``interpret``
    is that setting, which the caller has checked against the one Triton was
    imported with. Each kernel is rebuilt from its code with globals of its
    own, in which ``tl`` is ``triton.language``: attnlib's namespace never
    imports Triton, and the interpreter, which runs a kernel in its globals and
    adds its own helpers there, leaves this module untouched.
    """
    triton = _import_triton()
    scope = {"tl": triton.language, "triton": triton, "__name__": __name__}

    def jit(fn: Callable[..., None]) -> object:  # a JITFunction, or an InterpretedFunction
        assert isinstance(fn, types.FunctionType)  # a def: it has __code__ and __defaults__
        rebound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
        # FunctionType drops the annotations, which tell Triton the tl.constexpr arguments
        # (compiled in as constants: tl.arange(0, HEAD_DIM) needs one).
        rebound.__annotations__ = dict(fn.__annotations__)
        return triton.jit(rebound)

    return types.SimpleNamespace(
        interpret=interpret,
        forward=jit(_forward_kernel),
        delta=jit(_delta_kernel),
        grad_key_value=jit(_grad_key_value_kernel),
        grad_query=jit(_grad_query_kernel),
    )


# --- input checks and launch settings --------------------------------------------------------


def _check_block(name: str, value: object, low: int = 16, high: int = 256,
                 power_of_two: bool = True) -> int | None:
    """``value`` as an int from ``low`` to ``high`` (a power of two if asked), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type_name(value)} {name}={value!r}")
    value = int(value)
    if value < low or value > high or (power_of_two and value & (value - 1)):
        what = "a power of two" if power_of_two else "an int"
        raise ValueError(f"{name} must be {what} from {low} to {high}, got {name}={value}")
    return value


def _check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  is_causal: bool, scale: float | None, block_m: object, block_n: object,
                  num_warps: object = None, num_stages: object = None
                  ) -> tuple[int | None, int | None, int | None, int | None]:
    """The reference's checks, then what the kernels need; returns the launch settings
    asked for, ``(block_m, block_n, num_warps, num_stages)``, each an int or None."""
    from .functional import _check_sdpa_inputs

    _check_sdpa_inputs(query, key, value, None, 0.0, is_causal, scale)
    check_bool("is_causal", is_causal)
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"flash_attention_triton takes float16, bfloat16 or float32 tensors, got {query.dtype}"
        )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, num_heads, num_tokens, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
    head_dim = query.shape[-1]
    if value.shape[-1] != head_dim:
        raise ValueError(
            f"value must have the query's head_dim={head_dim}, got value {tuple(value.shape)}"
        )
    if head_dim not in HEAD_DIMS:
        raise ValueError(
            f"head_dim must be a power of two from 16 to 128 ({', '.join(map(str, HEAD_DIMS))}), "
            f"got head_dim={head_dim}"
        )
    if query.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"flash_attention_triton runs on CUDA tensors, or on CPU tensors under Triton's "
            f"interpreter; got tensors on {query.device}"
        )
    return (_check_block("block_m", block_m), _check_block("block_n", block_n),
            _check_block("num_warps", num_warps, 1, 32),
            _check_block("num_stages", num_stages, 1, 8, power_of_two=False))


class _LaunchSettings(TypedDict):
    """What :func:`_launch_settings` returns: a plain dict at run time."""

    kernels: types.SimpleNamespace  # the four kernels, from _kernels()
    block_m: int
    block_n: int
    launch: dict[str, int]  # num_warps and num_stages on a GPU; empty under the interpreter
    precision: str  # tl.dot's input_precision: "ieee" or "tf32"


def _launch_settings(query: torch.Tensor, block_m: int | None, block_n: int | None,
                     num_warps: int | None = None, num_stages: int | None = None
                     ) -> _LaunchSettings:
    """Kernels (interpreted or compiled), block sizes, warps and stages for these inputs."""
    triton = _import_triton()
    interpret = _interpreting(triton)
    if query.device.type == "cpu" and not interpret:
        raise RuntimeError(
            "flash_attention_triton got CPU tensors, which Triton runs only under its "
            "interpreter: set the environment variable TRITON_INTERPRET=1 before Triton is "
            "first imported (os.environ['TRITON_INTERPRET'] = '1' at the top of the notebook "
            "or script, or in the shell), or pass CUDA tensors"
        )
    if interpret != _imported_interpreted(triton):
        # Triton decorates its own library (tl.zeros, tl.max, ...) when first imported;
        # kernels of the other kind cannot call those functions.
        now, then = ("set", "not set") if interpret else ("not set", "set")
        raise RuntimeError(
            f"TRITON_INTERPRET=1 is {now} now but was {then} when this process first "
            "imported Triton, which reads it then: set or unset it before the first import "
            "of triton and restart the process (in a notebook: restart the kernel)"
        )
    if interpret and query.dtype == torch.bfloat16:
        # Triton's interpreter keeps bfloat16 as its 16-bit pattern and tl.dot multiplies
        # the patterns as integers (triton-lang/triton#11584): refuse rather than return junk.
        raise TypeError(
            "Triton's interpreter cannot run bfloat16 kernels (its tl.dot multiplies "
            "bfloat16 bit patterns as integers): use float16 or float32 under "
            "TRITON_INTERPRET=1, or bfloat16 on a CUDA GPU without it"
        )
    if interpret:  # few, small programs: the interpreter is slow per program; it runs
        default_m = default_n = 32  # each program as one, so warps and stages do not apply
        launch: dict[str, int] = {}
    else:
        # 64 x 64 tiles, 4 warps, 3 stages: a plain textbook setting, not tuned. float32
        # tiles are twice as large in shared memory, so they get half the rows.
        default_m = default_n = 64 if query.element_size() == 2 else 32
        launch = {"num_warps": num_warps or 4,
                  "num_stages": num_stages or (3 if query.element_size() == 2 else 2)}
    return {
        "kernels": _kernels(interpret),
        "block_m": block_m or default_m,
        "block_n": block_n or default_n,
        "launch": launch,
        # float32 inputs get full float32 products (not TF32, Triton's default on a GPU),
        # so that float32 results agree with torch's to float32 accuracy.
        "precision": "ieee" if query.dtype == torch.float32 else "tf32",
    }


def _interpreting(triton: types.ModuleType) -> bool:
    """Whether ``TRITON_INTERPRET`` is on now, as Triton reads it."""
    knobs = getattr(triton, "knobs", None)  # Triton's settings object, in recent versions
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def _imported_interpreted(triton: types.ModuleType) -> bool:
    """Whether Triton's own library was decorated under the interpreter at import."""
    from triton.runtime.interpreter import (  # type: ignore[import-untyped]  # no hints
        InterpretedFunction,
    )

    return isinstance(triton.language.zeros, InterpretedFunction)


def _cdiv(n: int, block: int) -> int:
    return (n + block - 1) // block  # blocks needed to cover n rows


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# --- the passes ------------------------------------------------------------------------------


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
             scale: float, settings: _LaunchSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous ``(B, H, N, d)`` inputs -> output ``(B, H, N_q, d)``, LSE ``(B, H, N_q)``."""
    batch, num_heads, num_tokens_q, head_dim = query.shape
    num_tokens_kv = key.shape[2]
    context_vec = torch.empty_like(query)  # (B, H, N_q, head_dim)
    lse = torch.empty((batch, num_heads, num_tokens_q), dtype=torch.float32,
                      device=query.device)  # (B, H, N_q), log2 of each row's denominator
    if num_tokens_q == 0:
        return context_vec, lse
    if num_tokens_kv == 0:  # no keys: zeros, as in torch; every row's sum is empty
        return context_vec.zero_(), lse.fill_(-math.inf)
    block_m, block_n = settings["block_m"], settings["block_n"]
    grid = (_cdiv(num_tokens_q, block_m), batch * num_heads)
    with _on_device(query.device):
        settings["kernels"].forward[grid](
            query, key, value, context_vec, lse, scale * LOG2_E, num_tokens_q, num_tokens_kv,
            IS_CAUSAL=is_causal, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
            DOT_PRECISION=settings["precision"], **settings["launch"])
    return context_vec, lse


def _backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              context_vec: torch.Tensor, lse: torch.Tensor, grad_context: torch.Tensor,
              is_causal: bool, scale: float, settings: _LaunchSettings
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the query, key and value (Dao 2023, Algorithm 2), each in the input dtype."""
    batch, num_heads, num_tokens_q, head_dim = query.shape
    num_tokens_kv = key.shape[2]
    grad_query = torch.zeros_like(query)
    grad_key = torch.zeros_like(key)
    grad_value = torch.zeros_like(value)
    if num_tokens_q == 0 or num_tokens_kv == 0:
        return grad_query, grad_key, grad_value
    grad_context = grad_context.contiguous()
    block_m, block_n = settings["block_m"], settings["block_n"]
    kernels, launch, precision = settings["kernels"], settings["launch"], settings["precision"]
    delta = torch.empty_like(lse)  # (B, H, N_q), float32
    q_grid = (_cdiv(num_tokens_q, block_m), batch * num_heads)
    kv_grid = (_cdiv(num_tokens_kv, block_n), batch * num_heads)
    common = {"IS_CAUSAL": is_causal, "HEAD_DIM": head_dim, "BLOCK_M": block_m,
              "BLOCK_N": block_n, "DOT_PRECISION": precision, **launch}
    with _on_device(query.device):
        kernels.delta[q_grid](context_vec, grad_context, delta, num_tokens_q,
                              HEAD_DIM=head_dim, BLOCK_M=block_m)
        kernels.grad_key_value[kv_grid](
            query, key, value, grad_context, lse, delta, grad_key, grad_value,
            scale, scale * LOG2_E, num_tokens_q, num_tokens_kv, **common)
        kernels.grad_query[q_grid](
            query, key, value, grad_context, lse, delta, grad_query,
            scale, scale * LOG2_E, num_tokens_q, num_tokens_kv, **common)
    return grad_query, grad_key, grad_value


class _FlashAttentionTritonFunction(torch.autograd.Function):
    """Autograd wrapper: saves the inputs, the output and the log-sum-exp, nothing N x N."""

    # ctx is Any, as in torch's own signatures: FunctionCtx declares neither
    # saved_tensors nor the attributes set on it here.
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                is_causal: bool, scale: float, settings: _LaunchSettings) -> torch.Tensor:
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        context_vec, lse = _forward(query, key, value, is_causal, scale, settings)
        ctx.save_for_backward(query, key, value, context_vec, lse)
        ctx.is_causal, ctx.scale, ctx.settings = is_causal, scale, settings
        return context_vec

    @staticmethod
    @_once_differentiable("attnlib.flash_triton.flash_attention_triton")
    def backward(ctx: Any, grad_context: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        query, key, value, context_vec, lse = ctx.saved_tensors
        grads = _backward(query, key, value, context_vec, lse, grad_context,
                          ctx.is_causal, ctx.scale, ctx.settings)
        return (*grads, None, None, None)


def _prepare(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
             scale: float | None, block_m: object, block_n: object, num_warps: object,
             num_stages: object) -> tuple[bool, float, _LaunchSettings]:
    asked = _check_inputs(query, key, value, is_causal, scale, block_m, block_n, num_warps,
                          num_stages)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return bool(is_causal), scale, _launch_settings(query, *asked)


# --- public functions ------------------------------------------------------------------------


def flash_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``softmax(query @ key^T * scale) @ value`` by FlashAttention-2's Triton kernels.

    Gives the result of :func:`torch.nn.functional.scaled_dot_product_attention`
    (no mask or causal, no dropout) and its gradients, as
    :func:`attnlib.functional.flash_attention` does, but each pass is fused
    into Triton kernels: the forward writes only the output and one
    log-sum-exp per query row, and the backward recomputes the attention
    weights tile by tile from them (Dao 2023, Algorithms 1 and 2). Memory is
    linear in the number of tokens in both passes.

    On CUDA tensors the kernels are compiled for the GPU. On CPU tensors they
    run under Triton's interpreter, which is switched on by the environment
    variable ``TRITON_INTERPRET=1``, set before Triton is first imported in the
    process (``os.environ`` at the top of a notebook); it is slow but runs the
    same kernel code, which is how the tests check it without a GPU. bfloat16
    needs the GPU: the interpreter's ``tl.dot`` does not support it.

    It is differentiable once: the backward kernels run outside autograd,
    so the gradients have no graph of their own. With
    ``torch.autograd.grad(..., create_graph=True)`` they come back, but
    differentiating them again (double backward) raises a RuntimeError
    that says so; torch's ``scaled_dot_product_attention`` supports it.

    Args:
        query: ``(batch, num_heads, num_tokens_q, head_dim)``.
        key: ``(batch, num_heads, num_tokens_kv, head_dim)``.
        value: ``(batch, num_heads, num_tokens_kv, head_dim)``. All three share
            one dtype (float16, bfloat16 or float32), one device and
            ``batch, num_heads``; ``head_dim`` is 16, 32, 64 or 128. The token
            counts are any, not only multiples of a block.
        is_causal: query ``i`` sees keys ``j <= i``: the lower triangle aligned
            at the top-left corner, as torch's ``is_causal=True`` and
            :func:`attnlib.functional.causal_mask`, also when
            ``num_tokens_q != num_tokens_kv``. Default ``False``.
        scale: multiplier of the scores; default ``1 / sqrt(head_dim)``.
        block_m: keyword-only; query rows per program, a power of two from 16
            to 256. Default 32 under the interpreter; on a GPU 64 for half
            precision and 32 for float32.
        block_n: keyword-only; key rows per inner-loop tile, the same choices
            and defaults as ``block_m``.
        num_warps: keyword-only; warps (of 32 threads) per program on a GPU, a
            power of two from 1 to 32; default 4. The interpreter ignores it.
        num_stages: keyword-only; how many key/value tiles a program keeps in
            flight on a GPU (software pipelining), 1 to 8; default 3 for half
            precision and 2 for float32. The interpreter ignores it.

    Returns:
        ``context_vec`` ``(batch, num_heads, num_tokens_q, head_dim)``, the
        dtype of the input. Products are summed and the softmax kept in
        float32; float32 inputs get full float32 products on the GPU (not
        TF32). With no keys it is zeros, as in torch.

    Raises:
        ImportError: Triton is not installed (``pip install attnlib[triton]``).
        RuntimeError: CPU tensors while ``TRITON_INTERPRET=1`` is not set; the
            variable set now but not when Triton was first imported, or the
            other way round.
        TypeError: a tensor is not a floating-point tensor; the dtypes differ
            or are not float16, bfloat16 or float32; bfloat16 under the
            interpreter; ``is_causal`` is not a bool; ``scale`` is not a
            number; a block size, ``num_warps`` or ``num_stages`` is not an int.
        ValueError: a tensor is not 4-D; query and key disagree on
            ``head_dim``, key and value on ``num_tokens_kv``, or value on
            ``head_dim``; ``batch`` or ``num_heads`` differ; ``head_dim`` is not
            16, 32, 64 or 128; the tensors are on different devices or on a
            device other than CPU or CUDA; ``scale`` is not finite; a block
            size is not a power of two from 16 to 256, ``num_warps`` not one from
            1 to 32, or ``num_stages`` not from 1 to 8.
        RuntimeError: also raised later, by a backward pass through the
            gradients this function's backward returned (differentiable once).

    Source: Dao (2023), "FlashAttention-2: Faster Attention with Better
    Parallelism and Work Partitioning", Algorithm 1 (forward, Section 3.1.1),
    Algorithm 2 (backward, Section 3.1.2) and Section 3.2 (one program per
    row block in the forward, per column block in the backward); Tillet, Kung
    and Cox (2019), "Triton: An Intermediate Language and Compiler for Tiled
    Neural Network Computations".
    """
    is_causal, scale, settings = _prepare(query, key, value, is_causal, scale, block_m, block_n,
                                          num_warps, num_stages)
    return _FlashAttentionTritonFunction.apply(query, key, value, is_causal, scale, settings)


def flash_attention_triton_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone, returning the log-sum-exp it saves for the backward.

    Nothing is recorded for autograd. The kernel keeps the log-sum-exp in base
    2 (``exp2`` with ``log2(e)`` folded into the scale); it is returned here in
    natural log, as :func:`attnlib.flash.flash_attention_forward` returns it.

    Args:
        query, key, value: ``(batch, num_heads, num_tokens, head_dim)`` tensors
            of one dtype, float16, bfloat16 or float32, as for
            :func:`flash_attention_triton`.
        is_causal, scale, block_m, block_n, num_warps, num_stages: as for
            :func:`flash_attention_triton`.

    Returns:
        ``(context_vec, logsumexp)``: ``context_vec``
        ``(batch, num_heads, num_tokens_q, head_dim)`` in the input's dtype, and
        ``logsumexp`` ``(batch, num_heads, num_tokens_q, 1)`` in float32, the
        log of each row's softmax denominator ``sum_j exp(score_ij)`` (``-inf``
        for every row when there are no keys).

    Raises:
        ImportError, RuntimeError, TypeError, ValueError: as
            :func:`flash_attention_triton` raises them, for the same inputs.

    Source: Dao (2023), "FlashAttention-2", Algorithm 1 and Section 3.1.1.
    """
    is_causal, scale, settings = _prepare(query, key, value, is_causal, scale, block_m, block_n,
                                          num_warps, num_stages)
    with torch.no_grad():
        context_vec, lse = _forward(query.contiguous(), key.contiguous(), value.contiguous(),
                                    is_causal, scale, settings)
    return context_vec, (lse * math.log(2.0)).unsqueeze(-1)  # (B, H, N_q, 1), natural log
