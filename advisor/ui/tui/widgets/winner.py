"""The chosen plan and the selection's explanation (advisor.search.select.explain), built from the numbers."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from advisor.core.fit import host_usable_bytes
from advisor.search.select import run_peak
from advisor.ui.render import host_peak_text
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
        if sel.best is not None and (sel.best.host_peak_bytes or sel.best.host_bytes):
            hb = board.info.description.host_budget
            fmt = board.info.fmt
            text.append(f"\nGPU peak {fmt(run_peak(sel.best))} · host peak {host_peak_text(sel.best, fmt)}"
                        + (f" of {fmt(host_usable_bytes(hb.bytes))} usable of {hb.text}" if hb is not None else ""))
        if running and sel.best is not None:
            text.append("\n(provisional: the study is still running)", style="dim")
        text.append(f"\n\nIn the table, {LEGEND}.", style="dim")
        self.update(text)
