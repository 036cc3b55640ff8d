"""The app fed by real studies: the tuner in a thread worker (pause, resume, stop after the current
trial, study saved) and `advisor tui` polling a study that another thread is running."""

from __future__ import annotations

import argparse
import asyncio
import functools
import threading
import time

import pytest

from advisor.commands import tune as tune_command


def sync(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def settings_for(tmp_path, trials: int):
    parser = argparse.ArgumentParser()
    subs = parser.add_subparsers()
    tune_command.add_parser(subs)
    args = parser.parse_args(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate",
                              "--trials", str(trials), "--reports-dir", str(tmp_path / "reports")])
    return tune_command.build_settings(args)


async def wait_for(pilot, condition, timeout=60.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out waiting for the app"
        await pilot.pause(0.05)


def open_tuner(settings):
    from advisor.search.tuner import Tuner

    tuner = Tuner(settings)
    tuner.open_study()
    return tuner


@pytest.mark.slow
@sync
async def test_live_study_pause_resume_and_quit_after_the_current_trial(tmp_path):
    from advisor.ui.tui.app import AdvisorApp
    from advisor.ui.tui.controller import TunerController

    settings = settings_for(tmp_path, trials=30)
    tuner = open_tuner(settings)
    controller = TunerController(tuner)
    app = AdvisorApp(tuner.records(), tuner.study.user_attrs["advisor"], study_name=settings.study_name,
                     storage=settings.storage, controller=controller)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.board.finished_count() >= 3)
        assert app.running
        await pilot.press("p")
        assert app.pause_state in ("pausing", "paused") and tuner.paused
        await wait_for(pilot, lambda: app.pause_state == "paused")
        assert any("Paused" in n.message for n in app._notifications)
        held = app.board.finished_count()
        await pilot.pause(0.6)
        assert app.board.finished_count() == held < 30  # nothing runs while paused
        await pilot.press("p")
        assert not tuner.paused
        await wait_for(pilot, lambda: app.board.finished_count() > held)
        await pilot.press("q")
        assert app.stopping
        await wait_for(pilot, lambda: controller.done.is_set())
        await pilot.pause(0.2)
    assert controller.done.is_set() and controller.stop_requested
    # the study on disk holds what the app showed, every trial finished (none left running)
    reopened = open_tuner(settings)
    finished = reopened.finished_count()
    assert held < finished < 30
    assert not [t for t in reopened.study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    assert app.board.finished_count() == finished


@pytest.mark.slow
@sync
async def test_watching_a_study_run_elsewhere_picks_up_new_trials(tmp_path):
    from advisor.ui.tui import open_study_app

    settings = settings_for(tmp_path, trials=4)
    open_tuner(settings).run()
    app = open_study_app(settings.storage, settings.study_name, poll_s=0.2)
    more = settings_for(tmp_path, trials=10)
    runner = threading.Thread(target=lambda: open_tuner(more).run())
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.board.finished_count() == 4
        await pilot.press("p")
        assert any("Nothing to pause" in n.message for n in app._notifications)
        runner.start()
        await wait_for(pilot, lambda: app.board.finished_count() == 10)
        runner.join()
        assert app.query_one("#status").render()  # redrawn without error
        await pilot.press("q")
    assert app.return_code == 0


def test_advisor_tui_opens_a_study_directory_by_name(tmp_path, monkeypatch):
    from advisor.commands.tui import resolve

    settings = settings_for(tmp_path, trials=2)
    open_tuner(settings).run()
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(study_dir=settings.study_name, storage=None, study=None, reports_dir="reports",
                              export=None, poll=1.5)
    storage, name = resolve(args)
    assert name == settings.study_name and storage == settings.storage
    args.study = "other"
    import pytest

    from advisor.core.errors import AdvisorInputError

    with pytest.raises(AdvisorInputError, match="--study: no such study in the storage"):
        resolve(args)
