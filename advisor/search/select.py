"""Choosing the answer from a study's trials: feasibility, time to quality held to the usual recipe, the
Pareto front, and an explanation built from the numbers. Pure functions over plain records (no Optuna here),
so the CLI, the TUI and the report render the same selection.

The ranking is time to quality (DESIGN.md "Objectives"): a plan's tokens per second corrected by what its
levers do to training (advisor/data/quality.yaml: token_factor / tokens_per_s). The usual recipe
(advisor.search.recipe) is the baseline: an answer departs from it by exact levers freely, otherwise only
for a gain larger than the step-time model's own median error, with its quality within the tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from advisor.core.fit import fits, host_fits
from advisor.core.plan import Plan
from advisor.core.units import format_bytes
from advisor.search.departures import Departure, departures, non_exact, plan_of, with_change
from advisor.search.ladder import is_reference
from advisor.search.recipe import is_recipe

T = TypeVar("T")

TIE = 0.02
"""Times to quality within 2% are a tie: broken by fewer changes from the usual recipe, no CPU offload, the
lower accuracy loss beyond noise, then more headroom (``break_tie``)."""
ACCURACY_TIE = 0.005
"""Measured accuracy losses (nats/token) within this are a tie (priors are compared by their sources' noise:
advisor.search.quality.quality_tie)."""
ACCURACY_TOLERANCE = 0.05
"""Default largest accuracy loss a chosen plan may have (nats/token of excess held-out loss against the
reference training; `advisor tune --accuracy-tolerance`): advisor/data/quality.yaml ``default_tolerance``,
about +5% perplexity, just beyond what the sources' downstream evaluations resolve (peft's re-runs move
GSM8K 3-4 points, 0.03-0.04 nats)."""


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
    token_factor: float = 1.0      # training tokens to reach the same loss, relative to the reference (quality.yaml)
    seconds: float = 0.0
    ladder: str = ""               # the ladder rung that proposed it, if any
    losses: list[float] = field(default_factory=list)
    duplicate_of: int | None = None  # a repeat proposal, answered from this earlier trial
    note: str = ""                 # e.g. why a later stage was skipped
    step_terms: dict[str, float] = field(default_factory=dict)  # predicted seconds per step of each
    #                               step-time term (advisor/speed), also kept when a probe measured the speed
    approximate: bool = False      # memory approximated by the closed form beyond what it describes (not yet
    #                               simulated: the tuner simulates the finalists, advisor.search.tuner)
    closed_form_decides: bool = False  # a simulating backend left it to the closed form, which describes it and
    #                               puts it clear of both budgets (advisor.search.tuner); simulated once it is
    #                               the answer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


POLISH_MARK = "polish:"
"""The ladder label of a trial Tuner.polish added (not one of the planned --trials)."""


def signed_pct(x: float) -> str:
    """A relative change as the explanation prints it: "+16%", "-5%", and "0%" for what rounds to none (never
    "-0%")."""
    text = f"{x:+.0%}"
    return "0%" if text in ("+0%", "-0%") else text


def is_polish(record) -> bool:
    """A trial Tuner.polish added after the planned ones."""
    return (record.ladder or "").startswith(POLISH_MARK)


def record_from_trial(trial) -> TrialRecord:
    """A TrialRecord from an Optuna FrozenTrial (its user attribute "record")."""
    data = dict(trial.user_attrs.get("record") or {})
    state = trial.state.name.lower()
    data.setdefault("plan", {})
    data.setdefault("plan_short", "")
    data.pop("number", None)
    data.pop("state", None)
    data.setdefault("duplicate_of", trial.user_attrs.get("duplicate_of"))
    known = set(TrialRecord.__dataclass_fields__)
    return TrialRecord(number=trial.number, state=state, **{k: v for k, v in data.items() if k in known})


def run_peak(t: TrialRecord) -> int | None:
    """What feasibility is decided on: the run's peak when known, else the step's."""
    return t.run_peak_bytes or t.peak_bytes


def peak_phase(t: TrialRecord) -> str:
    """The phase that sets the run's peak where it is not the training step ("" where it is, or is not known)."""
    return t.run_peak_phase if t.run_peak_bytes and t.run_peak_phase not in ("", "train") else ""


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
    recipe: TrialRecord | None = None
    """The usual recipe's trial (None where the space leaves out every version of it, or a study older than it)."""
    departures: list[Departure] = field(default_factory=list)
    """What the answer changes from the usual recipe, group by group."""

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best.to_dict() if self.best else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "recipe": self.recipe.to_dict() if self.recipe else None,
                "departures": [asdict(d) for d in self.departures],
                "pareto": [t.to_dict() for t in self.pareto], "explanation": self.explanation}


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
    """Trials no other trial beats on time to quality, accuracy loss and memory at once."""
    front = non_dominated(records, lambda t: (-time_to_quality(t), -t.accuracy_loss, -t.peak_bytes))
    seen, unique = set(), []
    for t in sorted(front, key=time_to_quality):
        k = (t.plan_short, round(t.tokens_per_s or 0, 3))
        if k not in seen:
            seen.add(k)
            unique.append(t)
    return unique


@dataclass(frozen=True)
class Rules:
    """How the answer is chosen beside the budget: the quality model's regime, the global batch the user asked
    for, and the step-time model's measured error that a change must beat to leave the usual recipe."""

    regime: str | None = None
    """sft (default), domain or cpt: advisor/data/quality.yaml ``regimes``."""
    global_batch: int | None = None
    """Sequences per optimizer step the space fixes (a plan that changes it changes the dynamics)."""
    gpus: int = 1
    """The run's GPUs, over whose data-parallel ranks the global batch is split."""
    margin: float | None = None
    """The gain in time to quality a non-exact change must exceed; None: the step-time model's median error
    (advisor/data/prediction_error.yaml ``step_time``)."""
    uniform_lengths: bool = False
    """No --data was given: every sequence is taken to be seq_len tokens (no padding), which the explanation
    says when the answer batches several unpacked sequences."""
    host_budget_bytes: int | None = None
    """The host budget (advisor.core.fit's host rule); None: host memory is not checked (an older study)."""

    def needed_gain(self) -> float:
        return step_time_error() if self.margin is None else self.margin


def step_time_error() -> float:
    """The step-time model's median |error| against published runs (prediction_error.yaml, checked against
    benchmarks/throughput_vs_published.py by tests/test_speed_published.py)."""
    from advisor.core.data_files import load_data_file

    return float(load_data_file("prediction_error.yaml")["step_time"]["median_abs"])


def time_to_quality(t: TrialRecord) -> float:
    """Seconds per reference token (token factor / tokens per second): the ranking key, lower is better."""
    return (t.token_factor or 1.0) / t.tokens_per_s


def _quality(t: TrialRecord, rules: Rules):
    from advisor.search.quality import quality_of

    return quality_of(plan_of(t.plan), rules.regime, global_batch=rules.global_batch, gpus=rules.gpus)


def select(records: list[TrialRecord], budget_bytes: int, headroom: float, tolerance: float,
           unit: str = "GiB", rules: Rules | None = None,
           measure_change: Callable[[Plan], tuple[float | None, int | None]] | None = None) -> Selection:
    """The best balance of time to quality among feasible trials, held to the usual recipe.

    1. Eligible: fits the budget with headroom (and the host budget, advisor.core.fit), every lever has a
       quality entry, accuracy loss within ``tolerance``; levers that change training dynamics only when no
       eligible plan fits without them.
    2. Allowed: the usual recipe's trial (advisor.search.recipe), and any plan that departs from it by exact
       levers only, or whose gain in time to quality over it beats the step-time model's median error
       (``Rules.needed_gain``). Without a recipe that fits, every eligible plan is allowed.
    3. The fastest in time to quality (token factor / tokens per second); plans within ``TIE`` of it go to
       ``break_tie``.
    ``measure_change(plan) -> (tokens/s, run peak)`` lets the explanation say what each change gains alone.
    """
    rules = rules or Rules()
    done = [t for t in records if t.state == "complete" and t.peak_bytes is not None and t.tokens_per_s
            and t.duplicate_of is None]
    feasible = [t for t in done if fits(run_peak(t), budget_bytes, headroom)
                and host_fits(host_peak(t), rules.host_budget_bytes)]
    quality = {t.number: _quality(t, rules) for t in feasible}
    accurate = [t for t in feasible if (t.accuracy_loss or 0.0) <= tolerance]
    pickable = [t for t in accurate if quality[t.number].pickable]
    steady = [t for t in pickable if not quality[t.number].dynamics]
    eligible = steady or pickable
    recipe = next((t for t in records if is_recipe(t.ladder) and t.duplicate_of is None), None)
    baseline = recipe if recipe is not None and recipe in eligible else None
    moves = {t.number: departures(plan_of(t.plan), plan_of(baseline.plan), rules.regime,
                                  global_batch=rules.global_batch, gpus=rules.gpus) if baseline else []
             for t in eligible}
    need = rules.needed_gain()

    def allowed(t: TrialRecord) -> bool:
        return (baseline is None or not non_exact(moves[t.number])
                or time_to_quality(baseline) / time_to_quality(t) - 1 > need)

    ranked = sorted((t for t in eligible if allowed(t)), key=time_to_quality)
    best = None
    if ranked:
        top = time_to_quality(ranked[0])
        best = simplest(break_tie([t for t in ranked if time_to_quality(t) <= top * (1 + TIE)], moves, quality),
                        ranked, moves, need)
    runner_up = next((t for t in ranked if best and t.plan_short != best.plan_short), None)
    pareto = pareto_front(feasible)
    context = _Context(records, feasible, eligible, pickable, steady, recipe, baseline, moves, quality, rules,
                       budget_bytes, headroom, tolerance, unit, measure_change, ranked[0] if ranked else None)
    return Selection(best, runner_up, feasible, pareto, explain(best, runner_up, context), recipe=recipe,
                     departures=list(moves.get(best.number, [])) if best else [])


def changed_groups(moves: list[Departure]) -> frozenset[str]:
    """The groups of levers in which a plan makes non-exact changes to the usual recipe."""
    return frozenset(d.group for d in non_exact(moves))


def simplest(best: TrialRecord, pool: list[TrialRecord], moves: dict, need: float) -> TrialRecord:
    """Each non-exact change from the usual recipe must pay for itself: while some plan of ``pool`` makes a
    strict subset of ``best``'s non-exact changes and is within ``need`` (the step-time model's error) of its
    time to quality, that simpler plan is the answer (the fastest of them, then simplified again)."""
    current = best
    while True:
        mine = changed_groups(moves.get(current.number, []))
        simpler = [t for t in pool if changed_groups(moves.get(t.number, [])) < mine
                   and time_to_quality(t) <= time_to_quality(current) * (1 + need)]
        if not simpler:
            return current
        current = min(simpler, key=time_to_quality)


def _offloads(t: TrialRecord) -> bool:
    return t.plan.get("offload", "none") != "none"


def break_tie(ties: list[TrialRecord], moves: dict | None = None, quality: dict | None = None) -> TrialRecord:
    """Among plans of tied time to quality: the fewest non-exact departures from the usual recipe, then CPU
    offload only as the last resort (the seeds' priority order), then the lower accuracy loss where the
    difference is beyond the sources' noise (advisor.search.quality.quality_tie), then the most headroom."""
    moves, quality = moves or {}, quality or {}
    fewest = min(len(non_exact(moves.get(t.number, []))) for t in ties)
    pool = [t for t in ties if len(non_exact(moves.get(t.number, []))) == fewest]
    pool = [t for t in pool if not _offloads(t)] or pool
    least = min(pool, key=lambda t: t.accuracy_loss or 0.0)
    pool = [t for t in pool if not _more_accurate(least, t, quality)]
    return min(pool, key=run_peak)


def _more_accurate(a: TrialRecord, b: TrialRecord, quality: dict) -> bool:
    """Is ``a`` more accurate than ``b`` beyond noise? Priors: the difference must exceed the noise of the
    levers in which the two plans differ, and the quality model's resolution (advisor.search.quality); a
    measured loss on either side: ``ACCURACY_TIE``."""
    from advisor.search.quality import quality_data, quality_difference

    delta = (b.accuracy_loss or 0.0) - (a.accuracy_loss or 0.0)
    qa, qb = quality.get(a.number), quality.get(b.number)
    if qa is not None and qb is not None and a.accuracy_source == b.accuracy_source == "prior":
        return delta > max(quality_difference(qa, qb)[1], quality_data().resolution) + 1e-12
    return delta > ACCURACY_TIE


def tie_decider(best: TrialRecord, other: TrialRecord, moves: dict | None = None, quality: dict | None = None) -> str:
    """What chose ``best`` over ``other`` when their time to quality ties (``break_tie``'s order)."""
    moves = moves or {}
    if len(non_exact(moves.get(other.number, []))) > len(non_exact(moves.get(best.number, []))):
        return "fewer changes from the usual recipe decided"
    if _offloads(other) and not _offloads(best):
        return "no CPU offload decided"
    if _more_accurate(best, other, quality or {}):
        return "the lower accuracy loss decided"
    return "more headroom decided"


@dataclass(frozen=True)
class _Context:
    records: list[TrialRecord]
    feasible: list[TrialRecord]
    eligible: list[TrialRecord]
    pickable: list[TrialRecord]
    steady: list[TrialRecord]
    recipe: TrialRecord | None
    baseline: TrialRecord | None
    moves: dict[int, list[Departure]]
    quality: dict
    rules: Rules
    budget_bytes: int
    headroom: float
    tolerance: float
    unit: str
    measure_change: Callable[[Plan], tuple[float | None, int | None]] | None
    fastest: TrialRecord | None = None


def explain(best: TrialRecord | None, runner_up: TrialRecord | None, c: _Context) -> list[str]:
    fmt = lambda n: format_bytes(n, c.unit)  # noqa: E731
    lines: list[str] = []
    pruned = [t for t in c.records if t.state == "pruned"]
    if best is None:
        lines.append(f"No plan fits {fmt(c.budget_bytes)} with {c.headroom:.0%} headroom and an accuracy loss "
                     f"within {c.tolerance}: {len(pruned)} pruned, {len(c.feasible)} feasible.")
        smallest = min((t for t in c.records if t.peak_bytes), key=run_peak, default=None)
        if smallest:
            during = f", during {peak_phase(smallest)}" if peak_phase(smallest) else ""
            lines.append(f"The smallest plan seen, #{smallest.number} {smallest.plan_short}, needs "
                         f"{fmt(run_peak(smallest))} ({smallest.source}{during}).")
        return lines
    left = c.budget_bytes - run_peak(best)
    during = f" during {peak_phase(best)}" if peak_phase(best) else ""
    factor = f", {best.token_factor:.2f}x the tokens to the same loss" if (best.token_factor or 1.0) > 1 else ""
    lines.append(f"Chosen #{best.number} {best.plan_short}: {best.tokens_per_s:,.0f} tokens/s "
                 f"({best.tokens_per_s_source}{factor}), peak {fmt(run_peak(best))}{during} ({best.source}) of "
                 f"{fmt(c.budget_bytes)}, {fmt(left)} ({left / c.budget_bytes:.0%}) left; accuracy loss "
                 f"{best.accuracy_loss:.3f} ({best.accuracy_source}, tolerance {c.tolerance}).")
    lines += recipe_lines(best, c, fmt)
    f = c.fastest
    if f is not None and f.number != best.number and time_to_quality(f) < time_to_quality(best):
        extra = changed_groups(c.moves.get(f.number, [])) - changed_groups(c.moves.get(best.number, []))
        gain = time_to_quality(best) / time_to_quality(f) - 1
        if extra and signed_pct(gain) != "0%":
            lines.append(f"Simpler than #{f.number} {f.plan_short}: its further changes ({', '.join(sorted(extra))}) "
                         f"gain {signed_pct(gain)} in time to quality, within the step-time model's "
                         f"{c.rules.needed_gain():.0%} median error.")
    if runner_up:
        d_ttq = time_to_quality(runner_up) / time_to_quality(best) - 1
        d_mem = run_peak(runner_up) - run_peak(best)  # the runs' peaks, as every summary gives them
        lines.append(f"Runner-up #{runner_up.number} {runner_up.plan_short}: {signed_pct(d_ttq)} time to quality, "
                     f"{'+' if d_mem >= 0 else '-'}{fmt(abs(d_mem))} memory, accuracy loss "
                     f"{runner_up.accuracy_loss:.3f}.")
        decided = deciding_terms(best, runner_up, c)
        if decided:
            lines.append(decided)
    breakdown = step_breakdown(best)
    if breakdown:
        lines.append(breakdown)
    p = best.plan
    if c.rules.uniform_lengths and not p.get("packing") and int(p.get("micro_batch", 1)) > 1:
        lines.append(f"Assumes uniform lengths: every sequence is {p.get('seq_len')} tokens (no --data given), so "
                     f"micro-batch {p.get('micro_batch')} pays no padding. On real data of varied lengths it does "
                     "(ms-swift measured micro-batch 8 at 0.64x the samples/s of micro-batch 1): pass --data FILE to "
                     "count it, or pack the sequences (--packing).")
    faster = [t for t in c.feasible
              if time_to_quality(t) < time_to_quality(best) and (t.accuracy_loss or 0) > c.tolerance]
    if faster:
        f = min(faster, key=time_to_quality)
        lines.append(f"Faster but rejected for accuracy: #{f.number} {f.plan_short} ({f.tokens_per_s:,.0f} tokens/s, "
                     f"loss {f.accuracy_loss:.3f} > {c.tolerance}).")
    unpicked = [t for t in c.feasible if t.number in c.quality and not c.quality[t.number].pickable]
    if unpicked:
        levers = sorted({u.split(":")[0] for t in unpicked for u in c.quality[t.number].uncovered})
        lines.append(f"Left out: {len(unpicked)} plan(s) using levers no source measured in this setting "
                     f"({', '.join(levers)}): a lever without a quality entry cannot be picked.")
    dynamic = [t for t in c.pickable if t not in c.steady] if c.steady else []
    if dynamic:
        levers = sorted({x for t in dynamic for x in c.quality[t.number].dynamics})
        lines.append(f"Left out: {len(dynamic)} plan(s) with levers that change training dynamics "
                     f"({', '.join(levers)}): they are used only where nothing else fits, and plans without "
                     "them fit.")
    held = [t for t in c.records if t.state == "pruned" and t.duplicate_of is None
            and t.reason.startswith("changes training dynamics")]
    if held:
        lines.append(f"Not searched: {len(held)} plan(s) with levers that change training dynamics (e.g. "
                     f"#{held[0].number} {held[0].plan_short}): a plan without them fits.")
    over = [t for t in c.records if t.state == "pruned" and t.plan.get("method") == "full" and t.peak_bytes]
    if over and (best is None or best.plan.get("method") != "full"):  # a full answer rejects no full fine-tuning
        reference = [t for t in over if is_reference(t.plan)]
        t = reference[0] if reference else min(over, key=lambda t: t.peak_bytes)
        lines.append(f"Full fine-tuning rejected: #{t.number} {t.plan_short}: {t.reason}.")
    if pruned:
        by_stage: dict[str, int] = {}
        for t in pruned:
            by_stage[t.stage or "plan"] = by_stage.get(t.stage or "plan", 0) + 1
        lines.append("Pruned: " + ", ".join(f"{n} at {s}" for s, n in sorted(by_stage.items())) + ".")
    return lines


def recipe_lines(best: TrialRecord, c: _Context, fmt: Callable[[int], str]) -> list[str]:
    """The answer beside the usual recipe: what it changes, what each change gains and costs."""
    r = c.recipe
    if r is None:
        return ["No usual-recipe trial in this study: the space leaves out every version of the usual recipe (a "
                "method or value it pins; advisor.search.recipe), so the answer is the fastest eligible plan."]
    if c.baseline is None:
        why = r.reason or ("its accuracy loss is over the tolerance" if r in c.feasible else "it did not run")
        return [f"The usual recipe, #{r.number} {r.plan_short}, is not a candidate: {why}. The answer is the "
                "fastest eligible plan."]
    if best.number == r.number:
        lines = [f"This is the usual recipe ({r.plan_short})."]
        better = [t for t in c.eligible if time_to_quality(t) < time_to_quality(r) and non_exact(c.moves[t.number])]
        if better:
            t = min(better, key=time_to_quality)
            gain = time_to_quality(r) / time_to_quality(t) - 1
            lines.append(f"The fastest departure, #{t.number} {t.plan_short}, gains {signed_pct(gain)} in time to "
                         "quality "
                         f"but changes {', '.join(d.group for d in non_exact(c.moves[t.number]))} (not exact): a "
                         f"gain within the step-time model's {c.rules.needed_gain():.0%} median error decides "
                         "nothing, so the recipe stays.")
        return lines
    gain = time_to_quality(r) / time_to_quality(best) - 1
    moves = c.moves[best.number]
    d_acc = (best.accuracy_loss or 0.0) - (r.accuracy_loss or 0.0)
    lines = [f"The usual recipe, #{r.number} {r.plan_short}: {r.tokens_per_s:,.0f} tokens/s, peak "
             f"{fmt(run_peak(r))}, accuracy loss {r.accuracy_loss:.3f}. The answer gains {signed_pct(gain)} in time to "
             f"quality at {d_acc:+.3f} accuracy loss"
             + (", changing exact levers only (the trained model is the same)." if not non_exact(moves) else
                f", more than the step-time model's {c.rules.needed_gain():.0%} median error.")]
    recipe_plan, plan = plan_of(r.plan), plan_of(best.plan)
    if moves and c.measure_change:
        lines.append("Each change below is measured alone, applied to the usual recipe: the changes interact (one "
                     "frees the memory another spends), so their gains do not add up to the answer's.")
    for d in moves:
        lines.append("  " + change_line(d, recipe_plan, plan, r, c, fmt))
    return lines


def change_line(d: Departure, recipe_plan: Plan, plan: Plan, r: TrialRecord, c: _Context,
                fmt: Callable[[int], str]) -> str:
    """One change from the recipe: the values, its kind, and what it gains and costs applied to the recipe alone."""
    text = f"{d.group}: {d.recipe} -> {d.answer} ({d.kind})"
    gains = []
    variant = with_change(recipe_plan, plan, d) if c.measure_change else None
    if variant is not None:
        tps, peak = c.measure_change(variant)
        if tps and r.tokens_per_s:
            gains.append(f"{signed_pct(tps / r.tokens_per_s - 1)} tokens/s")
        if peak is not None and run_peak(r):
            delta = peak - run_peak(r)
            gains.append(f"{'+' if delta >= 0 else '-'}{fmt(abs(delta))} peak")
    costs = []
    if d.accuracy_loss:
        costs.append(f"{d.accuracy_loss:+.3f} accuracy loss")
    if abs(d.token_factor - 1) > 1e-9:
        costs.append(f"{d.token_factor:.2f}x tokens")
    if d.kind == "exact":
        costs.append("no quality cost")
    text += ": " + ", ".join(gains + costs) if gains or costs else ""
    if d.sources:
        text += f" [{'; '.join(d.sources)}]"
    return text + "."


# ----------------------------------------------------------------------------- step-time terms

def _per_token(t: TrialRecord) -> dict[str, float]:
    """Predicted seconds per token of each step-time term of a trial (what the ranking compares)."""
    p = t.plan or {}
    tokens = int(p.get("micro_batch", 1)) * int(p.get("seq_len", 1)) * int(p.get("grad_accum", 1))
    return {k: v / tokens for k, v in t.step_terms.items()} if tokens > 0 else {}


def deciding_terms(best: TrialRecord, other: TrialRecord, c: "_Context | None" = None, n: int = 2) -> str:
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
    if best.tokens_per_s and other.tokens_per_s and abs(time_to_quality(other) / time_to_quality(best) - 1) <= TIE:
        decider = tie_decider(best, other, c.moves if c else None, c.quality if c else None)
        return (f"Time-to-quality tie (within {TIE:.0%}): {vs} differ most in {', '.join(shown)} per 1k tokens "
                f"(predicted step-time terms); {decider}.")
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
