"""The usual recipe: the plan practitioners run by default for a question, the baseline every answer is held to.

DESIGN.md "Objectives": bf16 LoRA on every linear layer with AdamW, checkpointing as needed; QLoRA nf4 when
that does not fit; a full fine-tune when it fits. In the advisor's terms:

- a **full fine-tune** (the capacity reference of advisor/data/quality.yaml) when it fits the budget;
- else **LoRA** at the card's precision on ``all-linear`` (peft's ``target_modules="all-linear"``; QLoRA §4 and
  Biderman et al. 2024 train every linear layer), rank 16 with alpha 2r (the rank from which quality.yaml's
  sft regime finds no capacity gap), the default optimizer of transformers 5 (``adamw_torch_fused``,
  TrainingArguments.optim);
- else **QLoRA**: the same over an nf4 base with double quantization (Dettmers et al. 2023, §3-4).

For GRPO and DPO (TRL's trainers) the recipe is TRL's defaults for the task with LoRA, QLoRA when that does not fit
(no full fine-tune: TRL's examples and docs train adapters on one card): gradient checkpointing on
(GRPOConfig / DPOConfig.gradient_checkpointing defaults to True), completions by ``generate()`` (use_vllm False),
one generation per optimizer step (steps_per_generation = the accumulation), the reference the disabled adapter;
the vLLM knobs at TRL's values (gpu_memory_utilization 0.3, no sleep) should the space pin vLLM.

Each without gradient checkpointing when it fits so, else with it; the micro-batch is the largest of the
space's that fits (with the space's global batch: the rest is gradient accumulation, which trains the same).
Every other knob takes the value its declaration prefers for the ladder (the space's choice). Pure: the
caller says what fits (``fits``: the tuner's estimate of the run's peak against the budget).
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.core.plan import ALL_LINEAR, RL_TASKS
from advisor.search.space import SearchSpace, search_knobs

RECIPE_RUNG = "recipe"
"""The ladder label of the usual recipe's trial starts with this (``is_recipe``)."""
RECIPE_RANK = 16
RECIPE_OPTIMIZER = "adamw_torch_fused"
"""TrainingArguments.optim's default in transformers 5 (training_args.py: OptimizerNames.ADAMW_TORCH_FUSED)."""

RL_DEFAULTS = {"generation": "transformers", "vllm_gpu_memory_utilization": 0.3, "vllm_sleep": 0, "vllm_gpus": 1,
               "steps_per_generation": None, "reference": "adapter", "padding_free": False}
"""TRL 1.16's defaults for the GRPO/DPO levers (GRPOConfig: use_vllm False, vllm_gpu_memory_utilization 0.3,
vllm_enable_sleep_mode False, steps_per_generation None; a PEFT policy's reference is the disabled adapter;
DPOConfig.padding_free False)."""

Fits = Callable[[dict[str, Any]], bool]


def _method_points(space: SearchSpace, precision: str) -> list[tuple[str, dict[str, Any]]]:
    """(method, the recipe's knobs for it) in the order the recipe tries them."""
    peft = {"lora_targets": ALL_LINEAR, "lora_r": RECIPE_RANK, "dora": False}
    full_precision = "mixed_bf16" if precision == "bf16" else "mixed_fp16"
    return [
        ("full", {"method": "full", "quantization": "none", "double_quant": False, "precision": full_precision}),
        ("lora", {"method": "lora", "quantization": "none", "double_quant": False, "precision": precision, **peft}),
        ("qlora", {"method": "qlora", "quantization": "nf4", "double_quant": True, "precision": precision, **peft}),
    ]


def usual_recipe(space: SearchSpace, precision: str, fits: Fits) -> tuple[str, dict[str, Any]] | None:
    """(ladder label, params) of the usual recipe within ``space`` at the card's ``precision``; None when the
    space holds no version of it (say a space pinned to one method whose recipe values it lacks entirely).

    A knob whose recipe value the space does not offer takes the space's own (the user pinned it: the
    recipe answers the question as asked); a version of the recipe whose method the space leaves out is
    skipped. When no version fits at all, the last one the space allows is returned at its smallest
    micro-batch (the baseline that did not fit: the selection says so).
    """
    s = space.search
    base = {k.name: k.search.ladder(s[k.name]) for k in search_knobs(space.plan).values()
            if k.search.ladder is not None and k.name in s}
    base.update(optimizer=RECIPE_OPTIMIZER, loss="plain", offload="none", activation_offload=False,
                optimizer_in_backward=False, checkpoint_layers=None, expandable_segments=False)
    rl = space.workload.get("task") in RL_TASKS
    if rl:
        base.update({k: v for k, v in RL_DEFAULTS.items() if k in s})
    sizes = space.micro_batches()  # those that keep the global batch
    last = None
    for method, knobs in _method_points(space, precision):
        if method not in space.methods() or (rl and method == "full"):
            continue
        point = {**base, **knobs}
        point = {k: (v if k not in s or v in s[k] else s[k][0]) for k, v in point.items()}
        for checkpointing in ((True, False) if rl else (False, True)):  # TRL: checkpointing on by default
            if checkpointing not in s["gradient_checkpointing"]:
                continue
            candidate = {**point, "gradient_checkpointing": checkpointing}
            fitting = [mb for mb in sizes if fits({**candidate, "micro_batch": mb})]
            if fitting:
                return f"{RECIPE_RUNG}: the usual recipe ({method})", {**candidate, "micro_batch": fitting[-1]}
            last = (method, {**candidate, "micro_batch": sizes[0]})
    if last is None:
        return None
    return f"{RECIPE_RUNG}: the usual recipe ({last[0]}, does not fit)", last[1]


def is_recipe(ladder_label: str) -> bool:
    """Whether a trial's ladder label marks the usual recipe."""
    return (ladder_label or "").startswith(RECIPE_RUNG + ":")


__all__ = ["RECIPE_OPTIMIZER", "RECIPE_RANK", "RECIPE_RUNG", "is_recipe", "usual_recipe"]
