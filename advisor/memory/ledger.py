"""The memory ledger (the seeds' 显存账本): bytes per category, on the GPU and in host memory.

Every backend (estimate, simulate, cpu, cuda) returns a ``MemoryReport`` holding the same
categories, so the CLI, the TUI and the report render one kind of object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

CATEGORIES = (
    "weights",           # base model weights in their storage dtype (packed 4/8-bit included)
    "quant_constants",   # absmax / scales of quantized weights (and their double quantization)
    "adapter_weights",   # trainable LoRA A/B matrices
    "gradients",         # gradients of the trainable parameters
    "optimizer_states",  # optimizer moments (and 8-bit quantization constants)
    "master_weights",    # fp32 copies kept beside lower-precision weights (DeepSpeed, mixed precision)
    "activations",       # tensors saved for backward
    "transient",         # short-lived: logits and loss, dequantized weights, attention and optimizer workspaces
    "overhead",          # outside the tensors: CUDA context, cuBLAS workspace, allocator fragmentation
)

LABELS = {
    "weights": "Weights",
    "quant_constants": "Quantization constants",
    "adapter_weights": "Adapter (LoRA) weights",
    "gradients": "Gradients",
    "optimizer_states": "Optimizer states",
    "master_weights": "Master weights (fp32)",
    "activations": "Saved activations",
    "transient": "Transient peak",
    "overhead": "Framework overhead",
    "kv_cache": "KV cache",
    "cuda_graphs": "CUDA graphs (reserve)",
}


def empty() -> dict[str, int]:
    return {c: 0 for c in CATEGORIES}


@dataclass(frozen=True)
class PhaseMemory:
    """The peak of one phase of a run (advisor.memory.phases computes it)."""

    name: str
    """load, train, eval, generate or save."""
    live_bytes: int
    """Tensors alive at the phase's peak (allocated)."""
    reserved_bytes: int
    """The caching allocator's reserved segments at that peak."""
    peak_bytes: int
    """reserved_bytes plus memory outside the allocator: what the GPU must hold."""
    source: str
    """simulated or estimated."""
    what: str
    """What sets the peak, in a few words."""
    included: bool = True
    """Whether the run has this phase (generation-based eval only with max_new_tokens > 0)."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "reserved_bytes": self.reserved_bytes, "live_bytes": self.live_bytes,
                "source": self.source, "what": self.what, "included": self.included, "notes": list(self.notes)}


@dataclass(frozen=True)
class RunPhases:
    """Every phase of one run; the run's peak is the highest included phase."""

    phases: dict[str, PhaseMemory]
    reserved_model: str = ""
    """How reserved bytes were obtained (the allocator replay, or the interim overhead fraction)."""
    notes: tuple[str, ...] = field(default=())

    @property
    def run_peak_phase(self) -> str:
        return max((p for p in self.phases.values() if p.included), key=lambda p: p.peak_bytes).name

    @property
    def run_peak(self) -> PhaseMemory:
        return self.phases[self.run_peak_phase]

    @property
    def run_peak_bytes(self) -> int:
        return self.run_peak.peak_bytes

    def covering(self, names: Sequence[str]) -> PhaseMemory:
        """The highest of the named phases (a measurement that covered only those)."""
        return max((self.phases[n] for n in names), key=lambda p: p.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {name: p.to_dict() for name, p in self.phases.items()}


@dataclass(frozen=True)
class StepMeasurement:
    """What a real run (a cpu or cuda probe) measured beside memory: speed and accuracy
    (advisor.runtime.probe._result.ProbeResult holds the whole record)."""

    tokens_per_s: float | None = None
    """Tokens of one optimizer step divided by the median step time (one GPU)."""
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    losses: tuple[float, ...] = ()
    """Training loss of each optimizer step, warm-up included."""
    final_loss: float | None = None
    fidelity_kl: float | None = None
    """KL per token of the plan's base model from the reference-precision base (nats); None with random weights."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["losses"] = list(self.losses)
        return d


@dataclass(frozen=True)
class MemoryReport:
    """Where the memory of one plan goes, at its peak."""

    source: str
    """estimated (closed-form ledger), simulated (fake-tensor trace) or measured (real run)."""
    backend: str
    """The backend that produced it: estimate, simulate, cpu, cuda."""
    device: dict[str, int]
    """GPU bytes per category at the moment of the peak (overhead included)."""
    host: dict[str, int]
    """Host-memory bytes per category (offloaded states and parameters)."""
    tensor_peak_bytes: int
    """Peak of live tensors on the device, before framework overhead."""
    peak_bytes: int
    """tensor_peak_bytes + overhead: what the GPU must hold."""
    peak_phase: str = ""
    """When the peak happens: forward, loss, backward, optimizer, prefill, decode."""
    notes: tuple[str, ...] = ()
    """Assumptions and caveats worth showing a person."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Diagnostics to show, which no decision reads (e.g. kv_cache_bytes_per_token, simulation seconds,
    the overhead's parts)."""
    reserved_peak_bytes: int | None = None
    """Peak of ``torch.cuda.max_memory_reserved``: the tensor peak plus what the caching allocator holds
    beyond it (replayed through advisor.memory.allocator by the simulate backend, estimated by the
    estimate backend, measured by a GPU probe); None where unknown (a CPU probe)."""
    run_phases: RunPhases | None = None
    """The whole run's phases (load, train, eval, generate, save) once attached (advisor.memory.phases.attach);
    None for a step alone."""
    measured: StepMeasurement | None = None
    """Speed and accuracy a real run measured (cpu and cuda probes); None otherwise."""

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    @property
    def run_peak_bytes(self) -> int:
        """What feasibility is decided on: the run's peak (its highest phase) when the phases are attached,
        else the step's peak."""
        return int(self.run_phases.run_peak_bytes) if self.run_phases is not None else int(self.peak_bytes)

    @property
    def run_peak_phase(self) -> str:
        """The phase that sets ``run_peak_bytes`` (train for a step alone)."""
        return self.run_phases.run_peak_phase if self.run_phases is not None else "train"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; with phases attached, also ``phases``, ``run_peak_phase``, ``run_peak_bytes``,
        ``reserved_model`` and ``phase_notes`` (and ``reserved_peak_bytes`` falls back to the train phase's
        when the backend did not give one)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["host_bytes"] = self.host_bytes
        d.pop("run_phases")
        d.pop("measured")
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
        run = self.run_phases
        if run is not None:
            d.update(phases=run.to_dict(), run_peak_phase=run.run_peak_phase, run_peak_bytes=run.run_peak_bytes,
                     reserved_model=run.reserved_model, phase_notes=list(run.notes))
            if d["reserved_peak_bytes"] is None:
                d["reserved_peak_bytes"] = run.phases["train"].reserved_bytes
        return d
