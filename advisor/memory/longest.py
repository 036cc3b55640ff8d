"""The longest sequence a plan fits on a budget: bisection on the run's peak over the sequence length.

Every term of a step's ledger is non-decreasing in the sequence length (saved activations, the logits and the loss,
attention's workspace, the KV of an evaluation; weights and optimizer states do not move), so the lengths that fit
are an interval from the shortest up, and bisection finds its end: the run's peak at the answer fits, at one step
more it does not. The category that grows most over that step is what stops it. The search stops at the model's
context (``max_position_embeddings``, or factor x it under ``--rope-scaling``): past it the model needs (more) RoPE
scaling.
Calculation only: the caller measures (the closed form, or the simulation) and renders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

STEP = 64
"""Lengths a simulation or a probe bisects on (and a study runs at) are multiples of this many tokens: each is a
trace or a run."""

Peak = Callable[[int], tuple[int, dict[str, int]]]
"""The run's peak and its device ledger at a sequence length."""


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
                    guess: int | None = None) -> LongestFit:
    """Bisection on multiples of ``step`` in [step, ceiling] for the longest whose ``peak_at`` ``fits``; ``guess``: a
    length that likely fits (another measure's answer), where the search starts when it does."""
    seen: dict[int, tuple[int, dict[str, int]]] = {}

    def peak(n: int) -> tuple[int, dict[str, int]]:
        if n not in seen:
            seen[n] = peak_at(n)
        return seen[n]

    top = max(step, ceiling // step * step)
    if fits(peak(top)[0]):
        return LongestFit(top, peak(top)[0], None, None, None, step, ceiling, len(seen))
    if not fits(peak(step)[0]):
        return LongestFit(None, peak(step)[0], step, peak(step)[0], None, step, ceiling, len(seen))
    lo, hi = 1, top // step  # in steps: lo fits, hi does not
    if guess is not None and step < guess // step * step < top:
        g = guess // step
        if fits(peak(g * step)[0]):
            lo = g
        else:
            hi = g
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(peak(mid * step)[0]):
            lo = mid
        else:
            hi = mid
    (at, ledger), (over, ledger_over) = peak(lo * step), peak(hi * step)
    grows = {c: ledger_over.get(c, 0) - ledger.get(c, 0) for c in set(ledger) | set(ledger_over)}
    stops = max(grows, key=grows.get) if grows else None
    return LongestFit(lo * step, at, hi * step, over, stops, step, ceiling, len(seen))


def peaks(measure: Callable, plan) -> Peak:
    """``Peak`` of ``plan`` from ``measure(plan)``, a report with the run's phases: its run peak and device ledger
    at each length."""
    def peak_at(n: int) -> tuple[int, dict[str, int]]:
        report = measure(plan.with_(seq_len=n))
        return report.run_peak_bytes, dict(report.device)
    return peak_at


def ceiling_of(model, rope_scaling: str | None = None) -> int:
    """The longest searched: the model's trained context, or factor x it under ``rope_scaling`` (--rope-scaling
    yarn:4: 4 x max_position_embeddings, advisor.core.rope.scaled_context)."""
    from advisor.core.rope import scaled_context

    return scaled_context(int(model.max_position_embeddings or 131072), rope_scaling or "none")


def longest_plan(model, plan, budget_bytes: int, headroom: float, measure: Callable, backend: str) -> tuple:
    """``plan`` at the longest sequence whose run (``measure(plan)``, a report with the run's phases) fits
    ``budget_bytes`` less ``headroom``, and the search: by the token on the closed form (``backend`` estimate), by
    ``STEP`` tokens on a simulation or a probe (each length is a trace or a run). advisor estimate and advisor
    preflight ask it (``--seq-len max``)."""
    from advisor.core.fit import fits

    fit = longest_seq_len(peaks(measure, plan), lambda peak: fits(peak, budget_bytes, headroom),
                          ceiling_of(model, plan.rope_scaling), step=1 if backend == "estimate" else STEP)
    return plan.with_(seq_len=fit.max_seq_len or fit.step), fit
