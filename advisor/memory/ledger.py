"""The memory ledger (the seeds' 显存账本): bytes per category, on the GPU and in host memory.

Every backend (estimate, simulate, cpu, cuda) returns a ``MemoryReport`` holding the same
categories, so the CLI, the TUI and the report render one kind of object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
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
    "reference_weights": "Reference model (frozen copy)",
    "vllm_weights": "vLLM weights",
    "vllm_reserve": "vLLM CUDA graphs and non-torch",
    "rollout": "Generation batch (ids, log-probs)",
    "vision_weights": "Vision tower and projector",
    "vision_constants": "Vision tower scales",
    "encoder_cache": "Encoder cache (vision outputs)",
    "vision_activations": "Vision tower profile (pixels, activations)",
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
    test_double: str | None = None
    """The catalog GPU a CUDA test double stood for (the step ran on the CPU under it: advisor.runtime.cuda_double);
    None for a run on the device it names."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["losses"] = list(self.losses)
        return d


@dataclass(frozen=True)
class KvCache:
    """The KV cache of a serving plan (advisor.memory.inference computes it; the ledger's ``kv_cache`` is its
    bytes for every sequence in flight)."""

    bytes_per_token: int
    """Keys and values of one token over every layer, as a full-attention layer holds them."""
    bytes_per_sequence: int
    """One sequence of the plan's context length, layer kind by layer kind (a sliding window holds its window)."""
    tokens_in_flight: int
    """Tokens the engine holds in the cache at once."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


HOST_KINDS = ("pinned", "pageable")
"""How host memory is allocated: page-locked (cudaHostAlloc through torch's CachingHostAllocator: never swapped,
what DMA copies need) or ordinary pageable memory (malloc; CUDA managed memory evicted to the host counts here)."""


@dataclass(frozen=True)
class HostMemory:
    """The host (CPU) RAM one training run needs, split by how the libraries allocate it
    (advisor.memory.host builds it; the sums per category are the report's ``host``)."""

    pinned: dict[str, int]
    """Page-locked bytes per ledger category during training, as allocated: torch's CachingHostAllocator hands out
    power-of-two blocks (offloaded activations, DeepSpeed's pinned buffers)."""
    pageable: dict[str, int]
    """Ordinary bytes per category during training (DeepSpeed's CPU Adam moments, ZeRO-3's fp32 partition, a
    paged optimizer's states while the driver keeps them evicted to the host)."""
    load_bytes: int = 0
    """Weights held in host memory while the model loads, before they move to the GPU (the load phase)."""
    load_what: str = ""
    """What sets ``load_bytes``, in a few words."""
    baseline_bytes: int = 0
    """The training process itself before any tensor (Python and the training libraries)."""
    notes: tuple[str, ...] = ()

    @property
    def pinned_bytes(self) -> int:
        return int(sum(self.pinned.values()))

    @property
    def pageable_bytes(self) -> int:
        return int(sum(self.pageable.values()))

    @property
    def train_bytes(self) -> int:
        """What the plan keeps in host memory during training (pinned and pageable)."""
        return self.pinned_bytes + self.pageable_bytes

    @property
    def peak_phase(self) -> str:
        """load or train: the phase that sets the host peak."""
        return "load" if self.load_bytes > self.train_bytes else "train"

    @property
    def peak_bytes(self) -> int:
        """The run's host peak: the process baseline plus the higher of loading and training (the loaded copy
        is gone once the weights are on the GPU, before the optimizer's host buffers exist)."""
        return int(self.baseline_bytes + max(self.load_bytes, self.train_bytes))

    def by_category(self) -> dict[str, int]:
        """Pinned and pageable bytes summed per category (the report's ``host``)."""
        out: dict[str, int] = {}
        for part in (self.pinned, self.pageable):
            for k, v in part.items():
                out[k] = out.get(k, 0) + int(v)
        return out

    def scaled(self, divide_by: int, categories: Sequence[str]) -> "HostMemory":
        """The same with ``categories`` split ``divide_by`` ways (state sharded across data-parallel ranks)."""
        def part(d: dict[str, int]) -> dict[str, int]:
            return {k: (v // divide_by if k in categories else v) for k, v in d.items()}
        return replace(self, pinned=part(self.pinned), pageable=part(self.pageable))

    def to_dict(self) -> dict[str, Any]:
        return {"pinned": dict(self.pinned), "pageable": dict(self.pageable), "pinned_bytes": self.pinned_bytes,
                "pageable_bytes": self.pageable_bytes, "load_bytes": self.load_bytes, "load_what": self.load_what,
                "baseline_bytes": self.baseline_bytes, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "notes": list(self.notes)}


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
    """Diagnostics to show, which no decision and no export reads (simulation seconds, the overhead's parts, who
    answered, the probe's versions). What a decision or an export reads has a typed field of its own (``kv_cache``,
    ``measured``, ``sharded``, ``run_phases``...); a key here may repeat one for display."""
    reserved_peak_bytes: int | None = None
    """Peak of ``torch.cuda.max_memory_reserved``: the tensor peak plus what the caching allocator holds
    beyond it (replayed through advisor.memory.allocator by the simulate backend, estimated by the
    estimate backend, measured by a GPU probe); None where unknown (a CPU probe)."""
    run_phases: RunPhases | None = None
    """The whole run's phases (load, train, eval, generate, save) once attached (advisor.memory.phases.attach);
    None for a step alone."""
    measured: StepMeasurement | None = None
    """Speed and accuracy a real run measured (cpu and cuda probes); None otherwise."""
    host_memory: HostMemory | None = None
    """Host memory split by how it is allocated (pinned / pageable), with the load phase and the process
    baseline; None where the backend does not model host memory (a probe)."""
    sharded: tuple[int, str] | None = None
    """(GPUs, strategy) when advisor.memory.sharding.shard_report made this the per-GPU ledger of a
    data-parallel run (the run's load phase follows the strategy); None for one GPU's own step."""
    kv_cache: KvCache | None = None
    """The serving KV cache's sizes (the vLLM export states them); None for training."""

    @property
    def host_bytes(self) -> int:
        """What the plan keeps in host memory during training (the sum of ``host``)."""
        return sum(self.host.values())

    @property
    def host_peak_bytes(self) -> int:
        """The run's host peak (advisor.core.fit.host_fits decides on it): baseline + max(load, train) when the
        split is known, else the training bytes."""
        return self.host_memory.peak_bytes if self.host_memory is not None else int(self.host_bytes)

    @property
    def host_pinned_bytes(self) -> int:
        return self.host_memory.pinned_bytes if self.host_memory is not None else 0

    @property
    def host_pageable_bytes(self) -> int:
        """Pageable bytes during training (all of ``host`` where the split is unknown)."""
        return self.host_memory.pageable_bytes if self.host_memory is not None else int(self.host_bytes)

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
        d.pop("sharded")  # extra shows gpus and sharding
        d.pop("kv_cache")  # extra shows the KV cache's sizes
        d["host_memory"] = self.host_memory.to_dict() if self.host_memory is not None else None
        d.update(host_peak_bytes=self.host_peak_bytes, host_pinned_bytes=self.host_pinned_bytes,
                 host_pageable_bytes=self.host_pageable_bytes)
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
        run = self.run_phases
        if run is not None:
            d.update(phases=run.to_dict(), run_peak_phase=run.run_peak_phase, run_peak_bytes=run.run_peak_bytes,
                     reserved_model=run.reserved_model, phase_notes=list(run.notes))
            if d["reserved_peak_bytes"] is None:
                d["reserved_peak_bytes"] = run.phases["train"].reserved_bytes
        return d
