"""What only a GPU can answer, behind one door: torch.cuda, NVML, and where a cuda run's tensors live.

The code that asks CUDA or NVML something (the probe child, its budget cap, the calibration of an idle
CUDA process, the Trainer callback's memory readers) asks through ``cuda()`` and ``nvml()``. Normally
they are ``torch.cuda`` and ``pynvml`` themselves, so the real path is the same calls as before. With
``$ADVISOR_CUDA_DOUBLE`` naming a catalog GPU (advisor.core.catalog.cuda_double_gpu, the one place it is
read) they are the CUDA test double (advisor.runtime.cuda_double) and a cuda run's tensors live on the
CPU (``tensor_device``): every branch above this door still takes its cuda path.
"""

from __future__ import annotations

from typing import Any


def double() -> Any:
    """The CUDA test double of this process when ``$ADVISOR_CUDA_DOUBLE`` switches it on, else None."""
    from advisor.runtime.cuda_double import active

    return active()


def cuda() -> Any:
    """``torch.cuda``, or the CUDA test double standing in for it."""
    d = double()
    if d is not None:
        return d
    import torch

    return torch.cuda


def nvml() -> Any:
    """``pynvml`` (None without nvidia-ml-py), or the CUDA test double's NVML."""
    d = double()
    if d is not None:
        return d.nvml
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def tensor_device(device: str) -> str:
    """Where the tensors of a run on ``device`` live: ``device`` itself, except the CPU for cuda under the double."""
    return "cpu" if device.startswith("cuda") and double() is not None else device


__all__ = ["cuda", "double", "nvml", "tensor_device"]
