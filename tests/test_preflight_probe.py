"""`advisor preflight CONFIG --probe`: the probe is held to the budget for real (RLIMIT_DATA on the CPU);
a probe that fails makes the verdict NO-GO, exit 1, naming its status (never an input error, exit 2)."""

from __future__ import annotations

import json

import pytest

from advisor.configs.export import export_plan
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.runtime.simulate.tiny import tiny_spec
from cli_run import advisor_json


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(tiny_spec("qwen2", num_layers=2, vocab_size=512).config))
    return d


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the probe runs on the CPU


def preflight(config, *argv):
    return advisor_json("preflight", config, *argv, "--json")


def _config(tiny_dir, tmp_path, plan):
    return export_plan(resolve_model(str(tiny_dir)), plan, tmp_path, formats=["advisor"])["advisor"]


@pytest.mark.slow
def test_probe_over_the_budget_is_no_go_naming_the_status(tiny_dir, tmp_path):
    # logits alone: 16 x 2048 x 512 x 4 B = 64 MiB, over a 48 MiB budget
    config = _config(tiny_dir, tmp_path, Plan(method="full", seq_len=2048, micro_batch=16))
    code, d, err = preflight(config, "--probe", "--gpu-budget", "48MiB", "--backend", "estimate")
    assert code == 1 and d is not None, err
    assert d["verdict"] == "NO-GO"
    probe = next(f for f in d["findings"] if f["check"] == "memory.probe")
    assert probe["severity"] == "error" and probe["title"].startswith("probe oom:")
    assert probe["data"]["status"] == "oom" and probe["data"]["budget_bytes"] == 48 * 2**20


@pytest.mark.slow
def test_probe_within_the_budget_runs_and_measures(tiny_dir, tmp_path):
    config = _config(tiny_dir, tmp_path, Plan(method="lora", seq_len=32, lora_dropout=0.0))
    code, d, err = preflight(config, "--probe", "--gpu-budget", "2GiB", "--backend", "estimate")
    assert d is not None, err
    probe = next(f for f in d["findings"] if f["check"] == "memory.probe")
    assert probe["severity"] == "ok" and "measured on the cpu held to 2.00 GiB" in probe["title"], probe
    assert probe["data"]["status"] == "ok" and probe["data"]["tokens_per_s"] > 0
