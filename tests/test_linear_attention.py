"""attnlib.linear_attention: the three forms agree, the delta rule does what it
says, and Gated DeltaNet matches Hugging Face's Qwen3-Next layer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers  # a pinned test dependency: no importorskip

import attnlib.kv_cache
from attnlib.linear_attention import (
    GatedDeltaNet,
    RecurrentState,
    delta_rule_step,
    gated_delta_rule,
    linear_attention,
)


def _inputs(b=2, h=3, n=13, d=5, dv=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(b, h, n, d, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(b, h, n, dv, generator=g, dtype=dtype)
    beta = torch.rand(b, h, n, generator=g, dtype=dtype)
    log_decay = -torch.rand(b, h, n, generator=g, dtype=dtype)
    return q, k, v, beta, log_decay


def test_linear_attention_parallel_equals_recurrent_and_is_causal():
    q, k, v, _, _ = _inputs()
    parallel = linear_attention(q, k, v)
    recurrent = linear_attention(q, k, v, form="recurrent")
    torch.testing.assert_close(recurrent, parallel, rtol=0, atol=1e-12)
    torch.testing.assert_close(linear_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6]),
                               parallel[:, :, :6], rtol=0, atol=1e-12)
    # The first output is the first value (the weights of one token sum to 1).
    torch.testing.assert_close(parallel[:, :, 0], v[:, :, 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 64])
def test_gated_delta_rule_three_forms_agree(gated, chunk_size):
    q, k, v, beta, log_decay = _inputs()
    g = log_decay if gated else None
    recurrent, s_rec = gated_delta_rule(q, k, v, beta, g, form="recurrent")
    parallel, s_par = gated_delta_rule(q, k, v, beta, g, form="parallel")
    chunked, s_chk = gated_delta_rule(q, k, v, beta, g, form="chunked", chunk_size=chunk_size)
    assert recurrent.shape == (2, 3, 13, 7) and s_rec.shape == (2, 3, 5, 7)
    for out, state in ((parallel, s_par), (chunked, s_chk)):
        torch.testing.assert_close(out, recurrent, rtol=0, atol=1e-10)
        torch.testing.assert_close(state, s_rec, rtol=0, atol=1e-10)


def test_initial_state_continues_a_sequence():
    q, k, v, beta, g = _inputs(n=12)
    full, s_full = gated_delta_rule(q, k, v, beta, g, form="parallel")
    first, s1 = gated_delta_rule(q[:, :, :7], k[:, :, :7], v[:, :, :7], beta[:, :, :7],
                                 g[:, :, :7], form="chunked", chunk_size=3)
    second, s2 = gated_delta_rule(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], beta[:, :, 7:],
                                  g[:, :, 7:], form="parallel", initial_state=s1)
    torch.testing.assert_close(torch.cat([first, second], 2), full, rtol=0, atol=1e-10)
    torch.testing.assert_close(s2, s_full, rtol=0, atol=1e-10)


def test_delta_rule_with_beta_one_stores_the_value_exactly():
    # After writing (k, v) with beta = 1 and a unit key, reading with k returns v,
    # whatever the state held before: the delta rule overwrites, linear attention adds.
    g = torch.Generator().manual_seed(3)
    state = torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64)
    key = F.normalize(torch.randn(1, 2, 4, generator=g, dtype=torch.float64), dim=-1)
    value = torch.randn(1, 2, 3, generator=g, dtype=torch.float64)
    out, new_state = delta_rule_step(state, key, key, value, torch.ones(1, 2,
                                     dtype=torch.float64), scale=1.0)
    torch.testing.assert_close(out, value, rtol=0, atol=1e-12)
    assert not torch.equal(new_state, state)  # the argument is not modified in place...
    assert state.abs().sum() > 0
    # ...and a plain additive write (linear attention) would not recall v.
    additive = state + key[..., :, None] * value[..., None, :]
    assert ((additive * key[..., :, None]).sum(-2) - value).abs().max() > 1e-3


def test_gate_decays_the_state():
    g = torch.Generator().manual_seed(4)
    state = torch.randn(1, 1, 4, 3, generator=g, dtype=torch.float64)
    zeros = torch.zeros(1, 1, 4, dtype=torch.float64)
    _, decayed = delta_rule_step(state, zeros, zeros, torch.zeros(1, 1, 3, dtype=torch.float64),
                                 torch.ones(1, 1, dtype=torch.float64),
                                 torch.full((1, 1), -0.5, dtype=torch.float64))
    torch.testing.assert_close(decayed, state * torch.exp(torch.tensor(-0.5, dtype=torch.float64)), rtol=0,
                               atol=1e-12)


def test_bad_arguments():
    q, k, v, beta, g = _inputs()
    with pytest.raises(ValueError, match="form must be one of"):
        gated_delta_rule(q, k, v, beta, g, form="fast")
    with pytest.raises(ValueError, match="beta must have shape"):
        gated_delta_rule(q, k, v, beta[:, :, :3], g)
    with pytest.raises(ValueError, match="queries and keys must have the same shape"):
        linear_attention(q, k[:, :, :4], v)
    with pytest.raises(ValueError, match="form must be one of"):
        linear_attention(q, k, v, form="chunked")
    with pytest.raises(ValueError, match="key must have shape"):
        delta_rule_step(torch.zeros(1, 1, 4, 3), torch.zeros(1, 1, 4), torch.zeros(1, 1, 5),
                        torch.zeros(1, 1, 3), torch.ones(1, 1))
    with pytest.raises(TypeError, match="kv_cache must be an attnlib.RecurrentState"):
        GatedDeltaNet(8, 2, 4)(torch.randn(1, 3, 8), kv_cache={})


def test_gated_deltanet_state_is_constant_and_decoding_equals_full_forward():
    torch.manual_seed(0)
    layer = GatedDeltaNet(16, 2, 4, head_dim_v=6, chunk_size=4).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    full = layer(x)
    state = layer.new_cache()
    parts = [layer(x[:, :5], kv_cache=state)]
    size_after_prompt = state.memory_bytes()
    for t in range(5, 11):
        parts.append(layer(x[:, t : t + 1], kv_cache=state))
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)
    assert state.memory_bytes() == size_after_prompt == 2 * layer.state_numbers * 8
    assert state.num_tokens == len(state) == 11
    assert isinstance(state, RecurrentState) and isinstance(state, attnlib.kv_cache.Cache)
    state.reset()
    assert (state.num_tokens, state.memory_bytes(), repr(state)) == (0, 0, "RecurrentState(empty)")
    with pytest.raises(ValueError, match="conv_size=3, the layer 4"):
        layer(x, kv_cache=RecurrentState(3))
    with pytest.raises(ValueError, match="return_weights=False"):
        layer(x, True)


# ---------------------------------------------------------------------------
# Against transformers' Qwen3-Next (torch fallback of the fla kernels)
# ---------------------------------------------------------------------------


def _hf_layer(dtype, num_key_heads=2, num_value_heads=2):
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    config = transformers.Qwen3NextConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        linear_num_key_heads=num_key_heads, linear_num_value_heads=num_value_heads,
        linear_key_head_dim=4, linear_value_head_dim=6, linear_conv_kernel_dim=4,
        num_hidden_layers=1, layer_types=["linear_attention"], vocab_size=50,
        intermediate_size=16, moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1,
    )
    torch.manual_seed(5)
    hf = qn.Qwen3NextGatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.4)
    return config, hf.to(dtype).eval()


def _copy_from_hf(hf) -> GatedDeltaNet:
    """Hugging Face's fused projections, grouped per key head, split into ours."""
    hk, h, d, dv = hf.num_k_heads, hf.num_v_heads, hf.head_k_dim, hf.head_v_dim
    r = h // hk  # value heads per key head
    layer = GatedDeltaNet(16, h, d, num_key_heads=hk, head_dim_v=dv, chunk_size=4)
    layer = layer.to(hf.out_proj.weight.dtype)
    qkvz = hf.in_proj_qkvz.weight.view(hk, 2 * d + 2 * r * dv, 16)  # per key head: q k v z
    q, k, v, z = qkvz.split([d, d, r * dv, r * dv], dim=1)
    ba = hf.in_proj_ba.weight.view(hk, 2 * r, 16)  # per key head: its value heads' b, a
    b, a = ba.split([r, r], dim=1)
    with torch.no_grad():
        layer.W_query.weight.copy_(q.reshape(hk * d, 16))
        layer.W_key.weight.copy_(k.reshape(hk * d, 16))
        layer.W_value.weight.copy_(v.reshape(h * dv, 16))
        layer.W_gate.weight.copy_(z.reshape(h * dv, 16))
        layer.W_beta.weight.copy_(b.reshape(h, 16))
        layer.W_alpha.weight.copy_(a.reshape(h, 16))
        layer.conv.weight.copy_(hf.conv1d.weight)
        layer.A_log.copy_(hf.A_log)
        layer.dt_bias.copy_(hf.dt_bias)
        layer.norm.weight.copy_(hf.norm.weight)
        layer.out_proj.weight.copy_(hf.out_proj.weight)
    return layer.eval()


# Qwen3-Next's torch path computes the delta rule in float32 whatever the input
# dtype, so both comparisons are held to float32 rounding. (2, 4): 2 key heads, each
# serving 2 of 4 value heads, as Qwen3-Next's 16 serve 32.
@pytest.mark.parametrize("dtype,heads,atol", [
    (torch.float32, (2, 2), 2e-5), (torch.float64, (2, 2), 2e-5),
    (torch.float32, (2, 4), 1e-5), (torch.float32, (1, 4), 1e-5),
])
def test_equals_transformers_qwen3_next(dtype, heads, atol):
    config, hf = _hf_layer(dtype, *heads)
    layer = _copy_from_hf(hf)
    assert (layer.num_key_heads, layer.num_heads) == heads
    torch.manual_seed(6)
    x = torch.randn(2, 10, 16, dtype=dtype)
    with torch.no_grad():
        expected = hf(x)
        got = layer(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)

    # Cached decoding on both sides: a prompt of 6 tokens, then one at a time.
    model_cache = transformers.DynamicCache(config=config)
    state = layer.new_cache()
    hf_parts, parts = [], []
    with torch.no_grad():
        for start, stop in [(0, 6), (6, 7), (7, 8), (8, 9), (9, 10)]:
            hf_parts.append(hf(x[:, start:stop], cache=model_cache))
            parts.append(layer(x[:, start:stop], kv_cache=state))
    torch.testing.assert_close(torch.cat(hf_parts, 1), expected, rtol=0, atol=atol)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=0, atol=atol)
    assert state.state.shape == (2, heads[1], 4, 6)  # one state per value head


def test_key_heads_are_shared_by_consecutive_value_heads():
    # With 1 key head serving 3 value heads, the layer equals one with 3 key heads whose
    # query and key projections are three copies of the one.
    torch.manual_seed(8)
    shared = GatedDeltaNet(8, 3, 4, num_key_heads=1, head_dim_v=2).double()
    copies = GatedDeltaNet(8, 3, 4, head_dim_v=2).double()
    with torch.no_grad():
        for name, param in copies.named_parameters():
            if name in ("W_query.weight", "W_key.weight"):
                param.copy_(getattr(shared, name.split(".")[0]).weight.repeat(3, 1))
            elif name == "conv.weight":
                q, k, v = shared.conv.weight.split([4, 4, 6])
                param.copy_(torch.cat([q.repeat(3, 1, 1), k.repeat(3, 1, 1), v]))
            else:
                param.copy_(dict(shared.named_parameters())[name])
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(shared(x), copies(x), rtol=0, atol=1e-12)
    assert shared.state_numbers == 3 * 4 * 2 + (2 * 4 + 3 * 2) * 3
    with pytest.raises(ValueError, match="num_key_heads=2 must divide num_heads=3"):
        GatedDeltaNet(8, 3, 4, num_key_heads=2)


# ---------------------------------------------------------------------------
# The decay: initialised as the authors train, and what it bounds
# ---------------------------------------------------------------------------


def test_reset_decay_draws_the_authors_ranges():
    torch.manual_seed(0)
    layer = GatedDeltaNet(8, 64, 4)
    a = layer.A_log.detach().exp()
    dt = F.softplus(layer.dt_bias.detach())
    assert a.min() > 0 and a.max() <= 16
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    # log-uniform: about half the heads below the geometric mean 0.01, spread over 2 decades
    assert 16 <= int((dt < 0.01).sum()) <= 48
    assert dt.max() / dt.min() > 20
    # With x W_alpha = 0 the state keeps exp(-A dt) per token: most heads keep most of it,
    # unlike the old dt_bias = 1 (softplus(1) = 1.31), which kept exp(-1.31 A).
    with torch.no_grad():
        layer.W_alpha.weight.zero_()
    kept = layer.log_decay(torch.randn(1, 3, 8)).exp()  # (1, 64, 3)
    torch.testing.assert_close(kept[0, :, 0], torch.exp(-a * dt), rtol=1e-5, atol=0)
    assert kept.min() >= math.exp(-1.6) * (1 - 1e-5) and kept.max() < 1
    assert kept[0, :, 0].median() > 0.8


def test_reset_decay_takes_ranges_and_rejects_bad_ones():
    torch.manual_seed(1)
    layer = GatedDeltaNet(8, 4, 4)
    layer.reset_decay(a_range=(2.0, 3.0), dt_range=(0.05, 0.05))
    a = layer.A_log.detach().exp()
    assert a.min() >= 2 and a.max() <= 3
    torch.testing.assert_close(F.softplus(layer.dt_bias.detach()), torch.full((4,), 0.05),
                               rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="a_range"):
        layer.reset_decay(a_range=(3.0, 2.0))
    with pytest.raises(ValueError, match="dt_range"):
        layer.reset_decay(dt_range=(0.0, 0.1))
    with pytest.raises(TypeError, match="a_range"):
        layer.reset_decay(a_range=(0.0, "16"))
    with pytest.raises(TypeError, match="dt_range"):
        layer.reset_decay(dt_range=0.1)


def test_log_decay_is_the_gates_formula():
    torch.manual_seed(2)
    layer = GatedDeltaNet(8, 2, 4).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    g = layer.log_decay(x)
    assert g.shape == (2, 2, 5) and bool((g < 0).all())
    expected = -layer.A_log.exp() * F.softplus(layer.W_alpha(x) + layer.dt_bias)
    torch.testing.assert_close(g, expected.transpose(1, 2), rtol=0, atol=1e-15)
    with pytest.raises(ValueError):
        layer.log_decay(torch.randn(2, 5, 7, dtype=torch.float64))


def _orthogonal_writes(num_writes, keep, head_dim=6, head_dim_v=3):
    """|S| after writes of unit values with unit keys orthogonal to S's columns."""
    gen = torch.Generator().manual_seed(7)
    state = torch.zeros(1, 1, head_dim, head_dim_v, dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.float64)
    g = torch.full((1, 1), math.log(keep), dtype=torch.float64)
    for _ in range(num_writes):
        key = torch.randn(head_dim, generator=gen, dtype=torch.float64)
        basis = torch.linalg.qr(state[0, 0]).Q
        key = F.normalize(key - basis @ (basis.T @ key), dim=0)[None, None]
        value = F.normalize(torch.randn(1, 1, head_dim_v, generator=gen,
                                        dtype=torch.float64), dim=-1)
        _, state = delta_rule_step(state, key, key, value, one, g)
    return torch.linalg.matrix_norm(state[0, 0]).item()


def test_without_decay_the_delta_rule_state_is_unbounded():
    # Keys that avoid what the state holds overwrite nothing: |S|^2 grows by |v|^2 = 1.
    assert _orthogonal_writes(400, 1.0) == pytest.approx(20.0, abs=1e-9)
    # A decay keeping 0.9 per token holds |S|^2 at 1 / (1 - 0.81), below 2 / (1 - 0.9).
    assert _orthogonal_writes(400, 0.9) == pytest.approx((1 / 0.19) ** 0.5, abs=1e-9)
