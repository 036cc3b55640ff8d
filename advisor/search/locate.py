"""Finding a study from what a person typed: a study folder (reports/<study>/), its study.db, a
bare study name under --reports-dir, or --storage URL [--study NAME]. Shared by `advisor report`,
`advisor export` and `advisor tui`; every bad input names its flag.
"""

from __future__ import annotations

from pathlib import Path

from advisor.core.errors import AdvisorInputError
from advisor.search.storage import redact

DB_NAME = "study.db"


def resolve_storage(study: str | None, storage: str | None, name: str | None,
                    reports_dir: str | Path = "reports") -> tuple[str, Path | None]:
    """(storage URL, study folder) from STUDY or --storage."""
    if storage:
        if study:
            raise AdvisorInputError("STUDY", "give either a STUDY directory or --storage, not both", study)
        if "://" not in storage:
            raise AdvisorInputError("--storage", "expected an Optuna storage URL such as "
                                    "sqlite:///reports/NAME/study.db or postgresql://user@host/db", redact(storage))
        folder = None
        if storage.startswith("sqlite:///"):
            db = Path(storage[len("sqlite:///"):])
            if not db.is_file():
                raise AdvisorInputError("--storage", f"no SQLite file at {db}", storage)
            folder = db.parent
        return storage, folder
    if not study:
        found = sorted(db.parent.name for db in Path(reports_dir).glob(f"*/{DB_NAME}"))
        there = (f"; {reports_dir} holds {', '.join(found[:3])}{' ...' if len(found) > 3 else ''}" if found
                 else f"; {reports_dir} holds none")
        raise AdvisorInputError("STUDY", "name a study directory (reports/<study>/ holding study.db), "
                                "or give --storage URL --study NAME" + there, study, show_value=False)
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


def check_sqlite(db: Path, flag: str, storage: str) -> None:
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


def study_name(storage: str, name: str | None, folder: Path | None) -> str:
    """The study to open: ``name`` if given (and there), else the only one, else the folder's namesake."""
    import optuna

    flag = "--storage" if folder is None else "STUDY"
    if storage.startswith("sqlite:///"):
        check_sqlite(Path(storage[len("sqlite:///"):]), flag, storage)
    try:
        names = optuna.get_all_study_names(storage)
    except Exception as e:  # noqa: BLE001 - not a database, unreachable server, foreign schema...
        raise AdvisorInputError(flag, f"cannot read an Optuna study from it ({type(e).__name__}: "
                                f"{redact(str(e).splitlines()[0][:200]) if str(e) else ''})", redact(storage)) from e
    if name is not None:
        if name not in names:
            raise AdvisorInputError("--study", f"no such study in the storage (it holds: {', '.join(names) or 'none'})",
                                    name)
        return name
    if len(names) == 1:
        return names[0]
    if folder is not None and folder.name in names:
        return folder.name
    raise AdvisorInputError("--study", f"the storage holds {len(names)} studies "
                            f"({', '.join(names) or 'none'}); name one", name)
