"""pytest hooks for the whole run: the order in which xdist hands out the files, and
OpenMP threads that sleep while they wait.

``make test`` runs ``pytest -n 3 --dist loadfile`` (TEST_WORKERS): each file (each
notebook under nbval) goes whole to one of the workers, which asks for the next
file when it is nearly done. xdist's own order is by number of tests, so the few
long files with few tests (the PDF, the wheel and the Colab environment: 17, 3 and
1 tests) came last, and one worker ran them while the others had nothing left.
Longest first keeps them busy to the end (issue 25, item 7). The order of the tests inside a
file is kept (nbval runs a notebook's cells in order, module fixtures build once).

The learner notebooks' runs (tests/test_learner_notebooks.py) once took as long
as the chapters' own runs and were scheduled one by one; they now run only the
exercises sections, a few seconds each, and the file is one unit like the others.

A file's expected cost is its entry in ``SECONDS``, or else a tenth of a second a
test (a notebook's kernel start added). Only the order depends on these numbers:
a stale one costs time, not a result. The notebooks' own execution records are
not used: a chapter saved from a run on a loaded machine records several times
its running time.
"""

from __future__ import annotations

import os

import pytest

# An OpenMP thread that waits for work sleeps at once instead of spinning first
# (libgomp's default). Two workers with _ext/numerics.env's two threads each share
# 2 cores, and more with other load: a spinning thread holds a core that another
# process needs. Set here, before anything loads torch; nbval's kernels and the
# tests' subprocesses inherit it. The arithmetic is the same (same threads, same
# split of the work). A 100-step AdamW loop, two at once under a load of about 20:
# 126 and 148 s with the default (12.6 and 14.3 s of CPU), 1.1 and 4.7 s with
# PASSIVE (3.7 and 3.8 s of CPU, the import included), the same loss to the last bit.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: Seconds a file takes on a quiet 2-core machine, worker's wall clock, for the
#: files that take much longer than their number of tests says. From the ranking of
#: ``pytest -n 2 --dist loadfile --durations=0`` on a machine under a load of about
#: 15 (issue 25; times there were 4-5 times these, up to 25 times for small-op
#: training loops), the chapters' running times (intro.md's table), and estimates
#: for the files that run whole environments or notebooks.
SECONDS = {
    "tests/test_pdf.py": 380,  # the single-page build, Chromium's prints, the page scans
    "tests/test_book.py": 250,  # the HTML build, then 53 pages x 3-4 modes, 4 at a time
    "chapters/13_beyond_full_attention.ipynb": 160,
    "tests/test_bench.py": 90,  # memory under torch.profiler, a whole --quick run
    "tests/test_learner_notebooks.py": 45,  # 13 kernels, each running a section
    "tests/test_wheel.py": 90,  # a wheel, a fresh venv, chapters 11 and 12 whole
    "tests/test_colab.py": 60,  # a fresh venv, pip install from a clone, chapter 1
    "tests/test_explorer.py": 60,  # models trained, pages in Chromium
    "chapters/10_watching_attention_learn.ipynb": 55,
    "chapters/11_writing_the_kernel.ipynb": 45,  # Triton's interpreter
    "tests/test_flash.py": 40,  # memory profiles
    "tests/test_models.py": 40,  # each variant trained
    "tests/test_flash_triton_variants.py": 40,  # Triton's interpreter
    "tests/test_exercises_multihead.py": 30,  # a checker's dropout probes per answer
    "tests/test_experiments.py": 30,
    "tests/test_experiments_init.py": 30,  # two seeds x 80 steps against the loop
    "chapters/09_attention_in_llms.ipynb": 30,
    "chapters/04_self_attention_classes.ipynb": 25,
    "chapters/08_efficient_attention.ipynb": 25,
    "tests/test_flash_triton.py": 20,
    "tests/test_gqa.py": 20,
    "tests/test_distributed.py": 20,  # process groups
    "chapters/12_attention_across_devices.ipynb": 20,
    "chapters/05_causal_attention.ipynb": 20,
    "tests/test_exercises_efficient.py": 15,
    "chapters/06_multi_head_attention.ipynb": 15,
}
#: A notebook's kernel start, on top of its cells.
KERNEL_SECONDS = 5.0
SECONDS_PER_TEST = 0.1


def work_unit(nodeid: str) -> str:
    """What xdist hands to a worker whole: the test's file."""
    return nodeid.split("::", 1)[0]


def cost(unit: str, tests: int) -> float:
    """A unit's expected seconds on a quiet 2-core machine (only the order uses it)."""
    kernel = KERNEL_SECONDS if unit.endswith(".ipynb") else 0.0
    return SECONDS.get(unit, kernel + tests * SECONDS_PER_TEST)


def pytest_configure(config):
    # xdist would sort the units by number of tests, undoing the order below.
    if getattr(config.option, "dist", "no") in {"loadfile", "loadscope", "loadgroup"}:
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Units longest first; a unit's tests stay in their order."""
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        unit = work_unit(item.nodeid)
        count[unit] = count.get(unit, 0) + 1
        first.setdefault(unit, index)
    costs = {unit: cost(unit, n) for unit, n in count.items()}
    items.sort(key=lambda item: (-costs[work_unit(item.nodeid)], first[work_unit(item.nodeid)]))
