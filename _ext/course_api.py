"""The API reference, generated from attnlib's docstrings on every build.

The reference is one page per module (``api/*.md``), each under the index page
``api.md``, in ``_toc.yml``. A page holds its title and a marker line,
``<!-- attnlib-api: attnlib.attention -->``, which this extension replaces with
the module's ``automodule`` (``:members:`` and ``:undoc-members:``: every name in
the module's ``__all__`` is listed). A module too long for one page on a phone is
split over several: the marker then names what its page holds, after the module,
``<!-- attnlib-api: attnlib.exercises module CheckFailed basics scaling -->``:
``module`` (the module's docstring and target, on one of its pages), names of its
``__all__``, and submodules (every name of ``__all__`` defined there). A public
module on no page, or a name of a split module on none or on two, is a warning,
which ``-W`` fails. ``api.md`` holds the prose and the marker
``<!-- attnlib-api-modules -->``, replaced with a line per page: its title and
the first sentence of the module's docstring (or the page's own first paragraph).

The checkers of ``attnlib.exercises`` live in submodules and are re-exported by
the package, so they are listed once, under ``attnlib.exercises``;
``attnlib.exercises._common``, the toolkit for writing a checker, gets its own page.

References that Sphinx cannot resolve inside the book (``torch.Tensor``,
``numpy.ndarray``, Python's own types) become links to PyTorch's, NumPy's and
Python's documentation: those names are not "nitpick" errors, and a reader can
follow them. Anything else unresolved stays a warning, which ``-W`` fails.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

MARKER = "<!-- attnlib-api-modules -->"
API_DOC = "api"
#: The folder of the module pages, beside api.md.
API_DIR = "api"
PAGE_MARKER = re.compile(
    r"^<!-- attnlib-api: (?P<module>[\w.]+)(?P<tokens>(?: [\w.]+)*) -->$", re.M)

#: Documented in their own section although their name starts with "_".
EXTRA_MODULES = ("attnlib.exercises._common",)


def public_modules() -> list[str]:
    """attnlib's public modules, in the order the API page lists them."""
    import attnlib

    names = ["attnlib"]
    for info in pkgutil.walk_packages(attnlib.__path__, "attnlib."):
        parts = info.name.split(".")
        if any(part.startswith("_") for part in parts):
            continue
        # Checkers are re-exported by attnlib.exercises: list them there, once.
        if parts[:2] == ["attnlib", "exercises"] and len(parts) > 2:
            continue
        names.append(info.name)
    names += [name for name in EXTRA_MODULES if importlib.util.find_spec(name)]
    return names


def label(module: str) -> str:
    """The page's target for a module's section: ``{ref}`api-attnlib-exercises```."""
    return "api-" + module.replace(".", "-").replace("_", "")


def undocumented_data(module: str) -> list[str]:
    """Names in ``module.__all__`` that are plain values without a ``#:`` comment.

    autodoc's ``:undoc-members:`` lists undocumented functions and classes, but
    leaves out such a constant without a word: each gets an ``autodata`` entry.
    """
    from sphinx.pycode import ModuleAnalyzer

    obj = importlib.import_module(module)
    documented = {name for (_, name) in ModuleAnalyzer.for_module(module).find_attr_docs()}
    return [name for name in getattr(obj, "__all__", [])
            if name not in documented and not callable(getattr(obj, name))
            and not isinstance(getattr(obj, name), type(obj))]


@dataclass
class Page:
    """A page of the reference: ``api/attention`` holds ``attnlib.attention``."""

    docname: str
    title: str
    summary: str | None  # the page's own first paragraph, if it has one
    module: str
    tokens: tuple[str, ...]  # empty: the whole module

    @property
    def whole(self) -> bool:
        return not self.tokens

    def names(self) -> list[str]:
        """The names of the module's ``__all__`` that this page documents, in order."""
        obj = importlib.import_module(self.module)
        every = list(getattr(obj, "__all__", []))
        if self.whole:
            return every
        # In the tokens' order (a split module's pages go chapter by chapter).
        return [name for token in self.tokens for name in every
                if name == token or _home(self.module, name) == f"{self.module}.{token}"]


def _home(module: str, name: str) -> str:
    """The module that defines ``module.name`` (a value without one: ``module``)."""
    return getattr(getattr(importlib.import_module(module), name), "__module__", None) or module


def _page(srcdir: Path, path: Path) -> Page | None:
    text = path.read_text()
    found = PAGE_MARKER.search(text)
    if found is None:
        return None
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "")
    between = text[text.index("# "):found.start()].split("\n", 1)[-1]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", between)
                  if p.strip() and not p.strip().startswith(("(", "<!--"))]
    docname = path.relative_to(srcdir).with_suffix("").as_posix()
    return Page(docname, title, " ".join(paragraphs[0].split()) if paragraphs else None,
                found["module"], tuple(found["tokens"].split()))


def api_pages(srcdir: str | Path) -> list[Page]:
    """The module pages of the reference, in the order of ``public_modules()``."""
    srcdir = Path(srcdir)
    pages = [page for path in sorted((srcdir / API_DIR).glob("*.md"))
             if (page := _page(srcdir, path)) is not None]
    order = {name: float(i) for i, name in enumerate(public_modules())}
    for name in EXTRA_MODULES:  # after the package it belongs to
        order[name] = order.get(name.rsplit(".", 1)[0], len(order)) + 0.5
    def natural(docname: str) -> list:  # exercises_6_to_10 before exercises_11_to_13
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", docname)]

    return sorted(pages, key=lambda page: (order.get(page.module, len(order)),
                                           natural(page.docname)))


def placement_problems(pages: list[Page]) -> list[str]:
    """What the pages leave out or hold twice: a public module on no page, a name of
    a split module on none or on two, a token that names nothing."""
    problems = []
    by_module: dict[str, list[Page]] = {}
    for page in pages:
        by_module.setdefault(page.module, []).append(page)
    for module in public_modules():
        if module not in by_module:
            problems.append(f"{module} is on no page of {API_DIR}/ (add {API_DIR}/NAME.md"
                            f" with the line '<!-- attnlib-api: {module} -->', and it to _toc.yml)")
    for module, group in by_module.items():
        if len(group) == 1 and group[0].whole:
            continue
        every = getattr(importlib.import_module(module), "__all__", [])
        for page in group:
            if page.whole:
                problems.append(f"{page.docname}: {module} is split, so its page must name"
                                " what it holds")
            unknown = [token for token in page.tokens
                       if token != "module" and token not in every and not any(
                           _home(module, name) == f"{module}.{token}" for name in every)]
            if unknown:
                problems.append(f"{page.docname}: {unknown} name nothing in {module}")
        for name in every:
            holders = [page.docname for page in group if name in page.names()]
            if len(holders) != 1:
                problems.append(f"{module}.{name} is on {len(holders)} pages: {holders}")
        with_module = [page.docname for page in group if "module" in page.tokens or page.whole]
        if len(with_module) != 1:
            problems.append(f"{module}'s docstring is on {len(with_module)} pages: {with_module}")
    return problems


def _member(module: str, name: str) -> str:
    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f"\n.. autoexception:: {name}\n"
    if inspect.isclass(obj):
        return f"\n.. autoclass:: {name}\n   :members:\n   :undoc-members:\n"
    if callable(obj):
        return f"\n.. autofunction:: {name}\n"
    return f"\n.. autodata:: {name}\n"


def documented_elsewhere(module: str) -> list[tuple[str, str]]:
    """Names of ``module.__all__`` that another public module defines and documents
    (``attnlib.functional.flash_attention`` is ``attnlib.flash``'s): (name, home).
    Each public name is documented on one page; here it is a link."""
    obj = importlib.import_module(module)
    public = set(public_modules())
    out = []
    for name in getattr(obj, "__all__", []):
        home = getattr(getattr(obj, name), "__module__", None)
        if (home and home != module and home in public
                and name in getattr(importlib.import_module(home), "__all__", [])):
            out.append((name, home))
    return out


def _top_level_names() -> str:
    """The package's page: each name it re-exports, linked to where it is documented."""
    import attnlib

    lines = []
    for name in attnlib.__all__:
        obj = getattr(attnlib, name)
        if inspect.ismodule(obj):
            lines.append(f"* :py:mod:`attnlib.{name} <{obj.__name__}>` (a module)")
            continue
        homes = [m for m in public_modules()[1:]
                 if name in getattr(importlib.import_module(m), "__all__", [])
                 and getattr(importlib.import_module(m), name) is obj]
        if not homes:
            continue  # documented with the package itself
        home = getattr(obj, "__module__", None)
        home = home if home in homes else homes[0]
        lines.append(f"* :py:obj:`attnlib.{name} <{home}.{name}>` (:py:mod:`{home}`)")
    return ("\n## The names at the top level\n\n"
            "`import attnlib` gives these names, each documented with its module:\n\n"
            "```{eval-rst}\n" + "\n".join(lines) + "\n```\n")


def page_body(page: Page) -> str:
    """The directives that replace a page's marker."""
    module = page.module
    if module == "attnlib":
        # The package re-exports names documented in their own modules.
        return ("```{eval-rst}\n.. automodule:: attnlib\n   :no-members:\n```\n"
                + _top_level_names())
    if page.whole:
        elsewhere = documented_elsewhere(module)
        skip = [name for name, _ in elsewhere]
        if module.endswith("._common"):
            skip.append("CheckFailed")
        extra = f"   :exclude-members: {', '.join(skip)}\n" if skip else ""
        data = "".join(f"\n.. autodata:: {name}\n" for name in undocumented_data(module)
                       if name not in skip)
        also = "".join(
            f"\n.. rubric:: Also exported here\n\n:py:obj:`{home}.{name}` is also exported by"
            f" this module, as ``{module}.{name}``; it is documented with :py:mod:`{home}`.\n"
            for name, home in elsewhere)
        return (
            "```{eval-rst}\n"
            f".. automodule:: {module}\n"
            "   :members:\n"
            "   :undoc-members:\n"
            f"{extra}"
            f"{data}"
            f"{also}"
            "```\n"
        )
    head = (f".. automodule:: {module}\n   :no-members:\n" if "module" in page.tokens
            else f".. py:currentmodule:: {module}\n")
    return "```{eval-rst}\n" + head + "".join(_member(module, n) for n in page.names()) + "```\n"


def _plain(text: str) -> str:
    """reST's inline markup of a docstring as MyST: ``x`` and :func:`x` read `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def first_sentence(module: str) -> str:
    doc = (importlib.import_module(module).__doc__ or "").strip()
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph)[0]
    return _plain(sentence)


def index_lines(pages: list[Page]) -> str:
    """api.md's list: a line per page, its title linked, and what it holds."""
    lines = []
    for page in pages:
        summary = page.summary if page.summary else first_sentence(page.module)
        lines.append(f"- [{page.title}]({page.docname}.md): {summary}")
    return "\n".join(lines) + "\n"


def _fill_api_page(app, docname, source):
    if docname == API_DOC and MARKER in source[0]:
        source[0] = source[0].replace(MARKER, index_lines(api_pages(app.srcdir)))
        return
    if not docname.startswith(API_DIR + "/"):
        return
    found = PAGE_MARKER.search(source[0])
    if found is None:
        return
    page = _page(Path(app.srcdir), Path(app.srcdir) / (docname + ".md"))
    source[0] = source[0][:found.start()] + page_body(page) + source[0][found.end():]


def _check_pages(app):
    for problem in placement_problems(api_pages(app.srcdir)):
        LOGGER.warning("API reference: %s", problem, type="course_api")


def _always_reread_api(app, env, added, changed, removed):
    # The pages depend on the package, not on their Markdown alone: regenerate them.
    return [doc for doc in env.found_docs if doc == API_DOC or doc.startswith(API_DIR + "/")]


def _skip_undocumented_attributes(app, what, name, obj, skip, options):
    # A class's fields are described by its "Attributes:" section (napoleon);
    # listing them again, undocumented, would describe each object twice.
    if what == "class" and not callable(obj) and not isinstance(obj, property):
        doc = getattr(obj, "__doc__", None)
        if doc is None or doc == getattr(type(obj), "__doc__", None):
            return True
    return None


# Where the names of the libraries attnlib builds on are documented.
_PYTORCH = "https://docs.pytorch.org/docs/stable/"
_SPECIAL_PYTORCH = {
    "torch.Tensor": "tensors.html#torch.Tensor",
    "torch.dtype": "tensor_attributes.html#torch.dtype",
    "torch.device": "tensor_attributes.html#torch.device",
    "torch.Size": "size.html#torch.Size",
}
_NUMPY = "https://numpy.org/doc/stable/reference/generated/"
_PYTHON = "https://docs.python.org/3/library/"
_PYTHON_MODULES = {
    "collections.abc": "collections.abc.html#collections.abc.",
    "typing": "typing.html#typing.",
    "contextlib": "contextlib.html#contextlib.",
    "dataclasses": "dataclasses.html#dataclasses.",
    "argparse": "argparse.html#argparse.",
    "time": "time.html#time.",
    "os": "os.html#os.",
    "pathlib": "pathlib.html#pathlib.",
    "functools": "functools.html#functools.",
}
_PYTHON_BUILTINS = {
    "int", "float", "bool", "str", "bytes", "list", "tuple", "dict", "set", "object",
    "type", "None", "Exception", "ValueError", "TypeError", "AssertionError",
    "RuntimeError", "NotImplementedError",
}


_MATPLOTLIB = {  # viz annotates with Axes, imported for the type checker only
    "Axes": "https://matplotlib.org/stable/api/_as_gen/matplotlib.axes.Axes.html",
    "matplotlib.axes.Axes": "https://matplotlib.org/stable/api/_as_gen/matplotlib.axes.Axes.html",
}


def external_url(target: str) -> str | None:
    """The documentation page of a PyTorch, NumPy, matplotlib or Python name, or None."""
    if target in _MATPLOTLIB:
        return _MATPLOTLIB[target]
    if target.startswith("torch.Tensor."):
        return f"{_PYTORCH}generated/{target}.html"
    if target in _SPECIAL_PYTORCH:
        return _PYTORCH + _SPECIAL_PYTORCH[target]
    if target.startswith("torch."):
        return f"{_PYTORCH}generated/{target}.html"
    if target.startswith(("numpy.", "np.")):
        return f"{_NUMPY}numpy.{target.split('.', 1)[1]}.html"
    if target in _PYTHON_BUILTINS:
        anchor = "exceptions.html#" if target[0].isupper() and target != "None" else (
            "functions.html#" if target != "None" else "constants.html#")
        return f"{_PYTHON}{anchor}{target}"
    for module, page in _PYTHON_MODULES.items():
        if target.startswith(module + "."):
            return _PYTHON + page + target[len(module) + 1 :]
    return None


def documented_name(target: str) -> str | None:
    """Where a re-exported attnlib name is documented: ``attnlib.MultiHeadAttention``
    is ``attnlib.multihead.MultiHeadAttention``, a method follows its class."""
    if not target.startswith("attnlib."):
        return None
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name, attrs = ".".join(parts[:split]), parts[split:]
        try:
            obj = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in attrs[:1]:
            obj = getattr(obj, attr, None)
        home = getattr(obj, "__module__", None)
        if obj is None or home is None or home == module_name:
            return None
        return ".".join([home, *attrs])
    return None


def _resolve_in_book(app, env, node, contnode, target):
    domain = env.get_domain("py")
    return domain.resolve_xref(env, node.get("refdoc"), app.builder, node.get("reftype"),
                               target, node, contnode)


def _link_missing(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    # 1. A re-exported attnlib name: link to the module that documents it.
    home = documented_name(target)
    if home is not None:
        found = _resolve_in_book(app, env, node, contnode, home)
        if found is not None:
            return found
    # 2. A bare name from a docstring (``DEFAULT_BLOCK_SIZE``, ``attnlib.KVCache``
    #    before the package re-exports it) documented once in attnlib under a
    #    module the reference did not name.
    if "." not in target or target.startswith("attnlib.") and target.count(".") == 1:
        name = target.rsplit(".", 1)[-1]
        matches = sorted(full for full in env.get_domain("py").objects
                         if full.startswith("attnlib.") and full.endswith("." + name))
        if len(matches) == 1:
            found = _resolve_in_book(app, env, node, contnode, matches[0])
            if found is not None:
                return found
    # 3. A constant of the referencing module that is not public (not in its
    #    __all__, so not listed): link to the module's section.
    module_name = node.get("py:module")
    if "." not in target and module_name and module_name.startswith("attnlib"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if module is not None and hasattr(module, target):
            domain = env.get_domain("py")
            found = domain.resolve_xref(env, node.get("refdoc"), app.builder, "mod",
                                        module_name, node, contnode)
            if found is not None:
                return found
    # 4. PyTorch, NumPy and Python names: their own documentation.
    url = external_url(target)
    if url is None:
        return None
    reference = nodes.reference("", "", internal=False, refuri=url, reftitle=target)
    reference += contnode
    return reference


def setup(app):
    app.connect("builder-inited", _check_pages)
    app.connect("source-read", _fill_api_page)
    app.connect("env-get-outdated", _always_reread_api)
    app.connect("missing-reference", _link_missing)
    app.connect("autodoc-skip-member", _skip_undocumented_attributes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
