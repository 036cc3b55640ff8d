"""Memory sizes: parsing the budgets people type and printing bytes in the binary unit they mean.

Convention (documented in the README): decimal and binary prefixes both mean powers of two,
``GB`` == ``GiB`` == 2**30 bytes, as nvidia-smi, NVML and PyTorch report GPU memory and as GPU
makers label it (an RTX 4090 sold as "24 GB" has 24 GiB = 25,757,220,864 bytes; NVML reports
24,564 MiB of which the driver reserves some). So ``--gpu-budget 24GB`` is exactly that card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from advisor.core.errors import AdvisorInputError

_UNITS = {
    "b": 1, "": 1,
    "k": 2**10, "kb": 2**10, "kib": 2**10,
    "m": 2**20, "mb": 2**20, "mib": 2**20,
    "g": 2**30, "gb": 2**30, "gib": 2**30,
    "t": 2**40, "tb": 2**40, "tib": 2**40,
}
_CANONICAL = {1: "B", 2**10: "KiB", 2**20: "MiB", 2**30: "GiB", 2**40: "TiB"}
_SIZE = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d*)?)\s*%\s*$")


@dataclass(frozen=True)
class Budget:
    """A GPU memory budget as the user gave it."""

    bytes: int
    """The budget in bytes."""
    unit: str
    """The unit to print it in: the binary spelling of the one the user typed ("24GB" prints as GiB, what it
    means here)."""
    text: str
    """What the user typed, for messages."""

    def format(self, n_bytes: float) -> str:
        """Print ``n_bytes`` in the budget's unit."""
        return format_bytes(n_bytes, self.unit)

    def __str__(self) -> str:
        return self.format(self.bytes)


def unit_factor(unit: str) -> int:
    return _UNITS[unit.lower()]


def parse_size(text: str, flag: str) -> tuple[int, str]:
    """Parse "24GB", "24 GiB", "24000MiB", "25769803776" into (bytes, unit as typed)."""
    m = _SIZE.match(str(text))
    if not m or m.group("unit").lower() not in _UNITS:
        raise AdvisorInputError(
            flag, "expected a size like 24GB, 24 GiB, 24000MiB or a percentage like 90%", text
        )
    value = float(m.group("num"))
    if value <= 0:
        raise AdvisorInputError(flag, "a memory size must be greater than zero", text)
    unit = m.group("unit") or "B"
    n = int(round(value * _UNITS[unit.lower()]))
    if n < 2**20:
        hint = f"; did you mean {m.group('num')}GB?" if not m.group("unit") else ""  # a bare number is bytes
        raise AdvisorInputError(flag, f"a memory budget below 1 MiB cannot hold any model{hint}", text)
    return n, unit


def parse_budget(text: str, flag: str = "--gpu-budget", gpu_total_bytes: int | None = None) -> Budget:
    """Parse a budget; a percentage needs the total memory of a detected or named GPU."""
    pm = _PERCENT.match(str(text))
    if pm:
        pct = float(pm.group("num"))
        if not 0 < pct <= 100:
            raise AdvisorInputError(flag, "a percentage budget must be in (0, 100]", text)
        if gpu_total_bytes is None:
            raise AdvisorInputError(
                flag, "a percentage needs a GPU: none was detected, name one with --gpu", text
            )
        return Budget(int(gpu_total_bytes * pct / 100), "GiB", str(text))
    n, unit = parse_size(text, flag)
    # printed in the binary spelling of what it means: "24GB" is 24 GiB here, and says so beside the host's GiB
    return Budget(n, _CANONICAL[_UNITS[unit.lower()]], str(text))


def parse_host_budget(text: str, ram_bytes: int, flag: str = "--host-budget") -> Budget:
    """Parse a host-memory budget the way ``parse_budget`` parses a GPU one; a percentage is of ``ram_bytes``,
    the RAM detected on this machine (advisor.core.host.detect_host_ram)."""
    return parse_budget(text, flag, ram_bytes)


def format_bytes(n_bytes: float, unit: str | None = None, digits: int = 2) -> str:
    """Bytes in ``unit`` (the spelling is kept: "GB" stays "GB"), or in a readable binary unit."""
    if unit is None:
        factor = 1
        for f in sorted(_CANONICAL):
            if abs(n_bytes) >= f:
                factor = f
        unit = _CANONICAL[factor]
    else:
        factor = _UNITS[unit.lower()]
        if unit == "":
            unit = "B"
    if factor == 1:
        return f"{int(round(n_bytes)):,} B"
    return f"{n_bytes / factor:,.{digits}f} {unit}"
