"""Tests for attnlib.flash_triton: FlashAttention-2's Triton kernels against torch.

Without CUDA the kernels run on the CPU under Triton's interpreter: this file sets
``TRITON_INTERPRET=1`` before it imports Triton (Triton reads the variable at its first
import), in float32 and float16 at small sizes, since the interpreter executes every
program in Python (N stays at or below 70; the file takes seconds). Where CUDA exists the
same tests run compiled on the GPU, plus bfloat16 and float16 at larger N. The file is
skipped where Triton is not installed.

The reference is torch.nn.functional.scaled_dot_product_attention computed in float64.
float32 tolerance: rtol = atol = 1e-5, as tests/test_flash.py uses for the PyTorch tiling.
The kernel sums at most 70 products of float32 numbers of order 1 per entry (float32's
epsilon is 1.2e-7), and the largest error measured in those tests is 1.4e-6 (values and
gradients). Half precision, and float32 with large scores (scale -1, scores in the
hundreds), are held to torch's own error in that dtype instead: at most twice what
F.scaled_dot_product_attention makes, plus a slack of 1e-6 (float32) or 1e-5 (half).
No timing assertions: speed is the benchmark's job.
"""

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from _triton_helpers import import_triton  # sets TRITON_INTERPRET first
from torch.nn.attention import SDPBackend, sdpa_kernel

_, INTERPRETED = import_triton()

from attnlib import flash_triton  # noqa: E402
from attnlib.flash_triton import (  # noqa: E402
    flash_attention_triton,
    flash_attention_triton_forward,
)

needs_cuda = pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU (compiled Triton kernels)")
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="Triton was imported without TRITON_INTERPRET=1 (CUDA is here)")
TOL32 = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture
def device():
    """CPU tensors under Triton's interpreter, or CUDA tensors compiled where CUDA is."""
    return torch.device("cpu" if INTERPRETED else "cuda")


def _qkv(n_q, n_kv, head_dim, *, batch=1, heads=2, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, n_q, head_dim), (batch, heads, n_kv, head_dim),
              (batch, heads, n_kv, head_dim))
    return tuple(torch.randn(s, generator=gen).to(device=device, dtype=dtype).requires_grad_()
                 for s in shapes)


def _run(fn, query, key, value, grad_out, **kwargs):
    """Output and (dQ, dK, dV) of fn for the upstream gradient grad_out."""
    out = fn(query, key, value, **kwargs)
    return (out, *torch.autograd.grad(out, (query, key, value), grad_out))


def _reference(query, key, value, grad_out, is_causal=False, scale=None):
    """torch's attention and its gradients in float64, by its math backend.

    The math backend because torch 2.13's default CPU backend returns nan for
    is_causal=True with a negative scale (the math backend and attnlib do not).
    """
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (query, key, value))
    with sdpa_kernel(SDPBackend.MATH):
        return _run(F.scaled_dot_product_attention, q64, k64, v64, grad_out.double(),
                    is_causal=is_causal, scale=scale)


def _max_errors(got, want):
    return [(g.double() - w).abs().max().item() for g, w in zip(got, want, strict=True)]


def _grad_out(query):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(query.shape, generator=gen).to(device=query.device, dtype=query.dtype)


def _assert_matches_torch(query, key, value, *, is_causal=False, scale=None, **blocks):
    """float32: values and gradients within TOL32 of torch's float64 result."""
    grad_out = _grad_out(query)
    got = _run(flash_attention_triton, query, key, value, grad_out,
               is_causal=is_causal, scale=scale, **blocks)
    want = _reference(query, key, value, grad_out, is_causal, scale)
    for name, g, w in zip(("output", "dQ", "dK", "dV"), got, want, strict=True):
        assert g.dtype == query.dtype and g.shape == w.shape, name
        torch.testing.assert_close(g.double(), w, **TOL32, msg=name)


def _assert_as_accurate_as_torch(query, key, value, *, is_causal=False, scale=None, **blocks):
    """Errors against float64 at most twice those of torch's attention in the same dtype.

    For half precision, and for float32 where large scores make float32's own
    rounding larger than TOL32 (a score of 20 carries an error near 20 * 6e-8).
    """
    grad_out = _grad_out(query)
    want = _reference(query, key, value, grad_out, is_causal, scale)
    got = _run(flash_attention_triton, query, key, value, grad_out,
               is_causal=is_causal, scale=scale, **blocks)
    negative = scale is not None and scale < 0  # the default CPU backend's nan, see _reference
    with sdpa_kernel(SDPBackend.MATH) if negative else contextlib.nullcontext():
        same_dtype = _run(F.scaled_dot_product_attention, query, key, value, grad_out,
                          is_causal=is_causal, scale=scale)
    slack = 1e-6 if query.dtype == torch.float32 else 1e-5
    errors = zip(("output", "dQ", "dK", "dV"), got, want, _max_errors(got, want),
                 _max_errors(same_dtype, want), strict=True)
    for name, g, w, err, torch_err in errors:
        assert g.dtype == query.dtype and g.shape == w.shape, name
        assert err <= 2 * torch_err + slack, (name, err, torch_err)


# --- differentiable once ---------------------------------------------------------------------


def test_a_second_derivative_says_the_kernel_is_differentiable_once(device):
    query, key, value = _qkv(20, 20, 16, device=device)
    out = flash_attention_triton(query, key, value, is_causal=True)
    (grad,) = torch.autograd.grad(out, query, torch.ones_like(out), create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match="flash_attention_triton is differentiable once"):
        torch.autograd.grad(grad.sum(), key)
    with pytest.raises(RuntimeError, match="flash_attention_triton is differentiable once"):
        grad.sum().backward()


# --- values and gradients, float32 -----------------------------------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "n_q, n_kv, head_dim",
    [
        (70, 70, 64),  # N not a multiple of the 32-row block
        (37, 70, 32),  # fewer queries than keys: causal keys past N_q are seen by no one
        (70, 37, 16),  # more queries than keys: rows past N_kv see every key
        (1, 5, 16),  # a single query, a block almost all edge
    ],
)
def test_matches_torch(device, is_causal, n_q, n_kv, head_dim):
    query, key, value = _qkv(n_q, n_kv, head_dim, device=device)
    _assert_matches_torch(query, key, value, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("block_m, block_n", [(16, 32), (32, 16)])
def test_custom_scale_and_unequal_blocks(device, is_causal, block_m, block_n):
    # block_m != block_n moves the causal loops' bounds off the block grid.
    query, key, value = _qkv(45, 40, 32, device=device, seed=2)
    _assert_matches_torch(query, key, value, is_causal=is_causal, scale=0.3,
                          block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("is_causal", [False, True])
def test_negative_scale(device, is_causal):
    # scale -1 with head_dim 32: scores up to ~20, gradients up to ~18.
    query, key, value = _qkv(45, 40, 32, device=device, seed=2)
    _assert_as_accurate_as_torch(query, key, value, is_causal=is_causal, scale=-1.0)


def test_large_scores_and_batch(device):
    # Scores in the hundreds: exp would overflow float32 (past 88.7) without the running max.
    query, key, value = _qkv(20, 20, 16, batch=2, heads=3, device=device, seed=3)
    with torch.no_grad():
        query.mul_(10.0)
        key.mul_(10.0)
    _assert_as_accurate_as_torch(query, key, value, is_causal=True)


def test_non_contiguous_inputs(device):
    # (batch, N, heads, d) transposed to (batch, heads, N, d), as multi-head attention does.
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, n, 2, 16, generator=gen).to(device).transpose(1, 2)
               .requires_grad_() for n in (33, 21, 21))
    assert not q.is_contiguous()
    _assert_matches_torch(q, k, v, is_causal=True)


def test_forward_returns_the_log_sum_exp(device):
    query, key, value = _qkv(40, 50, 16, device=device, seed=5)
    for is_causal in (False, True):
        out, lse = flash_attention_triton_forward(query, key, value, is_causal=is_causal)
        assert lse.shape == (1, 2, 40, 1) and lse.dtype == torch.float32
        assert not out.requires_grad
        scores = query.detach().double() @ key.detach().double().transpose(-2, -1) / 4.0
        if is_causal:
            hidden = torch.ones(40, 50, dtype=torch.bool, device=device).triu(1)
            scores = scores.masked_fill(hidden, -math.inf)
        torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1, keepdim=True),
                                   **TOL32)


def test_no_keys_or_no_queries(device):
    query, key, value = _qkv(5, 0, 16, device=device)
    out = flash_attention_triton(query, key, value)
    assert out.shape == (1, 2, 5, 16) and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(query.grad, torch.zeros_like(query))
    query, key, value = _qkv(0, 5, 16, device=device)
    assert flash_attention_triton(query, key, value, is_causal=True).shape == (1, 2, 0, 16)


# --- half precision ----------------------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("is_causal", [False, True])
def test_float16_under_the_interpreter(is_causal):
    query, key, value = _qkv(50, 45, 32, dtype=torch.float16, seed=6)
    _assert_as_accurate_as_torch(query, key, value, is_causal=is_causal)


@needs_interpreter
def test_bfloat16_is_refused_under_the_interpreter():
    # Triton 3.9's interpreter multiplies bfloat16 bit patterns as integers in tl.dot.
    query, key, value = _qkv(8, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="interpreter cannot run bfloat16"):
        flash_attention_triton(query, key, value)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n_q, n_kv, head_dim", [(1000, 1000, 64), (1023, 777, 128),
                                                 (300, 1100, 128)])
def test_half_precision_on_cuda(dtype, is_causal, n_q, n_kv, head_dim):
    query, key, value = _qkv(n_q, n_kv, head_dim, batch=2, heads=4, dtype=dtype,
                             device="cuda", seed=7)
    _assert_as_accurate_as_torch(query, key, value, is_causal=is_causal)


@needs_cuda
def test_float32_on_cuda_at_larger_n():
    query, key, value = _qkv(1000, 1000, 128, device="cuda", seed=8)
    _assert_matches_torch(query, key, value, is_causal=True)


# --- errors ----------------------------------------------------------------------------------


def _good(n=8, d=16, dtype=torch.float32):
    return _qkv(n, n, d, dtype=dtype, device="cpu" if INTERPRETED else "cuda")


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda q, k, v: ([[1.0]], k, v), TypeError, "query must be a torch.Tensor"),
        (lambda q, k, v: (q, k, "v"), TypeError, "value must be a torch.Tensor"),
        (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError,
         "float16, bfloat16 or float32.*float64"),
        (lambda q, k, v: (q.long(), k, v), TypeError, "floating-point"),
        (lambda q, k, v: (q.half(), k, v), TypeError, "share a dtype"),
        (lambda q, k, v: (q[0], k[0], v[0]), ValueError, "must be 4-D"),
        (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), ValueError,
         "head_dim must be a power of two from 16 to 128.*head_dim=8"),
        (lambda q, k, v: (q, k, v[..., :8]), ValueError, "value must have the query's head_dim"),
        (lambda q, k, v: (q, k[..., :3, :], v), ValueError, "num_tokens_kv"),
        (lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), ValueError, "leading"),
        (lambda q, k, v: (q, k.to("meta"), v), ValueError, "one device"),
        (lambda q, k, v: (q.to("meta"), k.to("meta"), v.to("meta")), ValueError,
         "CUDA tensors, or on CPU tensors"),
    ],
)
def test_bad_tensors(change, error, match):
    with pytest.raises(error, match=match):
        flash_attention_triton(*change(*_good()))


@pytest.mark.parametrize("head_dim", [24, 256])
def test_head_dim_not_supported(head_dim):
    with pytest.raises(ValueError, match=f"power of two from 16 to 128.*head_dim={head_dim}"):
        flash_attention_triton(*_good(d=head_dim))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
        ({"scale": "0.5"}, TypeError, "scale must be a float"),
        ({"scale": math.inf}, ValueError, "scale must be finite"),
        ({"block_m": 24}, ValueError, "block_m must be a power of two from 16 to 256"),
        ({"block_n": 8}, ValueError, "block_n must be a power of two from 16 to 256"),
        ({"block_m": 32.0}, TypeError, "block_m must be an int"),
        ({"num_warps": 3}, ValueError, "num_warps must be a power of two from 1 to 32"),
        ({"num_warps": 64}, ValueError, "num_warps must be a power of two from 1 to 32"),
        ({"num_warps": "4"}, TypeError, "num_warps must be an int or None"),
        ({"num_stages": 0}, ValueError, "num_stages must be an int from 1 to 8"),
        ({"num_stages": 2.5}, TypeError, "num_stages must be an int or None"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        flash_attention_triton(*_good(), **kwargs)
    with pytest.raises(error, match=match):
        flash_attention_triton_forward(*_good(), **kwargs)


@pytest.mark.parametrize("num_warps, num_stages", [(8, 2), (1, 1), (4, 5)])
def test_warps_and_stages_do_not_change_the_result(device, num_warps, num_stages):
    query, key, value = _qkv(40, 40, 32, device=device)
    grad_out = torch.randn(1, 2, 40, 32, generator=torch.Generator().manual_seed(3)).to(device)
    default = _run(flash_attention_triton, query, key, value, grad_out, is_causal=True)
    chosen = _run(flash_attention_triton, query, key, value, grad_out, is_causal=True,
                  num_warps=num_warps, num_stages=num_stages)
    for a, b in zip(default, chosen, strict=True):
        torch.testing.assert_close(a, b, **TOL32)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="set the environment variable TRITON_INTERPRET=1"):
        flash_attention_triton(*_qkv(8, 8, 16))


def test_missing_triton_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` fail
    with pytest.raises(ImportError, match=r"pip install 'attnlib\[triton\]'"):
        flash_attention_triton(*_good())


_FRESH_PROCESS = """
import os, sys
sys.modules["triton"] = None  # as if Triton were not installed
import torch
import attnlib, attnlib.flash_triton as ft
assert "triton" not in vars(ft) and "tl" not in vars(ft)
q = torch.zeros(1, 1, 4, 16)
try:
    ft.flash_attention_triton(q, q, q)
except ImportError as err:
    print("1:", err)
del sys.modules["triton"]
import triton  # now installed, imported without the interpreter
os.environ["TRITON_INTERPRET"] = "1"  # too late: Triton has read it
try:
    ft.flash_attention_triton(q, q, q)
except RuntimeError as err:
    print("2:", err)
"""


def test_in_a_fresh_process_attnlib_needs_no_triton_and_a_late_variable_is_named():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "1: flash_attention_triton needs Triton" in result.stdout
    assert "pip install 'attnlib[triton]'" in result.stdout
    assert "2: TRITON_INTERPRET=1 is set now but was not set when this process first" in \
        result.stdout


_COMPILED_PARAMS = """
import attnlib.flash_triton as ft
kernels = ft.jit_kernels(False)
for name in ("forward", "delta", "grad_key_value", "grad_query"):
    fn = getattr(kernels, name)
    print(name, sorted(p.name for p in fn.params if p.is_constexpr))
"""


def test_compiled_kernels_know_their_constexpr_arguments():
    # Rebuilding a kernel in its own globals must keep its annotations: without them the
    # compiler sees HEAD_DIM or BLOCK_M as run-time values (the interpreter does not care).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _COMPILED_PARAMS], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    for name in ("forward", "grad_key_value", "grad_query"):
        assert "'HEAD_DIM'" in lines[name] and "'IS_CAUSAL'" in lines[name], lines[name]
        assert "'BLOCK_M'" in lines[name] and "'BLOCK_N'" in lines[name], lines[name]
    assert lines["delta"] != "[]", lines["delta"]


def test_kernels_leave_the_module_namespace_alone():
    # The interpreter adds its helpers to a kernel's globals: they must not land in attnlib.
    flash_attention_triton(*_good())
    for module in (flash_triton, flash_triton.kernels):
        assert "np" not in vars(module) and "tl" not in vars(module), module
    assert flash_triton.jit_kernels(INTERPRETED).interpret is INTERPRETED


def test_the_benchmark_times_the_kernel_beside_torch_and_flash_attention(device):
    """`python -m attnlib.bench` on a GPU times the Triton kernel in the kernel timing;
    the kernel is checked against torch's first (here under the interpreter, tiny)."""
    from attnlib import bench

    result = bench.run_kernel_timing(64, num_heads=1, head_dim=16, block_sizes=(32,), reps=1,
                                     warmup=0, device=device, triton=True)
    contestants = [r["contestant"] for r in result["records"]]
    assert contestants == ["sdpa", "flash_attention", "flash_attention_triton"]
    assert result["metadata"]["triton"] is True
    targets = [v["target"] for v in result["verdicts"]]
    # Only a compiled kernel's time is held to the GPU target; the interpreter's is not.
    assert ("flash_attention_triton_vs_sdpa" in targets) == (device.type == "cuda")
    assert "Triton kernel (ch. 11)" in bench.format_sweeps(None, result)


def test_the_benchmark_refuses_a_triton_setting_that_is_not_a_bool():
    from attnlib import bench

    with pytest.raises(TypeError, match="triton must be True, False or None"):
        bench.run_kernel_timing(64, num_heads=1, head_dim=16, block_sizes=(32,), reps=1,
                                device="cpu", triton="yes")


def test_the_memory_sweep_measures_the_kernel_below_the_scores_it_never_stores(device):
    from attnlib import bench

    sweep = bench.run_memory_sweep((64, 128), num_heads=1, head_dim=16, block_size=32,
                                   device=device, triton=True)
    for record in sweep["records"]:
        peak = record["flash_attention_triton_peak_bytes"]
        # The output and one log-sum-exp per row: far below the N x N scores and weights.
        assert peak is not None and peak < record["predicted_scores_weights_bytes"] / 4, record
    assert "flash_attention_triton" in sweep["slopes"]
    assert "Triton kernel" in bench.format_sweeps(sweep, None)
