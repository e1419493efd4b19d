"""Tests of attnlib.attention: reference numbers, shapes, causality, dropout,
errors, buffers, parameter order, and agreement with torch.nn.MultiheadAttention."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import attnlib
from attnlib import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttention_v1,
    SelfAttention_v2,
    causal_mask,
)


@pytest.fixture
def inputs() -> torch.Tensor:
    return attnlib.journey_embeddings()  # (6, 3)


@pytest.fixture
def batch(inputs) -> torch.Tensor:
    return torch.stack((inputs, inputs))  # (2, 6, 3)


def _ref(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------------------
# Reference numbers (Raschka 2024, Build a Large Language Model (From Scratch), ch. 3)
# ---------------------------------------------------------------------------

V1_REF = [[0.2996, 0.8053], [0.3061, 0.8210], [0.3058, 0.8203],
          [0.2948, 0.7939], [0.2927, 0.7891], [0.2990, 0.8040]]  # fmt: skip
V2_REF = [[-0.0739, 0.0713], [-0.0748, 0.0703], [-0.0749, 0.0702],
          [-0.0760, 0.0685], [-0.0763, 0.0679], [-0.0754, 0.0693]]  # fmt: skip
CAUSAL_REF = [[-0.4519, 0.2216], [-0.5874, 0.0058], [-0.6300, -0.0632],
              [-0.5675, -0.0843], [-0.5526, -0.0981], [-0.5299, -0.1081]]  # fmt: skip
WRAPPER_REF = [[-0.4519, 0.2216, 0.4772, 0.1063], [-0.5874, 0.0058, 0.5891, 0.3257],
               [-0.6300, -0.0632, 0.6202, 0.3860], [-0.5675, -0.0843, 0.5478, 0.3589],
               [-0.5526, -0.0981, 0.5321, 0.3428], [-0.5299, -0.1081, 0.5077, 0.3493]]  # fmt: skip
MHA_REF = [[0.3190, 0.4858], [0.2943, 0.3897], [0.2856, 0.3593],
           [0.2693, 0.3873], [0.2639, 0.3928], [0.2575, 0.4028]]  # fmt: skip


def test_self_attention_v1_reference_numbers(inputs):
    torch.manual_seed(123)
    sa_v1 = SelfAttention_v1(d_in=3, d_out=2)
    assert_close(sa_v1(inputs), _ref(V1_REF), atol=1e-4, rtol=0)


def test_self_attention_v2_reference_numbers(inputs):
    torch.manual_seed(789)
    sa_v2 = SelfAttention_v2(d_in=3, d_out=2)
    assert_close(sa_v2(inputs), _ref(V2_REF), atol=1e-4, rtol=0)


def test_causal_attention_reference_numbers(batch):
    torch.manual_seed(123)
    ca = CausalAttention(3, 2, 6, 0.0)
    context_vec = ca(batch)
    assert context_vec.shape == (2, 6, 2)
    assert_close(context_vec[0], _ref(CAUSAL_REF), atol=1e-4, rtol=0)
    assert_close(context_vec[1], _ref(CAUSAL_REF), atol=1e-4, rtol=0)


def test_wrapper_reference_numbers(batch):
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
    context_vec = mha(batch)
    assert context_vec.shape == (2, 6, 4)
    assert_close(context_vec[0], _ref(WRAPPER_REF), atol=1e-4, rtol=0)


def test_multi_head_attention_reference_numbers(batch):
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    context_vec = mha(batch)
    assert context_vec.shape == (2, 6, 2)
    assert_close(context_vec[0], _ref(MHA_REF), atol=1e-4, rtol=0)
    # the readable path gives the same numbers
    assert_close(mha(batch, return_weights=True)[0][0], _ref(MHA_REF), atol=1e-4, rtol=0)


def test_v2_weights_copied_into_v1_give_the_same_output(inputs):
    torch.manual_seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    sa_v1 = SelfAttention_v1(3, 2)
    assert not torch.allclose(sa_v1(inputs), sa_v2(inputs))  # different before the copy
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)  # nn.Linear stores (d_out, d_in)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
    assert_close(sa_v1(inputs), sa_v2(inputs), atol=1e-6, rtol=0)


def test_multi_head_attention_equals_wrapper_plus_out_proj():
    """Splitting one projection into heads is the wrapper's heads side by side, then W^O."""
    torch.manual_seed(0)
    num_heads, head_dim, d_in = 3, 2, 5
    wrapper = MultiHeadAttentionWrapper(d_in, head_dim, 7, 0.0, num_heads, qkv_bias=True)
    mha = MultiHeadAttention(d_in, num_heads * head_dim, 7, 0.0, num_heads, qkv_bias=True)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            layers = [getattr(head, name) for head in wrapper.heads]
            getattr(mha, name).weight.copy_(torch.cat([lin.weight for lin in layers], dim=0))
            getattr(mha, name).bias.copy_(torch.cat([lin.bias for lin in layers], dim=0))
    x = torch.randn(2, 7, d_in)
    assert_close(mha(x), mha.out_proj(wrapper(x)), atol=1e-5, rtol=0)
    _, w_mha = mha(x, return_weights=True)
    _, w_wrapper = wrapper(x, return_weights=True)
    assert_close(w_mha, w_wrapper, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------


def _make(kind: str, d_in=3, d_out=4, context_length=8, dropout=0.0, num_heads=2):
    if kind == "v1":
        return SelfAttention_v1(d_in, d_out)
    if kind == "v2":
        return SelfAttention_v2(d_in, d_out)
    if kind == "causal":
        return CausalAttention(d_in, d_out, context_length, dropout)
    if kind == "wrapper":
        return MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads)
    return MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads)


@pytest.mark.parametrize(
    ("kind", "out_features"),
    [("v1", 4), ("v2", 4), ("causal", 4), ("wrapper", 8), ("mha", 4)],
)
def test_output_shapes_batched(kind, out_features):
    module = _make(kind)
    assert module(torch.randn(5, 7, 3)).shape == (5, 7, out_features)


@pytest.mark.parametrize(
    ("kind", "out_features"), [("v1", 4), ("v2", 4), ("causal", 4), ("wrapper", 8)]
)
def test_output_shapes_unbatched(kind, out_features):
    module = _make(kind)
    x = torch.randn(7, 3)
    out = module(x)
    assert out.shape == (7, out_features)
    assert_close(out, module(x.unsqueeze(0))[0])  # same as a batch of one


@pytest.mark.parametrize(
    ("kind", "weights_shape"),
    [("causal", (5, 7, 7)), ("wrapper", (5, 2, 7, 7)), ("mha", (5, 2, 7, 7))],
)
def test_returned_weights_shape_rows_sum_to_one_and_hide_the_future(kind, weights_shape):
    module = _make(kind)
    context_vec, attn_weights = module(torch.randn(5, 7, 3), return_weights=True)
    assert context_vec.shape[:2] == (5, 7)
    assert attn_weights.shape == weights_shape
    assert_close(attn_weights.sum(-1), torch.ones(weights_shape[:-1]))
    future = ~causal_mask(7)
    assert torch.all(attn_weights[..., future] == 0)
    assert torch.all(attn_weights[..., ~future] > 0)


def test_returned_weights_unbatched_wrapper_and_causal():
    x = torch.randn(4, 3)
    _, w_causal = _make("causal")(x, return_weights=True)
    _, w_wrapper = _make("wrapper")(x, return_weights=True)
    assert w_causal.shape == (4, 4)
    assert w_wrapper.shape == (2, 4, 4)


@pytest.mark.parametrize("kind", ["v1", "v2", "causal", "wrapper", "mha"])
def test_forward_does_not_mutate_input(kind):
    x = torch.randn(2, 5, 3)
    before = x.clone()
    _make(kind)(x)
    assert torch.equal(x, before)


# ---------------------------------------------------------------------------
# Causality (property test) and fast vs readable paths
# ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["causal", "wrapper", "mha"]),
    batch_size=st.integers(1, 3),
    num_tokens=st.integers(1, 9),
    d_in=st.integers(1, 6),
    head_dim=st.integers(1, 4),
    num_heads=st.integers(1, 3),
    data=st.data(),
)
def test_changing_token_t_changes_no_output_before_t(
    kind, batch_size, num_tokens, d_in, head_dim, num_heads, data
):
    t = data.draw(st.integers(0, num_tokens - 1), label="t")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d_out = head_dim * num_heads if kind == "mha" else head_dim
    module = _make(kind, d_in, d_out, context_length=num_tokens, num_heads=num_heads).eval()
    x = torch.randn(batch_size, num_tokens, d_in, generator=gen)
    x_changed = x.clone()
    x_changed[:, t] += 1.0 + torch.rand(batch_size, d_in, generator=gen)
    out, out_changed = module(x), module(x_changed)
    assert_close(out[:, :t], out_changed[:, :t], atol=1e-6, rtol=0)
    assert not torch.equal(out[:, t:], out_changed[:, t:])  # the change is seen from t on


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mha_fast_and_readable_paths_agree_in_eval_mode(qkv_bias):
    torch.manual_seed(1)
    mha = MultiHeadAttention(12, 12, 10, 0.3, num_heads=4, qkv_bias=qkv_bias).eval()
    x = torch.randn(3, 9, 12, requires_grad=True)
    fast = mha(x)
    readable, _ = mha(x, return_weights=True)
    assert_close(fast, readable, atol=1e-6, rtol=1e-5)
    # and so do their input gradients
    g = torch.randn_like(fast)
    (grad_fast,) = torch.autograd.grad(fast, x, g)
    (grad_readable,) = torch.autograd.grad(readable, x, g)
    assert_close(grad_fast, grad_readable, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mha_fused_fast_path_gives_each_parameter_the_readable_paths_gradient(qkv_bias):
    torch.manual_seed(11)
    mha = MultiHeadAttention(10, 12, 9, 0.0, num_heads=3, qkv_bias=qkv_bias).double()
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    g = torch.randn(2, 9, 12, dtype=torch.float64)
    params = dict(mha.named_parameters())
    fast = mha(x)
    grads_fast = torch.autograd.grad(fast, list(params.values()), g)
    readable, _ = mha(x, return_weights=True)
    grads_readable = torch.autograd.grad(readable, list(params.values()), g)
    assert_close(fast, readable, atol=1e-12, rtol=1e-10)
    for name, gf, gr in zip(params, grads_fast, grads_readable, strict=True):
        assert gf.abs().sum() > 0, name  # every parameter is reached
        assert_close(gf, gr, atol=1e-12, rtol=1e-10, msg=name)


def _aten_calls(fn) -> list[tuple[str, list]]:
    """The ATen operators ``fn()`` runs, with their input shapes (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [(e.name, e.input_shapes) for e in prof.events()]


def test_mha_fast_path_projects_with_one_matmul_and_keeps_three_linears():
    torch.manual_seed(12)
    mha = MultiHeadAttention(6, 8, 5, 0.0, num_heads=2).eval()
    x = torch.randn(2, 5, 6)
    calls = _aten_calls(lambda: mha(x))
    weights = [shapes[1] for name, shapes in calls if name == "aten::linear"]
    assert weights == [[24, 6], [8, 8]]  # one fused (3 * d_out, d_in) projection, then out_proj
    assert [n for n, _ in mha.named_parameters()] == [
        "W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"
    ]


def test_mha_fast_path_sees_a_parameter_changed_in_place():
    torch.manual_seed(13)
    mha = MultiHeadAttention(4, 4, 6, 0.0, num_heads=2).eval()
    x = torch.randn(1, 6, 4)
    before = mha(x)
    with torch.no_grad():
        mha.W_value.weight.data.mul_(2.0)  # .data does not bump the version counter
    after = mha(x)
    assert_close(after, mha(x, return_weights=True)[0], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(before, after)


def _shares_storage(module) -> bool:
    ptrs = [p.untyped_storage().data_ptr() for p in module.parameters()]
    return len(set(ptrs)) != len(ptrs)


def test_mha_parameters_own_their_storage_through_to_and_loading():
    # Issue 27: no storage aliasing; .to() and load_state_dict(assign=True) are plain.
    torch.manual_seed(14)
    mha = MultiHeadAttention(5, 6, 4, 0.0, num_heads=2, qkv_bias=True)
    torch.manual_seed(14)
    reference = [nn.Linear(5, 6, bias=True) for _ in range(3)]  # the book's creation order
    assert torch.equal(mha.W_key.weight, reference[1].weight)
    assert not _shares_storage(mha)
    mha.double()
    assert not _shares_storage(mha) and mha.W_value.weight.dtype == torch.float64
    for assign in (False, True):
        other = MultiHeadAttention(5, 6, 4, 0.0, num_heads=2, qkv_bias=True).double()
        other.load_state_dict(mha.state_dict(), assign=assign)
        assert torch.equal(other.W_value.bias, mha.W_value.bias)
        x = torch.randn(2, 4, 5, dtype=torch.float64)
        with torch.no_grad():
            assert_close(other(x), mha(x), atol=1e-12, rtol=1e-10)


def test_mha_fast_path_without_gradients_projects_with_the_three_layers_and_copies_nothing():
    torch.manual_seed(15)
    mha = MultiHeadAttention(6, 8, 5, 0.0, num_heads=2, qkv_bias=True).eval()
    x = torch.randn(2, 5, 6)
    expected = mha(x, return_weights=True)[0]
    with torch.no_grad():
        out = mha(x)
        calls = _aten_calls(lambda: mha(x))
        assert "aten::cat" not in {name for name, _ in calls}
        assert [shapes[1] for name, shapes in calls if name == "aten::linear"] == [
            [8, 6], [8, 6], [8, 6], [8, 8]]
        mha.W_key.weight.data.mul_(3.0)  # an edit the next call must see
        out_edited = mha(x)
    assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert_close(out_edited, mha(x, return_weights=True)[0], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(out, out_edited)


def test_mha_fast_path_with_gradients_is_one_gemm_of_the_concatenated_weights():
    torch.manual_seed(17)
    mha = MultiHeadAttention(6, 8, 5, 0.0, num_heads=2, qkv_bias=True).double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 5, 8, dtype=torch.float64)
    # Two cats (weights, biases) in the forward; one in the backward: split's.
    assert [n for n, _ in _aten_calls(lambda: mha(x))].count("aten::cat") == 2
    mha(x).backward(g)
    grads = {name: p.grad.clone() for name, p in mha.named_parameters()}
    grad_x = x.grad.clone()
    reference = copy.deepcopy(mha)
    x2 = x.detach().clone().requires_grad_(True)
    reference(x2, return_weights=True)[0].backward(g)
    for name, p in reference.named_parameters():
        assert_close(grads[name], p.grad, atol=1e-12, rtol=1e-10, msg=name)
    assert_close(grad_x, x2.grad, atol=1e-12, rtol=1e-10)
    # x's gradient is the one GEMM's (the numbers of a layer with one packed weight).
    w = torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]).detach()
    b = torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]).detach()
    packed = copy.deepcopy(mha)
    x3 = x.detach().clone().requires_grad_(True)

    def one_weight(inputs, context=None, fused=True):  # ONE packed weight
        return torch.nn.functional.linear(inputs, w, b).split(8, dim=-1)

    packed.project = one_weight
    packed(x3).backward(g)
    assert torch.equal(x3.grad, grad_x)  # bit for bit: the same GEMMs


@pytest.mark.parametrize("grad", [False, True])
def test_mha_fast_path_follows_a_parameter_given_new_storage(grad):
    torch.manual_seed(19)
    mha = MultiHeadAttention(6, 8, 5, 0.0, num_heads=2, qkv_bias=True).eval()
    x = torch.randn(2, 5, 6)
    new_weight = torch.randn(8, 6)
    mha.W_value.weight.data = new_weight
    with torch.set_grad_enabled(grad):
        out = mha(x)
        expected = mha(x, return_weights=True)[0]
    assert_close(out, expected, atol=1e-6, rtol=1e-5)
    if grad:
        out.sum().backward()
        assert mha.W_value.weight.grad is not None and mha.W_key.weight.grad is not None
    assert torch.equal(mha.W_value.weight, new_weight)


def test_mha_fast_and_readable_paths_agree_in_train_mode_without_dropout():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2)
    assert mha.training
    x = torch.randn(2, 16, 8)
    assert_close(mha(x), mha(x, return_weights=True)[0], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["causal", "mha"])
def test_dropout_zeroes_and_rescales_weights_in_train_mode_only(kind):
    torch.manual_seed(3)
    module = _make(kind, d_in=3, d_out=4, context_length=6, dropout=0.5)
    x = torch.randn(2, 6, 3)
    module.eval()
    _, w_eval = module(x, return_weights=True)
    _, w_eval_again = module(x, return_weights=True)
    assert torch.equal(w_eval, w_eval_again)  # deterministic in eval mode
    module.train()
    _, w_train = module(x, return_weights=True)
    allowed = causal_mask(6).expand_as(w_train)
    dropped = (w_train == 0) & allowed
    kept = (w_train != 0) & allowed
    assert dropped.any() and kept.any()
    assert_close(w_train[kept], 2.0 * w_eval[kept])  # kept weights scaled by 1 / (1 - 0.5)


def test_mha_fast_path_dropout_acts_in_train_mode_only():
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 8, 12, 0.5, num_heads=2)
    x = torch.randn(2, 12, 8)
    train_out = mha(x)
    mha.eval()
    eval_out = mha(x)
    assert not torch.allclose(train_out, eval_out)
    assert torch.equal(eval_out, mha(x))
    without_dropout = copy.deepcopy(mha)
    without_dropout.dropout_p = 0.0
    assert_close(eval_out, without_dropout.train()(x))  # eval mode = no dropout


def test_causal_attention_eval_mode_ignores_dropout():
    torch.manual_seed(5)
    ca = CausalAttention(3, 4, 6, 0.5).eval()
    no_dropout = CausalAttention(3, 4, 6, 0.0)
    no_dropout.load_state_dict(ca.state_dict())
    x = torch.randn(2, 6, 3)
    assert_close(ca(x), no_dropout(x))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: SelfAttention_v1(0, 2), r"d_in=0"),
        (lambda: SelfAttention_v1(3, -1), r"d_out=-1"),
        (lambda: CausalAttention(3, 2, 0, 0.0), r"context_length=0"),
        (lambda: CausalAttention(3, 2, 6, 1.0), r"in \[0, 1\), got dropout=1.0"),
        (lambda: CausalAttention(3, 2, 6, -0.1), r"dropout=-0.1"),
        (lambda: MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=0), r"num_heads=0"),
        (
            lambda: MultiHeadAttention(3, 5, 6, 0.0, num_heads=2),
            r"d_out=5 is not divisible by num_heads=2",
        ),
        (lambda: MultiHeadAttention(0, 4, 6, 0.0, num_heads=2), r"d_in=0"),
        (lambda: MultiHeadAttention(3, 0, 6, 0.0, num_heads=2), r"d_out=0"),
        (lambda: MultiHeadAttention(3, 4, 6, 0.0, num_heads=-2), r"num_heads=-2"),
        (lambda: MultiHeadAttention(3, 4, -6, 0.0, num_heads=2), r"context_length=-6"),
        (lambda: MultiHeadAttention(3, 4, 6, 1.5, num_heads=2), r"dropout=1.5"),
    ],
)
def test_constructor_value_errors_name_the_value(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


@pytest.mark.parametrize(
    "factory",
    [
        lambda: SelfAttention_v1(3.0, 2),
        lambda: SelfAttention_v2(3, True),
        lambda: SelfAttention_v2(3, 2, qkv_bias=1),
        lambda: CausalAttention(3, 2, 6, "0.1"),
        lambda: MultiHeadAttention(3, 4, 6, 0.0, num_heads=2.0),
        lambda: MultiHeadAttention(3, 4, 6, 0.0, 2, out_bias=None),
    ],
)
def test_constructor_type_errors(factory):
    with pytest.raises(TypeError, match=r"must be a"):
        factory()


@pytest.mark.parametrize("kind", ["v1", "v2", "causal", "wrapper", "mha"])
def test_wrong_d_in_names_both_sizes(kind):
    with pytest.raises(ValueError, match=r"x.shape\[-1\]=5 does not match d_in=3"):
        _make(kind)(torch.randn(2, 4, 5))


@pytest.mark.parametrize("kind", ["causal", "wrapper", "mha"])
def test_too_many_tokens_names_both_numbers(kind):
    with pytest.raises(ValueError, match=r"num_tokens=9 exceeds context_length=8"):
        _make(kind, context_length=8)(torch.randn(1, 9, 3))


@pytest.mark.parametrize(
    ("kind", "shape", "match"),
    [
        ("mha", (4, 3), r"\(batch, num_tokens, d_in\), got 2-D shape \(4, 3\)"),
        ("mha", (1, 2, 4, 3), r"got 4-D shape \(1, 2, 4, 3\)"),
        ("v1", (3,), r"\(num_tokens, d_in\) or \(batch, num_tokens, d_in\), got 1-D"),
        ("causal", (1, 1, 4, 3), r"got 4-D shape"),
        ("v2", (2, 0, 3), r"at least one token"),
    ],
)
def test_wrong_rank_or_empty_input(kind, shape, match):
    with pytest.raises(ValueError, match=match):
        _make(kind)(torch.randn(shape))


@pytest.mark.parametrize("kind", ["v1", "causal", "mha"])
def test_non_float_or_non_tensor_input_is_a_type_error(kind):
    module = _make(kind)
    with pytest.raises(TypeError, match=r"floating-point dtype, got torch.int64"):
        module(torch.ones(1, 4, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        module([[[0.0, 0.0, 0.0]]])


@pytest.mark.parametrize("kind", ["causal", "wrapper", "mha"])
def test_return_weights_must_be_bool(kind):
    with pytest.raises(TypeError, match=r"return_weights must be a bool, got str"):
        _make(kind)(torch.randn(1, 4, 3), return_weights="yes")


# ---------------------------------------------------------------------------
# Mask buffer, state_dict, parameter order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["causal", "mha"])
def test_mask_buffer_is_bool_saved_and_moves_with_to(kind):
    module = _make(kind, context_length=5)
    assert module.mask.dtype == torch.bool
    assert torch.equal(module.mask, causal_mask(5))  # True = may attend
    assert "mask" in dict(module.named_buffers())
    # persistent, like the reference implementation's buffer
    assert torch.equal(module.state_dict()["mask"], causal_mask(5))
    module.to(torch.float64)
    assert module.mask.dtype == torch.bool  # a dtype cast leaves the bool mask alone
    assert module.W_query.weight.dtype == torch.float64
    module.to("meta")
    assert module.mask.device.type == "meta"


def test_wrapper_state_dict_has_one_mask_per_head():
    wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=3)
    masks = [k for k in wrapper.state_dict() if k.endswith("mask")]
    assert masks == ["heads.0.mask", "heads.1.mask", "heads.2.mask"]


@pytest.mark.parametrize("kind", ["causal", "mha"])
def test_loading_a_reference_float_mask_keeps_our_causal_mask(kind):
    """The reference stores a float mask, 1 = blocked: loading it must not flip ours."""
    torch.manual_seed(6)
    module = _make(kind, context_length=6).eval()
    x = torch.randn(2, 6, 3)
    before = module(x)
    state = module.state_dict()
    state["mask"] = torch.triu(torch.ones(6, 6), diagonal=1)  # the reference's convention
    reloaded = copy.deepcopy(module)  # the load hook survives a deepcopy
    reloaded.load_state_dict(state)
    assert reloaded.mask.dtype == torch.bool
    assert torch.equal(reloaded.mask, causal_mask(6))
    assert_close(reloaded(x), before)
    assert state["mask"].dtype == torch.float32  # the caller's dict is left as it was
    state["mask"] = torch.ones(5, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=r"size mismatch for mask"):
        reloaded.load_state_dict(state)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (SelfAttention_v1(3, 2), ["W_query", "W_key", "W_value"]),
        (
            SelfAttention_v2(3, 2, qkv_bias=True),
            ["W_query.weight", "W_query.bias", "W_key.weight", "W_key.bias",
             "W_value.weight", "W_value.bias"],
        ),
        (CausalAttention(3, 2, 6, 0.0), ["W_query.weight", "W_key.weight", "W_value.weight"]),
        (
            MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2),
            ["heads.0.W_query.weight", "heads.0.W_key.weight", "heads.0.W_value.weight",
             "heads.1.W_query.weight", "heads.1.W_key.weight", "heads.1.W_value.weight"],
        ),
        (
            MultiHeadAttention(3, 2, 6, 0.0, num_heads=2),
            ["W_query.weight", "W_key.weight", "W_value.weight",
             "out_proj.weight", "out_proj.bias"],
        ),
    ],
    ids=["v1", "v2", "causal", "wrapper", "mha"],
)
def test_parameter_creation_order(module, names):
    assert [name for name, _ in module.named_parameters()] == names


def test_mha_out_bias_false_has_no_output_bias():
    mha = MultiHeadAttention(4, 4, 6, 0.0, num_heads=2, out_bias=False)
    assert mha.out_proj.bias is None
    assert mha.head_dim == 2


# ---------------------------------------------------------------------------
# Interop with torch.nn.MultiheadAttention
# ---------------------------------------------------------------------------


def _torch_causal(module: nn.MultiheadAttention, x: torch.Tensor, float_mask: bool = False):
    n = x.shape[1]
    if float_mask:
        mask = torch.zeros(n, n).masked_fill(~causal_mask(n), float("-inf"))
    else:
        mask = ~causal_mask(n)  # torch's bool masks are True = blocked
    return module(x, x, x, attn_mask=mask, need_weights=False)[0]


def _assert_same_outputs_and_input_grads(ours, theirs_fn, x):
    x_ours = x.clone().requires_grad_()
    x_theirs = x.clone().requires_grad_()
    out_ours, out_theirs = ours(x_ours), theirs_fn(x_theirs)
    assert_close(out_ours, out_theirs, atol=1e-5, rtol=0)
    g = torch.randn_like(out_ours)
    (grad_ours,) = torch.autograd.grad(out_ours, x_ours, g)
    (grad_theirs,) = torch.autograd.grad(out_theirs, x_theirs, g)
    assert_close(grad_ours, grad_theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("float_mask", [False, True])
def test_from_torch_matches_torch_outputs_and_gradients(bias, float_mask):
    torch.manual_seed(7)
    theirs = nn.MultiheadAttention(12, 3, dropout=0.25, bias=bias, batch_first=True)
    if bias:  # torch starts its biases at zero, which would hide a bias that is not copied
        nn.init.normal_(theirs.in_proj_bias)
        nn.init.normal_(theirs.out_proj.bias)
    theirs.eval()
    ours = MultiHeadAttention.from_torch(theirs, context_length=10)
    assert not ours.training and ours.dropout_p == 0.25
    assert (ours.W_query.bias is None) == (not bias) and (ours.out_proj.bias is None) == (not bias)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 9, 12)
    _assert_same_outputs_and_input_grads(ours, lambda t: _torch_causal(theirs, t, float_mask), x)


@pytest.mark.parametrize(
    ("qkv_bias", "out_bias"), [(False, True), (True, True), (False, False), (True, False)]
)
def test_to_torch_matches_our_outputs_and_gradients(qkv_bias, out_bias):
    torch.manual_seed(8)
    ours = MultiHeadAttention(8, 8, 12, 0.0, num_heads=2, qkv_bias=qkv_bias, out_bias=out_bias)
    theirs = ours.to_torch()
    assert theirs.batch_first and theirs.num_heads == 2 and theirs.training
    assert (theirs.in_proj_bias is not None) == (qkv_bias or out_bias)
    x = torch.randn(3, 11, 8)
    _assert_same_outputs_and_input_grads(ours, lambda t: _torch_causal(theirs, t), x)


def test_per_head_weights_match_torch():
    torch.manual_seed(9)
    theirs = nn.MultiheadAttention(8, 4, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(theirs, context_length=7)
    x = torch.randn(2, 7, 8)
    _, w_theirs = theirs(
        x, x, x, attn_mask=~causal_mask(7), need_weights=True, average_attn_weights=False
    )
    _, w_ours = ours(x, return_weights=True)
    assert w_ours.shape == w_theirs.shape == (2, 4, 7, 7)
    assert_close(w_ours, w_theirs, atol=1e-6, rtol=0)


def test_from_torch_copies_dtype_and_round_trips():
    torch.manual_seed(10)
    theirs = nn.MultiheadAttention(6, 2, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(theirs, context_length=5)
    assert ours.W_key.weight.dtype == torch.float64
    back = ours.to_torch()
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: nn.MultiheadAttention(8, 2), r"batch_first=True, got batch_first=False"),
        (lambda: nn.MultiheadAttention(8, 2, batch_first=True, kdim=4), r"kdim=4"),
        (lambda: nn.MultiheadAttention(8, 2, batch_first=True, vdim=6), r"vdim=6"),
        (lambda: nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True), r"add_bias_kv"),
        (
            lambda: nn.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True),
            r"add_zero_attn",
        ),
    ],
)
def test_from_torch_rejects_unsupported_configs(make, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention.from_torch(make(), context_length=4)


def test_from_torch_type_and_context_length_errors():
    with pytest.raises(TypeError, match=r"torch.nn.MultiheadAttention, got torch.nn.Linear"):
        MultiHeadAttention.from_torch(nn.Linear(4, 4), context_length=4)
    with pytest.raises(ValueError, match=r"context_length=0"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(4, 2, batch_first=True), 0)


def test_to_torch_needs_d_in_equal_to_d_out():
    with pytest.raises(ValueError, match=r"d_in=3 and d_out=4"):
        MultiHeadAttention(3, 4, 6, 0.0, num_heads=2).to_torch()
