"""Integrations with training frameworks.

``MemoryGuardCallback`` is a transformers ``TrainerCallback``: during the first steps of a real run
it measures the peak, adds what the advisor's ledger says the longest batch still to come needs
beyond the batches seen so far (projected = measured + predicted(longest) - predicted(seen): the
measurement carries what the ledger cannot see, the ledger carries how memory grows with the
sequence), and stops the run early, with a clear message, when that batch will not fit the budget.

    from advisor.integrations import MemoryGuardCallback
    trainer.add_callback(MemoryGuardCallback(spec, plan, budget_bytes=24 * 2**30, longest_seq_len=4096))
"""

from __future__ import annotations

from typing import Callable

from transformers import TrainerCallback

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan
from advisor.core.fit import HEADROOM, fits
from advisor.core.units import format_bytes


def cuda_peak_reader() -> Callable[[], int] | None:
    """Peak bytes allocated by torch on the current CUDA device, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return lambda: int(torch.cuda.max_memory_allocated())


class MemoryGuardCallback(TrainerCallback):
    """Stop a run early when the longest batch still to come will not fit."""

    def __init__(self, spec: ModelSpec, plan: Plan, budget_bytes: int, *, longest_seq_len: int | None = None,
                 first_seq_len: int | None = None, check_steps: int = 2, headroom: float = HEADROOM,
                 memory_reader: Callable[[], int] | None = None, backend: str = "estimate"):
        self.spec, self.plan = spec, plan
        self.budget = int(budget_bytes)
        self.first_seq_len = first_seq_len or plan.seq_len
        self.longest_seq_len = longest_seq_len or self.first_seq_len
        self.check_steps = check_steps
        self.headroom = headroom
        self.reader = memory_reader if memory_reader is not None else cuda_peak_reader()
        self.backend = backend
        self.message: str | None = None
        self.projected_peak: int | None = None
        self.measured_peak: int | None = None

    def _predict(self, seq_len: int) -> int:
        from advisor.runtime.backends import get_backend

        return get_backend(self.backend).measure(self.spec, self.plan.with_(seq_len=seq_len), None).tensor_peak_bytes

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > self.check_steps or self.message is not None:
            return control
        predicted_now = self._predict(self.first_seq_len)
        predicted_longest = self._predict(self.longest_seq_len)
        if self.reader is not None:
            self.measured_peak = int(self.reader())
            self.projected_peak = self.measured_peak + predicted_longest - predicted_now
        else:
            self.projected_peak = predicted_longest
        # the feasibility rule every part of the advisor uses (advisor.core.fit)
        if state.global_step >= self.check_steps and not fits(self.projected_peak, self.budget, self.headroom):
            measured = (f"measured {format_bytes(self.measured_peak)} at seq {self.first_seq_len:,} "
                        f"(predicted {format_bytes(predicted_now)}); " if self.measured_peak is not None else "")
            self.message = (f"advisor: stopping early: {measured}the longest batch (seq {self.longest_seq_len:,}) "
                            f"will need about {format_bytes(self.projected_peak)}, over the budget "
                            f"{format_bytes(self.budget)} less {self.headroom:.0%} headroom. Lower the micro-batch, "
                            f"cap the sequence length, or turn on gradient checkpointing.")
            print(self.message)
            control.should_training_stop = True
        return control
