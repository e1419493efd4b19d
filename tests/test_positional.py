"""Tests for attnlib.positional: sinusoidal, learned and rotary position embeddings."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib.positional import (
    LearnedPositionalEmbedding,
    RotaryPositionalEmbedding,
    SinusoidalPositionalEncoding,
    check_base,
    check_float_dtype,
    check_tokens,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_offset_matrix,
)

SMALL = settings(max_examples=25, deadline=None)


# ---------------------------------------------------------------- sinusoidal_encoding


def test_shape_and_dtype():
    pe = sinusoidal_encoding(7, 10)
    assert pe.shape == (7, 10)
    assert pe.dtype == torch.float32
    assert sinusoidal_encoding(3, 4, dtype=torch.float64).dtype == torch.float64


def test_position_zero_is_zero_one_pairs():
    pe = sinusoidal_encoding(5, 8)
    expected = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(pe[0], expected, rtol=0, atol=0)


def test_first_pair_turns_one_radian_per_position():
    pe = sinusoidal_encoding(20, 6, dtype=torch.float64)
    positions = torch.arange(20, dtype=torch.float64)
    torch.testing.assert_close(pe[:, 0], torch.sin(positions))
    torch.testing.assert_close(pe[:, 1], torch.cos(positions))


def test_exact_values_from_the_paper_formula():
    d_model, base = 8, 10000.0
    pe = sinusoidal_encoding(40, d_model, base, dtype=torch.float64)
    for pos in (1, 7, 39):
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_known_numbers():
    # PE[1, 2] = sin(1 / 10000^(2/8)) = sin(0.1); PE[2, 1] = cos(2).
    pe = sinusoidal_encoding(3, 8)
    assert round(pe[1, 2].item(), 4) == 0.0998
    assert round(pe[2, 1].item(), 4) == -0.4161


def test_base_changes_the_frequencies():
    pe_small = sinusoidal_encoding(4, 4, base=100.0, dtype=torch.float64)
    # omega_1 = 100^(-2/4) = 0.1
    assert pe_small[3, 2].item() == pytest.approx(math.sin(0.3), abs=1e-12)
    assert not torch.equal(pe_small, sinusoidal_encoding(4, 4, dtype=torch.float64))


def test_odd_d_model_last_column_is_a_sine():
    d_model = 5
    pe = sinusoidal_encoding(12, d_model, dtype=torch.float64)
    positions = torch.arange(12, dtype=torch.float64)
    torch.testing.assert_close(pe[:, 4], torch.sin(positions / 10000.0 ** (4 / d_model)))
    torch.testing.assert_close(pe[:, 3], torch.cos(positions / 10000.0 ** (2 / d_model)))


def test_large_positions_keep_accuracy():
    pe = sinusoidal_encoding(100_001, 2)
    assert pe[100_000, 0].item() == pytest.approx(math.sin(100_000.0), abs=1e-6)


def test_rows_are_distinct():
    pe = sinusoidal_encoding(64, 16)
    distances = torch.cdist(pe, pe)
    off_diagonal = distances[~torch.eye(64, dtype=torch.bool)]
    assert off_diagonal.min() > 1e-3


def test_each_pair_has_unit_norm():
    pe = sinusoidal_encoding(30, 12)
    pair_norms = pe.view(30, 6, 2).norm(dim=-1)  # (num_positions, d_model / 2)
    torch.testing.assert_close(pair_norms, torch.ones(30, 6))


@SMALL
@given(
    num_positions=st.integers(1, 64),
    d_model=st.integers(1, 33),
    base=st.floats(2.0, 1e5),
)
def test_values_in_unit_interval_and_row_zero(num_positions, d_model, base):
    pe = sinusoidal_encoding(num_positions, d_model, base)
    assert pe.shape == (num_positions, d_model)
    assert torch.isfinite(pe).all()
    assert pe.abs().max() <= 1.0
    expected_row0 = torch.tensor([float(j % 2) for j in range(d_model)])
    torch.testing.assert_close(pe[0], expected_row0, rtol=0, atol=0)


def test_device_argument():
    pe = sinusoidal_encoding(3, 4, device="cpu")
    assert pe.device.type == "cpu"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_positions=0, d_model=4),
         ValueError, "num_positions must be a positive int, got num_positions=0"),
        (dict(num_positions=3, d_model=-2), ValueError, "d_model must be a positive int, got d_model=-2"),
        (dict(num_positions=3.0, d_model=4), TypeError, "num_positions must be an int, got float"),
        (dict(num_positions=3, d_model=True), TypeError, "d_model must be an int, got bool"),
        (dict(num_positions=3, d_model=4, base=0.0), ValueError, "base must be a finite positive"),
        (dict(num_positions=3, d_model=4, base=math.inf), ValueError, "got inf"),
        (dict(num_positions=3, d_model=4, base="10000"), TypeError,
         "base must be a float, got str"),
        (dict(num_positions=3, d_model=4, dtype=torch.int64), TypeError,
         "floating-point torch.dtype"),
    ],
)
def test_encoding_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_encoding(**kwargs)


# ---------------------------------------------------------------- relative positions


def test_offset_matrix_moves_every_position():
    pe = sinusoidal_encoding(50, 16, dtype=torch.float64)
    for k in (1, 3, 10):
        matrix = sinusoidal_offset_matrix(k, 16, dtype=torch.float64)
        torch.testing.assert_close(pe[k:], pe[:-k] @ matrix.T)
        torch.testing.assert_close(matrix @ pe[7], pe[7 + k])


def test_offset_property_pair_by_pair_by_least_squares():
    # Independently of attnlib's matrix: for each sin/cos pair, fit the best 2x2 map
    # from PE[pos] to PE[pos + k] over all positions; it must be exact and a rotation
    # by the angle k * omega_i.
    d_model, k = 8, 4
    pe = sinusoidal_encoding(60, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        now = pe[:-k, 2 * i : 2 * i + 2]  # (num_positions - k, 2)
        later = pe[k:, 2 * i : 2 * i + 2]
        solution = torch.linalg.lstsq(now, later).solution  # later = now @ solution
        torch.testing.assert_close(now @ solution, later, atol=1e-10, rtol=0)
        angle = k / 10000.0 ** (2 * i / d_model)
        rotation_t = torch.tensor(
            [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]],
            dtype=torch.float64,
        )
        torch.testing.assert_close(solution, rotation_t, atol=1e-8, rtol=0)


@SMALL
@given(
    half_d=st.integers(1, 12),
    offset=st.integers(-20, 20),
    base=st.floats(2.0, 1e5),
)
def test_offset_matrix_is_orthogonal_and_exact(half_d, offset, base):
    d_model = 2 * half_d
    matrix = sinusoidal_offset_matrix(offset, d_model, base, dtype=torch.float64)
    torch.testing.assert_close(matrix @ matrix.T, torch.eye(d_model, dtype=torch.float64))
    n = 21
    pe = sinusoidal_encoding(n + abs(offset), d_model, base, dtype=torch.float64)
    start = max(0, -offset)
    now = pe[start : start + n]  # positions pos
    later = pe[start + offset : start + offset + n]  # positions pos + offset
    torch.testing.assert_close(now @ matrix.T, later)


def test_offset_matrix_zero_is_identity_and_inverse_is_negative_offset():
    torch.testing.assert_close(sinusoidal_offset_matrix(0, 6), torch.eye(6))
    forward = sinusoidal_offset_matrix(5, 6, dtype=torch.float64)
    back = sinusoidal_offset_matrix(-5, 6, dtype=torch.float64)
    torch.testing.assert_close(forward @ back, torch.eye(6, dtype=torch.float64))


def test_offset_matrix_errors():
    with pytest.raises(ValueError, match="d_model=5 is odd"):
        sinusoidal_offset_matrix(1, 5)
    with pytest.raises(TypeError, match="offset must be an int, got float"):
        sinusoidal_offset_matrix(1.5, 4)
    with pytest.raises(ValueError, match="d_model must be a positive int, got d_model=0"):
        sinusoidal_offset_matrix(1, 0)


def test_frequencies_are_the_encodings_and_ropes():
    omegas = sinusoidal_frequencies(6, 100.0)
    assert omegas.dtype == torch.float64 and omegas.shape == (3,)
    torch.testing.assert_close(omegas, torch.tensor([1.0, 100.0 ** (-2 / 6), 100.0 ** (-4 / 6)],
                                                    dtype=torch.float64), rtol=1e-15, atol=0)
    # column 2i of the table turns omega_i radians per position (odd d_model: 3 pairs)
    pe = sinusoidal_encoding(4, 5, 100.0, dtype=torch.float64)
    angles = torch.arange(4, dtype=torch.float64)[:, None] * sinusoidal_frequencies(5, 100.0)
    torch.testing.assert_close(pe[:, 0::2], torch.sin(angles))
    rope = RotaryPositionalEmbedding(head_dim=6, context_length=3, base=100.0)
    torch.testing.assert_close(rope.cos[1, :3].double(), torch.cos(omegas), atol=1e-7, rtol=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: sinusoidal_frequencies(0), ValueError, "d_model must be a positive int"),
    (lambda: sinusoidal_frequencies(4, True), TypeError, "base must be a float, got bool"),
    (lambda: check_base(float("inf")), ValueError, "base must be a finite positive number"),
    (lambda: check_base(-1), ValueError, "base must be a finite positive number, got -1"),
    (lambda: check_float_dtype(torch.int64), TypeError,
     "dtype must be a floating-point torch.dtype, got torch.int64"),
    (lambda: check_tokens(torch.zeros(2, 5), 4, 8), ValueError, "d_model=4"),
    (lambda: check_tokens(torch.zeros(9, 4), 4, 8), ValueError, "more than context_length=8"),
    (lambda: check_tokens(torch.zeros(1, 2, 3, 4), 4, 8), ValueError, "got shape"),
    (lambda: check_tokens([0.0], 4, 8), TypeError, "x must be a torch.Tensor, got list"),
])
def test_the_public_checks_refuse_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_public_checks_pass_good_input():
    assert check_base(10000) is None and check_float_dtype(torch.bfloat16) is None
    assert check_tokens(torch.zeros(3, 8, 4), 4, 8) is None


# ---------------------------------------------------------------- SinusoidalPositionalEncoding


def test_sinusoidal_module_adds_the_table():
    torch.manual_seed(0)
    module = SinusoidalPositionalEncoding(d_model=6, context_length=10)
    x = torch.randn(2, 4, 6)
    out = module(x)
    expected = x + sinusoidal_encoding(10, 6)[:4]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # Each sequence in the batch gets the same positions.
    torch.testing.assert_close(out[0] - x[0], out[1] - x[1])


def test_sinusoidal_module_accepts_unbatched_input_and_does_not_mutate():
    x = attnlib.journey_embeddings()
    before = x.clone()
    out = SinusoidalPositionalEncoding(3, 6)(x)
    assert out.shape == (6, 3)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    torch.testing.assert_close(out, before + sinusoidal_encoding(6, 3), rtol=0, atol=0)


def test_sinusoidal_module_buffer_is_not_a_parameter():
    module = SinusoidalPositionalEncoding(8, 16)
    assert list(module.parameters()) == []
    assert "encoding" in dict(module.named_buffers())
    assert "encoding" not in module.state_dict()
    assert not module.encoding.requires_grad


def test_sinusoidal_module_follows_input_dtype_and_gradients_flow():
    module = SinusoidalPositionalEncoding(4, 5)
    x64 = torch.zeros(1, 3, 4, dtype=torch.float64, requires_grad=True)
    out = module(x64)
    assert out.dtype == torch.float64
    out.sum().backward()
    torch.testing.assert_close(x64.grad, torch.ones_like(x64))


def test_sinusoidal_module_repr():
    assert "context_length=16" in repr(SinusoidalPositionalEncoding(8, 16))


@SMALL
@given(
    batch=st.integers(1, 3),
    num_tokens=st.integers(1, 12),
    extra=st.integers(0, 5),
    d_model=st.integers(1, 16),
)
def test_sinusoidal_module_property(batch, num_tokens, extra, d_model):
    generator = torch.Generator().manual_seed(batch * 1000 + num_tokens * 10 + d_model)
    x = torch.randn(batch, num_tokens, d_model, generator=generator)
    out = SinusoidalPositionalEncoding(d_model, num_tokens + extra)(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out - x, sinusoidal_encoding(num_tokens, d_model).expand_as(x))


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.zeros(1, 4, 5), ValueError, "last dimension 5 .* d_model=6"),
        (torch.zeros(1, 11, 6), ValueError, "num_tokens=11, more than context_length=10"),
        (torch.zeros(6), ValueError, r"got shape \(6,\)"),
        (torch.zeros(1, 1, 4, 6), ValueError, r"got shape \(1, 1, 4, 6\)"),
        (torch.zeros(1, 4, 6, dtype=torch.long), TypeError,
         "floating-point dtype, got torch.int64"),
        ([[0.0] * 6], TypeError, "x must be a torch.Tensor, got list"),
    ],
)
def test_sinusoidal_module_forward_errors(x, error, match):
    with pytest.raises(error, match=match):
        SinusoidalPositionalEncoding(6, 10)(x)


def test_sinusoidal_module_constructor_errors():
    with pytest.raises(ValueError, match="context_length must be a positive int, got context_length=0"):
        SinusoidalPositionalEncoding(4, 0)
    with pytest.raises(ValueError, match="d_model must be a positive int, got d_model=-1"):
        SinusoidalPositionalEncoding(-1, 4)


# ---------------------------------------------------------------- LearnedPositionalEmbedding


def test_learned_parameter_count_and_shape():
    module = LearnedPositionalEmbedding(context_length=1024, d_model=768)
    assert sum(p.numel() for p in module.parameters()) == 1024 * 768
    assert module.embedding.weight.shape == (1024, 768)
    assert module.embedding.weight.requires_grad


def test_learned_adds_rows_zero_to_num_tokens():
    torch.manual_seed(123)
    module = LearnedPositionalEmbedding(8, 3)
    x = torch.randn(2, 5, 3)
    out = module(x)
    torch.testing.assert_close(out, x + module.embedding.weight[:5], rtol=0, atol=0)


def test_learned_is_seeded_and_trainable():
    torch.manual_seed(7)
    a = LearnedPositionalEmbedding(4, 2)
    torch.manual_seed(7)
    b = LearnedPositionalEmbedding(4, 2)
    torch.testing.assert_close(a.embedding.weight, b.embedding.weight, rtol=0, atol=0)
    out = a(torch.zeros(1, 3, 2))
    out.sum().backward()
    grad = a.embedding.weight.grad
    torch.testing.assert_close(grad[:3], torch.ones(3, 2))
    torch.testing.assert_close(grad[3], torch.zeros(2))  # position 3 was not used


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.zeros(1, 4, 5), ValueError, "last dimension 5 .* d_model=3"),
        (torch.zeros(9, 3), ValueError, "num_tokens=9, more than context_length=8"),
        (torch.zeros(1, 4, 3, dtype=torch.float64), TypeError, "dtype torch.float64 but the"),
        (torch.zeros(1, 4, 3, dtype=torch.int32), TypeError, "floating-point dtype"),
        ("tokens", TypeError, "x must be a torch.Tensor, got str"),
    ],
)
def test_learned_forward_errors(x, error, match):
    with pytest.raises(error, match=match):
        LearnedPositionalEmbedding(8, 3)(x)


def test_learned_constructor_errors():
    with pytest.raises(ValueError, match="context_length must be a positive int, got context_length=0"):
        LearnedPositionalEmbedding(0, 4)
    with pytest.raises(TypeError, match="d_model must be an int, got float"):
        LearnedPositionalEmbedding(4, 2.0)


# ---------------------------------------------------------------- why positions matter


def _shuffle_test_attention(x, w_q, w_k, w_v, **kwargs):
    return attnlib.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, **kwargs)


@SMALL
@given(num_tokens=st.integers(2, 10), d_in=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_attention_without_positions_is_permutation_equivariant(num_tokens, d_in, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, d_in, generator=generator, dtype=torch.float64)
    w_q, w_k, w_v = (
        torch.randn(d_in, 4, generator=generator, dtype=torch.float64) for _ in range(3)
    )
    perm = torch.randperm(num_tokens, generator=generator)
    out = _shuffle_test_attention(x, w_q, w_k, w_v)
    torch.testing.assert_close(_shuffle_test_attention(x[perm], w_q, w_k, w_v), out[perm])


def test_positions_break_permutation_equivariance():
    generator = torch.Generator().manual_seed(0)
    x = attnlib.journey_embeddings().double()
    w_q, w_k, w_v = (torch.randn(3, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    add_positions = SinusoidalPositionalEncoding(3, 6, dtype=torch.float64)
    out = _shuffle_test_attention(add_positions(x), w_q, w_k, w_v)
    shuffled = _shuffle_test_attention(add_positions(x[perm]), w_q, w_k, w_v)
    assert not torch.allclose(shuffled, out[perm], atol=1e-3)


def test_causal_mask_breaks_permutation_equivariance():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(3, 3, generator=generator, dtype=torch.float64) for _ in range(3))
    perm = torch.tensor([4, 3, 2, 1, 0])
    out = _shuffle_test_attention(x, w_q, w_k, w_v, is_causal=True)
    shuffled = _shuffle_test_attention(x[perm], w_q, w_k, w_v, is_causal=True)
    assert not torch.allclose(shuffled, out[perm], atol=1e-3)


# ---------------------------------------------------------------- RotaryPositionalEmbedding


def _rope_reference(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    """RoPE computed independently: complex rotation of adjacent pairs (the paper's
    layout) after the fixed permutation that takes the half-split layout there."""
    x = x.to(torch.float64)
    half = x.shape[-1] // 2
    # half-split (x1 | x2) -> adjacent pairs (x1[0], x2[0], x1[1], x2[1], ...)
    adjacent = torch.stack([x[..., :half], x[..., half:]], dim=-1)  # (..., n, half, 2)
    z = torch.view_as_complex(adjacent.contiguous())  # (..., n, half): x1 + i x2
    positions = torch.arange(offset, offset + x.shape[-2], dtype=torch.float64)
    theta = torch.tensor([base ** (-2 * i / x.shape[-1]) for i in range(half)],
                         dtype=torch.float64)
    rotation = torch.exp(1j * torch.outer(positions, theta))  # (n, half): e^{i m theta}
    rotated = torch.view_as_real(z * rotation)  # (..., n, half, 2)
    return torch.cat([rotated[..., 0], rotated[..., 1]], dim=-1)  # back to half-split


@pytest.mark.parametrize("offset", [0, 5])
def test_rope_matches_complex_rotation_of_adjacent_pairs_after_a_permutation(offset):
    gen = torch.Generator().manual_seed(0)
    rope = RotaryPositionalEmbedding(8, 32, base=100.0)
    x = torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        rope(x, offset=offset), _rope_reference(x, offset, base=100.0), atol=1e-12, rtol=0
    )


def test_rope_position_zero_is_the_identity_and_position_one_turns_pair_zero_one_radian():
    rope = RotaryPositionalEmbedding(4, 4)
    x = torch.eye(4, dtype=torch.float64)[:1].expand(2, 4)  # e_0 at positions 0 and 1
    out = rope(x)
    torch.testing.assert_close(out[0], x[0], atol=0, rtol=0)
    # pair 0 is components (0, 2) in the half-split layout; theta_0 = 1 rad
    expected = torch.tensor([math.cos(1.0), 0.0, math.sin(1.0), 0.0], dtype=torch.float64)
    torch.testing.assert_close(out[1], expected, atol=1e-15, rtol=0)


@SMALL
@given(m=st.integers(0, 40), n=st.integers(0, 40), shift=st.integers(0, 20))
def test_rope_scores_depend_only_on_the_offset(m, n, shift):
    gen = torch.Generator().manual_seed(1)
    rope = RotaryPositionalEmbedding(16, 64)
    q, k = torch.randn(2, 16, generator=gen, dtype=torch.float64)

    def score(pos_q, pos_k):
        return float(rope(q[None], offset=pos_q)[0] @ rope(k[None], offset=pos_k)[0])

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-12)


def test_rope_scores_do_change_with_the_offset():
    # the relative property is not trivially true: a different offset, a different score
    gen = torch.Generator().manual_seed(2)
    rope = RotaryPositionalEmbedding(16, 64)
    q, k = torch.randn(2, 1, 16, generator=gen, dtype=torch.float64)
    s0 = float(rope(q, 3) @ rope(k, 3).T)
    s1 = float(rope(q, 3) @ rope(k, 1).T)
    assert abs(s0 - s1) > 1e-3


def test_rope_keeps_norms_and_an_offset_equals_slicing_a_longer_call():
    gen = torch.Generator().manual_seed(3)
    rope = RotaryPositionalEmbedding(6, 20)
    x = torch.randn(2, 12, 6, generator=gen, dtype=torch.float64)
    out = rope(x)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(rope(x[:, 4:], offset=4), out[:, 4:], atol=0, rtol=0)
    assert not torch.allclose(rope(x[:, 4:]), out[:, 4:])  # the offset matters


def test_rope_keeps_dtype_shape_and_does_not_mutate_its_input():
    rope = RotaryPositionalEmbedding(4, 8)
    x = torch.randn(3, 2, 5, 4)
    x_copy = x.clone()
    out = rope(x)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.equal(x, x_copy)
    assert rope(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert "cos" not in rope.state_dict()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((5, 8), ValueError, r"head_dim=5 must be even"),
        ((0, 8), ValueError, r"head_dim must be a positive int, got head_dim=0"),
        ((4, 0), ValueError, r"context_length must be a positive int"),
        ((4.0, 8), TypeError, r"head_dim must be an int"),
        ((4, 8, -1.0), ValueError, r"base must be a finite positive number"),
    ],
)
def test_rope_constructor_errors(args, error, match):
    with pytest.raises(error, match=match):
        RotaryPositionalEmbedding(*args)


def test_rope_forward_errors_name_the_numbers():
    rope = RotaryPositionalEmbedding(4, 8)
    with pytest.raises(ValueError, match=r"x.shape\[-1\]=6 does not match head_dim=4"):
        rope(torch.randn(2, 6))
    with pytest.raises(
        ValueError, match=r"positions offset=5 to 8 \(num_tokens=4\) reach past context_length=8"
    ):
        rope(torch.randn(4, 4), offset=5)
    with pytest.raises(ValueError, match=r"reach past context_length=8"):
        rope(torch.randn(9, 4))
    with pytest.raises(ValueError, match=r"offset must be >= 0, got offset=-1"):
        rope(torch.randn(2, 4), offset=-1)
    with pytest.raises(TypeError, match=r"offset must be an int, got float"):
        rope(torch.randn(2, 4), offset=1.0)
    with pytest.raises(ValueError, match=r"x must be \(..., num_tokens, head_dim\), got 1-D"):
        rope(torch.randn(4))
    with pytest.raises(TypeError, match=r"floating-point dtype, got torch.int64"):
        rope(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        rope([[0.0] * 4])


def test_rope_is_exported():
    assert attnlib.RotaryPositionalEmbedding is RotaryPositionalEmbedding


# -- RoPE scaling options against transformers' initialisations ------------------

_SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
     "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
     "attention_factor": 1.3, "truncate": False},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
     "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 256,
     "low_freq_factor": 2.0, "high_freq_factor": 8.0},
]


def _hf_config(head_dim, base, params, max_positions=16384):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
        max_position_embeddings=max_positions, rope_parameters={"rope_theta": base, **params},
    )


@pytest.mark.parametrize("params", _SCALINGS, ids=lambda p: p["rope_type"])
@pytest.mark.parametrize(("head_dim", "base"), [(64, 10000.0), (128, 500000.0), (16, 10000.0)])
def test_rope_scaling_equals_transformers(params, head_dim, base):
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _hf_config(head_dim, base, params)
    hf_inv_freq, hf_attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    rope = RotaryPositionalEmbedding(head_dim, 32, base, scaling=params)
    # transformers computes in float32, attnlib in float64
    torch.testing.assert_close(rope.inv_freq, hf_inv_freq.double(), rtol=1e-6, atol=0)
    assert rope.attention_scaling == pytest.approx(hf_attention, rel=1e-12)
    unscaled = RotaryPositionalEmbedding(head_dim, 32, base)
    assert not torch.allclose(rope.inv_freq, unscaled.inv_freq)  # the option did something


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_ntk_equals_transformers_dynamic_ntk_at_its_matching_length(factor):
    # transformers' "dynamic" uses base * (factor * s / L - (factor - 1))^(d / (d - 2)) at
    # the call's length s: at s = L (2 factor - 1) / factor that is attnlib's static
    # base * factor^(d / (d - 2)).
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, base, original = 64, 10000.0, 2048
    config = _hf_config(head_dim, base, {"rope_type": "dynamic", "factor": factor},
                        max_positions=original)
    seq_len = original * (2 * factor - 1) / factor
    hf_inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=seq_len)
    rope = RotaryPositionalEmbedding(head_dim, 8, base, scaling={"rope_type": "ntk",
                                                                 "factor": factor})
    torch.testing.assert_close(rope.inv_freq, hf_inv_freq.double(), rtol=1e-6, atol=0)
    # the fastest pair is unchanged, the slowest divided by factor
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    assert rope.inv_freq[0] == theta[0]
    assert rope.inv_freq[-1].item() == pytest.approx(theta[-1].item() / factor, rel=1e-12)


def test_linear_scaling_is_position_interpolation():
    # position m with factor f rotates as position m / f did: rope_f(x, 4 m) == rope(x, m)
    plain = RotaryPositionalEmbedding(8, 64)
    stretched = RotaryPositionalEmbedding(8, 64, scaling={"rope_type": "linear", "factor": 4.0})
    x = torch.randn(3, 8, dtype=torch.float64)
    for m in (1, 5, 15):
        torch.testing.assert_close(stretched(x, offset=4 * m)[0], plain(x, offset=m)[0])


def test_yarn_attention_factor_scales_cos_and_sin():
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    rope = RotaryPositionalEmbedding(8, 32, scaling=params)
    assert rope.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1)
    x = torch.randn(5, 8, dtype=torch.float64)
    norms = rope(x).norm(dim=-1) / x.norm(dim=-1)
    torch.testing.assert_close(norms, torch.full((5,), rope.attention_scaling,
                                                 dtype=torch.float64))


@pytest.mark.parametrize(("scaling", "error", "match"), [
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "rope_type='dynamic'"),
    ({"rope_type": "linear"}, ValueError, "missing \\['factor'\\]"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, ValueError, "unknown \\['beta_fast'\\]"),
    ({"rope_type": "linear", "factor": -2.0}, ValueError, "factor must be a finite positive"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, ValueError, "rope_theta=500"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
      "low_freq_factor": 4.0, "high_freq_factor": 1.0}, ValueError, "high_freq_factor"),
    ([("rope_type", "linear")], TypeError, "scaling must be a dict"),
])
def test_rope_scaling_is_checked(scaling, error, match):
    with pytest.raises(error, match=match):
        RotaryPositionalEmbedding(8, 16, scaling=scaling)
