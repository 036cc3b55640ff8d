"""What a plan changes from the usual recipe, lever by lever, and what kind of change each is.

The selection holds every answer to the usual recipe (advisor.search.recipe): a plan may depart from it by
exact levers freely (checkpointing, the loss kernel, the micro-batch at the same global batch...: the trained
model is the same), but any other departure must buy more time to quality than the step-time model's own
error. The kind of a departure comes from advisor/data/quality.yaml: exact when the entries of both sides are
exact (or the lever does not take part on one side and is exact on the other), else the less exact of the two.
Pure functions over plans; the caller measures what a change gains (``Change``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.core.plan import Plan
from advisor.search.quality import KINDS, LeverEffect, applies, lever_effects

GROUPS: dict[str, tuple[str, ...]] = {
    "base weights": ("method", "quantization", "double_quant", "compute_dtype"),
    "precision": ("precision",),
    "adapters": ("lora_r", "lora_alpha", "lora_targets", "lora_dropout", "dora"),
    "optimizer": ("optimizer", "optim_rank", "optim_proj_gap", "optimizer_in_backward"),
    "micro-batch": ("micro_batch", "grad_accum", "global_batch"),
    "activations": ("gradient_checkpointing", "checkpoint_layers", "activation_offload"),
    "CPU offload": ("offload",),
    "loss": ("loss",),
    "packing": ("packing",),
    "attention": ("attn_impl",),
    "allocator": ("expandable_segments",),
    "evaluation": ("eval_batch", "max_new_tokens"),
    # GRPO / DPO (TRL): the engine with the settings that only mean something with it (vLLM's pool, sleep, GPUs)
    "generation": ("generation", "vllm_gpu_memory_utilization", "vllm_sleep", "vllm_gpus"),
    "generation batch": ("steps_per_generation",),
    "reference": ("reference",),
    "padding-free": ("padding_free",),
}
"""Levers that change together (a QLoRA base is method, quantization and its constants at once): one change
each, so that the recipe with one change applied is a valid plan."""
_GROUP_OF = {lever: group for group, levers in GROUPS.items() for lever in levers}
_RANK = {kind: i for i, kind in enumerate(KINDS)}


@dataclass(frozen=True)
class Departure:
    """One group of levers in which a plan differs from the usual recipe."""

    group: str
    """The group's name (GROUPS)."""
    levers: tuple[str, ...]
    """The levers of the group that differ."""
    recipe: str
    """The recipe's values, as the quality model labels them (``optimizer=adamw_torch_fused``)."""
    answer: str
    """The plan's values."""
    kind: str
    """exact, near-exact, cost, dynamics or unsupported: the least exact lever of the group, either side."""
    accuracy_loss: float
    """The plan's accuracy loss on these levers minus the recipe's (nats/token; the quality model's entries)."""
    token_factor: float
    """The plan's token factor on these levers over the recipe's."""
    sources: tuple[str, ...] = ()
    """The quality model's sources for the plan's side of the change."""

    @property
    def exact(self) -> bool:
        return self.kind == "exact"


@dataclass(frozen=True)
class Change:
    """What one departure does to the recipe alone (the recipe with just that group changed), measured by the
    caller: predicted tokens/s and run peak."""

    departure: Departure
    tokens_per_s: float | None
    run_peak_bytes: int | None


def _by_lever(effects: list[LeverEffect]) -> dict[str, LeverEffect]:
    return {e.lever: e for e in effects}


def departures(plan: Plan, recipe: Plan, regime: str | None = None, *,
               global_batch: int | None = None, gpus: int = 1) -> list[Departure]:
    """The groups of levers in which ``plan`` differs from ``recipe``, in GROUPS order."""
    mine, _ = lever_effects(plan, regime, global_batch=global_batch, gpus=gpus)
    theirs, _ = lever_effects(recipe, regime, global_batch=global_batch, gpus=gpus)
    a, r = _by_lever(mine), _by_lever(theirs)
    changed: dict[str, list[str]] = {}
    for lever in list(r) + [x for x in a if x not in r]:
        ea, er = a.get(lever), r.get(lever)
        same = ea is not None and er is not None and ea.label == er.label
        if lever in ("micro_batch", "grad_accum") and same:
            continue
        if not same or (lever != "global_batch" and getattr(plan, lever, None) != getattr(recipe, lever, None)):
            changed.setdefault(_GROUP_OF.get(lever, lever), []).append(lever)
    out = []
    for group in [g for g in GROUPS if g in changed] + [g for g in changed if g not in GROUPS]:
        levers = tuple(changed[group])
        sides = [e.kind for lever in levers for e in (a.get(lever), r.get(lever)) if e is not None]
        # a lever that takes part in the plan but has no entry it could use is one no source measured
        sides += ["unsupported" for lever in levers if lever not in a and lever != "global_batch"
                  and hasattr(plan, lever) and applies(plan, lever)]
        kind = max(sides, key=_RANK.__getitem__, default="exact")
        loss = sum(a[x].accuracy_loss for x in levers if x in a) - sum(r[x].accuracy_loss for x in levers if x in r)
        factor = 1.0
        for x in levers:
            factor *= (a[x].token_factor if x in a else 1.0) / (r[x].token_factor if x in r else 1.0)
        sources = tuple(dict.fromkeys(a[x].source for x in levers if x in a and a[x].kind != "exact"))
        out.append(Departure(group, levers, _labels(r, levers, recipe), _labels(a, levers, plan), kind, loss,
                             factor, sources))
    return out


def _labels(effects: dict[str, LeverEffect], levers: tuple[str, ...], plan: Plan) -> str:
    parts = []
    for lever in levers:
        e = effects.get(lever)
        if e is None:  # no entry: the lever takes no part on this side (left out), or no source measured it
            if hasattr(plan, lever) and applies(plan, lever) and lever != "global_batch":
                parts.append(f"{lever}={getattr(plan, lever)}")
        elif getattr(plan, lever, "") is None:  # an unset knob (checkpoint_layers: every layer)
            continue
        elif e.value in ("any", "as-asked", "changed") or e.setting:
            parts.append(f"{lever}={getattr(plan, lever, e.setting or e.value)}")
        else:
            parts.append(e.label)
    return ", ".join(parts) or "-"


def with_change(recipe: Plan, plan: Plan, departure: Departure) -> Plan | None:
    """The recipe with one departure's levers taken from ``plan`` (None when that alone is not a valid plan)."""
    fields = {lever: getattr(plan, lever) for lever in GROUPS.get(departure.group, departure.levers)
              if hasattr(plan, lever)}
    candidate = recipe.with_(**fields)
    return None if candidate.problems() else candidate


def non_exact(items: list[Departure]) -> list[Departure]:
    return [d for d in items if not d.exact]


def plan_of(record_plan: dict[str, Any]) -> Plan:
    """A stored trial's plan (a record holds the plan's dict)."""
    return Plan.from_dict(dict(record_plan))


__all__ = ["Change", "Departure", "GROUPS", "departures", "non_exact", "plan_of", "with_change"]
