"""Everything known of one trial: plan, where it stopped and why, memory ledger, throughput, accuracy."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from advisor.search.select import TrialRecord
from advisor.ui.tui.state import StudyInfo
from advisor.ui.tui.widgets import LedgerBars


def summary(record: TrialRecord, info: StudyInfo, chosen: bool) -> Text:
    t = Text()
    t.append(f"Trial #{record.number}", style="bold")
    t.append(f"  {record.state}" + (" (chosen)" if chosen else ""), style="bold green" if chosen else "")
    t.append(f"\n{record.plan_short or '(running)'}\n")
    if record.stage:
        t.append(f"went as far as: {record.stage}")
    if record.ladder:
        t.append(f" · proposed by ladder rung {record.ladder}")
    if record.seconds:
        t.append(f" · {record.seconds:.2f} s")
    if record.reason:
        t.append(f"\npruned: {record.reason}", style="yellow")
    if record.peak_bytes is not None:
        t.append(f"\npeak {info.fmt(record.peak_bytes)} ({record.source})")
        if record.tensor_peak_bytes:
            t.append(f", tensors {info.fmt(record.tensor_peak_bytes)}")
        t.append(f" of a {info.fmt(info.budget.bytes)} budget, {info.headroom:.0%} headroom")
    if record.tokens_per_s:
        t.append(f"\nthroughput {record.tokens_per_s:,.0f} tokens/s ({record.tokens_per_s_source})")
    if record.accuracy_loss is not None:
        t.append(f"\naccuracy loss {record.accuracy_loss:.4f} ({record.accuracy_source}; tolerance {info.tolerance})")
    if record.note:
        t.append(f"\n{record.note}", style="dim")  # e.g. over how many tokens a finalist's quality was measured
    if record.losses:
        t.append("\nlosses " + " ".join(f"{x:.3f}" for x in record.losses))
    return t


def plan_table(record: TrialRecord) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    for key, value in record.plan.items():
        table.add_row(key, ", ".join(value) if isinstance(value, (list, tuple)) else str(value))
    return table


class DetailsScreen(ModalScreen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("enter", "app.pop_screen", "Back", show=False),
                Binding("q", "app.pop_screen", "Back", show=False)]
    DEFAULT_CSS = """
    DetailsScreen { align: center middle; }
    DetailsScreen > VerticalScroll { width: 100%; height: 1fr; border: round $accent; padding: 0 1;
                                     background: $surface; }
    DetailsScreen .section { margin-top: 1; text-style: bold; }
    """

    def __init__(self, record: TrialRecord, info: StudyInfo, chosen: bool):
        super().__init__()
        self.record, self.info, self.chosen = record, info, chosen

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll(id="details")
        scroll.border_title = f"Trial #{self.record.number}"
        scroll.border_subtitle = "esc back · ↑↓ scroll"
        with scroll:
            yield Static(summary(self.record, self.info, self.chosen), id="details-summary")
            yield Static("Memory ledger", classes="section")
            yield LedgerBars(self.info, self.record, id="details-ledger")
            if self.record.plan:
                yield Static("Plan", classes="section")
                yield Static(plan_table(self.record), id="details-plan")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()
