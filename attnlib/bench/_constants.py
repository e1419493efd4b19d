"""The benchmark's constants and targets, in one module that imports nothing
from the package (every other ``attnlib.bench`` module reads them from here).

They are re-exported, and documented, by :mod:`attnlib.bench`; setting one
there (``attnlib.bench.TARGET_VS_TORCH_MHA = 1.2``) sets it here too. Modules
read the targets as ``_constants.NAME`` when they run, so a new value counts.
"""

from __future__ import annotations

CONTESTANTS = ("reference", "attnlib", "torch_mha", "bare_kernels", "sdpa_only", "flash_only")
MODES = ("forward", "forward_backward")
TARGET_VS_TORCH_MHA = 1.0 / 0.9
TARGET_VS_TORCH_MHA_FORWARD_LONG = 0.5
TARGET_VS_BARE_KERNELS = 1.03
TARGET_FLASH_VS_SDPA = 3.0
TARGET_TRITON_VS_SDPA = 0.85
TARGET_FLASH_MEMORY_BYTES = 128 * 2**20
TARGET_REFERENCE_MEMORY_BYTES = 2**30
SCHEMA_VERSION = 2
MEMORY_SWEEP_SEQ_LENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
