"""If the process crashes anyway, say where: Python's faulthandler (the Python stack of every thread) and, before
it, the runtime's note of the device work running and the op being dispatched (csrc/crash_report.cpp).

faulthandler is enabled for processes that use the device unless the user has a handler of their own (faulthandler
already on, as `python -X faulthandler` or pytest turn it on, or a Python handler for SIGSEGV): theirs is kept, and
the runtime's note is chained before it either way.
"""

from __future__ import annotations

import faulthandler
import signal
import sys


def install(rt) -> None:
    if not faulthandler.is_enabled() and signal.getsignal(signal.SIGSEGV) in (signal.SIG_DFL, None):
        try:
            faulthandler.enable(all_threads=True)
        except (AttributeError, ValueError, OSError):  # sys.stderr without a file descriptor (a notebook)
            if sys.__stderr__ is not None:
                faulthandler.enable(file=sys.__stderr__, all_threads=True)
    rt.install_crash_report()
