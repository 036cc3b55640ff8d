"""The ladder: candidates in the seeds' priority order, tried before the sampler explores.

0. the reference: a full fine-tune without techniques (shows what the techniques are for)
1. quantized loading and PEFT (QLoRA on a 4-bit base; LoRA on a 16-bit base)
2. the same with gradient checkpointing
3. CPU offload (DeepSpeed ZeRO-2; FSDP's on several GPUs) as the last resort

For each rung the micro-batch is the largest the closed-form ledger says fits, so that the
first trials already land near the feasible frontier.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.core.knobs import prefer
from advisor.search.space import SearchSpace, search_knobs


def _pick(values: list, preferred: list) -> Any:
    return prefer(*preferred)(values)


def ladder(space: SearchSpace, fits_with_micro_batch: Callable[[dict[str, Any]], bool]) -> list[tuple[str, dict]]:
    """(rung name, params) in priority order, restricted to the space."""
    s = space.search
    # every knob the rungs do not turn takes the value its declaration prefers for the ladder (Search.ladder)
    base = {k.name: k.search.ladder(s[k.name]) for k in search_knobs(space.plan).values()
            if k.search.ladder is not None and k.name in s}
    rungs: list[tuple[str, dict]] = []
    methods = space.methods()

    def add(name: str, method: str, **changes: Any) -> None:
        if method not in methods:
            return
        quants = space.quantizations_for(method)
        quant = _pick(quants, ["nf4", "int8", "none"] if method != "lora" else ["none", "int8"])
        params = {**base, "method": method, "quantization": quant, **changes}
        if method == "full" or quant not in ("nf4", "fp4"):
            params["double_quant"] = False
        if "optimizer" not in changes:
            params["optimizer"] = _pick(s["optimizer"], ["paged_adamw_8bit", "adamw_8bit", "adamw_torch"]
                                        if method == "qlora" else ["adamw_torch", "adamw_8bit"])
        if params["offload"] != "none":
            params["optimizer"] = "adamw_torch"
            if "adamw_torch" not in s["optimizer"]:
                return
        if any(params[k] not in s[k] for k in ("gradient_checkpointing", "offload", "optimizer")):
            return
        sizes = space.micro_batches()  # those that keep the global batch
        fitting = [mb for mb in sizes if fits_with_micro_batch({**params, "micro_batch": mb})]
        params["micro_batch"] = fitting[-1] if fitting else sizes[0]
        if params not in [p for _, p in rungs]:
            rungs.append((name, params))

    ckpt_off = _pick(s["gradient_checkpointing"], [False])
    add("0 reference: full fine-tune", "full", gradient_checkpointing=ckpt_off, offload="none")
    for method in ("qlora", "lora"):
        add(f"1 quantized loading + PEFT ({method})", method, gradient_checkpointing=ckpt_off)
    for method in ("qlora", "lora"):
        add(f"2 + gradient checkpointing ({method})", method, gradient_checkpointing=True)
    if "zero2_cpu" in s["offload"]:
        for method in ("lora", "full"):
            add(f"3 + CPU offload ({method})", method, gradient_checkpointing=True, offload="zero2_cpu")
    if "zero3_cpu" in s["offload"]:
        # the parameters too (DeepSpeed ZeRO-3 offload): what fits a model whose weights alone are over the GPU
        for method in ("lora", "full"):
            add(f"3 + ZeRO-3 CPU offload ({method})", method, gradient_checkpointing=True, offload="zero3_cpu")
    if "fsdp_cpu" in s["offload"]:
        # several GPUs: every shard of the model state on the host (Answer.AI's fsdp_qlora way to fit a 70B QLoRA on
        # two 24 GB cards); a rung the GPU count's rules refuse (one GPU) is left out
        for method in ("qlora", "lora"):
            add(f"3 + FSDP CPU offload ({method})", method, gradient_checkpointing=True, offload="fsdp_cpu")
    if "fused-linear" in s["loss"]:
        # today's stacks: the loss fused into the output projection (no logits), a 16-bit base without
        # recomputation first (Liger / cut cross-entropy in TRL, axolotl, LLaMA-Factory)
        for method in ("lora", "qlora"):
            add(f"4 fused linear loss ({method})", method, gradient_checkpointing=ckpt_off, loss="fused-linear")
    if "vllm-colocate" in s.get("generation", ()) and 2 in s.get("vllm_sleep", ()):
        # GRPO: vLLM beside the trainer, its pool dropped while the step trains (TRL's vllm_enable_sleep_mode)
        for method in ("lora", "qlora"):
            add(f"5 vLLM colocated, asleep while training ({method})", method, gradient_checkpointing=True,
                generation="vllm-colocate", vllm_sleep=2)
    return rungs


def is_reference(plan: dict[str, Any]) -> bool:
    """Rung 0's kind of plan, told by the plan itself (never by a rung's label): a full fine-tune without
    gradient checkpointing or offload, which shows what the techniques are for."""
    return (plan.get("method") == "full" and not plan.get("gradient_checkpointing")
            and plan.get("offload", "none") == "none")


__all__ = ["is_reference", "ladder"]
