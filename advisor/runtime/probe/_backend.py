"""The cpu and cuda backends: ``measure(model, plan, gpu, **options) -> MemoryReport`` by a real probe.

The probe measures the peak of live tensors and the persistent tensors by category (weights,
quantization constants, adapters, gradients, optimizer states); what is left of the peak is
activations and transient tensors together (a real run cannot tell them apart), and on a GPU the
overhead is the whole process's NVML memory minus the allocator's peak.
"""

from __future__ import annotations

from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.memory.ledger import CATEGORIES, MemoryReport
from advisor.runtime.probe._result import ProbeResult


class ProbeFailed(AdvisorInputError):
    """The plan did not run under a measuring backend (out of memory, crash, timeout, error)."""

    def __init__(self, backend: str, result: ProbeResult):
        self.result = result
        super().__init__(f"--backend {backend}", f"the probe ended with status {result.status}: {result.message}",
                         show_value=False)


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
    extra: dict[str, Any] = {k: getattr(result, k) for k in (
        "step_time_median_s", "step_time_p90_s", "tokens_per_s", "final_loss", "fidelity_kl", "peak_reserved_bytes",
        "nvml_peak_bytes", "wall_s")}
    extra["versions"] = result.versions
    return MemoryReport(source="measured", backend=result.device, device=device, host={}, tensor_peak_bytes=peak,
                        peak_bytes=whole, peak_phase=result.peak_phase, notes=tuple(notes), extra=extra,
                        reserved_peak_bytes=result.peak_reserved_bytes)


def _measure(device: str, model: Any, plan: Any, gpu: Any, options: dict[str, Any]) -> MemoryReport:
    from advisor.runtime.probe._runner import run_probe

    known = ("steps", "warmup", "timeout", "data", "memory_limit_bytes", "weights_dir", "num_layers", "seed")
    kwargs = {k: options[k] for k in known if options.get(k) is not None}
    kwargs.setdefault("steps", 2)
    kwargs.setdefault("warmup", 1)
    result = run_probe(model, plan, device=device, **kwargs)
    if not result.ok:
        raise ProbeFailed(device, result)
    if device == "cuda":
        from advisor.memory.calibration import record_probe_result

        record_probe_result(result.to_dict())   # measured overheads for later predictions on this GPU
    return report_from_result(result)


def measure_cpu(model: Any, plan: Any, gpu: Any = None, **options: Any) -> MemoryReport:
    return _measure("cpu", model, plan, gpu, options)


def measure_cuda(model: Any, plan: Any, gpu: Any = None, **options: Any) -> MemoryReport:
    return _measure("cuda", model, plan, gpu, options)
