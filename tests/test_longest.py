"""`--seq-len max`: the longest sequence whose run fits the budget (bisection on the run's peak,
advisor.memory.longest), and what stops one token more."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.memory.longest import longest_seq_len


def _linear(n: int):
    return 1000 + 10 * n, {"weights": 1000, "activations": 10 * n}


def test_bisection_finds_the_end_of_what_fits_and_what_stops_it():
    fit = longest_seq_len(_linear, lambda peak: peak <= 2000, ceiling=4096)
    assert (fit.max_seq_len, fit.next_seq_len, fit.stops) == (100, 101, "activations")
    assert fit.measured <= 16  # log2(4096) + the two ends
    assert longest_seq_len(_linear, lambda peak: peak <= 2000, ceiling=4096, step=64).max_seq_len == 64
    assert longest_seq_len(_linear, lambda peak: peak <= 10**9, ceiling=4096).at_ceiling
    assert longest_seq_len(_linear, lambda peak: peak <= 500, ceiling=4096).max_seq_len is None


def _estimate(capsys, *argv):
    code = main(["estimate", "--model", "qwen0.5b", "--method", "lora", "--gpu-budget", "4GB", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_estimate_answers_the_longest_that_fits(capsys):
    code, d = _estimate(capsys, "--seq-len", "max")
    longest = d["max_seq_len"]
    assert code == 0 and d["fits"] and d["plan"]["seq_len"] == longest and d["seq_len_search"]["stops"]
    assert _estimate(capsys, "--seq-len", str(longest))[1]["fits"]
    assert not _estimate(capsys, "--seq-len", str(longest + 1))[1]["fits"]


def test_max_without_a_budget_or_outside_estimate_is_a_clear_error(capsys):
    assert main(["estimate", "--model", "qwen0.5b", "--seq-len", "max"]) == 2
    assert "--seq-len: max needs a budget" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["estimate", "--model", "qwen0.5b", "--seq-len", "0"])
    assert e.value.code == 2 and "--seq-len" in capsys.readouterr().err


def test_a_guess_that_fits_starts_the_search_there():
    plain = longest_seq_len(_linear, lambda peak: peak <= 2000, ceiling=110)
    guessed = longest_seq_len(_linear, lambda peak: peak <= 2000, ceiling=110, guess=95)
    assert guessed.max_seq_len == plain.max_seq_len == 100 and guessed.measured < plain.measured
    assert longest_seq_len(_linear, lambda peak: peak <= 2000, ceiling=4096, guess=3000).max_seq_len == 100


def test_the_study_runs_within_five_percent_under_the_longest():
    from advisor.search.longest_study import study_seq_len

    assert study_seq_len(14016) == 13376 and 0.95 * 14016 <= 13376 <= 14016
    assert study_seq_len(100) == 100  # a multiple of 64 past it would not fit
    assert study_seq_len(32768, at_ceiling=True) == 32768  # every plan that reaches the trained context is as long
    assert study_seq_len(None) is None


def test_tune_answers_the_longest_sequence_and_the_fastest_plan_near_it(capsys, tmp_path):
    """`advisor tune seq_len=max`: the longest the space reaches (the closed form's bisection, then the simulation's,
    which decides at the edge), the study at 5% under it with the longest plan among its first trials, and how far
    the answer itself reaches."""
    from advisor.core.fit import fits
    from advisor.core.plan import Plan
    from advisor.search.longest_study import run_measure

    code = main(["tune", "--model", "qwen0.5b", "--gpu-budget", "2GB", "--backend", "estimate", "seq_len=max",
                 "--reports-dir", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    search, longest = d["seq_len_search"], d["max_seq_len"]
    assert code == 0 and longest == search["max_seq_len"] and search["answered_by"] == "simulation"
    study = search["study_seq_len"]
    assert 0.95 * longest <= study <= longest and study % 64 == 0
    assert {t["plan"]["seq_len"] for t in d["trials"]} == {study}
    first = [t for t in d["trials"] if (t["ladder"] or "").startswith("the longest")]
    assert first and first[0]["plan"] == {**search["plan"], "seq_len": study}
    assert d["best"]["plan"]["seq_len"] == study and d["answer_max_seq_len"] >= study
    # measured again: the longest plan fits at its length, and 64 tokens more it does not
    from advisor.commands.tune import build_settings
    from advisor.cli import build_parser

    settings = build_settings(build_parser().parse_args(["tune", "--model", "qwen0.5b", "--gpu-budget", "2GB",
                                                          "--backend", "estimate", "--reports-dir", str(tmp_path)]),
                              lookup=False)
    measure, plan = run_measure(settings, "simulate"), Plan.from_dict(search["plan"])
    assert fits(measure(plan).run_peak_bytes, settings.budget.bytes, settings.headroom)
    assert not fits(measure(plan.with_(seq_len=longest + 64)).run_peak_bytes, settings.budget.bytes, settings.headroom)


def test_tune_max_below_every_plan_is_a_clear_error(capsys, tmp_path):
    code = main(["tune", "--model", "qwen0.5b", "--gpu-budget", "1GB", "--backend", "estimate", "--seq-len", "max",
                 "--reports-dir", str(tmp_path)])
    assert code == 2 and "--seq-len: no plan of space 'default'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no study was made


@pytest.fixture(scope="module")
def lora_config(tmp_path_factory):
    from advisor.configs.export import export_plan
    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan

    root = tmp_path_factory.mktemp("longest")
    return str(export_plan(resolve_model("qwen0.5b"), Plan(method="lora", seq_len=512), root,
                           formats=["advisor"])["advisor"])


def _preflight(capsys, config, *argv):
    code = main(["preflight", config, "--gpu-budget", "4GB", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["estimate", "simulate"])
def test_preflight_answers_the_longest_the_config_fits(capsys, lora_config, backend):
    """`advisor preflight CONFIG --seq-len max`: GO at the longest length the config's plan fits (the search advisor
    estimate asks, on the preflight's own measure), the same length as estimate's on the closed form."""
    code, d = _preflight(capsys, lora_config, "--seq-len", "max", "--backend", backend)
    longest, search = d["max_seq_len"], d["seq_len_search"]
    assert code == 0 and d["verdict"] == "GO" and d["plan"]["seq_len"] == longest == search["max_seq_len"]
    assert search["step"] == (1 if backend == "estimate" else 64) and search["next_seq_len"] == longest + search["step"]
    found = next(f for f in d["findings"] if f["check"] == "memory.longest")
    assert found["severity"] == "ok" and f"{longest:,} tokens" in found["title"]
    assert _preflight(capsys, lora_config, "--max-seq-len", str(longest), "--backend", backend)[1]["verdict"] == "GO"
    over = _preflight(capsys, lora_config, "--seq-len", str(search["next_seq_len"]), "--backend", backend)[1]
    assert next(f for f in over["findings"] if f["check"] == "memory.fit")["severity"] != "ok"
    if backend == "estimate":
        assert longest == _estimate(capsys, "--seq-len", "max")[1]["max_seq_len"]


def test_preflight_max_that_cannot_be_answered_is_a_clear_error(capsys, lora_config):
    assert main(["preflight", lora_config, "--seq-len", "max", "--backend", "estimate"]) == 2
    assert "--seq-len: max needs a budget" in capsys.readouterr().err
    assert main(["preflight", lora_config, "--gpu-budget", "4GB", "--seq-len", "max", "--max-seq-len", "100"]) == 2
    assert "--seq-len: give --seq-len or --max-seq-len, not both" in capsys.readouterr().err
    code, d = _preflight(capsys, lora_config, "--seq-len", "max", "--backend", "estimate", "--gpu-budget", "1GB")
    assert code == 1 and d["verdict"] == "NO-GO" and d["max_seq_len"] is None
    assert next(f for f in d["findings"] if f["check"] == "memory.longest")["severity"] == "error"
