"""axolotl.yaml: the plan as an axolotl config (``axolotl train axolotl.yaml``).

Field names and types from axolotl 0.19's config schema, ``src/axolotl/utils/schemas/``:
``model.py`` (base_model, trust_remote_code, output_dir), ``peft.py`` LoraConfig (adapter,
load_in_8bit, load_in_4bit, lora_r, lora_alpha: int, lora_dropout, lora_target_modules,
lora_target_linear, bnb_config_kwargs), ``training.py`` (micro_batch_size,
gradient_accumulation_steps, learning_rate, optimizer, lr_scheduler, num_epochs), ``config.py``
(sequence_len, pad_to_sequence_len, bf16, fp16, tf32, gradient_checkpointing,
gradient_checkpointing_kwargs, attn_implementation, chunked_cross_entropy, deepspeed, max_steps,
warmup_steps, logging_steps, save_steps, val_set_size); the documented reference is
docs/config-reference.qmd in axolotl-ai-cloud/axolotl. tests/test_export_thirdparty.py validates
the output with ``AxolotlInputConfig`` when axolotl is importable, and always against the field
list in tests/data/axolotl_fields.txt.

What axolotl cannot express, and so is refused rather than approximated: fp32 master weights
under autocast (``bf16: true`` loads the weights in bf16: axolotl's precision is the Plan's pure
bf16/fp16), and a non-integer lora_alpha. The 4-bit compute dtype goes through
``bnb_config_kwargs`` (axolotl merges it into its BitsAndBytesConfig after setting its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.export._levers import axolotl_fields
from advisor.configs.export._base import (ADAM, DEEPSPEED_FILE, LEARNING_RATE, LR_SCHEDULER, TORCH_DTYPE, WARMUP_STEPS,
                                  ExportContext, Unsupported, comment_block, dump_yaml, env_note, env_prefix,
                                  plan_summary,
                                  require_int_alpha, write_text)

FILENAME = "axolotl.yaml"
FORMAT = "axolotl"


def axolotl_config(ctx: ExportContext) -> dict[str, Any]:
    plan = ctx.plan
    if plan.precision.startswith("mixed"):
        raise Unsupported(FORMAT, f"axolotl loads the weights in the autocast dtype; it has no {plan.precision} "
                          "(fp32 weights with 16-bit autocast)")
    alpha = require_int_alpha(FORMAT, plan)
    cfg: dict[str, Any] = {
        "base_model": ctx.model_id,
        "trust_remote_code": False,
        "load_in_8bit": plan.quantization == "int8",
        "load_in_4bit": plan.four_bit,
    }
    if plan.peft:
        cfg["adapter"] = plan.method  # lora | qlora
        if plan.four_bit:
            cfg["bnb_config_kwargs"] = {
                "bnb_4bit_quant_type": plan.quantization,
                "bnb_4bit_use_double_quant": bool(plan.double_quant),
                "bnb_4bit_compute_dtype": TORCH_DTYPE[plan.compute_dtype],
            }
        cfg["lora_r"] = plan.lora_r
        cfg["lora_alpha"] = alpha
        cfg["lora_dropout"] = float(plan.lora_dropout)
        if plan.lora_targets == "all-linear":
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = list(plan.lora_targets)
    cfg.update({
        "datasets": [{"path": "data.jsonl", "ds_type": "json", "type": "completion", "field": "text"}],
        "val_set_size": 0.0,
        "output_dir": "./outputs",
        "sequence_len": plan.seq_len,
        "pad_to_sequence_len": True,
        "sample_packing": bool(plan.packing),
        "micro_batch_size": plan.micro_batch,
        **({"eval_batch_size": plan.eval_batch} if plan.eval_batch else {}),
        "gradient_accumulation_steps": plan.grad_accum,
        "num_epochs": 1.0,
        "optimizer": plan.optimizer,
        "learning_rate": LEARNING_RATE[plan.method],
        "lr_scheduler": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        "weight_decay": ADAM["weight_decay"],
        "max_grad_norm": ADAM["max_grad_norm"],
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "tf32": False,
        "gradient_checkpointing": bool(plan.gradient_checkpointing),
    })
    if plan.gradient_checkpointing:
        cfg["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    cfg["attn_implementation"] = plan.attn_impl
    cfg.update(_lever_fields(plan))
    if plan.offload != "none":
        cfg["deepspeed"] = DEEPSPEED_FILE
    cfg["logging_steps"] = 10
    cfg["save_steps"] = 500
    cfg.update(axolotl_fields(plan, ctx.spec))
    return cfg


LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"


def _lever_fields(plan) -> dict[str, Any]:
    """The loss and DoRA: chunked_cross_entropy; Liger's plugin with only its fused linear cross-entropy
    (src/axolotl/integrations/liger/README.md: plugins, liger_fused_linear_cross_entropy); peft_use_dora."""
    out: dict[str, Any] = {}
    if plan.loss == "chunked":
        out["chunked_cross_entropy"] = True
    elif plan.loss == "fused-linear":
        out["plugins"] = [LIGER_PLUGIN]
        out["liger_fused_linear_cross_entropy"] = True
    if plan.dora:
        out["peft_use_dora"] = True
    return out


def write(ctx: ExportContext, out_dir: Path) -> Path:
    cfg = axolotl_config(ctx)
    header = comment_block([
        "axolotl config written by vram-advisor.",
        *plan_summary(ctx),
        "",
        f"Run:  {env_prefix(ctx.plan)}axolotl train axolotl.yaml",
        *env_note(ctx.plan, "axolotl.yaml"),
        "Replace `datasets` with yours (here: data.jsonl, one {\"text\": ...} per line). pad_to_sequence_len",
        "keeps every batch at sequence_len tokens, the length the memory plan was sized for.",
        *(["deepspeed.json (ZeRO CPU offload) must sit next to this file."] if ctx.plan.offload != "none" else []),
    ])
    return write_text(out_dir / FILENAME, dump_yaml(cfg, header))
