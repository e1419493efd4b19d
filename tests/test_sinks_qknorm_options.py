"""attnlib.QKNormSinkAttention, GroupedQueryAttention with chapter 13's qk_norm=True
and sinks=True: the parent's seeded weights unchanged, both paths and the KV cache
equal to a reference assembled from attnlib.sinks, gradients reaching the sinks on
both paths, and the old keywords of MultiHeadAttention and GroupedQueryAttention
refused with a pointer to it. (Against transformers' Qwen3 and gpt-oss:
tests/test_interop.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from attnlib import GroupedQueryAttention, KVCache, MultiHeadAttention, QKNormSinkAttention
from attnlib.sinks import sink_attention

TOL = {"atol": 1e-12, "rtol": 1e-10}


def _module(qk_norm, sinks, rope=True, num_kv_groups=2, seed=0):
    torch.manual_seed(seed)
    module = QKNormSinkAttention(10, 12, 16, 0.0, 4, num_kv_groups, True, rope=rope,
                                 head_dim=6, qk_norm=qk_norm, sinks=sinks).double().eval()
    with torch.no_grad():  # gains and sinks away from their initial 1 and 0
        for name, p in module.named_parameters():
            if "norm" in name or name.startswith("sinks"):
                p.normal_()
    return module


def _reference(module, x, allowed):
    """The layer assembled by hand from its parts and attnlib.sinks.sink_attention."""
    b, n, _ = x.shape
    h, g, d = module.num_heads, module.num_kv_groups, module.head_dim
    q = module.W_query(x).view(b, n, h, d).transpose(1, 2)
    k = module.W_key(x).view(b, n, g, d).transpose(1, 2)
    v = module.W_value(x).view(b, n, g, d).transpose(1, 2)
    if module.qk_norm is not None:
        q, k = module.qk_norm.q_norm(q), module.qk_norm.k_norm(k)
    if module.rope is not None:
        q, k = module.rope(q), module.rope(k)
    sinks = (module.sinks.sinks if module.sinks is not None
             else torch.full((h,), float("-inf"), dtype=x.dtype))
    ctx = sink_attention(q, k, v, sinks, attn_mask=allowed)
    return module.out_proj(ctx.transpose(1, 2).reshape(b, n, h * d))


CASES = list(itertools.product([False, True], [False, True], [False, True], [1, 2, 4]))


@pytest.mark.parametrize("qk_norm,sinks,rope,num_kv_groups", CASES)
def test_both_paths_and_cache_equal_the_reference(qk_norm, sinks, rope, num_kv_groups):
    module = _module(qk_norm, sinks, rope, num_kv_groups)
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    with torch.no_grad():
        expected = _reference(module, x, torch.ones(9, 9, dtype=torch.bool).tril())
        fast = module(x)
        readable, weights = module(x, return_weights=True)
        cache = KVCache()
        steps = [module(x[:, :4], kv_cache=cache)]
        steps += [module(x[:, t : t + 1], kv_cache=cache) for t in range(4, 9)]
        cache_readable = KVCache()
        steps_readable = [module(x[:, :5], True, kv_cache=cache_readable)[0],
                          module(x[:, 5:], True, kv_cache=cache_readable)[0]]
    for got in (fast, readable, torch.cat(steps, 1), torch.cat(steps_readable, 1)):
        assert_close(got, expected, **TOL)
    row_sums = weights.sum(-1)
    if sinks:  # the sink takes a share of every row: rows sum to less than 1
        assert (row_sums < 1 - 1e-6).all()
    else:
        assert_close(row_sums, torch.ones_like(row_sums), **TOL)


def test_each_option_changes_the_output():
    x = torch.randn(1, 6, 10, dtype=torch.float64)
    plain = _module(False, False)
    with torch.no_grad():
        base = plain(x)
        for qk_norm, sinks in [(True, False), (False, True)]:
            module = _module(qk_norm, sinks)
            module.load_state_dict(plain.state_dict(), strict=False)
            assert (module(x) - base).abs().max() > 1e-3


def test_defaults_keep_parameters_and_state_dict_keys():
    torch.manual_seed(0)
    plain = GroupedQueryAttention(8, 8, 6, 0.0, 2, 2, rope=True)
    torch.manual_seed(0)
    both = QKNormSinkAttention(8, 8, 6, 0.0, 2, 2, rope=True, qk_norm=True, sinks=True)
    torch.manual_seed(0)
    neither = QKNormSinkAttention(8, 8, 6, 0.0, 2, 2, rope=True)
    assert neither.qk_norm is None and neither.sinks is None and neither.causal
    extra = set(both.state_dict()) - set(plain.state_dict())
    assert extra == {"qk_norm.q_norm.weight", "qk_norm.k_norm.weight", "sinks.sinks"}
    assert set(plain.state_dict()) == set(neither.state_dict()) == {
        "mask", "W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight",
        "out_proj.bias"}
    # the parts are created after the parent's layers: the same seeded weights, first
    names = [name for name, _ in both.named_parameters()]
    assert names == [name for name, _ in plain.named_parameters()] + [
        "qk_norm.q_norm.weight", "qk_norm.k_norm.weight", "sinks.sinks"]
    for name, p in plain.named_parameters():
        assert torch.equal(p, both.get_parameter(name))
    assert both.sinks.sinks.shape == (2,) and both.qk_norm.q_norm.weight.shape == (4,)
    assert "qk_norm=True, sinks=True" in repr(both) and "qk_norm" not in repr(neither)
    assert repr(neither).replace("QKNormSinkAttention", "GroupedQueryAttention") == repr(plain)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.equal(neither.eval()(x), plain.eval()(x))


@pytest.mark.parametrize("num_kv_groups", [1, 4])
def test_gradients_reach_sinks_and_gains_equally_on_both_paths(num_kv_groups):
    torch.manual_seed(3)
    module = QKNormSinkAttention(10, 12, 16, 0.0, 4, num_kv_groups, qk_norm=True,
                                 sinks=True).double()
    with torch.no_grad():
        module.sinks.sinks.normal_()
    x = torch.randn(2, 7, 10, dtype=torch.float64)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 5:] = True  # padding too, so the float-mask path is exercised
    grads = []
    for return_weights in (False, True):
        module.zero_grad()
        out = module(x, return_weights, key_padding_mask=padding)
        out = out[0] if return_weights else out
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in module.named_parameters()})
    for name in grads[0]:
        assert_close(grads[0][name], grads[1][name], **TOL)
    assert grads[0]["sinks.sinks"].abs().min() > 0
    assert grads[0]["qk_norm.k_norm.weight"].abs().max() > 0


def test_sinks_with_fully_padded_rows_give_zeros():
    module = _module(True, True)
    x = torch.randn(2, 6, 10, dtype=torch.float64)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, :3] = True  # left padding: queries 0-2 of row 1 see no real key
    with torch.no_grad():
        for out in (module(x, key_padding_mask=padding),
                    module(x, True, key_padding_mask=padding)[0]):
            assert_close(out[1, :3], module.out_proj.bias.expand(3, -1), **TOL)
            allowed = (~padding)[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
            assert_close(out[0], _reference(module, x, allowed)[0], **TOL)
            assert_close(out[1, 3:], _reference(module, x, allowed)[1, 3:], **TOL)


def test_flash_path_refuses_sinks():
    module = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, sinks=True, attn_implementation="flash")
    with pytest.raises(ValueError, match="sinks"):
        module(torch.randn(1, 4, 8))


def test_option_flags_are_checked():
    with pytest.raises(TypeError, match="qk_norm"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, qk_norm=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sinks"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, sinks="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="causal"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, causal=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("keyword", ["qk_norm", "sinks"])
def test_the_old_keywords_name_the_chapter_13_class(keyword):
    for make in (lambda **kw: MultiHeadAttention(8, 8, 6, 0.0, 2, **kw),
                 lambda **kw: GroupedQueryAttention(8, 8, 6, 0.0, 2, 1, **kw)):
        for value in (True, False):  # refused even when off: the keyword is gone
            with pytest.raises(TypeError, match=rf"no longer takes {keyword}.*"
                                                r"attnlib\.QKNormSinkAttention"):
                make(**{keyword: value})


def test_unknown_keywords_are_still_type_errors():
    for make in (lambda **kw: MultiHeadAttention(8, 8, 6, 0.0, 2, **kw),
                 lambda **kw: GroupedQueryAttention(8, 8, 6, 0.0, 2, 1, **kw),
                 lambda **kw: QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, **kw)):
        with pytest.raises(TypeError, match="unexpected keyword argument 'qk_nrom'"):
            make(qk_nrom=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'rope'"):
        MultiHeadAttention(8, 8, 6, 0.0, 2, rope=True)  # RoPE is GroupedQueryAttention's


@pytest.mark.parametrize("window", [1, 3, 9])
def test_window_equals_the_reference_with_a_sliding_window_mask(window):
    module = _module(True, True)
    module.window = window
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    allowed = torch.zeros(9, 9, dtype=torch.bool)
    for t in range(9):  # query t sees keys t - window + 1 .. t
        allowed[t, max(0, t - window + 1):t + 1] = True
    with torch.no_grad():
        expected = _reference(module, x, allowed)
        cache = KVCache()
        steps = [module(x[:, :4], kv_cache=cache)]
        steps += [module(x[:, t : t + 1], kv_cache=cache) for t in range(4, 9)]
        for got in (module(x), module(x, True)[0], torch.cat(steps, 1)):
            assert_close(got, expected, **TOL)
        weights = module(x, True)[1]
    assert (weights[..., ~allowed] == 0).all()
    if window == 9:  # a window as long as the input masks nothing more
        plain = _module(True, True)
        with torch.no_grad():
            assert_close(plain(x), expected, **TOL)


def test_window_is_checked_and_shown():
    module = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, window=4)
    assert module.window == 4 and "dropout_p=0.0, window=4\n" in repr(module)
    with pytest.raises(TypeError, match="window"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, window=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, window=0)
    with pytest.raises(ValueError, match="causal=True"):
        QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, window=4, causal=False)
    flash = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, window=4, attn_implementation="flash")
    with pytest.raises(ValueError, match="flash"):
        flash(torch.randn(1, 5, 8))


def test_qk_norm_eps_reaches_the_norms_and_is_checked():
    module = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, qk_norm=True, qk_norm_eps=1e-5)
    assert module.qk_norm.q_norm.eps == module.qk_norm.k_norm.eps == 1e-5
    assert QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, qk_norm=True).qk_norm.q_norm.eps == 1e-6
    for bad, error in ((0.0, ValueError), (-1e-6, ValueError), (float("inf"), ValueError),
                       (float("nan"), ValueError), ("1e-6", TypeError), (True, TypeError)):
        with pytest.raises(error, match="qk_norm_eps"):
            QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, qk_norm=True, qk_norm_eps=bad)


def test_the_keyword_only_arguments_are_spelled_out():
    import inspect

    own = inspect.signature(QKNormSinkAttention.__init__).parameters
    parent = inspect.signature(GroupedQueryAttention.__init__).parameters
    assert inspect.Parameter.VAR_KEYWORD not in [p.kind for p in own.values()]
    for name, p in parent.items():  # every parent argument, with its default
        assert own[name].default == p.default and own[name].kind == p.kind


@pytest.mark.parametrize("options", [{"sinks": True}, {"window": 3}])
def test_flash_with_sinks_or_a_window_is_refused_before_any_computation(options):
    module = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, attn_implementation="flash", **options)
    calls = []
    module.project = lambda *args, **kw: calls.append(args)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="attn_implementation='flash' cannot run"):
        module(torch.randn(1, 4, 8))
    assert calls == []  # refused before the projection
    module = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, **options).eval()
    x = torch.randn(1, 4, 8)
    module(x)
    module.attn_implementation = "flash"  # an attribute: checked on each call
    with pytest.raises(ValueError, match="flash"):
        module(x)
    assert module(x, return_weights=True)[0].shape == (1, 4, 8)  # the readable path
    plain = QKNormSinkAttention(8, 8, 6, 0.0, 2, 1, qk_norm=True, attn_implementation="flash")
    assert plain.eval()(x).shape == (1, 4, 8)  # QK-norm alone runs on flash


def test_attend_has_the_parents_signature_and_refuses_a_second_sinks():
    import inspect

    assert (inspect.signature(QKNormSinkAttention.attend).parameters.keys()
            == inspect.signature(MultiHeadAttention.attend).parameters.keys())
    module = _module(False, True)
    q, k = torch.randn(1, 4, 3, 6, dtype=torch.float64), torch.randn(1, 2, 3, 6,
                                                                     dtype=torch.float64)
    with pytest.raises(TypeError, match="sinks"):
        module.attend(q, k, k, None, True, sinks=torch.zeros(4, dtype=torch.float64))
    without = _module(False, False)
    sinks = torch.randn(4, dtype=torch.float64)
    got, _ = without.attend(q, k, k, None, True, sinks=sinks)  # passed on without its own
    assert_close(got, sink_attention(q, k, k, sinks, is_causal=True), **TOL)
