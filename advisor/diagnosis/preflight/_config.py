"""Config checks: things in the training config that break or hurt a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.core.catalog import ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.diagnosis.findings import Finding
from advisor.core.adapters import attention_linears
from advisor.core.plan import Plan, lora_target_modules

# usual learning rates (AdamW): LoRA/QLoRA 1e-4..3e-4 (QLoRA paper §4, seeds: 1e-4 to 2e-4);
# full fine-tuning 1e-5..5e-5 (Ouyang et al. 2022 appendix; HF recipes). "Far outside" = 10x beyond.
LR_RANGE = {"peft": (1e-5, 1e-3), "full": (1e-6, 1e-4)}


def check_plan_rules(plan: Plan) -> list[Finding]:
    return [Finding(f"config.{e.where.lstrip('-')}", "error", e.rule, f"value {e.value!r}", (), "config")
            for e in plan.problems()]


def check_targets(model: ModelSpec, plan: Plan) -> list[Finding]:
    if not plan.peft:
        return []
    try:
        lora_target_modules(plan, list(model.linear_shapes()), attention_linears(model))
    except AdvisorInputError as e:
        return [Finding("config.lora-targets", "error", "LoRA target modules not in this model", e.rule,
                        (f"use target_modules: {list(model.linear_shapes())} (or all-linear)",), "config")]
    return []


def check_learning_rate(plan: Plan, training: dict[str, Any]) -> list[Finding]:
    lr = training.get("learning_rate")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return []
    low, high = LR_RANGE["peft" if plan.peft else "full"]
    if lr > high or lr < low:
        usual = "1e-4 to 3e-4" if plan.peft else "1e-5 to 5e-5"
        return [Finding("config.learning-rate", "warning",
                        f"learning rate {lr:g} is far outside the usual range for {plan.method} ({usual})",
                        "too high diverges (NaN loss); too low barely moves the weights",
                        (f"set learning_rate to {'2e-4' if plan.peft else '2e-5'}",), "config")]
    return []


def check_use_cache(plan: Plan, model_section: dict[str, Any], spec: ModelSpec) -> list[Finding]:
    """A config that asks for the KV cache while checkpointing (train.py, axolotl and LLaMA-Factory
    turn it off themselves; only an explicit use_cache: true is worth a word)."""
    if plan.gradient_checkpointing and model_section.get("use_cache") is True:
        return [Finding("config.use-cache", "info", "use_cache is on with gradient checkpointing",
                        "transformers turns it off with a warning; the KV cache is useless in training",
                        ("set model.config.use_cache = False",), "config")]
    return []


def check_pad_token(spec: ModelSpec) -> list[Finding]:
    """A local tokenizer without a pad token (many causal LMs ship without one)."""
    if not spec.path:
        return []
    folder = Path(spec.path)
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return []
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    special = {}
    stm = folder / "special_tokens_map.json"
    if stm.is_file():
        try:
            special = json.loads(stm.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            special = {}
    if not data.get("pad_token") and not special.get("pad_token"):
        return [Finding("config.pad-token", "warning", "the tokenizer has no pad token",
                        f"{cfg} sets no pad_token", ("set tokenizer.pad_token = tokenizer.eos_token",), "config")]
    return []
