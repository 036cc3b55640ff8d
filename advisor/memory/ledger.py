"""The memory ledger (the seeds' 显存账本): bytes per category, on the GPU and in host memory.

Every backend (estimate, simulate, cpu, cuda) returns a ``MemoryReport`` holding the same
categories, so the CLI, the TUI and the report render one kind of object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
    """Backend-specific figures (e.g. kv_cache_bytes_per_token, simulation seconds)."""
    reserved_peak_bytes: int | None = None
    """Peak of ``torch.cuda.max_memory_reserved``: the tensor peak plus what the caching allocator holds
    beyond it (replayed through advisor.memory.allocator by the simulate backend, estimated by the
    estimate backend, measured by a GPU probe); None where unknown (a CPU probe)."""

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["host_bytes"] = self.host_bytes
        return d
