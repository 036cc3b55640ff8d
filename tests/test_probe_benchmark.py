"""`benchmarks/gpu_validation.py --device cpu --tiny`: the CI form of the GPU validation, for real."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_validation_tiny_cpu_writes_the_report(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "benchmarks" / "gpu_validation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_validation"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu_validation.md"
    rc = mod.main(["--device", "cpu", "--tiny", "--out", str(out), "--timeout", "240", "--limit", "2"])
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| tiny-")]
    assert rc == 0 and len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "ok" and cells[3].endswith("MiB")
        assert "%" in cells[8]  # the analytic error was computed against a measured peak
        from advisor.runtime.backends import available

        if "simulate" in available():
            err = float(cells[6].split("(")[1].rstrip("%)"))
            assert abs(err) <= 2.0  # same step, same counting: within 2%
