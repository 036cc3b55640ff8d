"""The phases of a run for a step report from any backend: the load simulated where it can be.

``with_phases(model, plan, gpu, report)`` returns the report with its ``run_phases`` attached (typed:
``report.run_peak_bytes`` and ``report.run_peak_phase`` follow; advisor.memory.phases). The load is simulated on fake
tensors (advisor.runtime.simulate.load) when the step was simulated or measured and the plan loads
without DeepSpeed; the estimate backend keeps to closed forms (no torch import).
"""

from __future__ import annotations

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.plan import Plan
from advisor.memory.ledger import MemoryReport
from advisor.memory.phases import RunPhases, attach, run_phases

SIMULATED_LOAD_BACKENDS = ("simulate", "cpu", "cuda")


def measure_run(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, report: MemoryReport, *,
                evaluates: bool | None = None) -> RunPhases:
    load = None
    if report.backend in SIMULATED_LOAD_BACKENDS and plan.offload == "none" and model.arch is not None:
        from advisor.runtime.simulate.load import simulate_load

        trace = simulate_load(model, plan)
        what = f"16-bit {trace.peak_tensor} being quantized" if plan.quantized else "weights"
        load = (trace.live_peak_bytes, trace.final_bytes, what, trace.events)
    if plan.task != "sft":  # GRPO / DPO: generate, score, train, sync (or precompute, train) around load and save
        from advisor.memory.rl import rl_run_phases

        return rl_run_phases(model, plan, gpu, report, load=load)
    return run_phases(model, plan, gpu, report, load=load, evaluates=evaluates)


def with_phases(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, report: MemoryReport, *,
                evaluates: bool | None = None) -> MemoryReport:
    """``report`` with the run's phases attached (its ``peak_bytes`` stays the step's)."""
    return attach(report, measure_run(model, plan, gpu, report, evaluates=evaluates))


def run_report(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, backend: str = "estimate", *,
               evaluates: bool | None = None, gpus: int = 1, sharding: str | None = None) -> MemoryReport:
    """``backend``'s report of the step of ``plan`` on one of ``gpus`` GPUs splitting model state as ``sharding``
    says (advisor.memory.sharding; the default strategy where None), with the run's phases attached."""
    from advisor.runtime.backends import get_backend

    report = get_backend(backend).measure(model, plan, gpu)
    if gpus > 1:
        from advisor.memory.sharding import DEFAULT_SHARDING, shard_report

        report = shard_report(report, model, plan, gpus, sharding or DEFAULT_SHARDING, gpu)
    return with_phases(model, plan, gpu, report, evaluates=evaluates)
