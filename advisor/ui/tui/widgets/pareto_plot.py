"""Peak memory against throughput for the complete trials, the Pareto front and the chosen plan marked."""

from __future__ import annotations

from rich.console import Group
from textual.widget import Widget

from advisor.ui.tui.draw import pareto_lines
from advisor.ui.tui.state import Board


class ParetoPlot(Widget):
    DEFAULT_CSS = "ParetoPlot { height: 1fr; min-height: 6; }"

    def __init__(self, board: Board, **kwargs):
        super().__init__(**kwargs)
        self.board = board

    def render(self):
        b = self.board
        sel = b.selection
        size = self.content_size
        return Group(*pareto_lines(b.ordered(), sel.pareto, sel.best, b.info.budget.bytes, b.info.headroom,
                                   b.info.fmt, size.width or 78, size.height or 10))
