"""pytest hooks for the chapter notebooks run under nbval."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Skip notebook cells tagged ``gpu`` where no CUDA GPU exists.

    Such a cell guards itself too, so it prints a clear line in a reader's
    kernel; under nbval it is not executed at all, and pytest says why.
    """
    if torch.cuda.is_available():
        return
    reason = "cell tagged 'gpu': no CUDA GPU on this machine"
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "gpu" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(pytest.mark.skip(reason=reason))
