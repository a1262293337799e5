"""Profiling the emulated device: CPU fallbacks, device-memory traffic, a timeline of device work, time by
category, Dynamo graph breaks and recompiles, as tables, JSON, Chrome/Perfetto traces and PNG plots.

    from nativelab.profile import Session, print_report
    with Session("base") as s:
        ...
    print_report(s)
"""

from ._private import dynamo_counters
from .categories import CATEGORIES, categorize
from .session import OpStat, Session, session_active, traffic_per_token

__all__ = ["Session", "OpStat", "CATEGORIES", "categorize", "session_active", "traffic_per_token", "print_report", "dynamo_counters"]


def print_report(session, top: int = 15) -> None:
    """Rich tables of one session in the terminal."""
    from .report import print_report as _print

    _print(session, top=top)
