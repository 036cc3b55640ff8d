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
PADDING = 2 * 6


def _distinct_plans(plans: list[str], width: int) -> tuple[list[str], str]:
    """Each plan's words within ``width``: when one is longer, the words every plan holds go to the column's header
    (returned) and each row keeps the words that tell it apart, so two rows are never cut to look the same."""
    if all(len(p) <= width for p in plans) or len(plans) < 2:
        return plans, ""
    shared = set.intersection(*(set(p.split()) for p in plans))
    common = " ".join(w for w in plans[0].split() if w in shared)
    return [" ".join(w for w in p.split() if w not in shared) or "(as every row)" for p in plans], common


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

    @staticmethod
    def _cells(board: Board, r: TrialRecord) -> tuple[Text, Text, Text]:
        """The row's number cells: its peak, tokens/s and accuracy loss, each with its source mark."""
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
        return peak, tps, acc

    def show(self, board: Board, rows: list[TrialRecord], keep: int | None = None) -> None:
        """Redraw with ``rows``; the cursor goes back to trial ``keep`` (or the highlighted one)."""
        keep = self.highlighted_number() if keep is None else keep
        self._last = (board, rows)
        best = board.best
        # everything the columns' widths and the cells are made from: nothing to redraw when it is unchanged
        shown = (tuple((r.number, r.state, r.plan_short, r.peak_bytes, r.tokens_per_s) for r in rows),
                 best.number if best else None, self.size.width)
        if shown == self._shown:
            return
        self._shown = shown
        budget = board.info.budget.text or board.info.fmt(board.info.budget.bytes)
        cells = [self._cells(board, r) for r in rows]
        # each number column as wide as its widest cell (a three-digit peak keeps its source mark)
        widths = [max([len(title), *(len(c[i]) for c in cells)]) for i, title in
                  enumerate((f"peak ≤{budget}", "tok/s", "acc.loss"))]
        plan_w = max(16, self.size.width - 4 - 1 - sum(widths) - PADDING - 2) if self.size.width else 40
        plans = [r.plan_short or ("(queued)" if r.state == "waiting" else f"({r.state})") for r in rows]
        plans, common = _distinct_plans(plans, plan_w)
        self.clear(columns=True)
        # fixed widths: auto-sized columns drift when rows are replaced in one go
        self.add_column("#", key="number", width=4)
        self.add_column(" ", key="state", width=1)
        title = f"plan (each: {common})" if common else "plan"
        self.add_column(title if len(title) <= plan_w else title[: plan_w - 2] + "…)", key="plan", width=plan_w)
        self.add_column(f"peak ≤{budget}", key="peak", width=widths[0])
        self.add_column("tok/s", key="tps", width=widths[1])
        self.add_column("acc.loss", key="acc", width=widths[2])
        for r, plan, (peak, tps, acc) in zip(rows, plans, cells):
            winner = best is not None and r.number == best.number
            glyph, gstyle = STATE_GLYPH.get(r.state, ("?", ""))
            num = Text(f"★{r.number}" if winner else str(r.number), style="bold green" if winner else "")
            plan = plan if len(plan) <= plan_w else plan[: plan_w - 1] + "…"
            self.add_row(num, Text(glyph, style=gstyle), Text(plan, style="bold green" if winner else ""),
                         peak, tps, acc, key=str(r.number))
        if keep is not None:
            for i, r in enumerate(rows):
                if r.number == keep:
                    self.move_cursor(row=i, animate=False)
                    break
