"""Where studies live: Optuna storages, the lock that keeps the trial count exact across workers,
heartbeats for trials, and storage URLs with their passwords hidden.

- SQLite (the default, one process): a file lock; a trial cut off by kill -9 is found RUNNING on
  the next start and run again (advisor.search.tuner).
- PostgreSQL (many workers on many hosts): ``pg_advisory_lock`` around "count, then create a
  trial", and Optuna's heartbeat: a worker that dies mid-trial stops beating, its trial is failed
  after the grace period and retried by another worker (RetryFailedTrialCallback).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import threading
import warnings
from pathlib import Path
from typing import Iterator

HEARTBEAT_SECONDS = 10
GRACE_FACTOR = 3  # a trial is stale after this many missed heartbeats


def redact(url: str) -> str:
    """The URL with its password replaced by ***, for output, logs and reports."""
    return re.sub(r"(://[^:/@\s]+):[^@\s]*@", r"\1:***@", str(url))


def is_sqlite(url: str) -> bool:
    return str(url).startswith("sqlite")


def make_storage(url: str, heartbeat_seconds: int = HEARTBEAT_SECONDS):
    """An Optuna storage; RDBs other than SQLite get heartbeats and retries of stale trials."""
    import optuna

    from advisor.core.errors import AdvisorInputError, writable_folder

    db = sqlite_path(url) if is_sqlite(url) else None
    if db is not None and not db.exists():  # a new study's folder is made when it is opened; one it cannot write
        writable_folder(db.parent)  # is the folder's error (an OSError: the CLI names the flag that places it)
    try:
        if is_sqlite(url):
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
        with warnings.catch_warnings(), _schema_lock(url):
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3)
            return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat_seconds,
                                              grace_period=heartbeat_seconds * GRACE_FACTOR,
                                              heartbeat_stale_trial_callback=retry,
                                              engine_kwargs={"pool_pre_ping": True})
    except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors carry the URL: redact it
        reason = redact(str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise AdvisorInputError("--storage", f"cannot open the storage ({reason})", redact(url)) from None


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None: in memory, or not SQLite)."""
    if not is_sqlite(url) or ":memory:" in url:
        return None
    path = str(url).split("///", 1)[-1]
    return Path(path) if path else None


def stored_attr(url: str, study_name: str, attr: str):
    """The user attribute ``attr`` of the study ``study_name`` in the storage at ``url``, or None where there
    is no such study; a SQLite file or folder that does not exist is not made."""
    db = sqlite_path(url)
    if is_sqlite(url) and (db is None or not db.is_file()):
        return None
    storage = make_storage(url)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    return storage.get_study_user_attrs(study_id).get(attr)


def _lock_key(study_name: str) -> int:
    return int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)


# one key per database for Optuna's schema (advisory locks are scoped to the database they are taken in);
# a study name is hashed the same way, so this one is not a name a study could have
SCHEMA_LOCK_NAME = "\0vram-advisor: optuna schema"


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Serializes the creation of Optuna's tables between processes that open one fresh database at once.

    ``RDBStorage`` creates its schema when it is built (CREATE TYPE / CREATE TABLE, then the version
    rows); two processes doing it at once on an empty PostgreSQL database both see no table, and the
    loser fails with a unique violation on ``pg_type_typname_nsp_index``. The lock is held on a
    connection of its own, since the storage's engine does not exist yet.
    """
    if not url.startswith("postgresql"):
        yield  # SQLite is one process; other servers: not locked (PostgreSQL is the multi-worker storage)
        return
    import sqlalchemy
    from sqlalchemy import text

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as con:
            key = _lock_key(SCHEMA_LOCK_NAME)
            con.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            con.commit()  # a session lock outlives the transaction; do not sit idle in one while others wait
            try:
                yield
            finally:
                con.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                con.commit()
    finally:
        engine.dispose()


@contextlib.contextmanager
def study_lock(storage, url: str, study_name: str) -> Iterator[None]:
    """Mutual exclusion between the workers of one study (PostgreSQL advisory lock, or a file lock)."""
    if is_sqlite(url):
        path = Path(url.split("///", 1)[-1] + ".lock")
        with open(path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    if url.startswith("postgresql"):
        from sqlalchemy import text

        key = _lock_key(study_name)
        with storage.engine.connect() as con:
            con.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                con.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                con.commit()
        return
    yield  # other databases: no lock; the planned count may be overshot by (workers - 1)


class Heartbeat:
    """Records a trial's heartbeat every ``interval`` seconds while a trial runs (ask/tell has none)."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self.interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.interval:
            self.storage.record_heartbeat(self.trial_id)
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # noqa: BLE001 - a missed beat only risks a retry
                pass

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return False
