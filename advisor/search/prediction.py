"""A plan predicted as a trial's estimate stage predicts it, without a study: the closed form's run peak of one
GPU of the target run (sharded when it has several) and the step-time model's tokens/s.

The report and the TUI draw the explanation's per-change gains with ``predict_change`` (advisor.search.select
``measure_change``); the tuner shards its trials' ledgers with ``shard_to``. Neither needs the tuner.
"""

from __future__ import annotations

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory.closed_form import closed_form_describes
from advisor.memory.phases import run_peak_bytes
from advisor.runtime.backends import get_backend
from advisor.speed.throughput import predict_throughput


def shard_to(report, model: ModelSpec, plan: Plan, gpus: int, sharding: str, gpu: GpuSpec):
    """The ledger of one of ``gpus`` GPUs splitting model state as ``sharding`` says (advisor.memory.sharding);
    ``report`` itself on one GPU."""
    if gpus == 1:
        return report
    from advisor.memory.sharding import shard_report

    return shard_report(report, model, plan, gpus, sharding, gpu)


def predict_change(model: ModelSpec, gpu: GpuSpec, gpus: int, sharding: str, plan: Plan,
                   data=None) -> tuple[float | None, int | None]:
    """A variant of the usual recipe (one change applied), predicted as a trial is: the step-time model's
    tokens/s and the estimated run peak of one GPU (for the explanation's per-change gains). The peak comes
    from the closed form only: a variant it cannot describe gets none (a simulation per change would cost
    seconds each time the TUI or the report redraws the explanation)."""
    from advisor.runtime.phases import with_phases

    peak = None
    try:
        if closed_form_describes(model, plan)[0]:
            rep = get_backend("estimate").measure(model, plan, gpu)
            peak = run_peak_bytes(with_phases(model, plan, gpu, shard_to(rep, model, plan, gpus, sharding, gpu)))
        tps = predict_throughput(model, plan, gpu, gpus, sharding, data=data)
    except AdvisorInputError:
        return None, None
    return tps.tokens_per_s * 1.0, peak
