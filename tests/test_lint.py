"""The linter in the fast loop: ruff on the package, the tests and the benchmarks, as pyproject.toml's [tool.ruff]
configures it (pycodestyle and pyflakes, lines of at most 120 characters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_package_the_tests_and_the_benchmarks():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "advisor", "tests", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

