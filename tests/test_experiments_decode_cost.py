"""Chapter 13's count of decoding cost per cached token (attnlib.experiments)."""

import pytest

from attnlib.experiments import (
    DEEPSEEK_V3_ATTENTION,
    H100_SXM,
    attainable_flops,
    decode_cost,
)


def test_deepseek_v3_counts():
    """MHA with DeepSeek-V3's heads: 2 (192 + 128) = 640 FLOPs per head per cached token;
    absorbed MLA: 2 (512 + 64) + 2 * 512 = 2176; naive MLA adds the up-projection of the
    latent to a key part and a value per head, 2 * 512 * (128 + 128)."""
    mha = decode_cost("mha", **DEEPSEEK_V3_ATTENTION)
    gqa = decode_cost("gqa", num_kv_groups=8, **DEEPSEEK_V3_ATTENTION)
    naive = decode_cost("mla_naive", **DEEPSEEK_V3_ATTENTION)
    absorbed = decode_cost("mla_absorbed", **DEEPSEEK_V3_ATTENTION)
    assert [c.flops_per_head for c in (mha, gqa, naive, absorbed)] == [
        640, 640, 262144 + 640, 2176]
    assert absorbed.flops == 128 * 2176
    # bytes: 128 keys of 192 and values of 128; 8 of each; the latent and the RoPE key
    assert [c.cache_bytes for c in (mha, gqa, naive, absorbed)] == [
        2 * 128 * 320, 2 * 8 * 320, 2 * 576, 2 * 576]
    assert mha.intensity == 1.0 and gqa.intensity == 16.0
    assert absorbed.intensity == pytest.approx(278528 / 1152)


def test_mha_without_mla_split_and_fp8():
    """A plain model: queries and keys of 128, no RoPE part; one byte a number doubles
    the intensity."""
    cost = decode_cost("mha", num_heads=32, qk_nope_head_dim=128, v_head_dim=128,
                       bytes_per_number=1)
    assert (cost.flops_per_head, cost.cache_bytes, cost.intensity) == (512, 8192, 2.0)
    # MQA: one key/value head for all 32 query heads
    mqa = decode_cost("gqa", num_heads=32, qk_nope_head_dim=128, v_head_dim=128,
                      num_kv_groups=1)
    assert mqa.intensity == 32 * 512 / 512


def test_roofline():
    ridge = H100_SXM["peak_flops"] / H100_SXM["hbm_bytes_per_second"]
    assert round(ridge) == 295
    assert attainable_flops(1.0) == 3.35e12
    assert attainable_flops(1000.0) == 989.5e12
    assert attainable_flops(2.0, peak_flops=10.0, bytes_per_second=1.0) == 2.0


def test_bad_input():
    with pytest.raises(ValueError, match="kind="):
        decode_cost("mqa", num_heads=2, qk_nope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="num_kv_groups"):
        decode_cost("gqa", num_heads=2, qk_nope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="num_kv_groups=3"):
        decode_cost("gqa", num_heads=4, qk_nope_head_dim=4, v_head_dim=4, num_kv_groups=3)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        decode_cost("mla_absorbed", num_heads=2, qk_nope_head_dim=4, v_head_dim=4)
    with pytest.raises(TypeError, match="num_heads"):
        decode_cost("mha", num_heads=2.0, qk_nope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        decode_cost("mha", num_heads=2, qk_nope_head_dim=4, v_head_dim=4,
                    qk_rope_head_dim=-1)
    with pytest.raises(ValueError, match="intensity"):
        attainable_flops(0.0)
    with pytest.raises(TypeError, match="intensity"):
        attainable_flops("1")
