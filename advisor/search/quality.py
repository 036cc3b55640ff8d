"""Quality of a plan: what each of its levers does to the trained model, from advisor/data/quality.yaml.

Every lever value of a Plan has an entry (or an explicit ``unsupported`` one): its kind (exact, near-exact,
cost, dynamics), its effect in one currency, the conditions and noise of the source that measured it, and
the source. ``quality_of(plan)`` looks up the entry of every lever the plan uses and combines them:

- **accuracy losses add** (nats/token of excess held-out loss). Each source changes one lever with the others
  fixed, so each figure is a partial effect; near the reference the excess loss is a quadratic form in the
  parameter perturbation (½ δᵀHδ), and perturbations of different parts of training (base weights, adapter
  capacity, optimizer) are taken as independent, so the cross terms vanish and the partial effects sum.
  Where they overlap the sum over-counts (QLoRA T4 already measures NF4 under adapters): a conservative error.
- **token factors multiply**: a lever that needs k times the tokens to reach a loss is a compute multiplier,
  and independent efficiency multipliers compose by multiplication (the "effective compute" accounting of
  Ho et al. 2024, "Algorithmic progress in language models", arXiv 2403.05812).
- **noises add in quadrature** (independent errors); ``quality_tie`` compares two plans only on the levers
  they differ in.

A lever with no entry, or whose entry is ``unsupported``, makes the plan unpickable (``uncovered_levers``).
Levers of kind ``dynamics`` change the optimizer's trajectory (``dynamics_levers``); the hyper-parameters
their sources recommend come from ``recommended_hyperparameters``. Calculation only: rendering lives in
benchmarks/quality_table.py (docs/quality.md) and in the callers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Mapping

from advisor.core.catalog import architectures
from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.knobs import Knob, knobs, levers
from advisor.core.plan import ALL_LINEAR, METHODS, OPTIMIZERS, Plan

DATA_FILE = "quality.yaml"
KINDS = ("exact", "near-exact", "cost", "dynamics", "unsupported")
"""exact: same model by construction; near-exact: equal within the source's noise; cost: a measured loss;
dynamics: changes the optimizer's trajectory; unsupported: no source, cannot be picked."""
BASES = ("construction", "measured", "derived", "judgment", "claim", "none")
"""How an entry's number was obtained: by construction, read from a source in the currency, converted (the
crosswalk, ratios), bounded by sources but not measured, claimed without numbers, or nothing (unsupported)."""
BOOL = ("false", "true")
ANY = ("any",)
TARGET_CLASSES = ("all-linear", "mlp", "attention", "other")

GLOBAL_BATCH = ("as-asked", "changed")
"""The keys of ``global_batch``, which is not a Plan field: micro_batch x grad_accum against the global batch the
user asked for (a plan that changes it changes the dynamics)."""
CLASSES: dict[str, tuple[str, ...]] = {
    "lora_targets": TARGET_CLASSES, "lora_alpha": ("2r", "other"), "lora_dropout": ("0-0.1", "other"),
    "checkpoint_layers": ("all", "some"), "steps_per_generation": ("on-policy", "off-policy"),
    **{name: ("default", "set") for name in ("max_pixels", "min_pixels", "video_max_pixels", "video_total_pixels",
                                             "video_fps", "max_frames")},
}
"""Levers whose values quality.yaml prices by class (``value_key``), not one by one."""


def _key(value: Any) -> str:
    """A YAML key as quality.yaml means it (unquoted true/false parse as booleans)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def lever_values(plan_type: type = Plan) -> dict[str, tuple[str, ...]]:
    """Every lever and the keys its values fall under, from the knobs' declarations: a knob's choices, "false" /
    "true" for a switch, its classes (CLASSES), else "any" (a number: its entries select by range with ``when``);
    and ``global_batch``. The user's workload (``Knob.workload``: the sequence length, the evaluation) is no
    lever: two plans of one workload cannot differ in it, so it has no entry."""
    out: dict[str, tuple[str, ...]] = {}
    for k in levers(plan_type):
        out[k.name] = (tuple(map(_key, k.choices)) if k.choices is not None else BOOL if k.is_switch
                       else CLASSES.get(k.name, ANY))
    return {**out, "global_batch": GLOBAL_BATCH}


LEVER_VALUES: dict[str, tuple[str, ...]] = lever_values(Plan)
"""``lever_values`` of the Plan: what quality.yaml must cover, value by value."""


@lru_cache(maxsize=None)
def _knobs_by_name(plan_type: type) -> dict[str, Knob]:
    return {k.name: k for k in knobs(plan_type)}


ENTRY_KEYS = ("kind", "accuracy_loss", "token_factor", "noise", "basis", "does", "measured", "source_noise",
              "source", "evidence", "note", "when")
REQUIRED_ENTRY_KEYS = ("kind", "basis", "does", "measured", "source")
WHEN_LISTS = {"regime": None, "method": METHODS, "optimizer": OPTIMIZERS}
WHEN_RANGES = ("lora_r", "optim_rank", "optim_proj_gap")
TOP_KEYS = ("unit", "resolution", "default_tolerance", "default_regime", "crosswalk", "regimes", "levers",
            "hyperparameters")
HP_KEYS = ("learning_rate", "max_grad_norm", "optim_args", "warmup_ratio", "why", "source", "evidence", "when")
UNIT = "nats/token"
_GRID = tuple(range(1, 300)) + (300, 500, 501, 512, 1000, 1024, 1025, 2048, 100_000)
"""Values of the numeric `when` keys the validator tries: every value must find an entry."""


# ---------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class LeverEffect:
    """The entry of quality.yaml that one lever of a plan falls under."""

    lever: str
    """Plan field (or ``global_batch``)."""
    value: str
    """The key of its value in quality.yaml (``true``, ``nf4``, ``attention``, ``any``...)."""
    kind: str
    """exact, near-exact, cost, dynamics or unsupported."""
    accuracy_loss: float = 0.0
    """Excess held-out loss of the trained model, nats/token, against the reference training."""
    token_factor: float = 1.0
    """Training tokens needed to reach the same loss, as a multiple of the reference's (>= 1)."""
    noise: float = 0.0
    """Run-to-run noise of the source, nats/token."""
    basis: str = "construction"
    """How the number was obtained (BASES)."""
    does: str = ""
    """What the lever does to the trained model."""
    measured: str = ""
    """The source's model, task and metric."""
    source_noise: str = ""
    """The noise as the source reports it."""
    source: str = ""
    """One-line citation."""
    evidence: tuple[str, ...] = ()
    """Point ids in ../shared/published_runs/quality.json."""
    note: str = ""
    """Conditions a user must keep for the figure to hold."""
    when: tuple[tuple[str, Any], ...] = ()
    """The conditions under which this entry applies, (key, allowed values or (low, high)) pairs (empty: always)."""
    setting: str = ""
    """The plan's own value where the key is a class or a range (``lora_r`` 16 under ``any``), else empty."""

    @property
    def label(self) -> str:
        """``lever=value`` as the plan sets it (``lora_r=16``, ``optimizer=lomo``)."""
        return f"{self.lever}={self.setting or self.value}"


@dataclass(frozen=True)
class QualityEffect:
    """What a plan's levers do to the trained model, combined (see the module docstring)."""

    accuracy_loss: float
    """Sum of the levers' accuracy losses: excess held-out loss in nats/token against the reference."""
    token_factor: float
    """Product of the levers' token factors: tokens to reach the same loss, per reference token."""
    noise: float
    """The levers' noises in quadrature, nats/token."""
    regime: str
    """The training regime the entries were chosen for (sft, domain, cpt)."""
    kinds: dict[str, str]
    """Kind of each lever the plan uses, keyed ``lever=value``."""
    sources: tuple[str, ...]
    """The distinct sources of the entries that are not exact."""
    notes: tuple[str, ...]
    """Conditions the figures hold under (e.g. packing at equal tokens per step)."""
    uncovered: tuple[str, ...]
    """Levers with no entry or an unsupported one, each ``lever=value: why``: the plan cannot be picked."""
    levers: tuple[LeverEffect, ...]
    """Every entry used, in quality.yaml's order."""
    accuracy_source: str = "prior"
    """prior, or measured when a probe's KL replaced the quantization prior."""

    @property
    def pickable(self) -> bool:
        """Every lever has a quality entry that is not unsupported."""
        return not self.uncovered

    @property
    def dynamics(self) -> tuple[str, ...]:
        """The levers that change training dynamics (``lever=value``)."""
        return tuple(e.label for e in self.levers if e.kind == "dynamics")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["levers"] = [asdict(e) | {"when": {k: list(v) for k, v in e.when}} for e in self.levers]
        d["pickable"], d["dynamics"] = self.pickable, list(self.dynamics)
        return d


@dataclass(frozen=True, eq=False)
class QualityData:
    """quality.yaml, parsed and validated (hashed by identity: ``lever_effects`` caches per data object)."""

    resolution: float
    default_tolerance: float
    default_regime: str
    regimes: dict[str, str]
    crosswalk: dict[str, Any]
    entries: dict[str, dict[str, tuple[LeverEffect, ...]]]
    hyperparameters: dict[str, Any]


# ------------------------------------------------------------------------------------------------- loading


@lru_cache(maxsize=1)
def quality_data() -> QualityData:
    """quality.yaml, read and validated once (the tuner asks for every trial; read-only after this)."""
    return parse_quality_data(load_data_file(DATA_FILE))


def parse_quality_data(raw: Any) -> QualityData:
    """Validate ``raw`` (quality.yaml's content) and build the entries; every problem raised at once."""
    errs = validate_quality_data(raw)
    if len(errs) == 1:
        raise errs[0]
    if errs:
        raise ConfigErrors(errs)
    entries = {lever: {_key(value): tuple(_entry(lever, _key(value), e) for e in _variants(spec))
                       for value, spec in values.items()}
               for lever, values in raw["levers"].items()}
    return QualityData(float(raw["resolution"]), float(raw["default_tolerance"]), raw["default_regime"],
                       dict(raw["regimes"]), dict(raw["crosswalk"]), entries, dict(raw["hyperparameters"]))


def _variants(spec: Any) -> list:
    return spec if isinstance(spec, list) else [spec]


def _entry(lever: str, value: str, e: Mapping[str, Any]) -> LeverEffect:
    return LeverEffect(lever=lever, value=value, kind=e["kind"], accuracy_loss=float(e.get("accuracy_loss", 0.0)),
                       token_factor=float(e.get("token_factor", 1.0)), noise=float(e.get("noise", 0.0)),
                       basis=e["basis"], does=e["does"], measured=e["measured"],
                       source_noise=e.get("source_noise", ""), source=e["source"],
                       evidence=tuple(e.get("evidence", ())), note=e.get("note", ""),
                       when=tuple((k, tuple(v)) for k, v in e.get("when", {}).items()))


def validate_quality_data(raw: Any) -> list[AdvisorInputError]:
    """Every rule quality.yaml breaks: unknown keys, levers or values with no entry, numbers out of range,
    conditions that leave some plan without an entry. Each error names the key."""
    errs: list[AdvisorInputError] = []

    def bad(where: str, rule: str, value: Any = None, show: bool = True) -> None:
        errs.append(AdvisorInputError(f"{DATA_FILE}: {where}", rule, value, show_value=show))

    if not isinstance(raw, dict):
        bad("top level", "must be a mapping", type(raw).__name__)
        return errs
    for key in raw:
        if key not in TOP_KEYS:
            bad(str(key), f"unknown key (known: {', '.join(TOP_KEYS)})", key)
    for key in TOP_KEYS:
        if key not in raw:
            bad(key, "missing", show=False)
    if errs:
        return errs
    if raw["unit"] != UNIT:
        bad("unit", f"must be {UNIT} (the unit of --accuracy-tolerance)", raw["unit"])
    for key in ("resolution", "default_tolerance"):
        if not _number(raw[key]) or raw[key] <= 0:
            bad(key, "must be a number above 0", raw[key])
    regimes = raw["regimes"]
    if not isinstance(regimes, dict) or not regimes:
        bad("regimes", "must map each regime name to its description", regimes)
        return errs
    if raw["default_regime"] not in regimes:
        bad("default_regime", f"must be one of {', '.join(regimes)}", raw["default_regime"])
    if not isinstance(raw["crosswalk"], dict) or not _number(raw["crosswalk"].get("gsm8k_point_nats")) \
            or not raw["crosswalk"].get("source"):
        bad("crosswalk", "needs gsm8k_point_nats (a number) and its source", raw["crosswalk"])
    levers = raw["levers"]
    if not isinstance(levers, dict):
        bad("levers", "must be a mapping lever -> value -> entry", type(levers).__name__)
        return errs
    for lever in levers:
        if lever not in LEVER_VALUES:
            bad(f"levers.{lever}", f"unknown lever (levers: {', '.join(LEVER_VALUES)})", lever)
    for lever, allowed in LEVER_VALUES.items():
        values = levers.get(lever)
        if not isinstance(values, dict):
            bad(f"levers.{lever}", "no entry for this lever: every lever needs one per value", show=False)
            continue
        for value in values:
            if _key(value) not in allowed:
                bad(f"levers.{lever}.{_key(value)}", f"unknown value (values: {', '.join(allowed)})", _key(value))
        for value in allowed:
            if value not in {_key(v) for v in values}:
                bad(f"levers.{lever}.{value}", "no entry for this value: add one, or one of kind unsupported",
                    show=False)
        for value, spec in values.items():
            where = f"levers.{lever}.{_key(value)}"
            variants = _variants(spec)
            for i, e in enumerate(variants):
                _check_entry(f"{where}[{i}]" if isinstance(spec, list) else where, e, regimes, bad)
            if all(isinstance(e, dict) for e in variants):
                _check_coverage(where, [e.get("when", {}) for e in variants], regimes, bad)
    _check_hyperparameters(raw["hyperparameters"], levers, bad)
    return errs


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_entry(where: str, e: Any, regimes: Mapping[str, str], bad) -> None:
    if not isinstance(e, dict):
        bad(where, "must be a mapping of entry keys", e)
        return
    for key in e:
        if key not in ENTRY_KEYS:
            bad(f"{where}.{key}", f"unknown key (known: {', '.join(ENTRY_KEYS)})", key)
    for key in REQUIRED_ENTRY_KEYS:
        if not isinstance(e.get(key), str) or not e.get(key).strip():
            bad(f"{where}.{key}", "required: a non-empty line", e.get(key))
    kind, basis = e.get("kind"), e.get("basis")
    if kind not in KINDS:
        bad(f"{where}.kind", f"must be one of {', '.join(KINDS)}", kind)
    if basis not in BASES:
        bad(f"{where}.basis", f"must be one of {', '.join(BASES)}", basis)
    loss, factor, noise = e.get("accuracy_loss", 0.0), e.get("token_factor", 1.0), e.get("noise", 0.0)
    if not _number(loss) or loss < 0:
        bad(f"{where}.accuracy_loss", "must be a number >= 0 (nats/token; no lever is credited for beating "
            "the reference)", loss)
    if not _number(factor) or factor < 1:
        bad(f"{where}.token_factor", "must be a number >= 1", factor)
    if not _number(noise) or noise < 0:
        bad(f"{where}.noise", "must be a number >= 0 (nats/token)", noise)
    if kind in ("exact", "unsupported") and (loss != 0 or factor != 1):
        bad(where, f"a {kind} entry has accuracy_loss 0 and token_factor 1", (loss, factor))
    if kind == "exact" and noise != 0:
        bad(f"{where}.noise", "an exact entry has no noise", noise)
    if (kind == "unsupported") != (basis == "none"):
        bad(f"{where}.basis", "basis none goes with kind unsupported, and only with it", basis)
    evidence = e.get("evidence", [])
    if not isinstance(evidence, list) or not all(isinstance(x, str) and x for x in evidence):
        bad(f"{where}.evidence", "must be a list of quality.json point ids", evidence)
    for key in ("source_noise", "note"):
        if key in e and not isinstance(e[key], str):
            bad(f"{where}.{key}", "must be a line of text", e[key])
    _check_when(where, e.get("when", {}), regimes, bad)


def _check_when(where: str, when: Any, regimes: Mapping[str, str], bad) -> None:
    if not isinstance(when, dict):
        bad(f"{where}.when", "must be a mapping of conditions", when)
        return
    for key, cond in when.items():
        if key in WHEN_RANGES:
            ok = (isinstance(cond, list) and len(cond) == 2 and isinstance(cond[0], int)
                  and (cond[1] is None or (isinstance(cond[1], int) and cond[1] >= cond[0])))
            if not ok:
                bad(f"{where}.when.{key}", "must be [low, high] whole numbers (high null: no bound)", cond)
        elif key in WHEN_LISTS:
            allowed = tuple(regimes) if key == "regime" else WHEN_LISTS[key]
            if not isinstance(cond, list) or not cond or any(c not in allowed for c in cond):
                bad(f"{where}.when.{key}", f"must be a list of {', '.join(allowed)}", cond)
        else:
            bad(f"{where}.when.{key}", f"unknown condition (known: {', '.join((*WHEN_LISTS, *WHEN_RANGES))})", key)


def _check_coverage(where: str, whens: list[Any], regimes: Mapping[str, str], bad) -> None:
    """Every combination of the conditions a lever's entries use must find an entry (possibly unsupported)."""
    if not all(isinstance(w, dict) for w in whens):
        return
    keys = sorted({k for w in whens for k in w if k in WHEN_LISTS or k in WHEN_RANGES})
    domains = [tuple(regimes) if k == "regime" else WHEN_LISTS[k] if k in WHEN_LISTS else _GRID for k in keys]
    combos: list[dict[str, Any]] = [{}]
    for k, dom in zip(keys, domains):
        combos = [c | {k: v} for c in combos for v in dom]
    for combo in combos:
        if not any(_matches(w, combo.get) for w in whens):
            bad(where, "no entry applies when " + ", ".join(f"{k}={v}" for k, v in combo.items()), show=False)
            return


def _check_hyperparameters(hp: Any, levers: Mapping[str, Any], bad) -> None:
    if not isinstance(hp, dict):
        bad("hyperparameters", "must be a mapping optimizer -> recommended values", hp)
        return
    dynamics = [_key(v) for v, spec in (levers.get("optimizer") or {}).items()
                if any(isinstance(e, dict) and e.get("kind") == "dynamics" for e in _variants(spec))]
    known = ("reference", "optimizer_in_backward", *OPTIMIZERS)
    for name, spec in hp.items():
        if name not in known:
            bad(f"hyperparameters.{name}", "unknown key (optimizer names, optimizer_in_backward, reference)", name)
            continue
        if name == "reference":
            ref = spec if isinstance(spec, dict) else {}
            lr = ref.get("learning_rate")
            if not (isinstance(lr, dict) and set(lr) == {"full", "peft"} and all(_number(x) for x in lr.values())
                    and _number(ref.get("max_grad_norm")) and ref.get("source")):
                bad("hyperparameters.reference", "needs learning_rate {full, peft}, max_grad_norm and source", spec)
            continue
        for i, e in enumerate(_variants(spec)):
            w = f"hyperparameters.{name}" + (f"[{i}]" if isinstance(spec, list) else "")
            if not isinstance(e, dict):
                bad(w, "must be a mapping", e)
                continue
            for key in e:
                if key not in HP_KEYS:
                    bad(f"{w}.{key}", f"unknown key (known: {', '.join(HP_KEYS)})", key)
            for key in ("why", "source"):
                if not isinstance(e.get(key), str) or not e[key].strip():
                    bad(f"{w}.{key}", "required: a non-empty line", e.get(key))
            for key in ("learning_rate", "max_grad_norm", "warmup_ratio"):
                if key in e and (not _number(e[key]) or e[key] < 0):
                    bad(f"{w}.{key}", "must be a number >= 0", e[key])
            if "optim_args" in e and not isinstance(e["optim_args"], dict):
                bad(f"{w}.optim_args", "must be a mapping", e["optim_args"])
            _check_when(w, e.get("when", {}), {}, bad)
    for name in dynamics:
        if name not in hp:
            bad(f"hyperparameters.{name}", "a dynamics optimizer needs the hyper-parameters its source uses",
                show=False)
    if "optimizer_in_backward" not in hp:
        bad("hyperparameters.optimizer_in_backward", "required: the step inside backward loses clipping", show=False)


# ----------------------------------------------------------------------------------------------- lever values


def _matches(when: Mapping[str, Any] | tuple[tuple[str, Any], ...], lookup: Callable[[str], Any]) -> bool:
    """Whether every condition of ``when`` holds for the values ``lookup`` gives."""
    for key, cond in (when.items() if isinstance(when, dict) else when):
        actual = lookup(key)
        if key in WHEN_RANGES:
            low, high = cond
            if not (isinstance(actual, int) and actual >= low and (high is None or actual <= high)):
                return False
        elif actual not in cond:
            return False
    return True


@lru_cache(maxsize=1)
def _target_sets() -> tuple[tuple[frozenset[str], frozenset[str]], ...]:
    """(attention, mlp) module-name sets of every architecture the catalog knows (architectures.yaml)."""
    out = []
    for arch in architectures().values():
        sets = arch.get("lora_target_sets") or {}
        out.append((frozenset(sets.get("attention", ())), frozenset(sets.get("mlp", ()))))
    return tuple(out)


def target_class(targets: tuple[str, ...] | str) -> str:
    """all-linear, mlp (every MLP projection, attention optional), attention (attention projections only) or
    other, by the module names of architectures.yaml's ``lora_target_sets``."""
    if targets == ALL_LINEAR:
        return "all-linear"
    names = frozenset(targets)
    for attention, mlp in _target_sets():
        if not mlp or not names <= attention | mlp:
            continue
        if mlp <= names:
            return "all-linear" if attention <= names else "mlp"
        if names <= attention and names:
            return "attention"
    return "other"


def value_key(plan: Plan, lever: str) -> str:
    """The key in quality.yaml of ``plan``'s value of ``lever``."""
    if lever == "lora_targets":
        cls = target_class(plan.lora_targets)
        # LoRA on the stacked experts adapts a mixture of experts' MLP: with the attention, every layer's matrices
        return "all-linear" if cls == "attention" and plan.peft and plan.lora_experts else cls
    if lever == "checkpoint_layers":
        return "all" if plan.checkpoint_layers is None else "some"
    if lever == "lora_alpha":
        return "2r" if math.isclose(plan.lora_alpha, 2 * plan.lora_r) else "other"
    if lever == "lora_dropout":
        return "0-0.1" if 0 <= plan.lora_dropout <= 0.1 else "other"
    if lever == "steps_per_generation":  # each generation trained within one optimizer step (TRL: no old log-probs)
        spg = plan.steps_per_generation
        return "on-policy" if spg is None or plan.grad_accum % spg == 0 else "off-policy"
    if CLASSES.get(lever) == ("default", "set"):  # a processor setting: its own (None) or the plan's
        return "default" if getattr(plan, lever) is None else "set"
    if LEVER_VALUES[lever] == ANY:
        return "any"
    return _key(getattr(plan, lever))


def setting_of(plan: Plan, lever: str, value: str) -> str:
    """The plan's own value of ``lever`` where its quality key is a class or a range, else ""."""
    if lever in ("lora_alpha", "lora_dropout", "checkpoint_layers", "steps_per_generation") or value == "any":
        return str(getattr(plan, lever))
    return ""


def applies(plan: Plan, lever: str) -> bool:
    """Whether ``lever`` takes part in ``plan``: where its knob's declaration says it applies (``Knob.applies``:
    LoRA knobs only with adapters, the 4-bit knobs only on a 4-bit base...), the rule Plan.problems and
    ``canonical`` use; the others of the plan are ignored."""
    k = _knobs_by_name(type(plan)).get(lever)
    return k is not None and k.is_lever and k.applies_to(vars(plan))


def _regime(regime: str | None) -> str:
    data = quality_data()
    regime = regime or data.default_regime
    if regime not in data.regimes:
        raise AdvisorInputError("--regime", f"must be one of {', '.join(data.regimes)}", regime)
    return regime


def _lookup(plan: Plan, regime: str) -> Callable[[str], Any]:
    return lambda key: regime if key == "regime" else getattr(plan, key)


def _entry_for(data: QualityData, plan: Plan, lever: str, value: str, regime: str) -> LeverEffect | None:
    variants = data.entries.get(lever, {}).get(value, ())
    return next((e for e in variants if _matches(e.when, _lookup(plan, regime))), None)


def _unknown_fields(plan: Plan) -> list[str]:
    """Levers of ``plan`` the quality model does not know, set away from their default (a lever a Plan subclass
    adds: quality.yaml covers every lever of Plan itself, or fails to load)."""
    return [f"{k.name}={getattr(plan, k.name)!r}: no quality entry for this lever" for k in levers(type(plan))
            if k.name not in LEVER_VALUES and getattr(plan, k.name) != k.default]


@lru_cache(maxsize=None)
def _all_fields_known(plan_type: type) -> bool:
    return all(k.name in LEVER_VALUES for k in levers(plan_type))


# ------------------------------------------------------------------------------------------------ the model


def lever_effects(plan: Plan, regime: str | None = None, *, global_batch: int | None = None, gpus: int = 1
                  ) -> tuple[list[LeverEffect], list[str]]:
    """The entry of every lever ``plan`` uses, and the levers without one (``lever=value: why``). ``gpus``: the
    run's, over whose data-parallel ranks the global batch is split (advisor.memory.sharding.global_batch)."""
    used, uncovered = _lever_effects(quality_data(), plan, _regime(regime), global_batch, gpus)
    return list(used), list(uncovered)


@lru_cache(maxsize=1 << 16)
def _lever_effects(data: QualityData, plan: Plan, regime: str, global_batch: int | None, gpus: int = 1
                   ) -> tuple[tuple[LeverEffect, ...], tuple[str, ...]]:
    """``lever_effects`` of one quality data (cached: the space walk asks it of every plan it checks, about
    15,000 times a tune)."""
    used: list[LeverEffect] = []
    uncovered = [] if _all_fields_known(type(plan)) else _unknown_fields(plan)
    for lever in data.entries:
        if lever == "global_batch":
            if global_batch is None:
                continue
            from advisor.memory.sharding import global_batch as run_batch

            value = "as-asked" if run_batch(gpus, plan) == global_batch else "changed"
        elif not applies(plan, lever):
            continue
        else:
            value = value_key(plan, lever)
        entry = _entry_for(data, plan, lever, value, regime)
        setting = setting_of(plan, lever, value) if entry is not None and lever != "global_batch" else ""
        if setting:
            entry = _with_setting(entry, setting)
        if entry is None:
            uncovered.append(f"{lever}={value}: no entry for these conditions (regime {regime})")
        elif entry.kind == "unsupported":
            uncovered.append(f"{entry.label}: {entry.measured}")
        else:
            used.append(entry)
    return tuple(used), tuple(uncovered)


def quality_of(plan: Plan, regime: str | None = None, *, global_batch: int | None = None,
               measured_kl: float | None = None, gpus: int = 1) -> QualityEffect:
    """What ``plan`` does to the trained model (see the module docstring for how the levers combine).

    ``regime``: sft (default), domain or cpt (quality.yaml ``regimes``). ``global_batch``: the sequences per
    optimizer step the user asked for (a plan that changes it changes the dynamics). ``measured_kl``: the KL
    (nats/token) a probe measured for the quantized base, replacing the quantization prior.
    """
    regime = _regime(regime)
    used, uncovered = lever_effects(plan, regime, global_batch=global_batch, gpus=gpus)
    source = "prior"
    if measured_kl is not None and plan.quantized:
        used = [e if e.lever != "quantization" else _measured(e, measured_kl) for e in used]
        source = "measured"
    loss = sum(e.accuracy_loss for e in used)                      # partial effects add (module docstring)
    factor = math.prod(e.token_factor for e in used)               # compute multipliers compose (Ho et al. 2024)
    noise = math.sqrt(sum(e.noise ** 2 for e in used))             # independent errors in quadrature
    sources = tuple(dict.fromkeys(e.source for e in used if e.kind != "exact" and e.source.strip("- ")))
    notes = tuple(dict.fromkeys(f"{e.label}: {e.note}" for e in used if e.note))
    return QualityEffect(accuracy_loss=loss, token_factor=factor, noise=noise, regime=regime,
                         kinds={e.label: e.kind for e in used}, sources=sources, notes=notes,
                         uncovered=tuple(uncovered), levers=tuple(used), accuracy_source=source)


def _measured(e: LeverEffect, kl: float) -> LeverEffect:
    if not _number(kl) or kl < 0:
        raise AdvisorInputError("measured KL", "must be a number >= 0 (nats/token)", kl)
    return replace(e, accuracy_loss=float(kl), basis="measured", noise=0.0,
                   measured="KL of the quantized base from the 16-bit base, measured by advisor probe",
                   source="advisor probe (fidelity_kl)")


@lru_cache(maxsize=4096)
def _with_setting(entry: LeverEffect, setting: str) -> LeverEffect:
    """The entry labelled with the plan's own value (cached: dataclasses.replace dominates a grid's time)."""
    return replace(entry, setting=setting)


def uncovered_levers(plan: Plan, regime: str | None = None, *, global_batch: int | None = None,
                     gpus: int = 1) -> list[str]:
    """The levers of ``plan`` that have no quality entry or an unsupported one (``lever=value: why``): a plan
    with any cannot be picked."""
    return lever_effects(plan, regime, global_batch=global_batch, gpus=gpus)[1]


def quality_problems(plan: Plan, regime: str | None = None, *, global_batch: int | None = None, gpus: int = 1
                     ) -> list[AdvisorInputError]:
    """The uncovered levers of ``plan`` as plan-rule errors, each under the knob that sets the lever (the form
    the search's rule checks take: a plan the quality model has no evidence for is never proposed)."""
    from advisor.core.plan import flag_of

    errs = []
    for text in uncovered_levers(plan, regime, global_batch=global_batch, gpus=gpus):
        lever = text.split("=", 1)[0]
        knob = "micro_batch" if lever == "global_batch" else lever
        errs.append(AdvisorInputError(flag_of(knob), f"no quality evidence: {text}", getattr(plan, knob, None)))
    return errs


def dynamics_levers(plan: Plan, regime: str | None = None, *, global_batch: int | None = None,
                    gpus: int = 1) -> list[str]:
    """The levers of ``plan`` that change training dynamics (``lever=value``): searched only where needed
    to fit, never tie-breakers."""
    return [e.label for e in lever_effects(plan, regime, global_batch=global_batch, gpus=gpus)[0]
            if e.kind == "dynamics"]


def time_to_quality(tokens_per_s: float, effect: QualityEffect) -> float:
    """Seconds per reference token: the time a plan needs to reach the loss the reference reaches with one
    token (token_factor / tokens_per_s). The ranking key of selection, lower is better."""
    if not _number(tokens_per_s) or tokens_per_s <= 0:
        raise AdvisorInputError("tokens_per_s", "must be a number above 0", tokens_per_s)
    return effect.token_factor / tokens_per_s


def quality_difference(a: QualityEffect, b: QualityEffect) -> tuple[float, float]:
    """(b's accuracy loss minus a's, the noise of that difference): the noise counts only the levers in which
    the two plans' entries differ, both sides in quadrature."""
    ea, eb = {e.lever: e for e in a.levers}, {e.lever: e for e in b.levers}
    var = 0.0
    for lever in ea.keys() | eb.keys():
        x, y = ea.get(lever), eb.get(lever)
        if x != y:
            var += (x.noise if x else 0.0) ** 2 + (y.noise if y else 0.0) ** 2
    return b.accuracy_loss - a.accuracy_loss, math.sqrt(var)


def quality_tie(a: QualityEffect, b: QualityEffect) -> bool:
    """Whether the quality difference of two plans is within noise (or below the resolution): it decides
    nothing then."""
    delta, noise = quality_difference(a, b)
    return abs(delta) <= max(noise, quality_data().resolution) + 1e-12


def recommended_hyperparameters(plan: Plan) -> dict[str, Any]:
    """The learning rate and clipping the sources of ``plan``'s dynamics optimizer (or step inside backward)
    used, where they differ from AdamW's, with a one-line why and the sources; {} where AdamW's apply.

    Keys: learning_rate, max_grad_norm (0: no clipping, said explicitly where a step inside backward cannot
    clip), optional optim_args (TrainingArguments.optim_args) and warmup_ratio (a fraction of the steps:
    transformers 5's float ``warmup_steps``), why, sources, and reference (AdamW's values for this method).
    """
    data = quality_data()
    hp = data.hyperparameters
    used, _ = lever_effects(plan)
    optimizer_entry = next((e for e in used if e.lever == "optimizer"), None)
    out: dict[str, Any] = {}
    spec = hp.get(plan.optimizer)
    if spec is not None and optimizer_entry is not None:
        chosen = next((e for e in _variants(spec) if _matches(e.get("when", {}), _lookup(plan, ""))), None)
        if chosen is not None:
            out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in chosen.items()
                   if k in ("learning_rate", "max_grad_norm", "optim_args", "warmup_ratio")}
            out["why"] = chosen["why"]
            out["sources"] = [chosen["source"]]
    ref = hp["reference"]
    ref_lr = ref["learning_rate"]["peft" if plan.peft else "full"]
    if plan.optimizer_in_backward:
        ibw = hp["optimizer_in_backward"]
        out.setdefault("learning_rate", ref_lr)
        out["max_grad_norm"] = ibw["max_grad_norm"]
        out["why"] = "; ".join(x for x in (out.get("why"), ibw["why"]) if x)
        out["sources"] = [*out.get("sources", []), ibw["source"]]
    if out:
        out["reference"] = {"learning_rate": ref_lr, "max_grad_norm": ref["max_grad_norm"],
                            "source": ref["source"]}
    return out


# ------------------------------------------------------------------------------------------ the table (docs)


@dataclass(frozen=True)
class TableRow:
    """One entry of quality.yaml, for docs/quality.md (rendered by benchmarks/quality_table.py)."""

    lever: str
    value: str
    when: dict[str, Any]
    kind: str
    accuracy_loss: float
    token_factor: float
    noise: float
    basis: str
    does: str
    source: str
    measured: str
    source_noise: str
    evidence: tuple[str, ...]
    note: str


def lever_table() -> list[TableRow]:
    """Every entry of quality.yaml in its order (calculation; rendering is the caller's)."""
    return [TableRow(e.lever, e.value, {k: list(v) for k, v in e.when}, e.kind, e.accuracy_loss, e.token_factor,
                     e.noise, e.basis, e.does, e.source, e.measured, e.source_noise, e.evidence, e.note)
            for values in quality_data().entries.values() for variants in values.values() for e in variants]
