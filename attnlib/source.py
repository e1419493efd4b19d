"""Show attnlib's own code inside a notebook, so the page never drifts from the package."""

from __future__ import annotations

import ast
import inspect
import textwrap

__all__ = ["show_source", "SourceCode"]


class SourceCode:
    """The source text of a Python object, shown highlighted in Jupyter.

    ``str(obj)`` and the plain-text representation are the source itself; in a
    notebook the HTML representation adds syntax highlighting.
    """

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

        return highlight(self.text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))


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
