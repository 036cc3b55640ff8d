"""The main screen: status, live trial table, and tabs for the ledger, the Pareto chart, the pruning log
and the chosen plan. Built from plain data (records + the study's description); a controller, when
given, feeds it messages from a worker thread and takes pause / stop requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Protocol

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from advisor.configs.trial_export import export_trial
from advisor.search.description import StudyDescription
from advisor.search.select import TrialRecord
from advisor.ui.tui import messages as m
from advisor.ui.tui.exporting import exporter_unavailable
from advisor.ui.tui.screens import DetailsScreen, ExportScreen
from advisor.ui.tui.state import Board, StudyInfo, next_sort, sort_label
from advisor.ui.tui.widgets import LedgerBars, ParetoPlot, PruneLog, TrialTable, WinnerPanel

TABS = ("tab-ledger", "tab-pareto", "tab-pruned", "tab-winner")


class Controller(Protocol):
    """What the app asks of whoever feeds it (advisor.ui.tui.controller)."""

    can_pause: bool
    live: bool
    """True while a study runs in this process (the tuner); False when only watching storage."""

    def start(self, app: App) -> None: ...
    def pause(self, paused: bool) -> None: ...
    def stop(self) -> None: ...


class AdvisorApp(App[int]):
    TITLE = "vram-advisor"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #status { height: 2; padding: 0 1; background: $boost; }
    #filter { dock: bottom; display: none; }
    TabbedContent { height: 50%; min-height: 8; }
    TabPane { padding: 0 1; }
    #tab-pareto { padding: 0 0; }
    """
    BINDINGS = [
        Binding("enter", "details", "Details"),
        Binding("e", "export", "Export"),
        Binding("s", "sort", "Sort"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("p", "pause", "Pause/resume"),
        Binding("q", "quit_app", "Quit"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("1", "tab(0)", "Ledger", show=False),
        Binding("2", "tab(1)", "Pareto", show=False),
        Binding("3", "tab(2)", "Pruned", show=False),
        Binding("4", "tab(3)", "Chosen", show=False),
    ]

    def __init__(self, records: Iterable[TrialRecord], description: StudyDescription | dict[str, Any], *,
                 study_name: str, storage: str = "", controller: Controller | None = None,
                 export_dir: str | None = None, auto_export: bool = False):
        super().__init__()
        self.info = StudyInfo.from_description(study_name, description)
        self.board = Board(self.info, records)
        self.storage = storage
        self.controller = controller
        self.export_dir = export_dir or str(Path("reports") / study_name / "export")
        self.auto_export = auto_export
        self.sort = "number"
        self.query = ""
        self.running = bool(controller and controller.live)
        self.current: int | None = None      # the trial the tuner is on
        self.pause_state = ""                 # "", "pausing" (after the current trial), "paused"
        self.stopping = False
        self.done_note = ""
        self.exported: dict = {}

    # -- layout ---------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        table = TrialTable(id="trials")
        yield table
        with TabbedContent(id="tabs"):
            with TabPane("1 Ledger", id="tab-ledger"):
                with VerticalScroll():
                    yield LedgerBars(self.info, id="ledger")
            with TabPane("2 Pareto tok/s×peak", id="tab-pareto"):
                yield ParetoPlot(self.board, id="pareto")
            with TabPane("3 Pruned", id="tab-pruned"):
                yield PruneLog(id="pruned")
            with TabPane("4 Chosen", id="tab-winner"):
                with VerticalScroll():
                    yield WinnerPanel(id="winner")
        yield Input(placeholder="filter: words that must all appear (state, plan, reason, #n); esc clears",
                    id="filter")
        yield Footer()

    def on_mount(self) -> None:
        log = self.query_one(PruneLog)
        for r in self.board.pruned():
            log.add(r)
        self.refresh_all()
        self.query_one(TrialTable).focus()
        if self.controller is not None:
            self.controller.start(self)
        self.call_after_refresh(self.refresh_all)

    def on_unmount(self) -> None:
        if self.controller is not None:
            self.controller.stop()

    def on_resize(self) -> None:
        self.call_after_refresh(self.refresh_all)

    # -- drawing --------------------------------------------------------------

    def refresh_all(self) -> None:
        table = self.query_one(TrialTable)
        table.show(self.board, self.board.view(self.sort, self.query))
        self.show_ledger(table.highlighted_number())
        self.query_one(ParetoPlot).refresh()
        self.query_one(WinnerPanel).update_from(self.board, self.running)
        self.query_one("#status", Static).update(self.status_text())

    def show_ledger(self, number: int | None) -> None:
        self.query_one(LedgerBars).set_record(self.board.records.get(number) if number is not None else None)

    def status_text(self) -> Group:
        i, b = self.info, self.board
        head = Text(overflow="ellipsis", no_wrap=True)
        head.append(f"{i.model_name}", style="bold")
        head.append(f" · {i.fmt(i.budget.bytes)} budget, {i.headroom:.0%} headroom · {i.backend} · study "
                    f"{i.study_name} · {i.gpu_name}")
        hb = i.description.host_budget
        head.append(f" · host {hb.text}" if hb is not None else " · host not checked")
        t = Text(overflow="ellipsis", no_wrap=True)
        t.append(f"{b.tally()} · ")
        t.append(*self.activity())
        t.append(f" · sort: {sort_label(self.sort)}")
        if self.query:
            shown = len(b.view(self.sort, self.query))
            t.append(f" · filter '{self.query}': {shown}/{len(b.records)}", style="bold")
        return Group(head, t)

    def activity(self) -> tuple[str, str]:
        if self.stopping:
            return ("stopping after the current trial (q again: leave now)", "bold yellow")
        if self.pause_state == "pausing":
            return (f"pausing after trial #{self.current}" if self.current is not None else "pausing",
                    "bold yellow")
        if self.pause_state == "paused":
            return ("paused (p resumes)", "bold yellow")
        if self.running:
            if self.current is not None:
                return (f"running #{self.current}", "bold cyan")
            return ("running", "bold cyan")
        if self.controller is not None and not self.controller.live:
            return ("watching the storage", "cyan")
        return (self.done_note or "stored study", "")

    # -- messages from the controller ------------------------------------------

    def on_trial_started(self, message: m.TrialStarted) -> None:
        self.current = message.number
        if self.pause_state == "paused":  # it began just before the tuner saw the pause: it runs to its end
            self.pause_state = "pausing"
        self.board.started(message.number, message.plan_short)
        self.refresh_all()

    def on_trial_finished(self, message: m.TrialFinished) -> None:
        self.board.finished(message.record)
        self.query_one(PruneLog).add(message.record)
        if self.current == message.record.number:
            self.current = None
        if self.pause_state == "pausing":
            self.pause_state = "paused"
            self.notify(f"Paused after trial #{message.record.number}. Press p to resume.", title="Study paused")
        self.refresh_all()

    def on_records_loaded(self, message: m.RecordsLoaded) -> None:
        before = self.board.signature()
        self.board.replace(message.records)
        log = self.query_one(PruneLog)
        for r in self.board.pruned():
            log.add(r)
        if self.board.signature() != before or not self.running:
            self.refresh_all()

    def on_study_done(self, message: m.StudyDone) -> None:
        self.running = False
        self.current = None
        self.pause_state = ""
        if message.error:
            self.done_note = f"stopped by an error: {message.error}"
            self.notify(message.error, title="The study stopped", severity="error", timeout=30)
        elif message.stopped:
            self.done_note = f"stopped; study saved ({message.finished} finished trials)"
        else:
            self.done_note = f"finished; study saved ({message.finished} finished trials)"
            self.notify(f"{message.finished} trials finished. e exports the chosen plan.", title="Study finished")
        if self.auto_export and self.board.best is not None and not self.exported:
            self.export_now(self.board.best, self.export_dir, None)
        self.refresh_all()
        if self.stopping:
            self.exit(0 if self.board.best is not None else 1)

    # -- table ------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key is not None else None
        self.show_ledger(int(key) if key is not None else None)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_details()

    # -- actions ----------------------------------------------------------------

    def action_details(self) -> None:
        number = self.query_one(TrialTable).highlighted_number()
        if number is None or number not in self.board.records:
            self.notify("No trial selected.", severity="warning")
            return
        best = self.board.best
        self.push_screen(DetailsScreen(self.board.records[number], self.info,
                                       chosen=best is not None and best.number == number))

    def export_target(self) -> TrialRecord | None:
        """The chosen trial on the Chosen tab; elsewhere the highlighted trial when it is complete, else the chosen
        one."""
        if self.query_one("#tabs", TabbedContent).active == "tab-winner":
            return self.board.best
        number = self.query_one(TrialTable).highlighted_number()
        record = self.board.records.get(number) if number is not None else None
        if record is not None and record.state == "complete" and record.plan:
            return record
        return self.board.best

    def action_export(self) -> None:
        record = self.export_target()
        if record is None:
            self.notify("Nothing to export yet: no complete trial.", severity="warning")
            return
        best = self.board.best
        chosen = best is not None and best.number == record.number
        title = f"Export #{record.number} {record.plan_short}" + (" (the chosen plan)" if chosen else
                                                                   " (not the chosen plan)")
        unavailable = exporter_unavailable()

        def write(out_dir: str, formats):
            return self._write(record, out_dir, formats)

        def done(written: dict | None) -> None:
            if written:
                self.report_export(written, record)

        self.push_screen(ExportScreen(title, self.export_dir, None if unavailable else write, unavailable), done)

    def export_now(self, record: TrialRecord, out_dir: str, formats) -> None:
        unavailable = exporter_unavailable()
        if unavailable:
            self.notify(unavailable, severity="error")
            return
        try:
            written = self._write(record, out_dir, formats)
        except (ValueError, OSError) as e:
            self.notify(f"Export failed: {e}", severity="error")
            return
        self.report_export(written, record)

    def _write(self, record: TrialRecord, out_dir: str, formats) -> dict:
        d = self.info.description
        return export_trial(record, out_dir, formats, model=d.model, gpu=d.gpu, study_name=self.info.study_name,
                            gpus=d.gpus, sharding=d.sharding)

    def report_export(self, written: dict, record: TrialRecord) -> None:
        self.exported = dict(written)
        folder = Path(next(iter(written.values()))).parent if written else Path(self.export_dir)
        self.export_dir = str(folder)
        text = f"#{record.number} written to {folder}: " + ", ".join(Path(p).name for p in written.values())
        skipped = getattr(written, "skipped", {})
        if skipped:
            text += " (skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + ")"
        self.notify(text, title="Exported", timeout=15)

    def action_sort(self) -> None:
        self.sort = next_sort(self.sort)
        self.refresh_all()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True  # inline, at once: a key typed right after / must land in the box
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.query = event.value.strip()
            self.refresh_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            if not event.value.strip():
                event.input.display = False
            self.query_one(TrialTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display or self.query:
            box.value = ""
            self.query = ""
            box.display = False
            self.query_one(TrialTable).focus()
            self.refresh_all()

    def action_tab(self, index: int) -> None:
        self.query_one(TabbedContent).active = TABS[index]

    def action_pause(self) -> None:
        c = self.controller
        if c is None or not c.can_pause:
            self.notify("Nothing to pause here: this window shows a stored study; pause it where it runs.",
                        severity="warning")
            return
        if not self.running:
            self.notify("The study is not running.", severity="warning")
            return
        if self.pause_state:
            c.pause(False)
            self.pause_state = ""
            self.notify("Resumed.", title="Study running")
        else:
            c.pause(True)
            self.pause_state = "pausing"
            if self.current is not None:
                self.notify(f"Pausing after trial #{self.current} finishes.", title="Pausing")
            else:  # between trials: one may be starting now; paused once none has started for a second
                self.set_timer(1.0, self.confirm_pause)
        self.refresh_all()

    def confirm_pause(self) -> None:
        if self.pause_state == "pausing" and self.current is None:
            self.pause_state = "paused"
            self.notify("Paused. Press p to resume.", title="Study paused")
            self.refresh_all()

    def action_quit_app(self) -> None:
        c = self.controller
        if c is not None and c.live and self.running and not self.stopping:
            c.stop()  # the tuner's loop ends after the current trial (paused or not)
            self.stopping = True
            self.refresh_all()
            return
        if c is not None:
            c.stop()
        self.exit(0 if self.board.best is not None else 1)
