"""ms-swift's one-change ablations (benchmarks/ms_swift_ablations.py): issue 23's goals for the step-time
model. The predicted QLoRA/LoRA speed ratio within 15% of the published one, every order kept where
the published gap is over 10%, December's wall-time ratios (setup included) not exceeded, and the gap
closing at 8 x 2048 tokens per micro-batch."""

from __future__ import annotations

import pytest
from benchmark_modules import load_benchmark  # tests/benchmark_modules.py

BENCH = load_benchmark("ms_swift_ablations")
SPEC = BENCH.load_spec()
ROWS = BENCH.evaluate(SPEC)


def _id(r: dict) -> str:
    return f"{r['a']}->{r['b']}"


def test_every_lora_qlora_pair_of_the_tables_is_compared():
    qlora = {pid for pid, pt in SPEC["points"].items() if pt["plan"]["method"] == "qlora"}
    in_pairs = {r["b"] for r in ROWS if "QLoRA" in r["changed"]}
    assert qlora and qlora == in_pairs
    assert sum("ratio_within" in r for r in ROWS) == 2  # January's two clean samples/s pairs


@pytest.mark.parametrize("row", [r for r in ROWS if "ratio_within" in r], ids=_id)
def test_qlora_to_lora_ratio_within_15_percent(row):
    assert abs(row["predicted"] / row["published"] - 1) <= 0.15, (row["predicted"], row["published"])


@pytest.mark.parametrize("row", [r for r in ROWS if r["order_checked"]], ids=_id)
def test_order_kept_where_the_published_gap_is_over_10_percent(row):
    assert (row["predicted"] > 1) == (row["published"] > 1), row["changed"]


@pytest.mark.parametrize("row", [r for r in ROWS if r.get("bound")], ids=_id)
def test_december_wall_time_ratio_is_an_upper_bound(row):
    assert row["predicted"] <= row["published"]


def test_enough_orders_are_checked():
    assert sum(r["order_checked"] for r in ROWS) >= 15


def test_gap_closes_at_8_x_2048_tokens():
    ratios = dict(BENCH.amortization())
    assert ratios["1 x 2048"] < 0.75 and ratios["8 x 2048"] > 0.9


def test_length_profile_follows_the_published_statistics():
    lengths = BENCH.dataset_lengths()
    d = SPEC["dataset_lengths"]
    assert min(lengths) >= d["min"] and max(lengths) <= d["max"]
    assert sum(lengths) / len(lengths) == pytest.approx(d["mean"], rel=0.03)
    kept = BENCH.profile(2048, "delete")
    assert max(kept.lengths) <= 2048 and len(kept.lengths) < len(lengths)
    assert max(BENCH.profile(2048, "truncate").lengths) == 2048


def test_copied_values_match_the_published_json():
    data = next((p for p in BENCH.data_candidates() if p.is_file()), None)
    if data is None:
        pytest.skip("published_runs/ms_swift_benchmark.json is not on this machine")
    assert BENCH.check_copies(SPEC, data) == []
