"""The longest sequence a plan fits on a budget: bisection on the run's peak over the sequence length.

Every term of a step's ledger is non-decreasing in the sequence length (saved activations, the logits and the loss,
attention's workspace, the KV of an evaluation; weights and optimizer states do not move), so the lengths that fit
are an interval from the shortest up, and bisection finds its end: the run's peak at the answer fits, at one step
more it does not. The category that grows most over that step is what stops it. The search stops at the model's
trained context (``max_position_embeddings``): past it the model needs RoPE scaling, which is not planned here.
Calculation only: the caller measures (the closed form, or the simulation) and renders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

Peak = Callable[[int], tuple]
"""The run's peak and its device ledger at a sequence length, and optionally its host peak: (peak, ledger[, host])."""

HOST = "host memory"
"""What stops the search when the device still fits and the host does not (an offload's copies grow with the length)."""


@dataclass(frozen=True)
class LongestFit:
    max_seq_len: int | None
    """The longest sequence (a multiple of ``step``) whose run fits; None when not even ``step`` tokens fit."""
    peak_bytes: int
    """The run's peak at ``max_seq_len`` (at ``step`` when nothing fits)."""
    next_seq_len: int | None
    """One step longer (None at the ceiling)."""
    next_peak_bytes: int | None
    stops: str | None
    """The ledger category that grows most from ``max_seq_len`` to ``next_seq_len``: what runs out."""
    step: int
    ceiling: int
    """The longest searched: the model's trained context."""
    measured: int
    """Lengths measured."""

    @property
    def at_ceiling(self) -> bool:
        return self.max_seq_len == self.ceiling

    def to_dict(self) -> dict:
        return {**asdict(self), "at_ceiling": self.at_ceiling}


def longest_seq_len(peak_at: Peak, fits: Callable[[int], bool], ceiling: int, step: int = 1,
                    host_fits: Callable[[int], bool] | None = None) -> LongestFit:
    """Bisection on multiples of ``step`` in [step, ceiling] for the longest whose ``peak_at`` ``fits`` (and whose
    host peak, the third figure ``peak_at`` gives, ``host_fits`` when given)."""
    seen: dict[int, tuple] = {}

    def peak(n: int) -> tuple:
        if n not in seen:
            seen[n] = tuple(peak_at(n))
        return seen[n]

    def device_ok(n: int) -> bool:
        return fits(peak(n)[0])

    def ok(n: int) -> bool:
        at = peak(n)
        return device_ok(n) and (host_fits is None or len(at) < 3 or host_fits(at[2]))

    top = max(step, ceiling // step * step)
    if ok(top):
        return LongestFit(top, peak(top)[0], None, None, None, step, ceiling, len(seen))
    if not ok(step):
        return LongestFit(None, peak(step)[0], step, peak(step)[0], HOST if device_ok(step) else None,
                          step, ceiling, len(seen))
    lo, hi = 1, top // step  # in steps: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid * step):
            lo = mid
        else:
            hi = mid
    (at, ledger, *_), (over, ledger_over, *_) = peak(lo * step), peak(hi * step)
    if device_ok(hi * step):
        stops = HOST
    else:
        grows = {c: ledger_over.get(c, 0) - ledger.get(c, 0) for c in set(ledger) | set(ledger_over)}
        stops = max(grows, key=grows.get) if grows else None
    return LongestFit(lo * step, at, hi * step, over, stops, step, ceiling, len(seen))
