"""The memory ledger of one trial as horizontal bars against the budget line."""

from __future__ import annotations

from rich.console import Group
from textual.widget import Widget

from advisor.search.select import TrialRecord
from advisor.ui.tui.draw import ledger_lines
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
        return ledger_lines(self.record, i.budget.bytes, i.headroom, i.fmt, width)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.lines(width))

    def render(self):
        return Group(*self.lines(self.content_size.width or 78))
