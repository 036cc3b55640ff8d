"""Pre-flight of a vision-language run: the worst sample the pixel budget lets through (each image at max_pixels),
and the largest max_pixels whose step fits (advisor.diagnosis.preflight._vision)."""

from __future__ import annotations

import pytest

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
    assert fit_verdict(_run_peak(QWEN, largest_sample(PLAN, fits_at, QWEN), None), BUDGET.bytes, HEADROOM) != "over"
    assert fit_verdict(_run_peak(QWEN, largest_sample(PLAN, int(fits_at * 1.1), QWEN), None), BUDGET.bytes,
                       HEADROOM) == "over"


def test_a_pixel_budget_that_fits_is_ok_and_fixed_size_processors_are_not_checked():
    (f,) = pixel_budget_findings(QWEN, PLAN.with_(max_pixels=401408), None, BUDGET, HEADROOM)
    assert f.severity == "ok" and "the plan's max_pixels 401,408" in f.title
    assert pixel_budget_findings(resolve_model("gemma-3-4b-it"), PLAN, None, BUDGET, HEADROOM) == []  # 896 square
    assert pixel_budget_findings(resolve_model("qwen0.5b"), PLAN, None, BUDGET, HEADROOM) == []


def test_the_largest_sample_a_budget_lets_through_has_every_token_it_allows():
    """A square of ``max_pixels`` is rounded to fewer cells by smart_resize; the largest sample has the most whole
    28-pixel cells within the budget: a 1280x720 image's own budget (937,664 pixels) gives back its 1,196 tokens."""
    from advisor.core.vision_tokens import count_sample, planned_pixel_budget

    vl7b = resolve_model("qwen2.5-vl-7b")
    planned = Plan(method="lora", image_sizes=("1280x720",))
    budget = planned_pixel_budget(vl7b, planned)
    assert budget == 1288 * 728
    tokens = count_sample(vl7b, planned).text_tokens
    assert count_sample(vl7b, largest_sample(Plan(method="lora"), budget, vl7b)).text_tokens == tokens == 1196
    assert planned_pixel_budget(vl7b, planned.with_(max_pixels=401408)) is None  # the plan's own budget stands


@pytest.mark.slow  # two pre-flights of a Qwen2.5-VL-7B export: 2.5 s
def test_an_exported_vision_answer_bounds_its_images_and_preflight_plans_that_bound(tmp_path, capsys):
    """Issue 41: the VL export left the processor's default max_pixels (12.8M: 16,384 tokens an image), so preflight
    warned of a 116 GiB step, and planned its headline peak on text alone (13.03 GiB against the tune's 20.57 GiB).
    The export bounds each image at the planned one's pixels; preflight plans the largest image that bound lets
    through: the tune's peak."""
    import json

    from advisor.cli import main
    from advisor.configs.export import export_plan
    from advisor.runtime.phases import run_report

    vl7b, gpu = resolve_model("qwen2.5-vl-7b"), "rtx-4090"
    from advisor.core.catalog import resolve_gpu

    plan = Plan(method="qlora", quantization="nf4", image_sizes=("1280x720",), loss="fused-linear")
    peak = run_report(vl7b, plan, resolve_gpu(gpu)).run_peak_bytes
    export_plan(vl7b, plan, tmp_path, ["advisor", "trl", "llamafactory"], gpu=resolve_gpu(gpu))
    assert "max_pixels: 937664" in (tmp_path / "advisor.yaml").read_text()
    assert "image_max_pixels: 937664" in (tmp_path / "llamafactory.yaml").read_text()
    for name in ("advisor.yaml", "trl.yaml"):
        assert main(["preflight", str(tmp_path / name), "--gpu", gpu, "--gpu-budget", "24GB", "--backend",
                     "estimate", "--json"]) == 0
        found = {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
        assert found["memory.fit"]["data"]["peak_bytes"] == peak, name
        assert found["vision.pixel-budget"]["severity"] == "ok" and found["vision.pixel-budget"]["data"][
            "peak_bytes"] == peak
