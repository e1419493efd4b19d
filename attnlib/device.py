"""Choosing where tensors live."""

from __future__ import annotations

import torch

from ._validation import type_name

__all__ = ["get_device", "cuda_available"]


def cuda_available() -> bool:
    """True when PyTorch can use a CUDA GPU on this machine."""
    return torch.cuda.is_available()


def get_device(allow_mps: bool = False) -> torch.device:
    """The device the course's GPU cells and benchmarks run on.

    Args:
        allow_mps: also use Apple's Metal backend when it is available. Off by
            default because some operations the course times are slower or
            missing there.

    Returns:
        ``torch.device("cuda")`` when a CUDA GPU is available; else
        ``torch.device("mps")`` when ``allow_mps`` is true and MPS is
        available; else ``torch.device("cpu")``.

    Raises:
        TypeError: ``allow_mps`` is not a bool.
    """
    if not isinstance(allow_mps, bool):
        raise TypeError(f"allow_mps must be a bool, got {type_name(allow_mps)}")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if allow_mps and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
