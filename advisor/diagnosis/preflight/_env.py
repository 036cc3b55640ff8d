"""Environment checks: library versions and known incompatibilities, GPU capabilities, free
memory now, host RAM for offload, disk for checkpoints."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from advisor.core.card_rules import Card
from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.data_files import load_data_file
from advisor.diagnosis.findings import Finding
from advisor.core.plan import ALL_LINEAR, Plan
from advisor.core.units import format_bytes
from advisor.core.versions import library_versions


def plan_features(plan: Plan) -> set[str]:
    f = set()
    if plan.four_bit:
        f.add("four_bit")
    if plan.quantization == "int8":
        f.add("int8")
    if plan.optimizer.startswith("paged"):
        f.add("paged")
    if "8bit" in plan.optimizer or plan.optimizer.startswith("paged"):
        f.add("bnb_optimizer")
    if plan.peft and plan.lora_targets == ALL_LINEAR:
        f.add("all_linear")
    if plan.attn_impl in ("sdpa", "flash_attention_2"):
        f.add(plan.attn_impl)
    if plan.offload != "none":
        f.add("offload")
    return f


def _version_tuple(v: str) -> tuple:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def check_versions(plan: Plan, versions: dict[str, str | None] | None = None) -> list[Finding]:
    versions = versions or library_versions()
    features = plan_features(plan)
    findings = []
    for rule in load_data_file("compat.yaml"):
        if not features & set(rule["when"]):
            continue
        have = versions.get(rule["package"])
        if have is None:
            findings.append(Finding("env.missing-package", "error", f"{rule['package']} is not installed",
                                    f"needed for: {', '.join(sorted(features & set(rule['when'])))}",
                                    (f"pip install '{rule['package']}>={rule['min']}'",), "environment"))
        elif _version_tuple(have) < _version_tuple(rule["min"]):
            findings.append(Finding("env.version", "error", f"{rule['package']} {have} is too old: {rule['why']}",
                                    f"needs >= {rule['min']} ({rule['source']})",
                                    (f"pip install -U '{rule['package']}>={rule['min']}'",), "environment"))
    if "offload" in features and versions.get("deepspeed") is None:
        findings.append(Finding("env.missing-package", "error", "deepspeed is not installed (the plan offloads to the CPU)",
                                "", ("pip install deepspeed",), "environment"))
    if plan.attn_impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        findings.append(Finding("env.flash-attn", "error", "flash_attention_2 requested but flash-attn is not installed",
                                "importlib cannot find flash_attn",
                                ("use attn_implementation: sdpa (no extra package)",
                                 "pip install flash-attn --no-build-isolation (needs a matching CUDA toolkit)"),
                                "environment"))
    shown = {k: v for k, v in versions.items() if v}
    findings.append(Finding("env.versions", "info", "library versions",
                            ", ".join(f"{k} {v}" for k, v in shown.items()), (), "environment", {"versions": versions}))
    return findings


def check_gpu(plan: Plan, gpu: GpuSpec | None, budget_bytes: int | None) -> list[Finding]:
    findings = []
    if gpu is None:
        return [Finding("env.gpu", "info", "no GPU detected and none named: memory is checked against the budget only",
                        "", ("name the target with --gpu NAME",), "environment")]
    if gpu.detected:
        free = _free_gpu_memory(gpu.index or 0)
        if free is not None and budget_bytes and free < budget_bytes:
            findings.append(Finding("env.gpu-busy", "warning",
                                    f"only {format_bytes(free)} of the GPU is free right now (budget {format_bytes(budget_bytes)})",
                                    "NVML: other processes hold GPU memory", ("stop the other processes (nvidia-smi)",),
                                    "environment", {"free_bytes": free}))
    return findings


def check_card(plan: Plan, gpu: GpuSpec | None, model: ModelSpec | None) -> list[Finding]:
    """What runs on the card and for the model's class, by the one rule the tuner plans with
    (advisor.core.card_rules): what it refuses is an error (NO-GO), what runs by a slower path or with a better
    choice at hand is said (info, so the tuner's own answers stay GO)."""
    return [Finding(f"config.{f.id}", "error" if f.effect == "refuse" else "info", f.title, f.evidence, (f.fix,),
                    "config", {"key": f.knob, "value": f.value}) for f in Card.of(gpu, model).findings(plan)]


def _free_gpu_memory(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML
        return None


def check_host(host_bytes: int, checkpoint_bytes: int, output_dir: str) -> list[Finding]:
    import psutil

    findings = []
    if host_bytes:
        avail = psutil.virtual_memory().available
        sev = "error" if host_bytes > avail else "ok"
        findings.append(Finding("env.host-ram", sev, f"offload needs {format_bytes(host_bytes)} of host RAM; "
                                f"{format_bytes(avail)} available", "", () if sev == "ok" else
                                ("add RAM, or fit the plan on the GPU (QLoRA, checkpointing) instead of offloading",),
                                "environment"))
    target = Path(output_dir)
    probe = next((p for p in [target, *target.parents] if p.exists()), Path("."))
    free = shutil.disk_usage(probe).free
    if checkpoint_bytes > free:
        findings.append(Finding("env.disk", "error", f"a checkpoint needs {format_bytes(checkpoint_bytes)}, "
                                f"{format_bytes(free)} free under {probe}", "",
                                ("free disk space or set save_total_limit / a larger disk for output_dir",), "environment"))
    else:
        findings.append(Finding("env.disk", "ok", f"disk: {format_bytes(free)} free for checkpoints of "
                                f"~{format_bytes(checkpoint_bytes)}", "", (), "environment"))
    return findings
