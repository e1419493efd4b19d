"""Tests for attnlib.models: the tiny decoder-only transformer of chapter 10."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib.kv_cache import Cache
from attnlib.models import TinyTransformer, TransformerBlock
from attnlib.variants import (
    LinearAttention,
    SharedKVAttention,
    TopKAttention,
    gated_deltanet_layer,
    latent_attention_layer,
)

SMALL = settings(max_examples=20, deadline=None)


def make_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    args = {
        "vocab_size": 11,
        "context_length": 9,
        "d_model": 12,
        "num_heads": 3,
        "num_layers": 2,
    } | kwargs
    return TinyTransformer(**args).eval()


def tokens(batch, num_tokens, vocab_size=11, seed=1):
    return torch.randint(0, vocab_size, (batch, num_tokens), generator=torch.Generator().manual_seed(seed))


def test_logits_and_weights_shapes():
    model = make_model()
    idx = tokens(4, 7)
    logits = model(idx)
    assert logits.shape == (4, 7, 11)
    logits_w, weights = model(idx, return_weights=True)
    assert isinstance(weights, list) and len(weights) == 2
    for w in weights:
        assert w.shape == (4, 3, 7, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones(4, 3, 7))
        assert (w.triu(1) == 0).all()  # causal: no weight on later tokens
    # The readable path computes the same function as the fused fast path.
    torch.testing.assert_close(logits_w, logits, rtol=1e-5, atol=1e-5)


@SMALL
@given(
    batch=st.integers(1, 3),
    num_tokens=st.integers(1, 9),
    num_heads=st.sampled_from([1, 2, 4]),
    num_layers=st.integers(1, 3),
    positional=st.sampled_from(["learned", "sinusoidal", "rope"]),
)
def test_shapes_property(batch, num_tokens, num_heads, num_layers, positional):
    model = make_model(d_model=8, num_heads=num_heads, num_layers=num_layers,
                       positional=positional)
    logits, weights = model(tokens(batch, num_tokens), return_weights=True)
    assert logits.shape == (batch, num_tokens, 11)
    assert [w.shape for w in weights] == [(batch, num_heads, num_tokens, num_tokens)] * num_layers


@pytest.mark.parametrize("positional", ["learned", "rope"])
@pytest.mark.parametrize("d_ff", [None, 24])
@pytest.mark.parametrize("t", [0, 3, 8])
def test_causality_changing_token_t_leaves_earlier_logits_unchanged(d_ff, t, positional):
    model = make_model(d_ff=d_ff, positional=positional)
    idx = tokens(2, 9)
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % 11
    before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    assert (after[:, t] - before[:, t]).abs().max() > 1e-3  # position t itself sees it


def recompute_from_weights(model, idx, weights):
    """The model's forward, with each layer's attention taken from ``weights``."""
    x = model.tok_emb(idx)
    if model.pos_emb is not None:  # (with RoPE the attention rotates queries and keys)
        x = model.pos_emb(x)
    b, n, _ = x.shape
    for block, attn_weights in zip(model.blocks, weights, strict=True):
        attn = block.attn
        values = attn.W_value(block.norm_1(x)).view(b, n, attn.num_heads, attn.head_dim)
        values = values.transpose(1, 2)  # (b, num_heads, n, head_dim)
        context_vec = (attn_weights @ values).transpose(1, 2).reshape(b, n, attn.d_out)
        x = x + attn.out_proj(context_vec)
        if block.mlp is not None:
            x = x + block.mlp(block.norm_2(x))
    return model.out_head(model.final_norm(x))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("d_ff", [None, 16])
def test_returned_weights_are_the_weights_applied(d_ff, positional):
    model = make_model(d_ff=d_ff, num_layers=3, positional=positional)
    idx = tokens(3, 8)
    logits, weights = model(idx, return_weights=True)
    torch.testing.assert_close(recompute_from_weights(model, idx, weights), logits)
    # And the check can fail: other weights (here uniform over the visible
    # tokens) give other logits.
    uniform = [torch.tril(torch.ones(8, 8)) / torch.arange(1, 9)[:, None]] * 3
    uniform = [u.expand_as(w) for u, w in zip(uniform, weights, strict=True)]
    assert (recompute_from_weights(model, idx, uniform) - logits).abs().max() > 1e-3


def test_attention_only_and_mlp_variants():
    attention_only = make_model()
    with_mlp = make_model(d_ff=20)
    assert all(block.mlp is None for block in attention_only.blocks)
    assert all(block.mlp[0].out_features == 20 for block in with_mlp.blocks)
    n_attn = sum(p.numel() for p in attention_only.parameters())
    n_mlp = sum(p.numel() for p in with_mlp.parameters())
    # Each MLP adds two linear layers (with biases) and a LayerNorm.
    per_block = (12 * 20 + 20) + (20 * 12 + 12) + 2 * 12
    assert n_mlp - n_attn == 2 * per_block


def test_blocks_use_attnlib_multi_head_attention_and_parameter_count():
    model = make_model()
    assert all(isinstance(b.attn, attnlib.MultiHeadAttention) for b in model.blocks)
    d, v, c = 12, 11, 9
    per_block = 2 * d + 3 * d * d + (d * d + d)  # LayerNorm, W_q/W_k/W_v, out_proj
    expected = v * d + c * d + 2 * per_block + 2 * d + d * v
    assert sum(p.numel() for p in model.parameters()) == expected


def test_sinusoidal_positions_have_no_parameters():
    learned = make_model(positional="learned")
    fixed = make_model(positional="sinusoidal")
    n_learned = sum(p.numel() for p in learned.parameters())
    n_fixed = sum(p.numel() for p in fixed.parameters())
    assert n_learned - n_fixed == 9 * 12


def test_rope_uses_multi_head_attention_with_rotations_and_no_position_table():
    model = make_model(positional="rope")
    assert model.pos_emb is None
    for block in model.blocks:
        assert isinstance(block.attn, attnlib.GroupedQueryAttention)
        assert block.attn.num_kv_groups == block.attn.num_heads == 3
        assert isinstance(block.attn.rope, attnlib.RotaryPositionalEmbedding)
    n_learned = sum(p.numel() for p in make_model().parameters())
    assert n_learned - sum(p.numel() for p in model.parameters()) == 9 * 12


def test_rope_knows_only_relative_positions():
    # One token repeated: every query sees the same values, and RoPE's scores depend
    # only on offsets, so every position gets the same logits. Learned absolute
    # positions tell the positions apart.
    idx = torch.full((1, 6), 3)
    rope_logits = make_model(positional="rope")(idx)
    torch.testing.assert_close(rope_logits, rope_logits[:, :1].expand(1, 6, 11))
    learned_logits = make_model()(idx)
    assert (learned_logits[0, 0] - learned_logits[0, 5]).abs().max() > 1e-3


def test_position_matters():
    # With positions, the same token at two places gives two different logits.
    model = make_model()
    idx = torch.full((1, 5), 3)
    logits = model(idx)
    assert (logits[0, 0] - logits[0, 4]).abs().max() > 1e-3


def test_block_alone():
    torch.manual_seed(0)
    block = TransformerBlock(8, 6, 2, d_ff=16).eval()
    x = torch.randn(2, 5, 8)
    y, w = block(x, return_weights=True)
    assert y.shape == x.shape and w.shape == (2, 2, 5, 5)
    torch.testing.assert_close(block(x), y)


@pytest.mark.parametrize(
    ("idx", "error", "match"),
    [
        ([[1, 2]], TypeError, "idx must be a torch.Tensor"),
        (torch.ones(1, 3), TypeError, "dtype torch.int64"),
        (torch.ones(4, dtype=torch.long), ValueError, r"idx must be \(batch, num_tokens\)"),
        (torch.ones(1, 0, dtype=torch.long), ValueError, "at least one token"),
        (torch.ones(1, 10, dtype=torch.long), ValueError, "num_tokens=10 exceeds context_length=9"),
        (torch.tensor([[1, 11]]), ValueError, "token id 11, outside 0 .. vocab_size - 1 = 10"),
        (torch.tensor([[-1, 2]]), ValueError, "token id -1"),
    ],
)
def test_forward_errors(idx, error, match):
    with pytest.raises(error, match=match):
        make_model()(idx)


def test_return_weights_must_be_bool():
    with pytest.raises(TypeError, match="return_weights must be a bool"):
        make_model()(tokens(1, 3), return_weights=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 10}, ValueError, "d_model=10 is not divisible by num_heads=3"),
        ({"num_layers": 0}, ValueError, "num_layers"),
        ({"d_ff": 0}, ValueError, "d_ff"),
        ({"positional": "rotary!"}, ValueError, "positional must be one of"),
        ({"positional": "rope", "d_model": 9}, ValueError, "head_dim = d_model // num_heads = 3"),
        ({"positional": 1}, TypeError, "positional must be a str"),
        ({"dropout": 1.0}, ValueError, "dropout"),
        ({"vocab_size": 2.5}, TypeError, "vocab_size must be an int"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_model(**kwargs)


# ---------------------------------------------------------------- KV cache and generation


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
def test_chunks_through_kv_caches_equal_one_forward(positional):
    model = make_model(positional=positional, d_ff=16)
    idx = tokens(2, 9)
    full, full_weights = model(idx, return_weights=True)
    caches = model.new_caches()
    parts = [model(idx[:, :4], kv_caches=caches), model(idx[:, 4:5], kv_caches=caches)]
    last, last_weights = model(idx[:, 5:], return_weights=True, kv_caches=caches)
    torch.testing.assert_close(torch.cat([*parts, last], dim=1), full, rtol=1e-5, atol=1e-5)
    assert [len(c) for c in caches] == [9, 9]
    # The new tokens' weights over all nine keys are the last rows of the full maps.
    assert last_weights[0].shape == (2, 3, 4, 9)
    torch.testing.assert_close(last_weights[1], full_weights[1][:, :, 5:], rtol=1e-5, atol=1e-5)


def test_a_cache_needs_the_right_positions():
    # Feeding the new token without its cache would put it at position 0: other logits.
    model = make_model()
    idx = tokens(1, 6)
    full = model(idx)
    alone = model(idx[:, 5:])
    assert (alone[:, 0] - full[:, 5]).abs().max() > 1e-3


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("d_ff", [None, 16])
def test_generate_with_and_without_cache_agree(d_ff, positional):
    model = make_model(d_ff=d_ff, vocab_size=7, context_length=12, positional=positional)
    prompt = tokens(3, 4, vocab_size=7)
    with_cache = model.generate(prompt, 8)
    without = model.generate(prompt, 8, use_cache=False)
    assert with_cache.shape == (3, 12)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :4], prompt)
    # Greedy: each generated token is the argmax of the full forward pass.
    logits = model(with_cache[:, :-1])
    assert torch.equal(logits[:, 3:].argmax(-1), with_cache[:, 4:])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m.generate(tokens(1, 5), 5), ValueError, "= 10 exceeds context_length=9"),
        (lambda m: m.generate(tokens(1, 5), 0), ValueError, "max_new_tokens"),
        (lambda m: m.generate(tokens(1, 5), 2, use_cache=None), TypeError, "use_cache"),
        (lambda m: m(tokens(1, 3), kv_caches=attnlib.KVCache()), TypeError,
         "kv_caches must be a list of caches"),
        (lambda m: m(tokens(1, 3), kv_caches=[attnlib.KVCache()]), ValueError,
         "kv_caches has 1 caches, but the model has num_layers=2"),
    ],
)
def test_generation_and_cache_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(make_model())


def test_cache_overflow_and_mismatched_caches_are_errors():
    model = make_model()
    caches = model.new_caches()
    model(tokens(1, 6), kv_caches=caches)
    with pytest.raises(ValueError, match="the caches hold 6 tokens and idx adds num_tokens=4"):
        model(tokens(1, 4), kv_caches=caches)
    other = model.new_caches()
    model.blocks[0](torch.zeros(1, 2, 12), kv_cache=other[0])
    with pytest.raises(ValueError, match="different numbers of tokens"):
        model(tokens(1, 1), kv_caches=other)


def test_block_rope_errors():
    with pytest.raises(ValueError, match="head_dim = d_model // num_heads = 3 must be even"):
        TransformerBlock(6, 4, 2, rope=True)
    with pytest.raises(TypeError, match="rope must be a bool"):
        TransformerBlock(8, 4, 2, rope=1)


# ---------------------------------------------------------------------------
# Cross-layer KV sharing (kv_sharing) and the cache-size helpers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_kv_sharing_consumers_have_no_key_value_projections(positional):
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 16, 2, 4, positional=positional, kv_sharing=2)
    roles = [block.attn.makes_kv for block in model.blocks]
    assert roles == [True, False, True, False]
    assert model.blocks[1].attn.W_key is None and model.blocks[0].attn.W_key is not None
    plain = TinyTransformer(11, 16, 16, 2, 4, positional=positional)
    n_plain = sum(p.numel() for p in plain.parameters())
    n_shared = sum(p.numel() for p in model.parameters())
    assert n_plain - n_shared == 2 * 2 * 16 * 16  # two consumers lose W_key and W_value
    assert "kv_sharing=2" in repr(model)


def test_kv_sharing_consumer_reads_the_producers_keys():
    # Changing a producer's W_key changes the consumer's attention too.
    torch.manual_seed(1)
    model = TinyTransformer(11, 16, 16, 2, 2, kv_sharing=2).eval()
    idx = torch.randint(0, 11, (2, 9))
    x = model.tok_emb(idx) + model.pos_emb.embedding(torch.arange(9))
    assert model.blocks[1].new_cache() is None  # a consumer keeps nothing of its own
    cache = model.blocks[0].new_cache()
    x1 = model.blocks[0](x, kv_cache=cache)
    out = model.blocks[1](x1, kv_cache=cache)
    with torch.no_grad():
        model.blocks[0].attn.W_key.weight.mul_(2.0)
    cache_b = model.blocks[0].new_cache()
    model.blocks[0](x, kv_cache=cache_b)
    out_b = model.blocks[1](x1, kv_cache=cache_b)
    assert (out_b - out).abs().max() > 1e-4
    with pytest.raises(ValueError, match="consumer layer"):
        model.blocks[1](x1)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_kv_sharing_cached_decoding_equals_full_forward(positional):
    torch.manual_seed(2)
    model = TinyTransformer(11, 16, 16, 2, 3, positional=positional, kv_sharing=2).double()
    model.eval()
    idx = torch.randint(0, 11, (2, 10))
    full = model(idx)
    caches = model.new_caches()
    parts = [model(idx[:, :4], kv_caches=caches)]
    for t in range(4, 10):
        parts.append(model(idx[:, t : t + 1], kv_caches=caches))
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)
    assert [len(c) for c in caches] == [10, 10, 10]
    assert caches[1] is caches[0]  # the consumer reads its producer's cache
    prompt = idx[:, :3]
    torch.testing.assert_close(model.generate(prompt, 5), model.generate(prompt, 5,
                               use_cache=False))


def test_kv_sharing_off_is_the_old_model():
    torch.manual_seed(3)
    a = TinyTransformer(11, 16, 16, 2, 2)
    torch.manual_seed(3)
    b = TinyTransformer(11, 16, 16, 2, 2, kv_sharing=1)
    idx = torch.randint(0, 11, (1, 7))
    torch.testing.assert_close(a(idx), b(idx), rtol=0, atol=0)
    assert not any(isinstance(block.attn, SharedKVAttention) for block in b.blocks)


def test_kv_sharing_bad_arguments():
    with pytest.raises(ValueError, match="kv_sharing must be a positive int"):
        TinyTransformer(11, 16, 16, 2, 2, kv_sharing=0)
    with pytest.raises(ValueError, match="needs dropout=0"):
        TinyTransformer(11, 16, 16, 2, 2, kv_sharing=2, dropout=0.1)
    model = TinyTransformer(11, 16, 16, 2, 2, kv_sharing=2)
    with pytest.raises(ValueError, match="does not return attention weights"):
        model(torch.zeros(1, 3, dtype=torch.long), return_weights=True)


def test_cache_bytes_at_llama_3_8b_shape():
    from attnlib.variants import (
        cache_bytes,
        latent_cache_numbers,
        linear_state_numbers,
        softmax_cache_numbers,
    )

    # Llama-3-8B: 32 layers, 8 KV heads of 128: 128 KiB per token in bf16.
    llama = [softmax_cache_numbers(8, 128)] * 32
    assert cache_bytes(llama, 1) == 131072
    assert cache_bytes(llama, 1000) == 1000 * 131072
    # MLA at DeepSeek-V3's shape: 512 + 64 numbers per layer and token.
    assert latent_cache_numbers(512, 64) == (576, 0)
    # A linear layer's state does not grow with the tokens.
    state = [linear_state_numbers(32, 128, 128, 8192, 4)]
    assert cache_bytes(state, 10) == cache_bytes(state, 100_000) == 2 * (32 * 128 * 128
                                                                        + 8192 * 3)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
        cache_bytes(llama, -1)


# ---------------------------------------------------------------------------
# attention= variants (chapter 13's comparison), passed as factories
# ---------------------------------------------------------------------------

VARIANTS = (LinearAttention, gated_deltanet_layer, latent_attention_layer, TopKAttention)


@pytest.mark.parametrize("attention", VARIANTS)
def test_variant_shapes_and_modules(attention):
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 16, 2, 2, attention=attention)
    logits = model(tokens(3, 10))
    assert logits.shape == (3, 10, 11)
    assert torch.isfinite(logits).all()
    kinds = {type(b.attn) for b in model.blocks}
    assert len(kinds) == 1 and not issubclass(kinds.pop(), attnlib.MultiHeadAttention)
    assert f"attention='{attention.__name__}'" in repr(model)


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("t", [0, 5, 9])
def test_variant_is_causal(attention, t):
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 16, 2, 2, attention=attention).double().eval()
    idx = tokens(2, 12)
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % 11
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-12)
    assert (a[:, t] - b[:, t]).abs().max() > 1e-6  # the changed token itself matters


@pytest.mark.parametrize("attention", VARIANTS)
def test_variant_trains(attention):
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 16, 2, 2, attention=attention)
    idx = tokens(8, 12)
    targets = torch.roll(idx, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("attention", VARIANTS)
def test_variant_decodes_with_its_own_cache(attention):
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 16, 2, 2, attention=attention).double().eval()
    idx = tokens(2, 10)
    full = model(idx)
    caches = model.new_caches()
    assert all(isinstance(c, Cache) for c in caches) and caches[0] is not caches[1]
    parts = [model(idx[:, :4], kv_caches=caches)]
    parts += [model(idx[:, t : t + 1], kv_caches=caches) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)
    assert [len(c) for c in caches] == [10, 10]
    prompt = idx[:, :4]
    out = model.generate(prompt, 5)
    assert out.shape == (2, 9)
    assert torch.equal(out, model.generate(prompt, 5, use_cache=False))
    with pytest.raises(ValueError, match="return_weights"):
        model(prompt, return_weights=True)


def test_sparse_variant_keeps_top_k_keys_only():
    torch.manual_seed(0)
    layer = TopKAttention(16, 16, 2, top_k=16).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    # With top_k >= num_tokens every visible key is kept: plain causal attention.
    q = layer.W_query(x).view(2, 10, 2, 8).transpose(1, 2)
    k = layer.W_key(x).view(2, 10, 2, 8).transpose(1, 2)
    v = layer.W_value(x).view(2, 10, 2, 8).transpose(1, 2)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = layer.out_proj(full.transpose(1, 2).reshape(2, 10, 16))
    torch.testing.assert_close(layer(x), expected)
    layer.top_k = 2
    assert (layer(x) - expected)[:, 2:].abs().max() > 1e-6  # later queries lose keys
    torch.testing.assert_close(layer(x)[:, :2], expected[:, :2])  # the first two see <= 2


def test_variant_arguments():
    for bad in ("linear", 1, LinearAttention(16, 16, 2)):
        with pytest.raises(TypeError, match="attention must be a factory"):
            TinyTransformer(11, 16, 16, 2, 2, attention=bad)
    for kwargs in ({"kv_sharing": 2}, {"dropout": 0.1}, {"positional": "rope"}):
        with pytest.raises(ValueError, match="attention='LinearAttention' needs"):
            TinyTransformer(11, 16, 16, 2, 2, attention=LinearAttention, **kwargs)
    with pytest.raises(ValueError, match="not divisible"):
        LinearAttention(15, 16, 2)
    with pytest.raises(ValueError, match="dropout and rope configure the default"):
        TransformerBlock(16, 16, 2, rope=True, attention=LinearAttention)
    with pytest.raises(TypeError, match="attention must be an nn.Module, a factory"):
        TransformerBlock(16, 16, 2, attention="linear")


def test_block_takes_a_module_as_it_is():
    layer = TopKAttention(16, 16, 2, top_k=3)
    block = TransformerBlock(16, 16, 2, attention=layer)
    assert block.attn is layer
    assert isinstance(block.new_cache(), attnlib.KVCache)


def test_softmax_attention_is_the_default_model():
    torch.manual_seed(0)
    a = TinyTransformer(11, 16, 16, 2, 2)
    torch.manual_seed(0)
    b = TinyTransformer(11, 16, 16, 2, 2, attention=None)
    idx = tokens(2, 8)
    torch.testing.assert_close(a(idx), b(idx), rtol=0, atol=0)
    assert "attention" not in repr(a)
