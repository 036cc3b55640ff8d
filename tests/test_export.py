"""Exports load with the classes they are written for, and train.py trains one real step on the CPU.

advisor.yaml's sections go through BitsAndBytesConfig / LoraConfig / TrainingArguments;
deepspeed.json through DeepSpeed's own DeepSpeedConfig (pydantic, unknown ZeRO keys refused) and
transformers' HfTrainerDeepSpeedConfig consistency check; train.py runs in a subprocess against a
2-layer Qwen2 model and a byte-level BPE tokenizer built here (nothing downloaded).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.configs._base import training_hyperparameters
from advisor.configs.export import EXPORTERS, FILENAMES, export_plan, export_sections
from advisor.configs._deepspeed import PREFETCH_BUCKET_SIZE, REDUCE_BUCKET_SIZE
from advisor.core.plan import Plan
from export_runs import run_export_script  # tests/export_runs.py

ROOT = Path(__file__).resolve().parents[1]

PLANS = {
    "qlora-seed": Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit",
                       grad_accum=8, gradient_checkpointing=True, lora_r=16, lora_alpha=32.0),
    "lora-int8-all": Plan(method="lora", quantization="int8", lora_targets="all-linear", optimizer="adamw_8bit",
                          attn_impl="eager", precision="fp16", lora_alpha=12.5),
    "full-mixed-zero2": Plan(method="full", precision="mixed_bf16", offload="zero2_cpu", micro_batch=2, grad_accum=4,
                             loss="fused-linear", attn_impl="flash_attention_2"),
    "lora-dora-packed-chunked": Plan(method="lora", lora_targets="all-linear", dora=True, packing=True, loss="chunked"),
    "full-bf16-zero3": Plan(method="full", precision="bf16", offload="zero3_cpu", gradient_checkpointing=True),
    "qlora-fp4-zero2-fp16": Plan(method="qlora", quantization="fp4", compute_dtype="fp16", precision="mixed_fp16",
                                 offload="zero2_cpu", seq_len=4096),
    "full-fp32": Plan(method="full", precision="fp32", optimizer="sgd", attn_impl="eager"),
    "lora-eval-batch": Plan(method="lora", eval_batch=4),
}


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("qwen7b")


def _cpu_kwargs():
    import torch

    return {} if torch.cuda.is_available() else {"use_cpu": True}


# --------------------------------------------------------------------------- advisor.yaml


@pytest.mark.parametrize("name", sorted(PLANS))
def test_advisor_yaml_sections_build_their_classes(name, qwen7b, tmp_path):
    import torch
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments

    plan = PLANS[name]
    written = export_plan(qwen7b, plan, tmp_path, ["advisor"], extra={"peak_bytes": 3 * 2**30, "source": "simulated"})
    text = written["advisor"].read_text()
    assert text.startswith("# advisor.yaml - written by vram-advisor")
    assert f"python {tmp_path.resolve() / 'train.py'} --data" in text  # by a path that resolves from any cwd
    cfg = yaml.safe_load(text)
    assert set(cfg) == {"model", "quantization", "lora", "training", "deepspeed", "advisor"}

    m = cfg["model"]
    assert m["name_or_path"] == "Qwen/Qwen2.5-7B-Instruct" and m["catalog_name"] == "qwen2.5-7b-instruct"
    assert m["attn_implementation"] == plan.attn_impl and m["trust_remote_code"] is False
    assert isinstance(getattr(torch, m["torch_dtype"]), torch.dtype)

    q = cfg["quantization"]
    if plan.quantization == "none":
        assert q is None
    else:
        bnb = BitsAndBytesConfig(**q)
        assert bnb.load_in_4bit == plan.four_bit and bnb.load_in_8bit == (plan.quantization == "int8")
        if plan.four_bit:
            assert bnb.bnb_4bit_quant_type == plan.quantization
            assert bnb.bnb_4bit_use_double_quant == plan.double_quant
            assert bnb.bnb_4bit_compute_dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[plan.compute_dtype]

    lo = cfg["lora"]
    if not plan.peft:
        assert lo is None
    else:
        lc = LoraConfig(**lo)
        assert lc.r == plan.lora_r and lc.lora_alpha == plan.lora_alpha and lc.lora_dropout == plan.lora_dropout
        assert lc.task_type == "CAUSAL_LM"
        expected = plan.lora_targets if isinstance(plan.lora_targets, str) else set(plan.lora_targets)
        assert lc.target_modules == expected

    t = dict(cfg["training"], output_dir=str(tmp_path / "out"))
    if t["deepspeed"]:
        t["deepspeed"] = str(tmp_path / t["deepspeed"])
        export_plan(qwen7b, plan, tmp_path, ["deepspeed"])
    args = TrainingArguments(**t, **_cpu_kwargs())
    assert args.per_device_train_batch_size == plan.micro_batch
    assert args.per_device_eval_batch_size == (plan.eval_batch or 8)  # 8: TrainingArguments' default
    assert args.gradient_accumulation_steps == plan.grad_accum
    assert args.gradient_checkpointing == plan.gradient_checkpointing
    assert str(args.optim.value) == plan.optimizer
    assert args.bf16 == (plan.precision in ("bf16", "mixed_bf16"))
    assert args.fp16 == (plan.precision in ("fp16", "mixed_fp16"))
    hp = training_hyperparameters(plan)
    assert args.learning_rate == hp["learning_rate"] and args.max_grad_norm == hp["max_grad_norm"]
    if plan.optimizer.startswith(("adamw", "paged_adamw")) and not plan.optimizer_in_backward:
        assert args.learning_rate == (2e-5 if plan.method == "full" else 2e-4) and args.max_grad_norm == 1.0

    adv = cfg["advisor"]
    assert adv["max_seq_length"] == plan.seq_len and adv["chunked_ce"] == plan.chunked_ce
    assert Plan.from_dict(adv["plan"]) == plan
    assert adv["prediction"] == {"peak_bytes": 3 * 2**30, "source": "simulated"}
    assert export_sections(qwen7b, plan, extra={"peak_bytes": 3 * 2**30, "source": "simulated"},
                           out_dir=tmp_path) == cfg


# --------------------------------------------------------------------------- deepspeed.json


def _walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def _deepspeed_top_level_keys() -> set[str]:
    """Every config key DeepSpeed's runtime declares as a constant (deepspeed/runtime/constants.py etc.)."""
    import deepspeed.runtime.constants as c
    import deepspeed.runtime.zero.config as z

    keys = {v for mod in (c, z) for k, v in vars(mod).items() if k.isupper() and isinstance(v, str)}
    return keys


@pytest.mark.parametrize("name", ["full-mixed-zero2", "full-bf16-zero3", "qlora-fp4-zero2-fp16"])
def test_deepspeed_json_validates_with_deepspeed(name, qwen7b, tmp_path):
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments

    plan = PLANS[name]
    written = export_plan(qwen7b, plan, tmp_path, ["advisor", "deepspeed"])
    ds = json.loads(written["deepspeed"].read_text())
    assert "auto" not in list(_walk(ds)), "the file must run standalone: no 'auto' values"
    assert set(ds) <= _deepspeed_top_level_keys()

    cfg = DeepSpeedConfig(ds)  # DeepSpeed's own parser: pydantic, unknown ZeRO keys are errors
    zero = cfg.zero_config
    assert int(zero.stage) == {"zero2_cpu": 2, "zero3_cpu": 3}[plan.offload]
    assert zero.offload_optimizer.device == "cpu" and zero.offload_optimizer.pin_memory
    if plan.offload == "zero3_cpu":
        assert zero.offload_param.device == "cpu" and zero.offload_param.pin_memory
        assert zero.prefetch_bucket_size == PREFETCH_BUCKET_SIZE == 5e7
    else:
        assert zero.offload_param is None
    assert zero.reduce_bucket_size == REDUCE_BUCKET_SIZE == 2e8
    assert cfg.train_micro_batch_size_per_gpu == plan.micro_batch
    assert cfg.gradient_accumulation_steps == plan.grad_accum
    assert cfg.train_batch_size == plan.micro_batch * plan.grad_accum  # one GPU
    assert cfg.bfloat16_config.enabled == (plan.activation_dtype == "bf16")
    assert cfg.float16_config.enabled == (plan.activation_dtype == "fp16")

    # Under the HF Trainer the concrete values must agree with TrainingArguments (transformers checks).
    t = yaml.safe_load(written["advisor"].read_text())["training"]
    t.update(output_dir=str(tmp_path / "out"), deepspeed=str(tmp_path / t["deepspeed"]))
    args = TrainingArguments(**t, **_cpu_kwargs())
    assert args.hf_deepspeed_config.mismatches == []
    t["per_device_train_batch_size"] = plan.micro_batch + 1  # an edit to one file only is caught
    edited = TrainingArguments(**t, **_cpu_kwargs())
    assert any("per_device_train_batch_size" in m for m in edited.hf_deepspeed_config.mismatches)


def test_deepspeed_section_equals_json_file(qwen7b, tmp_path):
    plan = PLANS["full-bf16-zero3"]
    written = export_plan(qwen7b, plan, tmp_path)
    assert yaml.safe_load(written["advisor"].read_text())["deepspeed"] == json.loads(written["deepspeed"].read_text())


# --------------------------------------------------------------------------- registry


def test_export_all_formats_skips_what_a_format_cannot_express(qwen7b, tmp_path):
    written = export_plan(qwen7b, PLANS["full-mixed-zero2"], tmp_path)
    assert set(written) == {"advisor", "deepspeed", "train", "llamafactory", "trl"}
    assert "mixed_bf16" in written.skipped["axolotl"]
    for fmt, path in written.items():
        assert path == tmp_path / FILENAMES[fmt] and path.is_file()

    written = export_plan(qwen7b, PLANS["qlora-seed"], tmp_path / "q")
    assert set(written) == {"advisor", "train", "axolotl", "llamafactory", "trl"}
    assert "runs without DeepSpeed" in written.skipped["deepspeed"]
    assert set(EXPORTERS) == set(written) | set(written.skipped)


def test_export_named_formats(qwen7b, tmp_path):
    written = export_plan(qwen7b, PLANS["qlora-seed"], tmp_path, ["train"])
    assert set(written) == {"advisor", "train"}  # train.py needs advisor.yaml beside it
    written = export_plan(qwen7b, PLANS["full-mixed-zero2"], tmp_path / "z", ["llamafactory"])
    assert set(written) == {"llamafactory", "deepspeed"}  # it names deepspeed.json
    with pytest.raises(AdvisorInputError, match="pure_bf16 with DeepSpeed ZeRO-3"):
        export_plan(qwen7b, PLANS["full-bf16-zero3"], tmp_path / "z3", ["llamafactory"])
    with pytest.raises(ConfigErrors) as e:  # both asked for, both impossible: both reported
        export_plan(qwen7b, PLANS["lora-int8-all"], tmp_path / "x", ["axolotl", "llamafactory", "deepspeed"])
    wheres = [err.where for err in e.value.errors]
    assert wheres == ["--format axolotl", "--format llamafactory", "--format deepspeed"]
    with pytest.raises(AdvisorInputError, match="unknown format"):
        export_plan(qwen7b, PLANS["qlora-seed"], tmp_path, ["axolotl", "unsloth"])
    with pytest.raises(AdvisorInputError):  # an invalid plan is refused before anything is written
        export_plan(qwen7b, Plan(method="qlora", quantization="none"), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_train_py_is_the_template_verbatim(qwen7b, tmp_path):
    from importlib import resources

    written = export_plan(qwen7b, PLANS["qlora-seed"], tmp_path, ["train"])
    template = resources.files("advisor.configs.export.templates").joinpath("train.py").read_bytes()
    assert written["train"].read_bytes() == template
    assert os.access(written["train"], os.X_OK)


# --------------------------------------------------------------------------- a real step on the CPU


# tiny_model: tests/conftest.py


RUNS = {
    # the seeds' QLoRA recipe, shrunk: nf4 + double quant, paged 8-bit AdamW, checkpointing, 2 x 2 accumulation
    "qlora": Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit", micro_batch=2,
                  grad_accum=2, gradient_checkpointing=True, seq_len=32),
    # full fine-tune, fp32 masters, ZeRO-2 offload (dropped on the CPU), chunked loss, flash-attn (→ sdpa)
    "full-zero2-chunked": Plan(method="full", precision="mixed_bf16", offload="zero2_cpu", loss="chunked",
                               micro_batch=2, seq_len=32, gradient_checkpointing=True,
                               attn_impl="flash_attention_2"),
    # LoRA on an LLM.int8 base, every linear, 8-bit AdamW, eager attention
    "lora-int8": Plan(method="lora", quantization="int8", lora_targets="all-linear", optimizer="adamw_8bit",
                      attn_impl="eager", seq_len=24, lora_r=4, lora_alpha=8.0),
    # DoRA on every linear, packed documents (position_ids per document), fused-linear loss (Liger: off on the CPU)
    "dora-packed-fused": Plan(method="lora", lora_targets="all-linear", dora=True, packing=True, loss="fused-linear",
                              micro_batch=2, seq_len=32, lora_r=4, lora_alpha=8.0),
    # issue 15: fused AdamW, one checkpointed layer (every_n_layers), its input offloaded to host memory
    "full-fused-ckpt1-offload": Plan(method="full", optimizer="adamw_torch_fused", gradient_checkpointing=True,
                                     checkpoint_layers=1, activation_offload=True, seq_len=32),
    # LoRA, the optimizer step inside backward (per-parameter AdamW), activations offloaded without checkpointing
    "lora-in-bwd-offload": Plan(method="lora", optimizer="adamw_torch_fused", optimizer_in_backward=True,
                                activation_offload=True, seq_len=32),
    # GaLore (rank 4, a projection update every 2 steps) and LOMO, the TrainingArguments names
    "full-galore": Plan(method="full", optimizer="galore_adamw", optim_rank=4, optim_proj_gap=2, seq_len=32),
    "full-lomo": Plan(method="full", optimizer="lomo", gradient_checkpointing=True, seq_len=32),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_train_py_runs_one_step_on_cpu(name, tiny_model, qwen7b, tmp_path):
    plan = RUNS[name]
    # Exported for the catalog's Qwen2.5-7B (what tune would write); --model-path points at the tiny copy.
    written = export_plan(qwen7b, plan, tmp_path / "export", ["train"])
    proc, s = run_export_script(written["train"], "--data", str(tiny_model / "data.jsonl"), "--max-steps", "1",
                         "--model-path", str(tiny_model), "--output-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"]) and s["train_loss"] > 0
    assert s["device"] == "cpu" and s["seq_len"] == plan.seq_len and s["chunked_ce"] == plan.chunked_ce
    out = proc.stdout
    assert "no CUDA GPU: bf16/fp16 autocast off" in out or plan.precision == "fp32"
    assert f"block(s) of {plan.seq_len} tokens; micro batch {plan.micro_batch}, accumulation {plan.grad_accum}" in out
    if plan.four_bit:
        assert s["linear4bit_modules"] > 0
    if plan.quantization == "int8":
        assert s["linear8bit_modules"] > 0
    assert s["loss"] == plan.loss and s["packing"] == plan.packing and s["liger"] is False
    if plan.loss == "fused-linear":
        assert "Liger's fused linear cross-entropy off" in out
    if plan.peft:
        assert s["lora_modules"] > 0
        n_targets = 7 if plan.lora_targets == "all-linear" else len(plan.lora_targets)
        assert s["lora_modules"] == 2 * n_targets  # two decoder layers
    else:
        assert s["lora_modules"] == 0 and s["trainable_params"] > 20_000
    if plan.optimizer in ("paged_adamw_8bit", "adamw_8bit"):
        assert s["optimizer"].startswith("bitsandbytes.optim")
    if plan.offload != "none":
        assert "DeepSpeed ZeRO offload skipped" in out
    if plan.attn_impl == "flash_attention_2":
        assert "sdpa instead of flash_attention_2" in out
    if plan.checkpoint_layers is not None:
        assert "checkpointing 1 of 2 decoder layers" in out
    if plan.optimizer_in_backward:
        assert s["optimizer"].endswith("LayerWiseDummyOptimizer")
    if plan.optimizer in ("galore_adamw", "lomo"):
        assert s["optimizer"] in ("galore_torch.adamw.AdamW", "lomo_optim.lomo.Lomo")
    assert (tmp_path / "ckpt").is_dir()  # saved


def test_chunked_loss_equals_the_models_own_loss(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.configs.export.templates.train import chunked_causal_lm_loss

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :5] = -100  # masked positions are left out of the mean, as in transformers
    ref = model(input_ids=ids, labels=labels).loss
    ref_grad = torch.autograd.grad(ref, model.lm_head.weight)[0]
    mine = chunked_causal_lm_loss(model, ids, torch.ones_like(ids), labels, chunk_tokens=7)  # 36 positions, 6 chunks
    mine_grad = torch.autograd.grad(mine, model.lm_head.weight)[0]
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine_grad, ref_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["lomo", "adalomo", "sgd", "galore_adamw"])
def test_an_optimizer_that_changes_dynamics_exports_its_sources_hyperparameters(tmp_path, qwen7b, optimizer):
    """LOMO, AdaLomo, SGD, GaLore: the exported run trains with the learning rate and clipping their sources
    used (advisor/data/quality.yaml hyperparameters), and every format's header says why they differ."""
    from advisor.search.quality import recommended_hyperparameters

    plan = Plan(method="full", optimizer=optimizer, precision="bf16")
    rec = recommended_hyperparameters(plan)
    paths = export_plan(qwen7b, plan, tmp_path)
    cfg = yaml.safe_load(paths["advisor"].read_text())
    assert cfg["training"]["learning_rate"] == rec["learning_rate"] != 2e-5
    assert cfg["training"]["max_grad_norm"] == rec["max_grad_norm"]
    for fmt, path in paths.items():
        if fmt in ("advisor", "axolotl", "llamafactory", "trl"):
            text = path.read_text()
            assert "changes training dynamics" in text and "source:" in text, fmt
    if optimizer == "galore_adamw":
        assert "scale=4.0" in cfg["training"]["optim_args"]
