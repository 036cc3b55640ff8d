"""ProbeResult: what one probe measured, frozen, and round-tripped through JSON.

Every number here was measured by a real run in a child process (``source`` is always
"measured"); a figure that could not be measured is ``None``, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

STATUSES = ("ok", "oom", "timeout", "crash", "error")
_TUPLES = ("step_peaks_bytes", "step_times_s", "losses", "notes")


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe: status, memory, speed, accuracy and the software it ran on."""

    status: str
    """ok, oom (out of memory or over the budget), timeout, crash (signal, CUDA error, died) or error (Python
    exception)."""
    message: str
    """The essence of what went wrong in one line (empty when ok)."""
    device: str
    """cpu or cuda."""
    model: str
    """Name of the model probed."""
    plan: dict[str, Any]
    """The Plan (as Plan.to_dict()) that was run."""
    steps: int
    """Measured optimizer steps asked for (after the warm-up)."""
    warmup: int
    """Warm-up optimizer steps, run but not timed."""
    steps_done: int = 0
    """Optimizer steps completed, warm-up included."""
    peak_allocated_bytes: int | None = None
    """Peak of live tensor bytes: torch.cuda.max_memory_allocated on a GPU, the live-bytes tracker on the CPU."""
    peak_reserved_bytes: int | None = None
    """Peak bytes held by the CUDA caching allocator (torch.cuda.max_memory_reserved); None on the CPU."""
    nvml_peak_bytes: int | None = None
    """Peak GPU memory of the whole child process as NVML reports it (CUDA context included); None on the CPU."""
    peak_phase: str = ""
    """When the peak happened (forward, backward, optimizer, zero_grad), where the method can tell; else empty."""
    load_peak_bytes: int | None = None
    """Peak live bytes while building and loading the model (before the first step)."""
    load_reserved_bytes: int | None = None
    """Peak bytes the caching allocator reserved while building and loading (torch.cuda.max_memory_reserved); None
    on the CPU."""
    memory_method: str = ""
    """How peak_allocated_bytes was measured."""
    breakdown: dict[str, int] = field(default_factory=dict)
    """Measured bytes of the persistent tensors by ledger category (weights, adapters, gradients, optimizer...)."""
    step_peaks_bytes: tuple[int, ...] = ()
    """Peak live tensor bytes of each optimizer step (warm-up included)."""
    step_times_s: tuple[float, ...] = ()
    """Wall time of each measured optimizer step, synchronized before and after."""
    alloc_retries: int | None = None
    """cudaMalloc retries after freeing the cache, over the whole probe (torch.cuda.memory_stats
    num_alloc_retries); None on the CPU."""
    step_time_median_s: float | None = None
    """Median of step_times_s."""
    step_time_p90_s: float | None = None
    """90th percentile (nearest rank) of step_times_s."""
    tokens_per_s: float | None = None
    """Tokens of one optimizer step divided by the median step time."""
    losses: tuple[float, ...] = ()
    """Training loss of each optimizer step (mean over its micro-batches), warm-up included."""
    final_loss: float | None = None
    """Loss of the last step."""
    fidelity_kl: float | None = None
    """Mean KL(P_ref || P_plan) per token of the plan's base model from the reference-precision base on the eval
    texts (nats); None with random weights."""
    fidelity_tokens: int = 0
    """Tokens the fidelity and eval losses were computed over."""
    eval_loss_base: float | None = None
    """Cross-entropy of the plan's base model (before training) on the eval texts."""
    eval_loss_after: float | None = None
    """Cross-entropy on the eval texts after the short run."""
    learning_rate: float | None = None
    """The constant learning rate the run trained at, when one was asked for (None: the optimizer's default)."""
    weights: str = "random"
    """random (initialized from the config) or the directory real weights were loaded from."""
    data: str = "synthetic"
    """synthetic, or the data file that was tokenized and packed."""
    tokenizer: str = "none"
    """none (synthetic ids), model (the model directory's tokenizer) or bytes (UTF-8 byte fallback)."""
    budget_bytes: int | None = None
    """Memory budget enforced on the child (None: no budget)."""
    wall_s: float = 0.0
    """Seconds from spawning the child to its end."""
    exit: str = ""
    """How the child ended: "exit 0", "exit 1", "signal SIGKILL", "killed by the parent (timeout)"..."""
    gpu_name: str | None = None
    """Name of the GPU (torch.cuda.get_device_name), None on the CPU."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """torch, transformers, peft, bitsandbytes, deepspeed, cuda, driver (None when absent)."""
    notes: tuple[str, ...] = ()
    """Caveats worth showing a person."""
    source: str = "measured"
    """Always measured: a probe is a real run."""
    test_double: str | None = None
    """The catalog GPU the CUDA test double stood for (``$ADVISOR_CUDA_DOUBLE``, advisor.runtime.cuda_double): the
    step ran on the CPU and the cuda-only figures (reserved, NVML) are the double's. None on a real device."""

    def __post_init__(self) -> None:
        for key in _TUPLES:  # JSON gives lists; keep the frozen object hashable-in-spirit and comparable
            value = getattr(self, key)
            if not isinstance(value, tuple):
                object.__setattr__(self, key, tuple(value))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in _TUPLES:
            d[key] = list(d[key])
        return d

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeResult":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "ProbeResult":
        return cls.from_dict(json.loads(text))
