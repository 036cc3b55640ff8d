"""The Textual app from plain records: keys, selection, sort, filter, pause, export, quit; drawings;
`advisor tui` input errors; and a snapshot of the main screen at 80x24."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import subprocess
import sys

import pytest
import yaml

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.search.select import TrialRecord
from advisor.core.units import Budget

GB = 2**30
BUDGET = 24 * GB


def sync(test):
    """Run an async Pilot test with asyncio.run (no async plugin needed)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def _plan(**kw) -> Plan:
    return Plan(**kw).validate()


def _ledger(total: int) -> dict[str, int]:
    w = int(total * 0.4)
    a = int(total * 0.4)
    o = total - w - a
    return {"weights": w, "activations": a, "overhead": o}


def _done(n, plan: Plan, peak_gb, tps, acc, source="estimated", tps_src="predicted", acc_src="prior"):
    peak = int(peak_gb * GB)
    return TrialRecord(number=n, state="complete", plan=plan.to_dict(), plan_short=plan.short(), stage="estimate",
                       peak_bytes=peak, tensor_peak_bytes=peak - GB, source=source, ledger=_ledger(peak),
                       tokens_per_s=tps, tokens_per_s_source=tps_src, accuracy_loss=acc, accuracy_source=acc_src)


def _pruned(n, plan: Plan, peak_gb, reason, stage="estimate"):
    peak = int(peak_gb * GB)
    return TrialRecord(number=n, state="pruned", plan=plan.to_dict(), plan_short=plan.short(), stage=stage,
                       reason=reason, peak_bytes=peak, tensor_peak_bytes=peak - GB, source="estimated",
                       ledger=_ledger(peak))


def sample_records() -> list[TrialRecord]:
    qlora = dict(method="qlora", quantization="nf4", optimizer="paged_adamw_8bit", grad_accum=8)
    return [
        _pruned(0, _plan(method="full", grad_accum=8), 74.99, "estimated peak 74.99 GB over the budget 24.00 GB"),
        _done(1, _plan(**qlora, double_quant=True), 15.72, 1024.0, 0.019),
        _pruned(2, _plan(method="lora", grad_accum=8), 23.98, "estimated peak 23.98 GB over the budget 24.00 GB "
                                                               "less headroom"),
        _done(3, _plan(**qlora, double_quant=True, gradient_checkpointing=True), 12.23, 733.0, 0.019),
        _done(4, _plan(method="lora", gradient_checkpointing=True, optimizer="adamw_8bit", micro_batch=2,
                       grad_accum=4), 19.54, 741.0, 0.004, source="simulated"),
        _done(5, _plan(method="qlora", quantization="fp4", lora_r=32, gradient_checkpointing=True,
                       optimizer="adamw_8bit", micro_batch=2, grad_accum=4), 8.69, 1100.0, 0.037,
              source="measured", tps_src="measured", acc_src="measured"),
        _done(6, _plan(method="full", gradient_checkpointing=True, offload="zero2_cpu", micro_batch=2, grad_accum=4),
              19.76, 348.0, 0.0),
    ]


def description() -> dict:
    """A study's stored description, as `advisor tune` writes it (advisor.search.description)."""
    from advisor.search.space import load_space

    return {"model": resolve_model("qwen7b").to_dict(), "gpu": resolve_gpu("rtx-3090").to_dict(),
            "budget": {"bytes": BUDGET, "text": "24GB", "unit": "GB"}, "space": load_space("default").to_dict(),
            "backend": "estimate", "headroom": 0.05, "tolerance": 0.03, "trials": 10}


def make_app(tmp_path=None, records=None, **kw):
    from advisor.ui.tui.app import AdvisorApp

    return AdvisorApp(sample_records() if records is None else records, description(), study_name="demo",
                      export_dir=str(tmp_path / "export") if tmp_path else None, **kw)


def row_numbers(app) -> list[int]:
    from advisor.ui.tui.widgets import TrialTable

    table = app.query_one(TrialTable)
    return [int(row.key.value) for row in table.ordered_rows]


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


# ----------------------------------------------------------------------------- plain data


def test_board_selection_sort_and_filter():
    from advisor.ui.tui.state import Board, StudyInfo, next_sort

    board = Board(StudyInfo.from_description("demo", description()), sample_records())
    # #5 is fastest but its accuracy loss 0.037 is over the 0.03 tolerance: #1 is chosen
    assert board.best.number == 1
    assert [r.number for r in board.view("tokens")][:3] == [5, 1, 4]
    assert [r.number for r in board.view("peak")][:2] == [5, 3]
    assert [r.number for r in board.view("number", "pruned")] == [0, 2]
    assert [r.number for r in board.view("number", "qlora ckpt")] == [3, 5]
    assert board.fit(board.records[2]) == "tight" and board.fit(board.records[0]) == "over"
    assert next_sort("accuracy") == "number"
    with pytest.raises(ValueError, match="sort must be one of"):
        board.view("colour")


def test_ledger_bars_put_the_budget_line_where_the_budget_is():
    from advisor.ui.tui.draw import ledger_lines

    rec = sample_records()[1]
    lines = [t.plain for t in ledger_lines(rec, BUDGET, 0.05, Budget(BUDGET, "GB", "24GB").format, 80)]
    weights = next(line for line in lines if line.startswith("Weights"))
    total = next(line for line in lines if line.startswith("Peak"))
    bar_start = 23
    budget_col = weights.index("│") - bar_start
    filled = total[bar_start:].count("█")
    # bars are scaled to max(budget, peak) * 1.02: the budget line near the right, the peak at 15.72/24 of it
    assert abs(filled / budget_col - 15.72 / 24) < 0.05
    assert "15.72 GB" in total and "budget 24.00 GB" in lines[-1]
    over = [t.plain for t in ledger_lines(sample_records()[0], BUDGET, 0.05, Budget(BUDGET, "GB", "").format, 80)]
    assert "50.99 GB over" in " ".join(over)


def test_pareto_plot_marks_the_chosen_plan_and_the_front():
    from advisor.ui.tui.draw import pareto_lines
    from advisor.ui.tui.state import Board, StudyInfo

    board = Board(StudyInfo.from_description("demo", description()), sample_records())
    sel = board.selection
    text = "\n".join(t.plain for t in pareto_lines(board.ordered(), sel.pareto, sel.best, BUDGET, 0.05,
                                                   board.info.fmt, 78, 12))
    assert "★#1" in text
    assert {f"#{r.number}" for r in sel.pareto if r.number != 1} <= set(text.replace("◆", " ").split())
    assert "budget 24.00 GB" in text


# ----------------------------------------------------------------------------- the app


@sync
async def test_table_shows_every_trial_with_marks_and_the_winner():
    from advisor.ui.tui.widgets import TrialTable

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one(TrialTable)
        assert row_numbers(app) == list(range(7))
        cells = [str(c) for c in table.get_row("1")]
        assert cells[0] == "★1" and cells[1] == "✓"
        assert cells[3].endswith(" e") and cells[4].endswith(" p") and cells[5].endswith(" ~")
        measured = [str(c) for c in table.get_row("5")]
        assert measured[3].endswith(" m") and measured[4].endswith(" m") and measured[5].endswith(" m")
        assert str(table.get_row("4")[3]).endswith(" s")
        assert "✗" == str(table.get_row("0")[1])


@sync
async def test_arrow_keys_move_the_selection_and_the_ledger_follows():
    from advisor.ui.tui.widgets import LedgerBars, PruneLog, TrialTable

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one(LedgerBars).record.number == 0
        await pilot.press("down", "down", "down")
        assert app.query_one(TrialTable).highlighted_number() == 3
        assert app.query_one(LedgerBars).record.number == 3
        assert app.query_one(PruneLog).logged == {0, 2}


@sync
async def test_s_cycles_the_sort_and_keeps_the_cursor_on_its_trial():
    from advisor.ui.tui.widgets import TrialTable

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("down")  # trial #1
        await pilot.press("s")
        assert app.sort == "tokens"
        assert row_numbers(app)[:4] == [5, 1, 4, 3]
        assert app.query_one(TrialTable).highlighted_number() == 1
        await pilot.press("s")
        assert app.sort == "peak" and row_numbers(app)[0] == 5
        await pilot.press("s", "s")
        assert app.sort == "number" and row_numbers(app) == list(range(7))


@sync
async def test_slash_filters_and_escape_clears():
    from textual.widgets import Input

    from advisor.ui.tui.widgets import TrialTable

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("slash", *"pruned")
        assert isinstance(app.focused, Input)
        assert row_numbers(app) == [0, 2]
        await pilot.press("enter")
        assert isinstance(app.focused, TrialTable)
        assert row_numbers(app) == [0, 2]
        await pilot.press("q")  # the table has focus again: q is a key, not a letter of the filter
        await pilot.pause()
    assert app.return_code == 0


@sync
async def test_escape_clears_the_filter():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("slash", *"qlora")
        assert row_numbers(app) == [1, 3, 5]
        await pilot.press("escape")
        assert app.query == "" and row_numbers(app) == list(range(7))
        assert not app.query_one("#filter").display


@sync
async def test_enter_opens_the_details_and_escape_goes_back():
    from textual.widgets import Static

    from advisor.ui.tui.screens import DetailsScreen

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("down", "down", "enter")
        assert isinstance(app.screen, DetailsScreen)
        summary = str(app.screen.query_one("#details-summary", Static).render())
        assert "Trial #2" in summary and "less headroom" in summary
        await pilot.press("escape")
        assert not isinstance(app.screen, DetailsScreen)


@sync
async def test_p_without_a_running_study_says_so():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        assert any("Nothing to pause" in n for n in notes(app))


@pytest.mark.skipif(importlib.util.find_spec("advisor.configs.export") is None,
                    reason="advisor.configs.export (the exporters) is not in this tree yet")
@sync
async def test_e_exports_the_chosen_plan_as_advisor_yaml(tmp_path):
    from textual.widgets import Input

    from advisor.ui.tui.screens import ExportScreen

    app = make_app(tmp_path)
    out = tmp_path / "edited"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")  # the highlighted trial #0 was pruned: the chosen #1 is exported
        assert isinstance(app.screen, ExportScreen)
        assert "#1" in app.screen.title_text and "chosen" in app.screen.title_text
        box = app.screen.query_one("#export-dir", Input)
        assert box.value == str(tmp_path / "export")
        box.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ExportScreen)
    data = yaml.safe_load((out / "advisor.yaml").read_text())
    assert data["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert data["quantization"]["bnb_4bit_use_double_quant"] is True
    assert data["lora"]["r"] == 16
    assert data["training"]["gradient_accumulation_steps"] == 8
    assert (out / "train.py").is_file()
    assert app.exported["advisor"] == out / "advisor.yaml"


def test_the_header_counts_each_trial_once():
    """Issue 41: "40/40 trials, 42 pruned" for a study of 45 records counted repeated proposals among the pruned."""
    import dataclasses

    from advisor.search.tuner import POLISH_MARK
    from advisor.ui.tui.state import Board

    records = sample_records()  # 7 trials, 2 pruned
    repeat = dataclasses.replace(records[0], number=7, duplicate_of=0)  # a pruned proposal asked again
    polish = dataclasses.replace(records[1], number=8, ladder=f"{POLISH_MARK} optimizer")
    board = Board(make_app().info, [*records, repeat, polish])
    assert board.tally() == "7/10 trials (2 pruned) + 1 polish, 1 repeats skipped"


@sync
async def test_at_80_columns_rows_stay_apart_and_three_digit_peaks_keep_their_mark():
    """Issue 41: plans cut at the end looked identical at 80 columns, and a 100+ GB peak lost its source mark."""
    from advisor.ui.tui.widgets import TrialTable

    base = dict(method="lora", lora_targets="all-linear", gradient_checkpointing=True, micro_batch=4, grad_accum=4,
                seq_len=8192, optimizer="adamw_8bit")
    records = [_done(1, _plan(**base), 123.45, 900.0, 0.01),
               _done(2, _plan(**base, loss="fused-linear"), 101.5, 950.0, 0.01, source="simulated"),
               _done(3, _plan(**base, loss="chunked"), 111.0, 930.0, 0.01, source="measured")]
    app = make_app(records=records)
    async with app.run_test(size=(80, 24)):
        table = app.query_one(TrialTable)
        plans = [str(table.get_cell(str(n), "plan")) for n in (1, 2, 3)]
        peaks = [str(table.get_cell(str(n), "peak")) for n in (1, 2, 3)]
    assert len(set(plans)) == 3, plans
    assert all(p.endswith(m) for p, m in zip(peaks, (" e", " s", " m"))), peaks


@sync
async def test_e_on_the_chosen_tab_exports_the_chosen_trial_not_the_highlighted_row(tmp_path):
    from advisor.ui.tui.screens import ExportScreen

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.query_one("TrialTable").highlighted_number() != 4:  # a complete trial that is not the chosen #1
            await pilot.press("down")
        await pilot.press("4", "e")
        assert isinstance(app.screen, ExportScreen)
        assert "#1" in app.screen.title_text and "(the chosen plan)" in app.screen.title_text


@sync
async def test_export_dialog_explains_a_missing_exporter(monkeypatch):
    from advisor.ui.tui import app as app_module
    from advisor.ui.tui.screens import ExportScreen

    monkeypatch.setattr(app_module, "exporter_unavailable", lambda: "Export is not available: test")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        assert "not available" in str(app.screen.query_one("#export-message").render())
        await pilot.press("escape")
        assert not isinstance(app.screen, ExportScreen)


@sync
async def test_nothing_to_export_without_a_complete_trial():
    app = make_app(records=[r for r in sample_records() if r.state == "pruned"])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        assert any("Nothing to export" in n for n in notes(app))
    assert app.return_code in (None, 1)


@sync
async def test_q_quits():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


def test_main_screen_snapshot(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24))


def test_pareto_tab_snapshot(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), press=["2"])


# ----------------------------------------------------------------------------- `advisor tui` input


def test_cli_does_not_import_textual():
    code = ("import sys, advisor.cli as c; c.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'torch', 'optuna')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("argv, flag", [
    (["tui", "no-such-study"], "STUDY"),
    (["tui"], "STUDY"),
    (["tui", "--storage", "sqlite:////no/such/file.db", "--study", "x"], "--storage"),
    (["tui", "--storage", "nonsense://", "--study", "x"], "--storage"),
])
def test_bad_tui_input_names_the_flag(tmp_path, monkeypatch, capsys, argv, flag):
    from advisor.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"advisor tui: error: {flag}:") and "Traceback" not in err


def test_directory_without_study_db(tmp_path, monkeypatch, capsys):
    from advisor.cli import main

    (tmp_path / "reports" / "empty").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert main(["tui", "empty"]) == 2
    assert "holds no study.db" in capsys.readouterr().err
