"""Helpers for the chapter notebooks: show attnlib's own code (so the page never
drifts from the package) and check that the numbers the prose quotes are the
ones the code printed."""

from __future__ import annotations

import ast
import inspect
import math
import numbers
import textwrap

import torch

__all__ = ["show_source", "SourceCode", "expect"]


class SourceCode:
    """The source text of a Python object, shown highlighted in Jupyter.

    ``str(obj)`` and the plain-text representation are the source itself; in a
    notebook the HTML representation adds syntax highlighting with Pygments'
    CSS classes (``<div class="highlight">``, ``<span class="k">``), so the page's
    own code colours apply: the book's light and dark themes, and JupyterLab's.
    """

    #: CSS class of the ``<div>`` around the code; ``highlight`` is the class
    #: Sphinx themes, JupyterLab and nbconvert colour.
    CSS_CLASS = "highlight"

    def __init__(self, text: str, name: str):
        self.text = text
        self.name = name

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        # Classes, not inline colours: fixed light-theme colours read badly on a
        # dark background (blue names at 1.5:1 contrast).
        return highlight(self.text, PythonLexer(), HtmlFormatter(cssclass=self.CSS_CLASS))


def _drop_docstring(text: str) -> str:
    """Remove the docstring of the function or class whose source is ``text``."""
    tree = ast.parse(text)
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return text
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return text
    lines = text.split("\n")
    # ast line numbers are 1-based and inclusive.
    del lines[first.lineno - 1 : first.end_lineno]
    return "\n".join(lines)


def show_source(obj, *, docstring: bool = True) -> SourceCode:
    """Return the source code of an attnlib function, class or method.

    Args:
        obj: a function, class or method defined in Python source.
        docstring: keep the docstring; ``False`` removes it to show the code only.

    Returns:
        A :class:`SourceCode`, which a notebook displays highlighted.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a module attribute
            that is a plain value, ...).
    """
    try:
        text = inspect.getsource(obj)
    except (TypeError, OSError) as exc:
        raise TypeError(f"cannot show the source of {obj!r}: {exc}") from None
    text = textwrap.dedent(text).rstrip("\n")
    if not docstring:
        text = _drop_docstring(text)
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    return SourceCode(text, name)


def _as_numbers(value: object) -> list[float] | None:
    """A flat list of floats for a number, a tensor or a (nested) list, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return [float(value)]
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.detach().cpu().double().flatten().tolist()]
    if isinstance(value, (list, tuple)):
        flat: list[float] = []
        for item in value:
            inner = _as_numbers(item)
            if inner is None:
                return None
            flat.extend(inner)
        return flat
    return None


def expect(name: str, actual: object, expected: object, decimals: int | None = 4) -> None:
    """Check that a value the prose quotes is the value the code computed.

    Each chapter ends its sections with one small cell of these checks, tagged
    ``remove-input`` so that the book shows only its (empty) output. They keep
    the text and the printed numbers in step as strictly as ``round(x, 4) ==``
    would, and tell a reader who changed the code why a check now fails.

    Args:
        name: what the value is, as the text calls it (``"context_vec_2"``).
        actual: the computed value: a number, a tensor, or a (nested) list of
            numbers; or any other object, compared with ``==``.
        expected: the value the prose quotes, of the same shape.
        decimals: numbers match when ``actual`` rounds to ``expected`` at this
            many decimals (``|actual - expected| <= 0.5 * 10**-decimals``);
            None asks for exact equality.

    Raises:
        AssertionError: the values differ; the message shows both and says
            that after a change to the code above a mismatch is expected.
    """
    got, want = _as_numbers(actual), _as_numbers(expected)
    if got is not None and want is not None and decimals is not None:
        tolerance = 0.5 * 10.0 ** (-decimals) * (1 + 1e-9) + 1e-12
        same = len(got) == len(want) and all(
            math.isclose(g, w, rel_tol=0.0, abs_tol=tolerance)
            for g, w in zip(got, want, strict=True)
        )
    else:
        same = bool(actual == expected) if not isinstance(actual, torch.Tensor) else bool(
            torch.equal(actual, torch.as_tensor(expected, dtype=actual.dtype))
        )
    if not same:
        where = f" to {decimals} decimals" if decimals is not None else ""
        raise AssertionError(
            f"{name} is {actual!r}, but the text quotes {expected!r}{where}. If you changed the "
            "code above, this is expected: the text describes the original run. Otherwise, "
            "please report it."
        )
