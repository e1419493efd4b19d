"""Small, fixed data sets used across the course.

The six-token sentence "Your journey starts with one step" with 3-dimensional
embeddings is the running example of the field's best-known teaching material
(Raschka, *Build a Large Language Model (From Scratch)*, 2024, ch. 3). Using the
same numbers lets a reader check this course's results against other books.
"""

from __future__ import annotations

import torch

__all__ = ["JOURNEY_TOKENS", "journey_embeddings"]

#: The tokens of the running example, in order (index 1 is "journey").
JOURNEY_TOKENS: tuple[str, ...] = ("Your", "journey", "starts", "with", "one", "step")

_JOURNEY_ROWS = (
    (0.43, 0.15, 0.89),  # Your     (x^1)
    (0.55, 0.87, 0.66),  # journey  (x^2)
    (0.57, 0.85, 0.64),  # starts   (x^3)
    (0.22, 0.58, 0.33),  # with     (x^4)
    (0.77, 0.25, 0.10),  # one      (x^5)
    (0.05, 0.80, 0.55),  # step     (x^6)
)


def journey_embeddings() -> torch.Tensor:
    """Embeddings of "Your journey starts with one step".

    Returns:
        A new ``(6, 3)`` float32 tensor, one row per token of
        :data:`JOURNEY_TOKENS` (``num_tokens = 6``, ``d_in = 3``). Each call
        returns a fresh tensor, so changing it never changes later calls.

    Source: the running example of Raschka (2024), *Build a Large Language
    Model (From Scratch)*, section 3.3.
    """
    return torch.tensor(_JOURNEY_ROWS, dtype=torch.float32)
