"""Helpers for the chapter notebooks: show attnlib's own code (so the page never
drifts from the package) and check that the numbers the prose quotes are the
ones the code printed."""

from __future__ import annotations

import ast
import html
import inspect
import math
import numbers
import re
import textwrap
from collections.abc import Callable

import torch

from ._validation import type_name

__all__ = ["show_source", "SourceCode", "expect"]


class SourceCode:
    """The source text of a Python object, shown highlighted in Jupyter.

    ``str(obj)`` is the source itself, verbatim. What a notebook shows (the
    plain-text and the HTML representations) is the same code with its
    docstrings made readable: the reST markup of Sphinx, which the API page
    renders, is rewritten as Markdown-style code spans (see
    ``_readable_docstrings``); the code outside the docstrings is unchanged.

    The HTML representation adds syntax highlighting with Pygments' CSS classes
    (``<div class="highlight">``, ``<span class="k">``), so the page's own code
    colours apply: the book's light and dark themes, and JupyterLab's. Source
    longer than ``COLLAPSE_AFTER`` lines is wrapped in a closed
    ``<details>`` element whose summary names the object and its length, so a
    long listing does not push the chapter's text off the screen; the reader
    opens it with a click (the PDF opens every one).

    Args:
        text: the source code.
        name: the object's name, for the summary line of a collapsed listing.
        collapse: ``True`` or ``False`` to collapse the HTML listing or not;
            ``None`` (the default) collapses it when it has more than
            ``COLLAPSE_AFTER`` lines.

    Raises:
        TypeError: ``text`` or ``name`` is not a str, or ``collapse`` is not
            None or a bool.
    """

    #: CSS class of the ``<div>`` around the code; ``highlight`` is the class
    #: Sphinx themes, JupyterLab and nbconvert colour.
    CSS_CLASS = "highlight"
    #: CSS class of the ``<details>`` element around a collapsed listing.
    DETAILS_CSS_CLASS = "attnlib-source"
    #: Listings longer than this many lines are collapsed by default: about one
    #: screen of code.
    COLLAPSE_AFTER = 50

    def __init__(self, text: str, name: str, collapse: bool | None = None) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type_name(text)}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type_name(name)}")
        if collapse is not None and not isinstance(collapse, bool):
            raise TypeError(f"collapse must be None or a bool, got {collapse!r}")
        self.text = text
        self.name = name
        self.collapse = collapse

    @property
    def display_text(self) -> str:
        """The source as a notebook shows it, docstrings without reST markup."""
        return _readable_docstrings(self.text)

    @property
    def num_lines(self) -> int:
        """The number of lines of the listing."""
        return self.text.count("\n") + 1

    @property
    def collapsed(self) -> bool:
        """Whether the HTML listing is collapsed (closed) by default."""
        if self.collapse is not None:
            return self.collapse
        return self.num_lines > self.COLLAPSE_AFTER

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.display_text

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        # Classes, not inline colours: fixed light-theme colours read badly on a
        # dark background (blue names at 1.5:1 contrast).
        code = highlight(self.display_text, PythonLexer(),
                         HtmlFormatter(cssclass=self.CSS_CLASS))
        if not self.collapsed:
            return code
        summary = (f"Show the source of <code>{html.escape(self.name)}</code> "
                   f"({self.num_lines} lines)")
        return (f'<details class="{self.DETAILS_CSS_CLASS}">'
                f"<summary>{summary}</summary>\n{code}</details>")


#: ``:role:`target``` and ``:domain:role:`target```, as Sphinx writes cross-references.
_ROLE = re.compile(r":(?:[A-Za-z]+:)?[A-Za-z]+:`([^`]+)`")
#: ``` ``literal`` ```, reST's inline code.
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
#: ```text <https://...>`_``, a reST hyperlink.
_LINK = re.compile(r"`([^`<]+?)\s*<([^`>]+)>`__?")


def _role_text(match: re.Match[str]) -> str:
    """How Sphinx shows a cross-reference: its title, or its target; ``~`` keeps
    the last name only."""
    target = match.group(1).strip()
    titled = re.fullmatch(r"(.+?)\s*<[^<>]+>", target, re.DOTALL)
    if titled:
        return f"`{titled.group(1)}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _readable(docstring: str) -> str:
    """A docstring's text with its reST roles, literals and links made plain."""
    docstring = _ROLE.sub(_role_text, docstring)
    docstring = _LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", docstring)
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", docstring)


def _docstring_spans(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """(first line, first column, last line, end column) of every docstring in
    ``tree``: lines 1-based, columns in bytes of UTF-8, as :mod:`ast` gives them."""
    spans: list[tuple[int, int, int, int]] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        # ast.parse sets every statement's end; the stubs allow None (a node built by hand).
        last, end = first.end_lineno, first.end_col_offset
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str) and last is not None
                and end is not None):
            spans.append((first.lineno, first.col_offset, last, end))
    return spans


def _readable_docstrings(text: str) -> str:
    """Rewrite the reST markup in the docstrings of the source ``text`` as plain text.

    attnlib's docstrings are written for Sphinx, which turns their markup into
    links and code on the API page. Printed raw in a chapter, that markup is
    noise. In each docstring (and nowhere else):

    - ``:class:`~attnlib.KVCache``` (any role) becomes ```KVCache``` (the last
      name, as Sphinx shows it); ``:func:`attnlib.softmax``` becomes
      ```attnlib.softmax```; ``:meth:`title <target>``` becomes ```title```;
    - ``` ``x`` ``` becomes ```x```, a Markdown code span;
    - a link ```text <url>`_`` becomes ``text (url)``.

    The code outside the docstrings is returned verbatim, and so is ``text`` when
    it does not parse (a lambda cut out of a longer line).

    Args:
        text: Python source code: a function, a class or a module.

    Returns:
        The source with readable docstrings, with as many lines as ``text``.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type_name(text)}")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.split("\n")
    # From the last docstring to the first, so earlier offsets stay valid.
    for first, start, last, end in sorted(_docstring_spans(tree), reverse=True):
        head = lines[first - 1].encode()
        tail = lines[last - 1].encode()
        prefix, suffix = head[:start].decode(), tail[end:].decode()
        if first == last:
            body = head[start:end].decode()
        else:
            body = "\n".join([head[start:].decode(), *lines[first:last - 1],
                              tail[:end].decode()])
        lines[first - 1:last] = (prefix + _readable(body) + suffix).split("\n")
    return "\n".join(lines)


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


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``node`` is decorated with ``@overload`` (or ``@typing.overload``)."""
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in node.decorator_list
    )


def _drop_overloads(text: str) -> str:
    """Remove the ``@overload`` stubs from the source ``text``, with the blank lines after each.

    The stubs declare, for the type checker, how the return type of the definition
    that follows them depends on its arguments (``return_weights``); a reader sees
    the same in that definition's docstring. ``text`` is returned unchanged when
    it has no stub or does not parse.
    """
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    stubs = sorted(
        (node.decorator_list[0].lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_overload(node)
    )
    if not stubs:
        return text
    lines = text.split("\n")
    # From the last stub to the first, so earlier line numbers stay valid.
    for first, last in reversed(stubs):
        while last < len(lines) and not lines[last].strip():
            last += 1  # the blank lines after the stub (ast lines are 1-based)
        del lines[first - 1 : last]
    return "\n".join(lines)


def show_source(
    obj: Callable[..., object], *, docstring: bool = True, collapse: bool | None = None
) -> SourceCode:
    """Return the source code of an attnlib function, class or method.

    The ``@overload`` stubs of a class's methods (which tell a type checker how
    ``forward``'s return type depends on ``return_weights``) are left out: the
    listing shows each method once, as it runs.

    Args:
        obj: a function, class or method defined in Python source.
        docstring: keep the docstring; ``False`` removes it to show the code only.
        collapse: in the HTML (the book), show the listing closed, under a line
            that names ``obj`` and its length; ``None`` (the default) does so when
            it has more than ``SourceCode.COLLAPSE_AFTER`` lines.

    Returns:
        A :class:`SourceCode`, which a notebook displays highlighted, with the
        docstring's reST markup made readable (``_readable_docstrings``).

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a module attribute
            that is a plain value, ...), or ``docstring`` is not a bool, or
            ``collapse`` is not None or a bool.
    """
    if not isinstance(docstring, bool):
        raise TypeError(f"docstring must be a bool, got {docstring!r}")
    if collapse is not None and not isinstance(collapse, bool):
        raise TypeError(f"collapse must be None or a bool, got {collapse!r}")
    try:
        text = inspect.getsource(obj)
    except (TypeError, OSError) as exc:
        raise TypeError(f"cannot show the source of {obj!r}: {exc}") from None
    text = _drop_overloads(textwrap.dedent(text).rstrip("\n"))
    if not docstring:
        text = _drop_docstring(text)
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    return SourceCode(text, name, collapse)


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
