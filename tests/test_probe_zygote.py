"""CPU probes forked from the zygote (advisor.runtime.probe._zygote): one import of torch, transformers and peft for
every CPU probe of a process, each probe still a process of its own that the runner watches and kills."""

from __future__ import annotations

import os

import pytest

from advisor.core.plan import Plan
from advisor.runtime.probe import _zygote, run_probe
from advisor.runtime.simulate.tiny import tiny_spec

PLAN = Plan(method="lora", seq_len=32, lora_dropout=0.0)


@pytest.fixture(scope="module")
def spec():
    return tiny_spec("qwen2", num_layers=2, vocab_size=512)


def _parent(pid: int) -> int:
    import psutil

    return psutil.Process(pid).ppid()


def test_a_cuda_probe_and_a_probe_asked_fresh_get_no_zygote(monkeypatch):
    from advisor.core.catalog import CUDA_DOUBLE_ENV

    monkeypatch.delenv(CUDA_DOUBLE_ENV, raising=False)
    assert _zygote.zygote_for("cuda", dict(os.environ)) is None  # CUDA is started by the child it runs in
    assert _zygote._forkable("cuda", {**os.environ, CUDA_DOUBLE_ENV: "rtx-4090"})  # the double's step: on the CPU
    assert _zygote.zygote_for("cpu", {**os.environ, _zygote.OFF_ENV: "0"}) is None


def test_what_a_probe_may_set_on_its_own_and_what_takes_another_zygote():
    env = {"PATH": "/bin", "HF_HOME": "/a", "ADVISOR_SPEED_CALIBRATION": "/a.json", "PYTHONPATH": "/x"}
    same = {**env, "HF_HOME": "/b", "ADVISOR_SPEED_CALIBRATION": "/b.json", "PYTHONPATH": "/y",
            "COVERAGE_PROCESS_CONFIG": ":data:{}"}
    assert _zygote._comparable(env) == _zygote._comparable(same) == {"PATH": "/bin"}
    assert _zygote._comparable({**env, "TRANSFORMERS_VERBOSITY": "error"}) != _zygote._comparable(env)


@pytest.mark.slow
def test_cpu_probes_fork_from_one_zygote_and_a_killed_zygote_is_replaced(spec, monkeypatch):
    children: list[int] = []
    first = run_probe(spec, PLAN, device="cpu", steps=1, warmup=0, timeout=240, on_start=children.append)
    zygote = _zygote._zygote
    assert first.status == "ok", first.message
    assert zygote is not None and zygote.alive()
    second = run_probe(spec, PLAN, device="cpu", steps=1, warmup=0, timeout=240,
                       on_start=lambda pid: children.append((pid, _parent(pid))))
    assert second.status == "ok" and _zygote._zygote is zygote
    assert children[1][1] == zygote._proc.pid  # forked from the zygote, not started by this process
    assert second.losses == first.losses  # the same seed, the same step: the fork changes nothing it computes
    # a variable a preloaded library reads at import: another zygote, started with it
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    third = run_probe(spec, PLAN, device="cpu", steps=1, warmup=0, timeout=240)
    assert third.status == "ok" and _zygote._zygote is not zygote and not zygote.alive()
    # the zygote killed: the next probe starts another
    _zygote._zygote._proc.kill()
    _zygote._zygote._proc.wait()
    fourth = run_probe(spec, PLAN, device="cpu", steps=1, warmup=0, timeout=240)
    assert fourth.status == "ok", fourth.message
    assert _zygote._zygote.alive()


def test_what_a_library_prints_on_the_zygotes_stdout_is_not_a_message():
    assert _zygote._message('{"pid": 3}\n') == {"pid": 3}
    assert _zygote._message("Failed to load /site-packages/torchao/_C_mxfp8.so\n") is None
    assert _zygote._message("[1, 2]\n") is None
