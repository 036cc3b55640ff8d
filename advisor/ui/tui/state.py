"""What the app shows, as plain data: the study's description and its trials, sorted and filtered.

No Textual here: the widgets render a ``Board`` and the tests can check it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable

from advisor.core.fit import fit_verdict
from advisor.core.units import Budget
from advisor.search.description import StudyDescription
from advisor.search.select import Selection, TrialRecord, is_polish, run_peak, select
from advisor.search.prediction import predict_change

# (key, label shown in the status line); `s` cycles through them
SORTS = (
    ("number", "#"),
    ("tokens", "tok/s ↓"),
    ("peak", "peak ↑"),
    ("accuracy", "acc.loss ↑"),
)
FINISHED = ("complete", "pruned")


@dataclass(frozen=True)
class StudyInfo:
    """The study as its typed description tells it (advisor.search.description: the one reader of the
    stored ``study.user_attrs["advisor"]``, older studies included)."""

    study_name: str
    description: StudyDescription

    @classmethod
    def from_description(cls, study_name: str, d: StudyDescription | dict[str, Any]) -> "StudyInfo":
        """From the description, or from its stored JSON."""
        return cls(study_name, d if isinstance(d, StudyDescription) else StudyDescription.from_dict(d))

    @property
    def model_name(self) -> str:
        return self.description.model.name

    @property
    def gpu_name(self) -> str:
        return self.description.gpu.name

    @property
    def budget(self) -> Budget:
        return self.description.budget

    @property
    def headroom(self) -> float:
        return self.description.headroom

    @property
    def tolerance(self) -> float:
        return self.description.tolerance

    @property
    def backend(self) -> str:
        return self.description.backend

    @property
    def trials(self) -> int:
        """Finished trials the study is planned to reach."""
        return self.description.trials

    def fmt(self, n_bytes: float) -> str:
        return self.budget.format(n_bytes)


class Board:
    """The trials of one study, keyed by number, with the selection kept up to date."""

    def __init__(self, info: StudyInfo, records: Iterable[TrialRecord] = ()):
        self.info = info
        self.records: dict[int, TrialRecord] = {}
        self._selection: Selection | None = None
        self.replace(records)

    # -- updates -------------------------------------------------------------

    def replace(self, records: Iterable[TrialRecord]) -> None:
        self.records = {r.number: r for r in records}
        self._selection = None

    def started(self, number: int, plan_short: str) -> None:
        self.records[number] = TrialRecord(number=number, state="running", plan={}, plan_short=plan_short)
        self._selection = None

    def finished(self, record: TrialRecord) -> None:
        self.records[record.number] = record
        self._selection = None

    def signature(self) -> tuple:
        """Changes whenever something shown changes (to skip redraws on idle polls)."""
        return tuple((r.number, r.state, r.plan_short) for r in self.ordered())

    # -- reading -------------------------------------------------------------

    def ordered(self) -> list[TrialRecord]:
        return [self.records[n] for n in sorted(self.records)]

    @property
    def selection(self) -> Selection:
        if self._selection is None:
            i = self.info
            d = i.description
            self._selection = select(self.ordered(), i.budget.bytes, i.headroom, i.tolerance, i.budget.unit, d.rules,
                                     measure_change=partial(predict_change, d.model, d.gpu, d.gpus, d.sharding))
        return self._selection

    @property
    def best(self) -> TrialRecord | None:
        return self.selection.best

    def finished_count(self) -> int:
        """Finished trials that evaluated a plan of their own, as the tuner counts them toward --trials (a
        repeat proposal, answered from the first, is shown but cost nothing)."""
        return sum(1 for r in self.records.values() if r.state in FINISHED and r.duplicate_of is None)

    def finished_split(self) -> tuple[int, int]:
        """(planned, polish): the finished trials of their own, the planned --trials apart from the ones the
        polish added after them."""
        return finished_split(self.records.values())

    def pruned(self) -> list[TrialRecord]:
        return [r for r in self.ordered() if r.state == "pruned"]

    def tally(self) -> str:
        """The header's count: "40/40 trials (12 pruned) + 1 polish, 5 repeats skipped", each trial counted once
        (a repeated proposal and the polish's trials are not among the planned ones, nor among their pruned)."""
        planned, polish = self.finished_split()
        own = [r for r in self.records.values() if r.state in FINISHED and r.duplicate_of is None and not is_polish(r)]
        pruned = sum(1 for r in own if r.state == "pruned")
        repeats = sum(1 for r in self.records.values() if r.state in FINISHED and r.duplicate_of is not None)
        return (f"{planned}/{self.info.trials or '?'} trials ({pruned} pruned)"
                + (f" + {polish} polish" if polish else "") + (f", {repeats} repeats skipped" if repeats else ""))

    def fit(self, record: TrialRecord) -> str:
        """ok (peak + headroom fits), tight (fits, not the headroom), over, or "" (no peak): the one rule
        (advisor.core.fit) on the peak the selection decides on (the run's, advisor.search.select.run_peak)."""
        peak = run_peak(record)
        if peak is None:
            return ""
        verdict = fit_verdict(peak, self.info.budget.bytes, self.info.headroom)
        return "ok" if verdict == "fits" else verdict

    def view(self, sort: str = "number", query: str = "") -> list[TrialRecord]:
        """The trials to list: those matching every word of ``query``, in ``sort`` order."""
        rows = [r for r in self.ordered() if matches(r, query)]
        if sort == "tokens":
            rows.sort(key=lambda r: (r.tokens_per_s is None, -(r.tokens_per_s or 0), r.number))
        elif sort == "peak":
            rows.sort(key=lambda r: (run_peak(r) is None, run_peak(r) or 0, r.number))
        elif sort == "accuracy":
            rows.sort(key=lambda r: (r.accuracy_loss is None or r.state != "complete", r.accuracy_loss or 0, r.number))
        elif sort != "number":
            raise ValueError(f"sort must be one of {[k for k, _ in SORTS]}, but got {sort!r}")
        return rows


def haystack(r: TrialRecord) -> str:
    return " ".join((f"#{r.number}", r.state, r.plan_short, r.stage, r.source, r.reason, r.ladder)).lower()


def matches(r: TrialRecord, query: str) -> bool:
    """Every whitespace-separated word of ``query`` occurs in the trial's number, state, plan, stage or reason."""
    text = haystack(r)
    return all(word in text for word in query.lower().split())


def next_sort(current: str) -> str:
    keys = [k for k, _ in SORTS]
    return keys[(keys.index(current) + 1) % len(keys)]


def sort_label(key: str) -> str:
    return dict(SORTS)[key]


def finished_split(records: Iterable[TrialRecord]) -> tuple[int, int]:
    """(planned, polish) among finished trials that evaluated a plan of their own (a repeat proposal cost
    nothing): what "40/40 trials + 1 polish" says, never "41/40"."""
    own = [r for r in records if r.state in FINISHED and r.duplicate_of is None]
    polish = sum(1 for r in own if is_polish(r))
    return len(own) - polish, polish
