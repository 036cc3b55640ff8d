"""Why the smallest plan of a space is over the budget, and what would fit: the words of tune's refusal.

A mixture of experts loaded in 4 or 8 bits keeps its experts in bf16: bitsandbytes replaces ``nn.Linear``
modules, and transformers 5 stores a layer's experts as stacked 3-D parameters (docs/memory.md, "Mixtures of
experts"). The refusal says so, how many GPUs ZeRO-3 would need for the same plan, and what a stack that
quantizes the experts would need, named as another stack and not planned here.
"""

from __future__ import annotations

from advisor.core.catalog import ModelSpec
from advisor.core.fit import fits
from advisor.core.plan import Plan
from advisor.memory.ledger import MemoryReport

GPU_COUNTS = (2, 4, 8, 16, 32, 64)
"""GPU counts a refusal tries for ZeRO-3 (one node of 8, then whole nodes)."""
FOUR_BIT_BYTES = 0.5 + 4 / 64
"""Bytes per weight of an NF4 weight with its absmax per 64 (QLoRA, Dettmers et al. 2023 §3; without double
quantization), the cost of experts a stack quantizes to 4 bits."""


def bf16_expert_bytes(model: ModelSpec, plan: Plan) -> int:
    """Bytes of stacked experts that a 4/8-bit load leaves in bf16 (0 for a dense model or a 16-bit plan)."""
    if not model.is_moe or plan.quantization == "none":
        return 0
    return 2 * model.description.params_by_category.get("experts", 0)


def gpus_for_zero3(model: ModelSpec, plan: Plan, one_gpu: MemoryReport, budget_bytes: int, headroom: float,
                   gpu=None) -> int | None:
    """The fewest GPUs (of GPU_COUNTS) over which ZeRO-3 fits ``plan`` in the budget, per GPU; None past 64."""
    from advisor.memory.sharding import shard_report

    for n in GPU_COUNTS:
        if fits(shard_report(one_gpu, model, plan, n, "zero3", gpu).peak_bytes, budget_bytes, headroom):
            return n
    return None


def what_would_fit(model: ModelSpec, plan: Plan, one_gpu: MemoryReport, budget_bytes: int, headroom: float,
                   fmt, gpu=None) -> str:
    """The refusal's second half, ``""`` when nothing is known: why the weights are that large, and what fits."""
    parts = []
    experts = bf16_expert_bytes(model, plan)
    if experts:
        parts.append(f"bitsandbytes quantizes nn.Linear layers only, and transformers stores this model's experts as "
                     f"stacked 3-D parameters, so {fmt(experts)} of experts stay in bf16 under {plan.quantization}")
    n = gpus_for_zero3(model, plan, one_gpu, budget_bytes, headroom, gpu)
    if n is not None:
        parts.append(f"the same plan fits over {n} GPUs with ZeRO-3 (--gpus {n} --sharding zero3)")
    if experts:
        quantized = one_gpu.peak_bytes - experts + int(experts / 2 * FOUR_BIT_BYTES)
        if fits(quantized, budget_bytes, headroom):
            parts.append(f"a stack that quantizes the experts to 4 bits (Unsloth's MoE code; transformers before 5, "
                         f"whose experts were nn.Linear) would need about {fmt(quantized)}: another stack, not "
                         "planned here")
    return "; ".join(parts)
