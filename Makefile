# Two commands do all set-up on a fresh machine with Python 3.11 and make:
#   make book   build the HTML book into _build/html
#   make test   run every test (unit tests, nbval on every notebook, book build, browser check)
#   make unit   attnlib's unit tests only (no notebooks, book, PDF or Colab): the quick check
#   make pdf    the whole book as one PDF, _build/pdf/book.pdf (needs /usr/bin/chromium)
PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb))
# Kernels and tools must come from the virtual environment.
export PATH := $(BIN):$(PATH)
export PYTHONHASHSEED := 0
# The pinned CPU arithmetic of the stored outputs (_ext/numerics.env): every notebook
# is executed and checked under it, so its outputs reproduce on any x86-64 CPU with AVX2.
include _ext/numerics.env
export ATEN_CPU_CAPABILITY MKL_CBWR ONEDNN_MAX_CPU_ISA OMP_NUM_THREADS

.PHONY: book pdf test unit lint execute robustness torch-floor bench clean distclean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# First the learner notebooks that Colab opens from the repository (notebooks/,
# _ext/learner_notebooks.py), brought up to date with the chapters.
book: $(STAMP) explorer
	$(BIN)/python _ext/learner_notebooks.py
	$(BIN)/jupyter-book build -W -n --keep-going .

# The live explorer of chapters 6 and 10 (explorer/build.py): onnxruntime-web from npm
# (package-lock.json) and the chapters' models exported by attnlib.export, into
# explorer/site/explorer. Without npm or a network the book is built without it and
# says so on the page.
.PHONY: explorer
explorer: $(STAMP)
	$(BIN)/python explorer/build.py

# The book on one HTML page, printed by Chromium (Playwright, offline) with the print
# rules of _static/print.css. Then the HTML book is brought up to date: its
# introduction links the PDF only where it exists (the book-pdf role, _ext/course_html.py).
# Jupyter Book's own pdfhtml needs a download of Chromium; this uses the system one.
pdf: $(STAMP)
	$(BIN)/jupyter-book build -W -n --keep-going --builder singlehtml --path-output _build/pdf-build .
	$(BIN)/python _ext/make_pdf.py _build/pdf-build/_build/singlehtml/intro.html _build/pdf/book.pdf
	$(MAKE) book

# --durations: the slowest tests, in every CI log, for the next decision on CI time
# (issue 25, item 7: under 15 minutes on a quiet machine). --dist loadfile hands a
# worker a file whole, longest first (tests/conftest.py). Three workers on two
# cores: a run with two kept the cores busy only about two thirds of the time (22 min
# of user CPU in 17.7 min of wall clock), because the browser, PDF and notebook tests
# wait on Chromium and on kernels; a third worker fills those waits.
TEST_WORKERS ?= 3
test: $(STAMP) lint explorer
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30

# The unit tests, under 3 minutes on 2 cores: tests/ without the tests marked slow,
# without nbval (addopts replaced), the book build
# (test_book.py), the PDF (test_pdf.py) and the fresh Colab-like environment
# (test_colab.py). The notebook-structure tests read the .ipynb files, quickly.
unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -o addopts="-ra -p no:cacheprovider" -m "not slow" tests \
	    --ignore=tests/test_book.py --ignore=tests/test_pdf.py --ignore=tests/test_colab.py

# ruff with flake8-bugbear, import sorting and pyupgrade (settings in pyproject.toml).
# Notebook code lines stay within the 88 characters that the book's code box shows
# without cutting. mypy type-checks all of attnlib (settings in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check attnlib tests _ext
	$(BIN)/ruff check --line-length 88 chapters
	$(BIN)/mypy

# Re-execute every notebook in place, top to bottom in a fresh kernel, under the pinned
# arithmetic (_ext/numerics.env), keeping the stored outputs of a GPU run in `gpu` cells
# whose code is unchanged (_ext/execute.py); then write each chapter's running time into
# intro.md's table (_ext/chapter_times.py).
# One notebook: make execute NOTEBOOKS=chapters/03_why_scale.ipynb
execute: $(STAMP)
	$(BIN)/python _ext/execute.py $(NOTEBOOKS)
	$(BIN)/python _ext/chapter_times.py

# Every notebook under five arithmetics (pinned, ATen without vector kernels, MKL's
# compatible path, one thread, and this machine's own defaults): no cell may raise, and
# the report says how many cells print other figures. Run it before calling work on a
# chapter done. About 20 minutes on 2 cores. One: make robustness NOTEBOOKS=chapters/...
robustness: $(STAMP)
	$(BIN)/python _ext/robustness.py $(NOTEBOOKS)

# The torch floor (pyproject.toml: torch>=2.12), checked: a virtual environment with
# that torch, .venv-torch-2.12.0, runs the unit tests and every notebook (outputs not
# compared). Below it, chapter 11 fails: it reads the profiler's
# FunctionEvent.input_dtypes, new in 2.12. Another version, in an environment of its
# own: make torch-floor TORCH_FLOOR=2.13.0.
# PyPI has no CPU build of torch for Linux x86-64, so this downloads a CUDA build
# (about 3 GB, minutes), whose Triton runs chapter 11's kernel. The test dependencies
# transformers, onnx and onnxruntime are requirements.txt's. Left out: the tests of the
# book, PDF, instructors' page (its tools), Colab and wheel.
TORCH_FLOOR := 2.12.0
FLOOR_VENV  := .venv-torch-$(TORCH_FLOOR)
torch-floor:
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet torch==$(TORCH_FLOOR) \
	    $(shell grep -E '^(transformers|onnx|onnxruntime)==' requirements.txt) \
	    matplotlib tqdm pytest pytest-xdist hypothesis nbclient nbformat ipykernel pyyaml
	$(FLOOR_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(FLOOR_VENV)/bin/python -m pytest -n 2 -o addopts="-ra -p no:cacheprovider" \
	    -m "not slow" tests --ignore=tests/test_book.py --ignore=tests/test_pdf.py \
	    --ignore=tests/test_colab.py --ignore=tests/test_wheel.py \
	    --ignore=tests/test_instructors.py
	$(FLOOR_VENV)/bin/python _ext/robustness.py $(NOTEBOOKS) --settings native

bench: $(STAMP)
	$(BIN)/python -m attnlib.bench

clean:
	rm -rf _build

distclean: clean
	rm -rf $(VENV)
