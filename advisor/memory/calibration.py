"""Measured GPU overheads, kept per GPU model and torch / driver version (the calibration file).

What no tensor accounts for differs by GPU, driver and torch build: the CUDA context (kernels
loaded, lazily or not), the cuBLAS workspaces, how much the caching allocator holds beyond the
live blocks. A CUDA probe measures them (``advisor calibrate``, and every real probe of a study):

- CUDA context: NVML's memory of the probe process minus ``torch.cuda.memory_reserved`` at the
  same moment (everything the process holds outside the caching allocator);
- cuBLAS workspace: ``torch.cuda.memory_allocated`` after the first matmul (its output freed)
  minus before it (torch allocates the workspace through the caching allocator,
  aten/src/ATen/cuda/CublasHandlePool.cpp ``getCUDABlasLtWorkspace``);
- reserved against allocated: ``max_memory_reserved`` / ``max_memory_allocated`` of the probe.

The file is JSON (``{"version": 1, "probes": [...]}``), at ``$ADVISOR_MEMORY_CALIBRATION`` or
``$XDG_CACHE_HOME/vram-advisor/memory_calibration.json`` (``~/.cache`` when unset). Predictions for a GPU
use the median of its probes, preferring those of the torch version installed here, and say so:
"calibrated on NVIDIA H200 (3 probes)".
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable

from advisor.core.errors import AdvisorInputError

ENV = "ADVISOR_MEMORY_CALIBRATION"
VERSION = 1


def default_path() -> Path:
    """Where the calibration file lives (``$ADVISOR_MEMORY_CALIBRATION`` overrides it)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vram-advisor" / "memory_calibration.json"


@dataclass(frozen=True)
class OverheadProbe:
    """One real run's measured overheads on one GPU."""

    gpu: str
    """GPU name as torch / NVML give it ("NVIDIA H200")."""
    cuda_context_bytes: int
    """NVML process memory minus torch.cuda.memory_reserved at the same moment."""
    cublas_workspace_bytes: int | None = None
    """Allocated bytes the first matmul left behind (the cuBLAS / cuBLASLt workspace)."""
    reserved_peak_bytes: int | None = None
    """torch.cuda.max_memory_reserved of the probe."""
    allocated_peak_bytes: int | None = None
    """torch.cuda.max_memory_allocated of the probe."""
    torch: str | None = None
    """torch version."""
    cuda: str | None = None
    """CUDA version torch was built with."""
    driver: str | None = None
    """NVIDIA driver version."""
    workload: str = ""
    """What ran (a probe's model and plan, or the calibration matmuls)."""
    time: float = 0.0
    """When it was measured (seconds since the epoch)."""

    @property
    def reserved_over_allocated(self) -> float | None:
        if self.reserved_peak_bytes and self.allocated_peak_bytes:
            return self.reserved_peak_bytes / self.allocated_peak_bytes
        return None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OverheadProbe":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_probe(cls, result: dict[str, Any]) -> "OverheadProbe | None":
        """The overheads of a CUDA probe's result (``ProbeResult.to_dict()``), None when it measured none."""
        if result.get("device") != "cuda" or not result.get("gpu_name"):
            return None
        context = result.get("cuda_context_bytes")
        if context is None:
            nvml, reserved = result.get("nvml_peak_bytes"), result.get("peak_reserved_bytes")
            if not nvml or not reserved:
                return None
            context = nvml - reserved   # at the peak: the process's memory beyond the allocator's segments
        v = result.get("versions") or {}
        plan = result.get("plan") or {}
        return cls(gpu=str(result["gpu_name"]), cuda_context_bytes=int(context),
                   cublas_workspace_bytes=result.get("cublas_workspace_bytes"),
                   reserved_peak_bytes=result.get("peak_reserved_bytes"),
                   allocated_peak_bytes=result.get("peak_allocated_bytes"),
                   torch=v.get("torch"), cuda=v.get("cuda"), driver=v.get("driver"),
                   workload=f"probe {result.get('model', '')} {plan.get('method', '')} "
                            f"seq {plan.get('seq_len', '')}".strip(),
                   time=time.time())


@dataclass(frozen=True)
class Calibration:
    """The overheads to use for one GPU: medians over its probes."""

    gpu: str
    probes: int
    cuda_context_bytes: int
    cublas_workspace_bytes: int | None
    reserved_over_allocated: float | None
    torch: str | None
    driver: str | None

    @property
    def label(self) -> str:
        return f"calibrated on {self.gpu} ({self.probes} probe{'s' if self.probes != 1 else ''})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def load(path: Path | str | None = None) -> list[OverheadProbe]:
    """Every probe in the calibration file (none when it does not exist)."""
    p = Path(path) if path is not None else default_path()
    if not p.exists():
        return []
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        return [OverheadProbe.from_dict(d) for d in data.get("probes", [])]
    except (ValueError, TypeError, AttributeError) as e:
        raise AdvisorInputError(ENV, f"the calibration file {p} is not a calibration file ({e}); delete it or "
                                "point ADVISOR_MEMORY_CALIBRATION elsewhere", str(p), show_value=False) from None


def record(probes: Iterable[OverheadProbe], path: Path | str | None = None) -> Path:
    """Append ``probes`` to the calibration file (written whole, through a temporary file)."""
    p = Path(path) if path is not None else default_path()
    kept = load(p) + [x for x in probes if x is not None]
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": VERSION, "probes": [asdict(x) for x in kept]}, indent=1), encoding="utf-8")
    tmp.replace(p)
    return p


def record_probe_result(result: dict[str, Any], path: Path | str | None = None) -> bool:
    """Add a CUDA probe's overheads (``ProbeResult.to_dict()``) to the file; False when it measured none
    or the file cannot be written (a read-only cache never stops a probe)."""
    probe = OverheadProbe.from_probe(result) if result.get("status") == "ok" else None
    if probe is None:
        return False
    try:
        record([probe], path)
    except (OSError, AdvisorInputError):
        return False
    return True


def _torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")   # without importing torch
    except metadata.PackageNotFoundError:
        return None


def calibration_for(gpu_name: str | None, *, torch_version: str | None = None, driver: str | None = None,
                    path: Path | str | None = None) -> Calibration | None:
    """The calibration of ``gpu_name`` (medians of its probes), None when it was never probed.

    Probes of the same torch version (and driver, when given) are preferred; when there are none,
    every probe of that GPU is used.
    """
    if not gpu_name:
        return None
    probes = [x for x in load(path) if x.gpu.lower() == gpu_name.lower()]
    if not probes:
        return None
    torch_version = torch_version or _torch_version()
    for keep in (lambda x: x.torch == torch_version and (driver is None or x.driver == driver),
                 lambda x: x.torch == torch_version):
        same = [x for x in probes if keep(x)]
        if same:
            probes = same
            break
    cublas = [x.cublas_workspace_bytes for x in probes if x.cublas_workspace_bytes is not None]
    ratio = [r for r in (x.reserved_over_allocated for x in probes) if r is not None]
    last = probes[-1]
    return Calibration(gpu=probes[0].gpu, probes=len(probes),
                       cuda_context_bytes=int(statistics.median(x.cuda_context_bytes for x in probes)),
                       cublas_workspace_bytes=int(statistics.median(cublas)) if cublas else None,
                       reserved_over_allocated=statistics.median(ratio) if ratio else None,
                       torch=last.torch, driver=last.driver)
