"""What every exporter shares: the Plan → Hugging Face vocabulary, defaults, and writing files.

A Plan speaks the advisor's language (precision ``mixed_bf16``, quantization ``nf4``); the
exports speak the libraries' (``torch_dtype: float32`` + ``bf16: true``, ``load_in_4bit``).
The translation lives here once, so every format and the reader (``advisor.configs.read``) agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from advisor.core.errors import AdvisorInputError

DEEPSPEED_FILE = "deepspeed.json"

TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""Plan dtype names → torch dtype names (what BitsAndBytesConfig and from_pretrained take)."""

# precision → (dtype the weights are loaded in, TrainingArguments.bf16, TrainingArguments.fp16).
# Pure bf16/fp16: weights in that dtype, autocast a no-op. Mixed: fp32 weights, autocast to 16 bit.
PRECISION_FLAGS = {
    "bf16": ("bfloat16", True, False),
    "fp16": ("float16", False, True),
    "fp32": ("float32", False, False),
    "mixed_bf16": ("float32", True, False),
    "mixed_fp16": ("float32", False, True),
}
FLAGS_PRECISION = {v: k for k, v in PRECISION_FLAGS.items()}

# Defaults a person would start from; the advisor sizes memory, it does not tune these.
LEARNING_RATE = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}
"""Usual starting learning rates: LoRA/QLoRA papers and peft examples use 1e-4..3e-4; full
fine-tuning of 1-10B models 1e-5..5e-5."""
LR_SCHEDULER = "cosine"
WARMUP_STEPS = 10
"""An integer: transformers 5 dropped ``warmup_ratio`` (a float ``warmup_steps`` is its ratio
now) while 4.x only takes integers here, so a whole number of steps runs on both."""
ADAM = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
"""TrainingArguments' own defaults, written out because the DeepSpeed optimizer section repeats them."""


LIGER_FUSED_LOSS_ONLY = {"fused_linear_cross_entropy": True, "cross_entropy": False, "rms_norm": False,
                         "swiglu": False, "rope": False}
"""TrainingArguments.liger_kernel_config for --loss fused-linear: only the fused linear cross-entropy (the
lever the plan models), not Liger's RMSNorm/SwiGLU/RoPE kernels (transformers Trainer passes it to
liger_kernel.transformers._apply_liger_kernel_to_instance)."""


class Unsupported(AdvisorInputError):
    """A format cannot express this plan (e.g. axolotl has no fp32-master mixed precision)."""

    def __init__(self, fmt: str, reason: str):
        super().__init__(f"--format {fmt}", reason, show_value=False)
        self.format = fmt


@dataclass(frozen=True)
class ExportContext:
    """Everything an exporter may look at: the model, the plan, and what the advisor predicted."""

    spec: Any
    """advisor.core.catalog.ModelSpec."""
    plan: Any
    """advisor.core.plan.Plan (validated)."""
    gpu: Any = None
    """advisor.core.catalog.GpuSpec the plan was sized for, if known."""
    extra: dict = field(default_factory=dict)
    """Predictions and provenance (peak_bytes, tokens_per_s, source, study, ...), copied into advisor.yaml."""

    @property
    def model_id(self) -> str:
        return self.spec.hf_id


Writer = Callable[[ExportContext, Path], Path]


def lora_alpha_value(alpha: float) -> int | float:
    """Whole-number alphas as ints (LoraConfig types it int; axolotl and LLaMA-Factory demand it)."""
    return int(alpha) if float(alpha).is_integer() else float(alpha)


def require_int_alpha(fmt: str, plan) -> int | None:
    if not plan.peft:
        return None
    value = lora_alpha_value(plan.lora_alpha)
    if not isinstance(value, int):
        raise Unsupported(fmt, f"its lora_alpha is a whole number; the plan has {plan.lora_alpha}")
    return value


def dump_yaml(data: dict, header: str) -> str:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return header.rstrip("\n") + "\n\n" + body


def comment_block(lines: list[str]) -> str:
    return "\n".join(("# " + line).rstrip() for line in lines) + "\n"


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2) + "\n")


def alloc_env(plan) -> dict[str, str]:
    """Environment the run needs for the plan's allocator settings: PYTORCH_CUDA_ALLOC_CONF
    (advisor.memory.allocator.AllocatorConfig.to_env; torch reads it when CUDA starts)."""
    from advisor.memory.allocator import AllocatorConfig

    conf = AllocatorConfig(expandable_segments=plan.expandable_segments).to_env()
    return {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}


def env_prefix(plan) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF=... `` to put before a launch command ('' when none is needed)."""
    return "".join(f"{k}={v} " for k, v in alloc_env(plan).items())


def env_note(plan, config: str) -> list[str]:
    """Header lines for a format with no field for environment variables, when the plan needs one."""
    if not alloc_env(plan):
        return []
    return [f"{config} has no field for environment variables: PYTORCH_CUDA_ALLOC_CONF (the plan's",
            "allocator setting) must be set in the shell that launches it, as above."]


def plan_summary(ctx: ExportContext) -> list[str]:
    """Header lines naming the model, the plan and the prediction."""
    lines = [f"model: {ctx.spec.name} ({ctx.spec.hf_id})", f"plan:  {ctx.plan.short()}"]
    if ctx.gpu is not None:
        lines.append(f"sized for: {ctx.gpu.name} ({ctx.gpu.memory_bytes / 2**30:.1f} GiB)")
    peak = ctx.extra.get("peak_bytes")
    if peak:
        src = ctx.extra.get("source", "predicted")
        lines.append(f"peak memory ({src}): {peak / 2**30:.2f} GiB")
    return lines
