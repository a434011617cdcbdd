"""The device a run computes on, resolved in one place from what a user asks for (``--device``), and what the
trainer's optimiser runs there."""
from __future__ import annotations

import torch

from recbench.datasets.errors import unknown


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for ``cuda`` on a machine without it is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was requested but torch sees no CUDA device "
                           f"(torch {torch.__version__}); use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise unknown("device", name, ["auto", "cpu", "cuda", "cuda:N"])
    return torch.device(name)


def fused_adam(device: torch.device) -> bool:
    """Whether Adam runs fused on ``device``: one pass over each tensor that reads the gradient and moments once,
    instead of about ten elementwise passes, the same update up to rounding. On the CPU it matters where the
    embedding tables are large and a step touches all of them (NCF, BPR-MF, FPMC; ``experiments/adam_speed.py``)."""
    return device.type in ("cuda", "cpu")
