"""The pieces every checker shares (attnlib.exercises._common)."""

import linecache
import math

import pytest
import torch

import attnlib
from attnlib.exercises import (
    CheckFailed,
    check_causal_attention,
    check_scaled_dot_product_attention,
)
from attnlib.exercises._common import call_answer, checker


def test_check_failed_is_an_assertion_error_so_pytest_reports_a_failure():
    assert issubclass(CheckFailed, AssertionError)


def test_a_notebook_shows_only_the_message_not_the_checkers_stack():
    error = CheckFailed("the scores are not scaled: divide by sqrt(d_k)")
    assert error._render_traceback_() == [
        "CheckFailed: the scores are not scaled: divide by sqrt(d_k)"
    ]


def test_a_stub_is_reported_as_a_stub():
    def stub(x):
        raise NotImplementedError("write it")

    with pytest.raises(CheckFailed, match="raised NotImplementedError: replace the stub"):
        call_answer(stub, 1, what="my_fn(x)")


def test_the_checker_decorator_leaves_the_global_rng_alone():
    @checker
    def draws():
        torch.rand(3)
        return True

    before = torch.get_rng_state()
    assert draws()
    assert torch.equal(before, torch.get_rng_state())


# --- what a message shows when the learner's code raises -----------------------------------


def d2l_attention(queries, keys, values):
    """d2l's DotProductAttention.forward as a function: torch.bmm wants a batch."""
    d = queries.shape[-1]
    scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
    return torch.bmm(torch.softmax(scores, dim=-1), values)


def test_an_error_in_the_learners_code_shows_the_shapes_and_dtypes_it_was_called_with():
    # On check_scaled_dot_product_attention's first probe, which has no batch dimension,
    # keys.transpose(1, 2) raises; the message says with which inputs and on which line.
    with pytest.raises(CheckFailed) as info:
        check_scaled_dot_product_attention(d2l_attention)
    message = str(info.value)
    assert message.startswith("d2l_attention(query, key, value) raised ")
    assert "when called with queries (shape (5, 4), torch.float64), keys (shape (5, 4), " \
        "torch.float64) and values (shape (5, 3), torch.float64)" in message
    assert "of d2l_attention, `scores = torch.bmm(queries, keys.transpose(1, 2)) / " \
        "math.sqrt(d)`" in message


def notebook_cell(source: str) -> dict:
    """Run ``source`` as IPython runs a notebook cell (a file name of its own, the
    lines in linecache, and no pytest assertion rewriting); return its names."""
    filename = "/tmp/ipykernel_0/2718281828.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    names: dict = {"torch": torch}
    exec(compile(source, filename, "exec"), names)
    return names


def test_a_bare_assert_in_the_learners_code_is_shown_with_its_line_and_inputs():
    only_batches = notebook_cell(
        "def only_batches(query, key, value):\n"
        "    assert query.ndim == 3\n"
        "    return torch.softmax(query @ key.mT / query.shape[-1] ** 0.5, dim=-1) @ value\n"
    )["only_batches"]
    with pytest.raises(CheckFailed) as info:
        check_scaled_dot_product_attention(only_batches)
    assert str(info.value) == (
        "only_batches(query, key, value) raised AssertionError at line 2 of only_batches, "
        "`assert query.ndim == 3`, when called with query (shape (5, 4), torch.float64), "
        "key (shape (5, 4), torch.float64) and value (shape (5, 3), torch.float64)"
    )


def test_an_error_in_a_learners_module_shows_the_input_of_forward():
    class FixedWidth(attnlib.CausalAttention):
        def forward(self, x):
            if x.shape[-1] != 768:
                raise ValueError("expected GPT-2's width")
            return super().forward(x)

    with pytest.raises(CheckFailed) as info:
        check_causal_attention(FixedWidth)
    message = str(info.value)
    assert "raised ValueError at line" in message and "of forward, `raise ValueError(" in message
    assert message.endswith("when called with x (shape (2, 7, 5), torch.float64): "
                            "expected GPT-2's width")


def test_other_arguments_are_shown_by_name_and_value():
    def repeat(x, group_size):
        raise KeyError("no such head")

    with pytest.raises(CheckFailed, match=r"when called with x \(shape \(2, 3\), torch.float32\) "
                                          r"and group_size=4: 'no such head'"):
        call_answer(repeat, torch.zeros(2, 3), group_size=4, what="repeat(x, 4)")


def test_a_stub_is_reported_without_the_inputs():
    def stub(x):
        raise NotImplementedError

    with pytest.raises(CheckFailed) as info:
        call_answer(stub, torch.zeros(2), what="stub(x)")
    assert str(info.value) == ("stub(x) raised NotImplementedError: replace the stub's "
                               "`raise NotImplementedError` with your code.")
