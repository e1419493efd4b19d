"""The API reference page, generated from attnlib's docstrings on every build.

``api.md`` holds the prose and the marker line ``<!-- attnlib-api-modules -->``;
this extension replaces the marker with one section per public module of
attnlib (found by walking the package, so a new module appears without an edit),
each an ``automodule`` with ``:members:`` and ``:undoc-members:``: every name
in the module's ``__all__`` is listed. The checkers of ``attnlib.exercises``
live in submodules and are re-exported by the package, so they are listed once,
under ``attnlib.exercises``; ``attnlib.exercises._common``, the toolkit for
writing a checker, gets its own section.

References that Sphinx cannot resolve inside the book (``torch.Tensor``,
``numpy.ndarray``, Python's own types) become links to PyTorch's, NumPy's and
Python's documentation: those names are not "nitpick" errors, and a reader can
follow them. Anything else unresolved stays a warning, which ``-W`` fails.
"""

from __future__ import annotations

import importlib
import pkgutil

from docutils import nodes

MARKER = "<!-- attnlib-api-modules -->"
API_DOC = "api"

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


def _section(module: str) -> str:
    heading = f"({label(module)})=\n## `{module}`\n\n"
    if module == "attnlib":
        # The package re-exports names documented in their own modules below.
        return heading + "```{eval-rst}\n.. automodule:: attnlib\n   :no-members:\n```\n"
    extra = "   :exclude-members: CheckFailed\n" if module.endswith("._common") else ""
    data = "".join(f"\n.. autodata:: {name}\n" for name in undocumented_data(module))
    return (
        heading
        + "```{eval-rst}\n"
        f".. automodule:: {module}\n"
        "   :members:\n"
        "   :undoc-members:\n"
        f"{extra}"
        f"{data}"
        "```\n"
    )


def _skip_undocumented_attributes(app, what, name, obj, skip, options):
    # A class's fields are described by its "Attributes:" section (napoleon);
    # listing them again, undocumented, would describe each object twice.
    if what == "class" and not callable(obj) and not isinstance(obj, property):
        doc = getattr(obj, "__doc__", None)
        if doc is None or doc == getattr(type(obj), "__doc__", None):
            return True
    return None


def _fill_api_page(app, docname, source):
    if docname != API_DOC or MARKER not in source[0]:
        return
    sections = "\n".join(_section(name) for name in public_modules())
    source[0] = source[0].replace(MARKER, sections)


def _always_reread_api(app, env, added, changed, removed):
    # The page depends on the package, not on api.md alone: regenerate it always.
    return [API_DOC] if API_DOC in env.found_docs else []


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
    app.connect("source-read", _fill_api_page)
    app.connect("env-get-outdated", _always_reread_api)
    app.connect("missing-reference", _link_missing)
    app.connect("autodoc-skip-member", _skip_undocumented_attributes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
