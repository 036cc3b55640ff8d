"""A study's description, typed: what `advisor tune` was asked and for what, stored with the study.

It travels as JSON in the Optuna study's user attribute "advisor" (``to_dict`` / ``from_dict``, a
tested round trip), and every reader rebuilds the model, GPU, budget and space from it in this one
way: the tuner (and a worker joining the study), `advisor export`, `advisor report` and the TUI.
Studies written before this type existed (missing task, gpus, sharding, weights; older ModelSpec / GpuSpec
fields) still load. A study written before the host budget existed loads with ``host_budget`` None: its
host memory is not checked, by the tuner resuming it, the selection, the report or the TUI (its trials were
chosen without the host rule; a budget detected on whichever machine reads it would re-decide them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.fit import HEADROOM
from advisor.core.target import Target
from advisor.core.units import Budget
from advisor.memory.sharding import DEFAULT_SHARDING
from advisor.search.select import ACCURACY_TOLERANCE, Rules
from advisor.search.space import DEFAULT_TRIALS, SearchSpace

ATTR = "advisor"
"""The Optuna study user attribute holding the description."""


@dataclass(frozen=True)
class StudyDescription:
    """What one study searches: the target, the space, the backend and the selection settings."""

    model: ModelSpec
    """The model (the whole spec, so a reader needs no catalog, hub or network)."""
    gpu: GpuSpec
    """The GPU throughput is predicted for (named, detected, or assumed from the budget)."""
    budget: Budget
    """The memory budget per GPU."""
    space: SearchSpace
    """The resolved search space (overrides applied)."""
    backend: str
    """estimate, simulate, cpu or cuda: the last stage of each trial."""
    gpu_assumed: bool = False
    """No GPU was named or detected: ``gpu`` was assumed from the budget."""
    headroom: float = HEADROOM
    """Fraction of the budget kept free (advisor.core.fit)."""
    tolerance: float = ACCURACY_TOLERANCE
    """Largest accuracy loss accepted (nats/token of excess held-out loss: advisor/data/quality.yaml)."""
    seed: int = 0
    """Sampler seed."""
    trials: int = DEFAULT_TRIALS
    """Finished trials the study aims for."""
    task: str = "train"
    """train (fine-tuning plans); the inference search keeps no study."""
    gpus: int = 1
    """Data-parallel GPUs of the target run (the budget is per GPU)."""
    sharding: str = DEFAULT_SHARDING
    """How model state is split across ``gpus`` (advisor.memory.sharding)."""
    regime: str | None = None
    """What the fine-tune is, for the quality model (sft, domain, cpt; None: its default, sft)."""
    weights: str | None = None
    """Directory of the model's real weights (--weights) the finalists trained from; None: not given."""
    versions: dict[str, Any] = field(default_factory=dict, compare=False)
    """Library versions when the study was made."""
    environment: dict[str, Any] = field(default_factory=dict, compare=False)
    """GPU driver and CUDA when the study was made."""
    host_budget: Budget | None = None
    """The RAM of the machine the run is for (--host-budget, or detected where the study was made); None: host
    memory not checked (studies made before it existed)."""
    host_detected: bool = False
    """``host_budget`` was detected rather than given."""

    @property
    def target(self) -> Target:
        return Target(model=self.model, gpu=self.gpu, budget=self.budget, gpu_assumed=self.gpu_assumed,
                      host_budget=self.host_budget, host_detected=self.host_detected)

    @property
    def host_budget_bytes(self) -> int | None:
        return self.host_budget.bytes if self.host_budget is not None else None

    @property
    def rules(self) -> Rules:
        """How the study's answer is chosen beside the budget (advisor.search.select.Rules)."""
        return Rules(regime=self.regime, global_batch=self.space.fixed.get("global_batch"),
                     host_budget_bytes=self.host_budget_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored with the study (the keys studies have always had, plus task)."""
        return {"model": self.model.to_dict(), "gpu": self.gpu.to_dict(), "gpu_assumed": self.gpu_assumed,
                "budget": {"bytes": self.budget.bytes, "text": self.budget.text, "unit": self.budget.unit},
                "space": self.space.to_dict(), "backend": self.backend, "headroom": self.headroom,
                "tolerance": self.tolerance, "seed": self.seed, "trials": self.trials, "task": self.task,
                "gpus": self.gpus, "sharding": self.sharding, "regime": self.regime, "weights": self.weights, "versions": dict(self.versions),
                "environment": dict(self.environment),
                "host_budget": None if self.host_budget is None else {
                    "bytes": self.host_budget.bytes, "text": self.host_budget.text, "unit": self.host_budget.unit,
                    "detected": self.host_detected}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StudyDescription":
        """The description from its stored JSON (this version's or an older study's)."""
        b = d["budget"]
        hb = d.get("host_budget")
        space = _space(d["space"])
        return cls(model=model_from_dict(d["model"]), gpu=gpu_from_dict(d["gpu"]),
                   budget=_budget(b),
                   space=space, backend=d.get("backend", "estimate"), gpu_assumed=bool(d.get("gpu_assumed", False)),
                   headroom=float(d.get("headroom", HEADROOM)), tolerance=float(d.get("tolerance", ACCURACY_TOLERANCE)),
                   seed=int(d.get("seed", 0)), trials=int(d.get("trials") or space.trials),
                   task=d.get("task", "train"), gpus=int(d.get("gpus", 1)), sharding=d.get("sharding", DEFAULT_SHARDING),
                   regime=d.get("regime"), weights=d.get("weights"), versions=dict(d.get("versions") or {}),
                   environment=dict(d.get("environment") or {}),
                   host_budget=_budget(hb) if hb else None, host_detected=bool((hb or {}).get("detected", False)))


def _budget(b: dict[str, Any]) -> Budget:
    return Budget(int(b["bytes"]), b.get("unit") or "GiB", b.get("text") or f"{b['bytes']}B")


def _known(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def model_from_dict(m: dict[str, Any]) -> ModelSpec:
    """The stored spec; one from an older version missing a field is resolved again by its path or name."""
    try:
        return ModelSpec(**_known(ModelSpec, m))
    except TypeError:
        from advisor.core.catalog import resolve_model

        return resolve_model(m.get("path") or m["name"])


def gpu_from_dict(g: dict[str, Any]) -> GpuSpec:
    try:
        return GpuSpec(**_known(GpuSpec, g))
    except TypeError:
        from advisor.core.catalog import resolve_gpu

        return resolve_gpu(g.get("key") or g["name"])


def _space(sp: dict[str, Any]) -> SearchSpace:
    return SearchSpace(name=sp["name"], trials=int(sp.get("trials", DEFAULT_TRIALS)), fixed=dict(sp["fixed"]),
                       search={k: list(v) for k, v in sp["search"].items()}, source=sp.get("source", ""),
                       overrides=tuple(sp.get("overrides", ())))


__all__ = ["ATTR", "StudyDescription", "gpu_from_dict", "model_from_dict"]
