"""What the experiments of :mod:`attnlib.experiments` share."""

from __future__ import annotations

import torch

#: The dtype of every tensor an experiment returns (its arithmetic is float64 too).
DTYPE = torch.float64
