"""attnlib.sparse: DeepSeek Sparse Attention equals full attention with the
unselected keys masked, and its lightning indexer equals transformers'
DeepSeek-V3.2 indexer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers  # a pinned test dependency: no importorskip
from torch.overrides import TorchFunctionMode

from attnlib.sparse import LightningIndexer, sparse_attention, top_k_mask


def _setup(n=12, n_kv=12, seed=0):
    torch.manual_seed(seed)
    indexer = LightningIndexer(16, 12, 3, 4, rope_head_dim=2).double()
    x = torch.randn(2, n_kv, 16, dtype=torch.float64)
    index_scores = indexer(x[:, n_kv - n :], x_key=x)  # (2, n, n_kv)
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


def _indexer(q_lora_rank=5, seed=1):
    torch.manual_seed(seed)
    indexer = LightningIndexer(6, 16, 2, 4, rope_head_dim=2, q_lora_rank=q_lora_rank)
    indexer = indexer.double()
    with torch.no_grad():  # a LayerNorm gain and bias away from 1 and 0, so they matter
        indexer.key_norm.weight.normal_(1.0, 0.3)
        indexer.key_norm.bias.normal_(0.0, 0.3)
    return indexer


def _rotate_first_two(v, position):
    """RoPE by hand on components (0, 1), a half-split pair of a 2-wide RoPE part."""
    angle = torch.tensor(float(position), dtype=torch.float64)  # theta_0 = 1
    c, s = angle.cos(), angle.sin()
    return torch.cat([(v[:1] * c - v[1:2] * s), (v[1:2] * c + v[:1] * s), v[2:]])


def test_indexer_is_a_relu_weighted_sum():
    indexer = _indexer()
    x = torch.randn(1, 5, 6, dtype=torch.float64)
    q_latent = torch.randn(1, 5, 5, dtype=torch.float64)
    scores = indexer(x, q_latent)
    q = indexer.W_query(q_latent).view(1, 5, 2, 4)
    key = F.layer_norm(indexer.W_key(x), (4,), indexer.key_norm.weight,
                       indexer.key_norm.bias, eps=1e-6)
    w = indexer.W_weights(x) / 2**0.5
    t, s = 4, 1
    k_s = _rotate_first_two(key[0, s], s)
    manual = sum(w[0, t, j] * torch.relu(_rotate_first_two(q[0, t, j], t) @ k_s) / 2
                 for j in range(2))  # 1 / sqrt(index_head_dim) = 1 / 2
    torch.testing.assert_close(scores[0, t, s], manual)
    # the key LayerNorm and the RoPE both matter
    with torch.no_grad():
        indexer.key_norm.bias.zero_()
    assert (indexer(x, q_latent) - scores).abs().max() > 1e-3
    with torch.no_grad():
        indexer.rope.cos.fill_(1.0)
        indexer.rope.sin.fill_(0.0)
    assert (indexer(x, q_latent)[0, t, s] - manual).abs() > 1e-6


def test_indexer_queries_at_the_last_positions():
    indexer = _indexer()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    q_latent = torch.randn(2, 9, 5, dtype=torch.float64)
    full = indexer(x, q_latent)  # (2, 9, 9)
    last = indexer(x[:, 6:], q_latent[:, 6:], x_key=x)  # queries at positions 6, 7, 8
    torch.testing.assert_close(last, full[:, 6:], rtol=0, atol=1e-12)


def test_indexer_bad_arguments():
    with pytest.raises(ValueError, match="rope_head_dim=3 must be even"):
        LightningIndexer(6, 16, 2, 4, rope_head_dim=3)
    with pytest.raises(ValueError, match="rope_head_dim=6 must be even and at most"):
        LightningIndexer(6, 16, 2, 4, rope_head_dim=6)
    with pytest.raises(TypeError, match="q_lora_rank must be an int"):
        LightningIndexer(6, 16, 2, 4, rope_head_dim=2, q_lora_rank=2.0)
    indexer = _indexer()
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="pass q_latent"):
        indexer(x)
    with pytest.raises(ValueError, match=r"q_latent must have shape \(1, 3, 5\)"):
        indexer(x, torch.randn(1, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="q_lora_rank=None"):
        _indexer(q_lora_rank=None)(x, torch.randn(1, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="x_key must be"):
        indexer(x, torch.randn(1, 3, 5, dtype=torch.float64), x_key=x[:, :2])


def test_bad_arguments():
    index_scores, q, k, v = _setup()
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        top_k_mask(index_scores, 0)
    with pytest.raises(ValueError, match="index_scores must have shape"):
        sparse_attention(q, k, v, index_scores[:, :3], 2)
    with pytest.raises(TypeError, match="top_k must be an int"):
        sparse_attention(q, k, v, index_scores, 2.0)


# ---------------------------------------------------------------------------
# Against transformers' DeepSeek-V3.2 indexer (built from a config; no download)
# ---------------------------------------------------------------------------


class _CaptureTopKInput(TorchFunctionMode):
    """Keeps the tensor a ``Tensor.topk`` call ranks: the indexer's masked scores,
    which transformers' indexer does not return (it returns the top-k indices)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.topk:
            self.ranked = args[0].clone()
        return func(*args, **(kwargs or {}))


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 0.8,
        "beta_fast": 32.0, "beta_slow": 1.0}


@pytest.mark.parametrize("rope_scaling", [None, YARN], ids=["default", "yarn"])
def test_indexer_equals_transformers_deepseek_v32(rope_scaling):
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds

    rope = {} if rope_scaling is None else {"rope_parameters": dict(rope_scaling)}
    config = transformers.DeepseekV32Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
        kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
        index_n_heads=3, index_head_dim=8, index_topk=5, num_hidden_layers=1,
        vocab_size=50, intermediate_size=16, moe_intermediate_size=8, n_routed_experts=2,
        num_experts_per_tok=1, n_shared_experts=1, first_k_dense_replace=1,
        max_position_embeddings=64, attn_implementation="eager", **rope,
    )
    torch.manual_seed(0)
    hf = ds.DeepseekV32Indexer(config, layer_idx=0).eval()
    with torch.no_grad():  # LayerNorm gain and bias too, so that they matter
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    rotary = ds.DeepseekV32RotaryEmbedding(config)
    # As configured: its RoPE part is MLA's qk_rope_head_dim, its latent queries MLA's.
    indexer = LightningIndexer(32, 64, 3, 8, rope_head_dim=4, q_lora_rank=16,
                               rope_scaling=rope_scaling).eval()
    with torch.no_grad():
        indexer.W_query.weight.copy_(hf.wq_b.weight)
        indexer.W_key.weight.copy_(hf.wk.weight)
        indexer.key_norm.weight.copy_(hf.k_norm.weight)
        indexer.key_norm.bias.copy_(hf.k_norm.bias)
        indexer.W_weights.weight.copy_(hf.weights_proj.weight)
    x = torch.randn(2, 24, 32)
    q_latent = torch.randn(2, 24, 16)
    visible = torch.ones(24, 24, dtype=torch.bool).tril()  # True = may attend
    positions = torch.arange(24)[None]
    with torch.no_grad(), _CaptureTopKInput() as capture:
        hf_top = hf(x, q_latent, rotary(x, positions), visible[None].expand(2, -1, -1),
                    positions)  # (2, 24, 5) indices
        scores = indexer(x, q_latent)  # (2, 24, 24)
    assert scores.abs().max() > 1.0  # scores of a size at which 1e-6 means something
    torch.testing.assert_close(scores.masked_fill(~visible, 0.0),
                               capture.ranked.masked_fill(~visible, 0.0), rtol=0, atol=1e-6)
    # The same top-k keys on every row (a row that sees fewer keeps all it sees).
    hf_kept = torch.zeros(2, 24, 24, dtype=torch.bool).scatter(-1, hf_top.long(), True)
    kept = top_k_mask(scores, 5)
    assert torch.equal(kept, hf_kept & visible)
    assert kept.sum().item() == 2 * sum(min(5, t + 1) for t in range(24))
