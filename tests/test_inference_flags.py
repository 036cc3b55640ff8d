"""`advisor tune --task inference` never silently ignores a flag of the training study machinery: each one
it does not support is refused with one line naming it, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

BASE = ["tune", "--task", "inference", "--gpu-budget", "24GB", "--model", "qwen7b", "--gpu", "rtx-4090",
        "--backend", "estimate"]


@pytest.mark.parametrize("argv,flag", [
    (["--trials", "5"], "--trials"),
    (["--storage", "sqlite:///x.db"], "--storage"),
    (["--study", "s"], "--study"),
    (["--tui"], "--tui"),
    (["--gpus", "2"], "--gpus"),
    (["--no-work"], "--no-work"),
])
def test_unsupported_flag_is_refused_naming_it(argv, flag):
    proc = subprocess.run([sys.executable, "-m", "advisor", *BASE, *argv], capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"advisor tune: error: {flag}: not supported with --task inference")
    assert "Traceback" not in proc.stderr and not proc.stdout


def test_a_probe_backend_is_refused():
    from advisor.cli import main

    argv = [a for a in BASE if a != "estimate" and a != "--backend"]
    assert main([*argv, "--backend", "cpu"]) == 2


def test_the_supported_flags_still_run(capsys):
    from advisor.cli import main

    assert main([*BASE, "--headroom", "0.1", "--gpus", "1", "--json"]) == 0
    assert '"task": "inference"' in capsys.readouterr().out
