"""Framework overhead on the GPU: what no tensor accounts for.

Three parts (overheads.yaml documents each): the CUDA context and the cuBLAS workspace (measured on
the GPU by ``advisor calibrate`` and real probes when a calibration exists for it,
advisor.memory.calibration; else the file's figures), and the caching allocator's fragmentation
(reserved minus allocated at the peak): replayed through the allocator model when the caller has
the step's allocations (the simulate backend), else estimated (``estimated_fragmentation``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from advisor.core.catalog import GpuSpec, MIB
from advisor.core.data_files import load_data_file

ESTIMATED = "estimated (advisor/data/overheads.yaml)"


@lru_cache(maxsize=1)
def _overheads_file() -> dict[str, Any]:
    """overheads.yaml, parsed once (every estimate asks for its terms; read-only after this)."""
    return load_data_file("overheads.yaml")


def overhead_terms(gpu: GpuSpec | None) -> dict[str, Any]:
    """The overhead terms for ``gpu`` (its catalog key's entry over the defaults)."""
    data = _overheads_file()
    terms = dict(data["default"])
    if gpu is not None and gpu.key in data:
        terms.update(data[gpu.key])
    return terms


@dataclass(frozen=True)
class Overhead:
    """Bytes added to the tensor peak on a GPU, its parts, and where each figure comes from."""

    total: int
    parts: dict[str, int]
    """cuda_context, cublas_workspace, fragmentation."""
    source: str
    """Of the context and cuBLAS figures: "calibrated on <GPU> (N probes)" or estimated."""
    fragmentation_source: str
    """replayed (caching-allocator model) or estimated (``estimated_fragmentation``)."""

    def notes(self) -> list[str]:
        return [f"framework overhead: CUDA context and cuBLAS workspace {self.source}; "
                f"allocator fragmentation {self.fragmentation_source}"]


_CAL_CACHE: dict[tuple, Any] = {}


def _calibration(gpu: GpuSpec | None):
    """The GPU's calibration, read once per change of the file (the tuner asks hundreds of times)."""
    if gpu is None:
        return None
    from advisor.memory.calibration import calibration_for, default_path

    path = default_path()
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return None
    key = (gpu.name, str(path), stamp)
    if key not in _CAL_CACHE:
        _CAL_CACHE.clear()
        _CAL_CACHE[key] = calibration_for(gpu.name, path=path)
    return _CAL_CACHE[key]


def estimated_fragmentation(tensor_peak_bytes: int, terms: dict[str, Any], *, expandable_segments: bool = False,
                            loss_transient_bytes: int | None = None) -> tuple[int, str]:
    """Reserved minus allocated at the peak, without an allocation sequence to replay, and how it was
    estimated. A training step (``loss_transient_bytes``: the loss's logits transient of the ledger):
    a share of that transient, whose blocks stay cached and rarely fit what backward allocates next,
    plus a share of the tensor peak (overheads.yaml ``step_fragmentation``, fitted on replayed steps by
    benchmarks/fragmentation_replays.py). Otherwise a fraction of the tensor peak (``fragmentation``)."""
    suffix = "_expandable" if expandable_segments else ""
    if loss_transient_bytes is not None:
        key = "step_fragmentation" + suffix
        f = terms[key]
        frag = f["of_tensor_peak"] * tensor_peak_bytes + f["of_loss_transient"] * loss_transient_bytes
        return int(frag), (f"estimated: {f['of_loss_transient']:.0%} of the loss's logits transient + "
                           f"{f['of_tensor_peak']:.1%} of the tensor peak (overheads.yaml {key}; no allocation "
                           f"sequence to replay)")
    key = "fragmentation" + suffix
    frac = float(terms[key])
    return int(frac * tensor_peak_bytes), (f"estimated: {frac:.0%} of the tensor peak (overheads.yaml {key}; "
                                           f"no allocation sequence to replay)")


def overhead_of(tensor_peak_bytes: int, gpu: GpuSpec | None, *, fragmentation_bytes: int | None = None,
                expandable_segments: bool = False, loss_transient_bytes: int | None = None) -> Overhead:
    """The overhead of a step whose live tensors peak at ``tensor_peak_bytes`` on ``gpu``.

    ``fragmentation_bytes``: the replayed reserved-minus-allocated (advisor.runtime.simulate.reserved);
    without it, the estimate of overheads.yaml (``estimated_fragmentation``; a training step passes
    its ``loss_transient_bytes``).
    """
    t = overhead_terms(gpu)
    context, cublas, source = int(t["cuda_context_mib"] * MIB), int(t["cublas_workspace_mib"] * MIB), ESTIMATED
    cal = _calibration(gpu)
    if cal is not None:
        context = cal.cuda_context_bytes
        cublas = cal.cublas_workspace_bytes if cal.cublas_workspace_bytes is not None else cublas
        source = cal.label
    if fragmentation_bytes is not None:
        frag, frag_source = int(fragmentation_bytes), "replayed through the caching-allocator model"
    else:
        frag, frag_source = estimated_fragmentation(tensor_peak_bytes, t, expandable_segments=expandable_segments,
                                                    loss_transient_bytes=loss_transient_bytes)
    parts = {"cuda_context": context, "cublas_workspace": cublas, "fragmentation": frag}
    return Overhead(sum(parts.values()), parts, source, frag_source)


def outside_allocator_bytes(gpu: GpuSpec | None) -> int:
    """CUDA context and cuBLAS workspace: GPU memory no tensor and no segment accounts for (measured on
    the GPU when it has been calibrated, advisor.memory.calibration; else overheads.yaml). The training
    run's phases and the serving ledger both add it."""
    parts = overhead_of(0, gpu).parts
    return int(parts["cuda_context"] + parts["cublas_workspace"])


def framework_overhead(tensor_peak_bytes: int, gpu: GpuSpec | None, *, fragmentation_bytes: int | None = None,
                       expandable_segments: bool = False,
                       loss_transient_bytes: int | None = None) -> tuple[int, dict[str, int]]:
    """Bytes added to the tensor peak on a GPU, and its parts (see ``overhead_of``)."""
    o = overhead_of(tensor_peak_bytes, gpu, fragmentation_bytes=fragmentation_bytes,
                    expandable_segments=expandable_segments, loss_transient_bytes=loss_transient_bytes)
    return o.total, o.parts
