"""Run an exported training script (train.py, train_trl.py, train_grpo.py, train_dpo.py) on the CPU, as a user would:
a child Python in the export's folder, no GPU visible; returns the process and its ADVISOR_TRAIN_SUMMARY line.

A child is forked from a process that has already imported torch, transformers, peft and TRL (tests/forked.py),
then runs the script as ``__main__`` (``runpy.run_path``) with its own arguments, folder, environment and output:
the same script run, without a fresh interpreter's 6 s of imports each time. ``fresh=True`` starts a
new interpreter instead (``python script ...``), for what happens at import (tests/test_export_trl.py keeps one run
so, tests/test_export_alloc_conf.py its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from forked import forkserver_context  # tests/forked.py

TIMEOUT = 400


def run_export_script(script: Path, *args: str, fresh: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    if fresh:
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                              timeout=TIMEOUT, cwd=script.parent)
    else:
        proc = _forked(script, list(args), env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ADVISOR_TRAIN_SUMMARY ")]
    return proc, (json.loads(lines[-1].split(" ", 1)[1]) if lines else {})


def _forked(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        child = forkserver_context().Process(target=_run_script, args=(str(script), args, env, str(out), str(err)))
        child.start()
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([str(script), *args], TIMEOUT)
        return subprocess.CompletedProcess([str(script), *args], child.exitcode, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _run_script(script: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: ``python script *args`` from the script's folder, its output to ``out`` / ``err``."""
    import runpy
    import traceback
    import warnings

    code = 1
    try:
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's stdout
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        if env.get("PYTHONWARNINGS") == "ignore":  # what the interpreter reads at start, the forked one did not
            warnings.simplefilter("ignore")
        os.chdir(Path(script).parent)
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).parent))
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what a fresh interpreter would print before exiting 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
