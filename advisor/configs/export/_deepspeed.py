"""deepspeed.json: ZeRO-2 with the optimizer on the CPU, or ZeRO-3 with parameters and optimizer there.

Field names from DeepSpeed's config reference (deepspeedai/DeepSpeed docs/_pages/config-json.md,
https://www.deepspeed.ai/docs/config-json/: ``zero_optimization.stage``, ``offload_optimizer``
/ ``offload_param`` with ``device`` and ``pin_memory``, ``reduce_bucket_size``,
``stage3_prefetch_bucket_size``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``gradient_clipping``, ``bf16.enabled`` / ``fp16.enabled``,
``optimizer.type`` / ``params``) and checked by DeepSpeed's own ``DeepSpeedConfig`` (its ZeRO
section is a pydantic model that forbids unknown keys) in tests/test_export.py.

No "auto" anywhere: every value is concrete, so the file runs under plain ``deepspeed`` too. Under
the HF Trainer (``TrainingArguments.deepspeed``), transformers checks each concrete value against
the TrainingArguments it mirrors (batch, accumulation, clipping, lr, betas, eps, weight decay,
bf16/fp16) and refuses a mismatch, so an edit to one file but not the other is caught at launch.
``train_batch_size`` is left out: DeepSpeed derives it from micro batch × accumulation × GPUs,
which keeps the file valid on any number of GPUs. No scheduler section: the Trainer's
``lr_scheduler_type`` drives the DeepSpeed optimizer.

Note for the ledger: DeepSpeed's bf16/fp16 modes keep fp32 master weights and fp32 Adam states in
the (CPU-offloaded) optimizer whatever the Plan's precision, and it runs its own CPU Adam for the
offloaded partition (hence the optimizer section).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.export._base import ADAM, DEEPSPEED_FILE, LEARNING_RATE, PRECISION_FLAGS, ExportContext, Unsupported, write_json

REDUCE_BUCKET_SIZE = 200_000_000
"""Elements per gradient reduce bucket: 2e8, the size the memory ledger assumes for the bucket."""
PREFETCH_BUCKET_SIZE = 50_000_000
"""ZeRO-3 parameter prefetch bucket, elements (DeepSpeed's default, 5e7)."""

STAGES = {"zero2_cpu": 2, "zero3_cpu": 3}


def deepspeed_config(plan) -> dict[str, Any]:
    """The DeepSpeed config dict for a plan with CPU offload."""
    if plan.offload not in STAGES:
        raise Unsupported("deepspeed", f"the plan has no DeepSpeed offload (offload={plan.offload})")
    _, bf16, fp16 = PRECISION_FLAGS[plan.precision]
    zero: dict[str, Any] = {
        "stage": STAGES[plan.offload],
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": REDUCE_BUCKET_SIZE,
    }
    if plan.offload == "zero3_cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        zero["stage3_prefetch_bucket_size"] = PREFETCH_BUCKET_SIZE
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    else:
        zero["allgather_bucket_size"] = REDUCE_BUCKET_SIZE
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": ADAM["max_grad_norm"],
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16, "loss_scale": 0, "initial_scale_power": 16} if fp16 else {"enabled": False},
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": LEARNING_RATE[plan.method],
                "betas": [ADAM["adam_beta1"], ADAM["adam_beta2"]],
                "eps": ADAM["adam_epsilon"],
                "weight_decay": ADAM["weight_decay"],
            },
        },
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    return config


def write(ctx: ExportContext, out_dir: Path) -> Path:
    return write_json(out_dir / DEEPSPEED_FILE, deepspeed_config(ctx.plan))
