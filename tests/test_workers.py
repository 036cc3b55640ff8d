"""Many workers on one study in a real PostgreSQL (started by .ci/run, URL in ADVISOR_TEST_PG_URL):
one worker is killed with SIGKILL mid-trial; its trial is failed by heartbeat and retried, and the
study ends with every planned trial finished exactly once. Every test starts from an empty schema, as
on a freshly created database: the processes that open it first create Optuna's tables at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

PG_URL = os.environ.get("ADVISOR_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="no PostgreSQL: set ADVISOR_TEST_PG_URL (.ci/run starts one)")
TRIALS = 10


@pytest.fixture
def fresh_pg_url():
    """The test database's URL with a new, empty schema as its only search path: Optuna finds none of its
    tables there and creates them, as on a freshly created database (CREATE SCHEMA needs no CREATEDB).
    The schema is dropped afterwards."""
    import sqlalchemy

    schema = f"advisor_test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)
    with admin.connect() as con:
        con.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    url = sqlalchemy.engine.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with admin.connect() as con:
        con.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


def _advisor(*argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "advisor", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


OPEN_STORAGE = """
import sys
from advisor.search.storage import make_storage
print("ready", flush=True)
sys.stdin.readline()
make_storage(sys.argv[1])
"""


def test_processes_opening_a_fresh_storage_at_once_all_succeed(fresh_pg_url):
    # a study and its workers started together on a new database: each process creates Optuna's schema
    # (CREATE TYPE studydirection, CREATE TABLE ...) when it opens the storage; without a lock the ones that
    # lost failed with a unique violation on pg_type_typname_nsp_index (5 runs of 5 here, before the fix)
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORAGE, fresh_pg_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:  # every process has imported and waits: released together, they open the storage at once
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    errors = [err.strip().splitlines()[-1] for p in procs for _, err in [p.communicate(timeout=120)] if p.returncode]
    assert not errors, errors
    import optuna

    assert optuna.get_all_study_names(fresh_pg_url) == []  # the schema is there and usable


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_workers_one_killed_mid_trial(fresh_pg_url, monkeypatch):
    import optuna

    from advisor.runtime.simulate.disk_cache import ENV
    from advisor.search.storage import make_storage

    # each trial traces its step (the run's shared traces would answer a plan another test traced at once, and the
    # victim could finish every trial it takes between two looks)
    monkeypatch.delenv(ENV, raising=False)

    def load():
        try:
            return optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return None

    name = f"workers-{os.getpid()}-{int(time.time())}"
    common = ["--storage", fresh_pg_url, "--study", name]
    watcher = _advisor("tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "simulate",
                       "--trials", str(TRIALS), "--no-work", "--json", "--heartbeat", "1", *common)
    storage = make_storage(fresh_pg_url)  # opened alongside the watcher's, as a dashboard or a worker would
    deadline = time.time() + 120
    while load() is None or "ladder_rungs_enqueued" not in load().user_attrs:  # the first trials are enqueued
        assert time.time() < deadline and watcher.poll() is None, watcher.stderr.read() if watcher.poll() else "slow"
        time.sleep(0.2)
    workers = [_advisor("worker", "--heartbeat", "1", *common) for _ in range(3)]
    victim = workers[0]
    killed_trial = None
    while killed_trial is None and time.time() < deadline + 300:
        for t in load().get_trials(deepcopy=False):
            # mid-trial: the plan is chosen (plan_key is set after sampling) and being measured
            if t.state.name == "RUNNING" and t.user_attrs.get("worker", "").endswith(f":{victim.pid}") \
                    and "plan_key" in t.user_attrs:
                killed_trial = t.number
                os.killpg(victim.pid, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert killed_trial is not None, "the victim never held a running trial"
    victim.wait()
    outs = []
    for w in workers[1:] + [watcher]:
        out, err = w.communicate(timeout=900)
        assert w.returncode == 0, err
        outs.append(out + err)
    study = load()
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    # every planned evaluation finished exactly once (a repeat proposal is answered from the first
    # evaluation of its plan and does not count)
    evaluated = [t for t in finished if "duplicate_of" not in t.user_attrs]
    assert len(evaluated) == TRIALS
    assert len({t.user_attrs["plan_key"] for t in evaluated}) == TRIALS
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    dead = next(t for t in trials if t.number == killed_trial)
    assert dead.state.name == "FAIL"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed_trial]
    assert len(retries) == 1 and retries[0].params == dead.params and retries[0] in finished
    # the password never shows
    assert all("s3cret" not in o for o in outs)
    result = json.loads(outs[-1][: outs[-1].rindex("}") + 1])
    assert result["n_trials"] == TRIALS and "***" in result["storage"]
