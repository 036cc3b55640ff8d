"""The cpu and cuda backends: a real short run of the plan in a child process, measured.

The probe measures the peak of live tensors and the persistent tensors by category (weights,
quantization constants, adapters, gradients, optimizer states); what is left of the peak is
activations and transient tensors together (a real run cannot tell them apart), and on a GPU the
overhead is the whole process's NVML memory minus the allocator's peak.

``BackendOptions.budget_bytes`` is enforced for real (advisor.runtime.probe._limits: RLIMIT_DATA on
the CPU, the caching allocator's cap on a GPU); a run that ends otherwise than ok (oom, timeout,
crash, error) raises ``BackendFailed`` carrying the ProbeResult.
"""

from __future__ import annotations

from typing import Any

from advisor.memory.ledger import CATEGORIES, MemoryReport, StepMeasurement
from advisor.runtime.backends._base import ESTIMATE_SCREEN, BackendFailed, BackendOptions, BaseBackend, Stage
from advisor.runtime.probe._result import ProbeResult

PROBE_OPTIONS = frozenset({"budget_bytes", "steps", "warmup", "timeout", "data", "weights_dir", "num_layers", "seed"})


class _ProbeBackend(BaseBackend):
    source = "measured"
    accepts = PROBE_OPTIONS
    device = ""

    def measure(self, model, plan, gpu=None, options: BackendOptions | None = None) -> MemoryReport:
        from advisor.runtime.probe._runner import run_probe

        o = self.check(options)
        if plan.task != "sft":
            from advisor.core.errors import AdvisorInputError

            raise AdvisorInputError("--task", f"the {self.name} probe runs supervised steps only; {plan.task}'s TRL "
                                    "step is answered by --backend estimate (the closed form)", plan.task)
        kwargs: dict[str, Any] = {"steps": o.steps or 2, "warmup": 1 if o.warmup is None else o.warmup,
                                  "memory_limit_bytes": o.budget_bytes, "data": o.data, "weights_dir": o.weights_dir,
                                  "num_layers": o.num_layers, "seed": o.seed or 0}
        if o.timeout is not None:
            kwargs["timeout"] = o.timeout
        result = run_probe(model, plan, device=self.device, **kwargs)
        if not result.ok:
            raise BackendFailed(self.name, result.status, result.message, result)
        if self.device == "cuda":
            from advisor.memory.calibration import record_probe_result

            record_probe_result(result.to_dict())  # measured overheads for later predictions on this GPU
        return report_from_result(result)


class CpuBackend(_ProbeBackend):
    """A real run on the CPU: tests and small models."""

    name = "cpu"
    device = "cpu"
    # every plan that fits by the simulation is probed; the CPU's memory is not the GPU's: the probe decides nothing
    stages = (ESTIMATE_SCREEN, Stage("simulate", "simulate", decides=True), Stage("probe", "cpu", decides=False))


class CudaBackend(_ProbeBackend):
    """A real run on the GPU: the truth (memory, speed, accuracy)."""

    name = "cuda"
    device = "cuda"
    stages = (ESTIMATE_SCREEN, Stage("simulate", "simulate", decides=True),
              Stage("probe", "cuda", decides=True, on_target_gpu=True))


def report_from_result(result: ProbeResult) -> MemoryReport:
    """The ledger view of a successful probe (source "measured")."""
    device = {c: 0 for c in CATEGORIES}
    for key, value in result.breakdown.items():
        if key in device:
            device[key] = int(value)
    peak = int(result.peak_allocated_bytes or 0)
    persistent = sum(device.values())
    device["activations"] = max(0, peak - persistent)
    whole = peak
    if result.device == "cuda" and result.nvml_peak_bytes:
        device["overhead"] = max(0, int(result.nvml_peak_bytes) - peak)
        whole = max(peak, int(result.nvml_peak_bytes))
    notes = ["measured by a real run: activations = peak minus the persistent tensors measured after the run "
             "(saved activations and transient tensors together)", f"memory: {result.memory_method}"]
    if result.device == "cpu":
        notes.append("CPU probe: every tensor is in host memory; the figures are what the same step holds")
    notes += list(result.notes)
    measured = StepMeasurement(tokens_per_s=result.tokens_per_s, step_time_median_s=result.step_time_median_s,
                               step_time_p90_s=result.step_time_p90_s, losses=tuple(result.losses),
                               final_loss=result.final_loss, fidelity_kl=result.fidelity_kl,
                               test_double=result.test_double)
    # speed and accuracy are in ``measured``; ``extra`` keeps the run's diagnostics
    extra: dict[str, Any] = {k: getattr(result, k) for k in (
        "peak_reserved_bytes", "nvml_peak_bytes", "wall_s", "gpu_name", "test_double")}
    extra["versions"] = result.versions
    return MemoryReport(source="measured", backend=result.device, device=device, host={}, tensor_peak_bytes=peak,
                        peak_bytes=whole, peak_phase=result.peak_phase, notes=tuple(notes), extra=extra,
                        reserved_peak_bytes=result.peak_reserved_bytes, measured=measured)
