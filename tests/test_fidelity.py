"""Eval fidelity on a tiny model trained for a few seconds on the shipped texts (advisor/data/probes/train).

Quantization needs real, structured weights to damage: the tiny model is trained once per machine
(cached in the temp directory) and loaded by the probe from its directory, as real weights are.
"""

from __future__ import annotations

import json
import math

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.runtime.probe import run_probe
from advisor.runtime.probe._tiny import tiny_model_dir

SEQ = 64


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_dir()
    return path, resolve_model(str(path))


def test_the_tiny_model_learned_something(tiny):
    path, spec = tiny
    info = json.loads((path / "training.json").read_text())
    assert info["last_loss"] < info["first_loss"] - 2.0  # from ~ln(256) = 5.5 down to ~2
    assert spec.vocab_size == 256 and spec.source == "local"


@pytest.mark.slow
def test_fidelity_orders_quantizations(tiny):
    path, spec = tiny
    kl, base_loss = {}, {}
    for name, plan in {
        "bf16": Plan(method="lora", seq_len=SEQ),
        "int8": Plan(method="lora", quantization="int8", seq_len=SEQ),
        "nf4": Plan(method="qlora", quantization="nf4", seq_len=SEQ),
    }.items():
        r = run_probe(spec, plan, device="cpu", steps=1, warmup=0, timeout=300, weights_dir=str(path))
        assert r.status == "ok", r.message
        assert r.weights == str(path) and r.fidelity_tokens > 1000
        assert math.isfinite(r.eval_loss_after) and math.isfinite(r.fidelity_kl)
        kl[name], base_loss[name] = r.fidelity_kl, r.eval_loss_base
    # the bf16 plan is the reference itself; 8-bit damages less than 4-bit NF4
    assert kl["bf16"] == pytest.approx(0.0, abs=1e-7)
    assert 0 < kl["int8"] < kl["nf4"] < 0.5
    # on text it never saw, the trained model is far better than uniform (ln 256 = 5.55)
    assert base_loss["bf16"] < 3.5
    assert base_loss["nf4"] > base_loss["bf16"] - 0.01
