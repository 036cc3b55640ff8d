"""The simulate backend: one real training step under FakeTensorMode, every storage tracked.

Device bytes are the traced tensors at the peak (``tensor_peak_bytes``) plus the GPU-side overhead
the trace cannot see (advisor.memory.overhead, per GPU model). The traced allocations and frees are
replayed through the caching-allocator model (advisor.runtime.simulate.reserved): the reserved peak
(``reserved_peak_bytes``) is the tensor peak plus what the allocator holds beyond it, and that
replaces the estimated fragmentation. Offload plans are traced without DeepSpeed and moved the way
DeepSpeed documents it (see ``_offload``); their fragmentation stays estimated.
"""

from __future__ import annotations


from functools import lru_cache

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.memory.ledger import MemoryReport, empty
from advisor.core.plan import DTYPE_BYTES, Plan
from advisor.runtime import progress
from advisor.runtime.backends._base import ESTIMATE_SCREEN, BackendOptions, BaseBackend, Stage


class SimulateBackend(BaseBackend):
    """One real training step under FakeTensorMode on the CPU: exact memory without a GPU or weights."""

    name = "simulate"
    source = "simulated"
    accepts = frozenset({"layers"})
    # the seconds of a simulation go to the plans that could win: the closed form decides the others
    stages = (ESTIMATE_SCREEN, Stage("simulate", "simulate", decides=True, finalists_only=True))

    def measure(self, model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None,
                options: BackendOptions | None = None) -> MemoryReport:
        o = self.check(options)
        if plan.task != "sft":
            # TRL's GRPO / DPO step, its own loss and log-prob code on fake tensors (advisor.runtime.simulate.rl)
            from advisor.runtime.simulate.rl import rl_report

            if progress.busy():
                return rl_report(model, plan, gpu, layers="auto" if o.layers is None else o.layers)
            with progress.working(f"simulating TRL's {plan.task} step of {plan.short()} on {model.name}"):
                return rl_report(model, plan, gpu, layers="auto" if o.layers is None else o.layers)
        return _measure(model, plan, gpu, layers="auto" if o.layers is None else o.layers)


def _measure(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None, *, layers: str | int = "auto") -> MemoryReport:
    from advisor.memory.allocator import AllocatorConfig
    from advisor.memory.overhead import overhead_of
    from advisor.runtime.simulate.reserved import step_reserved

    plan.validate()
    traced = traced_plan(plan)
    if progress.busy():
        sim = _simulation(model, traced, layers)
    else:  # nobody said what this is: say it (a simulation takes seconds to minutes)
        with progress.working(f"simulating {plan.short()} on {model.name}"):
            sim = _simulation(model, traced, layers)
    from advisor.memory.sequence_parallel import sequence_parallel_notes

    notes = sequence_parallel_notes(model, plan) + list(sim.notes)
    if sim.extrapolated and len(sim.layers_traced) == 2 and sim.layer_kinds == 1:
        notes.append(f"traced {sim.layers_traced[0]} and {sim.layers_traced[1]} decoder layers, "
                     f"extrapolated to {model.num_layers}")
    device, phase = dict(sim.ledger), sim.peak_phase
    if plan.offload != "none":
        device, phase, more = _offload(model, plan, sim)
        notes += more
    if plan.optimizer.startswith("paged"):
        notes.append("paged optimizer states are counted on the GPU (resident); under memory pressure "
                     "bitsandbytes pages them to host memory")
    # the offload's host copies, traced in the pinned allocator's power-of-two blocks (simulate.tracker)
    offloaded = max((p.host_bytes for p in sim.phases.values()), default=0)
    from advisor.memory.host import host_memory
    from advisor.memory.sequence_parallel import rank_plan
    from advisor.memory.training import logits_bytes, paged_spill

    device = {**empty(), **device}
    spilled: dict[str, int] = {}
    if plan.offload == "none":
        notes += paged_spill(device, spilled, plan, gpu)
    hm = host_memory(model, plan, activations_pinned=offloaded, spill_bytes=spilled.get("optimizer_states", 0))
    host = {**empty(), **hm.by_category()}
    notes += hm.notes
    tensor_peak = sum(device.values())
    expandable = plan.expandable_segments
    allocator = None
    if plan.offload == "none" and sim.traced_events:
        depth = model.num_layers if sim.extrapolated else sim.layers_traced[-1]
        allocator = step_reserved(sim.traced_events, depth, AllocatorConfig(expandable_segments=expandable),
                                  tensor_peak_bytes=int(tensor_peak))
        depths = " and ".join(f"{d}-layer" for d in allocator.rebuilt_from)
        rebuilt = (f", the full depth rebuilt from the {depths} trace{'s' if len(allocator.rebuilt_from) > 1 else ''}"
                   if allocator.rebuilt_from[-1] != depth else "")
        notes.append(f"reserved memory: {allocator.replay.events:,} allocations and frees replayed through the "
                     f"CUDA caching-allocator model{' with expandable segments' if expandable else ''}{rebuilt} "
                     f"({allocator.seconds:.2f} s)"
                     + ("" if allocator.method == "replayed" else f"; {allocator.method}"))
    # no replay (an offload plan): the estimate's fragmentation rule, on the same loss transient as the closed form's
    loss = None if allocator else max(logits_bytes(model, rank_plan(plan)))
    over = overhead_of(tensor_peak, gpu, fragmentation_bytes=allocator.fragmentation_bytes if allocator else None,
                       expandable_segments=expandable, loss_transient_bytes=loss)
    notes += over.notes()
    device = {**empty(), **device, "overhead": over.total}
    extra = {"simulation_seconds": round(sim.seconds, 3), "layers_traced": list(sim.layers_traced),
             "extrapolated": sim.extrapolated, "overhead_parts": over.parts, "overhead_source": over.source,
             "fragmentation_source": over.fragmentation_source,
             "phase_peaks": {k: v.bytes for k, v in sim.phases.items()}}
    if allocator is not None:
        extra["allocator"] = allocator.replay.to_dict()
    if model.vision is not None:  # the sample as the processor counts it, the tower's and projector's traced bytes
        from advisor.runtime.simulate.vision import simulated_vision

        peak = sim.phases.get(sim.peak_phase)
        extra["vision"] = simulated_vision(model, plan, peak.parts if peak is not None else {})
    return MemoryReport(
        source="simulated", backend="simulate", device=device, host=host, host_memory=hm,
        tensor_peak_bytes=int(tensor_peak),
        peak_bytes=int(tensor_peak + over.total), peak_phase=phase, notes=tuple(notes), extra=extra,
        reserved_peak_bytes=int(tensor_peak + over.parts["fragmentation"]),
    )


TRACE_FREE = {"offload": "none", "expandable_segments": False}
"""Plan fields the traced step does not depend on, at the value it is traced with: offload is applied to the trace
afterwards (``_offload``), and expandable segments only change the caching-allocator replay of its events
(advisor.runtime.simulate.reserved), not the tensors."""


def traced_plan(plan: Plan) -> Plan:
    """The plan as it is traced: plans that differ only in ``TRACE_FREE`` fields share one trace."""
    free = {k: v for k, v in TRACE_FREE.items() if getattr(plan, k) != v}
    return plan.with_(**free) if free else plan


@lru_cache(maxsize=32)
def _simulation(model: ModelSpec, plan: Plan, layers: str | int):
    """The traced step of ``plan`` (``traced_plan``), kept for the next caller: a plan and its variants in the
    fields the trace does not depend on (the search's expandable-segments pairs, the finalists' and the recipe's
    re-asks) are traced once."""
    from advisor.runtime.simulate.extrapolate import simulate

    return simulate(model, plan, layers=layers)


def _offload(model: ModelSpec, plan: Plan, sim):
    """DeepSpeed ZeRO-Offload / ZeRO-3 offload applied to a traced step without offload.

    ZeRO-Offload keeps fp32 master weights, fp32 Adam moments and fp32 gradients in host memory and
    runs the optimizer there (DeepSpeedCPUAdam); the GPU holds the low-precision parameters, the
    activations and gradient buckets of ``reduce_bucket_size`` elements on their way out
    (deepspeed.ai/tutorials/zero-offload, deepspeed.ai/docs/config-json "offload_optimizer",
    Ren et al. 2021 §4). ZeRO-3 ``offload_param`` keeps the parameters on the host and gathers them
    a layer at a time plus ``stage3_prefetch_bucket_size`` (deepspeed.ai/docs/config-json
    "offload_param", Rajbhandari et al. 2021).
    """
    from advisor.memory.training import ZERO2_REDUCE_BUCKET, ZERO3_PREFETCH, fsdp_offload_gpu_bytes, param_breakdown

    pb = param_breakdown(model, plan)
    tb = 4 if plan.peft else DTYPE_BYTES[plan.param_dtype]
    bucket = int(min(pb.trainable, ZERO2_REDUCE_BUCKET) * tb)
    gathered = None
    if plan.offload == "fsdp_cpu":  # FSDP2's CPU offload: units gathered, one unit's gradients before reduce-scatter
        gathered, bucket = fsdp_offload_gpu_bytes(model, plan, pb)
    best, best_phase = None, ""
    for name, peak in sim.phases.items():
        if name == "optimizer":
            continue  # the optimizer step runs on the CPU
        d = dict(peak.ledger)
        d["optimizer_states"] = 0
        d["gradients"] = min(d["gradients"], bucket) if name == "forward" else bucket
        if best is None or sum(d.values()) > sum(best.values()):
            best, best_phase = d, name
    notes = ["offload: optimizer states, fp32 master weights and fp32 gradients in host memory (DeepSpeed "
             "ZeRO-Offload; advisor.memory.host counts its buffers); gradients on the GPU only as reduce buckets"]
    if plan.offload == "zero3_cpu":
        live = max(model.layer_params(), model.embedding_params) * 2 + ZERO3_PREFETCH
        best["weights"] = int(min(model.params_total, live) * DTYPE_BYTES[plan.param_dtype])
        notes.append("zero3_cpu: parameters in host memory, gathered a layer at a time (+ prefetch bucket)")
    if gathered is not None:
        best.update(weights=gathered, adapter_weights=0)
        notes[0] = ("fsdp_cpu: parameter, gradient and optimizer-state shards in host memory (FSDP2 CPUOffloadPolicy; "
                    "advisor.memory.host counts them); the GPU holds the gathered units (the output head's kept from "
                    "forward into backward, the layer running and the next) and one unit's gradients")
    return best, best_phase, notes
