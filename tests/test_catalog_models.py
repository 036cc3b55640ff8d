"""Every model catalog entry loads, and its parameter count is exact (formula == meta build == catalog)."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import model_catalog, resolve_model
from advisor.core.errors import AdvisorInputError

KEYS = list(model_catalog())
REQUIRED = [
    "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct", "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b", "google/gemma-2-9b",
    "google/gemma-2-27b", "microsoft/Phi-3.5-mini-instruct",
]


def test_catalog_has_every_required_model():
    ids = {e["hf_id"] for e in model_catalog().values()}
    assert set(REQUIRED) <= ids


def test_aliases_are_unique():
    seen = {}
    for key, entry in model_catalog().items():
        for name in [key, entry["hf_id"].lower(), *entry.get("hf_variants", []), *entry["aliases"]]:
            assert name.lower() not in seen, f"{name} names both {seen[name.lower()]} and {key}"
            seen[name.lower()] = key


BASE_AND_INSTRUCT = [  # (base, instruct) hub ids as published
    ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"), ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"), ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
    ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("google/gemma-2-2b", "google/gemma-2-2b-it"), ("google/gemma-2-9b", "google/gemma-2-9b-it"),
]


@pytest.mark.parametrize("base,instruct", BASE_AND_INSTRUCT)
def test_base_and_instruct_ids_resolve_to_one_architecture(base, instruct):
    b, i = resolve_model(base), resolve_model(instruct)
    assert (b.hf_id, i.hf_id) == (base, instruct), "each resolves to itself: exports load the checkpoint named"
    assert b.source == i.source == "catalog"
    for f in ("model_type", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "vocab_size", "tie_word_embeddings", "params_total"):
        assert getattr(b, f) == getattr(i, f), f
    assert resolve_model(base.lower()).hf_id == base  # hub ids are case-insensitive
    assert resolve_model(b.name).hf_id == base  # a study re-resolves its model by name


@pytest.mark.parametrize("key", KEYS)
def test_formula_count_matches_catalog(key):
    spec = resolve_model(key)
    assert spec.count_params() == spec.params_total


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_meta_device_build_matches_catalog(key):
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.core.catalog import build_hf_config

    spec = resolve_model(key)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_hf_config(spec.config))
    assert sum(p.numel() for p in model.parameters()) == spec.params_total
    # the decoder layer's linear modules are the ones the ledger knows
    layer = model.model.layers[0]
    linear = {n.split(".")[-1]: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(linear) == set(spec.linear_shapes())
    for name, (i, o) in spec.linear_shapes().items():
        assert (linear[name].in_features, linear[name].out_features) == (i, o)


def test_qwen7b_facts():
    spec = resolve_model("qwen7b")
    assert spec.hf_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.params_total == 7_615_616_512
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (28, 3584, 28, 4, 128)


@pytest.mark.parametrize("name", ["qwen7b", "QWEN7B", "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"])
def test_resolve_by_alias_id_or_key(name):
    assert resolve_model(name).name == "qwen2.5-7b-instruct"


def test_unknown_model_suggests_close_names():
    with pytest.raises(AdvisorInputError) as e:
        resolve_model("qwen7")
    assert "--model" in str(e.value) and "qwen7b" in str(e.value)


def _write_config(d, config):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_local_directory(tmp_path):
    cfg = dict(model_catalog()["qwen2.5-0.5b-instruct"]["config"])
    d = _write_config(tmp_path / "my-model", cfg)
    spec = resolve_model(str(d))
    assert spec.source == "local" and spec.params_total == 494_032_768


def test_hub_id_found_in_local_hf_cache(tmp_path, monkeypatch):
    cfg = dict(model_catalog()["llama-3.2-1b-instruct"]["config"])
    hub = tmp_path / "hf-home" / "hub" / "models--someone--tiny-llama" / "snapshots" / "abc123"
    _write_config(hub, cfg)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    spec = resolve_model("someone/tiny-llama")
    assert spec.source == "hf-cache" and spec.params_total == 1_235_814_400


def test_broken_config_json(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    with pytest.raises(AdvisorInputError, match="--model.*not valid JSON"):
        resolve_model(str(d))


def test_config_missing_field(tmp_path):
    d = _write_config(tmp_path / "partial", {"model_type": "llama", "hidden_size": 64})
    with pytest.raises(AdvisorInputError, match="lacks the field"):
        resolve_model(str(d))


def test_remote_code_needs_flag(tmp_path):
    d = _write_config(tmp_path / "custom", {"model_type": "my_custom_arch", "auto_map": {"AutoModelForCausalLM": "x.Y"},
                                            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                            "num_attention_heads": 4, "vocab_size": 100})
    (d / "x.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(AdvisorInputError, match="--trust-remote-code"):
        resolve_model(str(d))


def test_estimate_takes_a_base_model_id(capsys):
    from advisor.cli import main

    code = main(["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--gpu-budget", "8GB", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["model"]["hf_id"] == "Qwen/Qwen2.5-0.5B" and d["model"]["params_total"] == 494_032_768
