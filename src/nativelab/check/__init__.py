"""`nativelab check`: what in your own PyTorch code would break or be slow on Trainium, with the line, the count
per step and the fix, and a first-order Trainium2 estimate.

    nativelab check script.py [args...]          # or: python -m nativelab.check script.py
    nativelab check --device-from cuda train.py  # an unported CUDA script
    nativelab check -- run --model base --compile

    with nativelab.check.Check() as c:
        train()
    c.report().print()
"""

from __future__ import annotations

from .api import Check, step
from .hardware import Trainium2
from .report import Report

__all__ = ["Check", "step", "Report", "Trainium2"]
