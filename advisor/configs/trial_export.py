"""One trial of a study written as the files other tools run: its plan, and beside it what the study
predicted (peak, its source, tokens/s, the study and the trial), in advisor.yaml's ``prediction``.

`advisor export`, `advisor tune --export` and the TUI's export key all write a trial through this.
"""

from __future__ import annotations

from pathlib import Path

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.search.select import TrialRecord, peak_phase


def export_trial(record: TrialRecord, out_dir: str | Path, formats: list[str] | None, *, model: ModelSpec,
                 gpu: GpuSpec | None, study_name: str, gpus: int = 1, sharding: str | None = None) -> dict:
    """Write ``record``'s plan into ``out_dir``; {format: path} (``.skipped``: formats that cannot express it).
    ``model``, ``gpu``, ``gpus`` and ``sharding`` are the study's (advisor.search.description.StudyDescription):
    the files launch one process per GPU with the sharding's DeepSpeed or FSDP config."""
    from advisor.configs.export import export_plan
    from advisor.core.plan import Plan

    # the run's peak (the highest phase: what train.py compares with torch's max_memory_reserved), and the step's
    # beside it where another phase sets the run's
    prediction = {"peak_bytes": record.run_peak_bytes or record.peak_bytes, "source": record.source,
                  "tokens_per_s": record.tokens_per_s, "study": study_name, "trial": record.number}
    if peak_phase(record):
        prediction.update(peak_phase=peak_phase(record), step_peak_bytes=record.peak_bytes)
    from advisor.memory.sharding import train_gpus

    plan = Plan.from_dict(record.plan)
    # the study's --gpus count a vLLM server's; the files launch the processes that train, the server beside them
    return export_plan(model, plan, out_dir, formats, gpu=gpu, extra=prediction, gpus=train_gpus(gpus, plan),
                       sharding=sharding)


__all__ = ["export_trial"]
