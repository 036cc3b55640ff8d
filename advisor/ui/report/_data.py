"""Everything a report shows, computed once from a ``StudySnapshot``: pure, no I/O, no rendering.

The HTML page, the Markdown file, the CSV and the plots all render the same ``ReportData``.
"""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.ui.report._load import StudySnapshot
from advisor.search.description import StudyDescription
from advisor.search.select import Selection, TrialRecord, select
from advisor.core.units import format_bytes

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
    settings: dict[str, Any]
    """The study's recorded settings (model, gpu, gpu_assumed, budget, space, backend, versions...)."""
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
    description: StudyDescription | None = None
    """``settings``, typed (advisor.search.description)."""

    # -- conveniences for the renderers ----------------------------------------

    @property
    def budget_bytes(self) -> int:
        return int(self.settings["budget"]["bytes"])

    @property
    def unit(self) -> str:
        return self.settings["budget"].get("unit") or "GiB"

    @property
    def headroom(self) -> float:
        return float(self.settings.get("headroom", 0.05))

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
    s = snap.settings
    d = StudyDescription.from_dict(s)
    selection = select(snap.records, d.budget.bytes, d.headroom, d.tolerance, d.budget.unit)
    notes = []
    if s.get("gpu_assumed"):
        notes.append(f"No GPU was detected or named when the study ran: throughput is predicted for a "
                     f"{s['gpu']['name']}, the catalog GPU the budget matches (assumed).")
    sources = {r.source for r in snap.records if r.source}
    if sources <= {"estimated"}:
        notes.append("Every peak in this study is estimated (closed-form ledger); no trial was simulated or "
                     "measured, so there is nothing to compare predictions with.")
    if not any(r.tokens_per_s_source == "measured" for r in snap.records):
        notes.append("Throughput is predicted (step-time model of the GPU), not measured, for every trial.")
    if not any(r.accuracy_source == "measured" for r in snap.records):
        notes.append("Accuracy loss is a documented prior (advisor/data/accuracy_priors.yaml) for every trial.")
    return ReportData(
        study=snap.name, storage=snap.storage, settings=s, records=list(snap.records), selection=selection,
        timeline=timeline(snap), comparisons=comparisons(snap.records, s), exports=list(snap.exports),
        environment=environment(s), reproduce=reproduce_command(s, snap.name), notes=notes,
        description=d)


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


def _specs(settings: dict[str, Any]):
    """ModelSpec and GpuSpec rebuilt from what the study recorded (advisor.search.description: no catalog
    or network needed)."""
    from advisor.search.description import gpu_from_dict, model_from_dict

    return model_from_dict(settings["model"]), gpu_from_dict(settings["gpu"])


def analytic_numbers(records: list[TrialRecord], settings: dict[str, Any]) -> dict[int, tuple[int, float]]:
    """{trial number: (analytic peak bytes, predicted tokens/s)} for every trial with a valid plan."""
    from advisor.runtime.backends import get_backend
    from advisor.core.errors import AdvisorInputError
    from advisor.core.plan import Plan
    from advisor.speed.throughput import predict_throughput

    model, gpu = _specs(settings)
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


def comparisons(records: list[TrialRecord], settings: dict[str, Any]) -> list[Comparison]:
    """Trials whose recorded numbers come from a simulation or a probe, beside the analytic ones."""
    interesting = [r for r in records if r.source in ("simulated", "measured")
                   or r.tokens_per_s_source == "measured"]
    if not interesting:
        return []
    analytic = analytic_numbers(interesting, settings)
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


def environment(settings: dict[str, Any]) -> dict[str, Any]:
    gpu = settings.get("gpu") or {}
    env = settings.get("environment") or {}
    why = ("no GPU was detected when the study ran" if not gpu.get("detected")
           else "not recorded by this study")
    return {
        "gpu": gpu.get("name", ""), "gpu_key": gpu.get("key", ""), "gpu_memory_bytes": gpu.get("memory_bytes"),
        "gpu_detected": bool(gpu.get("detected")), "gpu_assumed": bool(settings.get("gpu_assumed")),
        "driver": env.get("driver") or gpu.get("driver") or f"— ({why})",
        "cuda": env.get("cuda") or gpu.get("cuda") or f"— ({why})",
        "versions": dict(settings.get("versions") or {}),
        "rendered_with": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                          "executable": sys.implementation.name},
    }


def reproduce_command(settings: dict[str, Any], study: str) -> str:
    space = settings.get("space") or {}
    gpu = settings.get("gpu") or {}
    parts = ["advisor", "tune", "--model", settings["model"].get("hf_id") or settings["model"]["name"],
             "--gpu-budget", settings["budget"]["text"]]
    if gpu.get("key") and gpu.get("key") != "detected":
        parts += ["--gpu", gpu["key"]]
    name = space.get("name", "default")
    source = space.get("source") or ""
    built_in = not source or (Path(source).name == f"{name}.yaml"
                              and Path(source).parent.name in ("spaces", "search_spaces"))  # search_spaces/: older studies
    parts += ["--space", name if built_in else source]
    parts += ["--backend", settings.get("backend", "auto"), "--trials", str(settings.get("trials", "")),
              "--seed", str(settings.get("seed", 0)), "--headroom", str(settings.get("headroom", 0.05)),
              "--accuracy-tolerance", str(settings.get("tolerance", 0.05)), "--study", study]
    parts += list(space.get("overrides") or [])
    return " ".join(shlex.quote(p) for p in parts)
