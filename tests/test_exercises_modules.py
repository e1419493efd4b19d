"""attnlib.exercises.modules: the checkers of chapter 4 accept the right answers
and name each typical wrong one."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import attnlib
from attnlib.exercises import CheckFailed, check_self_attention_v2, check_weight_transfer

# --------------------------------------------------------------------------- answers


class BookSelfAttention(nn.Module):
    """The book's solution to the exercise (chapter 4)."""

    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        queries = self.W_query(x)
        keys = self.W_key(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


def variant(*, scale="sqrt_dk", dim=-1, swap=False, raw_weight=False, dot_t=False,
            weights="softmax"):
    """A SelfAttention_v2-like class with one deliberate mistake."""

    class Variant(BookSelfAttention):
        def forward(self, x):
            if raw_weight:
                queries, keys, values = (x @ layer.weight for layer in
                                         (self.W_query, self.W_key, self.W_value))
            else:
                queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
            if swap:
                queries, keys = keys, queries
            keys_t = keys.T if dot_t else keys.transpose(-2, -1)
            scores = queries @ keys_t
            divisor = {"sqrt_dk": keys.shape[-1] ** 0.5, "none": 1.0,
                       "sqrt_d_in": x.shape[-1] ** 0.5, "d_k": keys.shape[-1],
                       "times_sqrt_dk": keys.shape[-1] ** -0.5,
                       "sqrt_num_tokens": keys.shape[0] ** 0.5}[scale]
            if weights == "scaled_after":
                return torch.softmax(scores, dim=dim) / keys.shape[-1] ** 0.5 @ values
            if weights == "none":
                return scores / divisor @ values
            attn_weights = torch.softmax(scores / divisor, dim=dim)
            if weights == "transposed":
                attn_weights = attn_weights.transpose(-2, -1)
            return attn_weights @ values

    return Variant


class NaiveSoftmax(BookSelfAttention):
    """The book's solution with a softmax written without the max shift."""

    def forward(self, x):
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
        attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
        exp_scores = torch.exp(attn_scores)
        return exp_scores / exp_scores.sum(dim=-1, keepdim=True) @ values


class NoBias(BookSelfAttention):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__(d_in, d_out, qkv_bias=False)


class SwappedLinear(BookSelfAttention):
    def __init__(self, d_in, d_out, qkv_bias=False):
        nn.Module.__init__(self)
        self.W_query = nn.Linear(d_out, d_in, bias=qkv_bias)
        self.W_key = nn.Linear(d_out, d_in, bias=qkv_bias)
        self.W_value = nn.Linear(d_out, d_in, bias=qkv_bias)


class Parameters(nn.Module):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))


def book_transfer(sa_v1, sa_v2):
    """The book's solution to the weight-transfer exercise (chapter 4)."""
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)


def no_transpose(sa_v1, sa_v2):
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(sa_v1, name).copy_(getattr(sa_v2, name).weight)


def no_transpose_reshaped(sa_v1, sa_v2):
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            param = getattr(sa_v1, name)
            param.copy_(getattr(sa_v2, name).weight.reshape(param.shape))


def mixed_up(sa_v1, sa_v2):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)


def wrong_direction(sa_v1, sa_v2):
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(sa_v2, name).weight.copy_(getattr(sa_v1, name).T)


def shared_memory(sa_v1, sa_v2):
    for name in ("W_query", "W_key", "W_value"):
        setattr(sa_v1, name, nn.Parameter(getattr(sa_v2, name).weight.T))


def new_parameters(sa_v1, sa_v2):
    for name in ("W_query", "W_key", "W_value"):
        setattr(sa_v1, name, nn.Parameter(getattr(sa_v2, name).weight.T.clone()))


def without_no_grad(sa_v1, sa_v2):
    sa_v1.W_query.copy_(sa_v2.W_query.weight.T)


def does_nothing(sa_v1, sa_v2):
    return None


def forgets_one(sa_v1, sa_v2):
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)


# --------------------------------------------------------------------------- self-attention class


def test_the_reference_and_the_books_solution_pass(capsys):
    assert check_self_attention_v2(attnlib.SelfAttention_v2) is True
    assert check_self_attention_v2(BookSelfAttention) is True
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (variant(scale="none"), "does not scale the scores"),
        (variant(scale="sqrt_d_in"), "divides the scores by sqrt(d_in)"),
        (variant(scale="d_k"), "divides the scores by d_k instead of sqrt(d_k)"),
        (variant(dim=-2), "softmax over the queries (dim=-2"),
        (variant(dim=0), "softmax over the queries"),
        (variant(dim=1), "softmax over the queries"),
        (variant(swap=True), "swaps queries and keys"),
        (variant(raw_weight=True), "multiplies by the stored weight, x @ W.weight"),
        (variant(scale="times_sqrt_dk"), "multiplies the scores by sqrt(d_k) instead"),
        (variant(scale="sqrt_num_tokens"), "divides the scores by sqrt(num_tokens)"),
        (variant(weights="scaled_after"), "divides the attention weights by sqrt(d_k) after"),
        (variant(weights="transposed"), "multiplies the values by the transposed weights"),
        (variant(weights="none"), "leaves out the softmax"),
    ],
    ids=["unscaled", "sqrt_d_in", "d_k", "dim-2", "dim0", "dim1", "swapped", "raw_weight",
         "times_sqrt_dk", "sqrt_num_tokens", "scaled_after", "weights_transposed",
         "no_softmax"],
)
def test_each_wrong_forward_is_named(answer, named):
    with pytest.raises(CheckFailed) as failure:
        check_self_attention_v2(answer)
    assert named in str(failure.value)


def test_a_softmax_without_the_max_shift_is_named():
    # Right on every probe but the last, whose scores in the thousands overflow exp.
    message = str(pytest.raises(CheckFailed, check_self_attention_v2, NaiveSoftmax).value)
    assert message.startswith("NaiveSoftmax(d_in=5, d_out=3, qkv_bias=False) overflows: its "
                              "softmax is the naive exp(s) / exp(s).sum()")
    assert "scores in the thousands" in message


def test_a_softmax_that_subtracts_the_row_maximum_passes():
    class StableSoftmax(BookSelfAttention):
        def forward(self, x):
            queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
            attn_scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5
            exp_scores = torch.exp(attn_scores - attn_scores.amax(dim=-1, keepdim=True))
            return exp_scores / exp_scores.sum(dim=-1, keepdim=True) @ values

    assert check_self_attention_v2(StableSoftmax) is True


@pytest.mark.filterwarnings("ignore:The use of `x.T` on tensors")
def test_dot_t_on_a_batch_is_explained():
    with pytest.raises(CheckFailed, match=r"works on one sequence but not on a batch.*keys.T"):
        check_self_attention_v2(variant(dot_t=True))


def test_a_batch_only_answer_is_explained():
    class BatchOnly(BookSelfAttention):
        def forward(self, x):
            queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
            scores = queries @ keys.permute(0, 2, 1)
            return torch.softmax(scores / keys.shape[-1] ** 0.5, dim=2) @ values

    with pytest.raises(CheckFailed, match="works on a batch but not on one sequence"):
        check_self_attention_v2(BatchOnly)


def test_qkv_bias_not_passed_on_is_named():
    with pytest.raises(CheckFailed, match="has no bias although qkv_bias=True"):
        check_self_attention_v2(NoBias)


def test_linear_layers_with_swapped_sizes_are_named():
    with pytest.raises(CheckFailed, match=r"nn.Linear takes \(in_features, out_features\)"):
        check_self_attention_v2(SwappedLinear)


def test_a_class_without_forward_is_named():
    class NoForward(nn.Module):
        def __init__(self, d_in, d_out, qkv_bias=False):
            super().__init__()
            self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
            self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    with pytest.raises(CheckFailed, match="has no forward method"):
        check_self_attention_v2(NoForward)


def test_parameters_instead_of_linear_layers_are_named():
    with pytest.raises(CheckFailed, match="has no nn.Linear attribute W_query"):
        check_self_attention_v2(Parameters)


def test_nonsense_gets_a_clear_message():
    with pytest.raises(CheckFailed, match="a class, but got str"):
        check_self_attention_v2("SelfAttention_v2")
    with pytest.raises(CheckFailed, match="Pass the class itself, not an instance"):
        check_self_attention_v2(BookSelfAttention(3, 2))
    with pytest.raises(CheckFailed, match="subclass of torch.nn.Module"):
        check_self_attention_v2(int)


def test_a_stub_says_to_fill_it_in():
    class Stub(nn.Module):
        def __init__(self, d_in, d_out, qkv_bias=False):
            super().__init__()
            raise NotImplementedError("write __init__")

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_self_attention_v2(Stub)


def test_wrong_output_shape_is_reported():
    class ReturnsWeights(BookSelfAttention):
        def forward(self, x):
            scores = self.W_query(x) @ self.W_key(x).transpose(-2, -1)
            return torch.softmax(scores, dim=-1)

    with pytest.raises(CheckFailed, match="returned shape"):
        check_self_attention_v2(ReturnsWeights)


def test_an_unknown_mistake_reports_the_difference():
    class Doubled(BookSelfAttention):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(CheckFailed, match="matches none of the typical mistakes"):
        check_self_attention_v2(Doubled)


def test_self_attention_check_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    check_self_attention_v2(BookSelfAttention)
    with pytest.raises(CheckFailed):
        check_self_attention_v2(variant(scale="none"))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_self_attention_check_on_cuda():
    assert check_self_attention_v2(BookSelfAttention, device="cuda") is True


# --------------------------------------------------------------------------- weight transfer


def test_the_books_transfer_passes(capsys):
    assert check_weight_transfer(book_transfer) is True
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (no_transpose, "forgot the transpose"),
        (no_transpose_reshaped, "reshape and view keep the numbers in their order"),
        (mixed_up, "mixed up the matrices: sa_v1.W_query holds sa_v2.W_key.weight.T"),
        (wrong_direction, "copied in the wrong direction"),
        (shared_memory, "share memory with sa_v2.W_query.weight"),
        (new_parameters, "replaced sa_v1.W_query by a new nn.Parameter instead of copying"),
        (without_no_grad, "torch.no_grad()"),
        (does_nothing, "did not change sa_v1.W_query"),
        (forgets_one, "did not change sa_v1.W_value"),
    ],
    ids=["no_transpose", "no_transpose_reshaped", "mixed_up", "wrong_direction",
         "shared_memory", "new_parameters", "no_grad", "nothing", "forgets_one"],
)
def test_each_wrong_transfer_is_named(answer, named):
    with pytest.raises(CheckFailed) as failure:
        check_weight_transfer(answer)
    assert named in str(failure.value)


def test_no_transpose_on_unequal_sizes_says_to_transpose():
    """Only the square probe lets the untransposed copy run; with d_in != d_out
    copy_ fails, and the message says why."""

    def untransposed_only_when_it_fits(sa_v1, sa_v2):
        with torch.no_grad():
            for name in ("W_query", "W_key", "W_value"):
                getattr(sa_v1, name).copy_(getattr(sa_v2, name).weight)

    # The square probe names it first; check the unequal probe's hint on its own.
    def transposes_only_square(sa_v1, sa_v2):
        if sa_v1.d_in == sa_v1.d_out:
            book_transfer(sa_v1, sa_v2)
        else:
            untransposed_only_when_it_fits(sa_v1, sa_v2)

    with pytest.raises(CheckFailed, match=r"Copy the transpose, sa_v2.W_query.weight.T"):
        check_weight_transfer(transposes_only_square)


def test_transfer_nonsense_gets_a_clear_message():
    with pytest.raises(CheckFailed, match="a function, but got str"):
        check_weight_transfer("book_transfer")
    with pytest.raises(CheckFailed, match="raised NotImplementedError"):
        check_weight_transfer(lambda a, b: (_ for _ in ()).throw(NotImplementedError()))


def test_transfer_check_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    check_weight_transfer(book_transfer)
    with pytest.raises(CheckFailed):
        check_weight_transfer(no_transpose)
    assert torch.equal(torch.get_rng_state(), state)


def test_bad_device_is_refused():
    with pytest.raises(TypeError, match="device must be"):
        check_weight_transfer(book_transfer, device=3)
