"""attnlib.exercises.multihead: check_merge_heads and check_multi_head_attention.

Each checker accepts the reference and the book's solution, and rejects each
typical wrong answer with a message that names it (one test per wrong answer).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import attnlib
from attnlib.exercises import CheckFailed, check_merge_heads, check_multi_head_attention

# ---------------------------------------------------------------------------
# check_merge_heads
# ---------------------------------------------------------------------------


def book_merge_heads(context_vec):
    """The solution printed in chapter 6."""
    b, num_heads, num_tokens, head_dim = context_vec.shape
    context_vec = context_vec.transpose(1, 2)  # (b, num_tokens, num_heads, head_dim)
    return context_vec.reshape(b, num_tokens, num_heads * head_dim)


def test_check_merge_heads_accepts_the_book_solution(capsys):
    assert check_merge_heads(book_merge_heads) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_check_merge_heads_accepts_contiguous_view_and_cat():
    def contiguous_view(c):
        b, h, n, d = c.shape
        return c.transpose(1, 2).contiguous().view(b, n, h * d)

    def cat(c):
        return torch.cat(c.unbind(dim=1), dim=-1)

    assert check_merge_heads(contiguous_view) is True
    assert check_merge_heads(cat) is True


def _reshape_only(c):
    b, h, n, d = c.shape
    return c.reshape(b, n, h * d)


def _reversed(c):
    return book_merge_heads(c.flip(1))


def _interleaved(c):
    b, h, n, d = c.shape
    return c.permute(0, 2, 3, 1).reshape(b, n, h * d)


def _view_without_contiguous(c):
    b, h, n, d = c.shape
    return c.transpose(1, 2).view(b, n, h * d)


def _in_place(c):
    c.mul_(1.0)
    c += 0.0
    c[0, 0, 0, 0] = 0.0
    return book_merge_heads(c)


def _no_merge(c):
    return c.transpose(1, 2)


def _d2l_without_permute(c):
    # d2l's transpose_output, X.reshape(X.shape[0], X.shape[1], -1), without its
    # X.permute(0, 2, 1, 3): the heads stay in front of the tokens
    return c.reshape(c.shape[0], c.shape[1], -1)


def _notebook_sizes(c):
    b, num_tokens, d_out = 2, 6, 12  # the chapter's example, not the argument's sizes
    return c.transpose(1, 2).reshape(b, num_tokens, d_out)


def _notebook_d_out(c):
    b, _, num_tokens, _ = c.shape
    return c.transpose(1, 2).reshape(b, num_tokens, 12)  # 12: the chapter's d_out


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        pytest.param(_reshape_only, "merged without moving them back", id="no-transpose"),
        pytest.param(_reversed, "concatenated in the wrong order", id="wrong-order"),
        pytest.param(_interleaved, "interleaved across heads", id="interleaved"),
        pytest.param(_view_without_contiguous, "use .contiguous\\(\\).view", id="view"),
        pytest.param(_in_place, "changed its input in place", id="in-place"),
        pytest.param(_no_merge, r"returned shape \(2, 5, 3, 4\); expected \(2, 5, 12\)",
                     id="not-merged"),
        pytest.param(_d2l_without_permute, r"returned shape \(2, 3, 20\) = \(b, num_heads, "
                     r"num_tokens \* head_dim\): the heads are still in front of the tokens.*"
                     r"permute\(0, 2, 1, 3\)", id="d2l-without-permute"),
        pytest.param(_notebook_sizes, "invalid for input of size 120\nRead b, num_heads, "
                     "num_tokens and head_dim from context_vec.shape", id="notebook-sizes"),
        pytest.param(_notebook_d_out, r"invalid for input of size 120\nRead b, num_heads",
                     id="notebook-d-out"),
    ],
)
def test_check_merge_heads_names_each_wrong_answer(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_merge_heads(wrong)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param("transpose", "a function, but got str", id="a-string"),
        pytest.param(lambda c: c.numpy(), "returned numpy.ndarray", id="numpy"),
        pytest.param(lambda c: _reshape_only(c).float(), "dtype torch.float32", id="dtype"),
    ],
)
def test_check_merge_heads_answers_nonsense_clearly(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_merge_heads(answer)


# ---------------------------------------------------------------------------
# check_multi_head_attention
# ---------------------------------------------------------------------------


class BookMultiHeadAttention(nn.Module):
    """The solution printed in chapter 6."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        if d_out % num_heads != 0:
            raise ValueError(f"d_out={d_out} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(context_length, context_length, dtype=torch.bool))
        self.register_buffer("mask", mask)  # True = may attend

    def forward(self, x):
        b, num_tokens, _ = x.shape
        shape = (b, num_tokens, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(shape).transpose(1, 2)  # (b, heads, tokens, head_dim)
        keys = self.W_key(x).view(shape).transpose(1, 2)
        values = self.W_value(x).view(shape).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)  # (b, heads, tokens, tokens)
        allowed = self.mask[:num_tokens, :num_tokens]
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
        attn_weights = torch.softmax(attn_scores / self.head_dim**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, tokens, heads, head_dim)
        context_vec = context_vec.reshape(b, num_tokens, self.num_heads * self.head_dim)
        return self.out_proj(context_vec)


def make_mha(mistake):
    """A multi-head attention class with one typical mistake."""

    class Wrong(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__()
            self.num_heads, self.head_dim, self.d_out = num_heads, d_out // num_heads, d_out
            bias = False if mistake == "ignores_qkv_bias" else qkv_bias
            self.W_query = nn.Linear(d_in, d_out, bias=bias)
            self.W_key = nn.Linear(d_in, d_out, bias=bias)
            self.W_value = nn.Linear(d_in, d_out, bias=bias)
            self.out_proj = nn.Linear(d_out, d_out)
            self.p = dropout
            mask = torch.tril(torch.ones(context_length, context_length, dtype=torch.bool))
            if mistake == "plain_attribute_mask":
                self.mask = mask
            else:
                self.register_buffer("mask", mask)

        def forward(self, x):
            b, n, _ = x.shape
            h, hd = self.num_heads, self.head_dim

            def split(t):
                if mistake in ("split_no_transpose", "split_and_merge_no_transpose"):
                    return t.view(b, h, n, hd)
                return t.view(b, n, h, hd).transpose(1, 2)

            q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
            scores = q @ k.transpose(2, 3)
            if mistake == "dropout_on_scores":
                scores = F.dropout(scores, self.p, training=self.training)
            allowed = self.mask if mistake == "mask_not_cut" else self.mask[:n, :n]
            if mistake == "flipped_mask":
                scores = scores.masked_fill(allowed, float("-inf"))
            elif mistake == "no_diagonal":
                scores = scores.masked_fill(~torch.tril(allowed, diagonal=-1), float("-inf"))
            elif mistake != "no_mask":
                scores = scores.masked_fill(~allowed, float("-inf"))
            scale = {"not_scaled": 1.0, "scaled_by_d_out": self.d_out**0.5,
                     "scaled_by_d_in": x.shape[-1] ** 0.5}.get(mistake, hd**0.5)
            dim = {"softmax_dim": -2, "softmax_over_heads": 1}.get(mistake, -1)
            weights = torch.softmax(scores / scale, dim=dim)
            if mistake == "only_last_token_leaks":
                weights = weights.clone()
                weights[:, :, :-1, -1] += 0.01
            keep = torch.rand_like(weights) >= self.p
            if mistake == "dropout_one_over_p":
                weights = weights * keep / self.p if self.training and self.p else weights
            elif mistake == "dropout_in_eval":
                weights = F.dropout(weights, self.p, training=True)
            elif mistake == "dropout_keep_probability":
                weights = F.dropout(weights, 1 - self.p, training=self.training)
            elif mistake not in ("no_dropout", "dropout_on_context", "dropout_on_output",
                                 "dropout_on_scores"):
                weights = F.dropout(weights, self.p, training=self.training)
            context = weights @ v  # (b, h, n, hd)
            if mistake == "dropout_on_context":
                context = F.dropout(context, self.p, training=self.training)
            if mistake == "wrong_head_order":
                context = context.flip(1)
            if mistake in ("merge_no_transpose", "split_and_merge_no_transpose"):
                context = context.reshape(b, n, self.d_out)
            elif mistake == "view_not_contiguous":
                context = context.transpose(1, 2).view(b, n, self.d_out)
            else:
                context = context.transpose(1, 2).reshape(b, n, self.d_out)
            if mistake == "no_out_proj":
                return context
            out = self.out_proj(context)
            if mistake == "dropout_on_output":
                out = F.dropout(out, self.p, training=self.training)
            return out

    Wrong.__name__ = f"MHA_{mistake}"
    return Wrong


def test_check_multi_head_attention_accepts_attnlib(capsys):
    assert check_multi_head_attention(attnlib.MultiHeadAttention) is True
    assert "causality and dropout are right" in capsys.readouterr().out


def test_check_multi_head_attention_accepts_the_book_solution():
    assert check_multi_head_attention(BookMultiHeadAttention) is True


def test_check_multi_head_attention_accepts_the_correct_variant_of_the_test_class():
    assert check_multi_head_attention(make_mha("none")) is True


def test_the_checkers_reference_is_attnlib_multi_head_attention():
    """The checker's reference equals attnlib's class to the checker's tolerance, with and
    without qkv_bias: the class passes, and the same class with every output moved by
    1e-4, or with its biases ignored, does not."""
    assert check_multi_head_attention(attnlib.MultiHeadAttention) is True

    class Nudged(attnlib.MultiHeadAttention):
        def forward(self, x, return_weights=False):
            return super().forward(x) + 1e-4

    with pytest.raises(CheckFailed):
        check_multi_head_attention(Nudged)

    class BiasIgnored(attnlib.MultiHeadAttention):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)

    with pytest.raises(CheckFailed, match="qkv_bias=True"):
        check_multi_head_attention(BiasIgnored)


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ("not_scaled", "scores are not scaled"),
        ("scaled_by_d_out", r"scaled by 1/sqrt\(d_out\) = 1/sqrt\(6\).*instead of "
                            r"1/sqrt\(head_dim\) = 1/sqrt\(3\)"),
        ("softmax_dim", "softmax runs over the wrong dimension"),
        ("softmax_over_heads", r"softmax runs over the heads \(dim=1"),
        ("scaled_by_d_in", r"scaled by 1/sqrt\(d_in\) = 1/sqrt\(5\), the size of the INPUTS"),
        ("mask_not_cut", r"works with num_tokens = context_length = 8 but not with 7 tokens.*"
                         r"self.mask\[:num_tokens, :num_tokens\]"),
        ("no_mask", "there is no causal mask"),
        ("flipped_mask", "polarity is flipped"),
        ("no_diagonal", "hides the diagonal too"),
        ("merge_no_transpose", "merged without moving them back"),
        ("wrong_head_order", "concatenated in the wrong order"),
        ("split_no_transpose", "split without the transpose"),
        ("split_and_merge_no_transpose", "split AND merged by reshape alone"),
        ("view_not_contiguous", "use .contiguous\\(\\).view"),
        ("no_out_proj", "out_proj is not applied"),
        ("only_last_token_leaks", "a future token leaks"),
        ("plain_attribute_mask", "self.mask is a plain tensor attribute"),
        ("ignores_qkv_bias", "with qkv_bias=True, W_query has no bias"),
        ("no_dropout", "the attention weights are never dropped"),
        ("dropout_one_over_p", r"scaled by 1/p = 5 instead of 1/\(1-p\) = 1.25"),
        ("dropout_in_eval", "dropout must be off after module.eval"),
        ("dropout_on_context", "features are zeroed one by one"),
        ("dropout_on_output", "the only dropout in your module comes after out_proj.*"
                              "attention weights are never dropped"),
        ("dropout_on_scores", "ever zeroed.*Dropout on the scores, before the softmax"),
        ("dropout_keep_probability", "drops [78][0-9]% of the attention weights instead of "
                                     "p = 20%.*not 1 - dropout"),
    ],
)
def test_check_multi_head_attention_names_each_wrong_answer(mistake, named):
    with pytest.raises(CheckFailed, match=named):
        check_multi_head_attention(make_mha(mistake))


class NanoGPTCausalSelfAttention(nn.Module):
    """nanoGPT's CausalSelfAttention (Karpathy, nanoGPT model.py), small and faithful: one
    c_attn for the three projections, attn_dropout on the attention weights, c_proj, and
    resid_dropout after c_proj, as in GPT-2. Only the constructor follows the exercise
    (nanoGPT takes a config, and its d_in equals d_out), and W_query, W_key, W_value and
    out_proj name the parts of c_attn and c_proj that the checker copies its weights into.
    ``flash`` takes nanoGPT's other path, scaled_dot_product_attention with dropout_p.
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False,
                 flash=False):
        super().__init__()
        assert d_out % num_heads == 0
        self.c_attn = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.c_proj = nn.Linear(d_out, d_out, bias=qkv_bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = num_heads
        self.n_embd = d_out
        self.dropout = dropout
        self.flash = flash
        mask = torch.tril(torch.ones(context_length, context_length))
        self.register_buffer("bias", mask.view(1, 1, context_length, context_length))

    def _part_of_c_attn(self, index):
        rows = slice(index * self.n_embd, (index + 1) * self.n_embd)
        bias = None if self.c_attn.bias is None else self.c_attn.bias[rows]
        return SimpleNamespace(weight=self.c_attn.weight[rows], bias=bias)

    W_query = property(lambda self: self._part_of_c_attn(0))
    W_key = property(lambda self: self._part_of_c_attn(1))
    W_value = property(lambda self: self._part_of_c_attn(2))
    out_proj = property(lambda self: self.c_proj)

    def forward(self, x):
        B, T, _ = x.size()
        C = self.n_embd
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class NanoGPTFlash(NanoGPTCausalSelfAttention):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias, flash=True)


def with_resid_dropout(cls):
    """``cls`` with a dropout after its output, as GPT-2's and nanoGPT's resid_dropout."""

    class WithResidDropout(cls):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
            self.resid_dropout = nn.Dropout(dropout)

        def forward(self, x):
            return self.resid_dropout(super().forward(x))

    WithResidDropout.__name__ = f"{cls.__name__}_with_resid_dropout"
    return WithResidDropout


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(NanoGPTCausalSelfAttention, id="nanogpt"),
        pytest.param(NanoGPTFlash, id="nanogpt-flash"),
        pytest.param(with_resid_dropout(attnlib.MultiHeadAttention), id="attnlib-resid"),
        pytest.param(with_resid_dropout(BookMultiHeadAttention), id="book-resid"),
    ],
)
def test_check_multi_head_attention_accepts_dropout_after_the_output_projection(answer):
    # GPT-2 and nanoGPT drop features after c_proj too (resid_dropout): a legitimate design.
    assert check_multi_head_attention(answer) is True


@pytest.mark.parametrize(
    ("mistake", "named"),
    [
        ("no_dropout", "the only dropout in your module comes after out_proj.*"
                       "attention weights are never dropped"),
        ("dropout_on_scores", "ever zeroed.*Dropout on the scores, before the softmax"),
        ("dropout_one_over_p", r"scaled by 1/p = 5 instead of 1/\(1-p\) = 1.25"),
        ("dropout_in_eval", "dropout must be off after module.eval"),
        ("dropout_on_context", "features are zeroed one by one before out_proj"),
        ("dropout_keep_probability", "drops [78][0-9]% of the attention weights instead of "
                                     "p = 20%.*not 1 - dropout"),
    ],
)
def test_check_multi_head_attention_names_dropout_mistakes_beside_a_resid_dropout(
        mistake, named):
    with pytest.raises(CheckFailed, match=named):
        check_multi_head_attention(with_resid_dropout(make_mha(mistake)))


def test_check_multi_head_attention_names_head_dim_from_d_in():
    class HeadDimFromDIn(BookMultiHeadAttention):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
            self.head_dim = d_in // num_heads

    with pytest.raises(CheckFailed, match="head_dim is d_out // num_heads"):
        check_multi_head_attention(HeadDimFromDIn)


def test_check_multi_head_attention_names_nan_with_its_positions():
    class NanFromRowTwo(BookMultiHeadAttention):
        def forward(self, x):
            out = super().forward(x).clone()
            out[:, 2] = float("nan")
            return out

    with pytest.raises(CheckFailed, match=r"gives nan at positions \[2\]\. The softmax"):
        check_multi_head_attention(NanFromRowTwo)


def test_check_multi_head_attention_names_a_wrapper_of_heads():
    with pytest.raises(CheckFailed, match="has no W_query with a .weight"):
        check_multi_head_attention(attnlib.MultiHeadAttentionWrapper)


def test_check_multi_head_attention_names_per_head_sized_projections():
    class PerHead(BookMultiHeadAttention):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__(d_in, d_out * num_heads, context_length, dropout, num_heads,
                             qkv_bias)

    with pytest.raises(CheckFailed, match=r"W_query.weight has shape \(12, 5\), expected \(6, 5\)"):
        check_multi_head_attention(PerHead)


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        pytest.param("MultiHeadAttention", "a class, but got str", id="a-string"),
        pytest.param(BookMultiHeadAttention(3, 4, 4, 0.0, 2), "not an instance", id="instance"),
        pytest.param(int, "subclass of torch.nn.Module", id="not-a-module"),
    ],
)
def test_check_multi_head_attention_answers_nonsense_clearly(answer, named):
    with pytest.raises(CheckFailed, match=named):
        check_multi_head_attention(answer)


def test_check_multi_head_attention_names_a_wrong_output_shape():
    class PerHeadOutput(BookMultiHeadAttention):
        def forward(self, x):
            return super().forward(x)[..., :-1]

    with pytest.raises(CheckFailed, match=r"returned shape \(4, 7, 5\); expected \(4, 7, 6\)"):
        check_multi_head_attention(PerHeadOutput)


def test_check_multi_head_attention_reports_the_stub():
    class Stub(nn.Module):
        def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
            super().__init__()

        def forward(self, x):
            raise NotImplementedError

    with pytest.raises(CheckFailed, match="no W_query"):
        check_multi_head_attention(Stub)


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda: check_merge_heads(book_merge_heads), id="merge"),
        pytest.param(lambda: check_multi_head_attention(BookMultiHeadAttention), id="mha"),
        pytest.param(lambda: pytest.raises(CheckFailed, check_multi_head_attention,
                                           make_mha("dropout_in_eval")), id="failing"),
    ],
)
def test_checks_leave_the_global_random_state_unchanged(run):
    torch.manual_seed(99)
    before = torch.get_rng_state()
    run()
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_checks_run_on_cuda():
    assert check_merge_heads(book_merge_heads, device="cuda") is True
    assert check_multi_head_attention(BookMultiHeadAttention, device="cuda") is True
    assert check_multi_head_attention(attnlib.MultiHeadAttention, device="cuda") is True
