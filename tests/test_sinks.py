"""attnlib.sinks: the sink softmax, sink attention and QK-norm, and both against
Hugging Face's gpt-oss and Qwen3 attention layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import transformers  # a pinned test dependency: no importorskip

from attnlib.positional import RotaryPositionalEmbedding
from attnlib.sinks import AttentionSinks, QKNorm, sink_attention, softmax_with_sinks


def test_softmax_with_sinks_is_softmax_over_one_more_logit():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    sinks = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    weights = softmax_with_sinks(scores, sinks)
    padded = torch.cat([scores, sinks[None, :, None, None].expand(2, 3, 4, 1)], dim=-1)
    torch.testing.assert_close(weights, padded.softmax(-1)[..., :-1], rtol=0, atol=1e-15)
    assert (weights.sum(-1) < 1).all()
    # A very negative sink gives back the ordinary softmax; a huge score does not overflow.
    torch.testing.assert_close(softmax_with_sinks(scores, torch.full((3,), -1e4,
                               dtype=torch.float64)), scores.softmax(-1))
    big = softmax_with_sinks(scores + 1e4, sinks)
    assert torch.isfinite(big).all()


def test_sink_attention_masks_and_shares_kv_heads():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    sinks = torch.randn(4, dtype=torch.float64)
    out = sink_attention(q, k, v, sinks, is_causal=True)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = (q @ k.repeat_interleave(2, 1).transpose(-2, -1)) / 8**0.5
    weights = softmax_with_sinks(scores.masked_fill(~allowed, float("-inf")), sinks)
    torch.testing.assert_close(out, weights @ v.repeat_interleave(2, 1))
    torch.testing.assert_close(sink_attention(q, k, v, sinks, attn_mask=allowed), out)
    # The first token, seeing only itself, reads less than its value when the sink is large.
    module = AttentionSinks(4, init=5.0).double()
    first = module(q, k, v, is_causal=True)[:, :, 0]
    assert (first.norm(dim=-1) < v.repeat_interleave(2, 1)[:, :, 0].norm(dim=-1)).all()


def test_qk_norm_gives_unit_rms_heads():
    torch.manual_seed(2)
    norm = QKNorm(8).double()
    q, k = norm(3 * torch.randn(2, 4, 5, 8, dtype=torch.float64),
                torch.randn(2, 2, 5, 8, dtype=torch.float64))
    torch.testing.assert_close(q.pow(2).mean(-1), torch.ones(2, 4, 5, dtype=torch.float64),
                               rtol=0, atol=1e-5)
    assert k.shape == (2, 2, 5, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="sinks"):
        softmax_with_sinks(torch.zeros(1, 3, 2, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="not divisible by num_kv_groups=3"):
        sink_attention(torch.zeros(1, 4, 2, 8), torch.zeros(1, 3, 2, 8), torch.zeros(1, 3, 2, 8),
                       torch.zeros(4))
    with pytest.raises(ValueError, match="does not match head_dim=8"):
        QKNorm(8)(torch.zeros(1, 1, 2, 6), torch.zeros(1, 1, 2, 8))
    with pytest.raises(TypeError, match="num_heads must be an int"):
        AttentionSinks(2.0)


# ---------------------------------------------------------------------------
# Against transformers (tiny layers built from configs; no download)
# ---------------------------------------------------------------------------


class _Attention(nn.Module):
    """attnlib's parts assembled as a Llama-style layer: projections, optional
    QK-norm, RoPE, optional sinks; one extra line for each option."""

    def __init__(self, d_in, num_heads, num_kv_groups, head_dim, *, qk_norm, sinks, bias):
        super().__init__()
        self.h, self.g, self.d = num_heads, num_kv_groups, head_dim
        self.W_query = nn.Linear(d_in, num_heads * head_dim, bias=bias)
        self.W_key = nn.Linear(d_in, num_kv_groups * head_dim, bias=bias)
        self.W_value = nn.Linear(d_in, num_kv_groups * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, d_in, bias=bias)
        self.rope = RotaryPositionalEmbedding(head_dim, 64)
        self.qk_norm = QKNorm(head_dim) if qk_norm else None
        self.sinks = AttentionSinks(num_heads) if sinks else None

    def forward(self, x, cache):
        b, n, _ = x.shape
        q = self.W_query(x).view(b, n, self.h, self.d).transpose(1, 2)
        k = self.W_key(x).view(b, n, self.g, self.d).transpose(1, 2)
        v = self.W_value(x).view(b, n, self.g, self.d).transpose(1, 2)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)  # the one line QK-norm needs
        cached = 0 if cache.get("k") is None else cache["k"].shape[2]
        q, k = self.rope(q, offset=cached), self.rope(k, offset=cached)
        if cached:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        cache["k"], cache["v"] = k, v
        allowed = torch.ones(n, cached + n, dtype=torch.bool).tril(cached)
        if self.sinks is not None:
            ctx = self.sinks(q, k, v, attn_mask=allowed)  # the one line sinks need
        else:
            ctx = sink_attention(q, k, v, torch.full((self.h,), float("-inf"),
                                 dtype=x.dtype), attn_mask=allowed)
        return self.out_proj(ctx.transpose(1, 2).reshape(b, n, self.h * self.d))


def _causal_bias(n, n_kv, dtype):
    allowed = torch.ones(n, n_kv, dtype=torch.bool).tril(n_kv - n)
    return torch.zeros(n, n_kv, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[
        None, None
    ]


def _compare(transformers, config, hf, rotary, ours, dtype, atol):
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    hf = hf.to(dtype).eval()
    rotary = rotary.to(dtype)
    ours = ours.to(dtype)
    with torch.no_grad():
        ours.W_query.load_state_dict(hf.q_proj.state_dict())
        ours.W_key.load_state_dict(hf.k_proj.state_dict())
        ours.W_value.load_state_dict(hf.v_proj.state_dict())
        ours.out_proj.load_state_dict(hf.o_proj.state_dict())
        if ours.qk_norm is not None:
            ours.qk_norm.q_norm.weight.copy_(hf.q_norm.weight)
            ours.qk_norm.k_norm.weight.copy_(hf.k_norm.weight)
        if ours.sinks is not None:
            ours.sinks.sinks.copy_(hf.sinks)
    torch.manual_seed(3)
    x = torch.randn(2, 9, config.hidden_size, dtype=dtype)
    with torch.no_grad():
        expected, _ = hf(x, rotary(x, torch.arange(9)[None]), _causal_bias(9, 9, dtype))
        got = ours(x, {})
        torch.testing.assert_close(got, expected, rtol=0, atol=atol)
        hf_cache, cache, hf_parts, parts = transformers.DynamicCache(config=config), {}, [], []
        for start, stop in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]:
            chunk = x[:, start:stop]
            out, _ = hf(chunk, rotary(chunk, torch.arange(start, stop)[None]),
                        _causal_bias(stop - start, stop, dtype), cache=hf_cache)
            hf_parts.append(out)
            parts.append(ours(chunk, cache))
    torch.testing.assert_close(torch.cat(hf_parts, 1), expected, rtol=0, atol=atol)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=0, atol=atol)
    return (got - expected).abs().max().item()


# Hugging Face computes the RoPE tables in float32 whatever the dtype, so float64
# agrees to float32 rounding of the angles.
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 2e-6)])
def test_sinks_equal_transformers_gpt_oss(dtype, atol):
    from transformers.models.gpt_oss import modeling_gpt_oss as go

    config = transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=1, layer_types=["full_attention"], vocab_size=50,
        intermediate_size=16, num_local_experts=2, num_experts_per_tok=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager", attention_bias=True,
    )
    torch.manual_seed(4)
    hf = go.GptOssAttention(config, layer_idx=0)
    ours = _Attention(32, 4, 2, 8, qk_norm=False, sinks=True, bias=True)
    _compare(transformers, config, hf, go.GptOssRotaryEmbedding(config), ours, dtype, atol)


# Qwen3's RMSNorm rounds to float32 even in float64: float32-level tolerance there.
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 2e-6)])
def test_qk_norm_equals_transformers_qwen3(dtype, atol):
    from transformers.models.qwen3 import modeling_qwen3 as q3

    config = transformers.Qwen3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=1, vocab_size=50, intermediate_size=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager",
    )
    torch.manual_seed(5)
    hf = q3.Qwen3Attention(config, layer_idx=0)
    ours = _Attention(32, 4, 2, 8, qk_norm=True, sinks=False, bias=False)
    _compare(transformers, config, hf, q3.Qwen3RotaryEmbedding(config), ours, dtype, atol)
