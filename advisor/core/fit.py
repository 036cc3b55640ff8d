"""The feasibility rule, written once: a plan fits when its peak leaves a headroom of the budget free.

``headroom`` is a fraction *of the budget* (README, "headroom = a fraction of the budget"): a plan
fits when ``peak <= budget x (1 - headroom)``. Every user of the rule calls these functions:
``advisor estimate`` and its renderer, the tuner's pruning and selection, pre-flight, the TUI, the
report and the Trainer callback; a test holds them to each other at the boundary.
"""

from __future__ import annotations

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


__all__ = ["HEADROOM", "Verdict", "fit_verdict", "fits", "overshoot", "usable_bytes"]
