"""The estimate backend: the closed-form ledger, in microseconds."""

from __future__ import annotations

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.plan import Plan
from advisor.memory.ledger import MemoryReport
from advisor.memory.training import estimate_training
from advisor.runtime.backends._base import BackendOptions, BaseBackend


class EstimateBackend(BaseBackend):
    """The training ledger in closed form (advisor.memory.training): no torch, no GPU."""

    name = "estimate"
    source = "estimated"
    accepts = frozenset()

    def measure(self, model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None,
                options: BackendOptions | None = None) -> MemoryReport:
        self.check(options)
        return estimate_training(model, plan, gpu)
