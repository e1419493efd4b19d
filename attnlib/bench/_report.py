"""Plain-text tables of the results: :func:`format_table` for
:func:`attnlib.bench.run_benchmark`, :func:`format_sweeps` for the sweeps.
Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

from typing import Any

from ._memory import fmt_bytes
from ._sweeps import KERNELS


def format_sweeps(memory: dict[str, Any] | None, kernel: dict[str, Any] | None) -> str:
    """The memory sweep and the kernel timing as text tables with verdict lines.

    Args:
        memory: :func:`run_memory_sweep`'s result, or None to leave it out.
        kernel: :func:`run_kernel_timing`'s result, or None to leave it out.

    Returns:
        The tables (sizes in MiB; a readable-path value marked ``~`` is
        extrapolated), then one ``PASS``/``FAIL`` line per verdict, as a string.
    """
    lines: list[str] = []
    if memory is not None:
        meta = memory["metadata"]
        lines += [f"Memory sweep: one call, {meta['num_heads']} head(s), d={meta['head_dim']}, "
                  f"{meta['dtype']}, causal={meta['is_causal']}, flash block_size="
                  f"{meta['block_size']}; peak above the inputs",
                  f"{'N':>6} {'scores+weights':>15} {'readable':>13} {'torch fused':>12} "
                  f"{'flash_attention':>16}"
                  + (f" {'Triton kernel':>14}" if meta.get("triton") else "")]
        for r in memory["records"]:
            readable = (fmt_bytes(r["reference_peak_bytes"]) if r["reference_peak_bytes"]
                        is not None else "~" + fmt_bytes(r["reference_extrapolated_bytes"]))
            lines.append(f"{r['seq_len']:>6} {fmt_bytes(r['predicted_scores_weights_bytes']):>15}"
                         f" {readable:>13} {fmt_bytes(r['sdpa_peak_bytes']):>12} "
                         f"{fmt_bytes(r['flash_attention_peak_bytes']):>16}"
                         + (f" {fmt_bytes(r['flash_attention_triton_peak_bytes']):>14}"
                            if "flash_attention_triton_peak_bytes" in r else ""))
        slopes = memory["slopes"]
        lines.append("log-log slopes: " + ", ".join(
            f"{k} {_fmt(slopes[k], '.2f')}" for k in (*KERNELS, "flash_attention_triton")
            if k in slopes)
            + f" (sdpa and flash over N in {slopes['upper_seq_lens']}); '~' = extrapolated")
    if kernel is not None:
        meta = kernel["metadata"]
        lines += ["", f"Kernel timing: N={meta['num_tokens']}, {meta['num_heads']} heads, "
                  f"d={meta['head_dim']}, batch={meta['batch']}, causal={meta['is_causal']}, "
                  f"{meta['dtype']}, reps={meta['reps']}"]
        for r in kernel["records"]:
            label = {"sdpa": "torch sdpa", "flash_attention_triton": "Triton kernel (ch. 11)"}.get(
                r["contestant"], f"flash_attention(block_size={r['block_size']})")
            lines.append(f"  {label:<32} median {r['median_ms']:9.1f} ms  "
                         f"IQR {r['q3_ms'] - r['q1_ms']:7.1f} ms  x{r['time_vs_sdpa']:.2f}")
    verdicts = [*(memory or {}).get("verdicts", []), *(kernel or {}).get("verdicts", [])]
    for v in verdicts:
        value = v["value"]
        in_bytes = "MiB" in v["target"] or "GiB" in v["target"]
        shown = fmt_bytes(value) if in_bytes else _fmt(value, ".3f")
        limit = fmt_bytes(v["threshold"]) if in_bytes else v["threshold"]
        lines.append(f"{'PASS' if v['passed'] else 'FAIL'}  {v['target']}: {shown} "
                     f"(threshold {limit})")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(result: dict[str, Any]) -> str:
    """Format :func:`run_benchmark`'s result as a text table and verdict lines.

    Args:
        result: the dict :func:`run_benchmark` returns (or its JSON, loaded).

    Returns:
        The table (one row per record, grouped by mode and sequence length),
        then one ``PASS``/``FAIL`` line per verdict, as a string.

    Raises:
        KeyError: ``result`` lacks ``metadata``, ``records`` or ``verdicts``.
    """
    meta = result["metadata"]
    lines = [
        f"attnlib.bench: {meta['device']} ({meta['device_name']}), "
        f"{meta['num_threads']} threads, torch {meta['torch_version']}, {meta['dtype']}, "
        f"batch={meta['batch']}, d_model={meta['d_model']}, num_heads={meta['num_heads']}, "
        f"qkv_bias={meta['qkv_bias']}, reps={meta['reps']} (+{meta['warmup']} warm-up), "
        f"load {meta.get('load_average_start')} -> {meta.get('load_average_end')}",
        "",
    ]
    header = (f"{'contestant':<13} {'mode':<16} {'seq_len':>7} {'median ms':>10} "
              f"{'IQR ms':>8} {'GFLOP/s':>8} {'peak MiB':>9} {'/torch_mha':>10} {'/bare':>6}")
    lines += [header, "-" * len(header)]
    previous = None
    for r in result["records"]:
        group = (r["mode"], r["seq_len"])
        if previous is not None and group != previous:
            lines.append("")
        previous = group
        lines.append(
            f"{r['contestant']:<13} {r['mode']:<16} {r['seq_len']:>7} {r['median_ms']:>10.2f} "
            f"{r['iqr_ms']:>8.2f} {r['gflops_per_s']:>8.1f} {_fmt(r['peak_memory_mb'], '9.1f'):>9} "
            f"{_fmt(r['time_vs_torch_mha'], '10.3f'):>10} "
            f"{_fmt(r['time_vs_bare_kernels'], '6.3f'):>6}")
    if result["verdicts"]:
        lines += ["", "Targets (time ratios; attnlib must be at most the threshold):"]
    for v in result["verdicts"]:
        what = (f"time <= {v['threshold']:.3g}x torch_mha's"
                if v["target"] == "attnlib_vs_torch_mha"
                else f"within {v['threshold']:.3g}x of the bare kernels (fused-QKV floor)")
        lines.append(
            f"{'PASS' if v['passed'] else 'FAIL'}  {v['mode']:<16} N={v['seq_len']:<5} "
            f"{v['target']:<24} ratio {v['ratio']:.3f} (paired {v['paired_ratio']:.3f}) "
            f"<= {v['threshold']:.3f}: {what}")
    return "\n".join(lines)
