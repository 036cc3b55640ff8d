"""The parent side of a probe: start a child, watch it, end it, reap it.

A CUDA child is a new interpreter (``subprocess.Popen`` of ``sys.executable``: spawn, never fork,
so no CUDA or thread state is inherited); a CPU child (or one of the CUDA test double) is forked from
the zygote, a process that has imported torch, transformers and peft once
(advisor.runtime.probe._zygote). Either runs in its own session, hence its own process group.
It writes one JSON event per line to a file; the parent polls that file, stops the child at
the timeout or as soon as a step's measured memory exceeds the budget, and always ends by
killing the whole process group (the child and any grandchildren) and waiting for them. Every
way the child can end becomes a ProbeResult: ok, oom, timeout, crash or error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from advisor.core.errors import AdvisorInputError
from advisor.runtime.probe._classify import describe_exit, essence, last_error_line
from advisor.runtime.probe._request import FAULTS, ProbeRequest
from advisor.runtime.probe._result import ProbeResult

DEVICES = ("cpu", "cuda")
POLL_S = 0.05


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[3])


def _fmt(n: int) -> str:
    from advisor.core.units import format_bytes

    return format_bytes(n)


class _EventReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._partial = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil
        return []


def reap(proc: Any, known: dict[int, Any]) -> None:
    """Kill the child's process group and every descendant seen, then wait for all of them."""
    for p in _descendants(proc.pid):
        known.setdefault(p.pid, p)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
    for p in list(known.values()):
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if known:
        try:
            import psutil

            psutil.wait_procs(list(known.values()), timeout=5)
        except Exception:  # noqa: BLE001
            pass


def _validate(plan: Any, device: str, steps: int, warmup: int, timeout: float, data: str | None,
              weights_dir: str | None, fault: str, memory_limit_bytes: int | None,
              learning_rate: float | None = None, eval_window: int | None = None) -> None:
    from advisor.runtime.probe._data import read_documents

    plan.validate()
    if device not in DEVICES:
        raise AdvisorInputError("--device", f"must be one of {', '.join(DEVICES)}", device)
    if not isinstance(steps, int) or steps < 1:
        raise AdvisorInputError("--steps", "must be a whole number of at least 1", steps)
    if not isinstance(warmup, int) or warmup < 0:
        raise AdvisorInputError("--warmup", "must be a whole number of at least 0", warmup)
    if not timeout or timeout <= 0:
        raise AdvisorInputError("--timeout", "must be a number of seconds greater than 0", timeout)
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise AdvisorInputError("--gpu-budget", "must be greater than zero", memory_limit_bytes)
    if data is not None:
        read_documents(data)
    if weights_dir is not None and not Path(weights_dir).is_dir():
        raise AdvisorInputError("--weights", "no such directory", weights_dir)
    if fault not in FAULTS:
        raise AdvisorInputError("fault", f"must be one of {', '.join(FAULTS)}", fault)
    if learning_rate is not None and not (isinstance(learning_rate, (int, float)) and 0 < learning_rate < 1):
        raise AdvisorInputError("learning rate", "must be a number between 0 and 1", learning_rate)
    if eval_window is not None and (not isinstance(eval_window, int) or eval_window < 2):
        raise AdvisorInputError("eval window", "must be a whole number of at least 2 tokens", eval_window)


def run_probe(model_spec: Any, plan: Any, *, device: str = "cpu", steps: int = 3, warmup: int = 1,
              timeout: float = 300.0, data: str | None = None, memory_limit_bytes: int | None = None,
              weights_dir: str | None = None, eval_texts: list[str] | None = None, max_eval_tokens: int = 2048,
              num_layers: int | None = None, quant_impl: str = "auto", seed: int = 0, fault: str = "none",
              on_start: Callable[[int], None] | None = None, keep_dir: str | None = None,
              learning_rate: float | None = None, eval_window: int | None = None,
              fidelity: bool = True) -> ProbeResult:
    """Run ``plan`` on ``model_spec`` for ``warmup + steps`` optimizer steps in a child process.

    Never raises for what happens in the child: out of memory, a crash, a hang past ``timeout``
    seconds or a Python error all come back as a ProbeResult with that status. Raises
    AdvisorInputError only for bad arguments. ``on_start(pid)`` is called with the child's pid
    once it runs. Real weights from ``weights_dir`` turn on eval fidelity over ``eval_texts``
    (default: the shipped advisor/data/probes/eval/*.txt). ``keep_dir`` keeps the request, events and child log.
    ``learning_rate`` trains every parameter group at that constant rate (default: the optimizer's own);
    ``eval_window`` sets the tokens per eval window (default: the plan's seq_len, at most 512); ``fidelity=False``
    keeps the eval losses but loads no 16-bit reference model (no KL).
    """
    from advisor.runtime.probe._data import default_eval_texts

    _validate(plan, device, steps, warmup, timeout, data, weights_dir, fault, memory_limit_bytes, learning_rate,
              eval_window)
    if eval_texts is None:
        eval_texts = [str(p) for p in default_eval_texts()] if weights_dir else []
    req = ProbeRequest(spec=model_spec.to_dict(), plan=plan.to_dict(), device=device, steps=steps, warmup=warmup,
                       data=str(data) if data else None, memory_limit_bytes=memory_limit_bytes,
                       weights_dir=str(weights_dir) if weights_dir else None, eval_texts=tuple(map(str, eval_texts)),
                       max_eval_tokens=max_eval_tokens, num_layers=num_layers, quant_impl=quant_impl, seed=seed,
                       fault=fault, learning_rate=learning_rate, eval_window=eval_window,
                       fidelity=fidelity)
    work = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="advisor-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _run(req, work, timeout, on_start, model_spec.name)
    finally:
        if not keep_dir:
            shutil.rmtree(work, ignore_errors=True)


def _test_double(device: str) -> str | None:
    """The catalog GPU the CUDA test double stands for in the child (it inherits the environment), or None."""
    from advisor.core.catalog import cuda_double_gpu

    gpu = cuda_double_gpu() if device == "cuda" else None
    return gpu.key if gpu is not None else None


def _run(req: ProbeRequest, work: Path, timeout: float, on_start: Callable[[int], None] | None,
         model_name: str) -> ProbeResult:
    req_path, ev_path, log_path = work / "request.json", work / "events.jsonl", work / "child.log"
    req.write(req_path)
    ev_path.write_text("", encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_package_root(), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if req.plan.get("expandable_segments") and "expandable_segments" not in conf:
        # the plan's allocator setting: torch reads it when the child starts CUDA
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(filter(None, [conf, "expandable_segments:True"]))
    cmd = [sys.executable, "-X", "faulthandler", "-m", "advisor.runtime.probe._worker", str(req_path), str(ev_path)]
    reader = _EventReader(ev_path)
    state: dict[str, Any] = {"steps": [], "phase": "spawn", "result": None, "failed": None, "loaded": None}
    known: dict[int, Any] = {}
    killed_for: str | None = None
    kill_message = ""
    t0 = time.monotonic()
    proc = _start(cmd, env, log_path, req.device)
    try:
        if on_start is not None:
            on_start(proc.pid)
        last_scan = 0.0
        while True:
            rc = proc.poll()
            for ev in reader.read():
                killed_for, kill_message = _handle(ev, state, req, killed_for, kill_message)
            if rc is not None or killed_for:
                break
            now = time.monotonic()
            if now - t0 > timeout:
                killed_for = "timeout"
                kill_message = (f"no result after {timeout:g} s (phase {state['phase']}, "
                                f"{len(state['steps'])} of {req.warmup + req.steps} steps done)")
                break
            if now - last_scan > 0.5:  # remember descendants, in case one leaves the process group
                for p in _descendants(proc.pid):
                    known.setdefault(p.pid, p)
                last_scan = now
            time.sleep(POLL_S)
    finally:
        reap(proc, known)
    for ev in reader.read():
        _handle(ev, state, req, killed_for, kill_message)
    wall = time.monotonic() - t0
    exit_text = describe_exit(proc.returncode)
    if killed_for:
        exit_text = f"killed by the parent ({killed_for})"
    return _result(req, state, killed_for, kill_message, exit_text, proc.returncode, log_path, wall, model_name)


def _start(cmd: list[str], env: dict[str, str], log_path: Path, device: str) -> Any:
    """The child: forked from the zygote where it can be (advisor.runtime.probe._zygote), else a fresh interpreter
    in its own session. Either has ``pid``, ``poll()``, ``wait()`` and ``returncode``."""
    from advisor.runtime.probe._zygote import zygote_for

    zygote = zygote_for(device, env)
    if zygote is not None:
        try:
            return zygote.fork(cmd[cmd.index("-m") + 1:], env, os.getcwd(), str(log_path))
        except OSError:
            pass  # the zygote is gone: a fresh interpreter instead
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _handle(ev: dict[str, Any], state: dict[str, Any], req: ProbeRequest, killed_for: str | None,
            kill_message: str) -> tuple[str | None, str]:
    kind = ev.get("ev")
    if kind == "phase":
        state["phase"] = ev["phase"]
    elif kind == "step":
        state["steps"].append(ev)
        limit = req.memory_limit_bytes
        if limit and not killed_for:
            measured = ev.get("nvml") if req.device == "cuda" else ev.get("peak")
            what = "whole-process GPU memory (NVML)" if req.device == "cuda" else "peak of live tensors"
            if _test_double(req.device):
                what += " of the cuda test double"
            if measured and measured > limit:
                return "oom", (f"{what} {_fmt(measured)} over the budget {_fmt(limit)} at step {ev['i']} "
                               f"(stopped early)")
    elif kind in ("result", "failed", "loaded"):
        state[kind] = ev
    elif kind == "grandchild":
        state.setdefault("grandchildren", []).append(ev["pid"])
    return killed_for, kill_message


def _result(req: ProbeRequest, state: dict[str, Any], killed_for: str | None, kill_message: str, exit_text: str,
            returncode: int | None, log_path: Path, wall: float, model_name: str) -> ProbeResult:
    steps = state["steps"]
    base: dict[str, Any] = {
        "device": req.device, "model": model_name, "plan": req.plan, "steps": req.steps, "warmup": req.warmup,
        "steps_done": len(steps), "step_peaks_bytes": tuple(s["peak"] for s in steps if s.get("peak") is not None),
        "losses": tuple(s["loss"] for s in steps), "weights": req.weights_dir or "random",
        "data": req.data or "synthetic", "budget_bytes": req.memory_limit_bytes, "wall_s": wall, "exit": exit_text,
        "test_double": _test_double(req.device), "learning_rate": req.learning_rate,
    }
    if steps:
        base["peak_allocated_bytes"] = max(s["peak"] or 0 for s in steps)
        base["step_times_s"] = tuple(s["time_s"] for s in steps if not s.get("warmup"))
        reserved = [s["reserved"] for s in steps if s.get("reserved")]
        nvml = [s["nvml"] for s in steps if s.get("nvml")]
        base["peak_reserved_bytes"] = max(reserved) if reserved else None
        base["nvml_peak_bytes"] = max(nvml) if nvml else None
    if killed_for:
        return ProbeResult(status=killed_for, message=kill_message, **base)
    if state["result"] is not None:
        r = dict(state["result"])
        for key in ("ev", "t", "limits"):
            r.pop(key, None)
        r["notes"] = tuple(r.get("notes", ()))
        return ProbeResult(status="ok", message="", **{**base, **r})
    if state["failed"] is not None:
        f = state["failed"]
        return ProbeResult(status=f["status"], message=f["message"], **base)
    log = log_path.read_text(encoding="utf-8", errors="replace")[-20000:] if log_path.exists() else ""
    why = last_error_line(log)
    if returncode is not None and returncode == -signal.SIGKILL:
        head = "killed by SIGKILL (another process, or the kernel's out-of-memory killer)"
    else:
        head = f"the child died ({exit_text}) without a result"
    return ProbeResult(status="crash", message=essence(f"{head}: {why}" if why else head), **base)
