"""The loss / DoRA / packing levers outside the simulation: Plan rules and legacy keys, the data
profile's padded-batch arithmetic, the step-time terms, the CLI flags."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from advisor.core.data_profile import DataProfile
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan


def test_loss_knob_and_its_legacy_key():
    assert Plan.from_dict({"chunked_ce": True}).loss == "chunked"
    assert Plan.from_dict({"chunked_ce": False}).loss == "plain"
    assert Plan(loss="chunked").chunked_ce and not Plan(loss="fused-linear").chunked_ce
    with pytest.raises(AdvisorInputError, match="--loss"):
        Plan(loss="cut").validate()


def test_dora_rules():
    with pytest.raises(AdvisorInputError, match="--dora"):
        Plan(method="full", dora=True).validate()
    with pytest.raises(AdvisorInputError, match="--dora"):
        Plan(method="qlora", quantization="nf4", dora=True).validate()
    assert "+dora" in Plan(dora=True).short()


def test_expected_padded_length_is_the_mean_batch_maximum():
    rng = random.Random(0)
    lengths = tuple(rng.randint(5, 300) for _ in range(9))
    d = DataProfile(lengths, "x", "given")
    for b in (1, 2, 4):
        brute = [max(min(n, 256) for n in c) for c in itertools.combinations(lengths, b)]
        assert d.expected_padded(256, b) == pytest.approx(sum(brute) / len(brute))
    assert d.longest(256) == min(max(lengths), 256)
    assert d.real_token_fraction(256, 4, packing=True) == 1.0
    assert 0 < d.real_token_fraction(256, 4, packing=False) < 1


def test_step_time_terms_of_the_levers():
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.speed.throughput import predict_throughput

    m, g = resolve_model("qwen7b"), resolve_gpu("rtx-4090")
    base = predict_throughput(m, Plan(), g)
    chunked = predict_throughput(m, Plan(loss="chunked"), g)
    fused = predict_throughput(m, Plan(loss="fused-linear"), g)
    assert chunked.terms["chunked_loss_recompute"] > 0 and chunked.step_seconds > base.step_seconds
    assert fused.terms["loss"] < base.terms["loss"]
    assert predict_throughput(m, Plan(dora=True), g).step_seconds > base.step_seconds
    d = DataProfile(tuple([200] * 50 + [1000] * 10), "x", "given")
    padded = predict_throughput(m, Plan(micro_batch=4), g, data=d)
    packed = predict_throughput(m, Plan(micro_batch=4, packing=True), g, data=d)
    assert padded.real_token_fraction < 1 and packed.real_token_fraction == 1
    assert packed.tokens_per_s > padded.tokens_per_s


def test_estimate_with_data_sizes_the_longest_batch(tmp_path, capsys):
    from advisor.cli import main

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("120\n300\n900\n40\n")
    assert main(["estimate", "--model", "qwen7b", "--seq-len", "2048", "--micro-batch", "2", "--data", str(lengths),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["seq_len"] == 900 and d["data"]["how"] == "given" and d["data"]["real_token_fraction"] < 1
    assert main(["estimate", "--model", "qwen7b", "--seq-len", "2048", "--data", str(lengths), "--packing",
                 "--loss", "fused-linear", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["seq_len"] == 2048 and d["plan"]["packing"] and d["plan"]["loss"] == "fused-linear"
    assert main(["estimate", "--model", "qwen7b", "--chunked-ce", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["loss"] == "chunked"
