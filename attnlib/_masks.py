"""The masks of attention, built in one place (a private module with public names).

:func:`causal_mask`, :func:`bottom_right_causal_mask` and
:func:`sliding_window_mask` are documented and imported as
``attnlib.functional``'s, which re-exports them. They live here, below every
module that builds a mask, because :mod:`attnlib.flash` needs them too and
:mod:`attnlib.functional` imports :mod:`attnlib.flash`. This module imports only
torch and :mod:`attnlib._validation`.

Mask convention, the same everywhere in attnlib: a **bool mask is True where a
query may attend** to a key, as in :func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import torch

from ._validation import check_int

__all__ = ["causal_mask", "bottom_right_causal_mask", "sliding_window_mask"]


def causal_mask(
    num_tokens: int,
    num_tokens_kv: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Bool mask that lets each token attend to itself and earlier tokens only.

    Args:
        num_tokens: number of query positions (rows).
        num_tokens_kv: number of key positions (columns); defaults to ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``j <= i``. This is the lower triangle
        aligned at the top-left corner, the same mask that
        ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``
        uses. (``torch.nn.MultiheadAttention`` wants the opposite polarity:
        pass ``~causal_mask(n)`` there.)

    Raises:
        TypeError: a size is not an integer (Python or NumPy; bools are refused).
        ValueError: a size is negative.

    Source: the decoder masking of Vaswani et al. (2017), section 3.2.3.
    """
    if num_tokens_kv is None:
        num_tokens_kv = num_tokens
    num_tokens = check_int("num_tokens", num_tokens, minimum=0)
    num_tokens_kv = check_int("num_tokens_kv", num_tokens_kv, minimum=0)
    ones = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool, device=device)
    return torch.tril(ones)


def bottom_right_causal_mask(
    num_tokens: int,
    num_tokens_kv: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask for the *last* ``num_tokens`` positions of ``num_tokens_kv`` keys.

    With a KV cache, ``num_tokens`` new queries follow ``num_tokens_kv - num_tokens``
    cached tokens, so query ``i`` sits at position ``num_tokens_kv - num_tokens + i``
    and may attend to keys ``0 ... num_tokens_kv - num_tokens + i``: the lower
    triangle aligned at the **bottom-right** corner. :func:`causal_mask` with
    two sizes aligns it at the top-left instead (query ``i`` sees keys
    ``0 ... i``), which is right only when both sizes are equal.

    Args:
        num_tokens: number of (new) query positions (rows).
        num_tokens_kv: number of key positions (columns), cached and new;
            at least ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``j <= num_tokens_kv - num_tokens + i``.

    Raises:
        TypeError: a size is not an integer (Python or NumPy; bools are refused).
        ValueError: a size is negative, or ``num_tokens > num_tokens_kv``.

    Source: incremental decoding of a causal decoder (Vaswani et al. 2017,
    section 3.2.3, masking; Shazeer 2019, section 2.4); PyTorch calls this
    alignment ``torch.nn.attention.bias.causal_lower_right``.
    """
    num_tokens = check_int("num_tokens", num_tokens, minimum=0)
    num_tokens_kv = check_int("num_tokens_kv", num_tokens_kv, minimum=0)
    if num_tokens > num_tokens_kv:
        raise ValueError(
            f"num_tokens={num_tokens} new queries cannot be the last positions of "
            f"num_tokens_kv={num_tokens_kv} keys: expected num_tokens <= num_tokens_kv"
        )
    ones = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=num_tokens_kv - num_tokens)


def sliding_window_mask(
    num_tokens: int,
    window: int,
    *,
    num_tokens_kv: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Banded causal mask: each token attends to itself and the ``window - 1`` before it.

    Token ``i`` may attend to keys ``j`` with ``i - window < j <= i``: at most
    ``window`` keys, the most recent ones. Stacked layers still pass
    information further back (``L`` layers reach ``L * (window - 1)``
    tokens back), and a KV cache needs to keep only the last ``window`` keys and
    values. ``window >= num_tokens`` gives :func:`causal_mask`.

    Args:
        num_tokens: number of query positions (rows).
        window: how many keys each query may see, itself included; ``>= 1``.
        num_tokens_kv: keyword-only; number of key positions (columns) when the
            queries are the *last* ``num_tokens`` of them (a KV cache: aligned
            bottom-right as in :func:`bottom_right_causal_mask`). Defaults to
            ``num_tokens``.
        device: where to create the mask.

    Returns:
        Bool tensor ``(num_tokens, num_tokens_kv)``, **True where attention is
        allowed**: ``mask[i, j]`` is ``0 <= p_i - j < window`` with
        ``p_i = num_tokens_kv - num_tokens + i`` the query's position.

    Raises:
        TypeError: a size or ``window`` is not an integer (bools are refused).
        ValueError: a size is negative, ``window < 1``, or
            ``num_tokens > num_tokens_kv``.

    Source: Beltagy, Peters and Cohan (2020), "Longformer: The Long-Document
    Transformer", section 3.1 (sliding window); used causally by Mistral 7B
    (Jiang et al. 2023, window 4096).
    """
    window = check_int("window", window, minimum=1)
    if num_tokens_kv is None:
        num_tokens_kv = num_tokens
    causal = bottom_right_causal_mask(num_tokens, num_tokens_kv, device=device)
    offset = causal.shape[1] - causal.shape[0]  # position of query 0
    too_old = torch.tril(torch.ones_like(causal), diagonal=offset - window)  # p_i - j >= window
    return causal & ~too_old
