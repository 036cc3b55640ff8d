"""What a LoRA plan adapts on one model: the ``target_modules`` and ``target_parameters`` the run passes to peft.

One answer for the real step (advisor.runtime.build), the closed-form ledger (advisor.memory), the search's model
rules and the exports, so that what is counted is what runs:

- the plan's target modules, the default attention set standing for the model's own attention linears
  (``advisor.core.plan.DEFAULT_TARGETS``: DeepSeek's latent attention has no k_proj / v_proj);
- on a mixture of experts, the stacked experts are not ``nn.Linear`` and get no adapter from ``target_modules``;
  for the model types whose v4 expert names peft rewrites (architectures.yaml ``peft_moe_target_rewrite``:
  Qwen-MoE, Qwen3-Next, OLMoE, DeepSeek, Mixtral), the names peft would move to the experts and the router are
  left out, since peft's ``ParamWrapper`` then refuses the plan's ``lora_dropout`` > 0
  (``LoraConfig("all-linear", lora_dropout=0.05)`` raises on Qwen3-MoE, reports/moe_findings.md section 3);
- with ``lora_experts``, ``target_parameters`` on the stacked expert weights (``experts.gate_up_proj``,
  ``experts.down_proj``): peft wraps each in a ``lora.ParamWrapper`` whose adapters are rank r x experts
  (peft/tuners/lora/layer.py:2455-2456), at the plan's rank on every stack (not the 2r peft's own "all-linear"
  rewrite gives gate_up_proj), the router left alone.
"""

from __future__ import annotations

from advisor.core.catalog import ModelSpec, peft_moved_lora_names
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import ALL_LINEAR, Plan, flag_of, lora_target_modules


def attention_linears(spec: ModelSpec) -> list[str]:
    """The short names of the model's attention linears (the description's role), in call order."""
    return list((spec.arch.get("lora_target_sets") or {}).get("attention", ()))


def adapted_modules(spec: ModelSpec, plan: Plan) -> list[str]:
    """The decoder-layer linears (short names) that get LoRA adapters: the run's ``target_modules``."""
    return lora_targets(spec, plan)[0]


def lora_targets(spec: ModelSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """(the LoRA target_modules the run passes to peft, notes) for ``plan`` on ``spec``."""
    names = list(spec.linear_shapes())
    targets = lora_target_modules(plan, names, attention_linears(spec))
    if not plan.peft or not spec.is_moe:
        return targets, []
    moved = peft_moved_lora_names(spec.model_type)
    kept = [t for t in targets if t not in moved]
    moe = spec.moe
    share = spec.description.params_by_category.get("experts", 0) / max(spec.params_total, 1)
    experts = (f"LoRA on the stacked experts too ({', '.join(target_parameters(spec))}, peft target_parameters, "
               f"rank {plan.lora_r} per expert); the router gets no adapter" if plan.lora_experts else
               f"the stacked experts ({share:.0%} of the parameters) and the router get no adapters "
               f"({flag_of('lora_experts')} adapts the experts)")
    notes = [f"mixture of experts ({moe.num_experts} experts, top-{moe.experts_per_token}): LoRA on "
             f"{', '.join(kept) or 'no linear module'}; {experts}"]
    dropped = [t for t in targets if t in moved]
    if dropped:
        notes.append(f"left out {', '.join(dropped)}: peft rewrites these names on {spec.model_type} into LoRA on "
                     "the stacked experts and the router (target_parameters), whose ParamWrapper refuses "
                     "lora_dropout > 0 and DoRA (peft/tuners/lora/layer.py)")
    if not kept and not plan.lora_experts:
        raise AdvisorInputError("--lora-targets", f"no module left to adapt on {spec.name}: its linears "
                                f"{', '.join(names)} are either not targeted or rewritten by peft into expert "
                                f"parameters; target the attention, or adapt the experts ({flag_of('lora_experts')})",
                                ",".join(targets), show_value=False)
    return kept, notes


def expert_weights(spec: ModelSpec):
    """The stacked expert weights of one routed layer (``ExpertParameter``s with an input width: no biases)."""
    layer = next((layer for layer in spec.description.layers if layer.num_experts), None)
    return [e for e in layer.experts if e.in_features] if layer is not None else []


def target_parameters(spec: ModelSpec) -> list[str]:
    """peft ``target_parameters`` for the stacked expert weights: ``<module>.<parameter>`` (``experts.gate_up_proj``),
    which peft matches as a suffix of each parameter's full name (peft/tuners/tuners_utils.py
    ``_inject_parameters``)."""
    return [".".join(e.name.split(".")[-2:]) for e in expert_weights(spec)]


def export_targets(spec: ModelSpec | None, plan: Plan) -> list[str] | str:
    """The ``target_modules`` an exported config writes: the plan's own where they mean what they say, else the
    modules the run adapts (``lora_targets``): on a mixture of experts whose names peft would rewrite onto the
    experts ("all-linear" on Qwen3-MoE raises with lora_dropout > 0, and with 0 adapts the experts and the router at
    2r), and where the default q/k/v/o stand for the model's own attention."""
    targets = plan.lora_targets
    if spec is None or not plan.peft:
        return targets if isinstance(targets, str) else list(targets)
    names = spec.linear_shapes()
    if not spec.is_moe and (targets == ALL_LINEAR or all(t in names for t in targets)):
        return targets if isinstance(targets, str) else list(targets)
    return lora_targets(spec, plan)[0]


LANGUAGE_MODEL_PREFIX = r"model\.(?:language_model|text_model)\..*\."
"""Where a vision-language model's language model sits in transformers 5 (``model.language_model``; SmolVLM's
``model.text_model``): a peft ``target_modules`` regex on it (peft fullmatches a string against each module's path,
peft/tuners/tuners_utils.py ``check_target_module_exists``) adapts no tower linear."""


def language_model_regex(spec: ModelSpec, plan: Plan) -> str:
    """The plan's targets as a ``target_modules`` regex on the language model alone (all-linear: its linears by
    name), for a tool that takes no list of full paths."""
    targets = export_targets(spec, plan)
    names = sorted(spec.linear_shapes()) if targets == ALL_LINEAR else list(targets)
    return f"{LANGUAGE_MODEL_PREFIX}({'|'.join(names)})"


def names_of_language_model_regex(text: str) -> tuple[str, ...] | None:
    """The module names of a ``language_model_regex`` (None: ``text`` is not one)."""
    import re

    m = re.fullmatch(re.escape(LANGUAGE_MODEL_PREFIX) + r"\(([A-Za-z0-9_|]+)\)", text.strip())
    return tuple(m.group(1).split("|")) if m else None


def export_parameters(spec: ModelSpec | None, plan: Plan) -> list[str] | None:
    """The ``target_parameters`` an exported config writes (None: LoRA on no stacked expert)."""
    if spec is None or not plan.peft or not plan.lora_experts:
        return None
    return target_parameters(spec)


def expert_problems(spec: ModelSpec, plan: Plan) -> list[AdvisorInputError]:
    """The model-dependent rule of ``lora_experts``: the model must have stacked experts."""
    if plan.peft and plan.lora_experts and not spec.is_moe:
        return [AdvisorInputError(flag_of("lora_experts"), f"{spec.name} has no stacked experts (not a mixture of "
                                  "experts): leave it off", plan.lora_experts)]
    return []


__all__ = ["LANGUAGE_MODEL_PREFIX", "adapted_modules", "language_model_regex", "names_of_language_model_regex",
           "attention_linears", "expert_problems", "expert_weights", "export_parameters",
           "export_targets", "lora_targets", "target_parameters"]
