"""The shared argument checks (attnlib._validation) and the defects a peer test suite found.

Each test below failed before its fix: a float mask whose row is all -inf gave
nan, softmax over an empty dimension raised IndexError, NumPy bools and ints
were refused (with the message "must be a bool, got bool"), and a dtype
mismatch reached torch's matmul error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib
from attnlib import _validation as V
from attnlib import functional as AF


def test_float_mask_with_a_fully_masked_row_gives_zeros_like_torch():
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(3, 3, dtype=torch.float64)
    mask[1] = float("-inf")  # query 1 may attend to no key
    ours = AF.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    theirs = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    assert not torch.isnan(ours).any()
    torch.testing.assert_close(ours, theirs)
    assert torch.equal(ours[:, 1], torch.zeros(2, 4, dtype=torch.float64))


def test_float_mask_with_a_fully_masked_row_has_finite_gradients():
    torch.manual_seed(1)
    query, key, value = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
                         for _ in range(3))
    mask = torch.zeros(3, 3, dtype=torch.float64)
    mask[0] = float("-inf")
    AF.scaled_dot_product_attention(query, key, value, attn_mask=mask).sum().backward()
    for t in (query, key, value):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(query.grad[0], torch.zeros(4, dtype=torch.float64))


def test_no_keys_at_all_gives_zeros_like_torch():
    query = torch.randn(2, 3, 4, dtype=torch.float64)
    key = torch.randn(2, 0, 4, dtype=torch.float64)
    value = torch.randn(2, 0, 5, dtype=torch.float64)
    ours, weights = AF.scaled_dot_product_attention(query, key, value, return_weights=True)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(query, key, value))
    assert ours.shape == (2, 3, 5) and weights.shape == (2, 3, 0)


def test_a_row_of_nan_scores_stays_nan_rather_than_silently_zero():
    query = torch.full((1, 3), float("nan"), dtype=torch.float64)
    key = torch.randn(2, 3, dtype=torch.float64)
    value = torch.randn(2, 2, dtype=torch.float64)
    assert torch.isnan(AF.scaled_dot_product_attention(query, key, value)).all()


@pytest.mark.parametrize("fn", [AF.softmax, AF.softmax_naive], ids=["softmax", "softmax_naive"])
@pytest.mark.parametrize("shape, dim", [((0,), 0), ((3, 0), -1), ((0, 4), 0)])
def test_softmax_of_an_empty_dimension_is_empty_like_torch(fn, shape, dim):
    x = torch.empty(shape)
    out = fn(x, dim=dim)
    assert out.shape == torch.softmax(x, dim=dim).shape == x.shape
    assert out.dtype == x.dtype


def test_numpy_bools_and_ints_are_accepted_like_python_ones():
    module = attnlib.SelfAttention_v2(3, 2, qkv_bias=np.bool_(True))
    assert module.W_query.bias is not None
    assert torch.equal(AF.causal_mask(np.int64(3)), AF.causal_mask(3))
    assert attnlib.MultiHeadAttention(np.int64(4), np.int64(4), np.int64(5), 0.0,
                                      num_heads=np.int32(2)).num_heads == 2


@pytest.mark.parametrize(
    "value, name",
    [(np.float64(1.0), "numpy.float64"), (1, "int"), ("yes", "str"), (torch.tensor(True), "torch.Tensor")],
)
def test_a_wrong_bool_is_named_in_full(value, name):
    with pytest.raises(TypeError, match=rf"qkv_bias must be a bool, got {name} qkv_bias="):
        attnlib.SelfAttention_v2(3, 2, qkv_bias=value)


def test_a_wrong_int_is_named_in_full():
    with pytest.raises(TypeError, match=r"num_tokens must be an int, got numpy.float32"):
        AF.causal_mask(np.float32(3))
    with pytest.raises(TypeError, match=r"d_in must be an int, got float d_in=3.0"):
        attnlib.SelfAttention_v1(3.0, 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: attnlib.SelfAttention_v1(3, 2),
        lambda: attnlib.SelfAttention_v2(3, 2),
        lambda: attnlib.CausalAttention(3, 2, 6, 0.0),
        lambda: attnlib.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2),
        lambda: attnlib.MultiHeadAttention(3, 4, 6, 0.0, num_heads=2),
    ],
    ids=["v1", "v2", "causal", "wrapper", "mha"],
)
def test_an_input_of_another_dtype_is_named_before_torch_sees_it(make):
    module = make()
    x = torch.rand(1, 6, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"x has dtype torch.float64 but the module's parameters "
                                         r"are torch.float32"):
        module(x)


def test_type_name():
    assert V.type_name(3) == "int"
    assert V.type_name(np.int64(3)) == "numpy.int64"
    assert V.type_name(torch.zeros(1)) == "torch.Tensor"
    # PyTorch types by their public path, not the module that defines them
    assert V.type_name(torch.nn.Linear(1, 1)) == "torch.nn.Linear"
    assert V.type_name(torch.nn.Parameter(torch.zeros(1))) == "torch.nn.Parameter"
    assert V.type_name(torch.float32) == "torch.dtype"


def test_no_message_names_a_type_by_its_bare_name():
    # Every "got <type>" in attnlib's own modules comes from type_name (full names):
    # no f-string formats type(x).__name__ (comparing it with a name is not a message).
    import pathlib
    import re

    root = pathlib.Path(AF.__file__).parent
    offenders = [str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
                 if re.search(r"\{type\([^)]*\)\.__name__", path.read_text())]
    assert offenders == []


def test_sdpa_inputs_are_checked_in_one_place():
    # the reference and the tiled FlashAttention share one checker, so one message
    assert AF.check_sdpa_inputs is V.check_sdpa_inputs
    q = torch.randn(1, 3, 4)
    for fn in (AF.scaled_dot_product_attention, AF.flash_attention):
        with pytest.raises(ValueError, match="query and key must have the same d_k"):
            fn(q, torch.randn(1, 3, 5), torch.randn(1, 3, 4))


def test_check_dropout_and_positive_int_return_python_values():
    assert V.check_positive_int("n", np.int64(3)) == 3 and type(V.check_positive_int("n", np.int64(3))) is int
    assert V.check_dropout(np.float32(0.5)) == 0.5
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got dropout=1.0"):
        V.check_dropout(1.0)
    with pytest.raises(TypeError, match=r"dropout must be a float, got bool"):
        V.check_dropout(True)
