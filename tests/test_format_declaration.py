"""An export format is declared once (advisor.configs.formats.FORMATS): a dummy format added there, and only
there, is written by export_plan, offered by `advisor export --help` and the TUI's export dialog, recognised
by detect_format and read back by read_config."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from advisor.configs import formats as declared
from advisor.configs.formats import FORMATS, Format
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan

PLAN = Plan(method="lora", lora_r=8, micro_batch=2, seq_len=1024)


def _write(ctx, out_dir: Path) -> Path:
    path = out_dir / "dummy.json"
    path.write_text(json.dumps({"dummy_model": ctx.model_id, "dummy_plan": ctx.plan.to_dict()}))
    return path


def _read(data: dict, c, plan_type: type):
    return data["dummy_model"], dict(vars(plan_type.from_dict(data["dummy_plan"]))), {}


DUMMY = Format("dummy", "dummy.json", "dummy.json (a test's format)", _write, _read,
               lambda data: "dummy_plan" in data, help="dummy.json: a format only this test declares")


@pytest.fixture
def dummy(monkeypatch):
    monkeypatch.setitem(FORMATS, "dummy", DUMMY)
    return DUMMY


def _export_help() -> str:
    from advisor.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["export"].format_help()


def _tui_labels() -> list[tuple[str, str]]:
    from textual.app import App
    from textual.widgets import SelectionList

    from advisor.ui.tui.screens import ExportScreen

    async def run():
        app = App()
        async with app.run_test(size=(100, 30)) as pilot:
            app.push_screen(ExportScreen("Export", "/tmp/x", None))
            await pilot.pause()
            options = app.screen.query_one("#export-formats", SelectionList)
            return [(str(options.get_option_at_index(i).prompt), options.get_option_at_index(i).value)
                    for i in range(options.option_count)]
    return asyncio.run(run())


def test_a_declared_format_is_in_the_help(dummy):
    text = _export_help()
    assert "dummy" in text and "a format only this test declares" in text
    for name in ("advisor", "train", "deepspeed", "axolotl", "llamafactory", "trl"):
        assert name in text  # every declared writer, TRL included


def test_without_the_declaration_it_is_nowhere():
    assert "dummy" not in _export_help()
    assert "dummy" not in declared.exported()
    assert declared.detect_format({"dummy_plan": {}, "base_model": "m"}) == "axolotl"


def test_a_declared_format_is_in_the_tui_list(dummy):
    labels = _tui_labels()
    assert ("dummy.json (a test's format)", "dummy") in labels
    assert [v for _, v in labels] == list(declared.exported())  # trl among them, in declaration order


def test_a_declared_format_is_written_detected_and_read(dummy, tmp_path):
    from advisor.configs.export import EXPORTERS, FILENAMES, export_plan
    from advisor.configs.read import detect_format, read_config

    assert FILENAMES["dummy"] == "dummy.json" and "dummy" in EXPORTERS
    written = export_plan(resolve_model("qwen7b"), PLAN, tmp_path, ["dummy"])
    assert written["dummy"] == tmp_path / "dummy.json"
    data = json.loads(written["dummy"].read_text())
    assert detect_format(data) == "dummy"
    name, plan, extras = read_config(written["dummy"])
    assert extras["format"] == "dummy" and plan == PLAN.validate() and name == resolve_model("qwen7b").hf_id
    everything = export_plan(resolve_model("qwen7b"), PLAN, tmp_path / "all")
    assert "dummy" in everything  # the default: every declared format


def test_the_declarations_are_the_registries():
    from advisor.configs import _keys
    from advisor.configs.export import EXPORTERS, FILENAMES
    from advisor.configs.read import FORMATS as READ

    assert list(EXPORTERS) == ["advisor", "train", "deepspeed", "axolotl", "llamafactory", "trl"]
    assert FILENAMES["trl"] == "trl.yaml" and FILENAMES["deepspeed"] == "deepspeed.json"
    assert READ == ("advisor", "axolotl", "llamafactory", "trl", "hf")
    assert _keys.FORMATS == ("advisor", "axolotl", "llamafactory", "trl")
