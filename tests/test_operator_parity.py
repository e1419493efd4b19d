"""attnlib's MultiHeadAttention runs the ATen operators of the benchmark's bare
kernels (issue 33.5), apart from the query/key/value projection (issue 27: three
nn.Linear layers with their own storage, no packed weight): torch.profiler's
operator names and counts, not times.

On an H200 in bfloat16 attnlib took 1.45x the bare kernels' time forward at
N=1024; on the CPU the two launched the same kernels apart from the projection.
"""

import dataclasses

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attnlib import bench

D_MODEL, NUM_HEADS, NUM_TOKENS = 64, 4, 32
DTYPES = [torch.float32, torch.bfloat16]


def _contestants(dtype, qkv_bias=True):
    return bench.make_contestants(D_MODEL, NUM_HEADS, NUM_TOKENS, names=["attnlib", "bare_kernels"],
                                  qkv_bias=qkv_bias, device="cpu", dtype=dtype)


def _x(dtype):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, NUM_TOKENS, D_MODEL, generator=gen).to(dtype)


def _aten_ops(contestant, x, mode):
    """Name -> count of the ATen operators of one profiled call, read from the profiler here
    (independently of attnlib.bench.operator_counts)."""
    inputs = contestant.make_inputs(x)
    backward = mode == "forward_backward"
    for _ in range(2):  # a warm-up call, then the one whose profile is read
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            with torch.inference_mode(not backward):
                y = contestant.fn(*inputs)
            if backward:
                y.backward(torch.ones_like(y))
        for t in (*contestant.params, *inputs):
            t.grad = None
    names = [e.name for e in prof.events() if e.name.startswith("aten::")]
    return {name: names.count(name) for name in set(names)}


@pytest.mark.parametrize("qkv_bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_runs_exactly_the_bare_kernels_operators(dtype, qkv_bias):
    built = _contestants(dtype, qkv_bias)
    x = _x(dtype)
    ours, floor = (_aten_ops(built[name], x, "forward") for name in ("attnlib", "bare_kernels"))
    launching = {k for k in set(ours) | set(floor)
                 if ours.get(k, 0) != floor.get(k, 0) and not bench.is_view_operator(k)}
    assert launching <= bench.PROJECTION_OPERATORS  # no upcast, no mask, no copy
    assert ours["aten::linear"] == 4 and floor["aten::linear"] == 2  # 3 projections + out_proj
    assert not {"aten::cat", "aten::to", "aten::_to_copy", "aten::tril"} & set(ours)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_backward_launches_the_bare_kernels_operators(dtype):
    built = _contestants(dtype)
    x = _x(dtype)
    ours, floor = (_aten_ops(built[name], x, "forward_backward")
                   for name in ("attnlib", "bare_kernels"))

    def launching(counts):
        return {k: v for k, v in counts.items() if not bench.is_view_operator(k)}

    ours_launching, floor_launching = launching(ours), launching(floor)
    # The concatenated weight and bias (two cats) join split's backward (one, as in the floor).
    assert ours_launching.pop("aten::cat") == 3 and floor_launching.pop("aten::cat") == 1
    assert ours_launching == floor_launching
    # What else differs are views: attnlib's six QKV parameters get six views of one gradient.
    assert all(bench.is_view_operator(k) for k in set(ours) | set(floor)
               if ours.get(k, 0) != floor.get(k, 0) and k != "aten::cat")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_operator_parity_passes_for_attnlib_in_both_modes(dtype):
    parity = bench.operator_parity(_contestants(dtype), _x(dtype))
    assert parity["dtype"] == str(dtype).removeprefix("torch.")
    forward, forward_backward = parity["modes"]
    assert forward["mode"] == "forward" and forward["passed"]
    assert set(forward["launching_difference"]) <= bench.PROJECTION_OPERATORS
    assert forward_backward["passed"]
    assert set(forward_backward["launching_difference"]) == {"aten::cat"}
    text = bench.format_operator_parity(parity)
    assert text.count("PASS") == 2 and "FAIL" not in text


def test_operator_parity_catches_an_upcast_and_a_materialised_mask():
    built = _contestants(torch.bfloat16)
    good = built["attnlib"].fn

    def upcast(x):  # a float32 detour: two conversions
        return good(x).float().to(x.dtype)

    def with_mask(x):  # a causal mask built on every call
        n = x.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        return good(x) * mask[-1, -1]

    for fn, extra in ((upcast, "aten::_to_copy"), (with_mask, "aten::tril")):
        wrong = dict(built, attnlib=dataclasses.replace(built["attnlib"], fn=fn))
        parity = bench.operator_parity(wrong, _x(torch.bfloat16), modes=("forward",))
        (forward,) = parity["modes"]
        assert not forward["passed"] and extra in forward["launching_difference"]
        assert "FAIL  forward" in bench.format_operator_parity(parity)


def test_is_view_operator_reads_the_schemas_alias_annotations():
    for name in ("aten::view", "aten::transpose", "aten::split", "aten::slice",
                 "aten::as_strided", "aten::detach", "aten::t"):
        assert bench.is_view_operator(name), name
    for name in ("aten::linear", "aten::cat", "aten::copy_", "aten::clone", "aten::_to_copy",
                 "aten::fill_", "aten::no_such_operator", "ScaledDotProductAttention"):
        assert not bench.is_view_operator(name), name


def test_operator_counts_and_parity_reject_bad_arguments():
    built = _contestants(torch.float32)
    with pytest.raises(ValueError, match="unknown mode 'train'"):
        bench.operator_counts(built["attnlib"], _x(torch.float32), "train")
    with pytest.raises(TypeError, match="contestant must be a Contestant"):
        bench.operator_counts(built["attnlib"].fn, _x(torch.float32), "forward")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        bench.operator_counts(built["attnlib"], [1.0], "forward")
    with pytest.raises(KeyError, match="bare_kernels"):
        bench.operator_parity({"attnlib": built["attnlib"]}, _x(torch.float32))
