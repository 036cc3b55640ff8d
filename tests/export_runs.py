"""Run an exported training script (train.py, train_trl.py, train_grpo.py, train_dpo.py) on the CPU, as a user would:
a child Python in the export's folder, no GPU visible; returns the process and its ADVISOR_TRAIN_SUMMARY line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_export_script(script: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=400, cwd=script.parent)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ADVISOR_TRAIN_SUMMARY ")]
    return proc, (json.loads(lines[-1].split(" ", 1)[1]) if lines else {})
