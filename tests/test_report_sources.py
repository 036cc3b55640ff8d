"""Reports of studies whose trials were simulated or probed: comparisons, loss curves, source labels.

No GPU and no minutes of simulation here: the study is a real Optuna SQLite study with the real
settings `advisor tune` records, and its trials carry records as the tuner writes them, with the
real analytic ledger of each plan; the simulated / measured peaks, throughputs and losses in them
are written by this test (stated numbers, not measurements). What is checked is the report: that
it recomputes the estimate beside them, labels each number with its source and draws the curves.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re

import optuna
import pytest

from advisor.memory.training import estimate_training
from advisor.cli import main
from advisor.core.plan import Plan
from advisor.ui.report import gather, open_study, resolve_storage
from advisor.speed.throughput import predict_throughput

QLORA = Plan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True,
             optimizer="paged_adamw_8bit", micro_batch=1, grad_accum=8, seq_len=1024)
LORA = Plan(method="lora", quantization="none", gradient_checkpointing=True, optimizer="adamw_8bit", micro_batch=2,
            grad_accum=4, seq_len=1024)


def _settings(tmp_path):
    """The settings `advisor tune` would record for this command line (parsed by the real parser)."""
    from advisor.cli import build_parser
    from advisor.commands.tune import build_settings

    args = build_parser().parse_args(["tune", "--model", "qwen7b", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                                      "--backend", "estimate", "--study", "probed", "--reports-dir", str(tmp_path),
                                      "--trials", "3"])
    return build_settings(args)


def _record(settings, plan: Plan, stage: str, source: str, scale: float, **extra):
    rep = estimate_training(settings.model, plan, settings.gpu)
    ledger = {k: int(v * scale) for k, v in rep.device.items()}
    return {"plan": plan.to_dict(), "plan_short": plan.short(), "stage": stage, "ladder": "", "reason": "",
            "peak_bytes": sum(ledger.values()), "tensor_peak_bytes": sum(ledger.values()) - ledger["overhead"],
            "source": source, "ledger": ledger, "host_bytes": 0, "accuracy_loss": 0.019,
            "accuracy_source": "prior", "seconds": 1.0, **extra}


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probed")
    s = _settings(tmp)
    (tmp / s.study_name).mkdir()  # the tuner makes the folder when it opens the study; this test writes it itself
    study = optuna.create_study(study_name=s.study_name, storage=s.storage, directions=["maximize", "minimize"])
    study.set_user_attr("advisor", s.describe())
    measured = _record(s, QLORA, "probe", "measured", 1.08, tokens_per_s=1234.5, tokens_per_s_source="measured",
                       losses=[2.31, 2.05, 1.87], accuracy_loss=0.012, accuracy_source="measured")
    simulated = _record(s, LORA, "simulate", "simulated", 0.97, tokens_per_s=800.0, tokens_per_s_source="predicted")
    for rec in (measured, simulated):
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE,
                                                  values=[rec["tokens_per_s"], rec["accuracy_loss"]],
                                                  user_attrs={"record": rec}))
    folder = tmp / s.study_name
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(folder), "--json"]) == 0
    paths = json.loads(out.getvalue())
    return {"settings": s, "folder": folder, "measured": measured, "simulated": simulated, "paths": paths,
            "html": open(paths["report.html"], encoding="utf-8").read()}


def test_comparisons_put_the_recomputed_estimate_beside_recorded_numbers(probed):
    s = probed["settings"]
    storage, folder = resolve_storage(str(probed["folder"]), None, None)
    data = gather(open_study(storage, None, folder))
    by_number = {c.number: c for c in data.comparisons}
    assert set(by_number) == {0, 1}
    est_q = estimate_training(s.model, QLORA, s.gpu).peak_bytes
    assert by_number[0].peak == {"estimated": est_q, "measured": probed["measured"]["peak_bytes"]}
    assert by_number[0].tokens_per_s == {
        "predicted": pytest.approx(predict_throughput(s.model, QLORA, s.gpu).tokens_per_s), "measured": 1234.5}
    assert by_number[1].peak == {"estimated": estimate_training(s.model, LORA, s.gpu).peak_bytes,
                                 "simulated": probed["simulated"]["peak_bytes"]}
    assert "predicted" in by_number[1].tokens_per_s and "measured" not in by_number[1].tokens_per_s
    assert not any("Every peak in this study is estimated" in n for n in data.notes)


def test_report_draws_loss_curves_and_the_comparison(probed):
    html = probed["html"]
    plots = dict(re.findall(r'<figure id="plot-(\w+)"[^>]*>(.*?)</figure>', html, flags=re.S))
    assert set(plots) == {"pareto", "ledger", "timeline", "losses", "compare"}
    assert "#0 (measured)" in plots["losses"] and "#1 (measured)" not in plots["losses"]
    assert "estimated peak" in plots["compare"] and "measured peak" in plots["compare"]
    assert "simulated peak" in plots["compare"]
    assert " measured<" in plots["ledger"] and " simulated<" in plots["ledger"]
    rows = re.search(r'<section id="compare">.*?</section>', html, flags=re.S).group(0)
    fmt = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    est = estimate_training(probed["settings"].model, QLORA, probed["settings"].gpu).peak_bytes
    assert f"{fmt(est)}<span class=\"src src-estimated\"" in rows
    assert f"{fmt(probed['measured']['peak_bytes'])}<span class=\"src src-measured\"" in rows
    assert "1,234<span class=\"src src-measured\"" in rows or "1,235<span class=\"src src-measured\"" in rows
    # the winner: measured peak, measured throughput and measured accuracy, each labelled
    answer = re.search(r'<div class="card answer">.*?</div>', html, flags=re.S).group(0)
    assert answer.count('src-measured"') == 4 and "src-predicted" not in answer and "src-prior" not in answer


def test_csv_keeps_losses_and_sources(probed):
    with open(probed["paths"]["trials.csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["memory_source"] for r in rows] == ["measured", "simulated"]
    assert json.loads(rows[0]["losses"]) == [2.31, 2.05, 1.87] and rows[1]["losses"] == ""
    assert rows[0]["tokens_per_s_source"] == "measured" and rows[0]["accuracy_source"] == "measured"
