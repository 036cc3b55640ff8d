"""Writing a trial's plan with advisor.configs.export.export_plan, from the study's stored description."""

from __future__ import annotations

from typing import Any

from advisor.search.select import TrialRecord


def exporter_unavailable() -> str:
    """Why exporting cannot work in this installation ("" when advisor.configs.export imports)."""
    try:
        from advisor.configs.export import export_plan  # noqa: F401
    except ImportError as e:
        return f"Export is not available: advisor.configs.export could not be imported ({e})."
    return ""


def export_record(description: dict[str, Any], record: TrialRecord, out_dir: str, formats: list[str] | None,
                  study_name: str, *, model=None, gpu=None) -> dict:
    """Write ``record``'s plan into ``out_dir``; {format: path} (``.skipped``: formats that cannot express it)."""
    from advisor.core.catalog import GpuSpec, ModelSpec
    from advisor.configs.export import export_plan
    from advisor.core.plan import Plan

    model = model or ModelSpec(**description["model"])
    if gpu is None and description.get("gpu"):
        gpu = GpuSpec(**description["gpu"])
    extra = {"peak_bytes": record.peak_bytes, "source": record.source, "tokens_per_s": record.tokens_per_s,
             "study": study_name, "trial": record.number}
    return export_plan(model, Plan.from_dict(record.plan), out_dir, formats, gpu=gpu, extra=extra)
