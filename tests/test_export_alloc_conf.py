"""expandable_segments in exports: PYTORCH_CUDA_ALLOC_CONF in advisor.yaml (train.py sets it), in every
launch command, read back by the config reader; formats without an environment field say so."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from advisor.configs.export import export_plan
from advisor.configs.read import read_config
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan

CONF = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_expandable_plan_exports_the_allocator_setting(tmp_path):
    spec = resolve_model("qwen7b")
    plan = Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, expandable_segments=True)
    written = export_plan(spec, plan, tmp_path, ["advisor", "train", "axolotl", "llamafactory"])
    text = written["advisor"].read_text()
    assert yaml.safe_load(text)["advisor"]["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert f"# Run it:   {CONF} python {tmp_path.resolve() / 'train.py'} --data" in text
    for fmt in ("axolotl", "llamafactory"):
        head = written[fmt].read_text()
        assert f"Run:  {CONF} " in head and "no field for environment variables" in head
    name, back, _ = read_config(written["advisor"])
    assert back.expandable_segments is True and back == plan.with_(lora_targets=back.lora_targets)


def test_default_plan_exports_no_allocator_setting(tmp_path):
    written = export_plan(resolve_model("qwen7b"), Plan(), tmp_path, ["advisor", "axolotl"])
    assert "env" not in yaml.safe_load(written["advisor"].read_text())["advisor"]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in written["axolotl"].read_text()
    assert read_config(written["advisor"])[1].expandable_segments is False


@pytest.mark.slow
def test_train_py_sets_the_variable_before_torch_starts(tmp_path):
    plan = Plan(method="lora", expandable_segments=True)
    written = export_plan(resolve_model("qwen7b"), plan, tmp_path, ["advisor", "train"])
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    # a missing data file ends the run right after the environment is set (nothing is downloaded)
    proc = subprocess.run([sys.executable, str(written["train"]), "--data", str(tmp_path / "missing.jsonl")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert f"[train.py] {CONF} (advisor.env)" in proc.stdout


@pytest.mark.slow
def test_a_probe_of_an_expandable_plan_runs_with_the_setting(monkeypatch):
    from advisor.runtime.probe import run_probe
    from advisor.runtime.simulate.tiny import tiny_spec

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    r = run_probe(tiny_spec("qwen2", num_layers=2, vocab_size=512), Plan(method="lora", seq_len=32,
                  expandable_segments=True), device="cpu", steps=1, warmup=0, timeout=240)
    assert r.ok and CONF in r.notes


def test_estimate_flag_sets_the_knob_and_lowers_the_estimated_reserve(capsys):
    import json

    from advisor.cli import main

    out = {}
    for flag in ((), ("--expandable-segments",)):
        assert main(["estimate", "--model", "qwen7b", "--method", "qlora", "--json", *flag]) == 0
        out[bool(flag)] = json.loads(capsys.readouterr().out)
    assert out[True]["plan"]["expandable_segments"] is True and out[False]["plan"]["expandable_segments"] is False
    assert out[True]["tensor_peak_bytes"] == out[False]["tensor_peak_bytes"]
    assert out[False]["tensor_peak_bytes"] < out[True]["reserved_peak_bytes"] < out[False]["reserved_peak_bytes"]
