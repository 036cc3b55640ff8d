"""Ways to measure a plan's memory, one contract (``_base``): ``get_backend(name).measure(model, plan, gpu, options)``.

| backend  | what runs                                          | needs  |
|----------|----------------------------------------------------|--------|
| estimate | the closed-form ledger (advisor.memory.training)   | nothing|
| simulate | the real step under FakeTensorMode                 | torch  |
| cpu      | a real short run on the CPU (child process)        | torch  |
| cuda     | a real short run on the GPU (child process)        | a GPU  |

``BACKENDS`` is the list, written once (the commands' ``--backend`` choices import it). Backends are
imported when first asked for, so that listing them costs nothing.
"""

from __future__ import annotations

import importlib

from advisor.core.errors import AdvisorInputError
from advisor.runtime.backends._base import STAGES, Backend, BackendFailed, BackendOptions, FAILURE_STATUSES, Stage

# name -> "module:class"; each class implements the Backend protocol
_REGISTRY = {
    "estimate": "advisor.runtime.backends._estimate:EstimateBackend",
    "simulate": "advisor.runtime.backends._simulate:SimulateBackend",
    "cpu": "advisor.runtime.backends._probe:CpuBackend",
    "cuda": "advisor.runtime.backends._probe:CudaBackend",
}
BACKENDS: tuple[str, ...] = tuple(_REGISTRY)
"""Every backend, cheapest first."""
PROBES: tuple[str, ...] = ("cpu", "cuda")
"""The backends that run the plan for real (and enforce a budget)."""

__all__ = ["BACKENDS", "PROBES", "FAILURE_STATUSES", "STAGES", "Backend", "BackendFailed", "BackendOptions", "Stage",
           "available", "get_backend", "resolve_backend", "stages_of"]


def available() -> list[str]:
    return list(BACKENDS)


def get_backend(name: str, flag: str = "--backend") -> Backend:
    """The backend called ``name``; an unknown name is an input error naming ``flag``."""
    if name not in _REGISTRY:
        raise AdvisorInputError(flag, f"must be one of {', '.join(BACKENDS)}", name)
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def stages_of(name: str, flag: str = "--backend") -> tuple[Stage, ...]:
    """The stages a tuner trial runs under the backend called ``name`` (its class's declaration)."""
    return get_backend(name, flag).stages


def resolve_backend(name: str, detected_gpu: object | None, flag: str = "--backend") -> str:
    """The backend a command runs: ``auto`` is cuda when a GPU is detected, else simulate; cuda without a
    detected GPU is an input error naming ``flag``."""
    if name == "auto":
        return "cuda" if detected_gpu is not None else "simulate"
    if name not in _REGISTRY:
        raise AdvisorInputError(flag, f"must be one of auto, {', '.join(BACKENDS)}", name)
    if name == "cuda" and detected_gpu is None:
        raise AdvisorInputError(flag, "cuda needs a GPU and none was detected (use simulate or cpu)", name)
    return name
