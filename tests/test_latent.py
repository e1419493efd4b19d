"""attnlib.latent: multi-head latent attention, naive and absorbed, cached, and
against Hugging Face's DeepSeek-V3 attention."""

from __future__ import annotations

import math

import pytest
import torch
import transformers  # a pinned test dependency: no importorskip

from attnlib.latent import LatentCache, MultiHeadLatentAttention

SHAPE = dict(kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)


def _mla(q_lora_rank: int | None = 16, dtype: torch.dtype = torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    mla = MultiHeadLatentAttention(32, 24, 4, q_lora_rank=q_lora_rank, **SHAPE).to(dtype)
    with torch.no_grad():
        for p in mla.parameters():  # norms away from 1 as well, so they matter
            p.normal_(0.0, 0.3)
    return mla.eval()


@pytest.mark.parametrize("q_lora_rank", [None, 16])
def test_absorbed_form_equals_naive_form(q_lora_rank):
    mla = _mla(q_lora_rank)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    naive = mla(x)
    absorbed = mla(x, absorb=True)
    assert naive.shape == (2, 9, 32)
    torch.testing.assert_close(absorbed, naive, rtol=0, atol=1e-12)


def test_causal_later_tokens_do_not_change_earlier_outputs():
    mla = _mla()
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    full = mla(x)
    torch.testing.assert_close(mla(x[:, :6]), full[:, :6], rtol=0, atol=1e-12)
    x2 = x.clone()
    x2[:, 7] += 1.0
    assert (mla(x2)[:, 7] - full[:, 7]).abs().max() > 1e-3  # a change does show


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_full_forward(absorb):
    mla = _mla()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    full = mla(x)
    cache = LatentCache()
    parts = [mla(x[:, :5], kv_cache=cache, absorb=absorb)]
    for t in range(5, 11):
        parts.append(mla(x[:, t : t + 1], kv_cache=cache, absorb=absorb))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-12)
    assert cache.num_tokens == 11
    assert cache.latents.shape == (2, 11, 12) and cache.rope_keys.shape == (2, 11, 4)
    assert cache.memory_bytes() == 2 * 11 * (12 + 4) * 8
    assert mla.cache_numbers_per_token == 16


def test_rope_makes_scores_depend_on_relative_position_only():
    # Shifting every position by the same offset (a cache of a dummy prefix whose
    # keys cannot be seen) leaves attention among the later tokens unchanged only
    # up to the rotation: here we check the RoPE part is actually used, by
    # comparing against a model whose rope dimension sees position 0 everywhere.
    mla = _mla()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    out = mla(x)
    with torch.no_grad():
        mla.rope.cos.fill_(1.0)
        mla.rope.sin.fill_(0.0)
    assert (mla(x) - out).abs().max() > 1e-4


def test_bad_arguments():
    with pytest.raises(ValueError, match="qk_rope_head_dim=3 must be even"):
        MultiHeadLatentAttention(32, 8, 4, kv_lora_rank=4, qk_nope_head_dim=4,
                                 qk_rope_head_dim=3, v_head_dim=4)
    with pytest.raises(TypeError, match="kv_lora_rank must be an int"):
        MultiHeadLatentAttention(32, 8, 4, kv_lora_rank=4.0, qk_nope_head_dim=4,
                                 qk_rope_head_dim=2, v_head_dim=4)
    mla = _mla()
    with pytest.raises(ValueError, match="exceed context_length=24"):
        cache = LatentCache()
        mla(torch.randn(1, 20, 32, dtype=torch.float64), kv_cache=cache)
        mla(torch.randn(1, 5, 32, dtype=torch.float64), kv_cache=cache)
    with pytest.raises(TypeError, match="LatentCache or None"):
        mla(torch.randn(1, 2, 32, dtype=torch.float64), kv_cache=object())
    with pytest.raises(TypeError, match="absorb must be a bool"):
        mla(torch.randn(1, 2, 32, dtype=torch.float64), absorb=1)
    with pytest.raises(TypeError, match="dtype"):
        mla(torch.randn(1, 2, 32, dtype=torch.float32))


# ---------------------------------------------------------------------------
# Against transformers' DeepSeek-V3 attention (built from a config; no download)
# ---------------------------------------------------------------------------


def _hf_mla(dtype: torch.dtype, **extra):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    options = dict(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
        num_hidden_layers=1, vocab_size=50, intermediate_size=16, moe_intermediate_size=8,
        n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1,
        first_k_dense_replace=1, max_position_embeddings=64, rope_interleave=True,
        attn_implementation="eager", **SHAPE,
    )
    config = transformers.DeepseekV3Config(**{**options, **extra})
    torch.manual_seed(1)
    hf = ds.DeepseekV3Attention(config, layer_idx=0)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    hf = hf.to(dtype).eval()
    rotary = ds.DeepseekV3RotaryEmbedding(config).to(dtype)
    return transformers, config, hf, rotary


def _copy_from_hf(hf, rope_scaling=None) -> MultiHeadLatentAttention:
    """attnlib's MLA with the weights of Hugging Face's (interleaved RoPE rows permuted)."""
    mla = MultiHeadLatentAttention(32, 64, 4, q_lora_rank=16, rope_scaling=rope_scaling,
                                   **SHAPE).to(hf.o_proj.weight.dtype)
    nope, rope, heads = SHAPE["qk_nope_head_dim"], SHAPE["qk_rope_head_dim"], 4
    # interleaved pairs (0, 1), (2, 3), ... -> half-split pairs (i, i + rope / 2)
    perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    q_rows = torch.arange(heads * (nope + rope)).view(heads, nope + rope)
    q_rows[:, nope:] = q_rows[:, nope:][:, perm]
    kv_rows = torch.arange(SHAPE["kv_lora_rank"] + rope)
    kv_rows[SHAPE["kv_lora_rank"]:] = kv_rows[SHAPE["kv_lora_rank"]:][perm]
    with torch.no_grad():
        mla.W_query_down.weight.copy_(hf.q_a_proj.weight)
        mla.query_norm.weight.copy_(hf.q_a_layernorm.weight)
        mla.W_query_up.weight.copy_(hf.q_b_proj.weight[q_rows.flatten()])
        mla.W_kv_down.weight.copy_(hf.kv_a_proj_with_mqa.weight[kv_rows])
        mla.kv_norm.weight.copy_(hf.kv_a_layernorm.weight)
        mla.W_kv_up.weight.copy_(hf.kv_b_proj.weight)
        mla.out_proj.weight.copy_(hf.o_proj.weight)
    return mla.eval()


def _causal_bias(num_tokens: int, num_tokens_kv: int, dtype: torch.dtype) -> torch.Tensor:
    allowed = torch.ones(num_tokens, num_tokens_kv, dtype=torch.bool).tril(
        num_tokens_kv - num_tokens
    )
    bias = torch.zeros(num_tokens, num_tokens_kv, dtype=dtype)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


# DeepseekV3RMSNorm rounds its input to float32 even in float64, so the float64
# comparison is held to float32 rounding of the latents, not to float64's.
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5), (torch.float64, 2e-6)])
@pytest.mark.parametrize("absorb", [False, True])
def test_equals_transformers_deepseek_v3(dtype, atol, absorb):
    transformers, config, hf, rotary = _hf_mla(dtype)
    mla = _copy_from_hf(hf)
    torch.manual_seed(2)
    x = torch.randn(2, 10, 32, dtype=dtype)
    positions = torch.arange(10)[None]
    with torch.no_grad():
        expected, _ = hf(x, rotary(x, positions), _causal_bias(10, 10, dtype))
        got = mla(x, absorb=absorb)
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)

    # Cached decoding: a prompt of 6 tokens, then one token at a time, both sides.
    hf_cache = transformers.DynamicCache(config=config)
    cache = LatentCache()
    hf_parts, parts = [], []
    with torch.no_grad():
        for start, stop in [(0, 6), (6, 7), (7, 8), (8, 9), (9, 10)]:
            chunk = x[:, start:stop]
            out, _ = hf(chunk, rotary(chunk, torch.arange(start, stop)[None]),
                        _causal_bias(stop - start, stop, dtype), cache=hf_cache)
            hf_parts.append(out)
            parts.append(mla(chunk, kv_cache=cache, absorb=absorb))
    torch.testing.assert_close(torch.cat(hf_parts, 1), expected, rtol=0, atol=atol)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=0, atol=atol)


# DeepSeek-V3's released rope_scaling, with the lengths shrunk to this test's: its
# factor 40 and mscale = mscale_all_dim = 1 (so cos and sin keep their size and the
# whole score is multiplied by mscale(40)^2 = 1.874); a second case with
# mscale_all_dim != mscale, where cos and sin are scaled as well.
YARN_V3 = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
           "original_max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 1.0,
           "beta_fast": 32.0, "beta_slow": 1.0}
YARN_UNEQUAL = {**YARN_V3, "factor": 4.0, "mscale_all_dim": 0.707}  # 8 -> 32 positions


@pytest.mark.parametrize("rope_scaling", [YARN_V3, YARN_UNEQUAL], ids=["v3", "unequal"])
@pytest.mark.parametrize("absorb", [False, True])
def test_yarn_equals_transformers_deepseek_v3(rope_scaling, absorb):
    dtype = torch.float32
    stretched = int(rope_scaling["factor"] * rope_scaling["original_max_position_embeddings"])
    transformers, config, hf, rotary = _hf_mla(dtype, rope_parameters=dict(rope_scaling),
                                               max_position_embeddings=stretched)
    mla = _copy_from_hf(hf, rope_scaling)
    mscale = 0.1 * rope_scaling["mscale_all_dim"] * math.log(rope_scaling["factor"]) + 1
    assert mla.scale == pytest.approx(hf.scaling, rel=1e-12)
    assert mla.scale == pytest.approx(mscale**2 / 12**0.5, rel=1e-12)
    attention_factor = (0.1 * math.log(rope_scaling["factor"]) + 1) / mscale
    assert mla.rope.attention_scaling == pytest.approx(attention_factor, rel=1e-12)
    torch.testing.assert_close(mla.rope.inv_freq.float(), rotary.inv_freq, rtol=1e-6, atol=0)
    torch.manual_seed(3)
    num_tokens = 20  # past the original 8 positions, within the stretched 320 or 32
    x = torch.randn(2, num_tokens, 32, dtype=dtype)
    with torch.no_grad():
        expected, _ = hf(x, rotary(x, torch.arange(num_tokens)[None]),
                         _causal_bias(num_tokens, num_tokens, dtype))
        got = mla(x, absorb=absorb)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    # the YaRN scale matters: without mscale^2 the output moves far more than that
    plain = _copy_from_hf(hf)
    with torch.no_grad():
        assert (plain(x, absorb=absorb) - expected).abs().max() > 1e-2

    # A prompt of 12 tokens, then 8 cached decoding steps, both sides.
    hf_cache = transformers.DynamicCache(config=config)
    cache = LatentCache()
    hf_parts, parts = [], []
    with torch.no_grad():
        for start, stop in [(0, 12)] + [(t, t + 1) for t in range(12, 20)]:
            chunk = x[:, start:stop]
            out, _ = hf(chunk, rotary(chunk, torch.arange(start, stop)[None]),
                        _causal_bias(stop - start, stop, dtype), cache=hf_cache)
            hf_parts.append(out)
            parts.append(mla(chunk, kv_cache=cache, absorb=absorb))
    torch.testing.assert_close(torch.cat(hf_parts, 1), expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=0, atol=2e-5)
    assert cache.num_tokens == 20


def test_yarn_mscale():
    from attnlib.positional import yarn_mscale

    assert yarn_mscale(40.0) == pytest.approx(0.1 * math.log(40.0) + 1, rel=1e-15)
    assert yarn_mscale(40.0) ** 2 == pytest.approx(1.874, abs=5e-4)  # DeepSeek-V3
    assert yarn_mscale(4.0, 0.707) == pytest.approx(0.0707 * math.log(4.0) + 1)
    assert yarn_mscale(1.0) == 1.0 and yarn_mscale(0.5, 3.0) == 1.0
    with pytest.raises(TypeError, match="factor must be a real number"):
        yarn_mscale(True)
    with pytest.raises(ValueError, match="mscale must be finite and positive"):
        yarn_mscale(4.0, -1.0)
    with pytest.raises(ValueError, match="rope_type='nope' is not one of"):
        MultiHeadLatentAttention(32, 8, 4, kv_lora_rank=4, qk_nope_head_dim=4,
                                 qk_rope_head_dim=2, v_head_dim=4,
                                 rope_scaling={"rope_type": "nope"})
