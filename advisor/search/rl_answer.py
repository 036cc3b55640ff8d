"""What a GRPO/DPO answer of the tuner is, beside its training levers: how completions are generated (the engine,
vLLM's pool, sleep and GPUs, the generation batch, the reference), and its phases: each phase's peak and what sets
it (generate, score, train...), what vLLM's pool holds (its weights, its KV cache and how many tokens that is against
one generation batch), and each phase's share of the step. From the closed form (advisor/memory/rl.py,
advisor/speed/rl.py) for the answer's plan on one of the GPUs that train; pure of any rendering."""

from __future__ import annotations

from typing import Any

from advisor.core.plan import GRPO, RL_TASKS, Plan, effective_beta, generation_steps
from advisor.memory.sharding import DEFAULT_SHARDING

GENERATION_KEYS = ("engine", "pool_bytes", "weights_bytes", "kv_cache_bytes", "kv_tokens", "batch_tokens",
                   "holds_batch", "starts", "notes")
"""The ``generation`` object's keys a tune answer shows (advisor.memory.rl: vLLM's pool as vLLM accounts it)."""


def generation_settings(plan: Plan, gpus: int = 1) -> dict[str, Any]:
    """The plan's GRPO/DPO settings, the user's workload apart from the levers the search turned."""
    if plan.task not in RL_TASKS:
        return {}
    values = vars(plan)
    out: dict[str, Any] = {"task": plan.task, "workload": {"beta": effective_beta(values)}, "levers": {}}
    if plan.task == GRPO:
        out["workload"].update(num_generations=plan.num_generations, max_prompt_length=plan.max_prompt_length,
                               max_completion_length=plan.max_completion_length)
        levers = {"generation": plan.generation, "steps_per_generation": generation_steps(plan),
                  "generation_batch": plan.micro_batch * gpus * generation_steps(plan)}
        if plan.generation == "vllm-colocate":
            levers.update(vllm_gpu_memory_utilization=plan.vllm_gpu_memory_utilization, vllm_sleep=plan.vllm_sleep)
        if plan.generation == "vllm-server":
            levers["vllm_gpus"] = plan.vllm_gpus
        out["levers"] = levers
    else:
        out["workload"]["seq_len"] = plan.seq_len
        out["levers"]["padding_free"] = plan.padding_free
    if effective_beta(values) > 0 or plan.task != GRPO:
        out["levers"]["reference"] = plan.reference
    return out


def rl_answer(model, plan: Plan, gpu, gpus: int = 1, sharding: str = DEFAULT_SHARDING, backend: str = "estimate"
              ) -> dict[str, Any] | None:
    """The answer's settings, phases, vLLM's pool and step shares (None for a supervised plan). ``gpus``: the GPUs
    that train (a vLLM server's are apart); ``backend``: the one that gave the answer's peak (its phases then peak
    where the answer says)."""
    if plan.task not in RL_TASKS:
        return None
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases
    from advisor.search.prediction import shard_to
    from advisor.speed.throughput import rl_times

    report = get_backend(backend).measure(model, plan, gpu)
    report = with_phases(model, plan, gpu, shard_to(report, model, plan, gpus, sharding, gpu))
    included = {name: p for name, p in report.run_phases.phases.items() if p.included}
    phases = {name: {"peak_bytes": p.peak_bytes, "what": p.what, "source": p.source} for name, p in included.items()}
    traced = [name for name, p in included.items() if p.source != "estimated"]
    gen = report.extra.get("generation") or None
    out = {**generation_settings(plan, gpus), "phases": phases, "run_peak_phase": report.run_peak_phase,
           "run_peak_bytes": report.run_peak_bytes,
           "phases_source": f"{' and '.join(traced)} simulated, the rest closed form" if traced else "closed form",
           "generation": {k: gen[k] for k in GENERATION_KEYS if k in gen} if gen else None}
    try:
        times = rl_times(model, plan, gpu, gpus, sharding)
        out["step_shares"] = dict(times.shares)
        out["completion_tokens_per_s" if plan.task == GRPO else "pair_tokens_per_s"] = times.completion_tokens_per_s
    except (ValueError, KeyError, ZeroDivisionError):
        out["step_shares"] = {}
    return out


def rl_answer_lines(answer: dict[str, Any] | None, fmt) -> list[str]:
    """The answer's GRPO/DPO lines for the terminal (``fmt``: bytes in the budget's unit)."""
    if not answer:
        return []
    w, lv = answer["workload"], answer["levers"]
    words = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w.items())
    lines = [f"{answer['task'].upper()} workload (yours, never searched): {words}.",
             ("Generation settings" if answer["task"] == GRPO else "Reference settings") + " beside the training ones: "
             + ", ".join(
                 f"{k.replace('_', ' ')} {'TRL default' if v is None else v}" for k, v in lv.items()) + "."]
    shares = answer.get("step_shares") or {}
    parts = [f"{name} {fmt(p['peak_bytes'])} ({p['what']})" + (f", {shares[name]:.0%} of the step" if name in shares
                                                                 else "")
             for name, p in answer["phases"].items()]
    lines.append(f"Phases ({answer['phases_source']}; the run peak is {answer['run_peak_phase']}): " + "; ".join(parts)
                 + ".")
    g = answer.get("generation")
    if g and g.get("pool_bytes"):
        held = "holds" if g.get("holds_batch") else "does not hold (vLLM preempts and recomputes: slower)"
        lines.append(f"vLLM ({g['engine']}): pool {fmt(g['pool_bytes'])} = weights {fmt(g['weights_bytes'])} "
                     "+ KV cache "
                     f"{fmt(g['kv_cache_bytes'])} ({g['kv_tokens']:,} tokens) + the rest; it {held} one generation "
                     f"batch of {g['batch_tokens']:,} tokens" + ("" if g.get("starts", True) else "; vLLM cannot start")
                     + ".")
    elif g:
        lines.append(f"Generation by {g['engine']}: no vLLM pool on the training GPU.")
    return lines


__all__ = ["generation_settings", "rl_answer", "rl_answer_lines"]
