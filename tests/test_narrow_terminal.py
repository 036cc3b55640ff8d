"""Readable at 80 columns: the catalogs, the estimate and tune's summary wrap or fold, never cut a name,
a hub id or a word of a plan; `--help` says each default once."""

from __future__ import annotations

import json
import re

import pytest

from advisor.cli import main
from advisor.core.catalog import gpu_catalog, model_catalog, resolve_gpu


@pytest.fixture(autouse=True)
def narrow(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out, "a cell was cut"
    return out


def test_models_show_every_name_and_hub_id_whole(capsys):
    out = run(capsys, "models")
    words = set(out.split())
    for key, entry in model_catalog().items():
        for name in [key, entry["hf_id"], *entry.get("hf_variants", [])]:
            assert name in out, name
        for alias in entry.get("aliases", []):  # whole, never broken mid-word ("qwen3-0 / 6b")
            assert alias in words, alias


def test_gpus_show_every_key_and_name_whole(capsys):
    out = run(capsys, "gpus")
    for key in gpu_catalog():
        assert key in out and resolve_gpu(key).name in out, key


def test_estimate_keeps_the_model_and_every_word_of_the_plan(capsys):
    out = run(capsys, "estimate", "--model", "qwen7b", "--method", "qlora", "--optimizer", "paged_adamw_8bit",
              "--lora-targets", "all-linear", "--gpu-budget", "24GB")
    for word in ["qwen2.5-7b-instruct", "7,615,616,512", "qlora", "nf4", "r16[all-linear]", "paged_adamw_8bit",
                 "Peak on the GPU"]:
        assert word in out, word


def test_tune_summary_keeps_every_word_of_every_plan(tmp_path, capsys):
    out = run(capsys, "tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--trials", "12",
              "--reports-dir", str(tmp_path), "--verbose")
    main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--trials", "12",
          "--reports-dir", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    words = {w for t in d["trials"] for w in t["plan_short"].split()}
    assert {"paged_adamw_8bit", "r16[q,k,v,o]"} & words
    assert [w for w in words if w not in out] == []


@pytest.mark.parametrize("command", ["tune", "estimate", "probe", "preflight", "export", "report", "worker"])
def test_help_says_each_default_once(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default" in text or command not in ("tune", "estimate", "probe")
    assert not re.search(r"\(default[^)]*\)\s*\(default", text), text
