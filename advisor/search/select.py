"""Choosing the answer from a study's trials: feasibility, the best balance, the Pareto front,
and an explanation built from the numbers. Pure functions over plain records (no Optuna here),
so the CLI, the TUI and the report render the same selection.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from advisor.core.fit import fits, host_fits
from advisor.core.units import format_bytes
from advisor.search.ladder import is_reference

T = TypeVar("T")

TIE = 0.02  # throughputs within 2% are a tie: broken by no CPU offload, then accuracy, then more headroom
# accuracy losses (KL nats/token) within this are a tie: the priors of accuracy_priors.yaml are int8 0.002,
# nf4 0.015, fp4 0.035, so one quantization format is never a tie with another
ACCURACY_TIE = 0.005
ACCURACY_TOLERANCE = 0.05
"""Default largest accuracy loss a chosen plan may have (KL nats/token; `advisor tune --accuracy-tolerance`):
every quantization prior of accuracy_priors.yaml (int8 0.002, nf4 0.015, fp4 0.035) is within it, so the
default never rules a format out by its prior alone; a measured KL above it does."""


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the advisor shows it."""

    number: int
    state: str                     # complete, pruned, failed, running, waiting
    plan: dict[str, Any]
    plan_short: str
    stage: str = ""                # how far it went: plan, estimate, simulate, probe
    reason: str = ""               # why it was pruned (or failed)
    peak_bytes: int | None = None  # the training step's peak (its ledger sums to it)
    tensor_peak_bytes: int | None = None
    source: str = ""               # estimated, simulated, measured
    run_peak_bytes: int | None = None  # the run's peak: the highest of load, train, eval, generate, save
    run_peak_phase: str = ""       # the phase that sets it
    ledger: dict[str, int] = field(default_factory=dict)
    host_bytes: int = 0            # host memory the plan keeps during training (offloaded)
    host_peak_bytes: int = 0       # the run's host peak: process + max(load, training), pinned and pageable
    host_peak_phase: str = ""      # load or train: what sets the host peak
    host_pinned_bytes: int = 0     # page-locked bytes during training (advisor.memory.host)
    host_pageable_bytes: int = 0
    host_ledger: dict[str, int] = field(default_factory=dict)  # host bytes per ledger category
    host_source: str = ""          # estimated or simulated: the stage that counted the host bytes (a probe does not)
    tokens_per_s: float | None = None
    tokens_per_s_source: str = ""  # predicted or measured
    accuracy_loss: float | None = None
    accuracy_source: str = ""      # prior or measured
    seconds: float = 0.0
    ladder: str = ""               # the ladder rung that proposed it, if any
    losses: list[float] = field(default_factory=list)
    duplicate_of: int | None = None  # a repeat proposal, answered from this earlier trial
    note: str = ""                 # e.g. why a later stage was skipped
    step_terms: dict[str, float] = field(default_factory=dict)  # predicted seconds per step of each
    #                               step-time term (advisor/speed), also kept when a probe measured the speed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_peak(t: TrialRecord) -> int | None:
    """What feasibility is decided on: the run's peak when known, else the step's."""
    return t.run_peak_bytes or t.peak_bytes


def host_peak(t: TrialRecord) -> int:
    """What host feasibility is decided on: the run's host peak, else (a record from before it was kept) the
    offloaded bytes."""
    return t.host_peak_bytes or t.host_bytes


@dataclass(frozen=True)
class Selection:
    best: TrialRecord | None
    runner_up: TrialRecord | None
    feasible: list[TrialRecord]
    pareto: list[TrialRecord]
    explanation: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best.to_dict() if self.best else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "pareto": [t.to_dict() for t in self.pareto], "explanation": self.explanation}


def _key(t: TrialRecord) -> tuple:
    return (t.tokens_per_s or 0.0, -(t.peak_bytes or 0))


def non_dominated(items: Iterable[T], objectives: Callable[[T], tuple]) -> list[T]:
    """The items no other item beats: at least as good on every objective and better on one.

    ``objectives`` gives a tuple where larger is better on each axis (negate what is minimised). Shared by
    the training selection and the serving one (advisor.search.serve_select)."""
    items = list(items)
    keys = [tuple(objectives(t)) for t in items]

    def dominates(a: tuple, b: tuple) -> bool:
        return all(x >= y for x, y in zip(a, b)) and a != b

    # a dominator is larger in lexicographic order, so it comes first in descending order; and whatever dominates
    # a dominated item dominates what that item dominates: checking each item against the front found so far is
    # enough (Kung, Luccio & Preparata 1975): O(n x front) instead of O(n^2), for grids of 10^5 plans
    front: list[int] = []
    for i in sorted(range(len(items)), key=keys.__getitem__, reverse=True):
        if not any(dominates(keys[j], keys[i]) for j in front):
            front.append(i)
    return [items[i] for i in sorted(front)]


def pareto_front(records: list[TrialRecord]) -> list[TrialRecord]:
    """Trials no other trial beats on throughput, accuracy loss and memory at once."""
    front = non_dominated(records, lambda t: (t.tokens_per_s, -t.accuracy_loss, -t.peak_bytes))
    seen, unique = set(), []
    for t in sorted(front, key=lambda t: -(t.tokens_per_s or 0)):
        k = (t.plan_short, round(t.tokens_per_s or 0, 3))
        if k not in seen:
            seen.add(k)
            unique.append(t)
    return unique


def select(records: list[TrialRecord], budget_bytes: int, headroom: float, tolerance: float,
           unit: str = "GiB", host_budget_bytes: int | None = None) -> Selection:
    """Highest throughput among feasible trials within the accuracy tolerance; ties → ``break_tie``.
    Feasible: the GPU rule and, with a host budget, the host rule (advisor.core.fit)."""
    done = [t for t in records if t.state == "complete" and t.peak_bytes is not None and t.tokens_per_s
            and t.duplicate_of is None]
    feasible = [t for t in done if fits(run_peak(t), budget_bytes, headroom)
                and host_fits(host_peak(t), host_budget_bytes)]
    accurate = [t for t in feasible if (t.accuracy_loss or 0.0) <= tolerance]
    ranked = sorted(accurate, key=lambda t: -(t.tokens_per_s or 0))
    best = None
    if ranked:
        top = ranked[0].tokens_per_s
        best = break_tie([t for t in ranked if t.tokens_per_s >= top * (1 - TIE)])
    runner_up = next((t for t in ranked if best and t.plan_short != best.plan_short), None)
    pareto = pareto_front(feasible)
    return Selection(best, runner_up, feasible, pareto,
                     explain(best, runner_up, records, feasible, budget_bytes, headroom, tolerance, unit))


def _offloads(t: TrialRecord) -> bool:
    return t.plan.get("offload", "none") != "none"


def break_tie(ties: list[TrialRecord]) -> TrialRecord:
    """Among plans of tied throughput: CPU offload only as the last resort (the seeds' priority order),
    then the lowest accuracy loss (within ``ACCURACY_TIE``), then the most headroom."""
    pool = [t for t in ties if not _offloads(t)] or ties
    least = min(t.accuracy_loss or 0.0 for t in pool)
    pool = [t for t in pool if (t.accuracy_loss or 0.0) <= least + ACCURACY_TIE]
    return min(pool, key=run_peak)


def tie_decider(best: TrialRecord, other: TrialRecord) -> str:
    """What chose ``best`` over ``other`` when their throughputs tie (``break_tie``'s order)."""
    if _offloads(other) and not _offloads(best):
        return "no CPU offload decided"
    if (other.accuracy_loss or 0.0) > (best.accuracy_loss or 0.0) + ACCURACY_TIE:
        return "the lower accuracy loss decided"
    return "more headroom decided"


def explain(best, runner_up, records, feasible, budget_bytes, headroom, tolerance, unit) -> list[str]:
    fmt = lambda n: format_bytes(n, unit)  # noqa: E731
    lines: list[str] = []
    pruned = [t for t in records if t.state == "pruned"]
    if best is None:
        lines.append(f"No plan fits {fmt(budget_bytes)} with {headroom:.0%} headroom and an accuracy loss "
                     f"within {tolerance}: {len(pruned)} pruned, {len(feasible)} feasible.")
        smallest = min((t for t in records if t.peak_bytes), key=run_peak, default=None)
        if smallest:
            during = (f", during {smallest.run_peak_phase}" if smallest.run_peak_phase not in ("", "train") else "")
            lines.append(f"The smallest plan seen, #{smallest.number} {smallest.plan_short}, needs "
                         f"{fmt(run_peak(smallest))} ({smallest.source}{during}).")
        return lines
    left = budget_bytes - run_peak(best)
    during = f" during {best.run_peak_phase}" if best.run_peak_phase not in ("", "train") else ""
    lines.append(f"Chosen #{best.number} {best.plan_short}: {best.tokens_per_s:,.0f} tokens/s "
                 f"({best.tokens_per_s_source}), peak {fmt(run_peak(best))}{during} ({best.source}) of {fmt(budget_bytes)}, "
                 f"{fmt(left)} ({left / budget_bytes:.0%}) left; accuracy loss {best.accuracy_loss:.3f} "
                 f"({best.accuracy_source}, tolerance {tolerance}).")
    if runner_up:
        d_tps = (runner_up.tokens_per_s / best.tokens_per_s - 1) * 100
        d_mem = runner_up.peak_bytes - best.peak_bytes
        lines.append(f"Runner-up #{runner_up.number} {runner_up.plan_short}: {d_tps:+.0f}% throughput, "
                     f"{'+' if d_mem >= 0 else '-'}{fmt(abs(d_mem))} memory, accuracy loss {runner_up.accuracy_loss:.3f}.")
        decided = deciding_terms(best, runner_up)
        if decided:
            lines.append(decided)
    breakdown = step_breakdown(best)
    if breakdown:
        lines.append(breakdown)
    faster = [t for t in feasible if t.tokens_per_s > best.tokens_per_s and (t.accuracy_loss or 0) > tolerance]
    if faster:
        f = max(faster, key=lambda t: t.tokens_per_s)
        lines.append(f"Faster but rejected for accuracy: #{f.number} {f.plan_short} ({f.tokens_per_s:,.0f} tokens/s, "
                     f"loss {f.accuracy_loss:.3f} > {tolerance}).")
    over = [t for t in records if t.state == "pruned" and t.plan.get("method") == "full" and t.peak_bytes]
    if over:
        reference = [t for t in over if is_reference(t.plan)]
        t = reference[0] if reference else min(over, key=lambda t: t.peak_bytes)
        lines.append(f"Full fine-tuning rejected: #{t.number} {t.plan_short}: {t.reason}.")
    if pruned:
        by_stage: dict[str, int] = {}
        for t in pruned:
            by_stage[t.stage or "plan"] = by_stage.get(t.stage or "plan", 0) + 1
        lines.append("Pruned: " + ", ".join(f"{n} at {s}" for s, n in sorted(by_stage.items())) + ".")
    return lines


# ----------------------------------------------------------------------------- step-time terms

def _per_token(t: TrialRecord) -> dict[str, float]:
    """Predicted seconds per token of each step-time term of a trial (what the ranking compares)."""
    p = t.plan or {}
    tokens = int(p.get("micro_batch", 1)) * int(p.get("seq_len", 1)) * int(p.get("grad_accum", 1))
    return {k: v / tokens for k, v in t.step_terms.items()} if tokens > 0 else {}


def deciding_terms(best: TrialRecord, other: TrialRecord, n: int = 2) -> str:
    """The predicted step-time terms that separate two plans, per 1k tokens, largest first."""
    if not best.step_terms or not other.step_terms:
        return ""
    from advisor.speed.throughput import term_labels

    labels = term_labels()
    a, b = _per_token(best), _per_token(other)
    diffs = sorted(((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)), key=lambda dk: -abs(dk[0]))
    shown = [f"{labels.get(k, k)} {'+' if d > 0 else '-'}{abs(d) * 1e6:.1f} ms" for d, k in diffs[:n] if abs(d) > 1e-12]
    if not shown:
        return ""
    vs = f"#{other.number} vs #{best.number}"
    if best.tokens_per_s and other.tokens_per_s and abs(other.tokens_per_s / best.tokens_per_s - 1) <= TIE:
        return (f"Throughput tie (within {TIE:.0%}): {vs} differ most in {', '.join(shown)} per 1k tokens "
                f"(predicted step-time terms); {tie_decider(best, other)}.")
    return f"Decided by (predicted step-time terms per 1k tokens, {vs}): {', '.join(shown)}."


def step_breakdown(t: TrialRecord, n: int = 3) -> str:
    """Where the chosen plan's predicted step time goes: its largest terms and their shares."""
    total = sum(t.step_terms.values())
    if not t.step_terms or total <= 0:
        return ""
    from advisor.speed.throughput import term_labels

    labels = term_labels()
    top = sorted(t.step_terms.items(), key=lambda kv: -kv[1])[:n]
    return (f"Its predicted step ({total:.2f} s) goes to " + ", ".join(
        f"{labels.get(k, k)} {v / total:.0%}" for k, v in top) + ".")
