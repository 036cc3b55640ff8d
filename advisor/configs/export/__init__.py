"""Exporters: a Plan written as files that other tools run.

Each format is declared once in advisor.configs.formats (its file, writer, reader, what it needs beside it);
one module per format (in advisor.configs, each both writing and reading its format) holds its writer
(``write(ctx, out_dir) -> Path``). ``EXPORTERS`` and ``FILENAMES`` are views of those declarations.

The inverse, reading any of these back into a Plan, is ``advisor.configs.read.read_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterable

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.configs import _advisor_yaml
from advisor.configs._base import ExportContext, Unsupported, Writer
from advisor.configs.formats import FORMATS, exported, resolve

__all__ = ["EXPORTERS", "FILENAMES", "ExportResult", "ExportContext", "Unsupported", "export_plan", "export_sections"]


class _View(Mapping):
    """{format: one field of its declaration}, for the formats written, read live from advisor.configs.formats."""

    def __init__(self, pick):
        self._pick = pick

    def __getitem__(self, name: str):
        return self._pick(exported()[name])

    def __iter__(self):
        return iter(exported())

    def __len__(self) -> int:
        return len(exported())


EXPORTERS: Mapping[str, Writer] = _View(lambda f: resolve(f.writer))
FILENAMES: Mapping[str, str] = _View(lambda f: f.filename)


class ExportResult(dict):
    """{format: path written}; ``skipped`` holds {format: why} for formats that cannot express the plan."""

    def __init__(self, written: dict[str, Path], skipped: dict[str, str]):
        super().__init__(written)
        self.skipped = skipped


def _context(spec, plan, gpu, extra, gpus: int, sharding: str | None, out_dir: Path | None) -> ExportContext:
    from advisor.memory.sharding import DEFAULT_SHARDING, STRATEGIES

    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise AdvisorInputError("--gpus", "must be a whole number of at least 1", gpus)
    sharding = sharding or DEFAULT_SHARDING
    if sharding not in STRATEGIES:
        raise AdvisorInputError("--sharding", f"must be one of {', '.join(STRATEGIES)}", sharding)
    return ExportContext(spec, plan, gpu, dict(extra or {}), gpus, sharding, out_dir)


def export_sections(spec, plan, *, gpu=None, extra: dict[str, Any] | None = None, gpus: int = 1,
                    sharding: str | None = None, out_dir=None) -> dict[str, Any]:
    """advisor.yaml's content as a dict, without writing anything (for --json output, the TUI); ``out_dir``: the
    folder its paths name (None: the files by their bare names)."""
    out = Path(out_dir).resolve() if out_dir is not None else None
    return _advisor_yaml.sections(_context(spec, plan.validate(), gpu, extra, gpus, sharding, out))


def export_plan(spec, plan, out_dir, formats: Iterable[str] | None = None, *, gpu=None,
                extra: dict[str, Any] | None = None, gpus: int = 1, sharding: str | None = None) -> ExportResult:
    """Write ``plan`` for ``spec`` into ``out_dir`` in the given formats (default: every one).

    With ``formats=None`` a format that cannot express the plan (say, axolotl for a mixed_bf16 plan,
    deepspeed.json for a plan without offload) is skipped and listed in ``result.skipped``; a format
    asked for by name that cannot express it raises, all such formats in one ConfigErrors.
    Files another needs come along: train → advisor.yaml; a plan under DeepSpeed → deepspeed.json.
    ``gpus`` and ``sharding`` (advisor.memory.sharding; default ZeRO-3) are the run's: each file launches one
    process per GPU and names the DeepSpeed or FSDP config the sharding needs, by absolute path.
    """
    plan = plan.validate()
    from advisor.core.adapters import expert_problems

    from advisor.memory.sharding import gpu_count_problems, server_gpus

    # LoRA on stacked experts of a model that has none; what needs the run's GPU count (FSDP's CPU offload...):
    # ``gpus`` are the processes that train, a vLLM server's GPUs beside them
    problems = expert_problems(spec, plan) + gpu_count_problems(plan, gpus + server_gpus(plan))
    if problems:
        raise problems[0]
    explicit = formats is not None
    wanted = list(EXPORTERS) if formats is None else list(dict.fromkeys(formats))
    unknown = [f for f in wanted if f not in EXPORTERS]
    if unknown:
        raise AdvisorInputError("--format", f"unknown format(s) {', '.join(unknown)}; known: {', '.join(EXPORTERS)}",
                                unknown, show_value=False)
    for fmt in list(wanted):
        for dep in FORMATS[fmt].needs:
            if dep not in wanted:
                wanted.insert(0, dep)
    out = Path(out_dir)
    ctx = _context(spec, plan, gpu, extra, gpus, sharding, out.resolve())
    if ctx.zero_stage is not None and "deepspeed" not in wanted and any(FORMATS[f].names_deepspeed for f in wanted):
        wanted.append("deepspeed")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    errors: list[AdvisorInputError] = []
    for fmt in wanted:
        try:
            written[fmt] = EXPORTERS[fmt](ctx, out)
        except Unsupported as e:
            if explicit:
                errors.append(e)
            else:
                skipped[fmt] = e.rule
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return ExportResult(written, skipped)
