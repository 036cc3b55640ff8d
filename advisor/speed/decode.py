"""Decode throughput of a serving plan: a roofline of the bytes each decode step reads and the FLOPs it does
(the serving planner's tokens/s, and a GRPO step's generation phase)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.serve_priors import load_priors
from advisor.memory.inference import ServePlan, serve_weight_bytes


@dataclass(frozen=True)
class DecodeThroughput:
    """Predicted decode throughput from a roofline (labelled "predicted")."""

    tokens_per_s: float
    step_seconds: float
    memory_seconds: float
    compute_seconds: float
    bytes_per_step: float
    source: str = "predicted"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_throughput(model: ModelSpec, plan: ServePlan, gpu: GpuSpec) -> DecodeThroughput:
    """tokens/s = B / max(bytes read per step / bandwidth, FLOPs per step / FLOP/s).

    A decode step reads every weight byte it uses once and each sequence's cache up to its position (on average
    ``mean_context_fraction`` of the context; a sliding-window layer at most its window, a recurrent layer its
    state): Pope et al. 2022 §2 (memory time = bytes / HBM bandwidth); FLOPs 2 per matmul parameter used per token
    plus attention 4 x L x position x q_dim (Kaplan et al. 2020 §2.1). A routed layer's step reads only the experts
    its B tokens pick: E (1 - (1 - k/E)^B) of them on average under a uniform router, and each token computes with
    its top-k only.
    """
    d = load_priors()["decode"]
    weights, consts = serve_weight_bytes(model, plan.weight_format, plan.group_size)
    embed_rows_only = model.embedding_params  # the input embedding is a lookup, not a read of the whole table
    expert_bytes, active_experts, expert_flops = _expert_decode(model, plan, weights + consts)
    weight_read = weights + consts - expert_bytes * (1 - active_experts) - embed_rows_only * 2 + \
        model.hidden_size * plan.concurrency * 2
    pos = plan.context_len * d["mean_context_fraction"]
    scale = {"bf16": 2, "fp16": 2, "fp8": 1}[plan.kv_dtype] / model.description.dtype_bytes
    kv_read = plan.concurrency * model.description.kv_cache_bytes(int(pos)) * scale
    bw = gpu.mem_bw_gbs * 1e9 * d["bandwidth_efficiency"]
    memory = (weight_read + kv_read) / bw
    linear = sum(m.in_features * m.out_features for layer in model.description.layers for m in layer.linears)
    attn_layers = sum(1 for layer in model.description.layers if layer.attention != "linear")
    matmul_params = linear + expert_flops + model.vocab_size * model.hidden_size
    flops = plan.concurrency * (2 * matmul_params + 4 * attn_layers * pos * model.q_dim)
    compute = flops / ((gpu.bf16_tflops or gpu.fp16_tflops) * 1e12 * d["matmul_efficiency"])
    step = max(memory, compute)
    return DecodeThroughput(plan.concurrency / step, step, memory, compute, weight_read + kv_read)


def _expert_decode(model: ModelSpec, plan: ServePlan, weight_bytes: float) -> tuple[float, float, int]:
    """(bytes of the stacked experts, share of them one decode step reads, expert parameters one token computes
    with) for a routed model; (0, 1, 0) for a dense one."""
    if not model.is_moe:
        return 0.0, 1.0, 0
    experts = model.description.params_by_category.get("experts", 0)
    fmt_bytes = 0.5 if plan.weight_format in ("int4", "mxfp4") else 1 if plan.weight_format in ("fp8", "int8") else 2
    E, k = model.moe.num_experts, model.moe.experts_per_token
    active = 1 - (1 - k / E) ** plan.concurrency
    return experts * fmt_bytes, active, int(experts * k / E)
