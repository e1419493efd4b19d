"""The pieces every checker shares (attnlib.exercises._common)."""

import pytest
import torch

from attnlib.exercises import CheckFailed
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
