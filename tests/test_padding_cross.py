"""key_padding_mask on the multi-head classes, against torch.nn.MultiheadAttention."""

import pytest
import torch
from torch.testing import assert_close

from attnlib import GroupedQueryAttention, KVCache, MultiHeadAttention, QKNormSinkAttention
from attnlib.functional import causal_mask

TOL = {"atol": 1e-12, "rtol": 1e-10}


def _pair(seed=0, d=12, heads=3):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d, d, 16, 0.0, heads, qkv_bias=True).double().eval()
    return mha, mha.to_torch().eval()


def _lengths_to_padding(lengths, n, left=False):
    pos = torch.arange(n)[None]
    lengths = torch.tensor(lengths)[:, None]
    return pos < n - lengths if left else pos >= lengths  # True = padding (torch's meaning)


@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize("mask_buffer", [True, False])
def test_key_padding_mask_equals_torch_on_real_positions(return_weights, mask_buffer):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 12, 16, 0.0, 3, qkv_bias=True,
                             mask_buffer=mask_buffer).double().eval()
    ref = mha.to_torch().eval()
    n = 9
    x = torch.randn(3, n, 12, dtype=torch.float64)
    padding = _lengths_to_padding([9, 5, 2], n)  # right padding
    out = mha(x, return_weights, key_padding_mask=padding)
    out = out[0] if return_weights else out
    expected, _ = ref(x, x, x, key_padding_mask=padding, attn_mask=~causal_mask(n),
                      need_weights=False)
    real = ~padding
    assert_close(out[real], expected[real], **TOL)
    # the padding changes the result: without it the real rows of row 1 differ
    assert not torch.allclose(mha(x)[1, 5:], out[1, 5:])


def test_fully_padded_rows_return_zeros():
    mha, _ = _pair(seed=1)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    padding = _lengths_to_padding([6, 3], 6, left=True)  # row 1: keys 0-2 are padding
    for out in (mha(x, key_padding_mask=padding),
                mha(x, True, key_padding_mask=padding)[0]):
        # causal + left padding: queries 0-2 of row 1 see no real key -> out_proj(0) = bias
        assert_close(out[1, :3], mha.out_proj.bias.expand(3, -1), **TOL)
        assert torch.isfinite(out).all()


def test_key_padding_mask_with_gqa_and_cache():
    torch.manual_seed(2)
    gqa = GroupedQueryAttention(10, 12, 16, 0.0, 6, 2, rope=True).double().eval()
    x = torch.randn(2, 8, 10, dtype=torch.float64)
    padding = _lengths_to_padding([8, 3], 8, left=True)
    full = gqa(x, key_padding_mask=padding)
    cache = KVCache()
    steps = [gqa(x[:, :5], kv_cache=cache, key_padding_mask=padding[:, :5])]
    steps += [gqa(x[:, t : t + 1], kv_cache=cache, key_padding_mask=padding[:, : t + 1])
              for t in range(5, 8)]
    assert_close(torch.cat(steps, dim=1), full, **TOL)
    assert_close(gqa(x, True, key_padding_mask=padding)[0], full, **TOL)


def test_key_padding_mask_is_checked():
    mha, _ = _pair()
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    with pytest.raises(TypeError, match="must be bool"):
        mha(x, key_padding_mask=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\(batch, num_tokens_kv\) = \(2, 4\)"):
        mha(x, key_padding_mask=torch.zeros(4, 2, dtype=torch.bool))


# ---------------------------------------------------------------------------
# Cross-attention: queries from x, keys and values from a context
# ---------------------------------------------------------------------------


def _cross_pair(seed=3, d=12, heads=3, **kwargs):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d, d, 16, 0.0, heads, qkv_bias=True, causal=False,
                             **kwargs).double().eval()
    return mha, mha.to_torch().eval()


@pytest.mark.parametrize("return_weights", [False, True])
def test_cross_attention_equals_torch(return_weights):
    mha, ref = _cross_pair()
    assert mha.mask is None  # no causal buffer for a non-causal module
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    context = torch.randn(2, 40, 12, dtype=torch.float64)  # longer than context_length
    out = mha(x, return_weights, context=context)
    expected, expected_weights = ref(x, context, context, average_attn_weights=False)
    assert_close(out[0] if return_weights else out, expected, **TOL)
    if return_weights:
        assert out[1].shape == (2, 3, 5, 40)
        assert_close(out[1], expected_weights, **TOL)
    # the keys really come from the context: self-attention gives something else
    assert not torch.allclose(mha(x), expected[:, :5])


@pytest.mark.parametrize("return_weights", [False, True])
def test_cross_attention_key_padding_mask_on_context_equals_torch(return_weights):
    mha, ref = _cross_pair(seed=4)
    x = torch.randn(3, 4, 12, dtype=torch.float64)
    context = torch.randn(3, 7, 12, dtype=torch.float64)
    padding = _lengths_to_padding([7, 3, 1], 7)  # True = padding, on the context's keys
    out = mha(x, return_weights, context=context, key_padding_mask=padding)
    out = out[0] if return_weights else out
    expected, _ = ref(x, context, context, key_padding_mask=padding, need_weights=False)
    assert_close(out, expected, **TOL)
    unpadded = mha(x, context=context)
    assert not torch.allclose(out[1], unpadded[1])  # the padding changed row 1
    assert_close(out[0], unpadded[0], **TOL)  # and not row 0, which has none


def test_cross_attention_with_gqa_and_options():
    torch.manual_seed(5)
    gqa = QKNormSinkAttention(10, 12, 8, 0.0, 4, 2, causal=False, qk_norm=True,
                              sinks=True).double().eval()
    x, context = torch.randn(2, 3, 10, dtype=torch.float64), torch.randn(2, 6, 10,
                                                                         dtype=torch.float64)
    fast = gqa(x, context=context)
    readable, weights = gqa(x, True, context=context)
    assert_close(fast, readable, **TOL)
    assert weights.shape == (2, 4, 3, 6) and (weights.sum(-1) < 1).all()


def test_non_causal_self_attention_equals_torch_without_mask():
    mha, ref = _cross_pair(seed=6)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    expected = ref(x, x, x, need_weights=False)[0]
    assert_close(mha(x), expected, **TOL)
    assert_close(mha(x, True)[0], expected, **TOL)


def test_cross_attention_misuse_is_refused():
    torch.manual_seed(7)
    causal = MultiHeadAttention(12, 12, 16, 0.0, 3).double()
    x, context = torch.randn(2, 4, 12, dtype=torch.float64), torch.randn(2, 6, 12,
                                                                         dtype=torch.float64)
    with pytest.raises(ValueError, match="causal mask there is a mistake"):
        causal(x, context=context)
    with pytest.raises(ValueError, match="causal mask there is a mistake"):
        causal(x, True, context=context)
    cross, _ = _cross_pair()
    with pytest.raises(ValueError, match=r"\(batch, num_tokens_kv, d_in\) = \(2, num_tokens_kv"):
        cross(x, context=context[:1])
    with pytest.raises(ValueError, match="no tokens"):
        cross(x, context=context[:, :0])
    with pytest.raises(TypeError, match="dtype"):
        cross(x, context=context.float())
    with pytest.raises(TypeError, match="context must be a torch.Tensor"):
        cross(x, context=[[0.0]])
    with pytest.raises(ValueError, match="kv_cache"):
        cross(x, context=context, kv_cache=KVCache())
    with pytest.raises(ValueError, match=r"\(batch, num_tokens_kv\) = \(2, 6\)"):
        cross(x, context=context, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    rope = GroupedQueryAttention(12, 12, 16, 0.0, 3, 3, rope=True, causal=False).double()
    with pytest.raises(ValueError, match="rope=True"):
        rope(x, context=context)
