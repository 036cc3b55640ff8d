"""What a command plans for, resolved once: the model, the GPU, the budget, and whether the GPU is assumed.

One rule for every command (estimate, tune for training and inference, probe, preflight, worker):

- model: ``--model`` (catalog name or alias, hub id, local directory), advisor.core.catalog.resolve_model;
- GPU: ``--gpu`` (catalog), else the GPU in this machine (NVML), else, when a budget is given, the
  catalog GPU the budget matches (``gpu_assumed``: throughput and overheads are predicted for it);
  with neither a GPU nor a budget there is none;
- budget: ``--gpu-budget`` ("24GB", or "90%" of the GPU named or detected); without it, the memory of
  the GPU named or detected when the command asks for that default (preflight), else none; never more
  than the card has (its memory rounded up to a whole GiB; without a card, the largest in the catalog);
- host budget: ``--host-budget`` ("64GB", or "50%" of the RAM detected here) when planning for another
  machine, else the RAM detected on this one (advisor.core.host: psutil, or the container's limit). The host
  rule (advisor.core.fit.host_fits) keeps the OS reserve out of it.
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
    host_budget: Budget | None = None
    """The host RAM the run's machine has (--host-budget, else detected); None: host memory is not checked."""
    host_detected: bool = False
    """``host_budget`` is a default, not a value the user gave: this machine's RAM as detected, or the usual node of
    a card the run is planned for elsewhere (``host_here`` says which)."""
    host_here: bool = False
    """``host_budget`` is this machine's RAM as detected (what is free on it now means something for the run)."""

    @property
    def known_gpu(self) -> GpuSpec | None:
        """The GPU named or detected (None when it is only assumed): what environment checks may judge."""
        return None if self.gpu_assumed else self.gpu


def resolve_target(model: str | ModelSpec, *, gpu: str | None = None, gpu_budget: str | None = None,
                   trust_remote_code: bool = False, budget_required: bool = False,
                   budget_defaults_to_gpu: bool = False, detect: bool = True,
                   host_budget: str | None = None, gpus: int = 1) -> Target:
    """The Target from what the user typed (flags named in every error).

    ``budget_required``: no --gpu-budget is an error. ``budget_defaults_to_gpu``: without --gpu-budget
    the budget is the whole memory of the GPU named or detected. ``detect=False`` skips NVML and the RAM
    detection (tests: no host budget unless ``host_budget`` is given).
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
        check_budget_on_card(budget, largest_gpu(), "the largest catalog GPU")
        chosen = gpu_for_budget(budget.bytes)
    elif budget is not None and chosen is not None:
        check_budget_on_card(budget, chosen, "the " if gpu else "the detected ",
                             "" if gpu else "; name the GPU the run is for with --gpu")
    planned_elsewhere = gpu is not None and (detected is None or detected.name != chosen.name)
    host, host_detected = resolve_host_budget(host_budget, detect, chosen if planned_elsewhere else None, gpus)
    here = host_detected and not (planned_elsewhere and chosen.node_host_ram_bytes)
    return Target(model=spec, gpu=chosen, budget=budget, gpu_assumed=assumed, detected=detected,
                  host_budget=host, host_detected=host_detected, host_here=here)


def card_ceiling_bytes(gpu: GpuSpec) -> int:
    """The most a budget on ``gpu`` may ask: its memory rounded up to a whole GiB, as datasheets round it (an RTX
    4090's 23.99 GiB is its "24 GB", an H100's 79.6 GiB its "80 GB"; an A10G's 22.5 GiB is not 24)."""
    gib = 2**30
    return -(-gpu.memory_bytes // gib) * gib


def largest_gpu() -> GpuSpec:
    """The catalog GPU with the most memory."""
    from advisor.core.catalog import gpu_catalog, resolve_gpu

    return max((resolve_gpu(key) for key in gpu_catalog()), key=lambda g: g.memory_bytes)


def check_budget_on_card(budget: Budget, gpu: GpuSpec, which: str, hint: str = "") -> None:
    """A budget per GPU above what ``gpu`` has is an input error naming --gpu-budget, the value and the card's
    memory (``which`` says which card: "the ", "the detected ", "the largest catalog GPU")."""
    from advisor.core.units import format_bytes

    if budget.bytes <= card_ceiling_bytes(gpu):
        return
    card = f"{which} ({gpu.name})" if which.endswith("GPU") else f"{which}{gpu.name}"
    raise AdvisorInputError("--gpu-budget", f"more than {card} has: {format_bytes(gpu.memory_bytes, 'GiB', 1)} per GPU"
                            f"{hint}", budget.text)


NODE_GPUS = 8
"""GPUs of the server node whose RAM gpus.yaml gives (``node_host_ram_gib``: DGX / HGX nodes of 8)."""


def resolve_host_budget(text: str | None, detect: bool = True, planned_gpu: GpuSpec | None = None,
                        gpus: int = 1) -> tuple[Budget | None, bool]:
    """(the host budget, whether it is a default rather than given): ``--host-budget`` as typed (a percentage of
    the RAM detected here); else, for a run planned for another machine's card (``planned_gpu``: named, not the
    one detected here) that has a usual node, that node's RAM for ``gpus`` of its 8 GPUs (a 1-GPU cloud slice of a
    DGX H100 has about an eighth of its 2 TB); else this machine's RAM; neither without detection."""
    from advisor.core.host import detect_host_ram
    from advisor.core.units import format_bytes, parse_host_budget

    if text is not None:
        ram = detect_host_ram().bytes if str(text).strip().endswith("%") else None
        return parse_host_budget(text, ram), False
    if not detect:
        return None, False
    if planned_gpu is not None and planned_gpu.node_host_ram_bytes:
        share = min(max(gpus, 1), NODE_GPUS)
        node = planned_gpu.node_host_ram_bytes * share // NODE_GPUS
        what = "the node" if share == NODE_GPUS else f"{share}/{NODE_GPUS} of the node"
        return Budget(node, "GiB", f"{format_bytes(node, 'GiB', 0)} ({what} of {planned_gpu.node_source})"), True
    ram = detect_host_ram()
    return Budget(ram.bytes, "GiB", f"{format_bytes(ram.bytes, 'GiB', 1)} (this machine: {ram.source})"), True


__all__ = ["Target", "card_ceiling_bytes", "check_budget_on_card", "largest_gpu", "resolve_host_budget",
           "resolve_target"]
