"""`--seq-len max`: the longest sequence whose run fits the budget (bisection on the run's peak, advisor.memory.longest),
and what stops one token more."""

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
