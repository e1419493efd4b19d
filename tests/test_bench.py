"""Tests for attnlib.bench: FLOP counts, fairness of the contestants, memory, JSON and CLI.

No timing assertions: speed is what ``python -m attnlib.bench`` measures.
"""

import dataclasses
import json

import pytest
import torch

from attnlib import bench
from attnlib.functional import scaled_dot_product_attention as reference_sdpa

D_MODEL, NUM_HEADS, HEAD_DIM = 64, 4, 16


# --- FLOP formula -------------------------------------------------------------------------


def test_attention_flops_hand_computed_small_case():
    # b=1, N=2, d=4, h=2 (head_dim=2):
    # projections 4 * 2*1*2*4*4 = 256; attention 2 * 2*1*2*2*2*2 = 64.
    assert bench.attention_flops(1, 2, 4, 2) == 320
    assert bench.attention_flops(1, 2, 4, 2, backward=True) == 960
    assert bench.attention_flops(1, 2, 4, 2, projections=False) == 64


def test_attention_flops_gpt2_small_layer():
    # 8*1024*768^2 = 4_831_838_208 and 4*1024^2*768 = 3_221_225_472.
    assert bench.attention_flops(1, 1024, 768, 12) == 8_053_063_680
    assert bench.attention_flops(2, 1024, 768, 12) == 2 * 8_053_063_680


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((1, 0, 64, 4), ValueError, "num_tokens=0"),
        ((0, 8, 64, 4), ValueError, "batch=0"),
        ((1, 8, 10, 3), ValueError, "d_model=10 is not divisible by num_heads=3"),
        ((1, 8.0, 64, 4), TypeError, "num_tokens must be an int"),
        ((1, True, 64, 4), TypeError, "num_tokens must be an int"),
    ],
)
def test_attention_flops_rejects_bad_sizes(args, error, match):
    with pytest.raises(error, match=match):
        bench.attention_flops(*args)


# --- the contestants compute the same function ---------------------------------------------


def _x(num_tokens=32, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, num_tokens, D_MODEL, generator=gen)


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_full_layer_contestants_match_attnlib_fast_path(qkv_bias):
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, qkv_bias=qkv_bias, device="cpu")
    x = _x()
    outputs, input_grads = {}, {}
    grad_output = torch.randn(2, 32, D_MODEL, generator=torch.Generator().manual_seed(1))
    for name, c in contestants.items():
        if not c.full_layer:
            continue
        (x_leaf,) = c.make_inputs(x)
        out = c.fn(x_leaf)
        out.backward(grad_output)
        outputs[name], input_grads[name] = out.detach(), x_leaf.grad
    assert set(outputs) == {"reference", "attnlib", "torch_mha", "bare_kernels"}
    assert outputs["attnlib"].shape == (2, 32, D_MODEL)
    for name in outputs:
        torch.testing.assert_close(outputs[name], outputs["attnlib"], msg=name)
        torch.testing.assert_close(input_grads[name], input_grads["attnlib"], msg=name)


def test_contestants_share_weights_but_not_gradients():
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu")
    mha_params = {id(p) for p in contestants["attnlib"].params}
    for name in ("torch_mha", "bare_kernels"):
        assert mha_params.isdisjoint(id(p) for p in contestants[name].params), name
    # attnlib, qkv_bias=True: 3 weights + 3 biases + out_proj weight and bias.
    assert len(contestants["attnlib"].params) == 8
    # The floor packs the three projections into ONE (3 * d_model, d_model) weight.
    w_qkv, b_qkv, w_o, b_o = contestants["bare_kernels"].params
    assert w_qkv.shape == (3 * D_MODEL, D_MODEL) and b_qkv.shape == (3 * D_MODEL,)
    assert w_o.shape == (D_MODEL, D_MODEL) and b_o.shape == (D_MODEL,)
    no_bias = bench.make_contestants(D_MODEL, NUM_HEADS, 32, qkv_bias=False, device="cpu")
    assert [p.shape for p in no_bias["bare_kernels"].params] == [
        (3 * D_MODEL, D_MODEL), (D_MODEL, D_MODEL), (D_MODEL,)]


def test_bare_kernels_run_one_projection_gemm():
    # One F.linear for q, k, v and one for out_proj: two addmm/mm calls in the forward.
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, names=["bare_kernels"],
                                         device="cpu")
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        contestants["bare_kernels"].fn(_x(16, batch=1))
    gemms = [e for e in prof.events() if e.name in ("aten::addmm", "aten::mm")]
    assert len(gemms) == 2, [e.name for e in gemms]


def test_torch_mha_is_causal():
    # Changing the last token must leave the earlier outputs unchanged.
    built = bench.make_contestants(D_MODEL, NUM_HEADS, 16, names=["torch_mha"], device="cpu")
    c = built["torch_mha"]
    x = _x(16, batch=1)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        y, y2 = c.fn(x), c.fn(x2)
    torch.testing.assert_close(y[:, :-1], y2[:, :-1])
    assert not torch.allclose(y[:, -1], y2[:, -1])


def test_flash_only_computes_sdpa_only():
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu")
    inputs = contestants["sdpa_only"].make_inputs(_x())
    assert not contestants["flash_only"].full_layer
    with torch.no_grad():
        torch.testing.assert_close(contestants["flash_only"].fn(*inputs),
                                   contestants["sdpa_only"].fn(*inputs))


def test_sdpa_only_is_the_attention_kernel_inside_attnlib():
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu")
    x = _x()
    c = contestants["sdpa_only"]
    assert not c.full_layer
    queries, keys, values = c.make_inputs(x)
    assert queries.shape == (2, 32, D_MODEL) and queries.requires_grad
    with torch.no_grad():
        context_vec = c.fn(queries, keys, values)  # (b, num_heads, num_tokens, head_dim)
        heads = [  # each (b, num_heads, num_tokens, head_dim)
            t.view(2, 32, NUM_HEADS, HEAD_DIM).transpose(1, 2) for t in (queries, keys, values)
        ]
        expected = reference_sdpa(*heads, is_causal=True)
        torch.testing.assert_close(context_vec, expected)
        # Merging the heads and applying out_proj gives attnlib's layer output.
        mha = contestants["attnlib"]
        merged = context_vec.transpose(1, 2).reshape(2, 32, D_MODEL)  # (b, num_tokens, d_model)
        w_o, b_o = mha.params[-2:]
        torch.testing.assert_close(torch.nn.functional.linear(merged, w_o, b_o), mha.fn(x))


def test_check_agreement_passes_and_catches_a_wrong_contestant():
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu")
    x = _x()
    bench.check_agreement(contestants, x)
    wrong = dict(contestants)
    good = contestants["bare_kernels"].fn
    wrong["bare_kernels"] = dataclasses.replace(
        contestants["bare_kernels"], fn=lambda x: good(x) + 0.01)
    with pytest.raises(RuntimeError, match="'bare_kernels' and 'reference' disagree"):
        bench.check_agreement(wrong, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_check_agreement_in_half_precision_allows_rounding_but_not_a_wrong_layer(dtype):
    """In bfloat16 the readable layer and the fast path differ by a unit in the last
    place (float32's tolerance rejected that, the crash of `--dtype bfloat16`); a
    contestant that is off by 3 % is still caught."""
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu", dtype=dtype)
    x = _x().to(dtype)
    if dtype == torch.bfloat16:  # 44 % of the elements differ by up to 0.0039 here
        with pytest.raises(RuntimeError, match="disagree"):
            bench.check_agreement(contestants, x, rtol=1e-3, atol=1e-4)
    bench.check_agreement(contestants, x)  # the dtype's own tolerance
    wrong = dict(contestants)
    good = contestants["bare_kernels"].fn
    wrong["bare_kernels"] = dataclasses.replace(
        contestants["bare_kernels"], fn=lambda x: good(x) * 1.03)
    with pytest.raises(RuntimeError, match="'bare_kernels' and 'reference' disagree"):
        bench.check_agreement(wrong, x)


def test_agreement_tolerance_is_two_units_in_the_last_place_but_never_tighter_than_float32s():
    assert bench.agreement_tolerance(torch.float32) == (1e-3, 1e-4)
    assert bench.agreement_tolerance(torch.float64) == (1e-3, 1e-4)
    assert bench.agreement_tolerance(torch.bfloat16) == (2**-6, 2**-6)
    assert bench.agreement_tolerance(torch.float16) == (2**-9, 2**-9)
    for bad in (torch.int64, "float32", None):
        with pytest.raises(TypeError, match="floating-point torch.dtype"):
            bench.agreement_tolerance(bad)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"names": ["reference", "flash"]}, ValueError, "unknown contestant 'flash'"),
        ({"names": []}, ValueError, "at least one contestant"),
        ({"names": "attnlib"}, TypeError, "not the string 'attnlib'"),
        ({"qkv_bias": 1}, TypeError, "qkv_bias must be a bool"),
        ({"dtype": torch.int64}, TypeError, "floating-point"),
    ],
)
def test_make_contestants_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        bench.make_contestants(D_MODEL, NUM_HEADS, 32, device="cpu", **kwargs)


def test_make_contestants_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="d_model=64 is not divisible by num_heads=5"):
        bench.make_contestants(64, 5, 32, device="cpu")


# --- memory and timing ----------------------------------------------------------------------


def test_peak_memory_counts_a_known_allocation():
    peak = bench.peak_memory_bytes(lambda: torch.empty(1000, 1000), "cpu")
    assert 4_000_000 <= peak < 4_100_000
    assert bench.peak_memory_bytes(lambda: None, "cpu") == 0
    with pytest.raises(TypeError, match="fn must be callable"):
        bench.peak_memory_bytes(42, "cpu")


@pytest.mark.parametrize("mode", bench.MODES)
def test_reference_needs_more_memory_than_fast_path(mode):
    # The readable path materialises (b, num_heads, N, N) = 4*256*256 floats = 1 MiB per matrix.
    num_tokens = 256
    result = bench.run_benchmark([num_tokens], d_model=D_MODEL, num_heads=NUM_HEADS,
                                 modes=[mode], contestants=["reference", "attnlib"], reps=1,
                                 warmup=0, device="cpu")
    peaks = {r["contestant"]: r["peak_memory_bytes"] for r in result["records"]}
    weights_bytes = NUM_HEADS * num_tokens * num_tokens * 4
    if mode == "forward":
        # The fused kernel never holds an (N, N) matrix; the readable path holds several.
        assert peaks["attnlib"] < weights_bytes
        assert peaks["reference"] > 2 * weights_bytes
    else:
        # The backward of the readable path keeps the weights and computes their gradient,
        # two (N, N) matrices at least. How much the fused backward needs is torch's
        # choice of CPU kernel, which changes between releases (2.8 MB under torch 2.11,
        # 0.9 MiB under 2.13), so it is not asserted.
        assert peaks["reference"] >= 2 * weights_bytes


def test_time_contestants_returns_reps_positive_times_and_clears_grads():
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 16, device="cpu")
    times = bench.time_contestants(contestants, _x(16, batch=1), "forward_backward",
                                   reps=2, warmup=1)
    assert set(times) == set(bench.CONTESTANTS)
    assert all(len(t) == 2 and min(t) > 0 for t in times.values())
    assert all(p.grad is None for c in contestants.values() for p in c.params)
    with pytest.raises(ValueError, match="unknown mode 'backward'"):
        bench.time_contestants(contestants, _x(16), "backward")
    with pytest.raises(ValueError, match="reps=0"):
        bench.time_contestants(contestants, _x(16), "forward", reps=0)


@pytest.mark.parametrize("warmup, error", [(1.0, TypeError), (True, TypeError), (-1, ValueError)])
def test_warmup_is_checked_alike_everywhere(warmup, error):
    # A wrong type is a TypeError and a negative count a ValueError, in every entry point.
    contestants = bench.make_contestants(D_MODEL, NUM_HEADS, 16, names=["attnlib"], device="cpu")
    calls = [
        lambda: bench.time_contestants(contestants, _x(16), "forward", warmup=warmup),
        lambda: bench.run_benchmark([8], d_model=D_MODEL, num_heads=NUM_HEADS, warmup=warmup,
                                    device="cpu"),
        lambda: bench.run_kernel_timing(16, warmup=warmup, device="cpu"),
    ]
    for call in calls:
        with pytest.raises(error, match="warmup"):
            call()


def test_setting_a_target_on_the_package_changes_the_verdict(monkeypatch):
    kwargs = dict(d_model=D_MODEL, num_heads=NUM_HEADS, modes=["forward"], reps=1, warmup=0,
                  contestants=["attnlib", "bare_kernels"], measure_memory=False, device="cpu")
    monkeypatch.setattr(bench, "TARGET_VS_BARE_KERNELS", 0.0)
    (verdict,) = bench.run_benchmark([8], **kwargs)["verdicts"]
    assert verdict["threshold"] == 0.0 and verdict["passed"] is False
    monkeypatch.setattr(bench, "TARGET_VS_BARE_KERNELS", 1e9)
    (verdict,) = bench.run_benchmark([8], **kwargs)["verdicts"]
    assert verdict["threshold"] == 1e9 and verdict["passed"] is True


# --- run_benchmark, JSON and the command line ----------------------------------------------


@pytest.mark.parametrize(
    "seq_lens, match",
    [([0], "seq_len=0"), ([32, -5], "seq_len=-5"), ([], "at least one sequence length")],
)
def test_run_benchmark_rejects_bad_seq_lens(seq_lens, match):
    with pytest.raises(ValueError, match=match):
        bench.run_benchmark(seq_lens, d_model=D_MODEL, num_heads=NUM_HEADS, device="cpu")


def test_run_benchmark_rejects_unknown_mode_and_contestant():
    with pytest.raises(ValueError, match="unknown mode 'train'"):
        bench.run_benchmark([8], d_model=D_MODEL, num_heads=NUM_HEADS, modes=["train"])
    with pytest.raises(ValueError, match="unknown contestant 'xformers'"):
        bench.run_benchmark([8], d_model=D_MODEL, num_heads=NUM_HEADS, contestants=["xformers"])


@pytest.mark.slow  # over 15 s on 2 cores
def test_quick_run_writes_json_with_the_documented_schema(tmp_path, monkeypatch, capsys):
    # Impossible thresholds make every target fail: --check must then exit 1.
    monkeypatch.setattr(bench, "TARGET_VS_TORCH_MHA", 0.0)
    monkeypatch.setattr(bench, "TARGET_VS_BARE_KERNELS", 0.0)
    out = tmp_path / "bench.json"
    status = bench.main(["--quick", "--seq-lens", "32", "--reps", "2", "--warmup", "0",
                         "--device", "cpu", "--out", str(out), "--check",
                         "--plot", str(tmp_path / "m.png")])
    assert status == 1
    printed = capsys.readouterr().out
    assert "FAIL  forward" in printed and "median ms" in printed

    result = json.loads(out.read_text())
    assert set(result) == {"schema_version", "metadata", "records", "verdicts", "all_targets_met",
                           "memory_sweep", "kernel_timing", "operators"}
    assert "Operators (torch.profiler, float32, cpu, N=32)" in printed
    assert [(m["mode"], m["passed"]) for m in result["operators"]["modes"]] == [
        ("forward", True), ("forward_backward", True)]
    assert result["schema_version"] == 2
    meta = result["metadata"]
    for key in ("torch_version", "device", "device_name", "num_threads", "batch", "d_model",
                "num_heads", "head_dim", "dtype", "qkv_bias", "reps", "warmup", "seq_lens",
                "modes", "contestants", "timestamp", "memory_method", "flop_formula", "targets",
                "load_average_start", "load_average_end"):
        assert key in meta, key
    assert (meta["d_model"], meta["num_heads"], meta["head_dim"]) == (64, 4, 16)
    assert (meta["reps"], meta["warmup"], meta["seq_lens"]) == (2, 0, [32])
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert meta["torch_version"] == torch.__version__

    records = result["records"]
    assert len(records) == len(bench.CONTESTANTS) * len(bench.MODES)
    assert {(r["contestant"], r["mode"]) for r in records} == {
        (c, m) for c in bench.CONTESTANTS for m in bench.MODES}
    for r in records:
        assert r["seq_len"] == 32 and r["batch"] == 1
        assert len(r["times_ms"]) == 2
        assert r["q1_ms"] <= r["median_ms"] <= r["q3_ms"]
        # Every call allocates at least its output: (1, 32, 64) float32 for a layer,
        # (1, 4, 32, 16) for the attention kernels alone, 8 KiB either way.
        assert r["peak_memory_bytes"] >= 32 * 64 * 4
        backward = r["mode"] == "forward_backward"
        kernel_only = r["contestant"] in ("sdpa_only", "flash_only")
        assert r["flops"] == bench.attention_flops(
            1, 32, 64, 4, backward=backward, projections=not kernel_only)
        assert r["gflops_per_s"] == pytest.approx(r["flops"] / r["median_ms"] / 1e6)
        if kernel_only:
            assert r["time_vs_torch_mha"] is None and r["time_vs_bare_kernels"] is None
            sdpa = next(o for o in records if o["contestant"] == "sdpa_only"
                        and o["mode"] == r["mode"])
            assert r["time_vs_sdpa_only"] == pytest.approx(r["median_ms"] / sdpa["median_ms"])
        else:
            assert r["time_vs_sdpa_only"] is None
        if r["contestant"] == "torch_mha":
            assert r["time_vs_torch_mha"] == 1.0
    verdicts = result["verdicts"]
    assert {(v["target"], v["mode"]) for v in verdicts} == {
        (t, m) for t in ("attnlib_vs_torch_mha", "attnlib_vs_bare_kernels") for m in bench.MODES}
    assert not any(v["passed"] for v in verdicts)
    assert result["all_targets_met"] is False
    sweep = result["memory_sweep"]
    assert [r["seq_len"] for r in sweep["records"]] == [64, 128, 256]
    assert result["kernel_timing"]["metadata"]["num_tokens"] == 128
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_without_check_a_missed_target_still_exits_0(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "TARGET_VS_BARE_KERNELS", 0.0)
    out = tmp_path / "b.json"
    status = bench.main(["--quick", "--seq-lens", "16", "--reps", "1", "--warmup", "0",
                         "--modes", "forward", "--contestants", "attnlib", "bare_kernels",
                         "--no-memory", "--device", "cpu", "--out", str(out),
                         "--no-memory-sweep", "--no-kernel-timing"])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["memory_sweep"] is None and result["kernel_timing"] is None
    assert [v["target"] for v in result["verdicts"]] == ["attnlib_vs_bare_kernels"]
    assert all(r["peak_memory_bytes"] is None for r in result["records"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq-lens", "0"], "seq_len=0"),
        (["--seq-lens", "64", "--batch", "0"], "batch=0"),
        (["--d-model", "30", "--num-heads", "4"], "d_model=30 is not divisible by num_heads=4"),
        (["--contestants", "flash"], "invalid choice: 'flash'"),
        (["--device", "no_such_device"], "not a torch device"),
        (["--kernel-block-sizes", "0"], "block_size must be a positive int"),
        (["--memory-seq-lens", "-4"], "seq_len=-4"),
    ],
)
def test_cli_rejects_bad_arguments(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--quick", "--out", str(tmp_path / "x.json"), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv", [["--kernel-block-sizes", "0"], ["--memory-seq-lens", "-4"],
                                  ["--kernel-reps", "-1"]])
def test_cli_checks_the_sweeps_arguments_before_running_the_layer(argv, tmp_path, monkeypatch):
    import attnlib.bench._cli as cli

    def layer_ran(*args, **kwargs):
        raise AssertionError("the layer benchmark ran before a bad sweep argument was refused")

    monkeypatch.setattr(cli, "run_benchmark", layer_ran)
    with pytest.raises(SystemExit) as info:
        bench.main(["--quick", "--out", str(tmp_path / "x.json"), *argv])
    assert info.value.code == 2


def test_help_documents_the_options(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--help"])
    assert info.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: python -m attnlib.bench")
    for option in ("--seq-lens", "--modes", "--contestants", "--reps", "--out", "--check",
                   "--quick", "--device", "--batch", "--qkv-bias"):
        assert option in usage


# --- the memory sweep and the kernel timing --------------------------------------------------


def test_loglog_slope():
    assert bench.loglog_slope([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)
    assert bench.loglog_slope([8, 16, 32], [5, 10, 20]) == pytest.approx(1.0)
    assert bench.loglog_slope([8, 16], [5, None]) is None
    assert bench.loglog_slope([8], [5]) is None


@pytest.mark.slow  # over 15 s on 2 cores
def test_memory_sweep_measures_the_readable_path_quadratic_and_flash_linear():
    sweep = bench.run_memory_sweep([128, 256, 512, 1024], max_reference_tokens=512,
                                   block_size=32, device="cpu")
    records = {r["seq_len"]: r for r in sweep["records"]}
    for n, r in records.items():
        assert r["predicted_scores_weights_bytes"] == 2 * n * n * 4
        assert r["input_bytes"] == 3 * n * 64 * 4
    for n in (128, 256, 512):  # measured: at least the predicted scores and weights
        assert records[n]["reference_peak_bytes"] >= records[n]["predicted_scores_weights_bytes"]
        assert records[n]["reference_extrapolated_bytes"] is None
        assert records[n]["flash_attention_peak_bytes"] < records[n]["reference_peak_bytes"]
    assert records[1024]["reference_peak_bytes"] is None
    # The extrapolation follows the fitted power law: about 4x the value at 512.
    assert records[1024]["reference_extrapolated_bytes"] == pytest.approx(
        4 * records[512]["reference_peak_bytes"], rel=0.05)
    assert sweep["slopes"]["reference"] == pytest.approx(2.0, abs=0.05)
    assert sweep["slopes"]["flash_attention"] < 1.3
    targets = {v["target"]: v for v in sweep["verdicts"]}
    assert targets["reference_scores_weights_over_1_GiB"]["passed"] is False  # N is small here
    assert targets["flash_attention_peak_under_128_MiB"]["passed"] is True
    assert targets["reference_slope_near_2"]["passed"] is True


def test_memory_sweep_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seq_len=0"):
        bench.run_memory_sweep([0], device="cpu")
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        bench.run_memory_sweep([16], block_size=0, device="cpu")
    with pytest.raises(TypeError, match="seq_lens must be a sequence"):
        bench.run_memory_sweep(16, device="cpu")


def test_plot_memory_sweep_writes_a_png(tmp_path):
    sweep = bench.run_memory_sweep([32, 64, 128], max_reference_tokens=64, device="cpu")
    path = bench.plot_memory_sweep(sweep, tmp_path / "memory.png")
    assert path == str(tmp_path / "memory.png")
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"


def test_kernel_timing_reports_ratios_to_torch():
    timing = bench.run_kernel_timing(64, num_heads=2, block_sizes=[16, 32], reps=2, warmup=0,
                                     device="cpu")
    records = timing["records"]
    assert [r["block_size"] for r in records] == [None, 16, 32]
    assert records[0]["contestant"] == "sdpa" and records[0]["time_vs_sdpa"] == 1.0
    for r in records:
        assert len(r["times_ms"]) == 2 and r["q1_ms"] <= r["median_ms"] <= r["q3_ms"]
        assert r["time_vs_sdpa"] == pytest.approx(r["median_ms"] / records[0]["median_ms"])
    best = min(records[1:], key=lambda r: r["median_ms"])
    assert timing["best_block_size"] == best["block_size"]
    (verdict,) = timing["verdicts"]
    assert verdict["value"] == best["time_vs_sdpa"] and verdict["threshold"] == 3.0
    with pytest.raises(ValueError, match="block_sizes must be a non-empty"):
        bench.run_kernel_timing(64, block_sizes=[], device="cpu")
