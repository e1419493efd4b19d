"""attnlib.experiments' DeepSeek Sparse Attention training: the indexed attention,
its KL loss, the agreement measures and the staged training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlib.experiments import (
    IndexedAttention,
    captured_weight,
    indexer_agreement,
    train_dsa_induction,
)
from attnlib.sparse import sparse_attention, top_k_mask


def _layer(mode: str, seed: int = 0) -> tuple[IndexedAttention, torch.Tensor]:
    torch.manual_seed(seed)
    layer = IndexedAttention(16, 12, 2, top_k=3).double()
    layer.mode = mode
    return layer, torch.randn(2, 12, 16, dtype=torch.float64)


def test_sparse_mode_equals_gathered_sparse_attention():
    layer, x = _layer("sparse")
    out = layer(x)
    b, n, h, d = 2, 12, 2, 8
    queries = layer.W_query(x).view(b, n, h, d).transpose(1, 2)
    keys = layer.W_key(x).view(b, n, h, d).transpose(1, 2)
    values = layer.W_value(x).view(b, n, h, d).transpose(1, 2)
    context_vec = sparse_attention(queries, keys, values, layer.indexer(x), 3)
    expected = layer.out_proj(context_vec.transpose(1, 2).reshape(b, n, 16))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert (layer.attn_weights > 0).sum(-1).max() == 3  # three keys per query at most


@pytest.mark.parametrize("mode", ["warmup", "sparse"])
def test_indexer_loss_is_the_kl_to_the_head_summed_attention(mode):
    layer, x = _layer(mode)
    layer(x)
    kept = (torch.ones(12, 12, dtype=torch.bool).tril() if mode == "warmup"
            else top_k_mask(layer.index_scores, 3))
    kept = kept.expand(2, 12, 12)
    b, t = 1, 7
    target = layer.attn_weights[b, :, t].sum(0)
    target = target[kept[b, t]] / target[kept[b, t]].sum()
    log_index = layer.index_scores[b, t][kept[b, t]].log_softmax(-1)
    row = F.kl_div(log_index, target, reduction="sum")
    rows = []
    for bb in range(2):
        for tt in range(12):
            p = layer.attn_weights[bb, :, tt].sum(0)[kept[bb, tt]]
            p = p / p.sum()
            rows.append(F.kl_div(layer.index_scores[bb, tt][kept[bb, tt]].log_softmax(-1),
                                 p, reduction="sum"))
    assert rows[12 + 7].item() == pytest.approx(row.item(), abs=1e-12)
    torch.testing.assert_close(layer.indexer_loss, torch.stack(rows).mean())
    assert layer.indexer_loss > 1e-3


def test_the_losses_train_separate_parts():
    layer, x = _layer("sparse")
    out = layer(x)
    out.sum().backward(retain_graph=True)
    assert all(p.grad is None for p in layer.indexer.parameters())  # not from the model
    assert layer.W_query.weight.grad is not None
    layer.zero_grad(set_to_none=True)
    layer.indexer_loss.backward()
    assert all(p.grad is None for n, p in layer.named_parameters() if "indexer" not in n)
    assert layer.indexer.W_query.weight.grad.abs().max() > 0


def test_dense_mode_runs_no_indexer():
    layer, x = _layer("dense")
    layer(x)
    assert layer.indexer_loss is None and layer.index_scores is None
    expected = layer.out_proj(F.scaled_dot_product_attention(
        layer.W_query(x).view(2, 12, 2, 8).transpose(1, 2),
        layer.W_key(x).view(2, 12, 2, 8).transpose(1, 2),
        layer.W_value(x).view(2, 12, 2, 8).transpose(1, 2), is_causal=True,
    ).transpose(1, 2).reshape(2, 12, 16))
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)


def test_agreement_and_captured_weight():
    # One query row at position 3 (4 visible keys), top 2, weights on keys 0 and 2.
    weights = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    weights[0, :, :, 0] = 1.0
    weights[0, :, 3] = torch.tensor([0.6, 0.1, 0.3, 0.0], dtype=torch.float64)
    scores = torch.zeros(1, 4, 4, dtype=torch.float64)
    scores[0, 3] = torch.tensor([5.0, 1.0, 0.0, 3.0])  # index keeps 0 and 3
    scores[0, 2] = torch.tensor([2.0, 1.0, 3.0, 0.0])  # index keeps 2 and 0
    # rows 2 and 3 count (they see more than 2 keys): row 2 dense top-2 is {0, 1 or 2}
    weights[0, :, 2] = torch.tensor([0.7, 0.0, 0.3, 0.0], dtype=torch.float64)
    assert indexer_agreement(weights, scores, 2) == pytest.approx((1.0 + 0.5) / 2)
    assert captured_weight(weights, scores, 2) == pytest.approx((1.0 + 0.6) / 2)
    assert indexer_agreement(weights, weights.sum(1), 2) == 1.0
    with pytest.raises(ValueError, match="no query sees more than top_k=4"):
        indexer_agreement(weights, scores, 4)
    with pytest.raises(ValueError, match="attn_weights must be"):
        captured_weight(weights[0], scores, 2)


def test_staged_training_is_seeded_and_the_warmup_lowers_the_kl():
    options = dict(dense_steps=30, warmup_steps=15, sparse_steps=5, test_size=64,
                   batch_size=16)
    first = train_dsa_induction(0, **options)
    assert first == train_dsa_induction(0, **options)
    assert len(first.warmup_losses) == 16
    assert first.warmup_losses[-1] < 0.8 * first.warmup_losses[0]
    for name, value in first.__dict__.items():
        if name != "warmup_losses":
            assert 0.0 <= value <= 1.0, name
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
        train_dsa_induction(0, warmup_steps=-1)
    with pytest.raises(ValueError, match="dense_steps must be a positive int"):
        train_dsa_induction(0, dense_steps=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        layer, x = _layer("sparse")
        layer.mode = "sparce"
        layer(x)
