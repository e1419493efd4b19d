"""Chapter 13's streaming and QK-norm experiments (attnlib.experiments._streaming)."""

import math

import pytest
import torch

from attnlib import TinyTransformer
from attnlib.data import IGNORE_INDEX
from attnlib.experiments import (
    attention_logit_max,
    induction_stream,
    position_accuracy,
    rope_transformer,
    streaming_logits,
    train_stream_model,
)


def one_layer(seed=0, **options):
    return rope_transformer(seed, 12, vocab_size=16, d_model=16, num_heads=2,
                            num_layers=1, **options).eval()


def test_stream_of_episodes():
    inputs, targets = induction_stream(3, 30, prefix_len=4, repeat_len=2, vocab_size=8,
                                       generator=torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (3, 30)
    scored = targets != IGNORE_INDEX
    # each 6-token episode scores one position, its first repeated token (t = 4)
    assert scored.nonzero()[:, 1].remainder(6).unique().tolist() == [4]
    assert torch.equal(targets[scored], inputs[:, 1:][scored[:, :-1]])


@pytest.mark.parametrize("options", [{}, {"sinks": True}, {"qk_norm": True}])
def test_dense_is_the_models_own_forward(options):
    torch.manual_seed(0)
    model = rope_transformer(0, 12, vocab_size=16, d_model=16, num_layers=2,
                             **options).eval()
    with torch.no_grad():
        for p in model.parameters():  # move the gains and sinks off their start
            p.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, 16, (2, 12))
    with torch.no_grad():
        reference = model(idx)
        torch.testing.assert_close(streaming_logits(model, idx), reference)
        # a window as long as the sequence, with or without kept tokens, changes nothing
        torch.testing.assert_close(streaming_logits(model, idx, window=12), reference)
        torch.testing.assert_close(
            streaming_logits(model, idx, window=8, num_sink_tokens=4), reference)
        # a shorter one does
        assert not torch.allclose(streaming_logits(model, idx, window=4), reference,
                                  atol=1e-4)


@pytest.mark.parametrize("sinks", [False, True])
def test_one_layer_matches_a_rolling_cache(sinks):
    """With one layer a token's key and value depend on the token alone, so the logits at
    t equal the model's own forward on the cache's content, positions counted from 0:
    the window's last W tokens, or the first s tokens followed by the last W."""
    model = one_layer(1, sinks=sinks)
    idx = torch.randint(0, 16, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        windowed = streaming_logits(model, idx, window=6)
        kept = streaming_logits(model, idx, window=6, num_sink_tokens=3)
        for t in range(20):
            recent = idx[:, max(0, t - 5): t + 1]
            torch.testing.assert_close(windowed[:, t], model(recent)[:, -1])
            cache = idx[:, : t + 1] if t < 9 else torch.cat((idx[:, :3], recent), dim=1)
            torch.testing.assert_close(kept[:, t], model(cache)[:, -1])


def test_logit_max_and_qk_norm_bound():
    """QK-norm bounds a logit by sqrt(head_dim) times the gains (1 at the start)."""
    model = one_layer(2)
    normed = one_layer(2, qk_norm=True)
    with torch.no_grad():
        for linear in (model.blocks[0].attn.W_query, normed.blocks[0].attn.W_query):
            linear.weight.mul_(100.0)
    idx = torch.randint(0, 16, (4, 12), generator=torch.Generator().manual_seed(4))
    grown, bounded = attention_logit_max(model, idx), attention_logit_max(normed, idx)
    assert grown.shape == (1,) and grown.item() > 10.0
    assert bounded.item() <= math.sqrt(8) + 1e-5


def test_position_accuracy_and_training_record():
    run = train_stream_model(0, context_length=24, num_steps=4, batch_size=4,
                             record_every=2)
    assert run.record_steps == [0, 2, 4] and len(run.max_logits) == 3
    assert len(run.losses) == 4 and not run.model.training
    inputs, targets = induction_stream(8, 36, generator=torch.Generator().manual_seed(5))
    acc = position_accuracy(run.model, inputs, targets, window=20)
    scored = (targets != IGNORE_INDEX).any(dim=0)
    assert acc.shape == (36,) and acc.dtype == torch.float64
    assert torch.isnan(acc[~scored]).all() and not torch.isnan(acc[scored]).any()
    assert ((acc[scored] >= 0) & (acc[scored] <= 1)).all()


def test_bad_input():
    model = one_layer()
    idx = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="needs a window"):
        streaming_logits(model, idx, num_sink_tokens=2)
    with pytest.raises(ValueError, match="window"):
        streaming_logits(model, idx, window=0)
    with pytest.raises(ValueError, match="token ids"):
        streaming_logits(model, idx + 16)
    with pytest.raises(TypeError, match="positional='rope'"):
        streaming_logits(TinyTransformer(16, 8, 8, 2, 1), idx)
    with pytest.raises(TypeError, match="idx"):
        streaming_logits(model, idx.float())
    with pytest.raises(ValueError, match="shape"):
        position_accuracy(model, idx, idx[:, :3])
