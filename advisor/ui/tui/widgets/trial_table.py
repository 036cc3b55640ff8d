"""The live trial table: one row per trial, the chosen one starred, each number marked with its source."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from advisor.search.select import TrialRecord
from advisor.ui.tui.draw import FIT_STYLE, mark
from advisor.ui.tui.state import Board

STATE_GLYPH = {"complete": ("✓", "green"), "pruned": ("✗", "yellow"), "running": ("▶", "cyan"),
               "failed": ("!", "red"), "waiting": ("…", "dim")}
FIXED_W = 4 + 1 + 11 + 8 + 8  # #, state, peak, tok/s, acc. loss
PADDING = 2 * 6


class TrialTable(DataTable):
    """Rows keyed by trial number; the cursor stays on the same trial when rows arrive or resort."""

    DEFAULT_CSS = "TrialTable { height: 1fr; }"
    BINDINGS = [Binding("enter", "select_cursor", "Details")]

    def __init__(self, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._shown: tuple = ()
        self._last: tuple | None = None

    def on_resize(self) -> None:
        """The plan column takes the width left by the others: redraw at the new width."""
        if self._last is not None:
            self.show(*self._last)

    def highlighted_number(self) -> int | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:  # noqa: BLE001 - an empty or shrinking table has no cursor row
            return None
        return int(key.value) if key.value is not None else None

    def show(self, board: Board, rows: list[TrialRecord], keep: int | None = None) -> None:
        """Redraw with ``rows``; the cursor goes back to trial ``keep`` (or the highlighted one)."""
        keep = self.highlighted_number() if keep is None else keep
        self._last = (board, rows)
        best = board.best
        plan_w = max(16, self.size.width - FIXED_W - PADDING - 2) if self.size.width else 40
        budget = board.info.budget.text or board.info.fmt(board.info.budget.bytes)
        shown = (tuple((r.number, r.state, r.plan_short, r.peak_bytes, r.tokens_per_s) for r in rows),
                 best.number if best else None, plan_w)
        if shown == self._shown:
            return
        self._shown = shown
        self.clear(columns=True)
        # fixed widths: auto-sized columns drift when rows are replaced in one go
        self.add_column("#", key="number", width=4)
        self.add_column(" ", key="state", width=1)
        self.add_column("plan", key="plan", width=plan_w)
        self.add_column(f"peak ≤{budget}", key="peak", width=max(11, len(budget) + 6))
        self.add_column("tok/s", key="tps", width=8)
        self.add_column("acc.loss", key="acc", width=8)
        for r in rows:
            winner = best is not None and r.number == best.number
            glyph, gstyle = STATE_GLYPH.get(r.state, ("?", ""))
            num = Text(f"★{r.number}" if winner else str(r.number), style="bold green" if winner else "")
            plan = r.plan_short or ("(queued)" if r.state == "waiting" else f"({r.state})")
            plan = plan if len(plan) <= plan_w else plan[: plan_w - 1] + "…"
            peak = Text()
            if r.peak_bytes is not None:
                peak.append(board.info.fmt(r.peak_bytes), style=FIT_STYLE[board.fit(r)])
                peak.append(f" {mark(r.source)}", style="dim")
            tps = Text()
            if r.tokens_per_s:
                tps.append(f"{r.tokens_per_s:,.0f}")
                tps.append(f" {mark(r.tokens_per_s_source)}", style="dim")
            acc = Text()
            if r.accuracy_loss is not None and r.state == "complete":
                over = r.accuracy_loss > board.info.tolerance
                acc.append(f"{r.accuracy_loss:.3f}", style="red" if over else "")
                acc.append(f" {mark(r.accuracy_source)}", style="dim")
            self.add_row(num, Text(glyph, style=gstyle), Text(plan, style="bold green" if winner else ""),
                         peak, tps, acc, key=str(r.number))
        if keep is not None:
            for i, r in enumerate(rows):
                if r.number == keep:
                    self.move_cursor(row=i, animate=False)
                    break
