"""Sweeps of one attention kernel: peak memory against N
(:func:`run_memory_sweep`, :func:`loglog_slope`, :func:`plot_memory_sweep`)
and ``flash_attention``'s time per block size against torch's fused kernel
(:func:`run_kernel_timing`). Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._validation import check_positive_int as _check_positive_int
from ..device import get_device
from ..flash import DEFAULT_BLOCK_SIZE, flash_attention
from ..flash_triton import flash_attention_triton
from ..functional import scaled_dot_product_attention as _readable
from . import _constants
from ._benchmark import check_seq_lens
from ._constants import MEMORY_SWEEP_SEQ_LENS
from ._contestants import Contestant, agreement_tolerance
from ._memory import fmt_bytes, peak_memory_bytes
from ._timing import check_warmup, prepare_call, quantiles, time_prepared

KERNELS = ("reference", "sdpa", "flash_attention")


def _attention_inputs(batch: int, num_heads: int, num_tokens: int, head_dim: int,
                      device: torch.device, dtype: torch.dtype,
                      seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (batch, num_heads, num_tokens, head_dim)
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3))


def loglog_slope(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """Least-squares slope of ``log(y)`` against ``log(x)`` over the pairs with ``y > 0``.

    A quantity that grows like ``x**p`` has slope ``p``: 2 for an ``N x N``
    matrix, 1 for a linear one.

    Args:
        xs: positive abscissae (sequence lengths).
        ys: the measured values, same length; None or non-positive entries are skipped.

    Returns:
        The slope, or None with fewer than two usable pairs.

    Raises:
        ValueError: ``xs`` and ``ys`` differ in length.
    """
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True)
              if y is not None and y > 0]
    if len(points) < 2:
        return None
    mean_x = sum(p[0] for p in points) / len(points)
    mean_y = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mean_x) ** 2 for p in points)
    sxy = sum((p[0] - mean_x) * (p[1] - mean_y) for p in points)
    return sxy / sxx if sxx > 0 else None


def run_memory_sweep(
    seq_lens: Sequence[int] = MEMORY_SWEEP_SEQ_LENS,
    *,
    num_heads: int = 1,
    head_dim: int = 64,
    is_causal: bool = True,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_reference_tokens: int = 4096,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    triton: bool | None = None,
) -> dict[str, Any]:
    """Peak memory of one attention call against the number of tokens N.

    For each N, queries, keys and values ``(1, num_heads, N, head_dim)`` are
    made first; then, under :func:`torch.inference_mode`, the peak memory
    above them (:func:`peak_memory_bytes`) of one call of each kernel:

    * ``reference`` - :func:`attnlib.functional.scaled_dot_product_attention`
      with ``return_weights=True`` (the readable path: it holds the scores
      and the weights, each ``(1, num_heads, N, N)``); measured only up to
      ``max_reference_tokens`` and extrapolated beyond with the power law
      fitted to the measured points (``reference_extrapolated_bytes``);
    * ``sdpa`` - :func:`torch.nn.functional.scaled_dot_product_attention`;
    * ``flash_attention`` - :func:`attnlib.functional.flash_attention`;
    * with ``triton``, ``flash_attention_triton`` - chapter 11's kernel,
      :func:`attnlib.flash_triton.flash_attention_triton`.

    The N² term is predicted: scores and weights need
    ``2 * num_heads * N**2 * element_size`` bytes.

    Args:
        seq_lens: the N to measure. Default :data:`MEMORY_SWEEP_SEQ_LENS`
            (256 to 16 384).
        num_heads: heads per call. Default 1.
        head_dim: ``d_k = d_v``. Default 64.
        is_causal: causal attention (top-left). Default True.
        block_size: ``flash_attention``'s tile size.
        max_reference_tokens: the largest N at which the readable path is run
            (it needs about ``3 * num_heads * N**2 * element_size`` bytes).
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        seed: seed of the inputs.
        log: called with one progress line per N; None is silent.
        triton: measure the Triton kernel too. None (default): on a CUDA device
            where Triton can be imported (see :func:`run_kernel_timing`).

    Returns:
        A JSON-ready dict: ``metadata`` (the arguments, ``device``,
        ``element_size``); ``records``, one per N: ``seq_len``,
        ``input_bytes``, ``predicted_scores_weights_bytes``, and
        ``reference_peak_bytes`` (None where not run), ``sdpa_peak_bytes``,
        ``flash_attention_peak_bytes`` (and ``flash_attention_triton_peak_bytes``
        with ``triton``), ``reference_extrapolated_bytes``
        (None where measured); ``slopes``: the log-log slope of each kernel's
        peak against N (:func:`loglog_slope`; for ``flash_attention`` and
        ``sdpa`` over the upper half of the N, where the part that grows with
        N dominates the fixed tile workspace), and ``reference_fit``, the
        fitted ``log2`` coefficient and exponent; ``verdicts``: readable path's
        predicted scores and weights at the largest N above
        :data:`TARGET_REFERENCE_MEMORY_BYTES` (1 GiB), ``flash_attention``'s
        peak at the largest N below :data:`TARGET_FLASH_MEMORY_BYTES` (128
        MiB), and the slopes (reference within 1.8-2.2, flash_attention at
        most 1.2), each with ``target``, ``value``, ``threshold``, ``passed``.

    Raises:
        TypeError, ValueError: a sequence length or size is not a positive int.
    """
    seq_lens = sorted(check_seq_lens(seq_lens))
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim),
                        ("block_size", block_size),
                        ("max_reference_tokens", max_reference_tokens)):
        _check_positive_int(name, value)
    device = torch.device(device) if device is not None else get_device()
    element_size = torch.empty((), dtype=dtype).element_size()
    triton = _use_triton(triton, device)
    calls = _memory_calls(is_causal, block_size, triton=triton)
    records = []
    for num_tokens in seq_lens:
        qkv = _attention_inputs(1, num_heads, num_tokens, head_dim, device, dtype,
                                seed + num_tokens)
        record = _memory_record(calls, qkv, device,
                                run_reference=num_tokens <= max_reference_tokens)
        records.append(record)
        if log is not None:
            parts = ", ".join(f"{name} {fmt_bytes(record[f'{name}_peak_bytes'])}"
                              for name in calls)
            log(f"memory N={num_tokens}: {parts}")
    fit = _extrapolate_reference(records)
    slopes = _memory_slopes(records, fit)
    return {
        "metadata": {
            "device": str(device), "dtype": str(dtype).removeprefix("torch."),
            "element_size": element_size, "batch": 1, "num_heads": num_heads,
            "head_dim": head_dim, "is_causal": is_causal, "block_size": block_size,
            "max_reference_tokens": max_reference_tokens, "seq_lens": seq_lens,
            "triton": triton,
            "memory_method": "peak_memory_bytes under torch.inference_mode, above the inputs",
        },
        "records": records,
        "slopes": slopes,
        "reference_fit": fit,
        "verdicts": _memory_verdicts(records[-1], slopes),
    }


def _memory_record(calls: dict[str, Callable[..., object]], qkv: tuple[torch.Tensor, ...],
                   device: torch.device, *, run_reference: bool) -> dict[str, Any]:
    """One N of the memory sweep: its sizes and each kernel's peak (see run_memory_sweep)."""
    _, num_heads, num_tokens, _ = qkv[0].shape
    element_size = qkv[0].element_size()
    record: dict[str, Any] = {
        "seq_len": num_tokens,
        "input_bytes": sum(t.numel() for t in qkv) * element_size,
        "predicted_scores_weights_bytes": 2 * num_heads * num_tokens**2 * element_size,
    }
    with torch.inference_mode():
        for name, call in calls.items():
            if name == "reference" and not run_reference:
                record["reference_peak_bytes"] = None
                continue
            record[f"{name}_peak_bytes"] = peak_memory_bytes(
                functools.partial(call, *qkv), device)
    return record


def _memory_calls(is_causal: bool, block_size: int, *,
                  triton: bool) -> dict[str, Callable[..., object]]:
    """The kernels of the memory sweep, each called as ``call(q, k, v)``."""

    def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> object:
        return _readable(q, k, v, is_causal=is_causal, return_weights=True)

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> object:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> object:
        return flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)

    calls = {"reference": reference, "sdpa": sdpa, "flash_attention": flash}
    if triton:
        calls["flash_attention_triton"] = functools.partial(flash_attention_triton,
                                                            is_causal=is_causal)
    return calls


def _extrapolate_reference(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """Fit ``log2(peak) = log2_coefficient + exponent * log2(N)`` to the measured
    readable-path peaks; fill in ``reference_extrapolated_bytes`` where not measured."""
    measured = [r for r in records if r["reference_peak_bytes"] is not None]
    exponent = loglog_slope([r["seq_len"] for r in measured],
                            [r["reference_peak_bytes"] for r in measured])
    fit = None
    if exponent is not None:
        mean_x = sum(math.log2(r["seq_len"]) for r in measured) / len(measured)
        mean_y = sum(math.log2(r["reference_peak_bytes"]) for r in measured) / len(measured)
        fit = {"exponent": exponent, "log2_coefficient": mean_y - exponent * mean_x}
    for r in records:
        r["reference_extrapolated_bytes"] = (
            2 ** (fit["log2_coefficient"] + fit["exponent"] * math.log2(r["seq_len"]))
            if fit is not None and r["reference_peak_bytes"] is None else None)
    return fit


def _memory_slopes(records: list[dict[str, Any]],
                   fit: dict[str, float] | None) -> dict[str, Any]:
    """Log-log slopes: the readable path's fitted exponent; the others over the upper half."""
    upper = records[len(records) // 2:] if len(records) > 2 else records
    ns = [r["seq_len"] for r in upper]
    return {
        "reference": None if fit is None else fit["exponent"],
        "sdpa": loglog_slope(ns, [r["sdpa_peak_bytes"] for r in upper]),
        "flash_attention": loglog_slope(ns, [r["flash_attention_peak_bytes"] for r in upper]),
        **({"flash_attention_triton": loglog_slope(
            ns, [r["flash_attention_triton_peak_bytes"] for r in upper])}
           if "flash_attention_triton_peak_bytes" in records[0] else {}),
        "upper_seq_lens": ns,
    }


def _memory_verdicts(last: dict[str, Any], slopes: dict[str, Any]) -> list[dict[str, Any]]:
    """The memory sweep's four targets, at its largest N (``last``) and on its slopes."""
    flash_peak = last["flash_attention_peak_bytes"]
    reference_slope, flash_slope = slopes["reference"], slopes["flash_attention"]
    return [
        {"target": "reference_scores_weights_over_1_GiB", "seq_len": last["seq_len"],
         "value": last["predicted_scores_weights_bytes"],
         "threshold": _constants.TARGET_REFERENCE_MEMORY_BYTES,
         "passed": last["predicted_scores_weights_bytes"]
         > _constants.TARGET_REFERENCE_MEMORY_BYTES},
        {"target": "flash_attention_peak_under_128_MiB", "seq_len": last["seq_len"],
         "value": flash_peak, "threshold": _constants.TARGET_FLASH_MEMORY_BYTES,
         "passed": flash_peak is not None and flash_peak < _constants.TARGET_FLASH_MEMORY_BYTES},
        {"target": "reference_slope_near_2", "seq_len": None, "value": reference_slope,
         "threshold": [1.8, 2.2],
         "passed": reference_slope is not None and 1.8 <= reference_slope <= 2.2},
        {"target": "flash_attention_slope_at_most_1.2", "seq_len": None, "value": flash_slope,
         "threshold": 1.2, "passed": flash_slope is not None and flash_slope <= 1.2},
    ]


def run_kernel_timing(
    num_tokens: int = 4096,
    *,
    num_heads: int = 8,
    head_dim: int = 64,
    batch: int = 1,
    is_causal: bool = True,
    block_sizes: Sequence[int] = (128, 256, 512),
    reps: int = 5,
    warmup: int = 1,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    triton: bool | None = None,
) -> dict[str, Any]:
    """Time :func:`attnlib.functional.flash_attention` against torch's fused kernel.

    Queries, keys and values are ``(batch, num_heads, num_tokens, head_dim)``;
    the forward pass runs under :func:`torch.inference_mode`, timed as in
    :func:`time_contestants` (interleaved round-robin, median of ``reps``).
    Contestants: ``sdpa`` (:func:`torch.nn.functional.scaled_dot_product_attention`,
    which on the CPU dispatches to its fused flash kernel) and one
    ``flash_attention`` per block size, and with ``triton`` chapter 11's
    kernel, :func:`attnlib.flash_triton.flash_attention_triton`
    (``flash_attention_triton``). All are checked to agree first, within
    :func:`agreement_tolerance` of the dtype.

    Args:
        num_tokens: N. Default 4096.
        num_heads: heads. Default 8.
        head_dim: ``d_k = d_v``. Default 64.
        batch: sequences. Default 1.
        is_causal: causal attention. Default True.
        block_sizes: the ``flash_attention`` tile sizes to time; the one with
            the lowest median is reported as the best.
        reps: timed repetitions. Default 5.
        warmup: untimed repetitions first. Default 1.
        device: default :func:`attnlib.get_device`.
        dtype: floating-point dtype. Default float32.
        seed: seed of the inputs.
        triton: time the Triton kernel too. None (default): on a CUDA device
            where Triton can be imported. On a CPU it needs Triton's interpreter
            (``TRITON_INTERPRET=1`` before Triton is imported), and its time is
            then the interpreter's, not a kernel's.

    Returns:
        A JSON-ready dict: ``metadata``; ``records``, one per contestant:
        ``contestant`` (``sdpa``, ``flash_attention`` or
        ``flash_attention_triton``), ``block_size`` (None but for
        ``flash_attention``), ``median_ms``,
        ``q1_ms``, ``q3_ms``, ``times_ms``, ``time_vs_sdpa``; ``best_block_size``;
        ``verdicts``: one, ``flash_attention_vs_sdpa``, the best block size's
        time ratio against :data:`TARGET_FLASH_VS_SDPA` (3x), and on a CUDA
        device with the Triton kernel a second, ``flash_attention_triton_vs_sdpa``,
        against :data:`TARGET_TRITON_VS_SDPA` (0.85x).

    Raises:
        TypeError, ValueError: a size, ``reps`` or a block size is not a
            positive int, ``block_sizes`` is empty, or ``triton`` is not a bool
            or None.
        ImportError: ``triton=True`` and Triton is not installed.
        RuntimeError: a contestant and torch's kernel disagree.
    """
    for name, value in (("num_tokens", num_tokens), ("num_heads", num_heads),
                        ("head_dim", head_dim), ("batch", batch), ("reps", reps)):
        _check_positive_int(name, value)
    warmup = check_warmup(warmup)
    if isinstance(block_sizes, (str, int)) or not block_sizes:
        raise ValueError(f"block_sizes must be a non-empty sequence of ints, got {block_sizes!r}")
    block_sizes = [_check_positive_int("block_size", b) for b in block_sizes]
    device = torch.device(device) if device is not None else get_device()
    triton = _use_triton(triton, device)
    q, k, v = _attention_inputs(batch, num_heads, num_tokens, head_dim, device, dtype, seed)
    built = _kernel_contestants((q, k, v), is_causal, block_sizes, triton=triton)
    prepared = {name: prepare_call(c, (q, k, v), "forward", None) for name, c in built.items()}
    records = _kernel_records(time_prepared(prepared, reps, warmup))
    best = min((r for r in records if r["contestant"] == "flash_attention"),
               key=lambda r: r["median_ms"])
    verdicts = [{"target": "flash_attention_vs_sdpa", "seq_len": num_tokens,
                 "value": best["time_vs_sdpa"], "threshold": _constants.TARGET_FLASH_VS_SDPA,
                 "passed": best["time_vs_sdpa"] <= _constants.TARGET_FLASH_VS_SDPA}]
    kernel = next((r for r in records if r["contestant"] == "flash_attention_triton"), None)
    if kernel is not None and device.type == "cuda":
        verdicts.append({
            "target": "flash_attention_triton_vs_sdpa", "seq_len": num_tokens,
            "value": kernel["time_vs_sdpa"], "threshold": _constants.TARGET_TRITON_VS_SDPA,
            "passed": kernel["time_vs_sdpa"] <= _constants.TARGET_TRITON_VS_SDPA})
    return {
        "metadata": {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                     "batch": batch, "num_heads": num_heads, "num_tokens": num_tokens,
                     "head_dim": head_dim, "is_causal": is_causal, "block_sizes": block_sizes,
                     "reps": reps, "warmup": warmup, "num_threads": torch.get_num_threads(),
                     "triton": triton, "mode": "forward under torch.inference_mode"},
        "records": records,
        "best_block_size": best["block_size"],
        "verdicts": verdicts,
    }


def _use_triton(triton: object, device: torch.device) -> bool:
    """``triton`` as given, or (None) whether ``device`` is CUDA and Triton imports."""
    if triton is None:
        return device.type == "cuda" and importlib.util.find_spec("triton") is not None
    if not isinstance(triton, bool):
        raise TypeError(f"triton must be True, False or None, got {triton!r}")
    return triton


def _kernel_contestants(qkv: tuple[torch.Tensor, ...], is_causal: bool,
                        block_sizes: list[int], *, triton: bool) -> dict[str, Contestant]:
    """torch's kernel (``sdpa``), one ``flash_attention`` per block size and, with
    ``triton``, chapter 11's kernel, checked to agree on the first 256 tokens of ``qkv``."""

    def inputs(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return qkv

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    built = {"sdpa": Contestant("sdpa", "F.scaled_dot_product_attention", sdpa, inputs, (),
                                full_layer=False)}
    for b in block_sizes:
        def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  b: int = b) -> torch.Tensor:
            return flash_attention(q, k, v, is_causal=is_causal, block_size=b)

        built[f"flash_attention_b{b}"] = Contestant(
            f"flash_attention_b{b}", f"flash_attention(block_size={b})", flash, inputs, (),
            full_layer=False)
    if triton:
        def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return flash_attention_triton(q, k, v, is_causal=is_causal)

        built["flash_attention_triton"] = Contestant(
            "flash_attention_triton", "flash_attention_triton (Triton kernel)", kernel, inputs,
            (), full_layer=False)
    with torch.inference_mode():
        check = tuple(t[..., :256, :] for t in qkv)
        expected = sdpa(*check)
        rtol, atol = agreement_tolerance(expected.dtype)
        for name, c in built.items():
            try:
                torch.testing.assert_close(c.fn(*check), expected, rtol=rtol, atol=atol)
            except AssertionError as exc:
                raise RuntimeError(f"{name} and sdpa disagree: {exc}") from None
    return built


def _kernel_records(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One record per kernel contestant (see :func:`run_kernel_timing`)."""
    sdpa_median = quantiles(times["sdpa"])[1]
    records = []
    for name, t in times.items():
        q1, median, q3 = quantiles(t)
        blocked = name.startswith("flash_attention_b")
        records.append({
            "contestant": "flash_attention" if blocked else name,
            "block_size": int(name.rsplit("_b", 1)[1]) if blocked else None,
            "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
            "times_ms": [x * 1e3 for x in t], "time_vs_sdpa": median / sdpa_median,
        })
    return records


def plot_memory_sweep(sweep: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """Draw :func:`run_memory_sweep`'s result as a log-log plot and save it.

    Lines: the readable path (measured, then extrapolated dashed), its
    predicted scores and weights ``2 * h * N**2 * element_size``, torch's
    fused kernel and ``flash_attention``; grey guides of slope 2 and 1.
    matplotlib is imported only here.

    Args:
        sweep: the dict :func:`run_memory_sweep` returns.
        path: where to write the figure (the suffix picks the format, e.g. .png).

    Returns:
        The path written, as a string.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sweep["records"]
    ns = [r["seq_len"] for r in records]
    mib = 2.0**20

    def series(key: str) -> list[float]:  # NaN where not measured: a gap in the line
        return [math.nan if r[key] is None else r[key] / mib for r in records]

    with plt.style.context("attnlib.book"):
        fig, ax = plt.subplots(figsize=(5.0, 5.6), dpi=100)  # the book's phone width
        ax.plot(ns, series("predicted_scores_weights_bytes"), color="grey", linestyle=":",
                label="predicted: scores + weights,\n2·h·N²·(bytes per element)")
        ax.plot(ns, series("reference_peak_bytes"), "o-", color="C0",
                label="readable path (measured)")
        extrapolated = [(n, r["reference_extrapolated_bytes"] / mib) for n, r in zip(
            ns, records, strict=True) if r["reference_extrapolated_bytes"] is not None]
        if extrapolated:
            last = [(n, r["reference_peak_bytes"] / mib) for n, r in zip(ns, records, strict=True)
                    if r["reference_peak_bytes"] is not None][-1:]
            xs, ys = zip(*(last + extrapolated), strict=True)
            ax.plot(xs, ys, "--", color="C0", label="readable path (extrapolated)")
        ax.plot(ns, series("sdpa_peak_bytes"), "s-", color="C1", label="torch fused kernel")
        ax.plot(ns, series("flash_attention_peak_bytes"), "^-", color="C2",
                label="attnlib flash_attention")
        if "flash_attention_triton_peak_bytes" in records[0]:
            ax.plot(ns, series("flash_attention_triton_peak_bytes"), "v-", color="C3",
                    label="Triton kernel (chapter 11)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("tokens N")
        ax.set_ylabel("peak memory above the inputs (MiB)")
        meta = sweep["metadata"]
        ax.set_title(f"one attention call, {meta['num_heads']} head(s), d={meta['head_dim']},\n"
                     f"{meta['dtype']}, {meta['device']}")
        # Below the axes: seven labels inside would hide the lines at 12 pt.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return str(path)
