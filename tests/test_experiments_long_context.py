"""Chapter 9's long-context RoPE and GQA-conversion experiments (attnlib.experiments)."""

import pytest
import torch

from attnlib import GroupedQueryAttention, TinyTransformer
from attnlib.experiments import (
    ROPE_METHODS,
    gqa_from_mha_accuracy,
    long_context_accuracy,
    mean_pool_kv_heads,
    rope_scaling,
    set_rope_scaling,
    train_rope_induction,
)


@pytest.fixture(scope="module")
def tiny_models():
    torch.set_num_threads(1)
    return [train_rope_induction(seed, prefix_len=4, repeat_len=2, vocab_size=16,
                                 num_steps=5, batch_size=8) for seed in (0, 1)]


def test_pooling_heads_that_are_already_equal_changes_nothing():
    """If the key/value heads of each group are equal, their mean is that head, so the
    pooled layer must give the original outputs: true only if the query heads are
    grouped as GroupedQueryAttention groups them (consecutive heads share)."""
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 16, 10, 0.0, num_heads=4, num_kv_groups=4,
                                 rope=True).eval()
    with torch.no_grad():
        for linear in (attn.W_key, attn.W_value):
            rows = linear.weight.view(4, 4, 16)  # (heads, head_dim, d_in)
            rows[1] = rows[0]
            rows[3] = rows[2]
    x = torch.randn(2, 10, 16)
    pooled = mean_pool_kv_heads(attn, 2)
    assert pooled.num_kv_groups == 2 and not pooled.training
    torch.testing.assert_close(pooled(x), attn(x), rtol=1e-5, atol=1e-6)
    # the other arrangement (heads 0 and 2 sharing) is a different layer
    with torch.no_grad():
        rows = attn.W_key.weight.view(4, 4, 16)
        rows[1] = rows[2]
    assert not torch.allclose(mean_pool_kv_heads(attn, 2)(x), attn(x), atol=1e-3)


def test_pooling_to_one_head_is_the_mean_of_all():
    torch.manual_seed(1)
    attn = GroupedQueryAttention(8, 8, 6, 0.0, num_heads=4, num_kv_groups=2, qkv_bias=True)
    pooled = mean_pool_kv_heads(attn, 1)
    weight = attn.W_value.weight.view(2, 2, 8).mean(dim=0)  # (head_dim, d_in)
    torch.testing.assert_close(pooled.W_value.weight, weight)
    torch.testing.assert_close(pooled.W_key.bias, attn.W_key.bias.view(2, 2).mean(dim=0))
    torch.testing.assert_close(pooled.W_query.weight, attn.W_query.weight)
    with pytest.raises(ValueError, match="num_kv_groups=3"):
        mean_pool_kv_heads(attn, 3)
    with pytest.raises(TypeError, match="GroupedQueryAttention"):
        mean_pool_kv_heads(torch.nn.Linear(2, 2), 1)


def test_rope_scaling_dicts():
    assert rope_scaling("none", 4, 20) is None
    assert rope_scaling("yarn", 1, 20) is None  # the trained length: no scaling
    assert rope_scaling("linear", 2, 20) == {"rope_type": "linear", "factor": 2.0}
    llama3 = rope_scaling("llama3", 4, 20)
    assert llama3["original_max_position_embeddings"] == 20 and llama3["factor"] == 4.0
    with pytest.raises(ValueError, match="method"):
        rope_scaling("dynamic", 2, 20)


def test_set_rope_scaling_changes_only_the_rotation():
    torch.manual_seed(2)
    model = TinyTransformer(16, 12, d_model=8, num_heads=2, num_layers=1,
                            positional="rope").eval()
    idx = torch.randint(0, 16, (1, 12))
    reference = model(idx)
    set_rope_scaling(model, {"rope_type": "linear", "factor": 2.0})
    inv_freq = model.blocks[0].attn.rope.inv_freq
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.01], dtype=torch.float64) / 2)
    assert not torch.allclose(model(idx), reference)
    set_rope_scaling(model, None)
    torch.testing.assert_close(model(idx), reference)
    with pytest.raises(TypeError, match="positional='rope'"):
        set_rope_scaling(TinyTransformer(16, 12, 8, 2, 1), None)


def test_long_context_shapes_and_the_trained_length(tiny_models):
    result = long_context_accuracy(tiny_models, prefix_len=4, repeat_len=2,
                                   factors=(1, 2), finetune_steps=2, finetune_batch=4)
    assert result.lengths == (6, 12) and result.methods == ROPE_METHODS
    assert result.before.shape == result.after.shape == (2, len(ROPE_METHODS), 2)
    # at the trained length every method is the trained rotation: equal accuracies
    column = result.before[:, :, 0]
    assert torch.equal(column, column[:, :1].expand_as(column))
    assert ((result.after >= 0) & (result.after <= 1)).all()
    with pytest.raises(ValueError, match="context_length"):
        long_context_accuracy(tiny_models, prefix_len=4, repeat_len=2, factors=(8,))


def test_gqa_conversion_keeps_mha_when_nothing_is_pooled(tiny_models):
    result = gqa_from_mha_accuracy(tiny_models, num_kv_groups=(4, 1), prefix_len=4,
                                   repeat_len=2, uptrain_steps=2, batch_size=4)
    # 4 groups of 4 heads: pooling is the identity, so the accuracy is the model's
    torch.testing.assert_close(result.pooled_before[:, 0], result.mha)
    assert result.cache_bytes_per_token.tolist() == [2 * 4 * 8 * 4 * 2, 2 * 1 * 8 * 4 * 2]
    assert result.mha_cache_bytes_per_token == 2 * 4 * 8 * 4 * 2
    with pytest.raises(ValueError, match="does not divide"):
        gqa_from_mha_accuracy(tiny_models, num_kv_groups=(3,))


def test_pooling_refuses_a_subclass_whose_parts_it_would_drop():
    from attnlib import QKNormSinkAttention

    for options in ({"sinks": True}, {"qk_norm": True}, {"window": 3}, {}):
        attn = QKNormSinkAttention(8, 8, 6, 0.0, 4, 4, **options)
        with pytest.raises(TypeError, match="QKNormSinkAttention"):
            mean_pool_kv_heads(attn, 2)
