"""Shared fixtures: every test runs with a private HOME / HF cache, never the user's."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI explores the same examples on every run (a failure there is reproducible, never a dice roll);
# local runs keep exploring new ones
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("ADVISOR_MEMORY_CALIBRATION", str(tmp_path / "memory_calibration.json"))  # never the user's GPU calibration
    # probes' throughput calibration (advisor/speed/calibration.py) in the test's own folder
    monkeypatch.setenv("ADVISOR_SPEED_CALIBRATION", str(tmp_path / "speed_calibration.json"))
    yield
