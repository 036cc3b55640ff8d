"""Pre-flight of a vision-language run: the worst sample the pixel budget lets through (each image at max_pixels),
and the largest max_pixels whose step fits (advisor.diagnosis.preflight._vision)."""

from __future__ import annotations

from advisor.core.catalog import resolve_model
from advisor.core.fit import HEADROOM, fit_verdict
from advisor.core.plan import Plan
from advisor.core.units import parse_budget
from advisor.diagnosis.preflight._vision import _run_peak, largest_sample, pixel_budget_findings

QWEN = resolve_model("qwen2-vl-2b")
BUDGET = parse_budget("24GB")
PLAN = Plan(method="lora", seq_len=1024, gradient_checkpointing=True)


def test_the_default_pixel_budget_lets_one_image_exceed_the_budget():
    (f,) = pixel_budget_findings(QWEN, PLAN, None, BUDGET, HEADROOM)
    assert f.severity == "warning" and f.data["max_pixels"] == 12845056 and f.data["image_tokens"] == 16384
    fits_at = f.data["largest_max_pixels_that_fits"]
    assert fits_at and f"{fits_at:,}" in f.fixes[0]
    # the bisection's answer fits, and a budget a tenth larger does not
    assert fit_verdict(_run_peak(QWEN, largest_sample(PLAN, fits_at), None), BUDGET.bytes, HEADROOM) != "over"
    assert fit_verdict(_run_peak(QWEN, largest_sample(PLAN, int(fits_at * 1.1)), None), BUDGET.bytes,
                       HEADROOM) == "over"


def test_a_pixel_budget_that_fits_is_ok_and_fixed_size_processors_are_not_checked():
    (f,) = pixel_budget_findings(QWEN, PLAN.with_(max_pixels=401408), None, BUDGET, HEADROOM)
    assert f.severity == "ok" and "the plan's max_pixels 401,408" in f.title
    assert pixel_budget_findings(resolve_model("gemma-3-4b-it"), PLAN, None, BUDGET, HEADROOM) == []  # 896 square
    assert pixel_budget_findings(resolve_model("qwen0.5b"), PLAN, None, BUDGET, HEADROOM) == []
