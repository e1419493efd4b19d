"""``python -m attnlib.bench``: run the benchmark from the command line
(see :func:`attnlib.bench.main` and ``python -m attnlib.bench --help``)."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
