"""Peak memory of one call above what was allocated before it
(:func:`peak_memory_bytes`): CUDA's allocator statistics, or on the CPU the
running sum of the allocations :class:`torch.profiler.profile` records.
Import from :mod:`attnlib.bench`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch

from .._validation import type_name


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (e.g. some notebook kernels)
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before.

    Args:
        fn: a callable with no arguments; its return value is dropped inside
            the measurement (so a returned tensor counts while it is alive).
        device: the device ``fn`` computes on.

    Returns:
        The peak in bytes (an int >= 0); ``None`` on a device other than CPU
        and CUDA. On CUDA: ``torch.cuda.max_memory_allocated`` after
        ``reset_peak_memory_stats``, minus ``memory_allocated`` before. On the
        CPU: the maximum running sum of the allocations and frees that
        :class:`torch.profiler.profile` (``profile_memory=True``) records in
        PyTorch's CPU allocator (memory allocated outside it, e.g. by BLAS,
        is not seen).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type_name(fn)}")
    device = torch.device(device)
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    if device.type != "cpu":
        return None
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def fmt_bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"
