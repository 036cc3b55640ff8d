"""deepspeed.json: ZeRO-2 with the optimizer on the CPU, or ZeRO-3 with parameters and optimizer there; or, on
several GPUs, ZeRO-2 / ZeRO-3 sharding with everything on the GPUs; and the inverse, a DeepSpeed config (a mapping
or the path to its JSON) read back as the plan's offload.

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

Note for the ledger: DeepSpeed's bf16/fp16 modes keep fp32 master weights and fp32 optimizer states
whatever the Plan's precision. With CPU offload it runs its own CPU Adam for the offloaded partition
(hence the optimizer section, written only then); ZeRO sharding on the GPUs runs the plan's own ``optim``,
which the Trainer builds when the file has no optimizer section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.configs._base import (ADAM, Collect, DEEPSPEED_FILE, ExportContext, PRECISION_FLAGS, Unsupported,
                                   ZERO_OFFLOAD_STAGES, training_hyperparameters, write_json)

REDUCE_BUCKET_SIZE = 200_000_000
"""Elements per gradient reduce bucket: 2e8, the size the memory ledger assumes for the bucket."""
PREFETCH_BUCKET_SIZE = 50_000_000
"""ZeRO-3 parameter prefetch bucket, elements (DeepSpeed's default, 5e7)."""

STAGES = ZERO_OFFLOAD_STAGES


def deepspeed_config(plan, stage: int | None = None) -> dict[str, Any]:
    """The DeepSpeed config dict for a plan with CPU offload, or (``stage`` 2 or 3, no offload) for ZeRO sharding
    across several GPUs."""
    offload = plan.offload in STAGES
    if offload:
        stage = STAGES[plan.offload]
    elif stage not in (2, 3):
        raise Unsupported("deepspeed", "the plan runs without DeepSpeed (no DeepSpeed CPU offload, no ZeRO sharding on "
                                       "several GPUs)")
    _, bf16, fp16 = PRECISION_FLAGS[plan.precision]
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": REDUCE_BUCKET_SIZE})
    if stage == 3:
        if offload:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        zero["stage3_prefetch_bucket_size"] = PREFETCH_BUCKET_SIZE
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    else:
        zero["allgather_bucket_size"] = REDUCE_BUCKET_SIZE
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": training_hyperparameters(plan)["max_grad_norm"],
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16, "loss_scale": 0, "initial_scale_power": 16} if fp16 else {"enabled": False},
        "zero_optimization": zero,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if offload:  # the offloaded partition steps on DeepSpeed's CPU Adam (the plan's adamw_torch: advisor.core.plan)
        config["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": training_hyperparameters(plan)["learning_rate"],
                "betas": [ADAM["adam_beta1"], ADAM["adam_beta2"]],
                "eps": ADAM["adam_epsilon"],
                "weight_decay": ADAM["weight_decay"],
            },
        }
    else:
        # ZeRO sharding on the GPUs runs the plan's own optimizer: with no optimizer section the Trainer builds its
        # ``optim`` and hands it to deepspeed.initialize (transformers integrations/deepspeed.py
        # deepspeed_optim_sched); one DeepSpeed has not tested with ZeRO (bitsandbytes', a paged one) needs the flag
        # (deepspeed/runtime/engine.py _do_optimizer_sanity_check)
        config["zero_allow_untested_optimizer"] = True
    return config


def write(ctx: ExportContext, out_dir: Path) -> Path:
    return write_json(out_dir / DEEPSPEED_FILE, deepspeed_config(ctx.plan, ctx.zero_stage))


def sharding_of(ds: dict | None) -> str | None:
    """The several-GPU sharding a DeepSpeed config without CPU offload runs (zero2 / zero3; None: none or offload)."""
    zero = (ds or {}).get("zero_optimization") or {}
    if any((zero.get(k) or {}).get("device", "none") not in ("none", None) for k in ("offload_optimizer",
                                                                                   "offload_param")):
        return None
    return {2: "zero2", 3: "zero3"}.get(zero.get("stage"))


def read_offload(c: Collect, value: Any, where: str) -> tuple[str, dict | None]:
    """(the plan's offload, the DeepSpeed config) from a DeepSpeed config or the path to its JSON (relative
    to the config file that names it); a ZeRO setup the advisor does not plan is an error at ``where``."""
    if value in (None, "", False):
        return "none", None
    ds = value
    if isinstance(value, str):
        p = Path(value)
        p = p if p.is_absolute() else c.base_dir / p
        if not p.exists() and (c.base_dir / p.name).exists():
            p = c.base_dir / p.name  # an export moved with its folder: the file beside the config
        try:
            ds = json.loads(p.read_text(encoding="utf-8"))
        except OSError:
            c.bad(where, f"names {p}, which cannot be read", value)
            return "none", None
        except json.JSONDecodeError as e:
            c.bad(where, f"{p} is not valid JSON ({e.msg} at line {e.lineno})", value)
            return "none", None
    if not isinstance(ds, dict):
        c.bad(where, "must be a DeepSpeed config (a mapping) or the path to its JSON", value)
        return "none", None
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    dev = lambda k: (zero.get(k) or {}).get("device", "none")  # noqa: E731
    offload = next((mode for mode, st in STAGES.items() if st == stage), None)
    if stage == 2 and dev("offload_optimizer") == "cpu" and dev("offload_param") in ("none", None):
        return offload, ds
    if stage == 3 and dev("offload_optimizer") == "cpu" and dev("offload_param") == "cpu":
        return offload, ds
    if stage in (2, 3) and sharding_of(ds):
        return "none", ds  # ZeRO sharding across GPUs, no offload: the plan's sharding, not its offload
    c.bad(f"{where}.zero_optimization",
          "the advisor plans ZeRO-2 with offload_optimizer on the cpu, or ZeRO-3 with offload_param and "
          "offload_optimizer on the cpu", {"stage": stage, "offload_optimizer": dev("offload_optimizer"),
                                           "offload_param": dev("offload_param")})
    return "none", ds


def check_batch(c: Collect, ds: dict | None, fields: dict[str, Any], sect: str) -> None:
    """A DeepSpeed config's concrete batch and accumulation must equal the TrainingArguments' (or be "auto")."""
    if not ds:
        return
    for ds_key, t_key, field in (("train_micro_batch_size_per_gpu", "per_device_train_batch_size", "micro_batch"),
                                 ("gradient_accumulation_steps", "gradient_accumulation_steps", "grad_accum")):
        v, want = ds.get(ds_key), fields.get(field)
        if isinstance(v, int) and not isinstance(v, bool) and want is not None and v != want:
            c.bad(f"deepspeed.{ds_key}", f"must equal {sect}{t_key} ({want}), or be \"auto\"", v)
