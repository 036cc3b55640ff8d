"""The settings of a study: what `advisor tune` was asked and how this run of it goes, each declared once.

Every field of ``TuneSettings`` is declared with ``setting(...)`` (advisor.search.setting): its tune flag,
help and default, how the flags resolve into it, the key it is stored under in the study's JSON, and
whether it changes the answer. The tune command's flags, the stored description (``StudyDescription``,
advisor.search.description) and its JSON, the default study name and the check that a resumed study asks
the same question all derive from these declarations. To add a setting: one ``setting(...)`` field here.

The settings are frozen once resolved (``TuneSettings.from_flags``): a study resumed with a detected host
budget takes the stored one when the settings are made, not by changing them later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Mapping

from advisor.core.card_rules import Card
from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import HEADROOM
from advisor.core.knobs import Range
from advisor.core.target import Target
from advisor.core.units import Budget
from advisor.core.versions import gpu_environment, library_versions
from advisor.memory.sharding import DEFAULT_SHARDING, STRATEGIES
from advisor.runtime.backends import BACKENDS, BackendOptions
from advisor.search.select import ACCURACY_TOLERANCE, Rules
from advisor.search.setting import (NO_DEFAULT, Described, description_type, first_difference, identity_hash,
                                    setting, settings_of)
from advisor.search.space import DEFAULT_TRIALS, SearchSpace

WHOLE = Range(low=1, whole=True)

ATTR = "advisor"
"""The Optuna study user attribute holding the description."""


# --------------------------------------------------------------------------- how values are stored


def _known(cls, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def model_from_dict(m: Mapping[str, Any]) -> ModelSpec:
    """The stored spec; one from an older version missing a field is resolved again by its path or name."""
    try:
        return ModelSpec(**_known(ModelSpec, m))
    except TypeError:
        from advisor.core.catalog import resolve_model

        return resolve_model(m.get("path") or m["name"])


def gpu_from_dict(g: Mapping[str, Any]) -> GpuSpec:
    try:
        return GpuSpec(**_known(GpuSpec, g))
    except TypeError:
        from advisor.core.catalog import resolve_gpu

        return resolve_gpu(g.get("key") or g["name"])


def budget_to_dict(b: Budget) -> dict[str, Any]:
    return {"bytes": b.bytes, "text": b.text, "unit": b.unit}


def budget_from_dict(b: Mapping[str, Any]) -> Budget:
    return Budget(int(b["bytes"]), b.get("unit") or "GiB", b.get("text") or f"{b['bytes']}B")


def space_from_dict(sp: Mapping[str, Any]) -> SearchSpace:
    return SearchSpace(name=sp["name"], trials=int(sp.get("trials", DEFAULT_TRIALS)), fixed=dict(sp["fixed"]),
                       search={k: list(v) for k, v in sp["search"].items()}, source=sp.get("source", ""),
                       overrides=tuple(sp.get("overrides", ())))


def space_identity(space: SearchSpace) -> dict[str, Any]:
    """The space as a question: its knobs' values, not where it was read from or how many trials it plans."""
    return {"name": space.name, "fixed": space.fixed, "search": space.search}


def _space_shown(space: SearchSpace) -> str:
    return " ".join([space.name, *space.overrides])


def data_to_dict(d) -> dict[str, Any]:
    return {"lengths": list(d.lengths), "source": d.source, "how": d.how,
            **({"images": [list(sizes) for sizes in d.images]} if d.images else {})}


def data_from_dict(d: Mapping[str, Any]):
    from advisor.core.data_profile import DataProfile

    return DataProfile(lengths=tuple(int(n) for n in d["lengths"]), source=str(d.get("source", "")),
                       how=str(d.get("how", "given")),
                       images=tuple(tuple(str(x) for x in sizes) for sizes in d.get("images") or ()))


def _data_identity(d) -> dict[str, Any]:
    import hashlib

    out = {"documents": len(d.lengths), "lengths": hashlib.sha256(",".join(map(str, d.lengths)).encode()).hexdigest()}
    if d.images:  # a study asked again with other images is another study
        out["images"] = hashlib.sha256(";".join(",".join(sizes) for sizes in d.images).encode()).hexdigest()
    return out


# --------------------------------------------------------------------------- how the flags resolve


class Resolving:
    """The parsed tune flags while the settings are resolved from them: what several settings share (the
    target: model, GPU, budget and host budget resolved by one rule) is resolved once."""

    def __init__(self, flags: Any, overrides: tuple[str, ...] = (), settings_cls: type | None = None):
        self.flags = flags
        self.settings_cls = settings_cls or TuneSettings
        self.overrides = tuple(getattr(flags, "overrides", None) or ()) + tuple(overrides)
        self.values: dict[str, Any] = {}

    def flag(self, dest: str, default: Any = None) -> Any:
        return getattr(self.flags, dest, default)

    @cached_property
    def target(self) -> Target:
        from advisor.core.target import resolve_target

        f = self.flags
        return resolve_target(f.model, gpu=getattr(f, "gpu", None), gpu_budget=getattr(f, "gpu_budget", None),
                              trust_remote_code=getattr(f, "trust_remote_code", False),
                              host_budget=getattr(f, "host_budget", None), budget_required=True,
                              gpus=int(getattr(f, "gpus", None) or 1))  # the node's share the --gpus ranks have

    @cached_property
    def space(self) -> SearchSpace:
        from advisor.search.space import load_space

        return load_space(space_for_task(self.flag("space") or "default", self.overrides), list(self.overrides))

    @cached_property
    def data(self):
        if not self.flag("data"):
            return None
        from advisor.runtime.probe import data_profile

        profile = data_profile(self.flag("data"), self.target.model.path)
        profile.refuse_image_flag(self.flag("image_sizes"))
        given = [o.split("=", 1)[1].strip() for o in self.overrides if o.split("=", 1)[0].strip() == "doc_len"]
        profile.refuse_doc_len_flag(self.flag("doc_len") or (given[-1] if given else None))
        return profile


def space_for_task(name: str, overrides: tuple[str, ...]) -> str:
    """The space a study searches: ``--task grpo|dpo`` with the default space asks for that task's space
    (advisor/data/spaces/grpo.yaml, dpo.yaml: its levers and its workload), any other space as named."""
    from advisor.core.plan import RL_TASKS, parse_task

    tasks = [o.split("=", 1)[1].strip() for o in overrides if o.split("=", 1)[0].strip() == "task"]
    try:
        task = parse_task(tasks[-1]) if tasks else None
    except ValueError:  # argparse.ArgumentTypeError: the space's own check names the bad value
        task = None
    return task if name == "default" and task in RL_TASKS else name


def _space(r: Resolving) -> SearchSpace:
    space = r.space
    if r.data is not None and not any(o.split("=", 1)[0].strip() == "packing" for o in r.overrides):
        space = replace(space, search={**space.search, "packing": [False, True]})  # real lengths: a real trade-off
    return space


def _backend(r: Resolving) -> str:
    from advisor.runtime.backends import resolve_backend

    return resolve_backend(r.flag("backend") or "auto", r.target.detected)


def _regime(r: Resolving) -> str | None:
    regime = r.flag("regime")
    if regime is not None:
        from advisor.search.quality import quality_data

        if regime not in quality_data().regimes:
            raise AdvisorInputError("--regime", f"must be one of {', '.join(quality_data().regimes)}", regime)
    return regime


def _study_name(r: Resolving) -> str:
    return r.flag("study") or default_study_name(r.values, r.settings_cls)


def _storage(r: Resolving) -> str:
    return r.flag("storage") or default_storage(r.values["study_name"], r.flag("reports_dir") or "reports")


def _budget_shown(b: Budget) -> str:
    return b.text


# --------------------------------------------------------------------------- the settings


class _Study:
    """What the settings and their stored description both answer (from the settings they share)."""

    @property
    def target(self) -> Target:
        return Target(model=self.model, gpu=self.gpu, budget=self.budget, gpu_assumed=self.gpu_assumed,
                      host_budget=self.host_budget, host_detected=self.host_detected)

    @property
    def host_budget_bytes(self) -> int | None:
        return self.host_budget.bytes if self.host_budget is not None else None

    @property
    def rules(self) -> Rules:
        """How the answer is chosen beside the budget (advisor.search.select.Rules)."""
        return Rules(regime=self.regime, global_batch=self.space.fixed.get("global_batch"), gpus=self.gpus,
                     uniform_lengths=self.data is None, host_budget_bytes=self.host_budget_bytes)

    @property
    def card(self) -> GpuSpec | None:
        """The GPU whose rules the plans must keep (advisor.core.card_rules): named, detected, or assumed from the
        budget. An assumed card's rules hold too: the answer is planned and timed for that card, so it must run on it
        (issue 41: a bf16 answer for an assumed V100, which has no bf16)."""
        return self.gpu


@dataclass(frozen=True)
class TuneSettings(_Study):
    """One study's settings, resolved and frozen: what it answers (stored with it) and how this run goes."""

    model: ModelSpec = setting(
        help="catalog name or alias, hub id, or local directory", flag="--model", cli={"required": True},
        resolve=lambda r: r.target.model, key="model", encode=lambda m: m.to_dict(), decode=model_from_dict,
        answer=True, identity=lambda m: {"name": m.name, "hf_id": m.hf_id, "path": m.path}, shown=lambda m: m.name,
        flag_text=lambda d: d.model.hf_id or d.model.name)
    """The model (the whole spec, so a reader needs no catalog, hub or network; which model it is, not the
    catalog's figures of the day, is what the question names)."""
    gpu: GpuSpec = setting(
        help="GPU to plan for (catalog name); default: the detected one, else one the budget matches", flag="--gpu",
        resolve=lambda r: r.target.gpu, key="gpu", encode=lambda g: g.to_dict(), decode=gpu_from_dict, answer=True,
        identity=lambda g: {"key": g.key, "name": g.name, "memory_bytes": g.memory_bytes},
        shown=lambda g: g.name, flag_text=lambda d: None if d.gpu_assumed or d.gpu.key == "detected" else d.gpu.key)
    """The GPU throughput is predicted for (detected, named with --gpu, or assumed from the budget)."""
    budget: Budget = setting(
        help='memory budget per GPU: "24GB", "24 GiB", "24000MiB", "90%%" of the GPU (GB = GiB = 2^30 bytes); at '
             "most what the GPU has", flag="--gpu-budget", cli={"required": True}, resolve=lambda r: r.target.budget,
        key="budget", encode=budget_to_dict, decode=budget_from_dict, answer=True, identity=lambda b: b.bytes,
        shown=_budget_shown, flag_text=lambda d: d.budget.text)
    """The memory budget per GPU."""
    space: SearchSpace = setting(
        help="search space: a built-in name (advisor/data/spaces/) or a YAML file", flag="--space",
        cli={"default": "default"}, resolve=_space, key="space", encode=lambda s: s.to_dict(), decode=space_from_dict,
        answer=True, identity=space_identity, shown=_space_shown, flag_text=lambda d: d.space.name)
    """The resolved search space (overrides and fixed plan flags applied; ``auto`` choices the card's)."""
    gpu_assumed: bool = setting(
        False, help="no GPU was named or detected: ``gpu`` was assumed from the budget",
        resolve=lambda r: r.target.gpu_assumed, key="gpu_assumed", missing=False, answer=True,
        shown=lambda v: "assumed" if v else "named or detected")
    data: Any = setting(
        None, help="your training documents (JSONL with \"text\", text, or one token length per line): memory at "
                   "the longest batch unless packed, tokens/s in real tokens; adds packing to the search",
        flag="--data", cli={"metavar": "FILE"}, resolve=lambda r: r.data, key="data", encode=data_to_dict,
        decode=data_from_dict,
        answer=True, identity=_data_identity, shown=lambda d: f"{d.source} ({len(d.lengths)} documents)",
        flag_text=lambda d: d.data.source if d.data is not None else None)
    """The user's documents (advisor.core.data_profile.DataProfile): memory at the longest batch unless packed,
    tokens/s in real tokens. None: every sequence is seq_len tokens."""
    backend: str = setting(
        "auto", help="last stage of each trial; auto: cuda with a GPU, else simulate", flag="--backend",
        cli={"choices": ("auto", *BACKENDS), "default": "auto"}, resolve=_backend, key="backend", missing="estimate",
        answer=True, shown=str)
    """estimate, simulate, cpu or cuda: the last stage each trial goes through."""
    trials: int = setting(
        DEFAULT_TRIALS, help="finished trials to reach (default: the space's)", flag="--trials",
        cli={"range": WHOLE}, resolve=lambda r: r.flag("trials") or r.values["space"].trials, key="trials",
        missing=lambda d: int(d["space"].get("trials", DEFAULT_TRIALS)))
    """Finished trials the study aims for (a rerun with more continues it)."""
    headroom: float = setting(
        HEADROOM, help="fraction of the budget kept free", flag="--headroom", cli={"range": Range(low=0, high=1)},
        key="headroom", decode=float, answer=True, shown=lambda v: f"{v:g}")
    """Fraction of the budget kept free (advisor.core.fit)."""
    tolerance: float = setting(
        ACCURACY_TOLERANCE, help="largest accuracy loss accepted (KL nats/token; priors: int8 0.002, nf4 0.015, "
                                 "fp4 0.035)", flag="--accuracy-tolerance", cli={"range": Range(low=0)},
        key="tolerance", decode=float, answer=True, shown=lambda v: f"{v:g}")
    """Largest accuracy loss accepted (nats/token of excess held-out loss: advisor/data/quality.yaml)."""
    regime: str | None = setting(
        None, help="what the fine-tune is, for the quality model: sft (instruction or chat tuning, the default), "
                   "domain (code or math on ~100M+ tokens) or cpt (continued pre-training); advisor/data/quality.yaml",
        flag="--regime", resolve=_regime, key="regime", answer=True, shown=str)
    """What the fine-tune is, for the quality model (sft, domain, cpt; None: its default, sft)."""
    seed: int = setting(0, help="sampler seed (of the trials still to run)", flag="--seed", cli={"type": int},
                        key="seed", decode=int)
    """Sampler seed."""
    gpus: int = setting(1, help="data-parallel GPUs of the run (the budget is per GPU)", flag="--gpus",
                        cli={"range": WHOLE}, key="gpus", decode=int, answer=True, shown=str)
    """Data-parallel GPUs of the target run (the budget is per GPU)."""
    sharding: str = setting(
        DEFAULT_SHARDING, help="how model state is split across --gpus (ZeRO-2/3, FSDP full shard, or replicated)",
        flag="--sharding", cli={"choices": STRATEGIES}, key="sharding", answer=True, shown=str)
    """How model state is split across ``gpus`` (advisor.memory.sharding)."""
    host_budget: Budget | None = setting(
        None, help='host memory (RAM) of the machine the run is for: "64GB", "64 GiB" or "50%%" of this machine\'s '
                   "RAM (GB = GiB = 2^30 bytes); default: this machine's RAM as detected (psutil, or its container's "
                   "limit). A plan fits when its host peak (pinned and pageable) fits it less the OS reserve",
        flag="--host-budget", resolve=lambda r: r.target.host_budget, key="host_budget", encode=budget_to_dict,
        decode=budget_from_dict, answer=True, identity=lambda b: b.bytes, yields="host_detected", shown=_budget_shown,
        flag_text=lambda d: None if d.host_budget is None or d.host_detected else d.host_budget.text)
    """The RAM of the machine the run is for (--host-budget, else detected); None: host memory not checked (a
    study made before host budgets)."""
    host_detected: bool = setting(False, help="``host_budget`` was detected on this machine rather than given",
                                  resolve=lambda r: r.target.host_detected, key="host_budget.detected")
    weights: str | None = setting(
        None, help="real weights of --model (safetensors / bin): with --data and --backend cuda (or cpu for small "
                   "models), the finalists train a short run each and their measured loss replaces the quality prior",
        flag="--weights", cli={"metavar": "DIR"}, key="weights", answer=True, shown=str)
    """Directory of the model's real weights: with ``data`` and a cpu or cuda backend, the finalists train a
    short run each from them (advisor.search.finalists)."""
    quality_tokens: int | None = setting(
        None, help="training tokens of each finalist's quality run (default: 30 optimizer steps of the largest "
                   "step; rounded up to whole steps of every finalist)", flag="--quality-tokens",
        cli={"range": WHOLE, "metavar": "N"}, key="quality_tokens", answer=True, shown=str)
    """Training tokens of each finalist's run (None: advisor.search.finalists.STEPS steps of the largest step)."""
    task: str = setting("train", help="train (fine-tuning plans); the inference search keeps no study", key="task")
    probe_steps: int = setting(3, help="measured steps per probe", flag="--probe-steps", cli={"range": WHOLE})
    """Measured optimizer steps of each cpu / cuda probe."""
    heartbeat_seconds: int = setting(10, help="seconds between trial heartbeats in a shared storage",
                                     flag="--heartbeat", cli={"range": WHOLE})
    """Heartbeat of running trials in a shared (non-SQLite) storage; stale after 3 missed beats."""
    versions: dict = setting({}, help="library versions when the study was made", key="versions",
                             recorded=library_versions, decode=dict, compare=False)
    environment: dict = setting({}, help="GPU driver and CUDA when the study was made", key="environment",
                                recorded=gpu_environment, decode=dict, compare=False)
    study_name: str = setting("", help="study name (default: model-budget-space and a hash of every other setting "
                                       "that changes the answer)", flag="--study", resolve=_study_name, late=True)
    storage: str = setting("", help="Optuna storage URL (default: SQLite under --reports-dir/<study>/)",
                           flag="--storage", resolve=_storage, late=True)

    def __post_init__(self) -> None:
        # the space's `auto` choices (precision, attention) become the card's, for this model's class
        # and its global batch is split over the run's data-parallel ranks
        space = self.space.on_card(Card.of(self.card, self.model))
        object.__setattr__(self, "space", replace(space, gpus=self.gpus) if self.gpus > 1 else space)

    @property
    def probe_options(self) -> BackendOptions:
        """Options of the cpu / cuda probe (the budget is added for a cuda probe)."""
        return BackendOptions(steps=self.probe_steps)

    def description(self):
        """What the study is, typed (stored as JSON in the study's "advisor" attribute)."""
        cls = study_description_type(type(self))
        values = {}
        for s in settings_of(type(self)):
            if s.stored:
                value = getattr(self, s.name)
                values[s.name] = s.recorded() if s.recorded is not None and not value else value
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        return self.description().to_dict()

    @classmethod
    def from_description(cls, d, *, storage: str, study_name: str, backend: str | None = None,
                         heartbeat_seconds: int = 10) -> "TuneSettings":
        """The settings of a stored study (a worker joining it may run another backend)."""
        values = {s.name: getattr(d, s.name) for s in settings_of(cls) if s.stored}
        return cls(**{**values, "backend": backend or d.backend}, storage=storage, study_name=study_name,
                   heartbeat_seconds=heartbeat_seconds)

    @classmethod
    def from_flags(cls, flags: Any, overrides: tuple[str, ...] = (), stored: Mapping[str, Any] | None = None,
                   lookup=None, resolved: Mapping[str, Any] | None = None) -> "TuneSettings":
        """The settings the tune flags ask for, resolved in declaration order and frozen. ``overrides``: space
        keys set by other flags (the plan flags). ``lookup(storage, study_name)``: the stored description of the
        study they name, if there is one (advisor.search.storage.stored_attr); a study that answers another
        question is refused, naming the setting, and a guessed value (a detected host budget) takes the stored one.
        ``resolved``: settings the caller resolved itself (the command checks --weights with the finalists' rule)."""
        resolving = Resolving(flags, overrides, cls)
        ordered = sorted(settings_of(cls), key=lambda s: s.late)  # stable: declaration order, the late ones last
        for s in ordered:
            if resolved and s.name in resolved:
                resolving.values[s.name] = resolved[s.name]
            elif s.resolve is not None:
                resolving.values[s.name] = s.resolve(resolving)
            elif s.dest is not None:
                value = resolving.flag(s.dest)
                resolving.values[s.name] = s.default if value is None else value
            else:
                resolving.values[s.name] = None if s.default is NO_DEFAULT else s.default
        settings = cls(**resolving.values)
        if stored is None and lookup is not None:
            stored = lookup(settings.storage, settings.study_name)
        return same_question(settings, stored) if stored else settings


class _Description(Described, _Study):
    """What a stored description answers beside its fields (the target, the rules, the card)."""


@lru_cache(maxsize=None)
def study_description_type(settings_cls: type) -> type:
    """The stored description of a settings class (``StudyDescription`` for ``TuneSettings``)."""
    return description_type(settings_cls, _Description)


StudyDescription = study_description_type(TuneSettings)
StudyDescription.__module__ = __name__


def same_question(settings: TuneSettings, stored: Mapping[str, Any]) -> TuneSettings:
    """``settings`` for the study whose description is ``stored``: a setting that changes the answer and differs
    is an input error naming its flag, the stored value and the new one; a guessed value (``yields``: a host
    budget detected here) gives way to the stored one, in new settings (these are frozen)."""
    from advisor.search.setting import from_stored

    ss = settings_of(type(settings))
    values = {s.name: getattr(settings, s.name) for s in ss}
    diff = first_difference(ss, stored, values)
    if diff is not None:
        s, old, new = diff
        where = s.flag or f"--{s.name.replace('_', '-')}"
        raise AdvisorInputError(
            where, f"study {settings.study_name!r} was made with {s.name.replace('_', ' ')} {s.show(old)}, not "
            f"{s.show(new)}; name another study with --study, or leave --study out for the study of these settings "
            "(the existing study is kept as it is)", show_value=False)
    stored_values = from_stored(ss, stored)
    taken = {}
    for s in ss:
        if s.yields is not None and values.get(s.yields) and s.stored:
            taken.update({s.name: stored_values[s.name], s.yields: stored_values[s.yields]})
    return replace(settings, **taken) if taken else settings


def default_study_name(values: Mapping[str, Any], cls: type = TuneSettings) -> str:
    """model-budget-space, a short hash of every setting that
    changes the answer (the GPU, the GPU count, the sharding, the space's values, a host budget given, the
    regime...), and -host<budget> when one was given: one question, one study."""
    model, budget, space, host = values["model"], values["budget"], values["space"], values.get("host_budget")
    given_host = f"-host{host.text}" if host is not None and not values.get("host_detected") else ""
    raw = f"{model.name}-{budget.text}-{space.name}-{identity_hash(settings_of(cls), values)}{given_host}"
    return re.sub(r"[^A-Za-z0-9._-]+", "", raw.replace(" ", "")).lower()


def default_storage(study_name: str, reports_dir: str | Path = "reports") -> str:
    """The SQLite file of a study under ``reports_dir``/<study>/ (the folder is made when the study is opened:
    advisor.search.storage.make_storage)."""
    return f"sqlite:///{(Path(reports_dir) / study_name / 'study.db').resolve()}"


__all__ = ["ATTR", "Resolving", "StudyDescription", "TuneSettings", "default_storage", "default_study_name",
           "gpu_from_dict", "model_from_dict", "same_question", "study_description_type"]
