"""A plan sized for several GPUs exports as planned: each file launches one process per GPU, names the DeepSpeed
or FSDP config its sharding needs by a path that resolves from any directory, and advisor.yaml records the GPU
count and the sharding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from advisor.configs.export import export_plan
from advisor.configs.read import read_config
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan

LLAMA70B = "meta-llama/Llama-3.1-70B-Instruct"
ZERO3 = Plan(method="lora", lora_targets="all-linear", gradient_checkpointing=True, micro_batch=2)
QLORA = Plan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True,
             optimizer="paged_adamw_8bit")


def _header(path: Path) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))


def test_eight_gpu_zero3_plan_launches_eight_processes_under_zero3(tmp_path):
    out = tmp_path / "out"
    written = export_plan(resolve_model(LLAMA70B), ZERO3, out, gpu=resolve_gpu("h100-sxm"), gpus=8, sharding="zero3")
    here = out.resolve()
    assert {"advisor", "train", "deepspeed", "axolotl", "llamafactory", "trl"} <= set(written)
    ds = json.loads(written["deepspeed"].read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert "offload_param" not in ds["zero_optimization"] and "offload_optimizer" not in ds["zero_optimization"]
    assert ds["train_micro_batch_size_per_gpu"] == 2 and "train_batch_size" not in ds  # derived from the GPUs

    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["advisor"]["gpus"] == 8 and cfg["advisor"]["sharding"] == "zero3"
    assert cfg["advisor"]["launch"] == f"torchrun --nproc_per_node 8 {here / 'train.py'} --data my_data.jsonl"
    assert cfg["training"]["deepspeed"] == str(here / "deepspeed.json")
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 3
    head = _header(written["advisor"])
    assert f"Run it:   torchrun --nproc_per_node 8 {here / 'train.py'} --data my_data.jsonl" in head
    assert "GPUs: 8, one process each; sharding: DeepSpeed ZeRO-3" in head and "x 8" in head

    assert yaml.safe_load(written["axolotl"].read_text())["deepspeed"] == str(here / "deepspeed.json")
    assert f"accelerate launch --num_processes 8 -m axolotl.cli.train {here / 'axolotl.yaml'}" in _header(
        written["axolotl"])
    assert yaml.safe_load(written["llamafactory"].read_text())["deepspeed"] == str(here / "deepspeed.json")
    assert (f"FORCE_TORCHRUN=1 NNODES=1 NPROC_PER_NODE=8 llamafactory-cli train {here / 'llamafactory.yaml'}"
            in _header(written["llamafactory"]))
    assert yaml.safe_load(written["trl"].read_text())["deepspeed"] == str(here / "deepspeed.json")
    assert f"accelerate launch --num_processes 8 {here / 'train_trl.py'} --data my_data.jsonl" in _header(
        written["trl"])


def test_ddp_qlora_plan_launches_eight_processes_without_deepspeed(tmp_path):
    written = export_plan(resolve_model("qwen7b"), QLORA, tmp_path, gpus=8, sharding="ddp")
    here = tmp_path.resolve()
    assert "deepspeed" not in written and "runs without DeepSpeed" in written.skipped["deepspeed"]
    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["advisor"]["gpus"] == 8 and cfg["advisor"]["sharding"] == "ddp"
    assert cfg["advisor"]["launch"] == f"torchrun --nproc_per_node 8 {here / 'train.py'} --data my_data.jsonl"
    assert cfg["training"]["deepspeed"] is None and "fsdp" not in cfg["training"] and cfg["deepspeed"] is None
    assert "sharding: DDP" in _header(written["advisor"])
    for fmt in ("axolotl", "llamafactory", "trl"):
        assert "deepspeed" not in yaml.safe_load(written[fmt].read_text()), fmt
    assert "NPROC_PER_NODE=8 llamafactory-cli train" in _header(written["llamafactory"])
    assert "accelerate launch --num_processes 8 -m axolotl.cli.train" in _header(written["axolotl"])


def test_fsdp_plan_writes_the_trainer_fsdp_keys_and_the_tools_without_them_refuse(tmp_path):
    written = export_plan(resolve_model("qwen7b"), ZERO3, tmp_path, gpus=4, sharding="fsdp")
    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["training"]["fsdp"] == "full_shard auto_wrap" and cfg["training"]["fsdp_config"]["use_orig_params"]
    assert cfg["training"]["deepspeed"] is None and "deepspeed" not in written
    trl = yaml.safe_load(written["trl"].read_text())
    assert trl["fsdp"] == "full_shard auto_wrap"
    from transformers import TrainingArguments

    TrainingArguments(**{k: cfg["training"][k] for k in ("output_dir", "fsdp", "fsdp_config")})  # its own check
    for fmt in ("axolotl", "llamafactory"):
        assert "FSDP" in written.skipped[fmt]


def test_qlora_sharded_by_zero3_stores_its_4bit_weights_in_the_weights_dtype(tmp_path):
    from transformers import BitsAndBytesConfig

    written = export_plan(resolve_model("qwen7b"), QLORA, tmp_path, gpus=8, sharding="zero3")
    quant = yaml.safe_load(written["advisor"].read_text())["quantization"]
    assert quant["bnb_4bit_quant_storage"] == "bfloat16"
    BitsAndBytesConfig(**quant)
    assert yaml.safe_load(written["trl"].read_text())["bnb_4bit_quant_storage"] == "bfloat16"
    one = export_plan(resolve_model("qwen7b"), QLORA, tmp_path / "one")
    assert "bnb_4bit_quant_storage" not in yaml.safe_load(one["advisor"].read_text())["quantization"]


def test_one_gpu_plan_is_a_plain_python_launch(tmp_path):
    written = export_plan(resolve_model("qwen7b"), QLORA, tmp_path)
    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["advisor"]["gpus"] == 1 and cfg["advisor"]["sharding"] is None
    assert cfg["advisor"]["launch"] == f"python {tmp_path.resolve() / 'train.py'} --data my_data.jsonl"


def test_a_zero3_advisor_yaml_reads_back_from_another_directory(tmp_path):
    out = tmp_path / "out"
    written = export_plan(resolve_model(LLAMA70B), ZERO3, out, gpus=8, sharding="zero3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(elsewhere)
        for fmt in ("advisor", "axolotl", "llamafactory", "trl"):
            _, plan, extras = read_config(os.path.relpath(written[fmt]))
            assert plan.offload == "none" and plan.micro_batch == 2, fmt
            if fmt == "advisor":
                assert extras["gpus"] == 8 and extras["sharding"] == "zero3"
    finally:
        os.chdir(cwd)


def test_trl_parser_accepts_a_deepspeed_plan_from_another_directory(tmp_path):
    """TRL's own parser (TrlParser over SFTConfig + ModelConfig: what `trl sft --config` runs) opens the DeepSpeed
    config that trl.yaml names; run from a directory that is not the export's."""
    out = tmp_path / "out"
    plan = Plan(method="lora", offload="zero2_cpu", gradient_checkpointing=True)
    written = export_plan(resolve_model("qwen7b"), plan, out, ["trl"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = ("import sys\nfrom trl import ModelConfig, SFTConfig, TrlParser\n"
              "args, model = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(['--config', sys.argv[1],"
              " '--use_cpu', 'true'], fail_with_unknown_args=True)[:2]\n"
              "print('DS', type(args.hf_deepspeed_config).__name__ if getattr(args, 'hf_deepspeed_config', None)"
              " else args.deepspeed)\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", script, os.path.relpath(written["trl"], elsewhere)],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DS " in proc.stdout


@pytest.mark.parametrize("layers,every", [(14, 2)])
def test_trl_yaml_says_when_only_some_layers_are_checkpointed(tmp_path, layers, every):
    plan = Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=layers)
    written = export_plan(resolve_model("qwen7b"), plan, tmp_path)
    assert "axolotl" in written.skipped and "llamafactory" in written.skipped  # every layer or none
    cfg = yaml.safe_load(written["trl"].read_text())
    assert cfg["gradient_checkpointing"] is True
    assert cfg["gradient_checkpointing_kwargs"]["every_n_layers"] == every
    head = _header(written["trl"])
    assert f"gradient checkpointing: {layers} of 28 layers" in head and "not every layer" in head


def test_zero_on_the_gpus_runs_the_planned_optimizer(tmp_path):
    """Issue 42: deepspeed.json's optimizer block replaced the planned optim (paged_adamw_8bit, adamw_torch_fused...)
    with DeepSpeed's AdamW. ZeRO sharding on the GPUs writes no optimizer block, so the Trainer builds the planned one
    (and DeepSpeed is told to take an optimizer it has not tested with ZeRO); CPU offload keeps DeepSpeed's CPU Adam."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments

    written = export_plan(resolve_model(LLAMA70B), QLORA, tmp_path, ["advisor", "deepspeed"],
                          gpu=resolve_gpu("h100-sxm"), gpus=8, sharding="zero3")
    ds = json.loads(written["deepspeed"].read_text())
    assert "optimizer" not in ds and ds["zero_allow_untested_optimizer"] is True
    assert DeepSpeedConfig(ds).zero_allow_untested_optimizer
    training = yaml.safe_load(written["advisor"].read_text())["training"]
    assert training["optim"] == "paged_adamw_8bit"
    training.update(output_dir=str(tmp_path / "out"), deepspeed=str(written["deepspeed"]), use_cpu=True)
    assert TrainingArguments(**training).hf_deepspeed_config.mismatches == []
