"""Many workers on one study in a real PostgreSQL (started by .ci/run, URL in ADVISOR_TEST_PG_URL):
one worker is killed with SIGKILL mid-trial; its trial is failed by heartbeat and retried, and the
study ends with every planned trial finished exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PG_URL = os.environ.get("ADVISOR_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="no PostgreSQL: set ADVISOR_TEST_PG_URL (.ci/run starts one)")
TRIALS = 10


def _advisor(*argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "advisor", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


def _study(name):
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=PG_URL)
    except KeyError:
        return None


def test_three_workers_one_killed_mid_trial():
    name = f"workers-{os.getpid()}-{int(time.time())}"
    common = ["--storage", PG_URL, "--study", name]
    watcher = _advisor("tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "simulate",
                       "--trials", str(TRIALS), "--no-work", "--json", "--heartbeat", "1", *common)
    deadline = time.time() + 120
    while _study(name) is None or not _study(name).user_attrs.get("ladder_enqueued"):
        assert time.time() < deadline and watcher.poll() is None, watcher.stderr.read() if watcher.poll() else "slow"
        time.sleep(0.2)
    workers = [_advisor("worker", "--heartbeat", "1", *common) for _ in range(3)]
    victim = workers[0]
    killed_trial = None
    while killed_trial is None and time.time() < deadline + 300:
        for t in _study(name).get_trials(deepcopy=False):
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
    study = _study(name)
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
