"""`advisor export STUDY`: the chosen plan (or a trial) written in the formats asked for, loadable again."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.configs.read import read_config


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp")
    assert main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--trials", "10",
                 "--json", "--reports-dir", str(root / "reports"), "--study", "s"]) == 0
    return root / "reports" / "s"


def test_export_the_chosen_plan(study, tmp_path, capsys):
    capsys.readouterr()
    assert main(["export", str(study), "--out", str(tmp_path / "out"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"advisor", "train", "axolotl", "llamafactory"} <= set(d["written"])
    name, plan, _ = read_config(d["written"]["advisor"])
    assert name == "Qwen/Qwen2.5-7B-Instruct" and plan.short() == d["plan"]


def test_export_one_format_of_a_trial(study, tmp_path, capsys):
    # trial 0 is the usual recipe (complete); trial 1, the full fine-tune, was pruned
    assert main(["export", str(study), "--trial", "0", "--format", "axolotl", "--out", str(tmp_path / "o"),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d["written"]) == ["axolotl"] and d["trial"] == 0


def test_bad_export_input(study, capsys):
    assert main(["export", str(study), "--trial", "9999"]) == 2
    assert main(["export", str(study), "--format", "nope"]) == 2
    assert main(["export", "/no/such/study"]) == 2
    err = capsys.readouterr().err
    assert "--trial" in err and "--format" in err and "STUDY" in err
