"""attnlib.sparse: DeepSeek Sparse Attention equals full attention with the
unselected keys masked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlib.sparse import LightningIndexer, sparse_attention, top_k_mask


def _setup(n=12, n_kv=12, seed=0):
    torch.manual_seed(seed)
    indexer = LightningIndexer(16, 3, 4).double()
    x = torch.randn(2, n_kv, 16, dtype=torch.float64)
    index_scores = indexer(x[:, n_kv - n :], x)  # (2, n, n_kv)
    q = torch.randn(2, 4, n, 8, dtype=torch.float64)
    k = torch.randn(2, 4, n_kv, 8, dtype=torch.float64)
    v = torch.randn(2, 4, n_kv, 5, dtype=torch.float64)
    return index_scores, q, k, v


@pytest.mark.parametrize("top_k", [1, 3, 5])
@pytest.mark.parametrize("n", [12, 4, 1])
def test_equals_full_attention_with_complementary_keys_masked(top_k, n):
    index_scores, q, k, v = _setup(n=n)
    mask = top_k_mask(index_scores, top_k)
    visible = torch.ones(n, 12, dtype=torch.bool).tril(12 - n)
    assert not (mask & ~visible).any()  # never a future key
    kept = mask.sum(-1)
    torch.testing.assert_close(kept, visible.sum(-1).clamp(max=top_k).expand_as(kept))
    # the kept keys are the highest-scoring visible ones
    scores = index_scores.masked_fill(~visible, float("-inf"))
    lowest_kept = scores.masked_fill(~mask, float("inf")).min(-1).values
    highest_dropped = scores.masked_fill(mask, float("-inf")).max(-1).values
    assert (lowest_kept >= highest_dropped).all()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    got = sparse_attention(q, k, v, index_scores, top_k)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_top_k_of_all_keys_is_causal_attention():
    index_scores, q, k, v = _setup()
    got = sparse_attention(q, k, v, index_scores, 12)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # ...and a smaller top_k does change the result
    assert (sparse_attention(q, k, v, index_scores, 3) - expected).abs().max() > 1e-3


def test_indexer_is_a_relu_weighted_sum():
    torch.manual_seed(1)
    indexer = LightningIndexer(6, 2, 3).double()
    x = torch.randn(1, 4, 6, dtype=torch.float64)
    scores = indexer(x, x)
    q = indexer.W_query(x).view(1, 4, 2, 3)
    key = indexer.W_key(x)
    w = indexer.W_weights(x)
    t, s = 3, 1
    manual = sum(w[0, t, j] * torch.relu(q[0, t, j] @ key[0, s]) for j in range(2))
    torch.testing.assert_close(scores[0, t, s], manual)


def test_bad_arguments():
    index_scores, q, k, v = _setup()
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        top_k_mask(index_scores, 0)
    with pytest.raises(ValueError, match="index_scores must have shape"):
        sparse_attention(q, k, v, index_scores[:, :3], 2)
    with pytest.raises(TypeError, match="top_k must be an int"):
        sparse_attention(q, k, v, index_scores, 2.0)
