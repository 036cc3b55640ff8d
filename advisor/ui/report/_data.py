"""Everything a report shows, computed once from a ``StudySnapshot``: pure, no I/O, no rendering.

The HTML page, the Markdown file, the CSV and the plots all render the same ``ReportData``.
"""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from advisor.core.units import format_bytes
from advisor.search.description import StudyDescription
from advisor.search.measured import study_quality_lines
from advisor.search.select import Selection, TrialRecord, select
from advisor.search.prediction import predict_change
from advisor.ui.report._format import is_built_in_space
from advisor.ui.report._load import StudySnapshot

PEAK_KINDS = ("estimated", "simulated", "measured")
TPS_KINDS = ("predicted", "measured")


@dataclass(frozen=True)
class Comparison:
    """One trial's peak and throughput from each way of knowing them that exists for it."""

    number: int
    plan_short: str
    peak: dict[str, int]
    """{estimated|simulated|measured: bytes}; "estimated" is the analytic ledger, computed for the report."""
    tokens_per_s: dict[str, float]
    """{predicted|measured: tokens/s}; "predicted" is the step-time model (advisor/speed), computed for the report."""

    @property
    def kinds(self) -> int:
        return max(len(self.peak), len(self.tokens_per_s))


@dataclass(frozen=True)
class ReportData:
    """One study, ready to render."""

    study: str
    storage: str
    description: StudyDescription
    """What the study searches (model, gpu, gpu_assumed, budget, space, backend, selection settings, versions...),
    typed (advisor.search.description)."""
    records: list[TrialRecord]
    selection: Selection
    timeline: list[dict[str, Any]]
    """Per trial: number, state, start_s, end_s (seconds since the first trial started), started, ended (ISO)."""
    comparisons: list[Comparison]
    """Trials known in more than one way (analytic estimate beside a simulated or measured peak)."""
    exports: list[dict[str, Any]]
    environment: dict[str, Any]
    reproduce: str
    """The `advisor tune` command that makes the same study."""
    notes: list[str] = field(default_factory=list)
    """Caveats a reader must see (assumed GPU, only estimates...)."""
    phases: Any = None
    """GRPO/DPO: the winner's step phases as a picture's data (advisor.ui.phase_view.PhasePicture, by the closed
    form); None for supervised fine-tuning or no winner."""

    # -- conveniences for the renderers ----------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self.description.budget.bytes

    @property
    def unit(self) -> str:
        return self.description.budget.unit

    @property
    def headroom(self) -> float:
        return self.description.headroom

    def fmt(self, n_bytes: float | None) -> str:
        return "" if n_bytes is None else format_bytes(n_bytes, self.unit)

    @property
    def best(self) -> TrialRecord | None:
        return self.selection.best

    @property
    def pareto_numbers(self) -> set[int]:
        return {t.number for t in self.selection.pareto}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.state] = out.get(r.state, 0) + 1
        return out


def gather(snap: StudySnapshot) -> ReportData:
    d = snap.description
    measure_change = partial(predict_change, d.model, d.gpu, d.gpus, d.sharding)  # the per-change gains tune printed
    # measured over N tokens, or priors: the lines tune printed
    selection = study_quality_lines(select(snap.records, d.budget.bytes, d.headroom, d.tolerance, d.budget.unit,
                                           d.rules, measure_change=measure_change), snap.quality)
    notes = []
    if d.gpu_assumed:
        notes.append(f"No GPU was detected or named when the study ran: throughput is predicted for a "
                     f"{d.gpu.name}, the catalog GPU the budget matches (assumed).")
    sources = {r.source for r in snap.records if r.source}
    if sources <= {"estimated"}:
        notes.append("Every peak in this study is estimated (closed-form ledger); no trial was simulated or "
                     "measured, so there is nothing to compare predictions with.")
    if not any(r.tokens_per_s_source == "measured" for r in snap.records):
        notes.append("Throughput is predicted (step-time model of the GPU), not measured, for every trial.")
    if not any(r.accuracy_source == "measured" for r in snap.records):
        notes.append("Accuracy loss is a documented prior (advisor/data/quality.yaml, docs/quality.md) for every "
                     "trial.")
    return ReportData(
        study=snap.name, storage=snap.storage, description=d, records=list(snap.records), selection=selection,
        timeline=timeline(snap), comparisons=comparisons(snap.records, d), exports=list(snap.exports),
        environment=environment(d), reproduce=reproduce_command(d, snap.name), notes=notes,
        phases=_winner_phases(selection, d))


def _winner_phases(selection: Selection, description: StudyDescription):
    """The GRPO/DPO winner's phase picture (None for SFT or no winner)."""
    from advisor.ui.phase_view import picture_of_record

    best = selection.best
    return picture_of_record(best, description) if best is not None else None


def timeline(snap: StudySnapshot) -> list[dict[str, Any]]:
    starts = [t.start for t in snap.timings.values() if t.start is not None]
    t0 = min(starts) if starts else None
    rows = []
    for r in snap.records:
        t = snap.timings.get(r.number)
        start = t.start if t else None
        end = t.end if t else None
        rows.append({"number": r.number, "state": r.state,
                     "start_s": (start - t0).total_seconds() if start and t0 else None,
                     "end_s": (end - t0).total_seconds() if end and t0 else None,
                     "started": start.isoformat(timespec="seconds") if start else "",
                     "ended": end.isoformat(timespec="seconds") if end else ""})
    return rows


def analytic_numbers(records: list[TrialRecord], description: StudyDescription) -> dict[int, tuple[int, float]]:
    """{trial number: (analytic peak bytes, predicted tokens/s)} for every trial with a valid plan."""
    from advisor.runtime.backends import get_backend
    from advisor.core.errors import AdvisorInputError
    from advisor.core.plan import Plan
    from advisor.speed.throughput import predict_throughput

    model, gpu = description.model, description.gpu  # as the study recorded them: no catalog or network needed
    out: dict[int, tuple[int, float]] = {}
    for r in records:
        if not r.plan or r.stage in ("", "plan"):
            continue
        try:
            plan = Plan.from_dict(r.plan)
            out[r.number] = (int(get_backend("estimate").measure(model, plan, gpu).peak_bytes),
                             float(predict_throughput(model, plan, gpu).tokens_per_s))
        except (AdvisorInputError, KeyError, ValueError):
            continue
    return out


def comparisons(records: list[TrialRecord], description: StudyDescription) -> list[Comparison]:
    """Trials whose recorded numbers come from a simulation or a probe, beside the analytic ones."""
    interesting = [r for r in records if r.source in ("simulated", "measured")
                   or r.tokens_per_s_source == "measured"]
    if not interesting:
        return []
    analytic = analytic_numbers(interesting, description)
    out = []
    for r in interesting:
        peak: dict[str, int] = {}
        tps: dict[str, float] = {}
        if r.number in analytic:
            peak["estimated"], tps["predicted"] = analytic[r.number]
        if r.peak_bytes is not None and r.source in ("simulated", "measured"):
            peak[r.source] = int(r.peak_bytes)
        if r.tokens_per_s and r.tokens_per_s_source == "measured":
            tps["measured"] = float(r.tokens_per_s)
        c = Comparison(r.number, r.plan_short, peak, tps)
        if c.kinds > 1:
            out.append(c)
    return out


def environment(d: StudyDescription) -> dict[str, Any]:
    gpu, env = d.gpu, d.environment
    why = "no GPU was detected when the study ran" if not gpu.detected else "not recorded by this study"
    return {
        "gpu": gpu.name, "gpu_key": gpu.key, "gpu_memory_bytes": gpu.memory_bytes,
        "gpu_detected": gpu.detected, "gpu_assumed": d.gpu_assumed,
        "driver": env.get("driver") or f"— ({why})",
        "cuda": env.get("cuda") or f"— ({why})",
        "versions": dict(d.versions),
        "rendered_with": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                          "executable": sys.implementation.name},
    }


def reproduce_command(d: StudyDescription, study: str) -> str:
    """The `advisor tune` command that makes the same study (a space file of the user's by the path it was read
    from: the command runs where the study did)."""
    from advisor.search.setting import reproduce_flags

    space = d.space
    # every stored setting's flag, from its declaration (advisor.search.settings)
    flags = reproduce_flags(d, {"space": space.name if is_built_in_space(space) else space.source})
    parts = ["advisor", "tune", *flags, "--study", study, *space.overrides]
    command = " ".join(shlex.quote(p) for p in parts)
    if d.gpu_assumed:  # no --gpu: naming the card would be another study (gpu_assumed is part of what it asks)
        return (f"# the study assumed the {d.gpu.name} ({d.gpu.key}) from the {d.budget.text} budget; the command "
                "assumes it again\n" + command)
    return command
