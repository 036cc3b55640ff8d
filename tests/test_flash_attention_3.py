"""`--attn-impl flash_attention_3` (issue 31): Hopper only (card_rules.yaml), the memory of flash_attention_2 (the same
saved tensors: q, k, v, the output and the log-sum-exp per head), FA2's step time (no measured FA3 factor in
throughput.yaml), an exact quality entry, and the exports that can say it."""

from __future__ import annotations

import json

import pytest
import yaml

from advisor.cli import main
from advisor.configs.export import export_plan
from advisor.configs.read import read_config
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import ATTENTION, FLASH_ATTENTION, Plan
from advisor.runtime.backends import get_backend

FA2, FA3 = "flash_attention_2", "flash_attention_3"


def test_it_is_an_attention_choice_of_the_flash_family():
    assert FA3 in ATTENTION and set(FLASH_ATTENTION) == {FA2, FA3}
    with pytest.raises(AdvisorInputError, match="flash_attention_3 computes in fp16/bf16 only"):
        Plan(attn_impl=FA3, precision="fp32").validate()


@pytest.mark.parametrize("gpu", ["rtx-4090", "a100-80gb"])
def test_estimate_refuses_it_off_hopper_in_one_line_naming_the_flag(capsys, gpu):
    assert main(["estimate", "--model", "qwen0.5b", "--gpu", gpu, "--attn-impl", FA3]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--attn-impl: " in err and "Hopper" in err and "flash_attention_3" in err


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_hopper_takes_it_with_fa2s_memory_and_step_time(capsys, gpu):
    def estimate(impl):
        assert main(["estimate", "--model", "qwen0.5b", "--method", "lora", "--gpu", gpu, "--seq-len", "4096",
                     "--attn-impl", impl, "--backend", "estimate", "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    fa2, fa3 = estimate(FA2), estimate(FA3)
    assert fa3["plan"]["attn_impl"] == FA3 and fa3["ledger"] == fa2["ledger"] and fa3["peak_bytes"] == fa2["peak_bytes"]
    assert fa3["tokens_per_s"] == fa2["tokens_per_s"] and fa3["step_terms"] == fa2["step_terms"]


def test_the_simulation_runs_it_as_sdpa_like_fa2_and_says_so():
    model, plan = resolve_model("qwen0.5b"), Plan(method="lora", seq_len=512)
    sim = get_backend("simulate")
    sim.measure(model, plan, None)  # the process's first trace allocates a few KiB once (lazy initialisation)
    fa2, fa3 = sim.measure(model, plan.with_(attn_impl=FA2), None), sim.measure(model, plan.with_(attn_impl=FA3), None)
    assert fa3.peak_bytes == fa2.peak_bytes and dict(fa3.device) == dict(fa2.device)
    assert any(n.startswith("flash_attention_3 run as sdpa (flash_attn_interface absent") for n in fa3.notes)


def test_its_quality_entry_is_exact():
    from advisor.core.data_files import load_data_file

    text = yaml.safe_dump(load_data_file("quality.yaml"))
    assert "flash_attention_3" in text
    entry = _find(load_data_file("quality.yaml"), FA3)
    assert entry["kind"] == "exact" and entry["source"].startswith("Shah et al. 2024")


def _find(node, key):
    if isinstance(node, dict):
        if key in node and isinstance(node[key], dict) and "kind" in node[key]:
            return node[key]
        for v in node.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def test_exports_write_it_and_read_it_back(tmp_path):
    """advisor.yaml (transformers' attn_implementation), TRL's ModelConfig.attn_implementation and axolotl's
    attn_implementation (its schema lists flash_attention_3) carry it; LLaMA-Factory 0.9.5 cannot run fa3: refused
    with the reason."""
    model, plan = resolve_model("qwen0.5b"), Plan(method="lora", attn_impl=FA3)
    written = export_plan(model, plan, tmp_path)
    assert {"advisor", "trl", "axolotl"} <= set(written)
    assert "LLaMA-Factory 0.9.5" in written.skipped["llamafactory"] and "fa3" in written.skipped["llamafactory"]
    advisor = yaml.safe_load(written["advisor"].read_text())
    assert advisor["model"]["attn_implementation"] == FA3
    assert yaml.safe_load(written["trl"].read_text())["attn_implementation"] == FA3
    assert yaml.safe_load(written["axolotl"].read_text())["attn_implementation"] == FA3
    for fmt in ("advisor", "trl", "axolotl"):
        assert read_config(str(written[fmt]))[1].attn_impl == FA3, fmt
    with pytest.raises(AdvisorInputError, match="flash_attention_2 for this format"):
        export_plan(model, plan, tmp_path / "lf", ["llamafactory"])


def test_the_train_scripts_fall_back_to_sdpa_without_a_gpu():
    from pathlib import Path

    import advisor.configs.export as export

    for name in ("train.py", "train_trl.py", "train_grpo.py", "train_dpo.py"):
        text = (Path(export.__file__).parent / "templates" / name).read_text()
        assert '("flash_attention_2", "flash_attention_3")' in text, name


def test_preflight_on_a_card_that_is_not_hopper_is_no_go(tmp_path, capsys):
    config = export_plan(resolve_model("qwen0.5b"), Plan(method="lora", attn_impl=FA3), tmp_path,
                         formats=["advisor"])["advisor"]
    code = main(["preflight", str(config), "--gpu", "a100-80gb", "--backend", "estimate", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 1 and d["verdict"] == "NO-GO"
    assert any(f["severity"] == "error" and "flash_attention_3" in f["title"] for f in d["findings"])
    assert resolve_gpu("b200").sm == 100  # Blackwell: FA3 is Hopper-only
