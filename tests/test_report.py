"""`advisor report` on a real study (Optuna + SQLite, estimate backend): content, CSV, offline, errors."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import sqlite3
import subprocess
import sys
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from advisor.cli import main
from advisor.memory.ledger import CATEGORIES


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A 12-trial study of qwen7b on 24GB, its report, and what the tuner itself printed."""
    root = tmp_path_factory.mktemp("report-study")
    code, out = _run(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate",
                      "--reports-dir", str(root), "--trials", "12", "--json"])
    assert code == 0
    tuned = json.loads(out)
    folder = root / tuned["study"]
    code, out = _run(["report", str(folder), "--json"])
    assert code == 0
    paths = json.loads(out)
    return {"folder": folder, "tuned": tuned, "paths": paths, "html": Path(paths["report.html"]).read_text("utf-8"),
            "md": Path(paths["report.md"]).read_text("utf-8"), "root": root}


class _Cells(HTMLParser):
    """Text of each table row under <section id=...>, and the tags used, from report.html."""

    def __init__(self):
        super().__init__()
        self.section = None
        self.rows: dict[str, list[list[str]]] = {}
        self.row_html: dict[str, list[str]] = {}
        self._row = None
        self._cell = None
        self._skip = False
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for k, v in attrs:
            self.attrs.append((tag, k, v or ""))
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
        elif tag == "tr" and self.section:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "span" and self._cell is not None and "src" in (a.get("class") or "").split():
            self._cell.append(f" [{(a.get('class') or '').split()[-1].removeprefix('src-')}]")
            self._skip = True  # the tag's own text is replaced by [source]

    def handle_endtag(self, tag):
        if tag == "span":
            self._skip = False
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.setdefault(self.section, []).append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None and not self._skip:
            self._cell.append(data)


def _parse(html: str) -> _Cells:
    p = _Cells()
    p.feed(html)
    return p


@pytest.mark.slow
def test_report_shows_the_question_the_winner_and_every_trial(study):
    html, tuned = study["html"], study["tuned"]
    best = tuned["best"]
    cells = _parse(html)
    # the question
    assert "qwen2.5-7b-instruct" in html and "24GB" in html and "25,769,803,776 bytes" in html
    assert "assumed" in html  # no GPU here: the GPU is the one the budget matches, and the report says so
    assert "lora_targets" in html and "paged_adamw_8bit" in html  # the search space's knobs
    # the answer: the tuner's own winner, its plan and explanation
    assert f"Winner <b>#{best['number']}</b>" in html
    assert best["plan_short"] in html
    for line in tuned["explanation"]:
        assert html_escape(line) in html
    ledger = {r[0]: r[1] for r in cells.rows["answer"] if len(r) == 3}
    assert ledger["Peak on the GPU"].startswith(f"{best['peak_bytes'] / 2**30:.2f} GiB")
    assert ledger["Peak on the GPU"].endswith(f"[{best['source']}]")  # an answer at the edge is simulated
    # every trial, once, in number order, the winner marked
    trial_rows = [r for r in cells.rows["trials"][1:]]
    numbers = [int(re.match(r"#(\d+)", r[0]).group(1)) for r in trial_rows]
    assert numbers == [t["number"] for t in tuned["trials"]] == list(range(12 + tuned["n_polish"]))
    assert "★" in trial_rows[best["number"]][0]
    # every number carries its source
    by_number = {t["number"]: t for t in tuned["trials"]}
    for row, n in zip(trial_rows, numbers):
        t = by_number[n]
        peak, tps, acc = row[5], row[6], row[7]
        assert (peak.endswith(f"[{t['source']}]")) == (t["peak_bytes"] is not None), row
        assert (tps.endswith("[predicted]")) == bool(t["tokens_per_s"]), row
        assert (acc.endswith("[prior]")) == (t["accuracy_loss"] is not None), row
        assert row[10] == t["reason"]


def test_the_search_space_is_named_without_the_machines_path(study):
    """The space shows as its name and its file relative to the package, never the absolute path it was read from."""
    from advisor.search.space import SPACES_DIR

    for text in (study["html"], study["md"]):
        assert str(SPACES_DIR) not in text
        assert "advisor/data/spaces/default.yaml" in text
    assert "--space default" in study["md"]


def test_a_study_written_before_the_newer_settings_still_reports(study, tmp_path):
    """The first studies stored no task, gpus, sharding or environment: the report and the TUI read them through
    StudyDescription's defaults (advisor.search.description), the same as every other reader."""
    import shutil

    from advisor.search.description import ATTR
    from advisor.search.select import select
    from advisor.ui.report import gather, open_study
    from advisor.ui.tui.state import Board, StudyInfo

    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(study["folder"] / "study.db", old / "study.db")
    url = f"sqlite:///{old / 'study.db'}"
    stored = optuna.load_study(study_name=study["tuned"]["study"], storage=url)
    first = {k: v for k, v in stored.user_attrs[ATTR].items() if k not in ("task", "gpus", "sharding", "environment")}
    stored.set_user_attr(ATTR, first)
    data = gather(open_study(url, None, old))
    d = data.description
    assert (d.task, d.gpus, d.sharding) == ("train", 1, "zero3") and data.best is not None
    assert data.best.number == study["tuned"]["best"]["number"]
    board = Board(StudyInfo.from_description("old", first), data.records)
    assert board.best.number == select(data.records, d.budget.bytes, d.headroom, d.tolerance).best.number
    code, _ = _run(["report", str(old), "--out", str(tmp_path / "r")])
    assert code == 0 and "The question" in (tmp_path / "r" / "report.html").read_text("utf-8")


def test_report_plots_are_inline_svg_with_every_trial(study):
    html, tuned = study["html"], study["tuned"]
    plots = dict(re.findall(r'<figure id="plot-(\w+)"[^>]*>(.*?)</figure>', html, flags=re.S))
    # estimate backend: no loss curves; the answer at the edge, simulated, is compared with its estimate
    assert {"pareto", "ledger", "timeline"} <= set(plots) <= {"pareto", "ledger", "timeline", "compare"}
    for svg in plots.values():
        assert svg.startswith("<svg ") and 'class="plot"' in svg and "currentColor" in svg
    with_peak = [t for t in tuned["trials"] if t["peak_bytes"]]
    for t in with_peak:  # a ledger bar per trial that has a ledger, labelled with its peak and source
        assert re.search(rf">#{t['number']} (winner|complete|pruned)<", plots["ledger"]), t["number"]
    assert plots["ledger"].count(" estimated<") + plots["ledger"].count(" simulated<") == len(with_peak)
    for t in tuned["trials"]:  # the timeline has a row for every trial
        assert f">#{t['number']}<" in plots["timeline"]
    for t in tuned["trials"]:
        if t["peak_bytes"] and t["tokens_per_s"]:
            assert f">#{t['number']}<" in plots["pareto"]
    assert "budget 24.00 GiB" in plots["pareto"] and "budget 24.00 GiB" in plots["ledger"]
    if "compare" not in plots:  # nothing simulated or probed: the report says there is nothing to compare
        assert "No trial was probed" in html and "nothing to compare" in html
    # ids are unique across the inlined SVGs (each plot's ids are prefixed)
    ids = re.findall(r' id="([^"]+)"', html)
    assert len(ids) == len(set(ids))


def test_report_html_is_self_contained(study):
    html = study["html"]
    cells = _parse(html)
    assert "script" not in cells.tags and "iframe" not in cells.tags and "object" not in cells.tags
    for tag, key, value in cells.attrs:
        if key in ("src", "href", "xlink:href", "action", "poster"):
            assert value.startswith(("#", "data:")), (tag, key, value)
    assert "@import" not in html and "@font-face" not in html
    assert not re.search(r"url\((?!#)", html)
    assert "default-src 'none'" in html  # the browser refuses any request the page might try
    assert "prefers-color-scheme: dark" in html


def test_trials_csv_has_one_row_per_trial(study):
    tuned = study["tuned"]
    with open(study["paths"]["trials.csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    storage = f"sqlite:///{study['folder'] / 'study.db'}"
    trials = optuna.load_study(study_name=tuned["study"], storage=storage).get_trials(deepcopy=False)
    assert len(rows) == len(trials) == 12 + tuned["n_polish"]
    assert [int(r["number"]) for r in rows] == [t.number for t in trials]
    assert [r["state"] for r in rows] == [t.state.name.lower() for t in trials]
    winners = [r for r in rows if r["winner"] == "True"]
    assert [int(r["number"]) for r in winners] == [tuned["best"]["number"]]
    for r, t in zip(rows, tuned["trials"]):
        if t["peak_bytes"]:
            assert int(r["peak_bytes"]) == t["peak_bytes"] and r["memory_source"] == t["source"]
            assert sum(int(r[f"ledger_{c}_bytes"]) for c in CATEGORIES) == t["peak_bytes"]
        if t["tokens_per_s"]:
            assert r["tokens_per_s_source"] == "predicted"
        assert r["reason"] == t["reason"]


def test_markdown_has_the_answer_and_every_trial(study):
    md, tuned = study["md"], study["tuned"]
    assert f"**Winner #{tuned['best']['number']}: `{tuned['best']['plan_short']}`**" in md
    for t in tuned["trials"]:
        assert re.search(rf"^\| #{t['number']}( \(winner\))? \|", md, flags=re.M), t["number"]
    assert "(estimated)" in md and "(predicted)" in md and "(prior)" in md
    assert "advisor tune --model Qwen/Qwen2.5-7B-Instruct --gpu-budget 24GB" in md
    assert "torch: " in md and "optuna: " in md


def test_reproduce_command_makes_the_same_study(study, tmp_path):
    """The report's "Reproduce" command, run elsewhere, gives the same trials and the same winner; the GPU the study
    assumed from the budget is said beside it (issue 41)."""
    gpu = study["tuned"]["gpu"]
    assert gpu["assumed"] and re.search(rf"^# the study assumed the {re.escape(gpu['name'])} \(\S+\) from the 24GB "
                                        "budget", study["md"], flags=re.M), gpu
    line = re.search(r"^advisor tune .*$", study["md"], flags=re.M).group(0)
    argv = line.split()[1:] + ["--reports-dir", str(tmp_path), "--json"]
    code, out = _run(argv)
    assert code == 0
    again = json.loads(out)
    assert again["best"]["plan_short"] == study["tuned"]["best"]["plan_short"]
    assert [t["plan_short"] for t in again["trials"]] == [t["plan_short"] for t in study["tuned"]["trials"]]


def test_out_dir_and_storage_url(study, tmp_path):
    storage = f"sqlite:///{study['folder'] / 'study.db'}"
    code, _ = _run(["report", "--storage", storage, "--study", study["tuned"]["study"], "--out", str(tmp_path / "r")])
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["report.html", "report.md", "trials.csv"]
    # a bare study name is looked up under --reports-dir
    from advisor.ui.report import resolve_storage

    url, folder = resolve_storage(study["tuned"]["study"], None, None, study["root"])
    assert folder == study["folder"].resolve() and url == f"sqlite:///{folder / 'study.db'}"


def test_exports_beside_the_study_are_shown(study, tmp_path):
    pytest.importorskip("advisor.configs.export")
    export = study["folder"] / "export"
    code, _ = _run(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--reports-dir",
                    str(study["root"]), "--trials", "12", "--json", "--export", str(export)])
    assert code == 0 and (export / "advisor.yaml").is_file()
    code, _ = _run(["report", str(study["folder"]), "--out", str(tmp_path)])
    assert code == 0
    html = (tmp_path / "report.html").read_text("utf-8")
    assert f"<code>{export}</code>" in html and "<code>advisor.yaml</code>" in html
    assert (export / "advisor.yaml").read_text("utf-8")[:200].replace("'", "&#x27;").replace('"', "&quot;") in html


@pytest.mark.parametrize("argv, flag", [
    (["report", "{tmp}/nowhere"], "STUDY"),
    (["report", "{tmp}"], "STUDY"),                                # a folder without study.db
    (["report"], "STUDY"),
    (["report", "--storage", "not-a-url"], "--storage"),
    (["report", "--storage", "sqlite:///{tmp}/missing.db"], "--storage"),
    (["report", "{tmp}/plain.db"], "STUDY"),                       # SQLite, but not an Optuna study
    (["report", "{tmp}/two/study.db"], "--study"),                 # two studies, none named
    (["report", "{tmp}/two/study.db", "--study", "c"], "--study"),
    (["report", "{tmp}/two/study.db", "--study", "a"], "--study"),  # an Optuna study not made by advisor tune
    (["report", "{study}", "--out", "{tmp}/plain.db"], "--out"),   # --out is a file
])
def test_bad_input_names_the_flag_and_exits_2(study, tmp_path, capsys, argv, flag):
    con = sqlite3.connect(tmp_path / "plain.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 'two' / 'study.db'}")
    before = (tmp_path / "plain.db").read_bytes()
    argv = [a.format(tmp=tmp_path, study=study["folder"]) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"advisor report: error: {flag}"), err
    assert "Traceback" not in err
    assert (tmp_path / "plain.db").read_bytes() == before  # never written to


def test_cli_import_stays_light():
    code = ("import sys, advisor.cli, advisor.commands.report; "
            "print(sorted(m for m in ('matplotlib', 'optuna', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_plan_table_lists_what_applies_to_the_plan():
    """Issue 41: the winner's plan table listed about 60 keys, GRPO, vLLM and video ones for a text run."""
    from advisor.core.plan import Plan
    from advisor.ui.report._format import plan_rows

    text = dict(plan_rows(Plan(method="lora", gradient_checkpointing=True).to_dict()))
    assert len(text) <= 25 and "Sequence length" in text and "LoRA rank" in text
    assert not {"task", "num_generations", "vllm_gpu_memory_utilization", "video_frames", "max_pixels", "sp_degree",
                "tiled_mlp", "image_sizes"} & set(text)
    grpo = dict(plan_rows(Plan(method="lora", task="grpo", generation="vllm-colocate").to_dict()))
    assert {"task", "num_generations", "max_completion_length", "vllm_gpu_memory_utilization"} <= set(grpo)
    vision = dict(plan_rows(Plan(method="lora", image_sizes=("640x480",), vision_tower="lora").to_dict()))
    assert {"image_sizes", "vision_tower"} <= set(vision) and "video_frames" not in vision


def test_scatter_labels_stay_by_their_points():
    """Issue 41: labels of crowded points floated away (moved up to half the plot, 150 points, with nothing tying
    them to their point)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

    from advisor.ui.report._plots import _label_points

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.set_xlim(0, 24)
    ax.set_ylim(0, 2000)
    crowd = [(12.0 + i * 0.01, 1000.0 + i, f"#{i}") for i in range(12)]
    _label_points(ax, crowd)
    height_pt = fig.get_size_inches()[1] * 72 * ax.get_position().height
    labels = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(labels) == 12
    for a in labels:
        moved = abs(a.xyann[1] - 3)
        assert moved <= 0.2 * height_pt + 1
        assert (a.arrow_patch is not None) == (moved > 0), a.get_text()
