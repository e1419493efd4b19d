"""The command line, ``python -m attnlib.bench`` (:func:`main`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_positive_int as _check_positive_int
from . import _constants
from ._benchmark import check_seq_lens, run_benchmark
from ._constants import CONTESTANTS, MEMORY_SWEEP_SEQ_LENS, MODES
from ._contestants import make_contestants
from ._operators import format_operator_parity, operator_parity
from ._report import format_sweeps, format_table
from ._sweeps import plot_memory_sweep, run_kernel_timing, run_memory_sweep

_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           "float16": torch.float16, "bfloat16": torch.bfloat16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnlib.bench",
        description=(
            "Time causal multi-head self-attention (GPT-2-small layer size by default): "
            "attnlib's readable reference, attnlib's fast path, torch.nn.MultiheadAttention, "
            "the bare kernels attnlib needs (one fused QKV projection), and "
            "scaled_dot_product_attention and attnlib's flash_attention alone. "
            "Reports median time, GFLOP/s and peak memory, writes JSON, and checks the "
            "targets: attnlib at least 0.9x torch_mha's speed (and at most 0.5x its time "
            "in forward at N >= 1024), and within 1.03x of the bare kernels' time. Then a "
            "memory sweep of one attention call (N up to 16384, with a log-log plot) and "
            "flash_attention's time against torch's fused kernel at N=4096, 8 heads. "
            "attnlib must also launch the bare kernels' ATen operators (torch.profiler)."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seq-lens", type=int, nargs="+", default=None, metavar="N",
                   help="sequence lengths (default 256 512 1024 2048; --quick: 32 64)")
    p.add_argument("--batch", type=int, default=1, help="sequences per call")
    p.add_argument("--d-model", type=int, default=None,
                   help="embedding size (default 768; --quick: 64)")
    p.add_argument("--num-heads", type=int, default=None,
                   help="attention heads (default 12; --quick: 4)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="what to time")
    p.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS),
                   help="which implementations to time")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions per length and mode (default 15; --quick: 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed repetitions first (default 2; --quick: 1)")
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu or cuda (default: attnlib.get_device())")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="dtype")
    p.add_argument("--qkv-bias", action=argparse.BooleanOptionalAction, default=True,
                   help="biases on the query/key/value projections (torch's bias=True matches)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads before running (default: torch's choice)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--no-operator-check", action="store_true",
                   help="skip comparing attnlib's ATen operators with the bare kernels' "
                        "(torch.profiler, one call per mode at the shortest length)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    p.add_argument("--out", default="bench.json", help="where to write the JSON results")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 when a target is missed")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke test (d_model 64, 4 heads, N 32 64, 3 reps; "
                        "sweeps at N <= 256)")
    p.add_argument("--skip-layer", action="store_true",
                   help="skip the layer benchmark (run only the sweeps)")
    p.add_argument("--no-memory-sweep", action="store_true", help="skip the memory sweep")
    p.add_argument("--memory-seq-lens", type=int, nargs="+", default=None, metavar="N",
                   help="memory sweep lengths (default 256 ... 16384; --quick: 64 128 256)")
    p.add_argument("--max-reference-tokens", type=int, default=None,
                   help="largest N the readable path runs at in the memory sweep; beyond it "
                        "its memory is extrapolated (default 4096; --quick: 128)")
    p.add_argument("--plot", default="bench_memory.png",
                   help="where to save the memory sweep's log-log plot ('' for none)")
    p.add_argument("--no-kernel-timing", action="store_true",
                   help="skip timing flash_attention against torch's fused kernel")
    p.add_argument("--kernel-tokens", type=int, default=None,
                   help="N of the kernel timing (default 4096; --quick: 128)")
    p.add_argument("--kernel-heads", type=int, default=None,
                   help="heads of the kernel timing (default 8; --quick: 2)")
    p.add_argument("--kernel-block-sizes", type=int, nargs="+", default=None,
                   help="flash_attention block sizes to time (default 128 256 512; "
                        "--quick: 16 64)")
    p.add_argument("--kernel-reps", type=int, default=None,
                   help="timed repetitions of the kernel timing (default 5; --quick: 2)")
    p.add_argument("--triton", action=argparse.BooleanOptionalAction, default=None,
                   help="time chapter 11's Triton kernel in the kernel timing (default: on a "
                        "CUDA device where Triton imports)")
    return p


def _operator_check(result: dict[str, Any], seed: int) -> dict[str, Any]:
    """:func:`operator_parity` of attnlib and the bare kernels as the benchmark built them."""
    meta = result["metadata"]
    device, dtype = torch.device(meta["device"]), getattr(torch, meta["dtype"])
    num_tokens = min(meta["seq_lens"])
    built = make_contestants(meta["d_model"], meta["num_heads"], num_tokens,
                             names=["attnlib", "bare_kernels"], qkv_bias=meta["qkv_bias"],
                             device=device, dtype=dtype, seed=seed)
    gen = torch.Generator(device="cpu").manual_seed(seed + 2)
    x = torch.randn(meta["batch"], num_tokens, meta["d_model"], generator=gen)
    return operator_parity(built, x.to(device, dtype), modes=tuple(meta["modes"]))


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m attnlib.bench [options]``.

    Args:
        argv: the arguments (default ``sys.argv[1:]``); see ``--help``.

    Returns:
        The exit status: 0, or 1 with ``--check`` when a target is missed.
        Bad arguments (a non-positive size, an unknown device, ...) exit with
        status 2 and a message, as argparse does.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    quick = args.quick
    seq_lens = args.seq_lens or ([32, 64] if quick else [256, 512, 1024, 2048])
    d_model = args.d_model or (64 if quick else 768)
    num_heads = args.num_heads or (4 if quick else 12)
    reps = args.reps if args.reps is not None else (3 if quick else 15)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    if args.threads is not None:
        if args.threads <= 0:
            parser.error(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device) if args.device is not None else None
    except RuntimeError as exc:
        parser.error(f"--device {args.device!r} is not a torch device: {exc}")
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device!r} asked for CUDA, but CUDA is not available")

    def log(line: str) -> None:
        print(line, flush=True)

    dtype = _DTYPES[args.dtype]
    memory_lens = args.memory_seq_lens or ([64, 128, 256] if quick else
                                           list(MEMORY_SWEEP_SEQ_LENS))
    max_reference = args.max_reference_tokens or (128 if quick else 4096)
    kernel_tokens = args.kernel_tokens or (128 if quick else 4096)
    kernel_heads = args.kernel_heads or (2 if quick else 8)
    kernel_blocks = args.kernel_block_sizes or ([16, 64] if quick else [128, 256, 512])
    kernel_reps = args.kernel_reps or (2 if quick else 5)
    try:
        # The sweeps' arguments are checked before the layer benchmark runs.
        if not args.no_memory_sweep:
            check_seq_lens(memory_lens, "memory_seq_lens")
            _check_positive_int("max_reference_tokens", max_reference)
        if not args.no_kernel_timing:
            for name, value in (("kernel_tokens", kernel_tokens), ("kernel_heads", kernel_heads),
                                ("kernel_reps", kernel_reps)):
                _check_positive_int(name, value)
            for block_size in kernel_blocks:
                _check_positive_int("block_size", block_size)
        if args.skip_layer:
            result = {"schema_version": _constants.SCHEMA_VERSION, "metadata": {}, "records": [],
                      "verdicts": [], "all_targets_met": True}
        else:
            result = run_benchmark(
                seq_lens, batch=args.batch, d_model=d_model, num_heads=num_heads,
                modes=args.modes, contestants=args.contestants, reps=reps, warmup=warmup,
                device=device, dtype=dtype, qkv_bias=args.qkv_bias,
                measure_memory=not args.no_memory, seed=args.seed, log=log)
        memory = None if args.no_memory_sweep else run_memory_sweep(
            memory_lens, max_reference_tokens=max_reference, device=device, dtype=dtype,
            seed=args.seed, log=log)
        kernel = None if args.no_kernel_timing else run_kernel_timing(
            kernel_tokens, num_heads=kernel_heads, block_sizes=kernel_blocks,
            reps=kernel_reps, warmup=1, device=device, dtype=dtype, seed=args.seed,
            triton=args.triton)
        operators = None
        if not (args.skip_layer or args.no_operator_check) and {
                "attnlib", "bare_kernels"} <= set(args.contestants):
            operators = _operator_check(result, args.seed)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if operators is not None:
        result["operators"] = operators
    result["memory_sweep"] = memory
    result["kernel_timing"] = kernel
    sweep_verdicts = [*(memory or {}).get("verdicts", []), *(kernel or {}).get("verdicts", [])]
    same_operators = operators is None or all(m["passed"] for m in operators["modes"])
    result["all_targets_met"] = bool(
        result["all_targets_met"] and all(v["passed"] for v in sweep_verdicts)
        and same_operators)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print()
    if not args.skip_layer:
        print(format_table(result))
        print()
    if operators is not None:
        print(format_operator_parity(operators))
        print()
    print(format_sweeps(memory, kernel))
    print(f"\nwrote {os.path.abspath(args.out)}")
    if memory is not None and args.plot:
        print(f"wrote {os.path.abspath(plot_memory_sweep(memory, args.plot))}")
    if args.check and not result["all_targets_met"]:
        return 1
    return 0
