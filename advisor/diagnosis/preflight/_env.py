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
from advisor.core.fit import host_fits, host_usable_bytes
from advisor.core.units import Budget, format_bytes
from advisor.memory.ledger import MemoryReport
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


LOSS_KERNELS = {"advisor": ("liger-kernel", "liger_kernel", "use_liger_kernel: true"),
                "llamafactory": ("liger-kernel", "liger_kernel", "enable_liger_kernel: true"),
                "axolotl": ("liger-kernel", "liger_kernel", "liger_fused_linear_cross_entropy: true")}
"""The package each format's fused linear cross-entropy comes from (TRL's SFTTrainer fuses the head itself: none),
its module, and the key that asks for it. transformers' Trainer refuses use_liger_kernel without the package
(TrainingArguments: is_liger_kernel_available)."""


def check_loss_kernel(plan: Plan, fmt: str, data: dict, gpu_here: bool) -> list[Finding]:
    """A fused-linear plan whose file asks for a kernel package that is not installed: the run stops before its first
    step where it would start here (a GPU detected), so NO-GO; on a machine without a GPU, a note for the one that
    trains."""
    if plan.loss != "fused-linear" or fmt not in LOSS_KERNELS:
        return []
    package, module, key = LOSS_KERNELS[fmt]
    if fmt == "axolotl" and data.get("cut_cross_entropy"):
        package, module, key = "cut-cross-entropy", "cut_cross_entropy", "cut_cross_entropy: true"
    if importlib.util.find_spec(module) is not None:
        return []
    where = "here" if gpu_here else "on this machine (no GPU here: the one that trains needs it)"
    return [Finding("env.missing-package", "error" if gpu_here else "info",
                    f"{package} is not installed {where}: the plan's fused-linear loss ({key}) comes from it",
                    f"importlib cannot find {module}; the memory planned counts the fused loss",
                    (f"pip install {package}", "or loss plain / chunked in the plan (more memory at the head)"),
                    "environment")]


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
        findings.append(Finding("env.missing-package", "error",
                                "deepspeed is not installed (the plan offloads to the CPU)",
                                "", ("pip install deepspeed",), "environment"))
    if plan.attn_impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        findings.append(Finding("env.flash-attn", "error",
                                "flash_attention_2 requested but flash-attn is not installed",
                                "importlib cannot find flash_attn",
                                ("use attn_implementation: sdpa (no extra package)",
                                 "pip install flash-attn --no-build-isolation (needs a matching CUDA toolkit)"),
                                "environment"))
    if plan.attn_impl == "flash_attention_3" and importlib.util.find_spec("flash_attn_interface") is None:
        # transformers is_flash_attn_3_available: the flash-attn-3 distribution's flash_attn_interface module
        findings.append(Finding("env.flash-attn", "error", "flash_attention_3 requested but FlashAttention-3 is not "
                                "installed", "importlib cannot find flash_attn_interface",
                                ("use attn_implementation: flash_attention_2 or sdpa",
                                 "build flash-attn's hopper/ directory (cd hopper && python setup.py install; "
                                 "CUDA >= 12.3, an H100/H800-class GPU)"), "environment"))
    shown = {k: v for k, v in versions.items() if v}
    findings.append(Finding("env.versions", "info", "library versions",
                            ", ".join(f"{k} {v}" for k, v in shown.items()), (), "environment", {"versions": versions}))
    return findings


def check_shell_allocator(extras: dict) -> list[Finding]:
    """Say where the allocator setting checked came from when it is this shell's (advisor.configs.read)."""
    return [Finding("env.allocator", "info", f"{k}={v} read from this shell",
                    "torch reads it when CUDA starts, over the file's own setting: the run started from this shell "
                    "is the run checked", (), "environment") for k, v in extras.get("shell_env", {}).items()]


def check_gpu(plan: Plan, gpu: GpuSpec | None, budget_bytes: int | None) -> list[Finding]:
    findings = []
    if gpu is None:
        return [Finding("env.gpu", "info", "no GPU detected and none named: memory is checked against the budget only",
                        "", ("name the target with --gpu NAME",), "environment")]
    if gpu.detected:
        free = _free_gpu_memory(gpu.index or 0)
        if free is not None and budget_bytes and free < budget_bytes:
            findings.append(Finding("env.gpu-busy", "warning",
                                    f"only {format_bytes(free)} of the GPU is free right now "
                                    f"(budget {format_bytes(budget_bytes)})",
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


def check_host(report: MemoryReport, host_budget: Budget | None, checkpoint_bytes: int, output_dir: str,
               detected: bool = False, gpus: int = 1) -> list[Finding]:
    """Host RAM by the host rule (advisor.core.fit.host_fits: the host peak, pinned and pageable, against the
    host budget less the OS reserve), then disk for checkpoints. With a detected budget, also what is free on
    this machine right now (psutil ``available``: other processes' memory)."""
    findings = host_memory_findings(report, host_budget, detected, gpus)
    target = Path(output_dir)
    probe = next((p for p in [target, *target.parents] if p.exists()), Path("."))
    free = shutil.disk_usage(probe).free
    if checkpoint_bytes > free:
        findings.append(Finding("env.disk", "error", f"a checkpoint needs {format_bytes(checkpoint_bytes)}, "
                                f"{format_bytes(free)} free under {probe}", "",
                                ("free disk space or set save_total_limit / a larger disk for output_dir",),
                                "environment"))
    else:
        findings.append(Finding("env.disk", "ok", f"disk: {format_bytes(free)} free for checkpoints of "
                                f"~{format_bytes(checkpoint_bytes)}", "", (), "environment"))
    return findings


def host_memory_findings(report: MemoryReport, host_budget: Budget | None, detected: bool = False,
                         gpus: int = 1) -> list[Finding]:
    """The host rule's finding: NO-GO (an error) naming the pinned and pageable bytes when the host peak is over
    the host budget less the OS reserve."""
    hm = report.host_memory
    fmt = host_budget.format if host_budget is not None else format_bytes
    peak = report.host_peak_bytes * gpus
    pinned, pageable = report.host_pinned_bytes * gpus, report.host_pageable_bytes * gpus
    phase = hm.peak_phase if hm is not None else "train"
    during = f", during load ({hm.load_what})" if hm is not None and phase == "load" else ""
    parts = f"pinned {fmt(pinned)}, pageable {fmt(pageable)}{during}"
    if hm is not None:
        parts += f", the process {fmt(hm.baseline_bytes)}"
    data = {"host_peak_bytes": peak, "host_pinned_bytes": pinned, "host_pageable_bytes": pageable,
            "host_peak_phase": phase, "host_budget_bytes": host_budget.bytes if host_budget else None}
    if host_budget is None:
        return [Finding("env.host-ram", "info", f"host memory: peak {fmt(peak)} ({parts}); no host budget to "
                        "check against", "", ("pass --host-budget",), "environment", data)]
    usable = host_usable_bytes(host_budget.bytes)
    data["host_usable_bytes"] = int(usable)
    # this machine's RAM as detected, a node's the run is planned for (its text says which), or --host-budget's
    where = f"{host_budget} of RAM (detected)" if detected else host_budget.text if "(" in host_budget.text \
        else f"{host_budget} of RAM"
    if not host_fits(peak, host_budget.bytes):
        return [Finding("env.host-ram", "error",
                        f"host memory: peak {fmt(peak)} > {fmt(usable)} usable of {where}",
                        f"{parts}; the OS keeps {fmt(host_budget.bytes - usable)} (GKE's node reservation). "
                        "Pinned pages cannot be swapped: the run ends in cudaErrorMemoryAllocation or the OOM killer",
                        host_fixes(report), "environment", data)]
    findings = [Finding("env.host-ram", "ok", f"host memory: peak {fmt(peak)} of {fmt(usable)} "
                        f"usable ({where})", parts, (), "environment", data)]
    findings += _memlock_findings(report, pinned)
    if detected:
        import psutil

        avail = int(psutil.virtual_memory().available)
        if avail < peak:
            findings.append(Finding("env.host-busy", "warning", f"only {format_bytes(avail)} of host RAM is free right "
                                    f"now; the run's host peak is {format_bytes(peak)}",
                                    "psutil: other processes hold memory", ("stop other processes before the run",),
                                    "environment", {"available_bytes": avail, "host_peak_bytes": peak}))
    return findings


def host_fixes(report: MemoryReport) -> tuple[str, ...]:
    """What lowers the host peak, by what sets it."""
    h, hm = report.host, report.host_memory
    fixes = []
    if hm is not None and hm.peak_phase == "load":
        fixes.append("load with a device_map (or 4-bit quantization) so the weights go to the GPU tensor by tensor")
    if h.get("activations", 0):
        fixes.append("offload activations with gradient checkpointing on (only each layer's input goes to the host), "
                     "or a smaller micro-batch, or no activation offload")
    if h.get("optimizer_states", 0) + h.get("master_weights", 0) + h.get("gradients", 0) > h.get("activations", 0):
        fixes.append("train LoRA / QLoRA adapters instead of offloading a full fine-tune (ZeRO-Offload keeps ~18 B per "
                     "trainable parameter on the host)")
    fixes.append("run on a machine with more RAM (--host-budget to plan for it), or `advisor tune` for a plan "
                 "within it")
    return tuple(fixes)


def _memlock_findings(report: MemoryReport, pinned: int) -> list[Finding]:
    """torch pins through cudaHostAlloc, which ``ulimit -l`` does not cap; DeepSpeed's native pinning backend
    (``DS_PIN_MEMORY_BACKEND=native``, deepspeed/utils/pin_memory.py) locks pages with mlock, which it does."""
    import os
    import resource

    if os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() != "native" or not pinned \
            or (report.host_memory is not None and not report.host_memory.pinned.keys() - {"activations"}):
        return []
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= pinned:
        return []
    return [Finding("env.memlock", "error", f"DS_PIN_MEMORY_BACKEND=native locks {format_bytes(pinned)} with mlock, "
                    f"over this shell's locked-memory limit of {format_bytes(soft)} (ulimit -l)", "",
                    ("raise the limit (ulimit -l unlimited; memlock in /etc/security/limits.conf, or --ulimit "
                     "memlock=-1 for docker)",
                     "or unset DS_PIN_MEMORY_BACKEND: torch's pinning is not capped by ulimit -l"),
                    "environment", {"memlock_bytes": soft, "host_pinned_bytes": pinned})]
