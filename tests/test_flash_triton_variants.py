"""Tests for the kernel's variants: causal in three stages (both alignments), grouped-query
heads, the sliding window, learnable sinks, the tile schedule and autotuning.

As in tests/test_flash_triton.py, without CUDA the kernels run under Triton's interpreter,
so this file sets ``TRITON_INTERPRET=1`` before Triton's first import, and the shapes stay
tiny (d = 16, N <= 45, blocks of 16, so every sequence ends inside a block and every stage
runs). The reference is attention in float64 with the mask written out
(``_allowed``), itself checked against attnlib's masks, torch's SDPA with
``enable_gqa=True`` and attnlib's readable ``sink_attention``. float32 is held to
1e-5 (the errors measured are near 1e-6); float16 to twice the error of the same
computation by torch (or by ``sink_attention``) in float16, plus 1e-3.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from _triton_helpers import import_triton  # sets TRITON_INTERPRET first
from torch.nn.attention import SDPBackend, sdpa_kernel

_, INTERPRETED = import_triton()

from attnlib import flash_triton  # noqa: E402
from attnlib.functional import (  # noqa: E402
    bottom_right_causal_mask,
    causal_mask,
    sliding_window_mask,
)
from attnlib.sinks import sink_attention  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
BLOCKS = {"block_m": 16, "block_n": 16}
TOL32 = {"rtol": 1e-5, "atol": 1e-5}


def _allowed(n_q, n_kv, is_causal=False, window=None, alignment="top_left", *,
             rows=None, cols=None):
    """(n_q, n_kv) bool, True where query i may attend key j; ``rows`` and ``cols``
    extend it past the ends (positions continue), for whole blocks."""
    rows, cols = rows or n_q, cols or n_kv
    position = torch.arange(rows)[:, None]  # (rows, 1), query i's position
    if alignment == "bottom_right":
        position = position + n_kv - n_q
    keys = torch.arange(cols)[None, :]  # (1, cols)
    allowed = torch.ones(rows, cols, dtype=torch.bool)
    if is_causal or window is not None:
        allowed &= keys <= position
    if window is not None:
        allowed &= keys > position - window
    return allowed


def _inputs(n_q, n_kv, *, heads=4, groups=4, sinks=False, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((1, heads, n_q, 16), (1, groups, n_kv, 16), (1, groups, n_kv, 16))
    tensors = [torch.randn(s, generator=gen) for s in shapes]
    if sinks:
        tensors.append(torch.randn(heads, generator=gen) * 2)
    return [t.to(DEVICE, dtype).requires_grad_() for t in tensors]


def _reference(inputs, allowed):
    """Output in float64 with a softmax whose rows may be empty (then 0) or have a sink."""
    query, key, value = inputs[:3]
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)  # (1, heads, n_kv, 16)
    value = value.repeat_interleave(group, dim=1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    scores = scores.masked_fill(~allowed.to(scores.device), -math.inf)
    if len(inputs) == 4:  # the sink: one more logit per row, of value 0
        sink = inputs[3][None, :, None, None].expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(-1e300)  # finite if row empty
    exp = (scores - row_max).exp()
    weights = exp / exp.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    return weights[..., : value.shape[-2]] @ value


def _run(fn, inputs, grad_out):
    out = fn(*inputs)
    return [out, *torch.autograd.grad(out, inputs, grad_out)]


def _kernel(is_causal=False, window=None, alignment="top_left", **kwargs):
    def call(query, key, value, sinks=None):
        return flash_triton.flash_attention_triton(
            query, key, value, is_causal=is_causal, window=window, sinks=sinks,
            causal_alignment=alignment, **{**BLOCKS, **kwargs})
    return call


def _compare(inputs, is_causal=False, window=None, alignment="top_left", same_dtype=None):
    """The kernel's output and gradients against float64; float16 against same_dtype's."""
    allowed = _allowed(inputs[0].shape[2], inputs[1].shape[2], is_causal, window, alignment)
    grad_out = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1))
    grad_out = grad_out.to(DEVICE, inputs[0].dtype)
    got = _run(_kernel(is_causal, window, alignment), inputs, grad_out)
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    want = _run(lambda *ts: _reference(ts, allowed), inputs64, grad_out.double())
    names = ["output", "dQ", "dK", "dV", "dsinks"]
    for name, g, w in zip(names, got, want, strict=False):
        assert g.dtype == inputs[0].dtype and g.shape == w.shape, name
    if inputs[0].dtype == torch.float32:
        for name, g, w in zip(names, got, want, strict=False):
            torch.testing.assert_close(g.double(), w, **TOL32, msg=name)
        return
    theirs = _run(same_dtype, inputs, grad_out)
    for name, g, t, w in zip(names, got, theirs, want, strict=False):
        err, their_err = ((x.double() - w).abs().max().item() for x in (g, t))
        assert err <= 2 * their_err + 1e-3, (name, err, their_err)


# --- the reference's masks are attnlib's ----------------------------------------------------


@pytest.mark.parametrize("n_q, n_kv", [(7, 7), (5, 9)])
def test_the_reference_masks_are_attnlibs(n_q, n_kv):
    assert torch.equal(_allowed(n_q, n_kv, True), causal_mask(n_q, n_kv))
    assert torch.equal(_allowed(n_q, n_kv, True, alignment="bottom_right"),
                       bottom_right_causal_mask(n_q, n_kv))
    assert torch.equal(_allowed(n_q, n_kv, window=3, alignment="bottom_right"),
                       sliding_window_mask(n_q, 3, num_tokens_kv=n_kv))


# --- every combination, float32, with gradients ---------------------------------------------


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("groups", [4, 1])  # 2 below: bottom-right, float16, the rivals
@pytest.mark.parametrize("is_causal, window", [(False, None), (True, None), (True, 7),
                                               (False, 20)])
@pytest.mark.parametrize("n_q, n_kv", [(37, 37), (21, 45)])
def test_float32_against_float64(n_q, n_kv, is_causal, window, groups, sinks):
    _compare(_inputs(n_q, n_kv, groups=groups, sinks=sinks), is_causal, window)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("is_causal, window", [(True, None), (True, 9)])
@pytest.mark.parametrize("n_q, n_kv", [(21, 45), (45, 21)])
def test_bottom_right_alignment(n_q, n_kv, is_causal, window, sinks):
    # With 45 queries and 21 keys, bottom-right, the first 24 queries see no key at all.
    _compare(_inputs(n_q, n_kv, groups=2, sinks=sinks), is_causal, window, "bottom_right")


def test_top_left_and_bottom_right_differ_and_agree_where_they_should():
    inputs = _inputs(21, 45)
    top, bottom = (_kernel(True, alignment=a)(*inputs) for a in ("top_left", "bottom_right"))
    assert (top - bottom).abs().max() > 0.1  # different masks
    square = _inputs(37, 37)
    top, bottom = (_kernel(True, alignment=a)(*square) for a in ("top_left", "bottom_right"))
    assert torch.equal(top, bottom)  # the same mask when N_q == N_kv


def test_a_query_that_sees_no_key_gets_zeros_and_no_gradient():
    query, key, value = _inputs(40, 16, groups=4)
    out = _kernel(True, alignment="bottom_right")(query, key, value)
    assert torch.equal(out[:, :, :24], torch.zeros_like(out[:, :, :24]))
    (grad,) = torch.autograd.grad(out.sum(), query)
    assert torch.equal(grad[:, :, :24], torch.zeros_like(grad[:, :, :24]))
    assert torch.isfinite(grad).all()


# --- float16 ---------------------------------------------------------------------------------


def _sdpa_gqa(is_causal, window, alignment):
    def call(query, key, value):
        allowed = _allowed(query.shape[2], key.shape[2], is_causal, window, alignment)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(query, key, value,
                                                  attn_mask=allowed.to(query.device),
                                                  enable_gqa=True)
    return call


def _readable_sinks(is_causal, window, alignment):
    def call(query, key, value, sinks):
        allowed = _allowed(query.shape[2], key.shape[2], is_causal, window, alignment)
        return sink_attention(query, key, value, sinks, attn_mask=allowed.to(query.device))
    return call


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("is_causal, window, groups", [(False, None, 4), (True, None, 2),
                                                       (True, 7, 1)])
def test_float16_as_accurate_as_torch(is_causal, window, groups, sinks):
    inputs = _inputs(37, 45, groups=groups, sinks=sinks, dtype=torch.float16)
    same = (_readable_sinks if sinks else _sdpa_gqa)(is_causal, window, "top_left")
    _compare(inputs, is_causal, window, same_dtype=same)


# --- the rivals: SDPA's enable_gqa and attnlib's readable sinks ------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_heads_equal_sdpa_with_enable_gqa(is_causal):
    inputs = _inputs(37, 37, heads=6, groups=2)
    grad_out = torch.randn(1, 6, 37, 16).to(DEVICE)
    got = _run(_kernel(is_causal), inputs, grad_out)
    with sdpa_kernel(SDPBackend.MATH):
        want = _run(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, enable_gqa=True), inputs, grad_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL32)
    assert got[2].shape == (1, 2, 37, 16)  # dK per key/value head, summed over its group


def test_sinks_equal_the_readable_sinks_path_and_their_gradient_is_its_own():
    inputs = _inputs(37, 37, groups=2, sinks=True)
    grad_out = torch.randn(1, 4, 37, 16).to(DEVICE)
    got = _run(_kernel(window=11), inputs, grad_out)
    allowed = sliding_window_mask(37, 11).to(DEVICE)
    want = _run(lambda q, k, v, s: sink_attention(q, k, v, s, attn_mask=allowed), inputs,
                grad_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL32)
    assert got[4].shape == (4,) and got[4].abs().min() > 0  # every head's sink is used


def test_the_log_sum_exp_includes_the_sink():
    query, key, value, sinks = _inputs(21, 21, sinks=True)
    _, lse = flash_triton.flash_attention_triton_forward(query, key, value, sinks=sinks,
                                                         **BLOCKS)
    scores = query @ key.transpose(-2, -1) / 4.0  # (1, 4, 21, 21)
    with_sink = torch.cat([scores, sinks[None, :, None, None].expand(1, 4, 21, 1)], -1)
    torch.testing.assert_close(lse, torch.logsumexp(with_sink, -1, keepdim=True), **TOL32)


def test_no_keys_with_sinks_gives_zeros_and_the_sink_as_log_sum_exp():
    query, key, value, sinks = _inputs(5, 0, sinks=True)
    out, lse = flash_triton.flash_attention_triton_forward(query, key, value, sinks=sinks)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse[0, :, 0, 0], sinks.detach())


# --- the tile schedule -----------------------------------------------------------------------


def _brute_force(n_q, n_kv, bm, bn, is_causal, window, alignment):
    """{kernel: [unmasked, masked, skipped]} tiles, from the mask itself.

    A program computes whole blocks: the forward's rows past n_q, and the dK/dV
    kernel's keys past n_kv, are computed (and not stored), so they count as
    positions here; the other side's last, partial tile always needs its mask.
    """
    pad_q, pad_kv = -(-n_q // bm) * bm, -(-n_kv // bn) * bn

    def allowed(n_rows, n_cols):
        return _allowed(n_q, n_kv, is_causal, window, alignment, rows=n_rows, cols=n_cols)

    counts = {}
    # The dK/dV kernel masks every tile of a partial last key block: full needs both.
    for name, mask, full_mask in (("forward", allowed(pad_q, n_kv), allowed(pad_q, n_kv)),
                                  ("grad_key_value", allowed(n_q, pad_kv),
                                   allowed(n_q, n_kv))):
        found = [0, 0, 0]
        for i in range(0, n_q, bm):
            for j in range(0, n_kv, bn):
                tile = full_mask[i:i + bm, j:j + bn]
                full = tile.all() and tile.shape == (bm, bn)
                seen = mask[i:i + bm, j:j + bn].any()
                found[0 if full else 1 if seen else 2] += 1
        counts[name] = found
    return counts


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("is_causal, window", [(False, None), (True, None), (True, 1),
                                               (True, 50), (True, 200)])
@pytest.mark.parametrize("n_q, n_kv, bm, bn", [(256, 256, 64, 64), (200, 333, 32, 64),
                                                (333, 200, 64, 16), (64, 64, 64, 64),
                                                (1, 300, 16, 32)])
def test_the_tile_schedule_skips_only_empty_tiles_and_unmasks_only_full_ones(
        n_q, n_kv, bm, bn, is_causal, window, alignment):
    counts = flash_triton.tile_counts(n_q, n_kv, block_m=bm, block_n=bn,
                                      is_causal=is_causal, window=window,
                                      causal_alignment=alignment)
    best = _brute_force(n_q, n_kv, bm, bn, is_causal, window, alignment)
    for name, stages in counts.items():
        # Exact: no tile with a visible pair is skipped, none with a hidden pair runs
        # unmasked, and no tile that could run unmasked is masked.
        assert [stages[k] for k in ("unmasked", "masked", "skipped")] == best[name], name
        assert stages["total"] == sum(best[name])


def test_the_schedule_of_the_causal_square():
    counts = flash_triton.tile_counts(1024, 1024, is_causal=True)
    # 16 x 16 tiles: 120 below the diagonal, 16 on it, 120 above.
    assert counts["forward"] == {"unmasked": 120, "masked": 16, "skipped": 120,
                                 "total": 256}
    assert counts["grad_key_value"] == counts["forward"]


# --- autotuning ------------------------------------------------------------------------------


def test_autotune_under_the_interpreter_runs_the_default_blocks():
    inputs = _inputs(21, 21)[:3]
    tuned = flash_triton.flash_attention_triton(*inputs, is_causal=True, autotune=True)
    plain = flash_triton.flash_attention_triton(*inputs, is_causal=True)
    assert torch.equal(tuned, plain)
    if INTERPRETED:
        assert flash_triton.autotuned_configs()["forward"] == {}


def test_the_autotuned_configurations_are_a_small_set_that_fits_shared_memory():
    assert 3 <= len(flash_triton.AUTOTUNE_CONFIGS) <= 8
    for bm, bn, warps, stages in flash_triton.AUTOTUNE_CONFIGS:
        assert 2 * 128 * (bm + 2 * stages * bn) <= 232448  # bfloat16, d = 128
        assert warps in (4, 8) and 2 <= stages <= 4


@pytest.mark.skipif(INTERPRETED, reason="needs a CUDA GPU (autotuning times kernels)")
def test_autotune_on_a_gpu_reports_its_choice():  # pragma: no cover - GPU only
    inputs = [t.half() for t in _inputs(300, 300)[:3]]
    tuned = flash_triton.flash_attention_triton(*inputs, is_causal=True, autotune=True)
    torch.testing.assert_close(tuned, flash_triton.flash_attention_triton(
        *inputs, is_causal=True), rtol=2e-3, atol=2e-3)
    chosen = flash_triton.autotuned_configs()["forward"]
    assert len(chosen) == 1
    (config,) = chosen.values()
    assert (config["BLOCK_M"], config["BLOCK_N"], config["num_warps"],
            config["num_stages"]) in flash_triton.AUTOTUNE_CONFIGS


# --- bad input -------------------------------------------------------------------------------


def _good():
    return _inputs(8, 8, groups=2)[:3]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"window": 0}, ValueError, "window"),
        ({"window": -3}, ValueError, "window"),
        ({"window": 2.0}, TypeError, "window"),
        ({"window": True}, TypeError, "window"),
        ({"sinks": torch.zeros(3)}, ValueError, r"sinks must have shape \(num_heads,\)"),
        ({"sinks": torch.zeros(1, 4)}, ValueError, r"sinks must have shape"),
        ({"sinks": torch.zeros(4, dtype=torch.long)}, TypeError, "sinks must be a float"),
        ({"sinks": [0.0] * 4}, TypeError, "sinks must be a floating-point tensor"),
        ({"causal_alignment": "lower_right"}, ValueError, "causal_alignment must be"),
        ({"causal_alignment": None}, TypeError, "causal_alignment must be a str"),
        ({"autotune": 1}, TypeError, "autotune must be a bool"),
        ({"autotune": True, "block_m": 32}, ValueError, "autotune=True chooses"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    if isinstance(kwargs.get("sinks"), torch.Tensor):
        kwargs = {**kwargs, "sinks": kwargs["sinks"].to(DEVICE)}
    for fn in (flash_triton.flash_attention_triton, flash_triton.flash_attention_triton_forward):
        with pytest.raises(error, match=match):
            fn(*_good(), **kwargs)


def test_groups_that_do_not_divide_the_heads_are_refused():
    query, key, value = _inputs(8, 8, heads=4, groups=3)[:3]
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_groups=3"):
        flash_triton.flash_attention_triton(query, key, value)
    query, key, value = _inputs(8, 8, heads=4, groups=2)[:3]
    with pytest.raises(ValueError, match="key and value must have the same num_kv_groups"):
        flash_triton.flash_attention_triton(query, key, value[:, :1])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"window": 0}, ValueError, "window"),
        ({"block_m": 24}, ValueError, "block_m must be a power of two"),
        ({"causal_alignment": "middle"}, ValueError, "causal_alignment must be"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
    ],
)
def test_tile_counts_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        flash_triton.tile_counts(64, 64, **kwargs)
