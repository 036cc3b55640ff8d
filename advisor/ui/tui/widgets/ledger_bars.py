"""The memory ledger of one trial as horizontal bars against the budget line."""

from __future__ import annotations

from rich.console import Group
from textual.widget import Widget

from advisor.search.select import TrialRecord
from advisor.ui.phase_view import picture_of_record
from advisor.ui.tui.draw import ledger_lines, phase_lines
from advisor.ui.tui.state import StudyInfo


class LedgerBars(Widget):
    DEFAULT_CSS = "LedgerBars { height: auto; }"

    def __init__(self, info: StudyInfo, record: TrialRecord | None = None, **kwargs):
        super().__init__(**kwargs)
        self.info = info
        self.record = record

    def set_record(self, record: TrialRecord | None) -> None:
        self.record = record
        self.refresh(layout=True)

    def lines(self, width: int):
        if self.record is None:
            from rich.text import Text

            return [Text("no trial selected", style="dim")]
        i = self.info
        lines = ledger_lines(self.record, i.budget.bytes, i.headroom, i.fmt, width)
        picture = self._picture()
        return lines + phase_lines(picture, i.budget.bytes, i.fmt, width) if picture is not None else lines

    def _picture(self):
        """The GRPO/DPO phase picture of the selected trial, computed once per trial (advisor.ui.phase_view)."""
        key = (self.record.number, id(self.record))
        if getattr(self, "_picture_key", None) != key:
            self._picture_key, self._picture_value = key, picture_of_record(self.record, self.info.description)
        return self._picture_value

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.lines(width))

    def render(self):
        return Group(*self.lines(self.content_size.width or 78))
