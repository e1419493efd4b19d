"""The full-layer benchmark (:func:`run_benchmark`): every contestant, sequence
length and mode, with the machine's metadata and a verdict per target, as one
JSON-ready dict. Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import __version__
from .._validation import check_positive_int as _check_positive_int
from ..device import get_device
from . import _constants
from ._constants import CONTESTANTS, MODES
from ._contestants import Contestant, attention_flops, check_agreement, make_contestants
from ._memory import peak_memory_bytes
from ._timing import check_mode, check_warmup, prepare_all, quantiles, time_prepared


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return device.type


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def check_seq_lens(seq_lens: object, name: str = "seq_lens") -> list[int]:
    """The distinct sequence lengths, in the order given."""
    if isinstance(seq_lens, (str, int)) or not isinstance(seq_lens, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {seq_lens!r}")
    if not seq_lens:
        raise ValueError(f"{name} must hold at least one sequence length, got none")
    for n in seq_lens:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"each seq_len must be an int, got {n!r}")
        if n <= 0:
            raise ValueError(f"seq_len={n} must be a positive number of tokens")
    return list(dict.fromkeys(seq_lens))


def _check_modes(modes: object) -> list[str]:
    if isinstance(modes, str) or not isinstance(modes, Sequence) or not modes:
        raise ValueError(f"modes must be a non-empty sequence of {MODES}, got {modes!r}")
    for mode in modes:
        check_mode(mode)
    return list(dict.fromkeys(modes))


def _metadata(built: dict[str, Contestant], device: torch.device, dtype: torch.dtype,
              **arguments: Any) -> dict[str, Any]:
    """The run's ``metadata`` (see :func:`run_benchmark`); ``arguments`` are copied in."""
    return {
        "torch_version": torch.__version__,
        "attnlib_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": _device_name(device),
        "num_threads": torch.get_num_threads(),
        **arguments,
        "dtype": str(dtype).removeprefix("torch."),
        "contestants": {name: c.description for name, c in built.items()},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": _load(),
        "memory_method": (
            "torch.cuda.max_memory_allocated above the start" if device.type == "cuda" else
            "peak running sum of torch.profiler CPU allocator events above the start"
            if device.type == "cpu" else "not measured on this device"),
        "flop_formula": "forward = 8*b*N*d^2 + 4*b*N^2*d (dense, causal mask not halved); "
                        "forward_backward = 3*forward; sdpa_only, flash_only: 4*b*N^2*d (x3)",
        "targets": {
            "attnlib_vs_torch_mha": _constants.TARGET_VS_TORCH_MHA,
            "attnlib_vs_torch_mha_forward_n_ge_1024":
                _constants.TARGET_VS_TORCH_MHA_FORWARD_LONG,
            "attnlib_vs_bare_kernels": _constants.TARGET_VS_BARE_KERNELS,
        },
    }


def _measure(built: dict[str, Contestant], x: torch.Tensor, mode: str, *, seed: int,
             reps: int, warmup: int,
             measure_memory: bool) -> tuple[dict[str, list[float]], dict[str, int | None]]:
    """Peak memory (one untimed call each, or None) and then the times of every contestant."""
    prepared = prepare_all(built, x, mode, seed=seed)
    memory: dict[str, int | None] = {}
    for name, p in prepared.items():
        p.clear_grads()
        memory[name] = peak_memory_bytes(p.step, x.device) if measure_memory else None
        p.clear_grads()
    return time_prepared(prepared, reps, warmup), memory


def _records(built: dict[str, Contestant], times: dict[str, list[float]],
             memory: dict[str, int | None], *, mode: str, num_tokens: int, batch: int,
             d_model: int, num_heads: int) -> list[dict[str, Any]]:
    """One record per contestant (see :func:`run_benchmark` for the keys)."""
    medians = {name: quantiles(t)[1] for name, t in times.items()}

    def ratio(median: float, other: str, wanted: bool) -> float | None:
        return median / medians[other] if wanted and other in medians else None

    records = []
    for name, t in times.items():
        q1, median, q3 = quantiles(t)
        full = built[name].full_layer
        flops = attention_flops(batch, num_tokens, d_model, num_heads,
                                backward=mode == "forward_backward", projections=full)
        mem = memory[name]
        records.append({
            "contestant": name, "mode": mode, "seq_len": num_tokens, "batch": batch,
            "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
            "iqr_ms": (q3 - q1) * 1e3, "min_ms": min(t) * 1e3,
            "times_ms": [v * 1e3 for v in t],
            "flops": flops, "gflops_per_s": flops / median / 1e9,
            "peak_memory_bytes": mem,
            "peak_memory_mb": None if mem is None else mem / 2**20,
            "time_vs_torch_mha": ratio(median, "torch_mha", full),
            "time_vs_bare_kernels": ratio(median, "bare_kernels", full),
            "time_vs_sdpa_only": ratio(median, "sdpa_only", not full),
        })
    return records


def _verdicts(times: dict[str, list[float]], *, mode: str,
              num_tokens: int) -> list[dict[str, Any]]:
    """attnlib against torch_mha and against the bare kernels, where both ran."""
    vs_torch = _constants.TARGET_VS_TORCH_MHA
    if mode == "forward" and num_tokens >= 1024:
        vs_torch = min(vs_torch, _constants.TARGET_VS_TORCH_MHA_FORWARD_LONG)
    verdicts = []
    for other, threshold in (("torch_mha", vs_torch),
                             ("bare_kernels", _constants.TARGET_VS_BARE_KERNELS)):
        if "attnlib" not in times or other not in times:
            continue
        ratio = quantiles(times["attnlib"])[1] / quantiles(times[other])[1]
        paired = statistics.median(
            a / o for a, o in zip(times["attnlib"], times[other], strict=False))
        verdicts.append({
            "target": f"attnlib_vs_{other}", "mode": mode, "seq_len": num_tokens,
            "ratio": ratio, "paired_ratio": paired, "threshold": threshold,
            "passed": bool(ratio <= threshold),
        })
    return verdicts


def run_benchmark(
    seq_lens: Sequence[int] = (256, 512, 1024, 2048),
    *,
    batch: int = 1,
    d_model: int = 768,
    num_heads: int = 12,
    modes: Sequence[str] = MODES,
    contestants: Sequence[str] = CONTESTANTS,
    reps: int = 15,
    warmup: int = 2,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    qkv_bias: bool = True,
    measure_memory: bool = True,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark and return its results as a JSON-ready dict.

    For each sequence length and mode: one untimed call per contestant to
    measure peak memory (:func:`peak_memory_bytes`; it doubles as a warm-up),
    then :func:`time_contestants`. Before timing, :func:`check_agreement`
    verifies that the full-layer contestants agree at the shortest length.

    Args:
        seq_lens: sequence lengths ``N`` to run. Default 256, 512, 1024, 2048.
        batch: sequences per call. Default 1.
        d_model: embedding size. Default 768.
        num_heads: heads; must divide ``d_model``. Default 12.
        modes: a subset of :data:`MODES`.
        contestants: a subset of :data:`CONTESTANTS`.
        reps: timed repetitions per (length, mode). Default 15.
        warmup: untimed repetitions before them. Default 2.
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        qkv_bias: biases on the query, key and value projections. Default True.
        measure_memory: measure peak memory (else ``peak_memory_bytes`` is None).
        seed: seed for weights and inputs.
        log: called with a progress line after each (length, mode); None is silent.

    Returns:
        A dict with these keys (the JSON schema, version 2; ``main`` adds
        ``memory_sweep`` and ``kernel_timing``, see :func:`run_memory_sweep`
        and :func:`run_kernel_timing`):

        * ``schema_version`` (int) and ``metadata`` (dict): ``torch_version``,
          ``attnlib_version``, ``python_version``, ``platform``, ``device``,
          ``device_name``, ``num_threads``, ``batch``, ``d_model``,
          ``num_heads``, ``head_dim``, ``dtype``, ``qkv_bias``, ``reps``,
          ``warmup``, ``seq_lens``, ``modes``, ``contestants``, ``timestamp``
          (ISO 8601, UTC), ``load_average_start``/``load_average_end``
          (1, 5, 15-minute load or None), ``memory_method``, ``flop_formula``,
          ``targets``.
        * ``records`` (list of dicts), one per contestant, mode and length:
          ``contestant``, ``mode``, ``seq_len``, ``batch``, ``median_ms``,
          ``q1_ms``, ``q3_ms``, ``iqr_ms``, ``min_ms``, ``times_ms`` (all
          timed repetitions), ``flops``, ``gflops_per_s`` (from the median),
          ``peak_memory_bytes`` and ``peak_memory_mb`` (MiB; None when not
          measured), ``time_vs_torch_mha`` and ``time_vs_bare_kernels`` (median
          time over theirs; None when that contestant is absent or this is
          an attention-only contestant), ``time_vs_sdpa_only`` (for the
          attention-only contestants ``sdpa_only`` and ``flash_only``; else None).
        * ``verdicts`` (list of dicts), one per target, mode and length where
          the contestants are present: ``target`` (``"attnlib_vs_torch_mha"``
          or ``"attnlib_vs_bare_kernels"``), ``mode``, ``seq_len``, ``ratio``
          (attnlib's median time over the other's), ``paired_ratio`` (median
          over repetitions of the per-repetition ratio, a noise check),
          ``threshold`` (largest allowed ratio: :data:`TARGET_VS_BARE_KERNELS`;
          :data:`TARGET_VS_TORCH_MHA`, or :data:`TARGET_VS_TORCH_MHA_FORWARD_LONG`
          in ``forward`` mode at N >= 1024), ``passed`` (bool).
        * ``all_targets_met`` (bool; True when there are no verdicts).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a sequence length, ``batch``, ``reps`` or a size is not
            positive (the message names it), ``warmup`` is negative,
            ``num_heads`` does not divide ``d_model``, or a mode or contestant
            is unknown or none is given.
        RuntimeError: the contestants disagree (see :func:`check_agreement`).
    """
    seq_lens = check_seq_lens(seq_lens)
    _check_positive_int("batch", batch)
    _check_positive_int("reps", reps)
    warmup = check_warmup(warmup)
    modes = _check_modes(modes)
    device = torch.device(device) if device is not None else get_device()
    built = make_contestants(d_model, num_heads, max(seq_lens), names=contestants,
                             qkv_bias=qkv_bias, device=device, dtype=dtype, seed=seed)
    metadata = _metadata(
        built, device, dtype, batch=batch, d_model=d_model, num_heads=num_heads,
        head_dim=d_model // num_heads, qkv_bias=qkv_bias, reps=reps, warmup=warmup,
        seq_lens=seq_lens, modes=modes,
    )
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    check_x = torch.randn(batch, min(seq_lens), d_model, generator=gen).to(device, dtype)
    check_agreement(built, check_x)

    records, verdicts = [], []
    for num_tokens in seq_lens:
        x = torch.randn(batch, num_tokens, d_model, generator=gen).to(device, dtype)
        for mode in modes:
            times, memory = _measure(built, x, mode, seed=seed + num_tokens, reps=reps,
                                     warmup=warmup, measure_memory=measure_memory)
            records += _records(built, times, memory, mode=mode, num_tokens=num_tokens,
                                batch=batch, d_model=d_model, num_heads=num_heads)
            verdicts += _verdicts(times, mode=mode, num_tokens=num_tokens)
            if log is not None:
                parts = ", ".join(f"{n} {quantiles(t)[1] * 1e3:.1f} ms" for n, t in times.items())
                log(f"N={num_tokens} {mode}: {parts}")
    metadata["load_average_end"] = _load()
    return {
        "schema_version": _constants.SCHEMA_VERSION,
        "metadata": metadata,
        "records": records,
        "verdicts": verdicts,
        "all_targets_met": all(v["passed"] for v in verdicts),
    }
