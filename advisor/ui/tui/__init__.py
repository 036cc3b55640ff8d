"""The Textual app: watch a study live, compare trials, export a plan (`advisor tune --tui`, `advisor tui`).

The App (``app.AdvisorApp``) is built from plain data, a list of ``TrialRecord`` and the study's
description (advisor.search.description.StudyDescription), so it can be tested without a study; a controller
(``controller``) feeds it messages (``messages``) from a Textual thread worker that runs the Tuner or polls the storage.
Textual is imported only when these functions are called.
"""

from __future__ import annotations

__all__ = ["POLL_SECONDS", "open_study_app", "run_tui"]

POLL_SECONDS = 1.5
"""How often a study running elsewhere is polled for new trials (`advisor tui --poll`)."""


def run_tui(settings, export_dir: str | None = None) -> int:
    """Run the study of ``settings`` inside the app; 0 when a plan was chosen, else 1."""
    from advisor.ui.tui.controller import run_tui as _run

    return _run(settings, export_dir=export_dir)


def open_study_app(storage_url: str, study_name: str, *, export_dir: str | None = None,
                   poll_s: float = POLL_SECONDS):
    """The app over a stored study (finished, or running elsewhere: polled every ``poll_s`` seconds)."""
    from advisor.ui.tui.controller import open_study_app as _open

    return _open(storage_url, study_name, export_dir=export_dir, poll_s=poll_s)
