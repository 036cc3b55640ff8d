"""Vision-language checks of a preflight: the largest image the processor's pixel budget lets into one sample, and
whether the step with it fits.

A config names no image sizes (they are the data's), so the check plans the worst sample the pixel budget allows:
each of the sample's images (one where the plan names none) at ``max_pixels``, the processor resizing it within
``[min_pixels, max_pixels]`` (Qwen's ``smart_resize``: a default of 12,845,056 pixels is 16,384 tokens an image).
Where that step does not fit, the finding gives the largest ``max_pixels`` that does (bisection on the closed form,
held within 3% of the simulation: tests/test_vision_ledger.py). Calculation only: findings, rendered by the CLI.
"""

from __future__ import annotations

from math import isqrt

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.fit import fit_verdict
from advisor.core.plan import Plan
from advisor.core.units import Budget
from advisor.core.vision_tokens import pixel_budget
from advisor.diagnosis.findings import Finding

BISECTION_STEPS = 12
"""Halvings of the pixel interval searched for the largest budget that fits (12: within 1/4096 of the interval)."""




def largest_sample(plan: Plan, max_pixels: int, model: ModelSpec) -> Plan:
    """``plan`` with each of its sample's images (one where it names none) the largest the budget lets through: the
    most whole ``factor`` x ``factor`` cells (patch x merge, 28 pixels for Qwen2.5-VL; one cell a token) within
    ``max_pixels``, the squarest grid of that many (a square of ``max_pixels`` is rounded to fewer cells by
    smart_resize: 1,156 tokens where a 1288x728 image of 937,664 pixels has 1,196)."""
    image = (model.processor or {}).get("image") or {}
    factor = int(image.get("patch_size", 14)) * int(image.get("merge_size", 2))
    cells = max(1, max_pixels // (factor * factor))
    # the most cells in a rows x columns grid, columns at most 200 times the rows (smart_resize's aspect limit)
    rows = max((r for r in range(isqrt(cells), 0, -1) if cells // r <= 200 * r), key=lambda r: r * (cells // r))
    size = f"{cells // rows * factor}x{rows * factor}"
    return plan.with_(image_sizes=(size,) * max(1, len(plan.image_sizes)), max_pixels=max_pixels)


def _run_peak(model: ModelSpec, plan: Plan, gpu: GpuSpec | None) -> int:
    from advisor.runtime.phases import run_report

    return run_report(model, plan, gpu).run_peak_bytes


def pixel_budget_findings(model: ModelSpec, plan: Plan, gpu: GpuSpec | None, budget: Budget | None,
                          headroom: float) -> list[Finding]:
    """One finding: the worst sample the pixel budget allows fits (ok), or does not (warning, with the largest
    ``max_pixels`` that fits)."""
    settings = pixel_budget(model)
    if settings is None or budget is None:
        return []
    from advisor.core.vision_tokens import count_sample

    limit = int(plan.max_pixels or settings["max_pixels"])
    worst = largest_sample(plan, limit, model)
    tokens = count_sample(model, worst).text_tokens
    peak = _run_peak(model, worst, gpu)
    where = "the plan's" if plan.max_pixels else "the processor's default"
    data = {"max_pixels": limit, "image_tokens": tokens, "peak_bytes": peak, "budget_bytes": budget.bytes}
    if fit_verdict(peak, budget.bytes, headroom) != "over":
        return [Finding("vision.pixel-budget", "ok", f"the largest image {where} max_pixels {limit:,} lets through "
                        f"({tokens:,} tokens a sample) fits: peak {budget.format(peak)} of {budget}", "", (),
                        "memory", data)]
    lo, hi = int(settings.get("min_pixels") or 1), limit
    if fit_verdict(_run_peak(model, largest_sample(plan, lo, model), gpu), budget.bytes, headroom) == "over":
        fits_at = None
    else:
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) // 2
            if fit_verdict(_run_peak(model, largest_sample(plan, mid, model), gpu), budget.bytes, headroom) == "over":
                hi = mid
            else:
                lo = mid
        fits_at = lo
    data["largest_max_pixels_that_fits"] = fits_at
    fixes = ((f"set max_pixels to {fits_at:,} or less for training (LLaMA-Factory image_max_pixels, ms-swift "
              "MAX_PIXELS, the processor's max_pixels), or resize the dataset's images",) if fits_at else
             ("no pixel budget fits this plan with an image: lower the batch or the text length, or train less",))
    return [Finding("vision.pixel-budget", "warning",
                    f"one large image can exceed the budget: {where} max_pixels {limit:,} lets an image become "
                    f"{tokens:,} tokens, and that step peaks at {budget.format(peak)} > {budget}",
                    "the config fits its text; the step that OOMs is the one with the largest sample of a batch",
                    fixes + ("plan on the largest image: advisor estimate --image-size WxH",), "memory", data)]
