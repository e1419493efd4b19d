"""attnlib.functional.attention, the one function the attention modules call
(issue 27): the readable, fused and tiled paths behind one signature, with
grouped key/value heads; and the modules' attn_implementation, mask and cache."""

import inspect

import pytest
import torch
from torch.testing import assert_close

import attnlib
from attnlib import functional as AF
from attnlib.gqa import GroupedQueryAttention
from attnlib.multihead import MultiHeadAttention


def _qkv(num_heads=6, num_kv_groups=2, n_q=7, n_kv=7, head_dim=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, num_heads, n_q, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(2, num_kv_groups, n_kv, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(2, num_kv_groups, n_kv, head_dim, generator=gen, dtype=torch.float64)
    return q, k, v


def _per_head_reference(q, k, v, allowed):
    """Each query head with its group's key/value head, softmax written out."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for h in range(q.shape[1]):
        scores = q[:, h] @ k[:, h // group].transpose(-2, -1) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(scores, dim=-1) @ v[:, h // group]
    return out


@pytest.mark.parametrize("implementation", AF.ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("num_kv_groups", [6, 3, 1])
def test_every_implementation_shares_the_key_value_heads_causally(implementation, num_kv_groups):
    q, k, v = _qkv(num_kv_groups=num_kv_groups)
    expected = _per_head_reference(q, k, v, attnlib.causal_mask(7))
    out, weights = AF.attention(q, k, v, is_causal=True, implementation=implementation)
    assert_close(out, expected, atol=1e-12, rtol=1e-10)
    if implementation == "readable":
        assert weights.shape == (2, 6, 7, 7)
        assert_close(weights.sum(-1), torch.ones(2, 6, 7, dtype=torch.float64))
    else:
        assert weights is None  # the fused and tiled kernels never hold them


@pytest.mark.parametrize("implementation", ["readable", "sdpa"])
def test_a_bottom_right_mask_and_padding_give_the_reference(implementation):
    q, k, v = _qkv(n_q=3, n_kv=8)
    allowed = AF.bottom_right_causal_mask(3, 8)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[1, :6] = True  # sequence 1: the first query (position 5) sees no real key
    mask = AF.merge_key_padding_mask(allowed, padding)
    assert mask.shape == (2, 1, 3, 8)
    out, _ = AF.attention(q, k, v, mask, implementation=implementation)
    assert_close(out[0], _per_head_reference(q, k, v, allowed)[0], atol=1e-12, rtol=1e-10)
    assert torch.equal(out[1, :, 0], torch.zeros_like(out[1, :, 0]))  # no key: zeros
    keep = allowed & ~padding[1]
    assert_close(out[1, :, 1:], _per_head_reference(q[1:], k[1:], v[1:], keep)[0, :, 1:],
                 atol=1e-12, rtol=1e-10)


def test_sinks_agree_between_the_readable_and_the_fused_path():
    q, k, v = _qkv()
    sinks = torch.linspace(-1.0, 2.0, 6, dtype=torch.float64)
    readable, weights = AF.attention(q, k, v, is_causal=True, sinks=sinks,
                                     implementation="readable")
    fused, _ = AF.attention(q, k, v, is_causal=True, sinks=sinks)
    assert_close(fused, readable, atol=1e-12, rtol=1e-10)
    assert (weights.sum(-1) < 1).all()  # the sink takes a share of every row
    assert_close(attnlib.sinks.sink_attention(q, k, v, sinks, is_causal=True), readable)


def test_bad_arguments_are_named():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="implementation must be one of"):
        AF.attention(q, k, v, implementation="fast")
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by num_kv_groups=4"):
        AF.attention(q, torch.zeros(2, 4, 7, 4, dtype=q.dtype), v)
    with pytest.raises(ValueError, match="queries must"):
        AF.attention(q[0], k, v)
    with pytest.raises(TypeError, match="keys"):
        AF.attention(q, "k", v)
    for kwargs in ({"attn_mask": attnlib.causal_mask(7)}, {"dropout_p": 0.1},
                   {"sinks": torch.zeros(6, dtype=q.dtype)}):
        with pytest.raises(ValueError, match="implementation='flash' takes no"):
            AF.attention(q, k, v, implementation="flash", **kwargs)
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        AF.merge_key_padding_mask(None, torch.zeros(2, 7))
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        AF.merge_key_padding_mask(attnlib.causal_mask(7), torch.zeros(2, 5, dtype=torch.bool))
    assert AF.merge_key_padding_mask(None, None) is None


@pytest.mark.parametrize("cls", [MultiHeadAttention, GroupedQueryAttention])
def test_attn_implementation_switches_the_path_and_not_the_outputs(cls):
    torch.manual_seed(3)
    args = (10, 12, 16, 0.0, 6) + (() if cls is MultiHeadAttention else (2,))
    module = cls(*args).double().eval()
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    with torch.no_grad():
        expected = module(x, return_weights=True)[0]
        for implementation in AF.ATTN_IMPLEMENTATIONS:
            module.attn_implementation = implementation
            assert_close(module(x), expected, atol=1e-12, rtol=1e-10, msg=implementation)
    built = cls(*args, attn_implementation="flash")
    assert built.attn_implementation == "flash" and "attn_implementation='flash'" in repr(built)
    with pytest.raises(ValueError, match="attn_implementation must be one of"):
        cls(*args, attn_implementation="eager")


def test_flash_with_a_cache_says_to_use_another_implementation():
    module = MultiHeadAttention(8, 8, 16, 0.0, 2, attn_implementation="flash").eval()
    cache = module.new_cache()
    x = torch.randn(1, 5, 8)
    with torch.no_grad():
        module(x[:, :3], kv_cache=cache)  # from position 0: is_causal, which flash has
        with pytest.raises(ValueError, match="implementation='flash' takes no attn_mask"):
            module(x[:, 3:], kv_cache=cache)


@pytest.mark.parametrize("cls", [MultiHeadAttention, GroupedQueryAttention])
def test_new_cache_is_an_empty_kv_cache_for_chunked_decoding(cls):
    torch.manual_seed(4)
    args = (8, 8, 16, 0.0, 4) + (() if cls is MultiHeadAttention else (2,))
    module = cls(*args).eval()
    cache = module.new_cache()
    assert isinstance(cache, attnlib.KVCache) and cache.num_tokens == 0
    assert module.new_cache() is not cache
    x = torch.randn(2, 10, 8)
    with torch.no_grad():
        chunks = [module(x[:, :4], kv_cache=cache), module(x[:, 4:], kv_cache=cache)]
        assert_close(torch.cat(chunks, dim=1), module(x), atol=1e-6, rtol=1e-5)


def test_grouped_query_attention_extends_multi_head_attention():
    assert issubclass(GroupedQueryAttention, MultiHeadAttention)
    assert not issubclass(MultiHeadAttention, GroupedQueryAttention)
    assert MultiHeadAttention.__bases__ == (torch.nn.Module,)
    # Chapter 6's forward has no hook for later chapters; GroupedQueryAttention's own
    # forward is built from its public steps, which it does not write again, plus RoPE
    # (and check_inputs adds RoPE's refusal of a context to the parent's checks).
    assert not hasattr(MultiHeadAttention, "transform_queries_keys")
    assert GroupedQueryAttention.forward is not MultiHeadAttention.forward
    for step in ("project", "split_heads", "attention_mask", "attend", "merge_heads"):
        assert getattr(GroupedQueryAttention, step) is getattr(MultiHeadAttention, step)
    assert "super().check_inputs(" in inspect.getsource(GroupedQueryAttention.check_inputs)
    for name in ("qk_norm", "sinks", "rope"):
        assert not hasattr(MultiHeadAttention(4, 4, 8, 0.0, 2), name)


def test_attention_mask_slices_the_buffer_or_builds_the_rows():
    with_buffer = MultiHeadAttention(4, 4, 8, 0.0, 2)
    without = MultiHeadAttention(4, 4, 8, 0.0, 2, mask_buffer=False)
    for module in (with_buffer, without):
        assert module.attention_mask(0, 5, fast=True) == (None, True)
        rows, is_causal = module.attention_mask(3, 5)
        assert not is_causal and torch.equal(rows, AF.bottom_right_causal_mask(2, 5))
    encoder = MultiHeadAttention(4, 4, 8, 0.0, 2, causal=False)
    assert encoder.attention_mask(0, 5, fast=True) == (None, False)
