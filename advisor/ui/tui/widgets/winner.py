"""The chosen plan and the selection's explanation (advisor.search.select.explain), built from the numbers."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from advisor.ui.tui.draw import LEGEND
from advisor.ui.tui.state import Board


class WinnerPanel(Static):
    DEFAULT_CSS = "WinnerPanel { height: auto; }"

    def update_from(self, board: Board, running: bool) -> None:
        sel = board.selection
        text = Text()
        if sel.best is None and not board.records:
            text.append("no trials yet", style="dim")
        for i, line in enumerate(sel.explanation):
            if i:
                text.append("\n")
            text.append(line, style="bold green" if line.startswith("Chosen") else "")
        if running and sel.best is not None:
            text.append("\n(provisional: the study is still running)", style="dim")
        text.append(f"\n\nIn the table, {LEGEND}.", style="dim")
        self.update(text)
