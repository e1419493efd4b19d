"""Show attnlib's own code inside a notebook, so the page never drifts from the package."""

from __future__ import annotations

import inspect

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
    text = inspect.cleandoc("\n" + text) if text.startswith((" ", "\t")) else text.rstrip("\n")
    if not docstring:
        doc = inspect.getdoc(obj)
        raw = getattr(obj, "__doc__", None)
        if doc and raw:
            for quote in ('"""', "'''"):
                block = quote + raw + quote
                start = text.find(block)
                if start != -1:
                    line_start = text.rfind("\n", 0, start) + 1
                    end = start + len(block)
                    line_end = text.find("\n", end)
                    text = text[:line_start] + text[(line_end + 1 if line_end != -1 else end):]
                    break
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    return SourceCode(text, name)
