"""A pytest plugin that reports a failed check as the checker's message alone.

In an instructor's assignment (one test per exercise, each calling a checker),
pytest's own report of a :class:`~attnlib.exercises.CheckFailed` shows the
checker's source, its probe tensors and a summary line cut to
``attnlib.exercises._common.CheckFail...``. With this plugin the report of such
a failure is one line, ``CheckFailed: <the checker's message>``, in the
failure's section and in the short test summary. Every other failure (a
submission that does not import, an ordinary ``assert``, a ``TypeError`` in the
test itself) is reported as pytest always reports it.

Load it for one run::

    pytest -p attnlib.exercises.pytest_plugin test_assignment.py

or for every run in an assignment's folder, with a line in its ``conftest.py``::

    pytest_plugins = ["attnlib.exercises.pytest_plugin"]

It needs pytest with pluggy 1.2 or newer (its hook is a new-style wrapper,
``wrapper=True``), which pytest 8 and later bring; pytest is not a dependency of
attnlib, and importing this module without it fails. It changes nothing in
attnlib itself.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from ._common import CheckFailed

__all__: list[str] = []


class _CheckFailedReports:
    """The plugin's one hook, as a method.

    pytest finds the hook as the module's attribute ``pytest_runtest_makereport``;
    binding it from an instance keeps the module free of public functions, which
    the API page would otherwise list (it documents the checkers, not pytest's hooks).
    """

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Replace the long report of a ``CheckFailed`` by ``CheckFailed: <message>``.

        A string report is what pytest prints in the failure's section and, cut to
        the terminal's width, after the test's name in the short summary
        (``-ra``, ``-rf``).
        """
        report = yield
        if (report.failed and call.excinfo is not None
                and call.excinfo.errisinstance(CheckFailed)):
            report.longrepr = f"CheckFailed: {call.excinfo.value}"
        return report


pytest_runtest_makereport = _CheckFailedReports().pytest_runtest_makereport
