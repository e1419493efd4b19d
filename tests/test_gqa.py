"""Tests for attnlib.GroupedQueryAttention: against a repeat_interleave reference,
torch's enable_gqa, MultiHeadAttention, with a KV cache and with RoPE."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attnlib
from attnlib import GroupedQueryAttention, KVCache, MultiHeadAttention
from attnlib.functional import causal_mask
from attnlib.positional import RotaryPositionalEmbedding

HAS_ENABLE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


def _gqa(seed=0, d_in=10, d_out=12, context_length=16, num_heads=6, num_kv_groups=2, **kw):
    torch.manual_seed(seed)
    module = GroupedQueryAttention(d_in, d_out, context_length, 0.0, num_heads, num_kv_groups,
                                   **kw)
    return module.double().eval()


def _rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE written independently of attnlib: pair (x[i], x[i + d/2]) of the vector at
    position m, read as the complex number x[i] + 1j x[i + d/2], times e^(1j m theta_i)."""
    n, d = x.shape[-2], x.shape[-1]
    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(n, d // 2, dtype=torch.float64),
                       torch.outer(torch.arange(n, dtype=torch.float64), theta))
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * turn
    return torch.cat([z.real, z.imag], dim=-1)


def _reference(m: GroupedQueryAttention, x: torch.Tensor) -> torch.Tensor:
    """GQA written out independently: per query head h, its key/value head is h // r."""
    b, n, _ = x.shape
    q = x @ m.W_query.weight.T
    k = x @ m.W_key.weight.T
    v = x @ m.W_value.weight.T
    if m.W_query.bias is not None:
        q, k, v = q + m.W_query.bias, k + m.W_key.bias, v + m.W_value.bias
    hd, r = m.head_dim, m.group_size
    heads = []
    for h in range(m.num_heads):
        qh = q[..., h * hd : (h + 1) * hd]
        j = h // r  # key/value head j serves query heads j*r ... j*r + r - 1
        kh, vh = k[..., j * hd : (j + 1) * hd], v[..., j * hd : (j + 1) * hd]
        rope = getattr(m, "rope", None)  # MultiHeadAttention has no RoPE
        if rope is not None:
            qh, kh = _rotate(qh, rope.base), _rotate(kh, rope.base)
        scores = qh @ kh.transpose(-2, -1) / math.sqrt(hd)
        scores = scores.masked_fill(~causal_mask(n), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vh)
    return m.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize(("num_heads", "num_kv_groups"), [(6, 6), (6, 3), (6, 2), (6, 1)])
@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("rope", [False, True])
def test_matches_the_per_head_reference(num_heads, num_kv_groups, return_weights, qkv_bias,
                                        rope):
    # with rope=True the reference rotates each head's queries and keys itself
    m = _gqa(num_heads=num_heads, num_kv_groups=num_kv_groups, qkv_bias=qkv_bias, rope=rope,
             d_out=24)  # head_dim 4: even, as RoPE needs
    x = torch.randn(3, 9, 10, dtype=torch.float64)
    out = m(x, return_weights=return_weights)
    if return_weights:
        out, w = out
        assert w.shape == (3, num_heads, 9, 9)
        assert_close(w.sum(-1), torch.ones(3, num_heads, 9, dtype=torch.float64))
    assert_close(out, _reference(m, x), atol=1e-12, rtol=1e-10)


def test_a_tiled_repeat_would_not_match():
    # repeat (tiling: head h uses kv head h % g) is the classic mistake; check it differs
    m = _gqa(num_heads=6, num_kv_groups=2)
    x = torch.randn(2, 7, 10, dtype=torch.float64)
    q = m.W_query(x).view(2, 7, 6, 2).transpose(1, 2)
    k = m.W_key(x).view(2, 7, 2, 2).transpose(1, 2).repeat(1, 3, 1, 1)
    v = m.W_value(x).view(2, 7, 2, 2).transpose(1, 2).repeat(1, 3, 1, 1)
    tiled = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tiled = m.out_proj(tiled.transpose(1, 2).reshape(2, 7, 12))
    assert not torch.allclose(tiled, m(x), atol=1e-6)


@pytest.mark.parametrize(("num_heads", "num_kv_groups"), [(8, 8), (8, 4), (8, 2), (8, 1)])
def test_matches_repeat_interleave_then_ordinary_attention(num_heads, num_kv_groups):
    # the reference the chapter uses: copy each key/value head for its group of query heads,
    # then run torch's attention with as many key/value heads as query heads
    m = _gqa(seed=1, num_heads=num_heads, num_kv_groups=num_kv_groups, d_out=16)
    x = torch.randn(2, 11, 10, dtype=torch.float64)
    hd, r = m.head_dim, m.group_size
    q = m.W_query(x).view(2, 11, num_heads, hd).transpose(1, 2)
    k = m.W_key(x).view(2, 11, num_kv_groups, hd).transpose(1, 2).repeat_interleave(r, dim=1)
    v = m.W_value(x).view(2, 11, num_kv_groups, hd).transpose(1, 2).repeat_interleave(r, dim=1)
    ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = m.out_proj(ctx.transpose(1, 2).reshape(2, 11, 16))
    assert_close(m(x), expected, atol=1e-12, rtol=1e-10)
    assert_close(m(x, return_weights=True)[0], expected, atol=1e-12, rtol=1e-10)


@pytest.mark.skipif(not HAS_ENABLE_GQA, reason="enable_gqa needs torch >= 2.5")
def test_matches_torch_enable_gqa():
    m = _gqa(seed=1, num_heads=8, num_kv_groups=2, d_out=16)
    x = torch.randn(2, 11, 10, dtype=torch.float64)
    q = m.W_query(x).view(2, 11, 8, 2).transpose(1, 2)
    k = m.W_key(x).view(2, 11, 2, 2).transpose(1, 2)
    v = m.W_value(x).view(2, 11, 2, 2).transpose(1, 2)
    ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = m.out_proj(ctx.transpose(1, 2).reshape(2, 11, 16))
    assert_close(m(x), expected, atol=1e-12, rtol=1e-10)
    assert_close(m(x, return_weights=True)[0], expected, atol=1e-12, rtol=1e-10)
    # the last 4 tokens after 7 cached ones: torch with a bottom-right mask of its own
    late = F.scaled_dot_product_attention(
        q[:, :, 7:], k, v, enable_gqa=True,
        attn_mask=torch.ones(4, 11, dtype=torch.bool).tril(diagonal=7),
    )
    late = m.out_proj(late.transpose(1, 2).reshape(2, 4, 16))
    for return_weights in (False, True):
        cache = KVCache()
        m(x[:, :7], kv_cache=cache)
        out = m(x[:, 7:], return_weights=return_weights, kv_cache=cache)
        out = out[0] if return_weights else out
        assert_close(out, late, atol=1e-12, rtol=1e-10)


def test_fast_and_readable_paths_give_the_same_gradients():
    m = _gqa(seed=2, qkv_bias=True, rope=True)
    x = torch.randn(2, 8, 10, dtype=torch.float64)
    g = torch.randn(2, 8, 12, dtype=torch.float64)
    params = list(m.parameters())
    fast = torch.autograd.grad(m(x), params, g)
    readable = torch.autograd.grad(m(x, return_weights=True)[0], params, g)
    for a, b in zip(fast, readable, strict=True):
        assert a.abs().sum() > 0
        assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_num_kv_groups_equal_num_heads_is_multi_head_attention():
    gqa = _gqa(seed=3, num_heads=3, num_kv_groups=3)
    torch.manual_seed(3)
    mha = MultiHeadAttention(10, 12, 16, 0.0, num_heads=3).double().eval()
    # same parameter shapes and creation order, so the same seed gives the same weights
    for a, b in zip(gqa.parameters(), mha.parameters(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    assert_close(gqa(x), mha(x), atol=1e-12, rtol=1e-10)


def test_shapes_and_parameter_counts():
    m = _gqa(num_heads=6, num_kv_groups=2)  # head_dim 2, kv_dim 4
    assert m.W_query.weight.shape == (12, 10)
    assert m.W_key.weight.shape == m.W_value.weight.shape == (4, 10)
    assert [n for n, _ in m.named_parameters()] == [
        "W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"
    ]
    assert m.group_size == 3 and m.head_dim == 2


def test_causality():
    m = _gqa(seed=4, rope=True)
    x = torch.randn(2, 10, 10, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 6] += 1.0
    out, out2 = m(x), m(x2)
    assert_close(out[:, :6], out2[:, :6], atol=1e-12, rtol=0)
    assert not torch.allclose(out[:, 6:], out2[:, 6:])


# ---------------------------------------------------------------- cache and RoPE


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("sizes", [[12], [1] * 12, [5, 7], [2, 1, 4, 5]])
def test_chunked_decoding_with_a_cache_equals_the_full_forward(rope, sizes):
    m = _gqa(seed=5, rope=rope, num_heads=4, num_kv_groups=2, d_out=16)
    x = torch.randn(2, 12, 10, dtype=torch.float64)
    full = m(x)
    cache, outs, start = KVCache(), [], 0
    for size in sizes:
        outs.append(m(x[:, start : start + size], kv_cache=cache))
        start += size
    assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=1e-10)
    assert cache.keys.shape == (2, 2, 12, 4)  # num_kv_groups heads are cached, not num_heads


def test_rope_makes_scores_depend_on_relative_position_only():
    # the scores inside the layer are the same whether the sequence starts at
    # position 0 or at position 5: only offsets between tokens matter
    m = _gqa(seed=6, rope=True, num_heads=2, num_kv_groups=1, d_out=8)
    x = torch.randn(1, 6, 10, dtype=torch.float64)
    q = m.W_query(x).view(1, 6, 2, 4).transpose(1, 2)
    k = m.W_key(x).view(1, 6, 1, 4).transpose(1, 2)
    s0 = m.rope(q) @ m.rope(k).transpose(-2, -1)
    s5 = m.rope(q, offset=5) @ m.rope(k, offset=5).transpose(-2, -1)
    assert_close(s0, s5, atol=1e-12, rtol=1e-10)
    assert isinstance(m.rope, RotaryPositionalEmbedding) and m.rope.head_dim == 4
    assert _gqa(rope=False).rope is None


def test_rope_changes_the_output_and_base_is_passed_on():
    x = torch.randn(1, 8, 10, dtype=torch.float64)
    plain, roped = _gqa(seed=7), _gqa(seed=7, rope=True, rope_base=50.0)
    assert roped.rope.base == 50.0
    assert not torch.allclose(plain(x), roped(x))


def test_cache_errors():
    m = _gqa(context_length=5)
    cache = KVCache()
    m(torch.randn(1, 3, 10, dtype=torch.float64), kv_cache=cache)
    with pytest.raises(ValueError, match=r"holds 3 tokens and x adds num_tokens=3: 6 tokens "
                                         r"exceed context_length=5"):
        m(torch.randn(1, 3, 10, dtype=torch.float64), kv_cache=cache)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((10, 12, 8, 0.0, 6, 4), {}, ValueError,
         r"num_heads=6 is not divisible by num_kv_groups=4"),
        ((10, 12, 8, 0.0, 5, 5), {}, ValueError, r"d_out=12 is not divisible by num_heads=5"),
        ((10, 12, 8, 0.0, 6, 0), {}, ValueError, r"num_kv_groups must be a positive int"),
        ((10, 12, 8, 0.0, 6, 2.0), {}, TypeError, r"num_kv_groups must be an int"),
        ((10, 12, 8, 1.0, 6, 2), {}, ValueError, r"dropout must be in \[0, 1\)"),
        ((10, 12, 8, 0.0, 6, 2), {"rope": 1}, TypeError, r"rope must be a bool"),
        ((10, 18, 8, 0.0, 6, 2), {"rope": True}, ValueError, r"head_dim=3 must be even"),
    ],
)
def test_constructor_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupedQueryAttention(*args, **kwargs)


def test_forward_errors():
    m = _gqa(context_length=4)
    with pytest.raises(ValueError, match=r"num_tokens=5 exceeds context_length=4"):
        m(torch.randn(1, 5, 10, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"does not match d_in=10"):
        m(torch.randn(1, 2, 9, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"x has dtype torch.float32"):
        m(torch.randn(1, 2, 10))


def test_exported():
    assert attnlib.GroupedQueryAttention is GroupedQueryAttention


def test_fast_path_without_enable_gqa_falls_back_to_repeat_interleave(monkeypatch):
    import attnlib.functional

    m = _gqa(seed=8, num_heads=6, num_kv_groups=2)
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    expected = _reference(m, x)
    monkeypatch.setattr(attnlib.functional, "_SDPA_HAS_ENABLE_GQA", False)
    assert_close(m(x), expected, atol=1e-12, rtol=1e-10)
    cache = KVCache()
    chunks = [m(x[:, :4], kv_cache=cache), m(x[:, 4:], kv_cache=cache)]
    assert_close(torch.cat(chunks, dim=1), expected, atol=1e-12, rtol=1e-10)


def test_fast_path_without_gradients_stacks_the_weights_without_copying():
    from torch.profiler import ProfilerActivity, profile

    m = _gqa(seed=9, qkv_bias=True)  # .double() after building: packed again
    x = torch.randn(2, 6, 10, dtype=torch.float64)
    expected = _reference(m, x)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = m(x)
    assert "aten::cat" not in {e.name for e in prof.events()}
    assert_close(out, expected, atol=1e-12, rtol=1e-10)


# -- head_dim different from d_out // num_heads (Qwen3, Gemma) -------------------


@pytest.mark.parametrize("cls", ["gqa", "mha"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_head_dim_keyword_decouples_heads_from_d_out(cls, return_weights):
    torch.manual_seed(20)
    if cls == "gqa":
        m = GroupedQueryAttention(10, 12, 16, 0.0, 4, 2, head_dim=6, rope=True)
    else:
        m = MultiHeadAttention(10, 12, 16, 0.0, 4, head_dim=6)
    m = m.double().eval()
    assert m.head_dim == 6
    assert m.W_query.weight.shape == (24, 10)
    assert m.W_key.weight.shape == (m.num_kv_groups * 6, 10)
    assert m.out_proj.weight.shape == (12, 24)  # num_heads * head_dim -> d_out
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    out = m(x, return_weights) if return_weights else m(x)
    out = out[0] if return_weights else out
    assert out.shape == (2, 9, 12)
    assert_close(out, _reference(m, x), atol=1e-12, rtol=1e-10)
    cache = KVCache()  # cached decoding with the new shapes
    steps = [m(x[:, :5], kv_cache=cache)] + [m(x[:, t : t + 1], kv_cache=cache)
                                             for t in range(5, 9)]
    assert_close(torch.cat(steps, dim=1), out, atol=1e-12, rtol=1e-10)


def test_head_dim_lets_d_out_be_indivisible_and_is_checked():
    m = GroupedQueryAttention(8, 10, 4, 0.0, 3, 1, head_dim=4)  # 10 % 3 != 0 is fine now
    assert m.out_proj.in_features == 12
    with pytest.raises(ValueError, match="d_out=10 is not divisible by num_heads=3"):
        GroupedQueryAttention(8, 10, 4, 0.0, 3, 1)
    with pytest.raises(ValueError, match="head_dim"):
        GroupedQueryAttention(8, 12, 4, 0.0, 3, 1, head_dim=0)
    with pytest.raises(TypeError, match="head_dim"):
        MultiHeadAttention(8, 12, 4, 0.0, 3, head_dim=4.0)
    with pytest.raises(ValueError, match="num_heads \\* head_dim == d_out"):
        MultiHeadAttention(8, 8, 4, 0.0, 2, head_dim=2).to_torch()


# -- no (context_length x context_length) mask buffer ----------------------------


def _buffer_bytes(module: torch.nn.Module) -> int:
    return sum(b.numel() * b.element_size() for b in module.buffers())


@pytest.mark.parametrize(("context_length", "expected"),
                         [(8192, 64 * 2**20), (32768, 2**30)])
def test_no_mask_buffer_saves_context_length_squared_bytes(context_length, expected):
    # Built on the meta device: shapes and bytes without allocating the GiB.
    with torch.device("meta"):
        with_buffer = GroupedQueryAttention(64, 64, context_length, 0.0, 4, 2)
        without = GroupedQueryAttention(64, 64, context_length, 0.0, 4, 2, mask_buffer=False)
        mha = MultiHeadAttention(64, 64, context_length, 0.0, 4, mask_buffer=False)
    assert _buffer_bytes(with_buffer) == context_length**2 == expected
    assert _buffer_bytes(without) == 0 and _buffer_bytes(mha) == 0
    assert without.mask is None and "mask" not in without.state_dict()


@pytest.mark.parametrize("cls", ["gqa", "mha"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_no_mask_buffer_gives_the_same_outputs(cls, return_weights):
    def build(mask_buffer):
        torch.manual_seed(21)
        if cls == "gqa":
            m = GroupedQueryAttention(10, 12, 16, 0.0, 6, 2, rope=True, mask_buffer=mask_buffer)
        else:
            m = MultiHeadAttention(10, 12, 16, 0.0, 6, mask_buffer=mask_buffer)
        return m.double().eval()

    ref, lean = build(True), build(False)
    x = torch.randn(2, 11, 10, dtype=torch.float64)
    expected = ref(x, True) if return_weights else ref(x)
    got = lean(x, True) if return_weights else lean(x)
    assert_close(got, expected, atol=1e-12, rtol=1e-10)
    assert_close(got[0] if return_weights else got, _reference(ref, x), atol=1e-12, rtol=1e-10)
    cache = KVCache()
    chunks = [lean(x[:, :4], kv_cache=cache), lean(x[:, 4:7], kv_cache=cache)]
    chunks += [lean(x[:, t : t + 1], kv_cache=cache) for t in range(7, 11)]
    assert_close(torch.cat(chunks, dim=1), _reference(ref, x), atol=1e-12, rtol=1e-10)


def test_state_dicts_load_across_mask_buffer():
    torch.manual_seed(22)
    ref = MultiHeadAttention(6, 6, 8, 0.0, 2)
    lean = MultiHeadAttention(6, 6, 8, 0.0, 2, mask_buffer=False)
    lean.load_state_dict(ref.state_dict())  # the saved mask is ignored, strict loading
    assert lean.mask is None
    assert_close(lean.W_key.weight, ref.W_key.weight)
    back = MultiHeadAttention(6, 6, 8, 0.0, 2)
    back.load_state_dict(lean.state_dict())  # no mask saved: the module keeps its own
    assert torch.equal(back.mask, causal_mask(8))
    with pytest.raises(TypeError, match="mask_buffer"):
        GroupedQueryAttention(6, 6, 8, 0.0, 2, 1, mask_buffer=None)


# -- chapter 9's forward is chapter 6's plus RoPE, and stays so ----------------------


def _forward_body(cls: type) -> list:
    """The statements of ``cls.forward`` (its own definition), docstring left out."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__dict__["forward"])))
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return [function.args, *body]


def test_gqa_forward_is_mha_forward_plus_the_rope_statement():
    import ast

    mha, gqa = _forward_body(MultiHeadAttention), _forward_body(GroupedQueryAttention)
    rope = [s for s in gqa if "transform_queries_keys" in ast.dump(s)]
    assert len(rope) == 1  # the one statement chapter 9 adds
    rest = [s for s in gqa if s is not rope[0]]
    assert [ast.dump(s) for s in rest] == [ast.dump(s) for s in mha]


def test_the_moved_keywords_leave_the_printed_signature_plain():
    import inspect

    for cls in (MultiHeadAttention, GroupedQueryAttention):
        kinds = [p.kind for p in inspect.signature(cls.__init__).parameters.values()]
        assert inspect.Parameter.VAR_KEYWORD not in kinds
        assert "removed" not in inspect.getsource(cls.__init__)


def test_context_with_rope_is_grouped_query_attentions_check():
    import inspect

    from attnlib import _heads

    for source in (inspect.getsource(MultiHeadAttention.check_inputs),
                   inspect.getsource(_heads.check_context)):
        assert "rope" not in source  # chapter 6's class does not know RoPE
    rope = _gqa(num_heads=3, num_kv_groups=3, d_out=12, rope=True, causal=False)
    x, context = torch.randn(2, 4, 10, dtype=torch.float64), torch.randn(2, 5, 10,
                                                                         dtype=torch.float64)
    with pytest.raises(ValueError, match="rope=True"):
        rope(x, context=context)
    assert _gqa(num_heads=3, num_kv_groups=3, causal=False)(x, context=context).shape == (
        2, 4, 12)


# -- torch.nn.MultiheadAttention converts plain multi-head attention only -----------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: GroupedQueryAttention(8, 8, 4, 0.0, 2, 1), r"num_kv_groups=1"),
        (lambda: GroupedQueryAttention(8, 8, 4, 0.0, 2, 2, rope=True), r"rope=True"),
        (lambda: attnlib.QKNormSinkAttention(8, 8, 4, 0.0, 2, 2, sinks=True), r"sinks"),
        (lambda: attnlib.QKNormSinkAttention(8, 8, 4, 0.0, 2, 2, qk_norm=True), r"qk_norm"),
        (lambda: attnlib.QKNormSinkAttention(8, 8, 4, 0.0, 2, 2, window=2), r"window"),
    ],
)
def test_to_torch_refuses_what_torch_cannot_compute(make, match):
    with pytest.raises(ValueError, match=rf"to_torch needs.*{match}"):
        make().to_torch()


def test_to_torch_of_a_plain_gqa_computes_the_same():
    module = _gqa(d_in=12, num_heads=3, num_kv_groups=3)
    theirs = module.to_torch()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    expected = theirs(x, x, x, attn_mask=~causal_mask(5), need_weights=False)[0]
    assert_close(module(x), expected)


def test_from_torch_on_a_subclass_is_refused():
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    for cls in (GroupedQueryAttention, attnlib.QKNormSinkAttention):
        with pytest.raises(TypeError, match=rf"{cls.__name__}\.from_torch is not supported"):
            cls.from_torch(theirs, 4)
    assert type(MultiHeadAttention.from_torch(theirs, 4)) is MultiHeadAttention
