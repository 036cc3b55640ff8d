"""Search the serving space: every discrete choice, with the largest concurrency that fits found by bisection.

Why a grid and not an Optuna study: the space is small (at most 4 weight formats x 3 group sizes x 2 KV
dtypes x 2 block sizes x 5 contexts = a few hundred points), each point is scored by the analytic ledger
in microseconds, and concurrency need not be sampled at all: the ledger grows monotonically with it, so
bisection finds the largest that fits exactly (8 steps for 256). Enumerating everything is exact and
faster than any sampler; an Optuna study (as the training tuner keeps) would add storage for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Any, Iterator

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.memory.ledger import MemoryReport
from advisor.core.serve_priors import load_priors, quality_prior
from advisor.core.serving_checkpoints import checkpoint_group_size
from advisor.search.serve_space import ServeSpace
from advisor.memory.inference import ServePlan, estimate_inference
from advisor.speed.decode import DecodeThroughput, decode_throughput


@dataclass(frozen=True)
class Candidate:
    """One scored serving plan."""

    plan: ServePlan
    report: MemoryReport
    """The vLLM ledger of the plan (estimated)."""
    limit_bytes: int
    """What vLLM may use: gpu_memory_utilization x total memory."""
    gpu_memory_utilization: float
    fits: bool
    quality: float
    """Expected accuracy recovery (prior)."""
    throughput: DecodeThroughput

    @property
    def served_tokens(self) -> int:
        return self.plan.concurrency * self.plan.context_len

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "plan_short": self.plan.short(), "peak_bytes": self.report.peak_bytes,
                "ledger": self.report.device, "limit_bytes": self.limit_bytes,
                "gpu_memory_utilization": self.gpu_memory_utilization, "fits": self.fits,
                "served_tokens": self.served_tokens, "quality": self.quality, "quality_source": "prior",
                "tokens_per_s": round(self.throughput.tokens_per_s, 1), "tokens_per_s_source": "predicted",
                "source": self.report.source}


def score(model: ModelSpec, plan: ServePlan, gpu: GpuSpec, limit_bytes: int, util: float) -> Candidate:
    report = estimate_inference(model, plan, gpu, engine="vllm")
    return Candidate(plan=plan, report=report, limit_bytes=limit_bytes, gpu_memory_utilization=util,
                     fits=report.peak_bytes <= limit_bytes,
                     quality=quality_prior(plan.weight_format, plan.group_size, plan.kv_dtype),
                     throughput=decode_throughput(model, plan, gpu))


def weight_formats(model: ModelSpec, space: ServeSpace, gpu: GpuSpec | None = None) -> list[str]:
    """The space's weight formats for this model on this card: a checkpoint that ships its experts in MXFP4
    (gpt-oss) adds ``mxfp4`` where vLLM has an MXFP4 MoE kernel (serve_priors.yaml ``mxfp4.min_sm``: Marlin from
    sm80); ``mxfp4`` in the space is dropped for a model without such experts."""
    from advisor.memory.inference import ships_mxfp4_experts

    formats = [f for f in space.search["weight_format"] if f != "mxfp4"]
    min_sm = load_priors()["mxfp4"]["min_sm"]
    if ships_mxfp4_experts(model) and (gpu is None or gpu.sm is None or gpu.sm >= min_sm):
        formats.insert(0, "mxfp4")
    return formats


def served_contexts(model: ModelSpec, space: ServeSpace, context_len: int | None, vision=None) -> list[int]:
    """The contexts (vLLM --max-model-len) to plan: ``--context-len`` as given (it must hold the images: checked by
    the plan), else each of the space's text contexts plus a prompt's image tokens (vLLM's max_model_len holds "the
    number of text tokens plus multimodal tokens"), within the model's maximum."""
    s = space.search
    limit = model.max_position_embeddings or max(s["context_len"])
    if context_len:
        return [context_len]
    extra = vision.tokens if vision is not None else 0
    contexts = sorted({c + extra for c in s["context_len"] if c + extra <= limit})
    if not contexts and extra:
        from advisor.core.errors import AdvisorInputError

        raise AdvisorInputError("--image-size", f"a prompt's images take {extra:,} tokens, and with the space's "
                                f"shortest text context they exceed {model.name}'s maximum context {limit:,}",
                                ",".join(map(str, vision.image_tokens_per_image)))
    return contexts or [limit]


def base_plans(model: ModelSpec, space: ServeSpace, context_len: int | None,
               gpu: GpuSpec | None = None, vision=None) -> Iterator[ServePlan]:
    """Every discrete combination (the checkpoint style, and with it the group size, only varies for int4)."""
    s = space.search
    contexts = served_contexts(model, space, context_len, vision)
    for wf, kv, block, ctx in product(weight_formats(model, space, gpu), s["kv_dtype"], s["block_size"], contexts):
        # an int4 plan is served from a checkpoint in that format: its group size is the checkpoint's
        # (advisor.core.serving_checkpoints), whatever group sizes the space lists
        quant = sorted({(checkpoint_group_size(model.hf_id, m), m) for m in s["quant_method"]}) if wf == "int4" \
            else [(128, "awq")]
        for group, method in quant:
            yield ServePlan(weight_format=wf, group_size=group, quant_method=method, kv_dtype=kv, block_size=block,
                            context_len=ctx, concurrency=1,
                            max_num_batched_tokens=space.fixed["max_num_batched_tokens"], vision=vision)


def largest_concurrency(model: ModelSpec, plan: ServePlan, gpu: GpuSpec, limit_bytes: int, util: float,
                        cap: int) -> Candidate:
    """The candidate with the most sequences that fits (bisection: the ledger grows with concurrency);
    the one-sequence candidate, marked not fitting, when even that does not fit."""
    one = score(model, replace(plan, concurrency=1), gpu, limit_bytes, util)
    if not one.fits:
        return one
    lo, hi = 1, cap
    best = one
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c = score(model, replace(plan, concurrency=mid), gpu, limit_bytes, util)
        if c.fits:
            lo, best = mid, c
        else:
            hi = mid - 1
    return best


def largest_static_batch(model: ModelSpec, plan: ServePlan, gpu: GpuSpec | None, limit_bytes: int,
                         cap: int | None = None) -> int:
    """The most sequences transformers' static cache holds within ``limit_bytes``: it preallocates batch x context
    tokens of K and V in the model dtype (no paging, no fp8 cache), so it holds fewer than vLLM's pool; 0 when even
    one does not fit (bisection: the hf ledger grows with the batch)."""
    hf = replace(plan, kv_dtype="bf16" if plan.kv_dtype == "fp8" else plan.kv_dtype)

    def fits(batch: int) -> bool:
        return estimate_inference(model, replace(hf, concurrency=batch), gpu, engine="hf").peak_bytes <= limit_bytes

    if not fits(1):
        return 0
    lo, hi = 1, cap or max(plan.concurrency, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def search(model: ModelSpec, space: ServeSpace, gpu: GpuSpec, limit_bytes: int, util: float,
           context_len: int | None = None, concurrency: int | None = None, vision=None) -> list[Candidate]:
    """Score every point of the space; with ``concurrency`` given it is pinned, else maximised. ``vision``
    (advisor.memory.serve_vision.ServeVision): a vision-language model's served images."""
    out = []
    for plan in base_plans(model, space, context_len, gpu, vision):
        if concurrency:
            out.append(score(model, replace(plan, concurrency=concurrency), gpu, limit_bytes, util))
        else:
            out.append(largest_concurrency(model, plan, gpu, limit_bytes, util, space.fixed["max_concurrency"]))
    return out
