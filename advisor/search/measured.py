"""Measured quality of a study's finalists: what was measured, stored with the study, and laid over its records.

The finalists' short training runs (advisor.search.finalists) end after the study's trials are finished, and
Optuna never lets a finished trial change. So the measurement is one study user attribute, ``ATTR``, and every
reader of a study's records (the tuner, `advisor report`, the TUI) passes them through ``apply_measured``:
a finalist's ``accuracy_loss`` becomes the measured one, ``accuracy_source`` "measured", and its ``note`` says
over how many tokens, against which trial and within what noise. The records keep nothing else of it: the
whole measurement (every run, its losses, the noise run) stays in the attribute. Pure data, no Optuna here.

**The measured accuracy loss** of finalist f, against the reference trial r:

    accuracy_loss(f) = max(0, accuracy_loss(r) + L(f) - L(r))

where L is the held-out loss after the same training tokens (advisor.search.finalists) and accuracy_loss(r)
the reference's own figure before the measurement (its prior, 0 for the usual bf16 LoRA recipe): the
measurement replaces the differences between plans, and keeps quality.yaml's zero point (docs/quality.md,
"The zero point"). The floor at 0 is quality.yaml's rule that no lever is credited for beating the reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable

ATTR = "measured_quality"
"""The Optuna study user attribute holding the QualityMeasurement (as ``to_dict``)."""
WHY_ATTR = "quality_not_measured"
"""The study user attribute saying why nothing was measured (`advisor tune` writes it; `advisor report` reads it)."""
METRIC = "held-out loss"
"""What L is: cross-entropy on documents of --data not trained on, after the run (see advisor.search.finalists)."""


@dataclass(frozen=True)
class FinalistRun:
    """One short training run of one finalist."""

    number: int
    """The trial the plan comes from."""
    plan_short: str
    status: str
    """The probe's status: ok, oom, timeout, crash or error."""
    message: str = ""
    """Why it did not end ok."""
    seed: int = 0
    """Seed of the run (adapter initialization, dropout); with the document order, what the noise run changes."""
    steps: int = 0
    """Optimizer steps run."""
    tokens: int = 0
    """Training tokens: steps x micro_batch x grad_accum x seq_len."""
    learning_rate: float | None = None
    """The constant rate it trained at (the rate an export of the plan trains with)."""
    held_out_loss: float | None = None
    """L: cross-entropy per token on the held-out documents after training (nats)."""
    held_out_loss_before: float | None = None
    """The same before training: the plan's base (quantized or not) on the held-out documents."""
    train_losses: tuple[float, ...] = ()
    """Training loss of each step."""
    wall_s: float = 0.0
    """Seconds of the whole run (child start to end)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.held_out_loss is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["train_losses"] = list(self.train_losses)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FinalistRun":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["train_losses"] = tuple(d.get("train_losses", ()))
        return cls(**d)


@dataclass(frozen=True)
class QualityMeasurement:
    """The finalists' runs, the reference they are measured against, the noise, and each one's accuracy loss."""

    tokens: int
    """Training tokens of every finalist's run (the target; each run's own count is in ``runs``)."""
    held_out_tokens: int
    """Tokens of held-out text L is computed over (at most the probe's max_eval_tokens)."""
    held_out_documents: int
    """Documents of --data held out (never trained on)."""
    train_documents: int
    """Documents of --data trained on, in file order (the noise run shuffles them)."""
    eval_window: int
    """Tokens per evaluation window, the same for every finalist."""
    reference: int | None
    """The trial the others are measured against (None when no run ended ok)."""
    reference_why: str
    """Why that one: "the usual recipe", or "the finalist with the lowest prior"."""
    reference_accuracy: float
    """The reference's own accuracy loss before the measurement (its prior): the anchor."""
    runs: tuple[FinalistRun, ...]
    """One run per finalist, the selection's answer first."""
    noise: float | None = None
    """|L(reference, seed 2) - L(reference)|: the run-to-run noise of a difference of two L (nats); None when
    the noise run was not done or failed."""
    noise_run: FinalistRun | None = None
    """The reference again with another seed and another document order."""
    priors: dict[int, float] = field(default_factory=dict)
    """Each finalist's accuracy loss before the measurement (what the study said: a prior, or a measured KL)."""
    weights: str = ""
    """The --weights directory every run started from."""
    data: str = ""
    """The --data file the documents come from."""
    device: str = ""
    """cpu or cuda."""
    key: dict[str, Any] = field(default_factory=dict)
    """What a later `advisor tune` compares to reuse this measurement (finalists, tokens, weights, data, seed)."""

    @property
    def ok_runs(self) -> list[FinalistRun]:
        return [r for r in self.runs if r.ok]

    def run_of(self, number: int) -> FinalistRun | None:
        return next((r for r in self.runs if r.number == number), None)

    def delta(self, number: int) -> float | None:
        """L(number) - L(reference), nats; None when either run failed."""
        run, ref = self.run_of(number), self.run_of(self.reference) if self.reference is not None else None
        if run is None or ref is None or not run.ok or not ref.ok:
            return None
        return run.held_out_loss - ref.held_out_loss

    def accuracy_loss(self, number: int) -> float | None:
        """The measured accuracy loss of a finalist (module docstring); None when it was not measured."""
        d = self.delta(number)
        return None if d is None else max(0.0, self.reference_accuracy + d)

    def measured(self) -> dict[int, float]:
        """Trial number -> measured accuracy loss, for every finalist whose run (and the reference's) ended ok."""
        out = {}
        for r in self.runs:
            a = self.accuracy_loss(r.number)
            if a is not None:
                out[r.number] = a
        return out

    def note(self, number: int) -> str:
        """The line a finalist's record carries: its L, the reference's, the noise, the tokens."""
        run = self.run_of(number)
        if run is None:
            return ""
        if not run.ok:
            return f"quality not measured: its run ended {run.status}: {run.message}"[:300]
        if number == self.reference:
            against = f"the reference ({self.reference_why})"
        else:
            d = self.delta(number)
            against = (f"{d:+.4f} vs #{self.reference}" if d is not None else f"#{self.reference}'s run failed")
        noise = f", noise ±{self.noise:.4f}" if self.noise is not None else ", noise not measured"
        return (f"quality measured over {run.tokens:,} tokens: {METRIC} {run.held_out_loss:.4f}, {against}{noise}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [r.to_dict() for r in self.runs]
        d["noise_run"] = self.noise_run.to_dict() if self.noise_run else None
        d["priors"] = {str(k): v for k, v in self.priors.items()}
        d["measured"] = {str(k): v for k, v in self.measured().items()}
        d["source"] = "measured"
        d["metric"] = METRIC
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QualityMeasurement":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["runs"] = tuple(FinalistRun.from_dict(r) for r in d.get("runs", ()))
        d["noise_run"] = FinalistRun.from_dict(d["noise_run"]) if d.get("noise_run") else None
        d["priors"] = {int(k): float(v) for k, v in (d.get("priors") or {}).items()}
        return cls(**d)


def stored_measurement(study_attrs: dict[str, Any]) -> QualityMeasurement | None:
    """The study's measurement (its user attributes), or None (not measured, or unreadable)."""
    raw = (study_attrs or {}).get(ATTR)
    if not isinstance(raw, dict):
        return None
    try:
        return QualityMeasurement.from_dict(raw)
    except (TypeError, KeyError, ValueError, AttributeError):
        return None  # written by another version: the records keep their priors


SIMULATED_ATTR = "simulated_finalists"
"""Study attribute: trial number -> the memory fields of its simulation, for a trial whose memory the closed form
only approximated (advisor.search.tuner.Tuner.simulate_finalists), and why it does not fit ("reason", "" if it
does)."""


def apply_simulated(records: Iterable[Any], study_attrs: dict[str, Any] | None) -> list[Any]:
    """``records`` with the finalists' simulated memory laid over their approximation (or over an estimate-backend
    answer at the edge of the budget): the simulation's peak, ledger and source, and pruned with its reason where
    it does not fit."""
    sims = (study_attrs or {}).get(SIMULATED_ATTR) or {}
    out = []
    for r in records:
        number = r.duplicate_of if r.duplicate_of is not None else r.number
        fields = sims.get(str(number)) if isinstance(sims, dict) else None
        if fields and (getattr(r, "approximate", False) or getattr(r, "source", "") == "estimated"):
            known = {k: v for k, v in fields.items() if k in r.__dataclass_fields__ and k != "reason"}
            reason = fields.get("reason") or ""
            r = replace(r, **known, approximate=False, stage="simulate", state="pruned" if reason else r.state,
                        reason=reason or r.reason,
                        note="simulated as a finalist" if not reason else "")
        out.append(r)
    return out


def apply_measured(records: Iterable[Any], study_attrs: dict[str, Any] | None) -> list[Any]:
    """``records`` (TrialRecords) with the study's measured quality laid over the finalists' (module docstring),
    and the finalists' simulated memory over the approximated ones' (``apply_simulated``)."""
    records = apply_simulated(records, study_attrs)
    m = stored_measurement(study_attrs or {})
    if m is None:
        return records
    measured = m.measured()
    out = []
    for r in records:
        number = r.duplicate_of if r.duplicate_of is not None else r.number
        note = m.note(number) if m.run_of(number) is not None else ""
        if number in measured:
            r = replace(r, accuracy_loss=measured[number], accuracy_source="measured",
                        note="; ".join(x for x in (r.note, note) if x))
        elif note:
            r = replace(r, note="; ".join(x for x in (r.note, note) if x))
        out.append(r)
    return out


def measured_lines(m: QualityMeasurement, best: Any | None) -> list[str]:
    """The explanation's lines on quality when it was measured: the answer's figure, then every finalist's."""
    lines = []
    ref = m.run_of(m.reference) if m.reference is not None else None
    if best is not None:
        number = best.duplicate_of if best.duplicate_of is not None else best.number
        a = m.accuracy_loss(number)
        prior = m.priors.get(number)
        prior_text = f"; prior {prior:.3f}" if prior is not None else ""
        if a is not None:
            run = m.run_of(number)
            lines.append(f"Quality of #{best.number}: accuracy loss {a:.3f} measured over {run.tokens:,} tokens "
                         f"({METRIC} on {m.held_out_tokens:,} tokens of --data not trained on{prior_text}).")
        else:
            run = m.run_of(number)
            why = f"its quality run ended {run.status}" if run is not None else "not a finalist"
            lines.append(f"Quality of #{best.number}: accuracy loss {best.accuracy_loss or 0.0:.3f} (prior, not "
                         f"measured: {why}).")
    if ref is None or not ref.ok:
        failed = ", ".join(f"#{r.number} {r.status}" for r in m.runs if not r.ok)
        lines.append(f"Quality measurement failed ({failed}): the finalists keep their priors.")
        return lines
    parts = []
    for r in m.runs:
        if not r.ok:
            parts.append(f"#{r.number} {r.status}")
        elif r.number == m.reference:
            parts.append(f"#{r.number} {r.held_out_loss:.4f} (reference: {m.reference_why})")
        else:
            parts.append(f"#{r.number} {r.held_out_loss:.4f} ({m.delta(r.number):+.4f})")
    noise = (f"noise ±{m.noise:.4f} (#{m.reference} again with seed {m.noise_run.seed} and another document order)"
             if m.noise is not None and m.noise_run is not None else "noise not measured")
    lines.append(f"Finalists after {m.tokens:,} training tokens each from --weights, {METRIC}: " + ", ".join(parts)
                 + f"; {noise}. Accuracy loss = the difference from #{m.reference} + its own "
                 f"{m.reference_accuracy:.3f}, at least 0.")
    return lines


def prior_line(why_not: str) -> str:
    """The explanation's line on quality when nothing was measured."""
    return f"Quality: priors, not measured: {why_not}." if why_not else "Quality: priors, not measured."


def with_quality_lines(selection: Any, measurement: QualityMeasurement | None, why_not: str = "") -> Any:
    """The selection (advisor.search.select.Selection) with its explanation saying where the answer's quality
    comes from, after the "Chosen" line: measured over N tokens (``measured_lines``), or priors and why
    (``prior_line``). `advisor tune` and `advisor report` show the same lines."""
    lines = measured_lines(measurement, selection.best) if measurement is not None else [prior_line(why_not)]
    head = selection.explanation[:1]
    return replace(selection, explanation=[*head, *lines, *selection.explanation[1:]])


def study_quality_lines(selection: Any, study_attrs: dict[str, Any] | None) -> Any:
    """``with_quality_lines`` from what a study stored (its measurement, or why there is none)."""
    attrs = study_attrs or {}
    return with_quality_lines(selection, stored_measurement(attrs), str(attrs.get(WHY_ATTR) or ""))


__all__ = ["ATTR", "METRIC", "WHY_ATTR", "FinalistRun", "QualityMeasurement", "apply_measured", "measured_lines",
           "prior_line", "stored_measurement", "study_quality_lines", "with_quality_lines"]
