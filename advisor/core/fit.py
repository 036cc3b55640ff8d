"""The feasibility rule, written once: a plan fits when its peak leaves a headroom of the budget free.

``headroom`` is a fraction *of the budget* (README, "headroom = a fraction of the budget"): a plan
fits when ``peak <= budget x (1 - headroom)``. Every user of the rule calls these functions:
``advisor estimate`` and its renderer, the tuner's pruning and selection, pre-flight, the TUI, the
report and the Trainer callback; a test holds them to each other at the boundary.

Host memory has its rule beside it: a plan fits the host when its host peak (pinned and pageable bytes,
the process itself included: advisor.memory.host) fits the host's RAM less what the machine keeps for its
OS (``host_reserve_bytes``, advisor/data/host_memory.yaml). The tuner, the selection, its Optuna constraint
and pre-flight call ``host_fits``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

HEADROOM = 0.05
"""Default fraction of the budget kept free (DESIGN.md "Objectives": peak plus 5% fits the budget)."""

Verdict = Literal["fits", "tight", "over"]


def usable_bytes(budget_bytes: float, headroom: float = HEADROOM) -> float:
    """What a plan may use of ``budget_bytes``: the budget less the headroom."""
    return budget_bytes * (1 - headroom)


def fits(peak_bytes: float, budget_bytes: float, headroom: float = HEADROOM) -> bool:
    """Feasible: the peak plus a headroom (a fraction of the budget) fits the budget."""
    return peak_bytes <= usable_bytes(budget_bytes, headroom)


def fit_verdict(peak_bytes: float, budget_bytes: float, headroom: float = HEADROOM) -> Verdict:
    """fits; tight (within the budget but into the headroom); over (beyond the budget)."""
    if fits(peak_bytes, budget_bytes, headroom):
        return "fits"
    return "tight" if peak_bytes <= budget_bytes else "over"


def overshoot(peak_bytes: float, budget_bytes: float, headroom: float = HEADROOM) -> float:
    """How far the peak is over the usable bytes, relative to them (> 0: does not fit); the tuner's
    constraint for the sampler."""
    limit = usable_bytes(budget_bytes, headroom)
    return (peak_bytes - limit) / limit


# ----------------------------------------------------------------------------- host memory

GIB = 2**30


@lru_cache(maxsize=1)
def _os_reserve() -> tuple[tuple[tuple[float | None, float], ...], int]:
    from advisor.core.data_files import load_data_file

    r = load_data_file("host_memory.yaml")["os_reserve"]
    return tuple((t[0], float(t[1])) for t in r["tiers"]), int(r["eviction_mib"]) * 2**20


def host_reserve_bytes(ram_bytes: float) -> int:
    """What a machine with ``ram_bytes`` of RAM keeps for its OS: GKE's tiered node reservation plus its
    eviction threshold (advisor/data/host_memory.yaml ``os_reserve``)."""
    tiers, eviction = _os_reserve()
    left, kept = float(ram_bytes), 0.0
    for size_gib, fraction in tiers:
        part = left if size_gib is None else min(left, size_gib * GIB)
        kept += part * fraction
        left -= part
        if left <= 0:
            break
    return int(kept + eviction)


def host_usable_bytes(host_budget_bytes: float) -> float:
    """What a plan may hold in host memory of ``host_budget_bytes`` of RAM: the RAM less the OS reserve."""
    return max(0.0, host_budget_bytes - host_reserve_bytes(host_budget_bytes))


def host_fits(host_peak_bytes: float, host_budget_bytes: float | None) -> bool:
    """Feasible on the host: the run's host peak fits the RAM less the OS reserve (no budget: not checked).

    Pinned bytes are not capped by ``ulimit -l``: cudaHostAlloc page-locks through the NVIDIA driver, not
    mlock(2), so RLIMIT_MEMLOCK does not apply (cupy/cupy#4775: pinning grew past the memlock limit until the
    OOM killer). Physical RAM does: page-locked pages can be neither swapped nor reclaimed, so swap space is
    never counted as budget."""
    return host_budget_bytes is None or host_peak_bytes <= host_usable_bytes(host_budget_bytes)


def host_overshoot(host_peak_bytes: float, host_budget_bytes: float | None) -> float:
    """How far the host peak is over the usable RAM, relative to it (> 0: does not fit); the tuner's host
    constraint for the sampler (-1 without a host budget)."""
    if host_budget_bytes is None:
        return -1.0
    limit = max(host_usable_bytes(host_budget_bytes), 1.0)
    return (host_peak_bytes - limit) / limit


__all__ = ["HEADROOM", "Verdict", "fit_verdict", "fits", "host_fits", "host_overshoot", "host_reserve_bytes",
           "host_usable_bytes", "overshoot", "usable_bytes"]
