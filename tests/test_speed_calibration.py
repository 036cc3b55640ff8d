"""Measured beats predicted: probes refit a GPU model's scales (the CPU runs the same logic as a
real CUDA probe; the probe result here is a fake with known numbers)."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.speed import calibration
from advisor.speed.terms import step_terms
from advisor.speed.throughput import predict_throughput

MODEL = resolve_model("qwen2.5-0.5b-instruct")
L40S = resolve_gpu("l40s")


@pytest.fixture
def cal_path(tmp_path, monkeypatch):
    path = tmp_path / "cal" / "speed_calibration.json"
    monkeypatch.setenv(calibration.ENV, str(path))
    return path


def test_default_path_is_isolated_in_tests(cal_path):
    assert calibration.calibration_path() == cal_path
    assert calibration.for_gpu(L40S) is None
    assert predict_throughput(MODEL, Plan(), L40S).source == "predicted"


def test_one_probe_replaces_the_prediction_for_its_plan_and_labels_it(cal_path):
    plan = Plan(method="lora", micro_batch=4, seq_len=256)
    before = predict_throughput(MODEL, plan, L40S)
    measured = before.tokens_per_s * 0.6  # the GPU ran slower than predicted
    cal = calibration.record_probe(MODEL, plan, L40S, measured)
    assert cal.probes == 1 and cal.label == "calibrated (1 probe)"
    after = predict_throughput(MODEL, plan, L40S)
    assert after.source == "calibrated (1 probe)"
    assert after.tokens_per_s == pytest.approx(measured, rel=1e-6)  # no link terms: one scale explains it
    # other plans on the same GPU model move by the same scale; other GPU models do not
    other = Plan(method="lora", micro_batch=8, seq_len=1024)
    assert predict_throughput(MODEL, other, L40S, calibrated=False).tokens_per_s * 0.6 == pytest.approx(
        predict_throughput(MODEL, other, L40S).tokens_per_s, rel=1e-6)
    assert predict_throughput(MODEL, plan, resolve_gpu("a100-80gb")).source == "predicted"
    stored = json.loads(cal_path.read_text())
    assert list(stored) == ["l40s"] and len(stored["l40s"]["points"]) == 1


def test_three_probes_refit_gpu_and_host_scales(cal_path):
    a, b = 1.3, 2.5  # what the "GPU" really does: kernels 30% slower, host overhead 2.5x
    plans = [Plan(method="lora", micro_batch=1, seq_len=128), Plan(method="lora", micro_batch=8, seq_len=2048),
             Plan(method="full", micro_batch=2, seq_len=512, grad_accum=2)]
    for plan in plans:
        parts = {"gpu": 0.0, "cpu": 0.0, "link": 0.0}
        for sec, kind in step_terms(MODEL, plan, L40S).values():
            parts[kind] += sec
        step = a * parts["gpu"] + b * parts["cpu"] + parts["link"]
        cal = calibration.record_probe(MODEL, plan, L40S, plan.tokens_per_step / step)
    assert cal.probes == 3 and cal.label == "calibrated (3 probes)"
    assert cal.gpu_scale == pytest.approx(a, rel=1e-6) and cal.cpu_scale == pytest.approx(b, rel=1e-6)
    new = Plan(method="qlora", quantization="nf4", micro_batch=2, seq_len=1024)
    assert predict_throughput(MODEL, new, L40S).source == "calibrated (3 probes)"


def test_a_probe_on_an_uncatalogued_gpu_is_keyed_by_its_name(cal_path):
    from dataclasses import replace

    odd = replace(L40S, key="detected", name="NVIDIA Mystery GPU", detected=True)
    calibration.record_probe(MODEL, Plan(), odd, 1000.0)
    assert calibration.for_gpu(odd).gpu == "NVIDIA Mystery GPU"
    assert calibration.for_gpu(L40S) is None


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), None])
def test_a_probe_without_a_rate_is_refused(cal_path, bad):
    with pytest.raises(ValueError):
        calibration.record_probe(MODEL, Plan(), L40S, bad)
    assert not cal_path.exists()
