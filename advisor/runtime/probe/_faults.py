"""Faults a probe child injects into itself on request, for real: the runner must survive each.

They exist so that tests exercise the real failure paths (a real segfault, a real hang, a real
grandchild) rather than mocks of them. Each fires after the first optimizer step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable

from advisor.runtime.probe._request import FAULTS


def inject(fault: str, emit: Callable[..., None]) -> None:
    """Do what ``fault`` says (see advisor.runtime.probe._request.FAULTS); return only for "none"."""
    if fault == "none":
        return
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}")
    emit("fault", fault=fault)
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "segfault":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if fault == "raise":
        raise RuntimeError("injected fault: a Python exception in the training loop")
    if fault == "exit":
        os._exit(3)
    if fault == "grandchild_hang":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        emit("grandchild", pid=grandchild.pid)
        while True:
            time.sleep(3600)
