"""No notebook asserts on a timing.

CI runs nbval on a busy two-core machine, where any comparison of measured times
("X beats Y", "a speed-up above 2", a share of a run's time) can come out either
way. The course's rule: notebooks *print* timings (in cells tagged
``nbval-ignore-output``) and speed is checked by the benchmark,
``python -m attnlib.bench``, never by an assert.

The check follows the data, across the whole notebook: a name is *timed* when it
is assigned from a clock (``time.perf_counter``, ``timeit``,
``torch.utils.benchmark``, a CUDA event's ``elapsed_time``, attnlib's benchmark),
from a function the notebook defines that reads a clock, or from another timed
name. An ``assert`` or an ``attnlib.expect`` that reads a timed name fails the test,
except in a cell that checks the text against the stored outputs of a GPU run (it
reads their ``gpu_run`` stamp from the notebook's file): stored numbers do not move.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))

#: Calls that read a clock, by their last name (``time.perf_counter`` -> perf_counter).
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
          "timeit", "Timer", "blocked_autorange", "adaptive_autorange", "elapsed_time",
          "run_benchmark"}
#: Clocks whose last name is too common to match alone (``tensor.repeat``, ``x.time``).
QUALIFIED_CLOCKS = {"time.time", "time.time_ns", "timeit.repeat", "time", "time_ns"}


def _parse(source: str) -> ast.Module | None:
    lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_clock(call: ast.Call, clocks: set[str]) -> bool:
    return _call_name(call) in clocks or ast.unparse(call.func) in QUALIFIED_CLOCKS


def _target_names(target: ast.AST) -> set[str]:
    """The variables an assignment target writes: ``a``, ``a[k]``, ``a.b`` and tuples."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _target_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(e) for e in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _reads_time(node: ast.AST, timed: set[str], clocks: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _is_clock(sub, clocks):
            return True
        if isinstance(sub, ast.Name) and sub.id in timed:
            return True
    return False


def _timing_functions(trees: list[ast.Module]) -> set[str]:
    """CLOCKS plus every function the notebook defines that calls a clock, to a fixed point."""
    clocks = set(CLOCKS)
    changed = True
    while changed:
        changed = False
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name not in clocks and any(
                        _reads_time(stmt, set(), clocks) for stmt in node.body):
                    clocks.add(node.name)
                    changed = True
    return clocks


def _imported_names(trees: list[ast.Module]) -> set[str]:
    """The names that import statements bind (``re``, ``attnlib``, ``F``, ...)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _update(stmt: ast.stmt, timed: set[str], clocks: set[str],
            modules: frozenset[str] = frozenset()) -> None:
    """Names ``stmt`` makes timed (added to ``timed``) or clean (removed), in place.

    A method call with a timed argument makes its receiver timed (``times.append(t)``),
    unless the receiver is a module (``attnlib.expect(...)``, ``re.findall(...)``):
    a module holds no measurement, and tainting it would taint all its later uses."""
    for _ in range(2):  # twice, so that a loop's later statements reach its earlier ones
        for node in ast.walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Assign):
                names = set().union(*(_target_names(t) for t in node.targets))
                if _reads_time(node.value, timed, clocks):
                    timed |= names
                elif node is stmt and all(isinstance(t, ast.Name) for t in node.targets):
                    timed -= names  # a top-level rebinding from a clock-free value
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None \
                    and _reads_time(node.value, timed, clocks):
                timed |= _target_names(node.target)
            elif isinstance(node, ast.NamedExpr) and _reads_time(node.value, timed, clocks):
                timed.add(node.target.id)
            elif isinstance(node, (ast.For, ast.comprehension)) \
                    and _reads_time(node.iter, timed, clocks):
                timed |= _target_names(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and any(_reads_time(a, timed, clocks) for a in node.args):
                timed |= _target_names(node.func.value) - modules  # times.append(t)


def timing_asserts(sources: list[str]) -> list[str]:
    """The asserts and ``expect`` calls in ``sources`` (one per cell) that read a timing.

    The cells are followed in order, as a top-to-bottom run executes them. Returns one
    line per offence: ``cell <i>: <the offending statement>``.
    """
    trees = [(i, tree) for i, src in enumerate(sources) if (tree := _parse(src)) is not None]
    clocks = _timing_functions([tree for _, tree in trees])
    modules = frozenset(_imported_names([tree for _, tree in trees]))
    timed: set[str] = set()
    offences = []
    for i, tree in trees:
        # A cell that checks the text against a GPU run's stored outputs reads them from
        # the notebook's file, with the run's `gpu_run` stamp (_ext/gpu_outputs.py): those
        # numbers are read, not measured, and cannot change from one run to the next.
        reads_stored_run = any(isinstance(node, ast.Constant) and node.value == "gpu_run"
                               for node in ast.walk(tree))
        for stmt in tree.body:
            _update(stmt, timed, clocks, modules)
            if reads_stored_run:
                continue
            for node in ast.walk(stmt):
                if isinstance(node, ast.Assert) and _reads_time(node.test, timed, clocks):
                    offences.append(f"cell {i}: {ast.unparse(node)[:120]}")
                elif isinstance(node, ast.Call) and _call_name(node) == "expect" and any(
                        _reads_time(a, timed, clocks) for a in [*node.args, *node.keywords]):
                    offences.append(f"cell {i}: {ast.unparse(node)[:120]}")
    return offences


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_asserts_on_a_timing(path):
    nb = nbformat.read(path, as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    offences = timing_asserts(sources)
    assert not offences, (
        f"{path.name} asserts on a measured time (print it in an nbval-ignore-output cell "
        "and let python -m attnlib.bench check speed):\n" + "\n".join(offences))


# The detector itself: each of these notebooks (a list of cell sources) must be caught.
CAUGHT = {
    "assert on a ratio of times": [
        "import time\nstart = time.perf_counter()\nf()\nslow = time.perf_counter() - start",
        "fast = 0.1\nassert slow / fast > 2",
    ],
    "a helper that times, then a comparison": [
        "def median_seconds(fn):\n    t = time.perf_counter()\n    fn()\n"
        "    return time.perf_counter() - t",
        "rates = {name: [1 / median_seconds(f)] for name, f in fns.items()}",
        "assert rates['fused'][-1] > rates['readable'][-1]",
    ],
    "a share of the time, appended in a loop": [
        "times = []\nfor _ in range(3):\n    t0 = time.perf_counter()\n    f()\n"
        "    times.append(time.perf_counter() - t0)\nshare = min(times) / total",
        "assert share < 0.5",
    ],
    "attnlib.expect on a speed-up": [
        "from timeit import timeit\nspeed_up = timeit(f, number=3) / timeit(g, number=3)",
        "attnlib.expect('speed-up', speed_up > 2, True)",
    ],
    "torch.utils.benchmark": [
        "m = benchmark.Timer(stmt='f()').blocked_autorange()\nmedian = m.median",
        "assert median < 1e-3",
    ],
}

# ... and these must pass: timings printed, asserts on values and on memory counts.
ALLOWED = {
    "timings printed only": [
        "t0 = time.perf_counter()\nf()\nprint(f'{time.perf_counter() - t0:.3f} s')",
        "assert torch.allclose(out, ref)",
    ],
    "an exact memory count next to a timing": [
        "t0 = time.perf_counter()\npeak = measure_peak_bytes(f)\nelapsed = time.perf_counter() - t0",
        "assert peak == 260 * 16384",
        "print(elapsed)",
    ],
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_the_detector_catches_a_timing_assert(name):
    assert timing_asserts(CAUGHT[name]), f"missed: {name}"


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_the_detector_allows_asserts_that_read_no_clock(name):
    assert timing_asserts(ALLOWED[name]) == []
