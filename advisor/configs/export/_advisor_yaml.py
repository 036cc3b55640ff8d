"""advisor.yaml: the plan in the field names of the classes that run it.

Sections (each is passed with ``**section`` by the exported train.py, so the names are exact):

- ``model``: ``name_or_path`` and ``torch_dtype`` / ``attn_implementation`` /
  ``trust_remote_code`` for ``AutoModelForCausalLM.from_pretrained``; ``catalog_name`` is the
  advisor's own name for the model (train.py does not pass it on).
- ``quantization``: ``transformers.BitsAndBytesConfig`` fields, or null.
- ``lora``: ``peft.LoraConfig`` fields, or null for a full fine-tune.
- ``training``: ``transformers.TrainingArguments`` fields.
- ``deepspeed``: the DeepSpeed config (also written to deepspeed.json, which
  ``training.deepspeed`` names), or null.
- ``advisor``: what the libraries have no field for (``max_seq_length``, ``loss``, ``packing``, ``env``: the
  environment the run needs, PYTORCH_CUDA_ALLOC_CONF for the allocator settings), the
  Plan itself, and the prediction it was chosen on.

Field names checked against transformers 5.x / peft 0.17+ by constructing the classes in
tests/test_export.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.export._levers import advisor_fields, training_arguments_fields
from advisor.configs.export._base import (ADAM, DEEPSPEED_FILE, LEARNING_RATE, LIGER_FUSED_LOSS_ONLY, LR_SCHEDULER,
                                          PRECISION_FLAGS,
                                  TORCH_DTYPE, WARMUP_STEPS, ExportContext, alloc_env, comment_block, dump_yaml, env_prefix,
                                  lora_alpha_value, plan_summary, write_text)

FILENAME = "advisor.yaml"
FORMAT_VERSION = 1


def model_section(ctx: ExportContext) -> dict[str, Any]:
    torch_dtype, _, _ = PRECISION_FLAGS[ctx.plan.precision]
    return {
        "name_or_path": ctx.model_id,
        "catalog_name": ctx.spec.name,
        "torch_dtype": torch_dtype,
        "attn_implementation": ctx.plan.attn_impl,
        "trust_remote_code": False,
    }


def quantization_section(plan) -> dict[str, Any] | None:
    if plan.quantization == "none":
        return None
    if plan.quantization == "int8":
        return {"load_in_8bit": True}
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": plan.quantization,
        "bnb_4bit_use_double_quant": bool(plan.double_quant),
        "bnb_4bit_compute_dtype": TORCH_DTYPE[plan.compute_dtype],
    }


def lora_section(plan) -> dict[str, Any] | None:
    if not plan.peft:
        return None
    targets = plan.lora_targets if isinstance(plan.lora_targets, str) else list(plan.lora_targets)
    return {
        "r": plan.lora_r,
        "lora_alpha": lora_alpha_value(plan.lora_alpha),
        "lora_dropout": float(plan.lora_dropout),
        "target_modules": targets,
        "bias": "none",
        "task_type": "CAUSAL_LM",
        **({"use_dora": True} if plan.dora else {}),
    }


def training_section(plan, output_dir: str = "outputs") -> dict[str, Any]:
    _, bf16, fp16 = PRECISION_FLAGS[plan.precision]
    section: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": plan.micro_batch,
        **({"per_device_eval_batch_size": plan.eval_batch} if plan.eval_batch else {}),
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_checkpointing": bool(plan.gradient_checkpointing),
        "gradient_checkpointing_kwargs": {"use_reentrant": False} if plan.gradient_checkpointing else None,
        "optim": plan.optimizer,
        "bf16": bf16,
        "fp16": fp16,
        "learning_rate": LEARNING_RATE[plan.method],
        "lr_scheduler_type": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        **ADAM,
        "num_train_epochs": 1,
        "max_steps": -1,
        "logging_steps": 10,
        "save_steps": 500,
        "report_to": "none",
        "deepspeed": DEEPSPEED_FILE if plan.offload != "none" else None,
    }
    if plan.loss == "fused-linear":
        section["use_liger_kernel"] = True
        section["liger_kernel_config"] = dict(LIGER_FUSED_LOSS_ONLY)
    return section


def sections(ctx: ExportContext) -> dict[str, Any]:
    """The whole advisor.yaml as a dict (what the file holds, comments aside)."""
    from advisor.configs.export._deepspeed import deepspeed_config

    plan = ctx.plan
    advisor: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "max_seq_length": plan.seq_len,
        "loss": plan.loss,
        "chunked_ce": bool(plan.chunked_ce),  # read by train.py files written before the loss knob
        "packing": bool(plan.packing),
        **advisor_fields(plan, ctx.spec),
        "plan": plan.to_dict(),
    }
    if alloc_env(plan):
        advisor["env"] = alloc_env(plan)   # train.py sets these before torch starts CUDA
    if ctx.gpu is not None:
        advisor["gpu"] = {"key": ctx.gpu.key, "name": ctx.gpu.name, "memory_bytes": ctx.gpu.memory_bytes,
                          "bf16": ctx.gpu.bf16}
    if ctx.extra:
        advisor["prediction"] = _plain(ctx.extra)
    return {
        "model": model_section(ctx),
        "quantization": quantization_section(plan),
        "lora": lora_section(plan),
        "training": {**training_section(plan), **training_arguments_fields(plan, ctx.spec)},
        "deepspeed": deepspeed_config(plan) if plan.offload != "none" else None,
        "advisor": advisor,
    }


def _plain(value: Any) -> Any:
    """JSON/YAML-safe copy (tuples → lists, numbers and strings as they are, the rest as str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


HEADER = [
    "advisor.yaml - written by vram-advisor (advisor tune / advisor export).",
    "",
    "{summary}",
    "",
    "Run it:   python train.py --data my_data.jsonl           (JSONL with a \"text\" field, or a .txt)",
    "          python train.py --data d.jsonl --max-steps 100 --model-path /local/copy/of/the/model",
    "Check it: advisor preflight advisor.yaml --gpu-budget <GB>",
    "",
    "Each section is passed as **section to the class named beside it, so keys are those classes'",
    "field names. Edit freely: preflight re-reads these sections, not the advisor section below.",
    "  model         -> AutoModelForCausalLM.from_pretrained (catalog_name is the advisor's name)",
    "  quantization  -> transformers.BitsAndBytesConfig (null: weights not quantized)",
    "  lora          -> peft.LoraConfig (null: full fine-tuning)",
    "  training      -> transformers.TrainingArguments",
    "  deepspeed     -> DeepSpeed config, also in deepspeed.json (null: no ZeRO offload)",
    "  advisor       -> what those classes have no field for, the plan, and the prediction",
]


def write(ctx: ExportContext, out_dir: Path) -> Path:
    summary = "\n".join(plan_summary(ctx))
    lines = "\n".join(HEADER).replace("{summary}", summary).split("\n")
    if alloc_env(ctx.plan):
        env = env_prefix(ctx.plan).strip()
        lines = [ln.replace("python train.py", f"{env} python train.py") for ln in lines]
        lines.insert(lines.index("Check it: advisor preflight advisor.yaml --gpu-budget <GB>"),
                     f"          (train.py sets {env} itself from advisor.env; a value in the shell wins)")
    header = comment_block(lines)
    return write_text(out_dir / FILENAME, dump_yaml(sections(ctx), header))
