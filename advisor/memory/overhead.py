"""Framework overhead on the GPU: what no tensor accounts for (overheads.yaml)."""

from __future__ import annotations

from typing import Any

from advisor.core.catalog import GpuSpec, MIB, _load_data


def overhead_terms(gpu: GpuSpec | None) -> dict[str, Any]:
    """The overhead terms for ``gpu`` (its catalog key's entry over the defaults)."""
    data = _load_data("overheads.yaml")
    terms = dict(data["default"])
    if gpu is not None and gpu.key in data:
        terms.update(data[gpu.key])
    return terms


def framework_overhead(tensor_peak_bytes: int, gpu: GpuSpec | None) -> tuple[int, dict[str, int]]:
    """Bytes added to the tensor peak on a GPU, and its parts."""
    t = overhead_terms(gpu)
    parts = {
        "cuda_context": int(t["cuda_context_mib"] * MIB),
        "cublas_workspace": int(t["cublas_workspace_mib"] * MIB),
        "fragmentation": int(t["fragmentation"] * tensor_peak_bytes),
    }
    return sum(parts.values()), parts
