"""Integrations with training frameworks.

``MemoryGuardCallback`` is a transformers ``TrainerCallback`` that decides on the whole run's peak,
not one step's:

- during the first steps it measures the peak, adds what the advisor says the run still needs beyond
  the batches seen so far (projected = measured + predicted run peak at the longest batch -
  predicted step at the batches seen: the measurement carries what the prediction cannot see, the
  prediction carries how memory grows with the sequence and which phase is highest), and stops the run
  early, with a clear message, when the run will not fit the budget;
- before every evaluation it projects the evaluation's peak (what is allocated now + the no-grad
  forward at the eval batch + the logits transformers' Trainer accumulates on the GPU unless
  ``prediction_loss_only`` or ``eval_accumulation_steps``) and stops before an evaluation that will
  not fit; during evaluation it records the measured peak.

    from advisor.integrations import MemoryGuardCallback
    trainer.add_callback(MemoryGuardCallback(spec, plan, budget_bytes=24 * 2**30, longest_seq_len=4096))
"""

from __future__ import annotations

from typing import Callable

from transformers import TrainerCallback

from advisor.core.catalog import ModelSpec
from advisor.core.fit import HEADROOM, fits, usable_bytes
from advisor.core.plan import DTYPE_BYTES, Plan
from advisor.core.units import format_bytes

ALWAYS = ("load", "train", "save")


def cuda_peak_reader() -> Callable[[], int] | None:
    """Peak bytes allocated by torch on the current CUDA device, or None without CUDA (torch.cuda, or the
    CUDA test double in its place: advisor.runtime.cuda_boundary)."""
    from advisor.runtime.cuda_boundary import cuda as cuda_api

    cuda = cuda_api()
    if not cuda.is_available():
        return None
    return lambda: int(cuda.max_memory_allocated())


def cuda_current_reader() -> Callable[[], int] | None:
    """Bytes allocated by torch on the current CUDA device now, or None without CUDA."""
    from advisor.runtime.cuda_boundary import cuda as cuda_api

    cuda = cuda_api()
    if not cuda.is_available():
        return None
    return lambda: int(cuda.memory_allocated())


class MemoryGuardCallback(TrainerCallback):
    """Stop a run early when the rest of the run (its longest batch, its evaluation) will not fit."""

    def __init__(self, spec: ModelSpec, plan: Plan, budget_bytes: int, *, longest_seq_len: int | None = None,
                 first_seq_len: int | None = None, check_steps: int = 2, headroom: float = HEADROOM,
                 memory_reader: Callable[[], int] | None = None, current_reader: Callable[[], int] | None = None,
                 backend: str = "estimate", eval_seq_len: int | None = None, eval_samples: int | None = None):
        self.spec, self.plan = spec, plan
        self.budget = int(budget_bytes)
        self.first_seq_len = first_seq_len or plan.seq_len
        self.longest_seq_len = longest_seq_len or self.first_seq_len
        self.eval_seq_len = eval_seq_len or self.longest_seq_len
        self.eval_samples = eval_samples
        self.check_steps = check_steps
        self.headroom = headroom
        self.reader = memory_reader if memory_reader is not None else cuda_peak_reader()
        self.current = current_reader if current_reader is not None else cuda_current_reader()
        self.backend = backend
        self.message: str | None = None
        self.projected_peak: int | None = None
        self.projected_phase: str | None = None
        self.measured_peak: int | None = None
        self.projected_eval_peak: int | None = None
        self.measured_eval_peak: int | None = None
        self.evaluations = 0
        self._cache: dict = {}

    # ------------------------------------------------------------------ predictions

    def _report(self, plan: Plan):
        key = plan
        if key not in self._cache:
            from advisor.runtime.backends import get_backend
            from advisor.runtime.phases import with_phases

            self._cache[key] = with_phases(self.spec, plan, None, get_backend(self.backend).measure(self.spec, plan))
        return self._cache[key]

    def _phases_of_run(self, args) -> tuple[str, ...]:
        watched = ALWAYS
        if str(getattr(args, "eval_strategy", "no")) not in ("no", "IntervalStrategy.NO"):
            watched += ("eval",)
        if getattr(self.plan, "max_new_tokens", 0):
            watched += ("generate",)
        return watched

    def _eval_plan(self, args) -> Plan:
        return self.plan.with_(seq_len=self.eval_seq_len, eval_batch=int(args.per_device_eval_batch_size))

    def _limit(self) -> float:
        """What the run may use: the budget less the headroom (advisor.core.fit, the rule every part uses)."""
        return usable_bytes(self.budget, self.headroom)

    def _stop(self, control, message: str):
        self.message = message
        print(message)
        control.should_training_stop = True
        control.should_evaluate = False
        return control

    # ------------------------------------------------------------------ the first steps: the run's peak

    def on_step_end(self, args, state, control, **kwargs):
        if self.message is not None:
            return control
        if state.global_step <= self.check_steps:
            self._check_run(args, state, control)
        if self.message is None and control.should_evaluate:
            self._check_eval(args, control, kwargs.get("eval_dataloader"))
        return control

    def _check_run(self, args, state, control) -> None:
        now = self._report(self.plan.with_(seq_len=self.first_seq_len))
        longest = self._report(self.plan.with_(seq_len=self.longest_seq_len,
                                               eval_batch=int(args.per_device_eval_batch_size)))
        phases = longest.run_phases.phases
        watched = self._phases_of_run(args)
        name = max(watched, key=lambda n: phases[n].live_bytes)
        predicted_run = int(phases[name].live_bytes)
        predicted_now = int(now.tensor_peak_bytes)
        if self.reader is not None:
            self.measured_peak = int(self.reader())
            self.projected_peak = self.measured_peak + predicted_run - predicted_now
        else:
            self.projected_peak = predicted_run
        self.projected_phase = name
        # the feasibility rule every part of the advisor uses (advisor.core.fit)
        if state.global_step >= self.check_steps and not fits(self.projected_peak, self.budget, self.headroom):
            measured = (f"measured {format_bytes(self.measured_peak)} at seq {self.first_seq_len:,} "
                        f"(predicted {format_bytes(predicted_now)}); " if self.measured_peak is not None else "")
            where = (f"the longest batch (seq {self.longest_seq_len:,})" if name == "train"
                     else f"the run's {name} phase (longest batch seq {self.longest_seq_len:,})")
            self._stop(control, f"advisor: stopping early: {measured}{where} will need about "
                                f"{format_bytes(self.projected_peak)}, over the budget {format_bytes(self.budget)} "
                                f"less {self.headroom:.0%} headroom. Lower the micro-batch, cap the sequence length, "
                                "or turn on gradient checkpointing.")

    # ------------------------------------------------------------------ evaluation

    def accumulated_logits_bytes(self, args, eval_dataloader) -> int:
        """Logits transformers' Trainer keeps on the device across an evaluation: every batch's
        (batch x seq x vocab) logits, concatenated as they come (trainer.py ``evaluation_loop``:
        ``all_preds.add(logits)``; moved to the host only every ``eval_accumulation_steps``), and the
        last concatenation holds the old and the new whole (trainer_pt_utils ``nested_concat``: torch.cat)."""
        if getattr(args, "prediction_loss_only", False):
            return 0
        samples = self.eval_samples
        if eval_dataloader is not None:
            try:
                samples = len(eval_dataloader.dataset)
            except TypeError:
                pass
        if not samples:
            return 0
        if args.eval_accumulation_steps:
            samples = min(samples, args.eval_accumulation_steps * args.per_device_eval_batch_size)
        per_sample = self.eval_seq_len * self.spec.vocab_size * DTYPE_BYTES[self.plan.activation_dtype]
        return 2 * samples * per_sample

    def _check_eval(self, args, control, eval_dataloader) -> None:
        report = self._report(self._eval_plan(args))
        from advisor.memory.phases import resident_bytes

        forward = int(report.run_phases.phases["eval"].live_bytes) - resident_bytes(report)
        held = self.accumulated_logits_bytes(args, eval_dataloader)
        base = int(self.current()) if self.current is not None else resident_bytes(report)
        self.projected_eval_peak = base + forward + held
        if not fits(self.projected_eval_peak, self.budget, self.headroom):
            kept = (f" including {format_bytes(held)} of eval logits the Trainer keeps on the GPU "
                    "(set prediction_loss_only=True or eval_accumulation_steps)" if held else "")
            self._stop(control, f"advisor: stopping before evaluation: it will need about "
                                f"{format_bytes(self.projected_eval_peak)} (eval batch "
                                f"{args.per_device_eval_batch_size}, seq {self.eval_seq_len:,}){kept}, over the budget "
                                f"{format_bytes(self.budget)} less {self.headroom:.0%} headroom. Lower "
                                "per_device_eval_batch_size or the eval sequence length.")

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.reader is not None:
            self.measured_eval_peak = max(self.measured_eval_peak or 0, int(self.reader()))
        return control

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations += 1
        return control
