"""`advisor tune seq_len=max`: the longest sequence the space reaches on the budget, then the study at it.

The longest comes first (``longest_of_space``): each of the space's most frugal plans (one per method,
quantization, offload and optimizer: advisor.search.tuner's frugal candidates), its adapters raised until its
accuracy loss is within the tolerance, is measured at the space's length and at the model's trained context; the
peak is close to affine in the length there (saved activations, logits and loss grow with it: advisor.memory.
longest), so the two points rank the candidates, and the three that reach farthest are bisected on the closed form
(by the token). The best is bisected again on the simulation (by 64 tokens, near the closed form's answer), which
decides a finalist at the edge of the budget in every study (advisor.search.tuner.simulate_finalists). The study
then runs at ``study_seq_len`` (5% under the longest, so that plans which reach nearly as far compete on speed)
with the longest plan among its first trials. Calculation only: tune renders."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.core.fit import fits, host_fits
from advisor.core.plan import Plan
from advisor.memory.longest import STEP, LongestFit, ceiling_of, longest_seq_len, peaks

WITHIN = 0.05
"""The answer is the fastest plan that reaches within this fraction of the longest (issue 31)."""
BISECTED = 3
"""The frugal candidates that reach farthest by their two-point line, each bisected exactly."""


@dataclass(frozen=True)
class LongestOfSpace:
    plan: Plan
    """The plan that reaches farthest, at its longest length."""
    params: dict[str, Any]
    """Its point of the space (to enqueue it in the study)."""
    fit: LongestFit
    """The bisection that found it (on the simulation where the study simulates)."""
    answered_by: str
    """closed form, or simulation."""
    closed_form_max: int | None
    """The closed form's longest for the same plan (beside the simulation's)."""

    @property
    def max_seq_len(self) -> int | None:
        return self.fit.max_seq_len

    def to_dict(self) -> dict:
        return {"max_seq_len": self.max_seq_len, "plan": self.plan.to_dict(), "plan_short": self.plan.short(),
                "answered_by": self.answered_by, "closed_form_max_seq_len": self.closed_form_max,
                "study_seq_len": study_seq_len(self.max_seq_len, self.fit.at_ceiling), "search": self.fit.to_dict()}


def study_seq_len(longest: int | None, at_ceiling: bool = False) -> int | None:
    """The length the study runs at: ``WITHIN`` under the longest, up to a multiple of ``STEP``, never past it; the
    longest itself where it is the model's trained context (every plan that reaches it is as long)."""
    if not longest or at_ceiling:
        return longest
    n = math.ceil(longest * (1 - WITHIN) / STEP) * STEP
    return n if n <= longest else longest


def admissible(params: dict[str, Any], settings) -> tuple[dict[str, Any], Plan] | None:
    """``params`` with its adapters raised (rank, then every linear) until the plan's accuracy loss is within the
    tolerance, as the answer must be (advisor.search.select); None when no rank of the space gets there or a lever
    has no quality entry."""
    from advisor.memory.sharding import gpu_count_problems
    from advisor.search.quality import quality_of, uncovered_levers
    from advisor.search.space import plan_from_params

    space, arch = settings.space, settings.model.arch or {}
    global_batch = space.fixed.get("global_batch")
    ranks = sorted(set(space.search.get("lora_r") or [params.get("lora_r")]) - {None})
    targets = [t for t in dict.fromkeys([params.get("lora_targets")] + list(space.search.get("lora_targets") or []))
               if t is not None]
    tries = [params] if params.get("method") == "full" else \
        [{**params, "lora_r": r, "lora_targets": t} for t in (targets or [None]) for r in (ranks or [None])
         if r is None or r >= (params.get("lora_r") or 0)]
    for point in tries:
        point = {k: v for k, v in point.items() if v is not None}
        try:
            plan = plan_from_params(point, space, arch)
        except AdvisorInputError:  # a point the space cannot build (an unknown target module) is skipped
            continue
        if plan.problems() or gpu_count_problems(plan, settings.gpus) \
                or uncovered_levers(plan, settings.regime, global_batch=global_batch, gpus=settings.gpus):
            continue
        loss = quality_of(plan, settings.regime, global_batch=global_batch, gpus=settings.gpus).accuracy_loss
        if loss <= settings.tolerance:
            return point, plan
    return None


def longest_of_space(settings, measure_estimate, measure_simulated=None) -> LongestOfSpace | None:
    """The plan of the space that reaches the longest sequence on the budget (see the module docstring).
    ``measure_estimate(plan)`` / ``measure_simulated(plan)``: the run's report of ``plan`` (one GPU of the run); without
    the second, the closed form answers. None when no frugal plan fits even ``STEP`` tokens."""
    from advisor.search.quality import quality_of
    from advisor.search.tuner import _frugal_candidates

    budget = settings.budget.bytes
    ceiling = ceiling_of(settings.model, settings.space.fixed.get("rope_scaling"))
    short = settings.space.fixed.get("seq_len") or 1024
    global_batch = settings.space.fixed.get("global_batch")
    candidates = []
    for params in _frugal_candidates(settings.space):
        found = admissible(params, settings)
        if found is None:
            continue
        point, plan = found
        try:
            at_short = measure_estimate(plan.with_(seq_len=min(short, ceiling)))
            a, b = at_short.run_peak_bytes, measure_estimate(plan.with_(seq_len=ceiling)).run_peak_bytes
        except AdvisorInputError:  # a plan the closed form cannot measure at that length is not a candidate
            continue
        if not host_fits(at_short.host_peak_bytes * settings.gpus, settings.host_budget_bytes):
            continue  # its offloaded states are over the host budget at any length
        slope = (b - a) / max(1, ceiling - min(short, ceiling))
        far = ceiling if b <= budget else (budget - a) / slope if slope > 0 else 0
        dynamics = quality_of(plan, settings.regime, global_batch=global_batch, gpus=settings.gpus).dynamics
        candidates.append((dynamics, -far, plan.short(), point, plan))
    if not candidates:
        return None
    if any(not c[0] for c in candidates):  # levers that change training dynamics only where nothing else reaches
        candidates = [c for c in candidates if not c[0]]
    candidates.sort(key=lambda c: c[:3])
    best = None
    for _, _, _, point, plan in candidates[:BISECTED]:
        fit = bisect(settings, measure_estimate, plan, ceiling, 1)
        if fit.max_seq_len and (best is None or fit.max_seq_len > best[0].max_seq_len):
            best = (fit, point, plan)
    if best is None:
        return None
    closed_fit, point, plan = best
    fit, by = reach(settings, plan, measure_estimate, measure_simulated, closed_fit)
    if not fit.max_seq_len:
        return None
    return LongestOfSpace(plan.with_(seq_len=fit.max_seq_len), point, fit, by, closed_fit.max_seq_len)


def bisect(settings, measure, plan: Plan, top: int, step: int, guess: int | None = None) -> LongestFit:
    """The longest multiple of ``step`` up to ``top`` at which ``measure``'s run of ``plan`` fits the budget."""
    return longest_seq_len(peaks(measure, plan), lambda peak: fits(peak, settings.budget.bytes, settings.headroom),
                           top, step=step, guess=guess)


def reach(settings, plan: Plan, measure_estimate, measure_simulated=None,
          closed_fit: LongestFit | None = None) -> tuple[LongestFit, str]:
    """(the longest ``plan`` reaches, who answered): by the token on the closed form, then by ``STEP`` tokens on the
    simulation near that answer (``measure_simulated`` given and the simulation traces the plan), which decides, as
    it decides a finalist at the edge of the budget (advisor.search.tuner.simulate_finalists)."""
    from advisor.runtime.simulate.vision import simulation_gap

    ceiling = ceiling_of(settings.model, settings.space.fixed.get("rope_scaling"))
    closed_fit = closed_fit or bisect(settings, measure_estimate, plan, ceiling, 1)
    closed = closed_fit.max_seq_len
    if measure_simulated is None or not closed or simulation_gap(settings.model, plan):
        return closed_fit, "closed form"
    top = min(ceiling, math.ceil(closed * (1 + WITHIN) / STEP) * STEP)  # they differ by a few % (or more: notes)
    return bisect(settings, measure_simulated, plan, top, STEP, guess=int(closed * (1 - 2 * WITHIN))), "simulation"


def run_measure(settings, backend: str):
    """``measure(plan)``: one GPU's run of ``plan`` as the study judges it (sharded over the study's GPUs, with the
    run's phases), by the closed form (``estimate``: its approximation where it does not describe the model) or by
    the simulation, which says what it traces while it runs."""
    from advisor.memory.closed_form import closed_form_describes
    from advisor.runtime import progress
    from advisor.runtime.backends import get_backend
    from advisor.runtime.backends._estimate import approximate
    from advisor.runtime.phases import with_phases
    from advisor.search.tuner import _shard

    model, gpu = settings.model, settings.gpu

    def measure(plan: Plan):
        if backend == "estimate":
            report = (get_backend("estimate").measure(model, plan, gpu) if closed_form_describes(model, plan)[0]
                      else approximate(model, plan, gpu))
        else:
            with progress.working(f"simulating {plan.short()} (the longest sequence that fits?)"):
                report = get_backend("simulate").measure(model, plan, gpu)
        return with_phases(model, plan, gpu, _shard(settings, report, plan))
    return measure


def answer_longest(settings, plan: Plan, longest: LongestOfSpace) -> tuple[LongestFit, str]:
    """The longest sequence the answer itself reaches, as the longest of the space was found (``reach``); the same
    figures where the answer is that plan."""
    if plan.with_(seq_len=longest.plan.seq_len) == longest.plan:
        return longest.fit, longest.answered_by
    return reach(settings, plan, run_measure(settings, "estimate"), run_measure(settings, "simulate"))
