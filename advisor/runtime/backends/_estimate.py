"""The estimate backend: the closed-form ledger, in microseconds; the simulation for a model it cannot describe."""

from __future__ import annotations

from dataclasses import replace

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.plan import Plan
from advisor.memory.closed_form import SIMULATION, closed_form_describes
from advisor.memory.ledger import MemoryReport
from advisor.memory.rl import step_ledger as estimate_training
from advisor.runtime.backends._base import BackendOptions, BaseBackend, Stage


STAND_IN_ROUTER = "qwen3_moe"
"""The family whose router terms approximate a mixture of experts the closed form has none for (``approximate``)."""


class EstimateBackend(BaseBackend):
    """The training ledger in closed form (advisor.memory.training): no torch, no GPU.

    Where the closed form does not describe the model (advisor.memory.closed_form: mixtures of experts, linear or
    latent attention, layers of several kinds, a sliding window shorter than the sequence), the simulate backend
    answers instead (the real model code on fake tensors: seconds, not microseconds), and the report says so: its
    ``backend`` is ``simulate`` and ``extra["answered_by"]`` holds who answered and why."""

    name = "estimate"
    source = "estimated"
    accepts = frozenset()
    stages = (Stage("estimate", "estimate", decides=True),)

    def measure(self, model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None,
                options: BackendOptions | None = None) -> MemoryReport:
        self.check(options)
        describes, why = closed_form_describes(model, plan)
        if describes:
            return estimate_training(model, plan, gpu)
        if plan.task != "sft":
            from advisor.core.errors import AdvisorInputError

            raise AdvisorInputError("--model", f"the closed form does not describe {model.name} ({why}), and the "
                                    f"simulation of {plan.task}'s TRL step is not written yet", model.name,
                                    show_value=False)
        from advisor.runtime.backends._simulate import SimulateBackend

        report = SimulateBackend().measure(model, plan, gpu)
        return replace(report, notes=(f"answered by the simulation, not the closed form: {why}",) + report.notes,
                       extra={**report.extra, "answered_by": {"by": SIMULATION, "why": why}})


def approximate(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None) -> MemoryReport:
    """The closed form applied to a plan it does not describe (advisor.memory.closed_form): an approximation, in
    microseconds, that a search screens plans with and ranks them by, never this backend's answer. The tuner
    simulates the plans it cannot decide by it (advisor.search.tuner ``APPROX_MARGIN``)."""
    describes, why = closed_form_describes(model, plan)
    if describes:
        return estimate_training(model, plan, gpu)
    try:
        report = estimate_training(model, plan, gpu)
    except KeyError:
        # a mixture of experts whose family's router the closed form has no terms for: the router of transformers'
        # generic top-k MoE (Qwen3-MoE's: an fp32 softmax over the experts, then top-k) stands in
        report = estimate_training(replace(model, model_type=STAND_IN_ROUTER), plan, gpu)
        report = replace(report, notes=(f"the router approximated by {STAND_IN_ROUTER}'s",) + report.notes)
    return replace(report, notes=(f"approximated by the closed form, which does not describe this plan: {why}",)
                   + report.notes, extra={**report.extra, "approximated": why})
