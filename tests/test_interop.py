"""attnlib.interop against tiny randomly initialised transformers models (no download):
Llama, Mistral, Qwen2 attention -> GroupedQueryAttention, GPT-2 attention ->
MultiHeadAttention, and back; outputs and cached decoding in float32 and float64."""

import pytest
import torch
import transformers  # a pinned test dependency: no importorskip
from torch.testing import assert_close

from attnlib import GroupedQueryAttention, KVCache, MultiHeadAttention, QKNormSinkAttention
from attnlib.interop import (
    gqa_from_gpt_oss_attention,
    gqa_from_llama_attention,
    gqa_to_gpt_oss_attention,
    gqa_to_llama_attention,
    mha_from_gpt2_attention,
    mha_to_gpt2_attention,
)

TOL = {torch.float32: {"atol": 2e-6, "rtol": 2e-5}, torch.float64: {"atol": 1e-12, "rtol": 1e-10}}
SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 50,
         "max_position_embeddings": 64}


def _llama_family(name, dtype, **extra):
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[name]
    model_cls = {"llama": transformers.LlamaForCausalLM,
                 "mistral": transformers.MistralForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM}[name]
    torch.manual_seed(0)
    config = cls(**{**SIZES, **extra})
    config._attn_implementation = "sdpa"  # eager softmaxes in float32 even for float64 inputs
    model = model_cls(config).to(dtype).eval()
    with torch.no_grad():  # random biases (HF initialises them to zero)
        for p in model.parameters():
            if p.ndim == 1:
                p.normal_()
    return model


def _hf_allowed(start, stop, window=None):
    """HF's own mask functions (transformers.masking_utils) for the queries start .. stop - 1
    and the keys 0 .. stop - 1: (stop - start, stop), True = may attend."""
    from transformers.masking_utils import (
        causal_mask_function,
        sliding_window_causal_mask_function,
    )

    allowed = causal_mask_function if window is None else sliding_window_causal_mask_function(
        window)
    zero = torch.tensor(0)
    return allowed(zero, zero, torch.arange(start, stop)[:, None], torch.arange(stop)[None, :])


def _hf_llama_steps(model, x, prefix, window=None):
    """HF's attention on x: one call on x[:, :prefix], then one token at a time (DynamicCache);
    with a window, HF's sliding-window mask passed in, as its model builds it."""
    attn, rotary = model.model.layers[0].self_attn, model.model.rotary_emb
    # (a cache of every key: the mask, not the cache, keeps the window)
    cache = transformers.DynamicCache(config=model.config) if window is None else (
        transformers.DynamicCache())
    outs = []
    bounds = [(0, prefix)] + [(t, t + 1) for t in range(prefix, x.shape[1])]
    with torch.no_grad():
        for start, stop in bounds:
            h = x[:, start:stop]
            cos_sin = rotary(h, torch.arange(start, stop)[None])
            mask = None if window is None else _hf_allowed(start, stop, window)[None, None]
            outs.append(attn(h, cos_sin, mask, cache)[0])
    return torch.cat(outs, dim=1)


def _hf_tables(model, dtype):
    """HF's cos and sin for positions 0 .. 63: (64, head_dim) each."""
    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=dtype), torch.arange(64)[None])
    return cos[0], sin[0]


def _attnlib_steps(module, x, prefix):
    cache = KVCache()
    with torch.no_grad():
        outs = [module(x[:, :prefix], kv_cache=cache)]
        outs += [module(x[:, t : t + 1], kv_cache=cache) for t in range(prefix, x.shape[1])]
    return torch.cat(outs, dim=1)


CASES = {
    "llama": {},
    "llama_bias_mqa": {"attention_bias": True, "num_key_value_heads": 1},
    "llama_head_dim": {"head_dim": 16},  # 4 heads x 16 = 64 != hidden_size 32, as Qwen3
    "llama3_scaling": {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
        "original_max_position_embeddings": 16, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0}},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 16}},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {"head_dim": 16},  # q_norm, k_norm -> qk_norm=True
}
# Qwen3's RMSNorm computes in float32 whatever the dtype, so in float64 the layer
# agrees to float32 rounding of the normalised queries and keys.
QWEN3_FLOAT64 = {"atol": 1e-8, "rtol": 1e-6}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_gqa_from_llama_family_equals_transformers(case, dtype):
    family = case.split("_")[0].replace("llama3", "llama").replace("yarn", "llama")
    model = _llama_family(family, dtype, **CASES[case])
    hf_attn = model.model.layers[0].self_attn
    module = gqa_from_llama_attention(hf_attn, context_length=64)
    assert isinstance(module, GroupedQueryAttention) and module.rope is not None
    # Qwen3's q_norm/k_norm make it chapter 13's subclass; the others stay plain
    assert isinstance(module, QKNormSinkAttention) == (family == "qwen3")
    if family == "qwen3":
        assert module.qk_norm is not None and module.sinks is None
    tol = QWEN3_FLOAT64 if (family, dtype) == ("qwen3", torch.float64) else TOL[dtype]
    assert module.W_query.weight.dtype == dtype and not module.training
    # transformers computes RoPE's angles in float32 whatever the dtype (its rotary
    # embedding calls .float()); attnlib in float64. The tables agree to float32
    # rounding; in float64 the layer is compared with HF's tables, to isolate the rest.
    cos, sin = _hf_tables(model, dtype)
    assert_close(module.rope.cos.double(), cos.double(), atol=2e-5, rtol=0)
    assert_close(module.rope.sin.double(), sin.double(), atol=2e-5, rtol=0)
    if dtype == torch.float64:
        module.rope.cos, module.rope.sin = cos, sin
    torch.manual_seed(1)
    x = torch.randn(2, 12, 32, dtype=dtype)
    expected = _hf_llama_steps(model, x, prefix=x.shape[1])  # one call, no decoding
    with torch.no_grad():
        got = module(x)
        got_readable = module(x, return_weights=True)[0]
    assert_close(got, expected, **tol)
    assert_close(got_readable, expected, **tol)
    # cached decoding: a 4-token prompt, then 8 steps of one token
    assert_close(_attnlib_steps(module, x, 4), _hf_llama_steps(model, x, 4), **tol)
    print(f"{case} {dtype}: max |attnlib - HF| = {(got - expected).abs().max().item():.2e}")


def test_gqa_to_llama_attention_round_trip():
    model = _llama_family("qwen2", torch.float64)  # q/k/v biases, no o_proj bias
    hf_attn = model.model.layers[0].self_attn
    torch.manual_seed(2)
    module = GroupedQueryAttention(32, 32, 64, 0.0, 4, 2, True, out_bias=False,
                                   rope=True).double().eval()
    gqa_to_llama_attention(module, hf_attn)
    module.rope.cos, module.rope.sin = _hf_tables(model, torch.float64)  # float32 angles
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        assert_close(module(x), _hf_llama_steps(model, x, 7), **TOL[torch.float64])
    with pytest.raises(ValueError, match="o_proj has no bias"):
        gqa_to_llama_attention(GroupedQueryAttention(32, 32, 64, 0.0, 4, 2, True, rope=True),
                               hf_attn)
    with pytest.raises(ValueError, match="k_proj.weight"):
        gqa_to_llama_attention(GroupedQueryAttention(32, 32, 64, 0.0, 4, 4, True,
                                                     out_bias=False, rope=True), hf_attn)


def test_qwen3_round_trip_and_other_qk_norms_refused():
    model = _llama_family("qwen3", torch.float64, head_dim=16)
    hf_attn = model.model.layers[0].self_attn
    module = gqa_from_llama_attention(hf_attn, 64)
    assert module.qk_norm.q_norm.eps == hf_attn.q_norm.variance_epsilon
    torch.manual_seed(5)
    other = QKNormSinkAttention(32, 32, 64, 0.0, 4, 2, rope=True, head_dim=16,
                                qk_norm=True, out_bias=False).double().eval()
    with torch.no_grad():
        other.qk_norm.k_norm.weight.normal_()
    gqa_to_llama_attention(other, hf_attn)
    assert torch.equal(hf_attn.k_norm.weight, other.qk_norm.k_norm.weight)
    assert torch.equal(gqa_from_llama_attention(hf_attn, 64).qk_norm.k_norm.weight,
                       other.qk_norm.k_norm.weight)
    with pytest.raises(ValueError, match="has QK-norm"):
        gqa_to_llama_attention(GroupedQueryAttention(32, 32, 64, 0.0, 4, 2, rope=True,
                                                     head_dim=16, out_bias=False).double(),
                               hf_attn)
    # Gemma 3's norm multiplies by (1 + weight): another function, refused
    with torch.no_grad():
        hf_attn.q_norm.forward = lambda h: (1 + hf_attn.q_norm.weight) * h * torch.rsqrt(
            h.pow(2).mean(-1, keepdim=True) + 1e-6)
    with pytest.raises(NotImplementedError, match="not an RMSNorm over each head"):
        gqa_from_llama_attention(hf_attn, 64)


def _gpt_oss(dtype, layer_type="full_attention"):
    from transformers.models.gpt_oss import modeling_gpt_oss as go

    config = transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=1, layer_types=[layer_type], vocab_size=50, sliding_window=16,
        intermediate_size=16, num_local_experts=2, num_experts_per_tok=1,
        max_position_embeddings=64, attention_bias=True, attn_implementation="eager",
    )  # default rope_parameters: YaRN, factor 32, as the released models
    torch.manual_seed(6)
    hf_attn = go.GptOssAttention(config, layer_idx=0)
    with torch.no_grad():
        for p in hf_attn.parameters():
            p.normal_(0.0, 0.3)
    return config, hf_attn.to(dtype).eval(), go.GptOssRotaryEmbedding(config).to(dtype)


def _hf_gpt_oss_steps(config, hf_attn, rotary, x, prefix, window=None):
    # (with a window, a cache of every key: the mask, not the cache, keeps the window)
    cache = transformers.DynamicCache(config=config) if window is None else (
        transformers.DynamicCache())
    bounds = [(0, prefix)] + [(t, t + 1) for t in range(prefix, x.shape[1])]
    outs = []
    with torch.no_grad():
        for start, stop in bounds:
            h = x[:, start:stop]
            allowed = _hf_allowed(start, stop, window)
            bias = torch.zeros(stop - start, stop, dtype=x.dtype).masked_fill(
                ~allowed, torch.finfo(x.dtype).min)[None, None]
            outs.append(hf_attn(h, rotary(h, torch.arange(start, stop)[None]), bias,
                                cache=cache)[0])
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gqa_from_gpt_oss_attention_equals_transformers(dtype):
    config, hf_attn, rotary = _gpt_oss(dtype)
    module = gqa_from_gpt_oss_attention(hf_attn, context_length=64)
    assert isinstance(module, QKNormSinkAttention)
    assert module.sinks is not None and module.qk_norm is None
    assert module.rope.scaling["rope_type"] == "yarn"
    cos, sin = rotary(torch.zeros(1, dtype=dtype), torch.arange(64)[None])  # (1, 64, hd/2)
    # gpt-oss's tables hold each angle once (it rotates halves); attnlib's twice
    assert_close(module.rope.cos.double(), torch.cat([cos[0], cos[0]], -1).double(),
                 atol=2e-5, rtol=0)
    if dtype == torch.float64:  # HF's angles are float32: compare the rest with its tables
        module.rope.cos = torch.cat([cos[0], cos[0]], -1)
        module.rope.sin = torch.cat([sin[0], sin[0]], -1)
    torch.manual_seed(1)
    x = torch.randn(2, 12, 32, dtype=dtype)
    expected = _hf_gpt_oss_steps(config, hf_attn, rotary, x, 12)
    with torch.no_grad():
        got = module(x)
        assert_close(got, expected, **TOL[dtype])
        assert_close(module(x, return_weights=True)[0], expected, **TOL[dtype])
    assert_close(_attnlib_steps(module, x, 4),
                 _hf_gpt_oss_steps(config, hf_attn, rotary, x, 4), **TOL[dtype])
    print(f"gpt-oss {dtype}: max |attnlib - HF| = {(got - expected).abs().max().item():.2e}")


def test_gpt_oss_round_trip_and_refusals():
    config, hf_attn, rotary = _gpt_oss(torch.float64)
    module = gqa_from_gpt_oss_attention(hf_attn, 64)
    with torch.no_grad():
        module.sinks.sinks.add_(1.0)
    gqa_to_gpt_oss_attention(module, hf_attn)
    assert torch.equal(hf_attn.sinks, module.sinks.sinks)
    with pytest.raises(NotImplementedError, match="gqa_from_gpt_oss_attention"):
        gqa_from_llama_attention(hf_attn, 64)
    with pytest.raises(ValueError, match="has sinks"):
        gqa_to_gpt_oss_attention(GroupedQueryAttention(32, 32, 64, 0.0, 4, 2, True,
                                                       rope=True, head_dim=8), hf_attn)
    llama = _llama_family("llama", torch.float32).model.layers[0].self_attn
    with pytest.raises(TypeError, match="sinks parameter"):
        gqa_from_gpt_oss_attention(llama, 64)
    _, sliding, _ = _gpt_oss(torch.float32, "sliding_attention")
    with pytest.raises(ValueError, match="sliding window 16"):
        gqa_to_gpt_oss_attention(module, sliding)  # module: a full-attention layer's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt_oss_sliding_window_layer_equals_transformers(dtype):
    config, hf_attn, rotary = _gpt_oss(dtype, "sliding_attention")  # a window of 16
    module = gqa_from_gpt_oss_attention(hf_attn, context_length=64)
    assert module.window == 16 and "sinks=True, window=16" in repr(module)
    assert gqa_from_gpt_oss_attention(hf_attn, 16).window is None  # the window masks nothing
    if dtype == torch.float64:  # HF's angles are float32: compare the rest with its tables
        cos, sin = rotary(torch.zeros(1, dtype=dtype), torch.arange(64)[None])
        module.rope.cos = torch.cat([cos[0], cos[0]], -1)
        module.rope.sin = torch.cat([sin[0], sin[0]], -1)
    torch.manual_seed(3)
    x = torch.randn(2, 40, 32, dtype=dtype)  # longer than the window
    expected = _hf_gpt_oss_steps(config, hf_attn, rotary, x, 40, window=16)
    with torch.no_grad():
        assert_close(module(x), expected, **TOL[dtype])
        assert_close(module(x, return_weights=True)[0], expected, **TOL[dtype])
        module.window = None  # the window matters: full attention differs
        assert (module(x) - expected).abs().max() > 1e-3
        module.window = 16
    assert_close(_attnlib_steps(module, x, 20),
                 _hf_gpt_oss_steps(config, hf_attn, rotary, x, 20, window=16), **TOL[dtype])
    gqa_to_gpt_oss_attention(module, hf_attn)  # the same window: accepted


def test_mistral_sliding_window_equals_transformers():
    model = _llama_family("mistral", torch.float64, sliding_window=8)
    hf_attn = model.model.layers[0].self_attn
    module = gqa_from_llama_attention(hf_attn, 64)
    assert isinstance(module, QKNormSinkAttention) and module.window == 8
    assert module.qk_norm is None and module.sinks is None
    assert type(gqa_from_llama_attention(hf_attn, 8)) is GroupedQueryAttention
    module.rope.cos, module.rope.sin = _hf_tables(model, torch.float64)  # float32 angles
    x = torch.randn(1, 20, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert_close(module(x), _hf_llama_steps(model, x, 20, window=8), **TOL[torch.float64])
    assert_close(_attnlib_steps(module, x, 5), _hf_llama_steps(model, x, 5, window=8),
                 **TOL[torch.float64])
    with pytest.raises(ValueError, match="sliding window 8"):
        gqa_to_llama_attention(GroupedQueryAttention(32, 32, 64, 0.0, 4, 2, True, rope=True),
                               hf_attn)


def test_wrong_modules_are_refused():
    with pytest.raises(TypeError, match="Llama-family"):
        gqa_from_llama_attention(torch.nn.Linear(2, 2), 8)
    with pytest.raises(TypeError, match="GPT2Attention"):
        mha_from_gpt2_attention(torch.nn.Linear(2, 2), 8)


def _gpt2(dtype):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, n_positions=64,
                                     vocab_size=50, attn_pdrop=0.0, resid_pdrop=0.0)
    config._attn_implementation = "sdpa"
    model = transformers.GPT2LMHeadModel(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.normal_()
    return model


def _hf_gpt2_steps(attn, x, prefix, config):
    cache = transformers.DynamicCache(config=config)
    bounds = [(0, prefix)] + [(t, t + 1) for t in range(prefix, x.shape[1])]
    with torch.no_grad():
        return torch.cat([attn(x[:, a:b].contiguous(), cache)[0] for a, b in bounds], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mha_from_gpt2_attention_equals_transformers(dtype):
    model = _gpt2(dtype)
    hf_attn = model.transformer.h[0].attn
    module = mha_from_gpt2_attention(hf_attn, context_length=64)
    assert isinstance(module, MultiHeadAttention) and module.W_query.weight.dtype == dtype
    torch.manual_seed(1)
    x = torch.randn(2, 12, 32, dtype=dtype)
    expected = _hf_gpt2_steps(hf_attn, x, 12, model.config)
    with torch.no_grad():
        assert_close(module(x), expected, **TOL[dtype])
        assert_close(module(x, return_weights=True)[0], expected, **TOL[dtype])
    assert_close(_attnlib_steps(module, x, 4), _hf_gpt2_steps(hf_attn, x, 4, model.config),
                 **TOL[dtype])


def test_mha_to_gpt2_attention_round_trip():
    model = _gpt2(torch.float64)
    hf_attn = model.transformer.h[0].attn
    torch.manual_seed(3)
    module = MultiHeadAttention(32, 32, 64, 0.0, 4, qkv_bias=True).double().eval()
    mha_to_gpt2_attention(module, hf_attn)
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        assert_close(module(x), _hf_gpt2_steps(hf_attn, x, 9, model.config),
                     **TOL[torch.float64])
    back = mha_from_gpt2_attention(hf_attn, 64)
    assert_close(back.W_value.weight, module.W_value.weight, atol=0, rtol=0)
    with pytest.raises(ValueError, match="8 heads"):
        mha_to_gpt2_attention(MultiHeadAttention(32, 32, 64, 0.0, 8), hf_attn)
