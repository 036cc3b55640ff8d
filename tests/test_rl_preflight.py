"""advisor preflight on GRPO/DPO configs: TRL's GRPOConfig/DPOConfig (YAML as exported, JSON as a user dumps it),
axolotl's rl: and LLaMA-Factory's stage: dpo, each answered by the closed form with GO / RISKY / NO-GO and the phase
(generate / score / train) that sets the step's peak named, and what vLLM holds."""

from __future__ import annotations

import json

import pytest
import yaml

from advisor.configs.export import export_plan
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.diagnosis.preflight import PreflightInput, run_preflight

GRPO_VLLM = Plan(task="grpo", method="qlora", quantization="nf4", gradient_checkpointing=True, micro_batch=8,
                 num_generations=8, max_prompt_length=256, max_completion_length=256, generation="vllm-colocate",
                 vllm_gpu_memory_utilization=0.3, vllm_sleep=2)
DPO_LORA = Plan(task="dpo", method="lora", lora_r=8, lora_targets="all-linear", seq_len=2048,
                gradient_checkpointing=True)


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("qwen7b")


def _check(path, gpu="rtx-4090", **kw):
    kw.setdefault("backend", "estimate")  # the closed form, instant; the simulation is tested once below
    return run_preflight(PreflightInput(config=str(path), gpu=gpu, host_budget="64GB", **kw))


def _by_check(result, name):
    return [f for f in result.findings if f.check == name]


def test_grpo_trl_export_is_go_with_its_phases_named(qwen7b, tmp_path):
    path = export_plan(qwen7b, GRPO_VLLM, tmp_path, ["trl"])["trl"]
    r = _check(path)
    assert r.verdict == "GO", [(f.severity, f.title) for f in r.findings]
    assert r.extra["backend"] == "estimate" and r.plan.task == "grpo"
    (phases,) = _by_check(r, "memory.phases")
    peaks = phases.data["phases"]
    assert set(peaks) == {"generate", "score", "train", "sync"}
    top = phases.data["step_peak_phase"]
    assert peaks[top]["live_bytes"] == max(p["live_bytes"] for p in peaks.values())
    assert f"{top} sets the step's peak" in phases.title
    # the colocated pool beside the trainer's weights: generation and the sync (vLLM's weights woken) are the highest
    assert top in ("generate", "sync") and peaks["generate"]["live_bytes"] > peaks["train"]["live_bytes"]
    (gen,) = _by_check(r, "memory.generation")
    assert "vLLM pool" in gen.title and "KV cache" in gen.title and "tokens" in gen.title
    d = r.to_dict()
    assert d["step_peak_phase"] == top and d["peak_phase"] in d["memory"]["phases"]
    (fit,) = _by_check(r, "memory.fit")
    assert "every completion at max_completion_length (256 + 256 tokens)" in fit.title


def test_grpo_too_big_for_the_card_is_no_go_with_phase_fixes(qwen7b, tmp_path):
    plan = GRPO_VLLM.with_(method="lora", quantization="none", vllm_gpu_memory_utilization=0.6, vllm_sleep=0)
    path = export_plan(qwen7b, plan, tmp_path, ["trl"])["trl"]
    r = _check(path)
    assert r.verdict == "NO-GO"
    errors = [f for f in r.findings if f.severity == "error"]
    assert errors and any("vllm" in fix.lower() for f in errors for fix in f.fixes)


def test_grpoconfig_json_as_a_user_dumps_it(qwen7b, tmp_path):
    path = export_plan(qwen7b, GRPO_VLLM, tmp_path / "x", ["trl"])["trl"]
    cfg = yaml.safe_load(path.read_text())
    (tmp_path / "grpo.json").write_text(json.dumps(cfg))
    r = _check(tmp_path / "grpo.json")
    assert r.verdict == "GO" and r.plan.generation == "vllm-colocate" and r.plan.vllm_sleep == 2
    assert r.plan.max_prompt_length == 256  # vllm_max_model_length - max_completion_length


def test_dpo_trl_axolotl_and_llamafactory_agree(qwen7b, tmp_path):
    written = export_plan(qwen7b, DPO_LORA, tmp_path)
    verdicts = {}
    for fmt in ("trl", "axolotl", "llamafactory"):
        r = _check(written[fmt])
        assert r.plan.task == "dpo" and r.plan.seq_len == 2048
        (phases,) = _by_check(r, "memory.phases")
        assert phases.data["step_peak_phase"] == "train"  # DPO's reference forward runs inside the step
        verdicts[fmt] = (r.verdict, r.report.run_peak_bytes)
    assert len(set(verdicts.values())) == 1, verdicts
    assert verdicts["trl"][0] == "GO"


def test_axolotl_grpo_is_read_and_checked(qwen7b, tmp_path):
    path = export_plan(qwen7b, GRPO_VLLM, tmp_path, ["axolotl"])["axolotl"]
    r = _check(path)
    assert r.plan.task == "grpo" and r.plan.generation == "vllm-colocate" and r.plan.max_prompt_length == 256
    assert r.verdict == "GO" and _by_check(r, "memory.phases")


def test_an_sft_learning_rate_in_a_grpo_config_is_risky(qwen7b, tmp_path):
    path = export_plan(qwen7b, GRPO_VLLM, tmp_path, ["trl"])["trl"]
    cfg = yaml.safe_load(path.read_text())
    cfg["learning_rate"] = 2e-3
    path.write_text(yaml.safe_dump(cfg))
    r = _check(path)
    assert r.verdict == "RISKY" and _by_check(r, "config.learning-rate")


@pytest.mark.slow
def test_the_simulation_answers_a_grpo_preflight_too(qwen7b, tmp_path):
    path = export_plan(qwen7b, GRPO_VLLM, tmp_path, ["trl"])["trl"]
    sim = _check(path, backend="simulate")
    est = _check(path)
    assert sim.extra["backend"] == "simulate" and sim.report.source == "simulated"
    assert sim.verdict == est.verdict == "GO"
    (phases,) = _by_check(sim, "memory.phases")
    assert {"generate", "score", "train"} <= set(phases.data["phases"])
    assert sim.report.run_peak_bytes == pytest.approx(est.report.run_peak_bytes, rel=0.15)
