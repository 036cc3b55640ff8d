"""Ways to measure a plan's memory, one interface: ``measure(model, plan, gpu) -> MemoryReport``.

| backend  | what runs                                   | needs        |
|----------|---------------------------------------------|--------------|
| estimate | the closed-form ledger (advisor.memory.training)    | nothing      |
| simulate | the real step under FakeTensorMode           | torch        |
| cpu      | a real short run on the CPU (child process)  | torch        |
| cuda     | a real short run on the GPU (child process)  | a GPU        |

Backends are imported when first asked for, so that listing them costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Callable

from advisor.core.errors import AdvisorInputError

# name -> "module:function"; each function is measure(model, plan, gpu, **options) -> MemoryReport
_REGISTRY = {
    "estimate": "advisor.runtime.backends._estimate:measure",
    "cpu": "advisor.runtime.probe._backend:measure_cpu",
    "cuda": "advisor.runtime.probe._backend:measure_cuda",
    "simulate": "advisor.runtime.backends._simulate:measure",
}

__all__ = ["available", "get_backend", "register"]


def register(name: str, target: str) -> None:
    """Add a backend ("module:function")."""
    _REGISTRY[name] = target


def available() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str) -> Callable:
    if name not in _REGISTRY:
        raise AdvisorInputError("--backend", f"must be one of {', '.join(_REGISTRY)}", name)
    module, func = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), func)
