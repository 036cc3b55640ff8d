"""Messages the controller's worker thread posts to the app (dataclasses, as toolong's messages.py).

``App.post_message`` is thread-safe: the worker posts these and never touches a widget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from advisor.search.select import TrialRecord


@dataclass
class TrialStarted(Message):
    """The tuner began trial ``number``."""

    number: int
    plan_short: str


@dataclass
class TrialFinished(Message):
    """A trial finished (complete or pruned), with everything the advisor knows of it."""

    record: TrialRecord


@dataclass
class RecordsLoaded(Message):
    """The whole study as stored now (a poll of a study run elsewhere, or the tuner's final state)."""

    records: list[TrialRecord] = field(default_factory=list)


@dataclass
class StudyDone(Message):
    """The tuner's loop ended: planned trials reached, stopped by the user, or an error."""

    finished: int
    stopped: bool = False
    error: str = ""
