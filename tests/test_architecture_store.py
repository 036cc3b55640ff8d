"""Where descriptions are kept (advisor/core/architecture_store.py): the committed data file is what a fresh
derivation gives, a catalog model is answered from it without torch, any other config is derived once and then
read from the user cache; architectures.yaml's facts agree with the installed libraries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.core import architecture_store as store
from advisor.core.architecture import config_key
from advisor.core.catalog import architecture_facts, model_catalog, peft_moved_lora_names

ROOT = Path(__file__).resolve().parents[1]
OLMOE = dict(model_type="olmoe", hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, num_experts=4, num_experts_per_tok=2, vocab_size=128, pad_token_id=0)


@pytest.mark.slow
def test_regenerating_the_data_file_gives_the_committed_one():
    """`python -m advisor.core.architecture_store --write` run now writes the file that is committed (models.yaml,
    the derivation and transformers agree with it)."""
    fresh = store.render(store.derived_catalog())
    committed = store.data_file_path().read_text(encoding="utf-8")
    assert fresh == committed, "run: python -m advisor.core.architecture_store --write"


def test_every_catalog_model_is_stored_under_its_config_key():
    data = json.loads(store.data_file_path().read_text(encoding="utf-8"))
    assert set(data["models"]) == set(model_catalog())
    for key, entry in model_catalog().items():
        assert data["models"][key]["config_key"] == config_key(entry["config"])
        assert data["models"][key]["description"]["params_total"] == entry["params_total"]


def _run(code: str, env_cache: Path) -> str:
    import os

    env = {**os.environ, store.CACHE_ENV: str(env_cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), env=env,
                         check=True)
    return out.stdout.strip()


def test_a_catalog_model_resolves_without_torch(tmp_path):
    code = ("import sys; from advisor.core.catalog import resolve_model; s = resolve_model('qwen30b-a3b'); "
            "print(s.params_total, s.description.moe.num_experts, len(s.linear_shapes()), 'torch' in sys.modules)")
    assert _run(code, tmp_path).split() == ["30532122624", "128", "4", "False"]


def test_a_new_config_is_derived_once_then_read_from_the_cache(tmp_path):
    d = tmp_path / "tiny-olmoe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(OLMOE))
    code = ("import sys; from advisor.core.architecture_store import description_for; "
            "from advisor.core.catalog import resolve_model, _read_config_json; from pathlib import Path; "
            f"p = Path({str(d)!r}); c = _read_config_json(p / 'config.json', 'x'); "
            "desc, where = description_for(c); print(where, desc.params_total, 'torch' in sys.modules)")
    cold = _run(code, tmp_path / "cache").split()
    warm = _run(code, tmp_path / "cache").split()
    assert cold[0] == "derived" and cold[2] == "True"
    assert warm == ["cache", cold[1], "False"]  # the second process reads the user cache: no torch import
    assert len(list((tmp_path / "cache").glob(f"{config_key(OLMOE)}-v*-transformers*.json"))) == 1


def test_a_damaged_cache_file_is_derived_again(tmp_path, monkeypatch):
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path))
    config = {**OLMOE, "num_hidden_layers": 3}
    path = store._cache_path(config_key(config))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    store._MEMO.pop(config_key(config), None)
    desc, where = store.description_for(config)
    assert where == "derived" and desc.num_layers == 3
    assert json.loads(path.read_text())["params_total"] == desc.params_total


def test_a_local_copy_of_a_catalog_config_is_answered_from_the_data_file(tmp_path):
    config = model_catalog()["gpt-oss-20b"]["config"]
    desc, where = store.description_for(dict(config))
    assert where in ("stored", "memo") and desc.params_total == 20_914_757_184
    assert not list(tmp_path.glob("architectures/*.json"))  # nothing derived, nothing cached


def test_peft_rewrite_table_is_the_installed_peft_and_transformers():
    """architectures.yaml's peft_moe_target_rewrite equals what peft 0.21 / transformers 5.24 really do."""
    pytest.importorskip("peft")
    from peft.utils import transformers_weight_conversion as conv

    rule = architecture_facts()["peft_moe_target_rewrite"]
    assert rule["source"] and rule["what"]
    for pattern, names in rule["moved_names"].items():
        assert sorted(names) == sorted(conv._MOE_TARGET_MODULE_MAPPING[pattern])
    installed = {p: sorted(t for t, q in conv._MODEL_TO_CONVERSION_PATTERN.items() if q == p)
                 for p in rule["moved_names"]}
    assert {p: sorted(t) for p, t in rule["model_types"].items()} == installed
    assert peft_moved_lora_names("qwen3_moe") == {"gate", "gate_proj", "up_proj", "down_proj"}
    assert peft_moved_lora_names("gpt_oss") == frozenset() == peft_moved_lora_names("llama")


def test_building_a_config_leaves_the_catalog_config_and_its_key_as_they_were():
    from advisor.core.catalog import build_hf_config

    config = model_catalog()["gpt-oss-20b"]["config"]  # transformers edits its rope_scaling in place
    key = config_key(config)
    build_hf_config(config)
    assert config_key(config) == key == config_key(model_catalog()["gpt-oss-20b"]["config"])
