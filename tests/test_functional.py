"""Tests for attnlib.functional: softmax, simplified attention, masks, and the
reference scaled dot-product attention against PyTorch's own."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import functional as AF

# The reference numbers of the running example (Raschka 2024, section 3.3).
JOURNEY_ATTN_SCORES_2 = [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]
JOURNEY_ATTN_WEIGHTS_2 = [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]
JOURNEY_CONTEXT_VEC_2 = [0.4419, 0.6515, 0.5683]


# ---------------------------------------------------------------- softmax


def test_softmax_matches_torch_on_random_input():
    x = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(0))
    for dim in (0, 1, 2, -1):
        torch.testing.assert_close(AF.softmax(x, dim=dim), torch.softmax(x, dim=dim))
        torch.testing.assert_close(AF.softmax_naive(x, dim=dim), torch.softmax(x, dim=dim))


def test_naive_softmax_overflows_where_stable_softmax_does_not():
    x = torch.tensor([10.0, 100.0, 1000.0])
    naive = AF.softmax_naive(x)
    assert torch.isnan(naive).any(), "exp(1000) overflows float32, so inf/inf = nan"
    stable = AF.softmax(x)
    torch.testing.assert_close(stable, torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(stable, torch.softmax(x, dim=-1))


def test_softmax_is_shift_invariant_and_rows_sum_to_one():
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(AF.softmax(x), AF.softmax(x + 123.0))
    torch.testing.assert_close(AF.softmax(x).sum(-1), torch.ones(3))


def test_softmax_all_minus_inf_row_is_nan_like_torch():
    x = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, 2.0]])
    ours, theirs = AF.softmax(x), torch.softmax(x, dim=-1)
    assert torch.isnan(ours[0]).all() and torch.isnan(theirs[0]).all()
    torch.testing.assert_close(ours[1], theirs[1])


@pytest.mark.parametrize("fn", [AF.softmax, AF.softmax_naive])
def test_softmax_rejects_bad_input(fn):
    with pytest.raises(TypeError, match="torch.Tensor, got list"):
        fn([1.0, 2.0])
    with pytest.raises(TypeError, match="floating-point dtype, got torch.int64"):
        fn(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="dim=2 is out of range for a tensor with 2"):
        fn(torch.zeros(2, 3), dim=2)
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        fn(torch.zeros(2, 3), dim=1.0)


# ---------------------------------------------------------------- simplified attention


def test_simplified_attention_reproduces_the_journey_reference_numbers():
    inputs = attnlib.journey_embeddings()
    context_vecs, attn_weights = AF.simplified_attention(inputs)
    # The scores of query 2 are dot products with every token.
    torch.testing.assert_close(inputs @ inputs[1], torch.tensor(JOURNEY_ATTN_SCORES_2), atol=1e-4, rtol=0)
    torch.testing.assert_close(attn_weights[1], torch.tensor(JOURNEY_ATTN_WEIGHTS_2), atol=1e-4, rtol=0)
    torch.testing.assert_close(context_vecs[1], torch.tensor(JOURNEY_CONTEXT_VEC_2), atol=1e-4, rtol=0)


def test_simplified_attention_context_is_weighted_sum_of_inputs():
    inputs = attnlib.journey_embeddings()
    context_vecs, attn_weights = AF.simplified_attention(inputs)
    by_loop = torch.stack([sum(attn_weights[i, j] * inputs[j] for j in range(6)) for i in range(6)])
    torch.testing.assert_close(context_vecs, by_loop)
    torch.testing.assert_close(attn_weights.sum(-1), torch.ones(6))
    assert not torch.allclose(attn_weights, attn_weights.T), "row-normalised weights are not symmetric"


def test_simplified_attention_batched_equals_per_example():
    x = torch.rand(3, 5, 4, generator=torch.Generator().manual_seed(2))
    context_vecs, attn_weights = AF.simplified_attention(x)
    assert context_vecs.shape == (3, 5, 4) and attn_weights.shape == (3, 5, 5)
    for b in range(3):
        c_b, w_b = AF.simplified_attention(x[b])
        torch.testing.assert_close(context_vecs[b], c_b)
        torch.testing.assert_close(attn_weights[b], w_b)


def test_simplified_attention_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"got shape \(3,\)"):
        AF.simplified_attention(torch.zeros(3))
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 3, 4\)"):
        AF.simplified_attention(torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="at least one token"):
        AF.simplified_attention(torch.zeros(0, 3))


# ---------------------------------------------------------------- causal mask


def test_causal_mask_is_lower_triangle_true_means_may_attend():
    mask = AF.causal_mask(4)
    assert mask.dtype == torch.bool
    expected = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(mask, expected)
    assert torch.equal(AF.causal_mask(2, 3), torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool))


def test_causal_mask_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got num_tokens=-1"):
        AF.causal_mask(-1)
    with pytest.raises(TypeError, match="num_tokens must be an int, got float"):
        AF.causal_mask(3.0)
    with pytest.raises(TypeError, match="num_tokens_kv must be an int, got bool"):
        AF.causal_mask(3, True)


# ---------------------------------------------------------------- scaled dot-product attention


def _qkv(shape_q, shape_kv, d_v=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g, dtype=dtype)
    k = torch.randn(*shape_kv, generator=g, dtype=dtype)
    v_shape = (*shape_kv[:-1], d_v if d_v is not None else shape_kv[-1])
    v = torch.randn(*v_shape, generator=g, dtype=dtype)
    return q, k, v


@settings(max_examples=40, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    num_tokens_q=st.integers(1, 7),
    num_tokens_kv=st.integers(1, 7),
    d_k=st.integers(1, 9),
    d_v=st.integers(1, 9),
    mask_kind=st.sampled_from(["none", "causal", "bool", "float"]),
    use_scale=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sdpa_matches_torch(batch, num_tokens_q, num_tokens_kv, d_k, d_v, mask_kind, use_scale, seed):
    q, k, v = _qkv((*batch, num_tokens_q, d_k), (*batch, num_tokens_kv, d_k), d_v=d_v, seed=seed)
    kwargs = {"scale": 0.37} if use_scale else {}
    g = torch.Generator().manual_seed(seed + 1)
    if mask_kind == "causal":
        kwargs["is_causal"] = True
    elif mask_kind == "bool":
        mask = torch.rand(num_tokens_q, num_tokens_kv, generator=g) > 0.3
        mask[:, 0] = True  # every query sees at least one key
        kwargs["attn_mask"] = mask
    elif mask_kind == "float":
        kwargs["attn_mask"] = torch.randn(num_tokens_q, num_tokens_kv, generator=g, dtype=q.dtype)
    ours, weights = AF.scaled_dot_product_attention(q, k, v, return_weights=True, **kwargs)
    theirs = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(ours, theirs)
    assert weights.shape == (*batch, num_tokens_q, num_tokens_kv)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=q.dtype))


def test_sdpa_gradients_match_torch():
    q, k, v = _qkv((2, 3, 5, 4), (2, 3, 6, 4), seed=3)
    grads = []
    for fn in (AF.scaled_dot_product_attention, F.scaled_dot_product_attention):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, is_causal=True).pow(2).sum().backward()
        grads.append([t.grad for t in leaves])
    for ours, theirs in zip(*grads, strict=False):
        torch.testing.assert_close(ours, theirs)


def test_sdpa_default_scale_is_one_over_sqrt_dk():
    q, k, v = _qkv((3, 8), (4, 8), seed=4)
    _, weights = AF.scaled_dot_product_attention(q, k, v, return_weights=True)
    expected = torch.softmax(q @ k.T / math.sqrt(8), dim=-1)
    torch.testing.assert_close(weights, expected)


def test_sdpa_fully_masked_row_gives_zeros_like_torch():
    q, k, v = _qkv((3, 4), (5, 4), seed=5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    ours, weights = AF.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
    assert torch.equal(weights[1], torch.zeros(5, dtype=q.dtype))
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_sdpa_bool_mask_equals_float_mask_of_minus_inf():
    q, k, v = _qkv((4, 3), (4, 3), seed=6)
    allowed = AF.causal_mask(4)
    additive = torch.zeros(4, 4, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
        AF.scaled_dot_product_attention(q, k, v, attn_mask=additive),
    )
    torch.testing.assert_close(
        AF.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
        AF.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_sdpa_does_not_mutate_its_inputs():
    q, k, v = _qkv((4, 3), (4, 3), seed=7)
    mask = AF.causal_mask(4)
    copies = [t.clone() for t in (q, k, v, mask)]
    AF.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5)
    for before, after in zip(copies, (q, k, v, mask), strict=False):
        assert torch.equal(before, after)


def test_sdpa_dropout_zeroes_weights_and_rescales_the_rest():
    torch.manual_seed(0)
    p = 0.25
    q, k, v = _qkv((64, 16), (64, 16), seed=8, dtype=torch.float32)
    _, clean = AF.scaled_dot_product_attention(q, k, v, return_weights=True)
    _, dropped = AF.scaled_dot_product_attention(q, k, v, dropout_p=p, return_weights=True)
    zeroed = dropped == 0
    fraction = zeroed.float().mean().item()
    # 4096 independent Bernoulli(0.25) draws: standard error 0.0068; allow 5 of them.
    assert abs(fraction - p) < 5 * math.sqrt(p * (1 - p) / zeroed.numel())
    torch.testing.assert_close(dropped[~zeroed], clean[~zeroed] / (1 - p))


def test_sdpa_without_dropout_is_deterministic():
    q, k, v = _qkv((5, 4), (5, 4), seed=9)
    assert torch.equal(
        AF.scaled_dot_product_attention(q, k, v), AF.scaled_dot_product_attention(q, k, v)
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"query": torch.zeros(2, 3), "key": torch.zeros(2, 4)}, ValueError, r"same d_k, got query \(2, 3\) and key \(2, 4\)"),
        ({"key": torch.zeros(5, 3)}, ValueError, r"same num_tokens_kv, got key \(5, 3\) and value \(2, 3\)"),
        ({"query": torch.zeros(2, 2, 3)}, ValueError, r"same leading \(batch, head\) dimensions, got \(2,\), \(\) and \(\)"),
        ({"value": torch.zeros(2, 3, dtype=torch.float64)}, TypeError, "must share a dtype"),
        ({"query": torch.zeros(2, 3, dtype=torch.int32)}, TypeError, "query must have a floating-point dtype, got torch.int32"),
        ({"key": [[0.0]]}, TypeError, "key must be a torch.Tensor, got list"),
        ({"value": torch.zeros(3)}, ValueError, r"value must have at least 2 dimension\(s\), got shape \(3,\)"),
        ({"dropout_p": 1.0}, ValueError, r"dropout_p must be in \[0, 1\), got 1.0"),
        ({"dropout_p": -0.1}, ValueError, r"dropout_p must be in \[0, 1\), got -0.1"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool, got int"),
        ({"scale": float("inf")}, ValueError, "scale must be finite, got inf"),
        ({"scale": "0.5"}, TypeError, "scale must be a float or None, got str"),
        ({"attn_mask": torch.ones(2, 2, dtype=torch.bool), "is_causal": True}, ValueError, "either attn_mask or is_causal"),
        ({"attn_mask": torch.ones(3, 2, dtype=torch.bool)}, ValueError, r"attn_mask of shape \(3, 2\) does not broadcast to the attention scores' shape \(2, 2\)"),
        ({"attn_mask": torch.ones(4, 2, 2, dtype=torch.bool)}, ValueError, r"attn_mask of shape \(4, 2, 2\) does not broadcast"),
        ({"attn_mask": torch.ones(2, 2, dtype=torch.float64)}, TypeError, "attn_mask must be bool or have the query's dtype torch.float32"),
        ({"attn_mask": torch.ones(2, 2, dtype=torch.int64)}, TypeError, "attn_mask must be bool or have the query's dtype"),
    ],
)
def test_sdpa_rejects_bad_input(kwargs, error, match):
    args = {"query": torch.zeros(2, 3), "key": torch.zeros(2, 3), "value": torch.zeros(2, 3)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        AF.scaled_dot_product_attention(**args)
