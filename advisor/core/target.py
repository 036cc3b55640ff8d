"""What a command plans for, resolved once: the model, the GPU, the budget, and whether the GPU is assumed.

One rule for every command (estimate, tune for training and inference, probe, preflight, worker):

- model: ``--model`` (catalog name or alias, hub id, local directory), advisor.core.catalog.resolve_model;
- GPU: ``--gpu`` (catalog), else the GPU in this machine (NVML), else, when a budget is given, the
  catalog GPU the budget matches (``gpu_assumed``: throughput and overheads are predicted for it);
  with neither a GPU nor a budget there is none;
- budget: ``--gpu-budget`` ("24GB", or "90%" of the GPU named or detected); without it, the memory of
  the GPU named or detected when the command asks for that default (preflight), else none.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.units import Budget


@dataclass(frozen=True)
class Target:
    """The model, GPU and budget one command plans for."""

    model: ModelSpec
    """The model to train or serve."""
    gpu: GpuSpec | None
    """Named with --gpu, detected, or assumed from the budget (see ``gpu_assumed``); None when none is known."""
    budget: Budget | None
    """The memory budget per GPU; None when none was given and the command takes no default."""
    gpu_assumed: bool = False
    """No GPU was named or detected: ``gpu`` is the catalog GPU the budget matches."""
    detected: GpuSpec | None = None
    """The GPU in this machine (where a cuda probe runs); None without one."""

    @property
    def known_gpu(self) -> GpuSpec | None:
        """The GPU named or detected (None when it is only assumed): what environment checks may judge."""
        return None if self.gpu_assumed else self.gpu


def resolve_target(model: str | ModelSpec, *, gpu: str | None = None, gpu_budget: str | None = None,
                   trust_remote_code: bool = False, budget_required: bool = False,
                   budget_defaults_to_gpu: bool = False, detect: bool = True) -> Target:
    """The Target from what the user typed (flags named in every error).

    ``budget_required``: no --gpu-budget is an error. ``budget_defaults_to_gpu``: without --gpu-budget
    the budget is the whole memory of the GPU named or detected. ``detect=False`` skips NVML (tests).
    """
    from advisor.core.catalog import detect_gpu, gpu_for_budget, resolve_gpu, resolve_model
    from advisor.core.units import parse_budget

    spec = model if isinstance(model, ModelSpec) else resolve_model(model, trust_remote_code=trust_remote_code)
    detected = detect_gpu() if detect else None
    chosen = resolve_gpu(gpu) if gpu else detected
    if gpu_budget is not None:
        budget = parse_budget(gpu_budget, "--gpu-budget", chosen.memory_bytes if chosen else None)
    elif budget_required:
        raise AdvisorInputError("--gpu-budget", "is required (e.g. --gpu-budget 24GB)", None, show_value=False)
    elif budget_defaults_to_gpu and chosen is not None:
        budget = Budget(chosen.memory_bytes, "GiB", chosen.name)
    else:
        budget = None
    assumed = chosen is None and budget is not None
    if assumed:
        chosen = gpu_for_budget(budget.bytes)
    return Target(model=spec, gpu=chosen, budget=budget, gpu_assumed=assumed, detected=detected)


__all__ = ["Target", "resolve_target"]
