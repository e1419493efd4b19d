"""Tests for attnlib.functional.sliding_window_mask (True = may attend)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import scaled_dot_product_attention
from attnlib.functional import bottom_right_causal_mask, causal_mask, sliding_window_mask


def test_small_example():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(sliding_window_mask(5, 2), expected)


@given(n=st.integers(0, 12), window=st.integers(1, 14))
@settings(max_examples=40, deadline=None)
def test_definition_and_row_counts(n, window):
    mask = sliding_window_mask(n, window)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    assert torch.equal(mask, (j <= i) & (i - j < window))
    assert torch.equal(mask.sum(-1), torch.clamp(torch.arange(n) + 1, max=window))
    assert not (mask & ~causal_mask(n)).any()  # never the future


def test_a_wide_window_is_the_causal_mask_and_window_one_is_the_diagonal():
    assert torch.equal(sliding_window_mask(6, 6), causal_mask(6))
    assert torch.equal(sliding_window_mask(6, 100), causal_mask(6))
    assert torch.equal(sliding_window_mask(6, 1), torch.eye(6, dtype=torch.bool))


@given(n=st.integers(0, 6), extra=st.integers(0, 6), window=st.integers(1, 8))
@settings(max_examples=40, deadline=None)
def test_with_a_cache_it_is_the_last_rows_of_the_square_mask(n, extra, window):
    full = sliding_window_mask(n + extra, window)
    assert torch.equal(sliding_window_mask(n, window, num_tokens_kv=n + extra), full[extra:])
    if window >= n + extra:
        assert torch.equal(sliding_window_mask(n, window, num_tokens_kv=n + extra),
                           bottom_right_causal_mask(n, n + extra))


def test_only_the_last_window_keys_matter_so_a_cache_can_drop_the_rest():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, generator=gen, dtype=torch.float64)  # the newest token
    k = torch.randn(2, 20, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 20, 3, generator=gen, dtype=torch.float64)
    window = 5
    mask = sliding_window_mask(1, window, num_tokens_kv=20)
    full = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    trimmed = scaled_dot_product_attention(q, k[:, -window:], v[:, -window:])
    torch.testing.assert_close(full, trimmed, atol=1e-12, rtol=0)


def test_errors():
    with pytest.raises(ValueError, match=r"window must be >= 1, got window=0"):
        sliding_window_mask(4, 0)
    with pytest.raises(TypeError, match=r"window must be an int, got float"):
        sliding_window_mask(4, 2.0)
    with pytest.raises(TypeError, match=r"window must be an int, got bool"):
        sliding_window_mask(4, True)
    with pytest.raises(ValueError, match=r"num_tokens=5 .* num_tokens_kv=3"):
        sliding_window_mask(5, 2, num_tokens_kv=3)


def test_exported():
    assert attnlib.sliding_window_mask is sliding_window_mask
