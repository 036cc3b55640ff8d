"""Writing a trial's plan with advisor.configs.export.export_plan, from the study's stored description."""

from __future__ import annotations

from typing import Any

from advisor.search.description import StudyDescription, gpu_from_dict, model_from_dict
from advisor.search.select import TrialRecord


def exporter_unavailable() -> str:
    """Why exporting cannot work in this installation ("" when advisor.configs.export imports)."""
    try:
        from advisor.configs.export import export_plan  # noqa: F401
    except ImportError as e:
        return f"Export is not available: advisor.configs.export could not be imported ({e})."
    return ""


def export_record(description: StudyDescription | dict[str, Any], record: TrialRecord, out_dir: str,
                  formats: list[str] | None, study_name: str, *, model=None, gpu=None) -> dict:
    """Write ``record``'s plan into ``out_dir``; {format: path} (``.skipped``: formats that cannot express it).

    The model and GPU come from the study's description (advisor.search.description: the one way a stored
    spec is rebuilt), unless given. Used by the TUI and by `advisor export`."""
    from advisor.configs.export import export_plan
    from advisor.core.plan import Plan

    if model is None or gpu is None:
        if isinstance(description, StudyDescription):
            model, gpu = model or description.model, gpu or description.gpu
        else:
            model = model or model_from_dict(description["model"])
            if gpu is None and description.get("gpu"):
                gpu = gpu_from_dict(description["gpu"])
    extra = {"peak_bytes": record.peak_bytes, "source": record.source, "tokens_per_s": record.tokens_per_s,
             "study": study_name, "trial": record.number}
    return export_plan(model, Plan.from_dict(record.plan), out_dir, formats, gpu=gpu, extra=extra)
