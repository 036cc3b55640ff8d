"""Reading a study for a report: the only module here that touches Optuna storage or the disk.

``open_study`` turns what the user typed (a study directory, a study.db, or --storage/--study)
into a ``StudySnapshot`` of plain data; everything after that is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorInputError
from advisor.select import TrialRecord

DB_NAME = "study.db"
EXPORT_FILES = ("advisor.yaml", "deepspeed.json", "train.py", "axolotl.yaml", "llamafactory.yaml")
EXPORT_TEXT_LIMIT = 20_000  # characters of an exported file inlined in the report


@dataclass(frozen=True)
class TrialTiming:
    """When a trial ran (None while it has not started or finished)."""

    start: datetime | None
    end: datetime | None


@dataclass(frozen=True)
class StudySnapshot:
    """One study as read from its storage: settings, trials and where it lives."""

    name: str
    """The Optuna study name."""
    storage: str
    """The storage URL, password redacted."""
    settings: dict[str, Any]
    """The study's "advisor" user attribute (model, gpu, budget, space, backend, versions...)."""
    records: list[TrialRecord]
    """Every trial of the study, in trial-number order."""
    timings: dict[int, TrialTiming]
    """Start and end of each trial, by trial number."""
    directory: Path | None = None
    """The folder holding study.db (None for a non-SQLite storage)."""
    exports: list[dict[str, Any]] = field(default_factory=list)
    """Export folders found beside the study: {"dir", "files": [{"name", "path", "text"}]}."""


def resolve_storage(study: str | None, storage: str | None, name: str | None,
                    reports_dir: str | Path = "reports") -> tuple[str, Path | None]:
    """(storage URL, study folder) from STUDY or --storage; every bad input names its flag."""
    if storage:
        if study:
            raise AdvisorInputError("STUDY", "give either a STUDY directory or --storage, not both", study)
        if "://" not in storage:
            raise AdvisorInputError("--storage", "expected an Optuna storage URL such as "
                                    "sqlite:///reports/NAME/study.db or postgresql://user@host/db", storage)
        folder = None
        if storage.startswith("sqlite:///"):
            db = Path(storage[len("sqlite:///"):])
            if not db.is_file():
                raise AdvisorInputError("--storage", f"no SQLite file at {db}", storage)
            folder = db.parent
        return storage, folder
    if not study:
        raise AdvisorInputError("STUDY", "name a study directory (reports/<study>/ holding study.db), "
                                "or give --storage URL --study NAME", study)
    path = Path(study).expanduser()
    if not path.exists() and not any(sep in study for sep in ("/", "\\")):
        path = Path(reports_dir) / study  # a bare study name: reports/<name>/
    if path.is_file():
        db = path
    elif path.is_dir():
        db = path / DB_NAME
        if not db.is_file():
            raise AdvisorInputError("STUDY", f"directory {path} holds no {DB_NAME} (run `advisor tune` first)", study)
    else:
        raise AdvisorInputError("STUDY", "no such study directory (expected reports/<study>/ holding study.db)", study)
    return f"sqlite:///{db.resolve()}", db.resolve().parent


def open_study(storage: str, name: str | None, folder: Path | None) -> StudySnapshot:
    """Load a study written by `advisor tune` (read only)."""
    import optuna

    from advisor.study import record_from_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    flag = "--storage" if folder is None else "STUDY"
    if storage.startswith("sqlite:///"):
        _check_sqlite(Path(storage[len("sqlite:///"):]), flag, storage)
    try:
        names = optuna.get_all_study_names(storage)
    except Exception as e:  # noqa: BLE001 - not a database, unreachable server, foreign schema...
        raise AdvisorInputError(flag, f"cannot read an Optuna study from it ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200]})", _redact(storage)) from e
    if name is None:
        if len(names) != 1:
            listed = ", ".join(names) if names else "none"
            raise AdvisorInputError("--study", f"the storage holds {len(names)} studies ({listed}); name one", name)
        name = names[0]
    elif name not in names:
        raise AdvisorInputError("--study", f"no such study in the storage (it holds: {', '.join(names) or 'none'})",
                                name)
    study = optuna.load_study(study_name=name, storage=storage)
    settings = study.user_attrs.get("advisor")
    if not isinstance(settings, dict):
        raise AdvisorInputError(flag if name is None else "--study",
                                "this study was not made by `advisor tune` (no advisor settings recorded)", name)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    records = [record_from_trial(t) for t in trials]
    timings = {t.number: TrialTiming(t.datetime_start, t.datetime_complete) for t in trials}
    return StudySnapshot(name=name, storage=_redact(storage), settings=settings, records=records, timings=timings,
                         directory=folder, exports=find_exports(folder) if folder else [])


def _check_sqlite(db: Path, flag: str, storage: str) -> None:
    """Refuse a SQLite file that is not an Optuna database before Optuna would add its tables to it."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            ok = con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='studies'").fetchone()
        finally:
            con.close()
    except sqlite3.Error as e:
        raise AdvisorInputError(flag, f"{db} is not a readable SQLite database ({e})", storage) from e
    if not ok:
        raise AdvisorInputError(flag, f"{db} is not an Optuna study database (no studies table)", storage)


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


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
