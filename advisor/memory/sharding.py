"""Plans for several GPUs: data parallel with ZeRO-2, ZeRO-3 or FSDP sharding, per-GPU ledger and
communication volume.

Each GPU runs the plan's micro-batch (data parallel), so saved activations and transients stay
per GPU; what sharding divides is the model state (Rajbhandari et al. 2020, ZeRO §5, fig. 1):

| strategy     | weights        | gradients | optimizer states, masters |
|--------------|----------------|-----------|---------------------------|
| ddp          | replicated     | replicated | replicated               |
| zero2        | replicated     | 1/N       | 1/N                       |
| zero3, fsdp  | 1/N + gathered | 1/N       | 1/N                       |

Communication per optimizer step, bytes each GPU sends (ring collectives move (N-1)/N of the
buffer per reduce-scatter or all-gather; ZeRO §7.2): ddp and zero2 2Ψ(N-1)/N (reduce-scatter +
all-gather of gradients/parameters), zero3/fsdp 3Ψ(N-1)/N (parameters gathered in forward and
again in backward), Ψ = bytes of the trainable parameters (all parameters for zero3's gathers).

A mixture of experts is sharded as any other model: its stacked experts are parameters like the others (ZeRO-3 /
FSDP gather a whole layer, every expert, at a time). Expert parallelism (experts placed on different GPUs, tokens
exchanged by all-to-all) is not planned; the per-GPU ledger says so (``expert_parallel_note``).
"""

from __future__ import annotations

from dataclasses import replace

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.memory.host import SHARDED, whole_model_load
from advisor.memory.ledger import MemoryReport
from advisor.memory.overhead import framework_overhead
from advisor.memory.sequence_parallel import rank_plan
from advisor.memory.training import logits_bytes
from advisor.core.plan import DTYPE_BYTES, Plan

STRATEGIES = ("ddp", "zero2", "zero3", "fsdp")
SHARDS_STATES = ("zero2", "zero3", "fsdp")
"""Strategies that divide gradients and optimizer states across the GPUs (the table above)."""
SHARDS_PARAMETERS = ("zero3", "fsdp")
"""Strategies that also divide the weights, gathering each layer's for forward and backward."""
DEFAULT_SHARDING = "zero3"
"""The strategy of a several-GPU plan unless one is named (``--sharding``, a study's ``sharding``, the
step-time model): ZeRO-3 divides every part of the model state (the table above), the most per-GPU
memory saved; with one GPU the strategy changes nothing."""


def _check(gpus: int, strategy: str) -> None:
    if not isinstance(gpus, int) or gpus < 1:
        raise AdvisorInputError("--gpus", "must be a whole number of at least 1", gpus)
    if strategy not in STRATEGIES:
        raise AdvisorInputError("--sharding", f"must be one of {', '.join(STRATEGIES)}", strategy)


def shard_report(report: MemoryReport, model: ModelSpec, plan: Plan, gpus: int, strategy: str,
                 gpu: GpuSpec | None = None) -> MemoryReport:
    """The per-GPU ledger of ``report`` (one GPU's step) when N GPUs shard the model state."""
    _check(gpus, strategy)
    moe_note = (expert_parallel_note(model, gpus, strategy),) if model.is_moe and gpus > 1 else ()
    if gpus == 1 or strategy == "ddp":
        return replace(report, notes=(*report.notes, *moe_note), sharded=(gpus, strategy),
                       extra={**report.extra, "gpus": gpus, "sharding": strategy,
                              "comm_bytes_per_step": comm_bytes_per_step(model, plan, gpus, strategy)})
    d = dict(report.device)
    d.pop("overhead", None)
    d.update(fp32_trainable_state(model, plan, strategy, d))
    for cat in ("gradients", "optimizer_states", "master_weights"):
        d[cat] = d.get(cat, 0) // gpus
    if strategy in SHARDS_PARAMETERS:
        p = DTYPE_BYTES[plan.param_dtype]
        # one decoder layer gathered at a time plus the next one prefetched (FSDP forward_prefetch,
        # DeepSpeed stage3_prefetch_bucket_size), and the embedding when it is gathered
        # DeepSeek's dense first layer is smaller than its routed ones: the largest layer
        layer = max(layer.params for layer in model.description.layers) if model.is_moe else model.layer_params()
        gathered = max(2 * layer, model.embedding_params) * p
        d["weights"] = d.get("weights", 0) // gpus + gathered
        d["quant_constants"] = d.get("quant_constants", 0) // gpus
        if "reference_weights" in d:  # a frozen reference is prepared by the same engine (trl prepare_deepspeed)
            d["reference_weights"] = d["reference_weights"] // gpus
    d = _optimizer_step_sharded(report, d, gpus)
    tensor_peak = sum(d.values())
    overhead, parts = framework_overhead(tensor_peak, gpu, expandable_segments=plan.expandable_segments,
                                         loss_transient_bytes=max(logits_bytes(model, rank_plan(plan))))
    d["overhead"] = overhead
    # ZeRO partitions the offloaded state across ranks; each rank's offloaded activations stay its own
    hm = report.host_memory.scaled(gpus, SHARDED) if report.host_memory is not None else None
    if hm is not None and plan.offload == "none" and strategy in ("zero2", "fsdp"):
        # the engine takes the model from the CPU (no device_map), in every process (advisor.memory.host)
        load, what = whole_model_load(model, plan)
        if strategy == "fsdp" and not plan.four_bit:
            # the export's fsdp_config sets cpu_ram_efficient_loading: rank 0 materializes the model, the others
            # move to the meta device and receive it from rank 0 (accelerate utils/fsdp_utils.py
            # fsdp2_prepare_model, fsdp2_load_full_state_dict; skipped for a model with bitsandbytes 4-bit
            # parameters, which every rank loads): the node holds one copy, counted here as 1/N of it per rank, so
            # the node's host peak (a rank's times N) is that copy
            load, what = load // gpus, f"rank 0 holds the whole model on the CPU (cpu_ram_efficient_loading): " \
                                       f"1/{gpus} of it per rank"
        hm = replace(hm, load_bytes=load, load_what=what)
    host = {**report.host, **hm.by_category()} if hm is not None else {k: v // gpus for k, v in report.host.items()}
    notes = (*report.notes, f"{strategy} over {gpus} GPUs: per-GPU ledger; collectives are modelled, not traced",
             *moe_note)
    return replace(report, device=d, host=host, host_memory=hm, tensor_peak_bytes=int(tensor_peak),
                   peak_bytes=int(tensor_peak + overhead), notes=notes,
                   reserved_peak_bytes=int(tensor_peak + parts["fragmentation"]), sharded=(gpus, strategy),
                   extra={**report.extra, "gpus": gpus, "sharding": strategy,
                          "comm_bytes_per_step": comm_bytes_per_step(model, plan, gpus, strategy)})


DEEPSPEED_ENGINES = ("zero2", "zero3")
"""The strategies the exports run on DeepSpeed (an fp32 copy of the trainable weights; FSDP2 upcasts them in place:
``fp32_trainable_state``)."""


def _optimizer_step_sharded(report: MemoryReport, d: dict[str, int], gpus: int) -> dict[str, int]:
    """The per-GPU ledger where the optimizer step set one GPU's peak: each rank steps its own shard (FSDP's
    optimizer over its local shards; DeepSpeed's over its partition, in sub-groups of ``sub_group_size``), so the
    step's temporaries are 1/N; the highest other moment (``moment_besides_optimizer``: its gradients sharded as the
    step's, its activations and transients whole) may then be the peak."""
    rest = report.extra.get("moment_besides_optimizer")
    if report.peak_phase != "optimizer" or not rest:
        return d
    stepped = {**d, "transient": d.get("transient", 0) // gpus}
    step_grads = report.device.get("gradients", 0)
    share = d.get("gradients", 0) / step_grads if step_grads else 1 / gpus
    other = {**d, "gradients": int(rest.get("gradients", 0) * share), "activations": rest.get("activations", 0),
             "transient": rest.get("transient", 0)}
    return max(stepped, other, key=lambda ledger: sum(ledger.values()))


def fp32_trainable_state(model: ModelSpec, plan: Plan, strategy: str, device: dict) -> dict[str, int]:
    """A full fine-tune in bf16 weights holds its trainable parameters' state in fp32 once sharded (whole-model bytes
    here, divided by the caller; Rajbhandari et al. 2020, ZeRO §3: 4 + 8 bytes per parameter for Adam):

    - DeepSpeed's ZeRO keeps an fp32 copy and runs the optimizer on it, its states fp32 too: the bf16/fp16 engine's
      ``single_partition_of_fp32_groups`` (runtime/zero/stage_1_and_2.py), ``fp32_partitioned_groups_flat``
      (runtime/zero/stage3.py);
    - FSDP2 under accelerate (what the export's ``fsdp`` runs, transformers' default FSDP version 2) upcasts each
      trainable parameter itself to fp32 when mixed precision is on (``bf16: true``; accelerate
      utils/fsdp_utils.py ``fsdp2_prepare_model``: "Upcast to fp32 master weights", 4-bit models excepted), so the
      weights, their gradients and the optimizer's states are fp32; the gathered copies are bf16
      (MixedPrecisionPolicy ``param_dtype``).

    The one-GPU ledger of the same plan has 16-bit states and no master; with ZeRO-Offload both are on the host
    already (advisor.memory.host)."""
    if strategy not in SHARDS_STATES or plan.offload != "none" or plan.method != "full" \
            or plan.param_dtype != "bf16" or plan.four_bit:  # pure fp16 full fine-tuning is refused (core.plan)
        return {}
    from advisor.memory.training import optimizer_states_of, param_breakdown

    fp32 = plan.with_(precision="mixed_bf16")  # what the optimizer sees: fp32 parameters
    pb = param_breakdown(model, fp32)
    states = optimizer_states_of(plan.optimizer)(model, fp32, pb)
    if strategy not in DEEPSPEED_ENGINES:  # FSDP2: the trainable weights and their gradients are fp32 themselves
        extra = pb.trainable * (DTYPE_BYTES["fp32"] - DTYPE_BYTES[plan.param_dtype])
        return {"weights": device.get("weights", 0) + extra, "gradients": device.get("gradients", 0) + extra,
                "optimizer_states": states}
    return {"master_weights": device.get("master_weights", 0) + pb.trainable * DTYPE_BYTES["fp32"],
            "optimizer_states": states}


def expert_parallel_note(model: ModelSpec, gpus: int, strategy: str) -> str:
    """A mixture of experts over several GPUs: sharded as any model, no expert parallelism (said plainly)."""
    how = {"ddp": "replicates every expert on each GPU", "zero2": "replicates the weights (every expert) and "
           "divides gradients and optimizer states", "zero3": "divides every expert stack like any other parameter "
           "and gathers a whole layer's stacks (all its experts) for forward and backward",
           "fsdp": "divides every expert stack like any other parameter and gathers a whole layer's stacks (all its "
           "experts) for forward and backward"}[strategy]
    return (f"mixture of experts over {gpus} GPUs: expert parallelism (each GPU holding some experts, tokens sent "
            f"to them by all-to-all: Megatron EP, DeepSpeed-MoE) is not planned; {strategy} {how}, and each GPU "
            "routes its own micro-batch (docs/multi-gpu.md)")


def comm_bytes_per_step(model: ModelSpec, plan: Plan, gpus: int, strategy: str) -> int:
    """Bytes each GPU sends per optimizer step (ZeRO §7.2 communication analysis)."""
    if gpus == 1:
        return 0
    from advisor.memory.training import param_breakdown

    pb = param_breakdown(model, plan)
    grad_b = 4 if plan.peft else DTYPE_BYTES[plan.param_dtype]
    ring = (gpus - 1) / gpus
    grads = pb.trainable * grad_b
    if strategy in SHARDS_PARAMETERS:
        params = model.params_total * DTYPE_BYTES[plan.param_dtype] if not plan.peft else pb.trainable * grad_b
        # all-gather in forward and backward, reduce-scatter of gradients
        return int(ring * (2 * params + grads))
    return int(ring * 2 * grads)  # all-reduce = reduce-scatter + all-gather
