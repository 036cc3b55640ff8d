"""Reading a study for a report: the only module here that touches Optuna storage or the disk.

``open_study`` turns what the user typed (a study directory, a study.db, or --storage/--study)
into a ``StudySnapshot`` of plain data; everything after that is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.search.description import ATTR, StudyDescription
from advisor.search.select import TrialRecord
from advisor.search.storage import redact
from advisor.search.locate import DB_NAME, resolve_storage, study_name  # noqa: F401 (re-exported)

EXPORT_FILES = ("advisor.yaml", "deepspeed.json", "train.py", "axolotl.yaml", "llamafactory.yaml")
EXPORT_TEXT_LIMIT = 20_000  # characters of an exported file inlined in the report


@dataclass(frozen=True)
class TrialTiming:
    """When a trial ran (None while it has not started or finished)."""

    start: datetime | None
    end: datetime | None


@dataclass(frozen=True)
class StudySnapshot:
    """One study as read from its storage: its description, trials and where it lives."""

    name: str
    """The Optuna study name."""
    storage: str
    """The storage URL, password redacted."""
    description: StudyDescription
    """What the study searches, typed from its "advisor" user attribute (model, gpu, budget, space, backend,
    selection settings, versions...; older studies included)."""
    records: list[TrialRecord]
    """Every trial of the study, in trial-number order."""
    timings: dict[int, TrialTiming]
    """Start and end of each trial, by trial number."""
    directory: Path | None = None
    """The folder holding study.db (None for a non-SQLite storage)."""
    exports: list[dict[str, Any]] = field(default_factory=list)
    """Export folders found beside the study: {"dir", "files": [{"name", "path", "text"}]}."""
    quality: dict[str, Any] = field(default_factory=dict)
    """The study's quality attributes (advisor.search.measured: ATTR, the finalists' measurement; WHY_ATTR, why
    nothing was measured), for the explanation's quality lines."""


def open_study(storage: str, name: str | None, folder: Path | None) -> StudySnapshot:
    """Load a study written by `advisor tune` (read only)."""
    import optuna

    from advisor.search.measured import ATTR as MEASURED, WHY_ATTR, apply_measured
    from advisor.search.select import record_from_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name(storage, name, folder)
    study = optuna.load_study(study_name=name, storage=storage)
    settings = study.user_attrs.get(ATTR)
    if not isinstance(settings, dict):
        raise AdvisorInputError("--study", "this study was not made by `advisor tune` (no advisor settings recorded)",
                                name)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    attrs = study.user_attrs
    records = apply_measured([record_from_trial(t) for t in trials], attrs)  # the finalists' measured quality
    timings = {t.number: TrialTiming(t.datetime_start, t.datetime_complete) for t in trials}
    return StudySnapshot(name=name, storage=redact(storage), description=StudyDescription.from_dict(settings),
                         records=records, timings=timings,
                         directory=folder, exports=find_exports(folder) if folder else [],
                         quality={k: attrs[k] for k in (MEASURED, WHY_ATTR) if k in attrs})


def find_exports(folder: Path) -> list[dict[str, Any]]:
    """Folders at or under the study folder (one level) holding files `advisor tune --export` writes."""
    found = []
    candidates = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
    for d in candidates:
        files = []
        for fname in EXPORT_FILES:
            p = d / fname
            if p.is_file():
                try:
                    text = p.read_text(encoding="utf-8")[:EXPORT_TEXT_LIMIT]
                except (OSError, UnicodeDecodeError):
                    text = None
                files.append({"name": fname, "path": str(p), "text": text})
        if files:
            found.append({"dir": str(d), "files": files})
    return found
