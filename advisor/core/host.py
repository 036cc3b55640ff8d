"""The RAM of the machine a command runs on, detected once: the host budget's default and what a
``--host-budget`` percentage is of.

Detection reads psutil's total physical memory, lowered to the control group's memory limit when the
process runs in a container that has one (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``): psutil
reports the whole machine there, while the kernel kills the container at its limit. ``ADVISOR_HOST_RAM``
("64GB", or bytes) replaces detection (tests; a machine whose limit is set some other way).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOST_RAM_ENV = "ADVISOR_HOST_RAM"
"""Environment variable that replaces the detected RAM ("64GB", "65536MiB" or bytes)."""

CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""cgroup v2 and v1 memory limits of this process's group (a container's); "max" or a huge value: none."""


@dataclass(frozen=True)
class HostRam:
    """The machine's RAM as detected."""

    bytes: int
    """Total physical memory, or the container's limit when lower."""
    source: str
    """Where it was read: psutil, a cgroup limit, or ADVISOR_HOST_RAM."""


def detect_host_ram() -> HostRam:
    """This machine's RAM (see the module docstring)."""
    override = os.environ.get(HOST_RAM_ENV)
    if override:
        from advisor.core.units import parse_size

        return HostRam(parse_size(override, HOST_RAM_ENV)[0], HOST_RAM_ENV)
    import psutil

    total = int(psutil.virtual_memory().total)
    limit = _cgroup_limit()
    if limit is not None and limit < total:
        return HostRam(limit, "cgroup memory limit")
    return HostRam(total, "psutil total RAM")


def _cgroup_limit() -> int | None:
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


__all__ = ["CGROUP_LIMITS", "HOST_RAM_ENV", "HostRam", "detect_host_ram"]
