"""The estimate backend: the closed-form ledger, in microseconds."""

from __future__ import annotations

from advisor.analytic import estimate_training
from advisor.catalog import GpuSpec, ModelSpec
from advisor.ledger import MemoryReport
from advisor.plan import Plan


def measure(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None, **_: object) -> MemoryReport:
    return estimate_training(model, plan, gpu)
