"""The estimate backend: the closed-form ledger, in microseconds."""

from __future__ import annotations

from advisor.memory.training import estimate_training
from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.memory.ledger import MemoryReport
from advisor.core.plan import Plan


def measure(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None, **_: object) -> MemoryReport:
    return estimate_training(model, plan, gpu)
