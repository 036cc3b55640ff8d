"""The TRL export: trl.yaml parsed by TRL's own parser into a real SFTConfig and ModelConfig, the
mapping refused where TRL cannot express a plan, and train_trl.py running one real SFTTrainer step on
the CPU with a tiny model built here (tests/conftest.py tiny_model; nothing downloaded)."""

from __future__ import annotations

import math

import pytest
import yaml

pytest.importorskip("trl")

from advisor.configs.export import ExportContext, Unsupported, export_plan  # noqa: E402
from advisor.configs._trl import trl_config  # noqa: E402
from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from export_runs import run_export_script  # noqa: E402 (tests/export_runs.py)

PLANS = {
    "qlora": Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit",
                  gradient_checkpointing=True, grad_accum=4),
    "dora-packed-fused": Plan(method="lora", lora_targets="all-linear", dora=True, packing=True, loss="fused-linear",
                              micro_batch=2, seq_len=32, lora_r=4, lora_alpha=8.0),
    "full-zero2": Plan(method="full", precision="mixed_bf16", offload="zero2_cpu", attn_impl="flash_attention_2"),
    "lora-eval-batch": Plan(method="lora", eval_batch=4),
    "lora-rope-yarn": Plan(method="lora", gradient_checkpointing=True, seq_len=65536, rope_scaling="yarn:2"),
}


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("qwen7b")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_trl_yaml_parses_with_trls_own_parser(name, qwen7b, tmp_path, monkeypatch):
    from trl import ModelConfig, SFTConfig, TrlParser

    monkeypatch.chdir(tmp_path)  # trl sft runs beside its files (deepspeed: deepspeed.json)
    plan = PLANS[name]
    written = export_plan(qwen7b, plan, tmp_path, ["trl"])
    path = written["trl"]
    assert (tmp_path / "train_trl.py").is_file()
    if plan.offload != "none":
        assert "deepspeed" in written  # deepspeed.json comes along
    sft, model = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        args=["--config", str(path), "--output_dir", str(tmp_path / "out"), "--use_cpu", "True"])  # no GPU here
    assert isinstance(sft, SFTConfig) and isinstance(model, ModelConfig)
    assert sft.max_length == plan.seq_len and sft.packing == plan.packing
    assert sft.per_device_train_batch_size == plan.micro_batch
    assert sft.per_device_eval_batch_size == (plan.eval_batch or 8)  # 8: TrainingArguments' default
    assert sft.gradient_accumulation_steps == plan.grad_accum
    assert sft.gradient_checkpointing == plan.gradient_checkpointing and sft.optim == plan.optimizer
    assert model.use_peft == plan.peft and model.attn_implementation == plan.attn_impl
    if plan.peft:
        assert model.lora_r == plan.lora_r and model.use_dora == plan.dora
    assert model.load_in_4bit == plan.four_bit
    if plan.packing:
        assert sft.packing_strategy == "bfd"
    if plan.rope_scaling != "none":  # the model's config overrides, passed to from_pretrained
        assert sft.model_init_kwargs["rope_parameters"]["rope_type"] == "yarn"
        assert sft.model_init_kwargs["max_position_embeddings"] == 2 * qwen7b.max_position_embeddings


def test_trl_refuses_what_it_cannot_express(qwen7b):
    plan = Plan(method="qlora", quantization="nf4", compute_dtype="fp16", precision="bf16")
    with pytest.raises(Unsupported, match="compute dtype"):
        trl_config(ExportContext(qwen7b, plan))
    with pytest.raises(Unsupported, match="whole number"):
        trl_config(ExportContext(qwen7b, Plan(method="lora", lora_alpha=12.5)))


@pytest.mark.slow
def test_train_trl_runs_one_sfttrainer_step_on_cpu(tiny_model, qwen7b, tmp_path):
    plan = PLANS["dora-packed-fused"]
    export_plan(qwen7b, plan, tmp_path / "export", ["trl"])
    cfg = yaml.safe_load((tmp_path / "export" / "trl.yaml").read_text())
    assert cfg["use_dora"] is True and cfg["packing"] is True
    proc, s = run_export_script(tmp_path / "export" / "train_trl.py", "--data", str(tiny_model / "data.jsonl"),
                   "--max-steps", "1", "--model-path", str(tiny_model), "--output-dir", str(tmp_path / "ckpt"),
                   "--no-save", fresh=True)  # the one exported run in a fresh interpreter, as a user starts it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"]) and s["train_loss"] > 0
    assert s["device"] == "cpu" and s["max_length"] == plan.seq_len and s["packing"] is True
    assert s["lora_modules"] == 2 * 7 and s["dora_modules"] == 2 * 7  # two layers, all seven linears
    assert "no CUDA GPU: bf16/fp16 autocast off" in proc.stdout
