"""llamafactory.yaml: the plan as a LLaMA-Factory training config (``llamafactory-cli train``).

Field names from LLaMA-Factory 0.9.5 (hiyouga/LLaMA-Factory): the layout of
examples/train_qlora/llama3_lora_sft_otfq.yaml and examples/train_lora/llama3_lora_sft.yaml
(model_name_or_path, quantization_bit, quantization_method, stage, do_train, finetuning_type,
lora_target, dataset, template, cutoff_len, output_dir, per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, lr_scheduler_type, bf16, ...), and the argument
dataclasses in src/llamafactory/hparams/: model_args.py (quantization_type: nf4|fp4,
double_quantization, flash_attn: auto|disabled|sdpa|fa2, disable_gradient_checkpointing,
enable_liger_kernel, trust_remote_code), finetuning_args.py (lora_rank, lora_alpha: int,
lora_dropout, lora_target "all" or comma-separated, pure_bf16), data_args.py (cutoff_len) and
transformers' TrainingArguments (optim, deepspeed, ...). tests/test_export_thirdparty.py parses
the output with LLaMA-Factory's own HfArgumentParser when it is importable, and always against
tests/data/llamafactory_fields.txt.

LLaMA-Factory semantics the mapping follows (src/llamafactory/model/adapter.py, parser.py):
gradient checkpointing is on unless ``disable_gradient_checkpointing``; weights load in the
autocast dtype; trainable parameters are upcast to fp32 unless ``pure_bf16``; the 4-bit compute
dtype is the autocast dtype. Hence full + ``bf16: true`` is the Plan's mixed_bf16, full +
``pure_bf16`` its bf16, LoRA + ``bf16: true`` its bf16 (fp32 adapters, as peft keeps them). Refused:
fp32 training (LLaMA-Factory picks a 16-bit dtype itself), LoRA over fp32 base weights, a compute
dtype other than the autocast dtype, a non-integer lora_alpha, pure_bf16 with ZeRO-3.
The fused-linear loss maps to ``enable_liger_kernel`` (Liger's fused linear cross-entropy never
holds all logits; it also swaps in Liger's RMSNorm/SwiGLU/RoPE kernels, which only lower the memory
the plan was sized for); the chunked loss has no LLaMA-Factory field and is refused. DoRA is
``use_dora``; packing is ``packing`` with ``neat_packing`` (no attention across packed documents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.export._levers import llamafactory_fields
from advisor.configs.export._base import (DEEPSPEED_FILE, LEARNING_RATE, LR_SCHEDULER, WARMUP_STEPS, ExportContext,
                                  Unsupported, comment_block, dump_yaml, env_note, env_prefix, plan_summary,
                                  require_int_alpha, write_text)

FILENAME = "llamafactory.yaml"
FORMAT = "llamafactory"

FLASH_ATTN = {"sdpa": "sdpa", "eager": "disabled", "flash_attention_2": "fa2"}


def precision_flags(plan) -> dict[str, bool]:
    """bf16 / fp16 / pure_bf16 for the plan, or Unsupported."""
    p = plan.precision
    if plan.method == "full":
        table = {"mixed_bf16": {"bf16": True}, "mixed_fp16": {"fp16": True},
                 "bf16": {"bf16": True, "pure_bf16": True}}
    else:
        table = {"bf16": {"bf16": True}, "fp16": {"fp16": True}}
    if p not in table:
        raise Unsupported(FORMAT, f"LLaMA-Factory has no {p} for {plan.method} (it loads weights in the autocast "
                          "dtype and picks a 16-bit dtype itself)")
    flags = {"bf16": False, "fp16": False, "pure_bf16": False, **table[p]}
    if flags["pure_bf16"] and plan.offload == "zero3_cpu":
        raise Unsupported(FORMAT, "LLaMA-Factory refuses pure_bf16 with DeepSpeed ZeRO-3")
    if plan.quantized and plan.four_bit and plan.compute_dtype != plan.activation_dtype:
        raise Unsupported(FORMAT, f"LLaMA-Factory's 4-bit compute dtype is the autocast dtype "
                          f"({plan.activation_dtype}), not {plan.compute_dtype}")
    return flags


def llamafactory_config(ctx: ExportContext) -> dict[str, Any]:
    plan = ctx.plan
    flags = precision_flags(plan)
    alpha = require_int_alpha(FORMAT, plan)
    cfg: dict[str, Any] = {"model_name_or_path": ctx.model_id, "trust_remote_code": False}
    if plan.quantized:
        cfg["quantization_bit"] = 8 if plan.quantization == "int8" else 4
        cfg["quantization_method"] = "bnb"
        if plan.four_bit:
            cfg["quantization_type"] = plan.quantization
            cfg["double_quantization"] = bool(plan.double_quant)
    cfg["flash_attn"] = FLASH_ATTN[plan.attn_impl]
    cfg["disable_gradient_checkpointing"] = not plan.gradient_checkpointing
    if plan.loss == "chunked":
        raise Unsupported(FORMAT, "LLaMA-Factory has no chunked loss: use --loss fused-linear (enable_liger_kernel)")
    if plan.loss == "fused-linear":
        cfg["enable_liger_kernel"] = True
    cfg.update({"stage": "sft", "do_train": True, "finetuning_type": "lora" if plan.peft else "full"})
    if plan.peft:
        cfg["lora_rank"] = plan.lora_r
        cfg["lora_alpha"] = alpha
        cfg["lora_dropout"] = float(plan.lora_dropout)
        cfg["lora_target"] = "all" if plan.lora_targets == "all-linear" else ",".join(plan.lora_targets)
        if plan.dora:
            cfg["use_dora"] = True
    if flags["pure_bf16"]:
        cfg["pure_bf16"] = True
    cfg.update({
        "dataset": "alpaca_en_demo",
        "template": "default",
        "cutoff_len": plan.seq_len,
        **({"packing": True, "neat_packing": True} if plan.packing else {}),
        "output_dir": "saves/advisor",
        "logging_steps": 10,
        "save_steps": 500,
        "per_device_train_batch_size": plan.micro_batch,
        **({"per_device_eval_batch_size": plan.eval_batch} if plan.eval_batch else {}),
        "gradient_accumulation_steps": plan.grad_accum,
        "optim": plan.optimizer,
        "learning_rate": LEARNING_RATE[plan.method],
        "num_train_epochs": 1.0,
        "lr_scheduler_type": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        "bf16": flags["bf16"],
        "fp16": flags["fp16"],
        "report_to": "none",
    })
    if plan.offload != "none":
        cfg["deepspeed"] = DEEPSPEED_FILE
    cfg.update(llamafactory_fields(plan, ctx.spec))
    return cfg


def write(ctx: ExportContext, out_dir: Path) -> Path:
    cfg = llamafactory_config(ctx)
    header = comment_block([
        "LLaMA-Factory config written by vram-advisor.",
        *plan_summary(ctx),
        "",
        f"Run:  {env_prefix(ctx.plan)}llamafactory-cli train llamafactory.yaml"
        + ("   (with FORCE_TORCHRUN=1 for DeepSpeed)" if ctx.plan.offload != "none" else ""),
        "Set `dataset` (a name in your data/dataset_info.json) and `template` (the model's chat",
        "template, e.g. qwen for Qwen2.5, llama3 for Llama 3). cutoff_len is the sequence length the",
        "memory plan was sized for; longer examples are cut to it.",
        *(["deepspeed.json (ZeRO CPU offload) must sit next to this file."] if ctx.plan.offload != "none" else []),
        *env_note(ctx.plan, "LLaMA-Factory's YAML"),
    ])
    return write_text(out_dir / FILENAME, dump_yaml(cfg, header))
