"""Feeding the app: the tuner run in a Textual thread worker (``advisor tune --tui``), or a stored
study polled in one (``advisor tui``). The workers only post messages (``App.post_message`` is
thread-safe); the interface never waits on a trial.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.search.storage import redact
from advisor.ui.tui import POLL_SECONDS
from advisor.ui.tui import messages as m


def default_export_dir(storage: str, study_name: str) -> str:
    """<the study's folder>/export for a SQLite study, else reports/<study>/export."""
    if storage.startswith("sqlite:///"):
        return str(Path(storage[len("sqlite:///"):]).parent / "export")
    return str(Path("reports") / study_name / "export")


class TunerController:
    """Runs a Tuner (already opened) in a thread worker; pause and stop go to the Tuner."""

    can_pause = True
    live = True

    def __init__(self, tuner):
        from advisor.search.tuner import TrialFinished, TrialStarted

        self.tuner = tuner
        self._events = (TrialStarted, TrialFinished)
        self.app = None
        self.stop_requested = False
        self.done = threading.Event()
        tuner.on_event = self._on_event

    def _on_event(self, event: Any) -> None:  # called on the worker thread
        started, finished = self._events
        if self.app is None:
            return
        if isinstance(event, started):
            self.app.post_message(m.TrialStarted(event.number, event.plan_short))
        elif isinstance(event, finished):
            self.app.post_message(m.TrialFinished(event.record))

    def start(self, app) -> None:
        self.app = app
        app.run_worker(self._work, thread=True, name="tuner", group="study", exit_on_error=False)

    def _work(self) -> None:
        error = ""
        try:
            self.tuner.run()
            if not self.stop_requested:
                self.tuner.polish()
            if not self.stop_requested:  # the finalists' quality runs, where they can run (advisor.search.finalists)
                from advisor.search.finalists import run_finalists

                run_finalists(self.tuner, tokens=self.tuner.s.quality_tokens)
        except Exception as e:  # noqa: BLE001 - shown in the app; the study keeps every finished trial
            error = f"{type(e).__name__}: {e}"
        try:
            records = self.tuner.records()
            finished = self.tuner.finished_count()
        except Exception as e:  # noqa: BLE001
            records, finished = None, 0
            error = error or f"{type(e).__name__}: {e}"
        if records is not None:
            self.app.post_message(m.RecordsLoaded(records))
        self.app.post_message(m.StudyDone(finished, stopped=self.stop_requested, error=error))
        self.done.set()

    def pause(self, paused: bool) -> None:
        self.tuner.pause(paused)

    def stop(self) -> None:
        self.stop_requested = True
        self.tuner.stop()


class StudyWatcher:
    """Polls a stored study every ``poll_s`` seconds; posts the records when anything changed."""

    can_pause = False
    live = False

    def __init__(self, storage: str, study_name: str, poll_s: float = POLL_SECONDS):
        self.storage, self.study_name, self.poll_s = storage, study_name, poll_s
        self._stop = threading.Event()
        self.study = None
        self._last: tuple = ()

    def load(self):
        """(records, the typed StudyDescription) as stored now; AdvisorInputError when there is no such study."""
        import optuna

        from advisor.search.measured import apply_measured
        from advisor.search.tuner import record_from_trial

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if self.study is None:
            try:
                self.study = optuna.load_study(study_name=self.study_name, storage=self.storage)
            except KeyError:
                names = optuna.get_all_study_names(self.storage)
                raise AdvisorInputError("--study", f"no such study in {redact(self.storage)} (studies there: "
                                        f"{', '.join(names) or 'none'})", self.study_name) from None
        from advisor.search.description import ATTR, StudyDescription

        stored = self.study.user_attrs.get(ATTR)
        if stored is None:
            raise AdvisorInputError("--study", "not a vram-advisor study: it has no 'advisor' description",
                                    self.study_name)
        description = StudyDescription.from_dict(stored)
        trials = self.study.get_trials(deepcopy=False)
        attrs = self.study.user_attrs
        self._last = _signature(trials, attrs)
        return apply_measured([with_params_summary(record_from_trial(t), t) for t in trials], attrs), description

    def start(self, app) -> None:
        app.run_worker(lambda: self._work(app), thread=True, name="study-watcher", group="study",
                       exit_on_error=False)

    def _work(self, app) -> None:
        from advisor.search.measured import apply_measured
        from advisor.search.tuner import record_from_trial

        last = self._last
        while not self._stop.wait(self.poll_s):
            try:
                trials = self.study.get_trials(deepcopy=False)
                attrs = self.study.user_attrs
            except Exception:  # noqa: BLE001 - a busy or briefly locked database: try again next poll
                continue
            sig = _signature(trials, attrs)
            if sig != last:
                app.post_message(m.RecordsLoaded(apply_measured(
                    [with_params_summary(record_from_trial(t), t) for t in trials], attrs)))
                last = sig

    def pause(self, paused: bool) -> None:  # a study run elsewhere is paused where it runs
        pass

    def stop(self) -> None:
        self._stop.set()


def _signature(trials, study_attrs: dict | None = None) -> tuple:
    from advisor.search.measured import ATTR

    measured = (study_attrs or {}).get(ATTR) or {}
    return (tuple((t.number, t.state.name, "record" in t.user_attrs) for t in trials), str(measured.get("key")))


def with_params_summary(record, trial):
    """A running trial has no plan summary yet: show its sampled parameters instead."""
    if record.plan_short or not trial.params:
        return record
    from dataclasses import replace

    short = " ".join(str(v) if not isinstance(v, bool) else (k if v else "") for k, v in trial.params.items())
    return replace(record, plan_short=" ".join(short.split()))


def open_study_app(storage_url: str, study_name: str, *, export_dir: str | None = None,
                   poll_s: float = POLL_SECONDS):
    from advisor.ui.tui.app import AdvisorApp

    watcher = StudyWatcher(storage_url, study_name, poll_s)
    records, description = watcher.load()
    return AdvisorApp(records, description, study_name=study_name, storage=storage_url, controller=watcher,
                      export_dir=export_dir or default_export_dir(storage_url, study_name))


def run_tui(settings, export_dir: str | None = None) -> int:
    from advisor.search.tuner import Tuner
    from advisor.ui.tui.app import AdvisorApp

    tuner = Tuner(settings)
    tuner.open_study()  # bad --study settings fail here, before the screen changes (exit code 2)
    controller = TunerController(tuner)
    from advisor.search.description import ATTR, StudyDescription

    stored = tuner.study.user_attrs.get(ATTR)
    description = StudyDescription.from_dict(stored) if stored else settings.description()
    app = AdvisorApp(tuner.records(), description, study_name=settings.study_name, storage=settings.storage,
                     controller=controller, export_dir=export_dir or default_export_dir(settings.storage,
                                                                                        settings.study_name),
                     auto_export=bool(export_dir))
    app.run()
    controller.stop()
    if not controller.done.wait(0.1) and controller.app is not None:
        print("waiting for the current trial to finish (Ctrl-C leaves it; it is re-run on resume)...",
              file=sys.stderr)
        controller.done.wait()
    selection = tuner.selection()
    from advisor.ui.tui.state import finished_split

    finished, polish = finished_split(tuner.records())
    print(f"study {settings.study_name!r} saved in {redact(settings.storage)}: {finished} of {settings.trials} "
          "planned trials" + (f" + {polish} polish" if polish else "") + " finished"
          + ("" if finished >= settings.trials else "; run the same command to continue"))
    if selection.best is not None:
        print(f"chosen #{selection.best.number} {selection.best.plan_short}")
    for kind, path in app.exported.items():
        print(f"exported {kind}: {path}")
    return 0 if selection.best is not None else 1
