"""Self-attention modules (placeholder: written in the next commits)."""

import torch.nn as nn

__all__ = [
    "SelfAttention_v1",
    "SelfAttention_v2",
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
]


class _Pending(nn.Module):
    """Placeholder for a module that is not written yet."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} is not written yet")


class SelfAttention_v1(_Pending):
    """Placeholder: not written yet."""


class SelfAttention_v2(_Pending):
    """Placeholder: not written yet."""


class CausalAttention(_Pending):
    """Placeholder: not written yet."""


class MultiHeadAttentionWrapper(_Pending):
    """Placeholder: not written yet."""


class MultiHeadAttention(_Pending):
    """Placeholder: not written yet."""
