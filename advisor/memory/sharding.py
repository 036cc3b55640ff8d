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
from advisor.memory.host import SHARDED, fsdp_host_load, whole_model_load
from advisor.memory.ledger import MemoryReport
from advisor.memory.overhead import framework_overhead
from advisor.memory.sequence_parallel import rank_plan
from advisor.memory.training import logits_bytes
from advisor.core.plan import DTYPE_BYTES, Plan, rl_problems

STRATEGIES = ("ddp", "zero2", "zero3", "fsdp")
SHARDS_STATES = ("zero2", "zero3", "fsdp")
"""Strategies that divide gradients and optimizer states across the GPUs (the table above)."""
SHARDS_PARAMETERS = ("zero3", "fsdp")
"""Strategies that also divide the weights, gathering each layer's for forward and backward."""
DEFAULT_SHARDING = "zero3"
"""The strategy of a several-GPU plan unless one is named (``--sharding``, a study's ``sharding``, the
step-time model): ZeRO-3 divides every part of the model state (the table above), the most per-GPU
memory saved; with one GPU the strategy changes nothing."""


OFFLOAD_STRATEGY = {"zero2_cpu": "zero2", "zero3_cpu": "zero3", "fsdp_cpu": "fsdp"}
"""The engine each CPU offload runs on: DeepSpeed ZeRO-2 / ZeRO-3 (the exported deepspeed.json) or FSDP (the exported
``fsdp: full_shard auto_wrap offload``)."""


def run_strategy(plan: Plan, sharding: str | None) -> str:
    """How the run of ``plan`` splits model state over its GPUs, decided once for estimate, tune, pre-flight and the
    exports: an offload's own engine (OFFLOAD_STRATEGY), else ``sharding`` (DEFAULT_SHARDING where None)."""
    return OFFLOAD_STRATEGY.get(plan.offload) or sharding or DEFAULT_SHARDING


def server_gpus(plan: Plan) -> int:
    """The GPUs a vLLM server takes from the run (``--vllm-gpus``: trl vllm-serve runs on GPUs of its own)."""
    return plan.vllm_gpus if plan.task == "grpo" and plan.generation == "vllm-server" else 0


def train_gpus(gpus: int, plan: Plan) -> int:
    """The GPUs that train, of the run's ``gpus`` (estimate's, tune's and pre-flight's --gpus count them all): all of
    them, less those a vLLM server takes."""
    return gpus - server_gpus(plan)


def data_parallel_ranks(gpus: int, plan: Plan) -> int:
    """The data-parallel ranks of a run on ``gpus`` GPUs: the GPUs that train, each sequence-parallel group of
    ``sp_degree`` of them one rank (it runs one micro-batch)."""
    return max(1, train_gpus(gpus, plan) // max(1, plan.sp_degree))


def global_batch(gpus: int, plan: Plan) -> int:
    """Sequences per optimizer step over the whole run: micro-batch x accumulation x data-parallel ranks."""
    return plan.micro_batch * plan.grad_accum * data_parallel_ranks(gpus, plan)


def gpu_count_problems(plan: Plan, gpus: int) -> list[AdvisorInputError]:
    """The rules that need the run's GPU count: FSDP's CPU offload needs a group of GPUs, a vLLM server leaves at
    least one GPU to train, and TRL's generation batch on the GPUs that train holds whole groups
    (advisor.core.plan.rl_problems)."""
    if server_gpus(plan) and train_gpus(gpus, plan) < 1:
        return [AdvisorInputError("--vllm-gpus", f"a vLLM server on {plan.vllm_gpus} of the run's {gpus} GPU(s) "
                                  "leaves none to train (vllm-server needs --gpus above --vllm-gpus)", plan.vllm_gpus)]
    if plan.offload == "fsdp_cpu" and gpus < 2:
        return [AdvisorInputError("--offload", "FSDP CPU offload shards the model over a process group of GPUs: it "
                                  "needs --gpus 2 or more (on one GPU: zero2_cpu or zero3_cpu)", plan.offload)]
    if plan.sp_degree > 1 and gpus % plan.sp_degree:
        return [AdvisorInputError("--sp-degree", f"must divide --gpus {gpus} (each sequence-parallel group is "
                                  f"{plan.sp_degree} of the run's GPUs)", plan.sp_degree)]
    return rl_problems(plan, train_gpus(gpus, plan))


def _check(gpus: int, strategy: str) -> None:
    if not isinstance(gpus, int) or gpus < 1:
        raise AdvisorInputError("--gpus", "must be a whole number of at least 1", gpus)
    if strategy not in STRATEGIES:
        raise AdvisorInputError("--sharding", f"must be one of {', '.join(STRATEGIES)}", strategy)


def shard_report(report: MemoryReport, model: ModelSpec, plan: Plan, gpus: int, strategy: str,
                 gpu: GpuSpec | None = None) -> MemoryReport:
    """The per-GPU ledger of ``report`` (one GPU's step) when N GPUs shard the model state as ``strategy`` says, or
    as the plan's CPU offload runs (``run_strategy``)."""
    _check(gpus, strategy)
    strategy = run_strategy(plan, strategy)
    moe_note = (expert_parallel_note(model, gpus, strategy),) if model.is_moe and gpus > 1 else ()
    if gpus == 1 or strategy == "ddp":
        return replace(report, notes=(*report.notes, *moe_note), sharded=(gpus, strategy),
                       extra=_layout_extra(report, model, plan, gpus, strategy))
    d = dict(report.device)
    d.pop("overhead", None)
    if plan.offload != "none":
        # an offload plan's one-GPU ledger is already one rank's: the weights it gathers (zero3_cpu, fsdp_cpu) or
        # holds whole (zero2_cpu), gradients as reduce buckets, no optimizer state (advisor.memory.training)
        return _offloaded(report, model, plan, gpus, strategy, d)
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
        # bitsandbytes' quantization constants (QuantState, Int8Params.SCB) are attributes, not parameters: neither
        # ZeRO-3 nor FSDP shards them, each GPU holds them whole (they move with their weight: Params4bit.to)
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
        load, what = fsdp_host_load(model, plan, gpus) if strategy == "fsdp" else whole_model_load(model, plan)
        hm = replace(hm, load_bytes=load, load_what=what)
    host = {**report.host, **hm.by_category()} if hm is not None else {k: v // gpus for k, v in report.host.items()}
    notes = (*report.notes, f"{strategy} over {gpus} GPUs: per-GPU ledger; collectives are modelled, not traced",
             *moe_note)
    return replace(report, device=d, host=host, host_memory=hm, tensor_peak_bytes=int(tensor_peak),
                   peak_bytes=int(tensor_peak + overhead), notes=notes,
                   reserved_peak_bytes=int(tensor_peak + parts["fragmentation"]), sharded=(gpus, strategy),
                   extra=_layout_extra(report, model, plan, gpus, strategy))


def _offloaded(report: MemoryReport, model: ModelSpec, plan: Plan, gpus: int, strategy: str,
               device: dict[str, int]) -> MemoryReport:
    """The per-GPU ledger of an offload plan on ``gpus`` GPUs: the GPU side as one rank's, the host state divided
    among the ranks (each rank's offloaded activations its own)."""
    hm = report.host_memory.scaled(gpus, SHARDED) if report.host_memory is not None else None
    if hm is not None and plan.offload == "fsdp_cpu":
        load, what = fsdp_host_load(model, plan, gpus)
        hm = replace(hm, load_bytes=load, load_what=what)
    host = {**report.host, **hm.by_category()} if hm is not None else {k: v // gpus for k, v in report.host.items()}
    return replace(report, device={**device, "overhead": report.device.get("overhead", 0)}, host=host,
                   host_memory=hm, notes=(*report.notes, f"{strategy} CPU offload over {gpus} GPUs: the host state "
                                          f"split among the ranks; collectives are modelled, not traced"),
                   sharded=(gpus, strategy), extra=_layout_extra(report, model, plan, gpus, strategy))


def _layout_extra(report: MemoryReport, model: ModelSpec, plan: Plan, gpus: int, strategy: str) -> dict:
    """The report's extra with the run's layout: its GPUs, its engine and each GPU's collective bytes per step."""
    return {**report.extra, "gpus": gpus, "sharding": strategy,
            "comm_bytes_per_step": comm_bytes_per_step(model, plan, gpus, strategy)}


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
    from advisor.memory.training import param_breakdown, weight_bytes

    pb = param_breakdown(model, plan)
    grad_b = 4 if plan.peft else DTYPE_BYTES[plan.param_dtype]
    ring = (gpus - 1) / gpus
    grads = pb.trainable * grad_b
    if strategy in SHARDS_PARAMETERS:
        # every parameter is sharded, a PEFT run's frozen base too (ZeRO-3 partitions all, FSDP wraps all): the
        # stored bytes are gathered (4-bit weights in their float quant storage), LoRA's adapters in fp32
        params = weight_bytes(model, plan, pb)[0] + (pb.adapter * 4 if plan.peft else 0)
        # all-gather in forward and backward, reduce-scatter of gradients
        return int(ring * (2 * params + grads))
    return int(ring * 2 * grads)  # all-reduce = reduce-scatter + all-gather
