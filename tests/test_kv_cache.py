"""Tests for attnlib.KVCache, MultiHeadAttention(..., kv_cache=...) and the
bottom-right causal mask it needs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import attnlib
from attnlib import KVCache, MultiHeadAttention
from attnlib.functional import bottom_right_causal_mask, causal_mask


def _mha(seed=0, d_in=6, d_out=8, context_length=16, num_heads=2, qkv_bias=True):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads, qkv_bias).double()


def _chunked(module, x, sizes, **kwargs):
    cache = KVCache()
    outs, start = [], 0
    for size in sizes:
        outs.append(module(x[:, start : start + size], kv_cache=cache, **kwargs))
        start += size
    assert start == x.shape[1] and len(cache) == start
    return outs, cache


# ---------------------------------------------------------------- bottom-right mask


def test_bottom_right_mask_sees_every_cached_key_and_the_new_ones_causally():
    mask = bottom_right_causal_mask(2, 5)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    # top-left alignment is what causal_mask gives: the wrong one for a cache
    assert torch.equal(causal_mask(2, 5), torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]],
                                                       dtype=torch.bool))


@given(n=st.integers(0, 9), extra=st.integers(0, 9))
@settings(max_examples=30, deadline=None)
def test_bottom_right_mask_is_the_last_rows_of_the_square_mask(n, extra):
    n_kv = n + extra
    assert torch.equal(bottom_right_causal_mask(n, n_kv), causal_mask(n_kv)[extra:])


def test_bottom_right_mask_errors():
    with pytest.raises(ValueError, match=r"num_tokens=3 .* num_tokens_kv=2"):
        bottom_right_causal_mask(3, 2)
    with pytest.raises(TypeError, match=r"num_tokens must be an int, got float"):
        bottom_right_causal_mask(1.0, 2)
    with pytest.raises(ValueError, match=r"num_tokens_kv must be >= 0"):
        bottom_right_causal_mask(0, -1)


# ---------------------------------------------------------------- chunking = full forward


@pytest.mark.parametrize(
    "sizes", [[11], [1] * 11, [4, 7], [3, 1, 5, 2], [10, 1], [1, 10], [2, 2, 2, 2, 3]]
)
@pytest.mark.parametrize("return_weights", [False, True])
def test_any_chunking_equals_the_full_forward(sizes, return_weights):
    mha = _mha().eval()
    x = torch.randn(3, 11, 6, dtype=torch.float64)
    full = mha(x)
    outs, cache = _chunked(mha, x, sizes, return_weights=return_weights)
    if return_weights:
        outs = [o for o, _ in outs]
    assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=1e-10)
    # the cache holds exactly the keys and values of the whole sequence
    keys = mha.W_key(x).view(3, 11, 2, 4).transpose(1, 2)
    assert_close(cache.keys, keys, atol=1e-12, rtol=1e-10)


@given(cuts=st.lists(st.integers(1, 5), min_size=1, max_size=8))
@settings(max_examples=25, deadline=None)
def test_random_chunkings_equal_the_full_forward(cuts):
    mha = _mha(seed=1, context_length=40).eval()
    total = sum(cuts)
    x = torch.randn(2, total, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    outs, _ = _chunked(mha, x, cuts)
    assert_close(torch.cat(outs, dim=1), mha(x), atol=1e-12, rtol=1e-10)


def test_cached_weights_are_the_rows_of_the_full_weights():
    mha = _mha(seed=3).eval()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    _, full_w = mha(x, return_weights=True)
    cache = KVCache()
    mha(x[:, :5], kv_cache=cache)
    _, w = mha(x[:, 5:], return_weights=True, kv_cache=cache)
    assert w.shape == (2, 2, 4, 9)
    assert_close(w, full_w[:, :, 5:, :], atol=1e-12, rtol=1e-10)


def test_a_top_left_mask_would_be_wrong():
    # the test above could not pass with torch's top-left is_causal on (new, cached + new)
    mha = _mha(seed=4).eval()
    x = torch.randn(1, 8, 6, dtype=torch.float64)
    cache = KVCache()
    mha(x[:, :5], kv_cache=cache)
    q = mha.W_query(x[:, 5:]).view(1, 3, 2, 4).transpose(1, 2)
    k = mha.W_key(x).view(1, 8, 2, 4).transpose(1, 2)
    v = mha.W_value(x).view(1, 8, 2, 4).transpose(1, 2)
    wrong = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    wrong = mha.out_proj(wrong.transpose(1, 2).reshape(1, 3, 8))
    assert not torch.allclose(wrong, mha(x)[:, 5:], atol=1e-6)


def test_cache_gradients_reach_the_parameters_like_the_full_forward():
    mha = _mha(seed=5).eval()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    g = torch.randn(2, 7, 8, dtype=torch.float64)
    params = list(mha.parameters())
    full_grads = torch.autograd.grad(mha(x), params, g)
    outs, _ = _chunked(mha, x, [3, 1, 3])
    chunk_grads = torch.autograd.grad(torch.cat(outs, dim=1), params, g)
    for a, b in zip(full_grads, chunk_grads, strict=True):
        assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_mha_without_cache_is_unchanged_by_the_new_argument():
    mha = _mha(seed=6).eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    assert torch.equal(mha(x), mha(x, kv_cache=None))


# ---------------------------------------------------------------- errors


def test_more_tokens_than_context_length_names_the_numbers():
    mha = _mha(context_length=6).eval()
    cache = KVCache()
    mha(torch.randn(1, 4, 6, dtype=torch.float64), kv_cache=cache)
    with pytest.raises(
        ValueError,
        match=r"the KV cache holds 4 tokens and x adds num_tokens=3: 7 tokens exceed "
        r"context_length=6",
    ):
        mha(torch.randn(1, 3, 6, dtype=torch.float64), kv_cache=cache)
    assert len(cache) == 4  # the failed call left the cache alone
    mha(torch.randn(1, 2, 6, dtype=torch.float64), kv_cache=cache)  # exactly full is fine
    assert len(cache) == 6


def test_cache_of_another_batch_or_layer_is_refused_before_computing():
    mha = _mha().eval()
    cache = KVCache()
    mha(torch.randn(2, 3, 6, dtype=torch.float64), kv_cache=cache)
    with pytest.raises(ValueError, match=r"\(2, 2, 4, 4\), but the new ones are \(1, 2, 4, 4\)"):
        mha(torch.randn(1, 1, 6, dtype=torch.float64), kv_cache=cache)
    other = MultiHeadAttention(6, 8, 16, 0.0, num_heads=4).double()
    with pytest.raises(ValueError, match=r"use one cache per layer"):
        other(torch.randn(2, 1, 6, dtype=torch.float64), kv_cache=cache)
    with pytest.raises(TypeError, match=r"kv_cache must be an attnlib.KVCache or None, got dict"):
        mha(torch.randn(2, 1, 6, dtype=torch.float64), kv_cache={})
    assert len(cache) == 3


def test_cache_dtype_mismatch_is_a_type_error():
    cache = KVCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(TypeError, match=r"holds torch.float32 tensors, got torch.float64"):
        cache.update(torch.zeros(1, 2, 1, 4, dtype=torch.float64),
                     torch.zeros(1, 2, 1, 4, dtype=torch.float64))


@pytest.mark.parametrize(
    ("keys", "values", "error", "match"),
    [
        ([0.0], torch.zeros(1, 1, 1, 1), TypeError, r"keys must be a torch.Tensor, got list"),
        (torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), ValueError, r"keys must be \(batch"),
        (torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4), ValueError, r"must agree on"),
        (torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.zeros(1, 1, 1, 1), TypeError,
         r"floating-point"),
    ],
)
def test_update_errors(keys, values, error, match):
    with pytest.raises(error, match=match):
        KVCache().update(keys, values)


# ---------------------------------------------------------------- bookkeeping


def test_update_appends_and_reports_memory_and_resets():
    cache = KVCache()
    assert len(cache) == 0 and cache.memory_bytes() == 0 and repr(cache) == "KVCache(empty)"
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 7)
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 7)
    cache.update(k1, v1)
    keys, values = cache.update(k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert len(cache) == 5
    assert cache.memory_bytes() == 2 * 3 * 5 * (5 + 7) * 4  # float32: 4 bytes
    assert repr(cache) == (
        "KVCache(batch=2, num_kv_groups=3, num_tokens=5, head_dim=5, dtype=torch.float32, "
        "memory_bytes=1440)"
    )
    cache.reset()
    assert len(cache) == 0 and cache.keys is None


def test_update_reallocates_as_its_docstring_says():
    # Appending makes new, longer tensors (torch.cat): what an earlier update returned
    # is left as it was, the length it had then.
    cache = KVCache()
    first_keys, _ = cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    keys, _ = cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert first_keys.shape[-2] == 3 and keys.shape[-2] == 4
    assert keys.untyped_storage().data_ptr() != first_keys.untyped_storage().data_ptr()
    assert torch.equal(keys[:, :, :3], first_keys)


def test_check_next_takes_num_kv_groups_and_the_old_keyword_with_a_warning():
    cache = KVCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    layout = dict(batch=1, head_dim=4, head_dim_v=4, dtype=torch.float32,
                  device=torch.device("cpu"))
    cache.check_next(num_kv_groups=2, **layout)  # fits: no error
    with pytest.raises(ValueError, match=r"\(batch, num_kv_groups, head_dim, head_dim_v\)"):
        cache.check_next(num_kv_groups=3, **layout)
    with pytest.warns(DeprecationWarning, match="num_kv_heads= is renamed num_kv_groups="):
        cache.check_next(num_kv_heads=2, **layout)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="num_kv_groups"):
        cache.check_next(num_kv_heads=3, **layout)
    with pytest.raises(TypeError, match="got both num_kv_heads= and num_kv_groups="):
        cache.check_next(num_kv_heads=2, num_kv_groups=2, **layout)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_cache_holds_only_its_keys_and_values_not_the_projection_buffer(grouped):
    # the fast path projects queries, keys and values with one GEMM; the cached keys
    # must not keep that whole buffer (queries included) alive
    torch.manual_seed(0)
    if grouped:
        layer = attnlib.GroupedQueryAttention(16, 16, 32, 0.0, num_heads=4, num_kv_groups=2)
    else:
        layer = MultiHeadAttention(16, 16, 32, 0.0, num_heads=4)
    cache = KVCache()
    with torch.no_grad():
        layer.eval()(torch.randn(2, 10, 16), kv_cache=cache)
    held = cache.keys.untyped_storage().nbytes() + cache.values.untyped_storage().nbytes()
    assert cache.keys.untyped_storage().data_ptr() != cache.values.untyped_storage().data_ptr()
    assert held == cache.memory_bytes() == 2 * 2 * (4 if not grouped else 2) * 10 * 4 * 4


def test_update_does_not_alias_the_callers_tensors():
    cache = KVCache()
    keys, values = torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3)
    cache.update(keys, values)
    keys += 1.0
    values += 1.0
    assert torch.equal(cache.keys, torch.zeros(1, 1, 2, 3))
    assert torch.equal(cache.values, torch.zeros(1, 1, 2, 3))


def test_exports():
    assert attnlib.KVCache is KVCache
    assert attnlib.bottom_right_causal_mask is bottom_right_causal_mask


def test_every_cache_has_the_one_interface():
    from attnlib.kv_cache import Cache
    from attnlib.latent import LatentCache
    from attnlib.linear_attention import RecurrentState

    with pytest.raises(TypeError):
        Cache()  # abstract: update, reset, memory_bytes and num_tokens are the subclasses'
    for cache in (attnlib.KVCache(), LatentCache(), RecurrentState()):
        assert isinstance(cache, Cache)
        assert (len(cache), cache.num_tokens, cache.memory_bytes()) == (0, 0, 0)
    latent = LatentCache()
    latent.update(torch.zeros(2, 3, 4), torch.zeros(2, 3, 2))
    assert len(latent) == 3 and latent.memory_bytes() == 2 * 3 * 6 * 4
    latent.reset()
    assert len(latent) == 0
