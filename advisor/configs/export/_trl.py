"""trl.yaml + train_trl.py: the plan as a TRL ``SFTTrainer`` run (``trl sft --config trl.yaml``).

trl.yaml is flat, as TRL's own CLI reads it (``TrlParser`` over ``SFTConfig`` and ``ModelConfig``):
``SFTConfig`` keys (transformers ``TrainingArguments`` plus TRL's ``max_length``, ``packing``,
``packing_strategy``, ``padding_free``, ``dataset_text_field``, ``loss_type``; trl/trainer/sft_config.py)
and ``ModelConfig`` keys (``model_name_or_path``, ``dtype``, ``attn_implementation``, ``use_peft``,
``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``, ``use_dora``, ``load_in_4bit``,
``load_in_8bit``, ``bnb_4bit_quant_type``, ``use_bnb_nested_quant``; trl/trainer/model_config.py),
field names checked against trl 1.16 in tests/test_export_trl.py by TRL's own parser.

The mapping is a table, one row per key (``ROWS``): a row returns the value for a plan, ``SKIP`` when
the key does not apply, or raises ``Unsupported`` for what TRL cannot express. What TRL decides itself:

- the loss: TRL 1.16's ``SFTTrainer`` always computes it through its fused LM head
  (trl.trainer.utils.add_fused_lm_head: 4,096-token x 32,768-vocabulary tiles, no full logits), and it
  refuses Liger's fused linear cross-entropy (``liger_kernel_config={"fused_linear_cross_entropy": True}``
  raises). A plan sized for the plain or chunked loss therefore holds no more than it was sized for;
  the header says so.
- the 4-bit compute dtype is ``dtype`` (trl get_quantization_config): a different one is refused.
- packing: ``packing_strategy: bfd`` is padding-free (position_ids per document, flash-attention's
  varlen or a block-diagonal mask), the Plan's ``packing``; without it batches are padded to their
  longest sequence (DataCollatorForLanguageModeling).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Callable

from advisor.configs.export._base import (ADAM, DEEPSPEED_FILE, LEARNING_RATE, LR_SCHEDULER, PRECISION_FLAGS,
                                          TORCH_DTYPE, WARMUP_STEPS, ExportContext, Unsupported, comment_block,
                                          dump_yaml, plan_summary, require_int_alpha, write_text)

FILENAME = "trl.yaml"
SCRIPT = "train_trl.py"
FORMAT = "trl"
SKIP = object()
"""A row's value when its key does not apply to the plan (not written)."""


def _dtype(ctx: ExportContext) -> str:
    return PRECISION_FLAGS[ctx.plan.precision][0]


def _compute_dtype(ctx: ExportContext) -> Any:
    plan = ctx.plan
    if not plan.four_bit:
        return SKIP
    if TORCH_DTYPE[plan.compute_dtype] != _dtype(ctx):
        raise Unsupported(FORMAT, f"TRL's 4-bit compute dtype is the weights' dtype ({_dtype(ctx)}), "
                                  f"not {TORCH_DTYPE[plan.compute_dtype]}")
    return SKIP  # nothing to write: it follows dtype


def _peft(value: Callable[[Any], Any]) -> Callable[[ExportContext], Any]:
    return lambda ctx: value(ctx.plan) if ctx.plan.peft else SKIP


ROWS: list[tuple[str, Callable[[ExportContext], Any]]] = [
    # ModelConfig: the model, its dtype and attention, quantization, the adapters
    ("model_name_or_path", lambda ctx: ctx.model_id),
    ("dtype", _dtype),
    ("attn_implementation", lambda ctx: ctx.plan.attn_impl),
    ("load_in_4bit", lambda ctx: True if ctx.plan.four_bit else SKIP),
    ("load_in_8bit", lambda ctx: True if ctx.plan.quantization == "int8" else SKIP),
    ("bnb_4bit_quant_type", lambda ctx: ctx.plan.quantization if ctx.plan.four_bit else SKIP),
    ("use_bnb_nested_quant", lambda ctx: bool(ctx.plan.double_quant) if ctx.plan.four_bit else SKIP),
    ("_compute_dtype", _compute_dtype),
    ("use_peft", lambda ctx: ctx.plan.peft),
    ("lora_r", _peft(lambda plan: plan.lora_r)),
    ("lora_alpha", lambda ctx: require_int_alpha(FORMAT, ctx.plan) if ctx.plan.peft else SKIP),
    ("lora_dropout", _peft(lambda plan: float(plan.lora_dropout))),
    ("lora_target_modules", _peft(lambda plan: plan.lora_targets if isinstance(plan.lora_targets, str)
                                  else list(plan.lora_targets))),
    ("use_dora", _peft(lambda plan: True if plan.dora else SKIP)),
    # SFTConfig: the data, the step, the loss
    ("dataset_text_field", lambda ctx: "text"),
    ("max_length", lambda ctx: ctx.plan.seq_len),
    ("packing", lambda ctx: bool(ctx.plan.packing)),
    ("packing_strategy", lambda ctx: "bfd" if ctx.plan.packing else SKIP),
    ("loss_type", lambda ctx: "nll"),
    ("per_device_train_batch_size", lambda ctx: ctx.plan.micro_batch),
    ("per_device_eval_batch_size", lambda ctx: ctx.plan.eval_batch or SKIP),
    ("gradient_accumulation_steps", lambda ctx: ctx.plan.grad_accum),
    ("gradient_checkpointing", lambda ctx: bool(ctx.plan.gradient_checkpointing)),
    ("gradient_checkpointing_kwargs", lambda ctx: {"use_reentrant": False} if ctx.plan.gradient_checkpointing
     else SKIP),
    ("optim", lambda ctx: ctx.plan.optimizer),
    ("bf16", lambda ctx: PRECISION_FLAGS[ctx.plan.precision][1]),
    ("fp16", lambda ctx: PRECISION_FLAGS[ctx.plan.precision][2]),
    ("learning_rate", lambda ctx: LEARNING_RATE[ctx.plan.method]),
    ("lr_scheduler_type", lambda ctx: LR_SCHEDULER),
    ("warmup_steps", lambda ctx: WARMUP_STEPS),
    *((k, (lambda v: lambda ctx: v)(v)) for k, v in ADAM.items()),
    ("num_train_epochs", lambda ctx: 1),
    ("output_dir", lambda ctx: "outputs"),
    ("logging_steps", lambda ctx: 10),
    ("save_steps", lambda ctx: 500),
    ("report_to", lambda ctx: "none"),
    ("deepspeed", lambda ctx: DEEPSPEED_FILE if ctx.plan.offload != "none" else SKIP),
]
"""(key, value of a plan) in the order written; keys starting with "_" are checks that write nothing."""


def trl_config(ctx: ExportContext) -> dict[str, Any]:
    from advisor.configs.export._levers import trl_fields

    out: dict[str, Any] = {}
    for key, value in ROWS:
        v = value(ctx)
        if v is not SKIP and not key.startswith("_"):
            out[key] = v
    # the memory levers of advisor.configs.export._levers (optimizer arguments, checkpointing kwargs,
    # activation_offloading), refused there where TRL cannot say them
    out.update(trl_fields(ctx.plan, ctx.spec))
    return out


def _loss_note(plan) -> list[str]:
    if plan.loss == "fused-linear":
        return ["loss: TRL's fused LM head (no full logits), the plan's fused-linear loss in TRL's own tiling."]
    return [f"loss: the plan was sized for the {plan.loss} loss; TRL always fuses the LM head into the loss",
            "(no full logits), so a run holds at most what was planned."]


def template_text() -> str:
    return resources.files("advisor.configs.export.templates").joinpath(SCRIPT).read_text(encoding="utf-8")


def write(ctx: ExportContext, out_dir: Path) -> Path:
    cfg = trl_config(ctx)
    header = comment_block([
        "TRL SFTTrainer config written by vram-advisor (SFTConfig + ModelConfig fields, flat).",
        *plan_summary(ctx),
        "",
        "Run:  python train_trl.py --data my_data.jsonl        (JSONL with a \"text\" field, or a .txt)",
        "  or: trl sft --config trl.yaml --dataset_name <hub dataset with a text field>",
        *_loss_note(ctx.plan),
        *(["deepspeed.json (ZeRO CPU offload) must sit next to this file."] if ctx.plan.offload != "none" else []),
    ])
    path = write_text(out_dir / FILENAME, dump_yaml(cfg, header))
    script = write_text(out_dir / SCRIPT, template_text())
    script.chmod(0o755)
    return path
