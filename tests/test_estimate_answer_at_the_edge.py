"""An answer of `--backend estimate` at the edge of the budget is simulated before it is given, so it passes the
pre-flight (a simulation) of its own export, as the simulate backend's answer does."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main


@pytest.mark.slow
def test_the_estimate_backends_answer_at_the_edge_passes_its_preflight(tmp_path, capsys):
    # Qwen2.5-0.5B on 5.5 GB: the answer's estimated peak is within a few % of the usable budget
    args = ["tune", "--gpu-budget", "5.5GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "8",
            "--reports-dir", str(tmp_path / "r"), "--export", str(tmp_path / "out"), "--json"]
    assert main(args) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["source"] == "simulated", "an estimate within the edge margin of the budget is simulated"
    assert main(["preflight", str(tmp_path / "out" / "advisor.yaml"), "--gpu-budget", "5.5GB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "GO"
