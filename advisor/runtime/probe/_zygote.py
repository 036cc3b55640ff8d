"""CPU probes forked from one process that has already imported torch, transformers and peft.

A fresh interpreter spends about 6 s importing them (``python -X importtime``: peft alone 5.5 s, through
transformers' quantizers and bitsandbytes) before a CPU probe of a small model builds anything; for a study of
CPU probes that is most of each trial. The zygote is a child of the process that runs probes
(``python -m advisor.runtime.probe._zygote``) that imports them once and then forks one probe per request, the
way Android's zygote or multiprocessing's forkserver does. A forked probe is still a process of its own, in its own
session (``os.setsid``, so the parent can kill it and its grandchildren as one group), with its own log, working
directory and environment; it runs the same ``advisor.runtime.probe._worker.main``.

Only CPU probes are forked (and cuda probes under the CUDA test double, whose step runs on the CPU): a CUDA child must
initialize CUDA itself (CUDA does not survive a fork, and importing bitsandbytes asks the driver for devices), so those
stay fresh interpreters (advisor.runtime.probe._runner). So do
probes whose environment differs from the zygote's in a variable the preloaded libraries read when imported. A probe
asked to be measured by coverage.py (its subprocess variables) starts and saves that measurement itself.

The protocol is one JSON line each way: the parent writes ``{"argv", "env", "cwd", "log"}``; the zygote answers
``{"pid"}`` at once and ``{"exit": pid, "rc"}`` when that probe ends (``rc`` as subprocess gives it: negative for a
signal). The zygote ends when its stdin closes: when the parent exits or closes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

# coverage.py's request to measure a started interpreter (coverage.process_startup): a forked probe honours it too
COVERAGE = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
# variables a probe may set differently from the zygote, none read by a preloaded library when imported: the child's
# own paths and flags; this package's settings (read when used, never at import); the CUDA allocator's
# and inductor's cache (read when CUDA starts or inductor compiles); the hub's cache (huggingface_hub reads HF_HOME
# at import, but a probe loads local directories only and downloads nothing); the tests' bookkeeping
PER_PROBE = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME",
             *COVERAGE, "PYTEST_CURRENT_TEST", "OLDPWD", "PWD")
PER_PROBE_PREFIX = "ADVISOR_"
OFF_ENV = "ADVISOR_PROBE_ZYGOTE"  # "0": every probe a fresh interpreter
UNKNOWN_EXIT = 255  # a probe that ended after its zygote: its exit status went with the zygote


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _preload() -> None:
    """What every CPU probe imports before it builds the model (the worker's own ``_preimport``, no model class)."""
    from advisor.runtime.probe._worker import _preimport

    _preimport("")


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the probe process the request describes; never returns."""
    code = 1
    measured = None
    try:
        os.setsid()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's stdout
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import faulthandler

        faulthandler.enable()
        if any(k in os.environ for k in COVERAGE):
            from coverage import process_startup

            measured = process_startup(force=True)
        from advisor.runtime.probe._worker import main

        code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the worker reports its own failures; this is what escaped it
        import traceback

        traceback.print_exc()
    finally:
        try:
            if measured is not None:  # os._exit skips the atexit hook that would save it
                measured.stop()
                measured.save()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    """The zygote: preload, then fork one child per request line until stdin closes."""
    _preload()
    out = sys.stdout
    lock = threading.Lock()

    def say(**fields: Any) -> None:
        with lock:
            out.write(json.dumps(fields) + "\n")
            out.flush()

    def wait_for(pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        say(exit=pid, rc=os.waitstatus_to_exitcode(status))

    say(ready=os.getpid())
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        say(pid=pid)
        threading.Thread(target=wait_for, args=(pid,), daemon=True).start()


def _message(line: str) -> dict | None:
    """A protocol line; None for anything else a preloaded library printed on the zygote's stdout."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError:
        return None
    return msg if isinstance(msg, dict) else None


class ForkedProbe:
    """A forked probe, with the part of ``subprocess.Popen`` the runner uses: pid, poll, wait, returncode."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        code = self._zygote.exit_code(self.pid)
        if code is None and not self._zygote.ready and not _exists(self.pid):
            return UNKNOWN_EXIT  # the zygote died before telling; the probe is gone too
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._zygote.wait_exit(self.pid, timeout):
            raise subprocess.TimeoutExpired(f"probe {self.pid}", timeout or 0)
        return self.returncode  # type: ignore[return-value]


class Zygote:
    """The parent's handle on its zygote: started on first use, one request at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self._proc = subprocess.Popen([sys.executable, "-m", "advisor.runtime.probe._zygote"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env, text=True,
                                      bufsize=1)
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        self._changed = threading.Condition()
        self.ready = False
        for line in self._proc.stdout:  # until the preload is done (or the zygote dead: no line)
            if "ready" in (_message(line) or {}):
                self.ready = True
                break
        if self.ready:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            msg = _message(line)
            if msg is None:
                continue
            with self._changed:
                if "pid" in msg:
                    self._pids.append(msg["pid"])
                else:
                    self._exits[msg["exit"]] = msg["rc"]
                self._changed.notify_all()
        with self._changed:  # the zygote is gone: so are the answers it still owed
            self.ready = False
            self._changed.notify_all()

    def alive(self) -> bool:
        return self.ready and self._proc.poll() is None

    def fork(self, argv: list[str], env: dict[str, str], cwd: str, log: str) -> ForkedProbe:
        with self._lock:
            with self._changed:
                known = len(self._pids)
            self._proc.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": cwd, "log": log}) + "\n")
            self._proc.stdin.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: len(self._pids) > known or not self.ready, timeout=60):
                    raise OSError("the probe zygote did not fork within 60 s")
                if len(self._pids) <= known:
                    raise OSError("the probe zygote ended")
                return ForkedProbe(self, self._pids[known])

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: pid in self._exits or not self.ready, timeout=timeout) \
                and pid in self._exits

    def close(self) -> None:
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - already gone
            self._proc.kill()


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_PROBE and not k.startswith(PER_PROBE_PREFIX)}


def _forkable(device: str, env: dict[str, str]) -> bool:
    """A CPU probe; or a cuda probe under the CUDA test double, whose child runs its step on the CPU and never starts
    CUDA (advisor.runtime.cuda_boundary)."""
    from advisor.core.catalog import CUDA_DOUBLE_ENV

    return device == "cpu" or (device == "cuda" and bool(env.get(CUDA_DOUBLE_ENV)))


def zygote_for(device: str, env: dict[str, str]) -> Zygote | None:
    """The zygote to fork a probe from, or None where the probe must be a fresh interpreter (module docstring)."""
    global _zygote
    if not _forkable(device, env) or env.get(OFF_ENV) == "0":
        return None
    with _zygote_lock:
        if _zygote is not None and (not _zygote.alive() or _comparable(_zygote.env) != _comparable(env)):
            _zygote.close()
            _zygote = None
        if _zygote is None:
            import atexit

            _zygote = Zygote(env)
            if not _zygote.ready:
                _zygote = None
                return None
            atexit.register(_zygote.close)
        return _zygote


if __name__ == "__main__":
    serve()
