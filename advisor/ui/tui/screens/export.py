"""The export dialog: a plan written by advisor.configs.export.export_plan into a directory the user can edit."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, SelectionList, Static

from advisor.core.errors import AdvisorInputError



def formats() -> dict[str, str]:
    """format name -> its label, for every format written (advisor.configs.formats: the declarations)."""
    from advisor.configs.formats import exported

    return {name: f.label or f.filename or name for name, f in exported().items()}


class ExportScreen(ModalScreen[dict | None]):
    """Dismissed with {format: path} once written, or None when cancelled.

    ``write(out_dir, formats)`` does the writing (formats None: every format that can express the plan).
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 76; max-width: 100%; height: auto; max-height: 100%;
                              border: round $accent; background: $surface; padding: 0 1; }
    ExportScreen SelectionList { height: auto; max-height: 7; }
    ExportScreen #export-message { height: auto; }
    ExportScreen Horizontal { height: auto; }
    ExportScreen Button { margin-right: 2; }
    """

    def __init__(self, title: str, default_dir: str, write: Callable[[str, list[str] | None], dict] | None,
                 unavailable: str = ""):
        super().__init__()
        self.title_text = title
        self.default_dir = default_dir
        self.write = write
        self.unavailable = unavailable

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.title_text, style="bold"))
            yield Label("Directory (enter to write, escape to cancel):")
            yield Input(self.default_dir, id="export-dir")
            self.offered = formats()
            yield SelectionList[str](*[(label, key, True) for key, label in self.offered.items()], id="export-formats")
            yield Static(Text(self.unavailable, style="bold red") if self.unavailable else "", id="export-message")
            with Horizontal():
                yield Button("Export", variant="primary", id="export-go", disabled=self.write is None)
                yield Button("Cancel", id="export-cancel")

    def on_mount(self) -> None:
        self.query_one("#export-dir", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.do_export()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-go":
            self.do_export()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def do_export(self) -> None:
        message = self.query_one("#export-message", Static)
        if self.write is None:
            message.update(Text(self.unavailable, style="bold red"))
            return
        out_dir = self.query_one("#export-dir", Input).value.strip()
        if not out_dir:
            message.update(Text("directory: give a directory to write into", style="bold red"))
            return
        chosen = list(self.query_one("#export-formats", SelectionList).selected)
        if not chosen:
            message.update(Text("formats: select at least one format", style="bold red"))
            return
        wanted = None if set(chosen) == set(self.offered) else chosen
        try:
            written = self.write(str(Path(out_dir).expanduser()), wanted)
        except (AdvisorInputError, OSError) as e:
            message.update(Text(f"not written: {e}", style="bold red"))
            return
        self.dismiss(written)
