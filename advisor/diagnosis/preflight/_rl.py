"""GRPO/DPO checks of a preflight: the phase that sets the run's peak, what vLLM holds, and the fixes per phase.

A GRPO step generates (vLLM's pool, or generate()'s KV cache), scores (no-grad log-prob passes of the policy and the
reference) and trains; DPO trains chosen and rejected through the policy and the reference. The run fits when its
highest phase does (advisor.memory.rl, the closed form; docs/rl.md). Calculation only: findings, rendered by the CLI.
"""

from __future__ import annotations

from typing import Any

from advisor.core.plan import GRPO, RL_TASKS, Plan
from advisor.core.units import Budget, format_bytes
from advisor.diagnosis.findings import Finding
from advisor.memory.ledger import MemoryReport

RL_PHASES = ("generate", "score", "train", "sync")
"""The phases of a step a GRPO/DPO preflight names (DPO's step is train; its reference forward runs inside it; sync:
the weights pushed into vLLM after each optimizer step)."""
LR_RANGE = {"peft": (1e-7, 1e-4), "full": (1e-8, 1e-5)}
"""Usual GRPO/DPO learning rates, 10x beyond each side: TRL's GRPOConfig/DPOConfig default 1e-6 (full), its PEFT
examples' 1e-5 (adapters); SFT's 2e-4 for LoRA is far too high for a policy-gradient or preference step."""


def is_rl(plan: Plan) -> bool:
    return plan.task in RL_TASKS


def phase_peaks(report: MemoryReport) -> dict[str, dict[str, Any]]:
    """{phase: its live and peak bytes and what sets it}, for the step's phases the run has, in order."""
    phases = report.run_phases.phases if report.run_phases is not None else {}
    return {name: {"live_bytes": p.live_bytes, "peak_bytes": p.peak_bytes, "what": p.what}
            for name, p in phases.items() if name in RL_PHASES and p.included}


def step_peak_phase(report: MemoryReport) -> str | None:
    """Which of generate / score / train / sync holds the most live memory (the step's own peak phase)."""
    peaks = phase_peaks(report)
    return max(peaks, key=lambda n: peaks[n]["live_bytes"]) if peaks else None


def phase_finding(report: MemoryReport, budget: Budget | None) -> list[Finding]:
    """One line per step phase, the one that sets the peak named (info: the verdict is memory.fit's)."""
    peaks = phase_peaks(report)
    if not peaks:
        return []
    fmt = budget.format if budget is not None else format_bytes
    top = step_peak_phase(report)
    parts = [f"{name} {fmt(p['live_bytes'])}" + (" (peak)" if name == top else "") for name, p in peaks.items()]
    return [Finding("memory.phases", "info",
                    f"step phases (live tensors): {', '.join(parts)}; {top} sets the step's peak",
                    f"{top}: {peaks[top]['what']}; the run's peak is in {report.run_peak_phase}", (), "memory",
                    {"phases": peaks, "step_peak_phase": top, "run_peak_phase": report.run_peak_phase})]


def generation_findings(report: MemoryReport, plan: Plan, budget: Budget | None) -> list[Finding]:
    """What vLLM holds (pool, weights, KV cache and the tokens it holds), and when it cannot start or preempts."""
    gen = report.extra.get("generation")
    if plan.task != GRPO or not gen:
        return []
    fmt = budget.format if budget is not None else format_bytes
    if gen["engine"] == "transformers":
        return [Finding("memory.generation", "info",
                        f"generate(): KV cache {fmt(gen['kv_cache_bytes'])} for {gen['sequences']} completions of "
                        f"{gen['sequence_tokens']:,} tokens", "", (), "memory", {"generation": gen})]
    where = "per server GPU" if gen["engine"] == "vllm-server" else "on the training GPU"
    held = (f"vLLM pool {fmt(gen['pool_bytes'])} {where}: weights {fmt(gen['weights_bytes'])}, KV cache "
            f"{fmt(gen['kv_cache_bytes'])} ({gen['kv_tokens']:,} tokens), CUDA graphs, activations and non-torch "
            f"{fmt(gen['reserve_bytes'])}")
    notes = "; ".join(gen.get("notes") or ())
    if not gen["starts"]:
        first = ("raise vllm_gpu_memory_utilization: the pool holds no KV cache beyond vLLM's weights and reserve"
                 if gen["kv_cache_bytes"] <= 0 else
                 "lower vllm_gpu_memory_utilization so the pool fits beside what the trainer holds at vLLM's start")
        return [Finding("memory.vllm-start", "error", "vLLM cannot start: " + held, notes,
                        (first, "set vllm_max_model_length to prompt + completion",
                         "or run vLLM as a server on other GPUs (vllm_mode: server)"), "memory", {"generation": gen})]
    if not gen["holds_batch"]:
        return [Finding("memory.vllm-kv", "warning",
                        f"{held}: it does not hold one generation batch ({gen['batch_tokens']:,} tokens): vLLM "
                        "preempts sequences and recomputes them (slower, no OOM)", notes,
                        ("raise vllm_gpu_memory_utilization, or lower per_device_train_batch_size x "
                         "steps_per_generation",), "memory", {"generation": gen})]
    return [Finding("memory.generation", "info", held + f"; holds one generation batch ({gen['batch_tokens']:,} "
                    "tokens)", "nvidia-smi shows the pool from vLLM's start, whatever the trainer uses after", (),
                    "memory", {"generation": gen})]


def phase_fixes(phase: str, plan: Plan) -> tuple[str, ...]:
    """What lowers the phase that sets a GRPO/DPO run's peak, the cheapest first."""
    if phase == "generate":
        if plan.generation == "transformers":
            return ("lower per_device_train_batch_size x steps_per_generation (the completions generated at once)",
                    "generate with vLLM (use_vllm) and its sleep mode, or on a vLLM server (vllm_mode: server)")
        return ("lower vllm_gpu_memory_utilization (the pool vLLM reserves at start)",
                "set vllm_max_model_length to prompt + completion",
                "or run vLLM as a server on other GPUs (vllm_mode: server)")
    if phase in ("score", "train", "sync"):
        fixes = []
        if plan.generation == "vllm-colocate" and plan.vllm_sleep != 2:
            fixes.append("vllm_enable_sleep_mode: true (vLLM frees its weights and KV cache while the trainer scores "
                         "and trains)")
        if plan.micro_batch > 1:
            fixes.append("lower per_device_train_batch_size (raise gradient_accumulation_steps to keep the batch)")
        if not plan.gradient_checkpointing:
            fixes.append("turn on gradient checkpointing")
        if plan.peft and plan.reference == "copy":
            fixes.append("score the reference with the adapter disabled (no copy)")
        if plan.peft and not plan.quantized:
            fixes.append("load the base in 4-bit (QLoRA nf4)")
        return (*fixes, "or run `advisor tune --task " + plan.task + "` for the fastest plan that fits")
    return ()


def check_learning_rate(plan: Plan, training: dict[str, Any]) -> list[Finding]:
    lr = training.get("learning_rate")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return []
    low, high = LR_RANGE["peft" if plan.peft else "full"]
    if low <= lr <= high:
        return []
    usual = "1e-6 to 5e-5" if plan.peft else "1e-7 to 1e-6"
    return [Finding("config.learning-rate", "warning",
                    f"learning rate {lr:g} is far outside the usual range for {plan.task.upper()} with {plan.method} "
                    f"({usual})", "too high collapses the policy (reward and KL jump); too low barely moves it",
                    (f"set learning_rate to {'1e-5' if plan.peft else '1e-6'}",), "config")]
