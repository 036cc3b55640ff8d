"""Every failure injected for real ends as a result with the right status, and no process is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from advisor.core.plan import Plan
from advisor.runtime.probe import run_probe
from advisor.runtime.simulate.tiny import tiny_spec

SEQ = 32


@pytest.fixture(scope="module")
def spec():
    return tiny_spec("qwen2", num_layers=2, vocab_size=512)


class Watch:
    """Records the child's pid and, while it runs, every descendant it has (grandchildren included)."""

    def __init__(self, kill_after: float | None = None):
        self.pids: set[int] = set()
        self.child: int | None = None
        self.kill_after = kill_after
        self._stop = threading.Event()

    def __call__(self, pid: int) -> None:
        self.child = pid
        self.pids.add(pid)
        threading.Thread(target=self._scan, daemon=True).start()
        if self.kill_after is not None:
            threading.Timer(self.kill_after, lambda: os.kill(pid, signal.SIGKILL)).start()

    def _scan(self) -> None:
        while not self._stop.is_set():
            try:
                self.pids.update(p.pid for p in psutil.Process(self.child).children(recursive=True))
            except psutil.Error:
                return
            time.sleep(0.1)

    def alive(self) -> list[int]:
        self._stop.set()
        out = []
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out


def probe(spec, watch, **kw):
    plan = kw.pop("plan", Plan(method="lora", seq_len=SEQ))
    return run_probe(spec, plan, device="cpu", steps=1, warmup=1, on_start=watch, **kw)


@pytest.mark.slow
def test_memory_limit_gives_a_real_oom_and_the_next_probe_runs(spec):
    w = Watch()
    # logits alone: 16 x 2048 x 512 x 4 B = 64 MiB, over a 48 MiB limit
    r = probe(spec, w, plan=Plan(method="full", seq_len=2048, micro_batch=16), memory_limit_bytes=48 * 2**20,
              timeout=240)
    assert r.status == "oom", r
    assert "can't allocate memory" in r.message and "enforce fail" not in r.message
    assert r.exit == "exit 1" and not w.alive()
    w2 = Watch()
    after = probe(spec, w2, memory_limit_bytes=512 * 2**20, timeout=240)
    assert after.status == "ok", after.message
    assert 0 < after.peak_allocated_bytes < 512 * 2**20 and not w2.alive()


def test_sigkill_of_the_child_is_a_crash(spec):
    w = Watch(kill_after=2.0)
    r = probe(spec, w, fault="hang", timeout=240)
    assert r.status == "crash" and "SIGKILL" in r.message and r.exit == "signal SIGKILL"
    assert not w.alive()


@pytest.mark.slow
def test_segfault_is_a_crash_with_the_signal(spec):
    w = Watch()
    r = probe(spec, w, fault="segfault", timeout=240)
    assert r.status == "crash" and r.exit == "signal SIGSEGV", r
    assert "Segmentation fault" in r.message
    assert r.steps_done == 1 and len(r.losses) == 1  # what was measured before the crash is kept
    assert not w.alive()


@pytest.mark.slow
def test_hang_past_the_timeout_is_killed_with_its_grandchild(spec):
    w = Watch()
    t0 = time.monotonic()
    r = probe(spec, w, fault="grandchild_hang", timeout=25)
    assert r.status == "timeout" and "no result after 25 s" in r.message, r
    assert time.monotonic() - t0 < 25 + 15
    assert r.exit == "killed by the parent (timeout)"
    if r.steps_done:  # the hang came after the first step: the grandchild existed and was seen
        assert len(w.pids) >= 2
    assert not w.alive()


@pytest.mark.slow
def test_python_error_and_exit_without_result(spec):
    w = Watch()
    r = probe(spec, w, fault="raise", timeout=240)
    assert r.status == "error" and "RuntimeError: injected fault" in r.message and r.exit == "exit 1"
    w2 = Watch()
    r2 = probe(spec, w2, fault="exit", timeout=240)
    assert r2.status == "crash" and r2.exit == "exit 3" and "without a result" in r2.message
    assert not w.alive() and not w2.alive()


def test_onednn_failing_under_the_memory_limit_is_an_oom():
    from advisor.runtime.probe._classify import status_of_exception

    text = "could not create a primitive"  # oneDNN's scratchpad refused by RLIMIT_DATA (a 25 MiB step at 48 MiB)
    assert status_of_exception("RuntimeError", text, limited=True) == "oom"
    assert status_of_exception("RuntimeError", text) == "error"  # without a limit it says nothing about memory
