"""A log of why trials were pruned, one line each, in the order they finished."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from advisor.search.select import TrialRecord


class PruneLog(RichLog):
    def __init__(self, **kwargs):
        super().__init__(wrap=True, markup=False, highlight=False, **kwargs)
        self.logged: set[int] = set()

    def add(self, record: TrialRecord) -> None:
        if record.state != "pruned" or record.number in self.logged:
            return
        self.logged.add(record.number)
        line = Text.assemble((f"#{record.number} ", "bold yellow"), (f"{record.plan_short}", ""),
                             (f"  [{record.stage or 'plan'}] ", "dim"), record.reason or "pruned")
        self.write(line)
