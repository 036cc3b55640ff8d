"""The phases of a GRPO/DPO step as a picture's data: per phase what the trainer keeps resident, what vLLM holds and
what the phase itself adds, which phase sets the peak, and what vLLM's pool holds (weights, KV cache, its reserve).

Calculation only (from a MemoryReport of the closed form, advisor.memory.rl): the HTML report
(advisor.ui.report._html) and the TUI (advisor.ui.tui.draw) render the same ``PhasePicture``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.memory.ledger import MemoryReport
from advisor.memory.phases import resident_bytes

STEP_PHASES = ("generate", "score", "train", "sync")
"""The phases of one GRPO/DPO step, in the order they run (DPO: train only)."""
VLLM_CATEGORIES = ("vllm_weights", "kv_cache", "vllm_reserve")
"""The ledger categories of a colocated vLLM on the training GPU (advisor.memory.rl)."""
SEGMENTS = ("resident", "vllm", "phase")
"""What each bar is made of: the trainer's resident state, what vLLM holds, and what the phase itself adds."""


@dataclass(frozen=True)
class PhaseBar:
    name: str
    live_bytes: int
    """Tensors alive at the phase's peak (the bar's length)."""
    segments: dict[str, int]
    """resident / vllm / phase bytes, summing to live_bytes."""
    what: str
    peak: bool
    """This phase sets the step's peak."""


@dataclass(frozen=True)
class VllmHolds:
    engine: str
    pool_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    reserve_bytes: int
    """CUDA graphs, the profiled activations and non-torch memory."""
    kv_tokens: int
    batch_tokens: int
    holds_batch: bool
    starts: bool
    asleep_while_training: bool
    """Sleep level 2 (or 1): during score and train vLLM keeps only its CUDA graphs and non-torch memory."""

    @property
    def parts(self) -> dict[str, int]:
        return {"weights": self.weights_bytes, "KV cache": self.kv_cache_bytes, "graphs + reserve": self.reserve_bytes}


@dataclass(frozen=True)
class PhasePicture:
    task: str
    bars: list[PhaseBar]
    step_peak_phase: str
    run_peak_phase: str
    run_peak_bytes: int
    vllm: VllmHolds | None

    def scale(self, budget_bytes: int | None) -> int:
        """The bytes the full width stands for: the budget or the largest bar, whichever is larger."""
        return max([budget_bytes or 0] + [b.live_bytes for b in self.bars]) or 1


def phase_picture(report: MemoryReport) -> PhasePicture | None:
    """The picture of a GRPO/DPO report with its run phases attached (None: not an RL report, or no phases)."""
    task = report.extra.get("task")
    phases = report.run_phases.phases if report.run_phases is not None else {}
    if task not in ("grpo", "dpo") or not phases:
        return None
    gen: dict[str, Any] | None = report.extra.get("generation")
    colocated = bool(gen) and gen["engine"] == "vllm-colocate"
    resident = resident_bytes(report)
    in_step = sum(report.device.get(k, 0) for k in VLLM_CATEGORIES)  # what vLLM holds while the trainer steps
    names = [n for n in STEP_PHASES if n in phases and phases[n].included]
    step_top = max(names, key=lambda n: phases[n].live_bytes)
    bars = []
    for name in names:
        ph = phases[name]
        held = (gen["pool_bytes"] if name == "generate" else in_step) if colocated else 0  # vLLM's, in this phase
        if name == "sync" and colocated and report.device.get("vllm_weights", 0) == 0:
            held += gen["weights_bytes"]  # a sleeping vLLM's weights are woken to receive the trainer's
        held = min(held, max(0, ph.live_bytes - resident))
        own = max(0, ph.live_bytes - resident - held)
        bars.append(PhaseBar(name, ph.live_bytes, {"resident": min(resident, ph.live_bytes), "vllm": held,
                                                   "phase": own}, ph.what, name == step_top))
    vllm = None
    if gen and gen["engine"] != "transformers":
        vllm = VllmHolds(gen["engine"], gen["pool_bytes"], gen["weights_bytes"], gen["kv_cache_bytes"],
                         gen["reserve_bytes"], gen["kv_tokens"], gen["batch_tokens"], gen["holds_batch"],
                         gen["starts"], colocated and report.device.get("kv_cache", 0) == 0)
    return PhasePicture(task, bars, step_top, report.run_peak_phase, report.run_peak_bytes, vllm)


def picture_of_plan(model, plan, gpu) -> PhasePicture | None:
    """The picture of a GRPO/DPO plan by the closed form (None for SFT, or a model the closed form does not
    describe)."""
    if getattr(plan, "task", "sft") not in ("grpo", "dpo"):
        return None
    from advisor.core.errors import AdvisorInputError
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    try:
        report = get_backend("estimate").measure(model, plan, gpu)
    except AdvisorInputError:
        return None
    return phase_picture(with_phases(model, plan, gpu, report))


def picture_of_record(record, description) -> PhasePicture | None:
    """The picture of a study's trial (its stored plan, the study's model and GPU)."""
    plan_dict = getattr(record, "plan", None) or {}
    if plan_dict.get("task", "sft") not in ("grpo", "dpo"):
        return None
    from advisor.core.plan import Plan

    try:
        plan = Plan.from_dict(plan_dict)
    except Exception:  # an old or edited study: no picture rather than a broken page
        return None
    return picture_of_plan(description.model, plan, description.gpu)
