"""Numbers as text, each with the word that says where it comes from (shared by HTML and Markdown)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from advisor.search.description import StudyDescription
from advisor.search.select import TrialRecord
from advisor.search.space import SearchSpace

SPACE_DIRS = (("advisor", "data", "spaces"), ("search_spaces",))
"""Where the built-in spaces live in the package (search_spaces/: studies made before they moved)."""

SOURCE_HELP = {
    "estimated": "closed-form memory ledger (advisor/memory/training.py)",
    "simulated": "fake-tensor trace of one real training step on the CPU",
    "measured": "a real probe run: NVML / allocator peak, timed steps",
    "predicted": "step-time model of the GPU (advisor/speed/)",
    "prior": "documented prior of each lever, with its source (advisor/data/quality.yaml, docs/quality.md)",
}

PLAN_LABELS = {
    "method": "Method", "quantization": "Base weights", "double_quant": "Double quantization",
    "compute_dtype": "Compute dtype", "precision": "Precision", "lora_r": "LoRA rank", "lora_alpha": "LoRA alpha",
    "lora_dropout": "LoRA dropout", "lora_targets": "LoRA targets", "gradient_checkpointing": "Gradient checkpointing",
    "optimizer": "Optimizer", "micro_batch": "Micro-batch", "grad_accum": "Gradient accumulation",
    "seq_len": "Sequence length", "attn_impl": "Attention", "offload": "Offload", "loss": "Loss", "dora": "DoRA",
    "packing": "Packing",
}


def value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def tps_text(r: TrialRecord) -> str:
    return f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else ""


def acc_text(r: TrialRecord) -> str:
    return f"{r.accuracy_loss:.3f}" if r.accuracy_loss is not None else ""


def plan_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) for the plan fields that apply to it, by the knobs' declarations (advisor.core.knobs): a lever
    where it applies (no LoRA rows for a full fine-tune, no GRPO or vLLM rows for supervised fine-tuning) and the
    search turns it, or it is set (no sequence-parallel, tiled-MLP or pixel rows at their defaults); a workload field
    where it is asked for (the required ones, those of the plan's task, the others off their default: no video rows
    without a video)."""
    from advisor.core.knobs import knobs
    from advisor.core.plan import Plan

    default = Plan().to_dict()
    values = {**default, **plan}
    rows = []
    for k in knobs(Plan):
        if k.name not in plan or not k.applies_to(values):
            continue
        at_default = plan[k.name] == default[k.name]
        if at_default and (not k.workload.required and k.applies is None if not k.is_lever
                           else k.search is None and k.tag is not None):
            continue
        if k.name == "double_quant" and plan.get("quantization") not in ("nf4", "fp4"):
            continue
        rows.append((PLAN_LABELS.get(k.name, k.name), value_text(plan[k.name])))
    return rows


def gpu_line(d: StudyDescription) -> str:
    from advisor.core.units import format_bytes

    gpu = d.gpu
    mem = format_bytes(gpu.memory_bytes or 0, "GiB", 0)
    how = ("assumed: none detected or named; the catalog GPU the budget matches" if d.gpu_assumed
           else "detected through NVML" if gpu.detected else "named with --gpu")
    return f"{gpu.name} ({mem}; {how})"


def _package_path(source: str) -> str | None:
    """``source`` relative to the package when it is a built-in space's file (advisor/data/spaces/x.yaml), else None."""
    parts = PurePath(source).parts
    for where in SPACE_DIRS:
        n = len(where)
        for i in range(len(parts) - n):
            if parts[i:i + n] == where and i + n == len(parts) - 1:
                return "/".join(parts[i:])
    return None


def is_built_in_space(space: SearchSpace) -> bool:
    """A space shipped with the package (named on the command line by its name), not a file of the user's."""
    return not space.source or (_package_path(space.source) is not None
                                and PurePath(space.source).name == f"{space.name}.yaml")


def space_source(space: SearchSpace) -> str:
    """Where the space was read from, without the absolute path of the machine that ran the study: a built-in
    space's file relative to the package (advisor/data/spaces/default.yaml), a user's file by its name."""
    if not space.source:
        return ""
    return _package_path(space.source) or PurePath(space.source).name


def host_budget_text(d: StudyDescription, fmt) -> str:
    """The study's host budget: the RAM, how it was set, and what the host rule leaves usable."""
    from advisor.core.fit import host_usable_bytes

    hb = d.host_budget
    if hb is None:
        return "not checked (a study made before host budgets)"
    how = "the default where the study ran" if d.host_detected else "--host-budget"
    return f"{hb.text} ({how}): {fmt(host_usable_bytes(hb.bytes))} usable, the rest kept for the OS"

