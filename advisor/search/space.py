"""Search spaces: YAML files in ``advisor/data/spaces/`` (or the user's), validated with every error at once.

A space has ``fixed`` values (the user's workload: the knobs declared ``Workload``, such as the sequence
length, and the global batch asked for) and ``search`` choices (the levers). ``key=value`` overrides on the
command line set either: a single value pins a knob.

Knobs are conditional (Optuna's define-by-run): a point of the space is chosen one knob at a time,
in the order the knobs declare (``Search.order``), and each knob is asked only where it means
something (``Knob.applies``) and only with the values the plan rules (``Plan.problems``) allow after
the knobs chosen before it (``Conditions``). Every point the tuner proposes is therefore a valid plan.
Which knobs are searched, their universe of choices, where each applies and what a space file that
leaves one out gets all come from the knobs' declarations (advisor.core.knobs); how a new knob
declares them: ``advisor/data/spaces/README.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Sequence

import yaml

from advisor.core.card_rules import AUTO, CARD_DECIDED, Card
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.knobs import Knob, knobs, searched, workload_knobs
from advisor.core.plan import Plan, checkpoint_depth_problems, compute_dtype_for

SPACES_DIR = Path(__file__).resolve().parents[1] / "data" / "spaces"
"""The shipped search spaces (package data: they travel in the wheel)."""
DEFAULT_TRIALS = 40
"""Finished trials a study aims for when its space names none (``trials:``)."""

FIXED_KEYS = {"global_batch": "int", "lora_dropout": "dropout", "lora_alpha_ratio": "positive"}
"""The space's own fixed values, which are not Plan fields: the global batch the user asked for (grad_accum =
global_batch / micro_batch), the adapters' dropout and alpha = ratio x r. Beside them ``fixed`` states the
workload's knobs (``Knob.workload``: the sequence length, the evaluation), checked by their declarations: one
declared ``required`` must be stated, another a space leaves out gets its Plan default (eval_batch 0: the run
does not evaluate, as the exported configs do not)."""
TRIALS = 40
"""Finished trials a space runs to when its file does not say."""


@lru_cache(maxsize=None)
def fixed_knobs(plan_type: type = Plan) -> Mapping[str, Knob]:
    """The knobs a space states among its fixed values: the user's workload (from the declarations)."""
    return MappingProxyType({k.name: k for k in workload_knobs(plan_type)})


@lru_cache(maxsize=None)
def field_names(plan_type: type = Plan) -> frozenset[str]:
    return frozenset(k.name for k in knobs(plan_type))


def workload_of(fixed: Mapping[str, Any], plan_type: type = Plan) -> dict[str, Any]:
    """The workload knobs' values a space's ``fixed`` states, the others at their defaults."""
    return {name: fixed.get(name, k.default) for name, k in fixed_knobs(plan_type).items()}


def known_fixed_keys(plan_type: type = Plan) -> tuple[str, ...]:
    """Every key a space's ``fixed`` may hold."""
    return (*fixed_knobs(plan_type), *FIXED_KEYS)


@lru_cache(maxsize=None)
def search_knobs(plan_type: type = Plan) -> Mapping[str, Knob]:
    """The knobs a space searches, by name, in the order a point chooses them (from the declarations)."""
    return MappingProxyType({k.name: k for k in searched(plan_type)})


def universe(k: Knob) -> tuple | None:
    """The choices a space may list for a knob (None: open-ended, see ``choice_problem``)."""
    if k.choices is not None:
        return k.choices
    return (True, False) if k.is_switch else None


def choice_problem(k: Knob, value: Any) -> str | None:
    """Why ``value`` cannot be one of a space's choices for knob ``k`` (None: it can). A knob the card decides
    (advisor.core.card_rules.CARD_DECIDED) also takes ``auto``: the card's value at each point."""
    if value == AUTO and k.name in CARD_DECIDED:
        return None
    allowed = universe(k)
    if allowed is not None:
        return None if value in allowed else f"must be among {', '.join(map(str, allowed))}"
    if k.search.choice is not None:
        return None if k.search.choice(value) else k.search.choice_rule
    if k.range is not None:
        if value is None and k.default is None:
            return None
        if k.range.holds(value):
            return None
        if k.default is None:
            return f"choices are null ({k.cli.default_means}) or {_numbers(k)}"
        return f"choices must be {_numbers(k)}"
    return None


def _numbers(k: Knob) -> str:
    return f"whole numbers of at least {k.range.low:g}" if k.range.whole else f"numbers ({k.range.rule})"


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space."""

    name: str
    trials: int
    fixed: dict[str, Any]
    search: dict[str, list]
    source: str = ""
    overrides: tuple[str, ...] = field(default=())
    plan: type = field(default=Plan, compare=False, repr=False)
    """The Plan class whose declared knobs the space searches (a subclass adds its own)."""
    card: Card | None = field(default=None, compare=False, repr=False)
    """Where the plans will train (advisor.core.card_rules.Card): what the ``auto`` choices become
    (``plan_from_params``). None: no card known (bf16, sdpa)."""
    gpus: int = field(default=1, compare=False, repr=False)
    """The run's GPUs (``--gpus``): the fixed ``global_batch`` is the sequences of one optimizer step over all the
    data-parallel ranks (``plan_from_params``)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "trials": self.trials, "fixed": self.fixed, "search": self.search,
                "source": self.source, "overrides": list(self.overrides)}

    @property
    def workload(self) -> dict[str, Any]:
        """The user's workload the space states (its ``fixed`` workload knobs, the others at their defaults): what
        a knob's ``applies`` reads beside the knobs chosen (the task, for a GRPO lever)."""
        return workload_of(self.fixed, self.plan)

    @cached_property
    def fixed_fields(self) -> dict[str, Any]:
        """The Plan fields the space's fixed values set (its workload), as each field holds them."""
        return {name: _as_field(self.fixed.get(name, k.default), k) for name, k in fixed_knobs(self.plan).items()}

    def conditions(self, arch: dict[str, Any] | None = None, check: "Check | None" = None) -> "Conditions":
        """The plan rules applied to this space's knobs (for one model's ``arch``)."""
        return Conditions(self, arch, check)

    def quantizations_for(self, method: str) -> list[str]:
        """The quantizations the plan rules allow with ``method``."""
        return self.conditions().offered("quantization", {"method": method})

    def methods(self) -> list[str]:
        """Methods that lead to at least one valid plan."""
        return self.conditions().offered("method", {})

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every valid point of the space (each knob only where it applies)."""
        return self.conditions().points()

    def micro_batches(self) -> list:
        """The space's micro-batches, smallest first, that keep its global batch over the run's GPUs (micro-batch x
        GPUs at most global_batch, so accumulation makes it up exactly where it divides); the smallest where none
        does."""
        sizes = sorted(self.search.get("micro_batch") or [1])
        batch = self.fixed.get("global_batch")
        kept = [mb for mb in sizes if batch is None or mb * self.gpus <= batch]
        return kept or sizes[:1]

    def on_card(self, card: Card) -> "SearchSpace":
        """The space for plans that train on ``card``: its ``auto`` choices become the card's. A knob none of
        whose choices runs there is an error naming the key (an older space's ``precision: [bf16]`` on a T4)."""
        errors = []
        for name, values in self.search.items():
            refusals = [card.refusal(name, v) for v in values]
            if values and all(refusals):
                auto = f" (or list {AUTO}: the card's choice)" if name in CARD_DECIDED else ""
                errors.append(AdvisorInputError(f"search.{name}", f"none of these choices runs here: {refusals[0]}"
                                                + auto, values))
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ConfigErrors(errors)
        return replace(self, card=card)


def list_spaces(task: str = "train") -> list[str]:
    """Built-in spaces for ``task`` (a space file says `task: inference`; training is the default)."""
    names = []
    for p in SPACES_DIR.glob("*.yaml"):
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        if data.get("task", "train") == task:
            names.append(p.stem)
    return sorted(names)


def read_space_file(ref: str, task: str = "train") -> tuple[dict, str]:
    """(the YAML mapping, its path) of a space for ``task``, by built-in name or file path.

    Shared by the training loader (``load_space``) and the serving one (advisor.search.serve_space)."""
    path = Path(ref)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = SPACES_DIR / f"{ref}.yaml"
        if not path.is_file():
            raise AdvisorInputError("--space", f"no such space (built in: {', '.join(list_spaces(task))}) and no "
                                    "such file", ref)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise AdvisorInputError("--space", f"{path} is not valid YAML{where}", ref, show_value=False) from None
    if not isinstance(data, dict):
        raise AdvisorInputError("--space", f"{path} must hold a mapping with 'fixed' and 'search'", ref,
                                show_value=False)
    if data.get("task", "train") != task:
        raise AdvisorInputError("--space", f"{path} is a space for --task {data.get('task', 'train')}, not "
                                f"--task {task}", ref, show_value=False)
    return data, str(path)


def parsed_overrides(overrides: Sequence[str], errors: list[AdvisorInputError]) -> Iterator[tuple[str, str, Any]]:
    """(text, key, value) of each ``key=value`` override that parses; the others' errors go to ``errors``."""
    for text in overrides:
        try:
            key, value = parse_override(text)
        except AdvisorInputError as e:
            errors.append(e)
            continue
        yield text, key, value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise AdvisorInputError("override", "expected key=value (e.g. method=qlora or micro_batch=[1,2])", text)
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_space(ref: str = "default", overrides: list[str] | tuple[str, ...] = (), *,
               plan: type = Plan) -> SearchSpace:
    """Load, apply ``key=value`` overrides, validate (all errors at once). ``plan``: the Plan class whose
    declared knobs the space searches."""
    data, source = read_space_file(ref, "train")
    knob_of = search_knobs(plan)
    fixed = dict(data.get("fixed") or {})
    search = _renamed_knobs(dict(data.get("search") or {}), knob_of)
    errors: list[AdvisorInputError] = []
    renamed = _renames(knob_of)
    for text, key, value in parsed_overrides(overrides, errors):
        if key in renamed:
            key, value = renamed[key][0], [renamed[key][1](v) for v in (value if isinstance(value, list) else [value])]
        if key in knob_of:
            search[key] = value if isinstance(value, list) else [value]
        elif key in known_fixed_keys(plan) or key == "trials":
            if key == "trials":
                data["trials"] = value
            else:
                fixed[key] = value
        else:
            errors.append(AdvisorInputError(key, f"unknown key; knobs: {', '.join(knob_of)}; "
                                                 f"fixed: {', '.join(known_fixed_keys(plan))}", text))
    workload = workload_of(fixed, plan)
    for k in knob_of.values():  # a space written before the knob existed: the knob's default (a lever of its task)
        if not k.search.required and k.search.searched_within(workload):
            search.setdefault(k.name, [k.default])
    errors += _check(data, fixed, search, plan)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
    return SearchSpace(name=str(data.get("name") or Path(source).stem), trials=int(data.get("trials", TRIALS)),
                       fixed=fixed, search=search, source=source, overrides=tuple(overrides), plan=plan)


def _renames(knob_of: Mapping[str, Knob]) -> dict[str, tuple[str, Callable[[Any], Any]]]:
    """A knob's name in older space files → (the knob now, its value now)."""
    return {k.renamed_from[0]: (k.name, k.renamed_from[1]) for k in knob_of.values() if k.renamed_from}


def _renamed_knobs(search: dict, knob_of: Mapping[str, Knob]) -> dict:
    """An older space's knobs read as today's (chunked_ce → loss)."""
    for old, (new, convert) in _renames(knob_of).items():
        if old in search and new not in search:
            values = search.pop(old)
            search[new] = list(dict.fromkeys(convert(v) for v in values)) if isinstance(values, list) else values
    return search


def _check(data: dict, fixed: dict, search: dict, plan: type = Plan) -> list[AdvisorInputError]:
    errs: list[AdvisorInputError] = []
    knob_of = search_knobs(plan)
    trials = data.get("trials", TRIALS)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        errs.append(AdvisorInputError("trials", "must be a whole number of at least 1", trials))
    known = known_fixed_keys(plan)
    for key in fixed:
        if key not in known:
            errs.append(AdvisorInputError(f"fixed.{key}", f"unknown key (known: {', '.join(known)})", key,
                                          show_value=False))
    for key, k in fixed_knobs(plan).items():
        if key not in fixed and k.workload.required:
            errs.append(AdvisorInputError(f"fixed.{key}", "is required", None, show_value=False))
            continue
        v = fixed.get(key, k.default)
        if k.range is not None and not (v is None and k.default is None) and not k.range.holds(v):
            errs.append(AdvisorInputError(f"fixed.{key}", k.range.rule, v))  # None: a knob's "the tool's default"
        elif k.choices is not None and v not in k.choices:
            errs.append(AdvisorInputError(f"fixed.{key}", f"must be one of {', '.join(map(str, k.choices))}", v))
    for key, kind in FIXED_KEYS.items():
        if key not in fixed:
            errs.append(AdvisorInputError(f"fixed.{key}", "is required", None, show_value=False))
            continue
        v = fixed[key]
        if kind == "int" and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            errs.append(AdvisorInputError(f"fixed.{key}", "must be a whole number of at least 1", v))
        if kind == "dropout" and (not isinstance(v, (int, float)) or not 0 <= v < 1):
            errs.append(AdvisorInputError(f"fixed.{key}", "must be in [0, 1)", v))
        if kind == "positive" and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
            errs.append(AdvisorInputError(f"fixed.{key}", "must be greater than 0", v))
    workload = workload_of(fixed, plan)
    for key in search:
        if key not in knob_of:
            errs.append(AdvisorInputError(f"search.{key}", f"unknown knob (known: {', '.join(knob_of)})", key,
                                          show_value=False))
        elif not knob_of[key].search.searched_within(workload):
            errs.append(AdvisorInputError(f"search.{key}", f"not a lever of --task {workload.get('task')} (a space "
                                          "for another task searches it)", key, show_value=False))
    for key, k in knob_of.items():
        if not k.search.searched_within(workload):
            continue
        values = search.get(key)
        if not isinstance(values, list) or not values:
            errs.append(AdvisorInputError(f"search.{key}", "must be a non-empty list of choices", values))
            continue
        for v in values:
            rule = choice_problem(k, v)
            if rule:
                errs.append(AdvisorInputError(f"search.{key}", rule, v))
    if not errs:
        space = SearchSpace(name="", trials=1, fixed=fixed, search=search, plan=plan)
        if next(space.grid(), None) is None:
            first = plan_from_params({k: v[0] for k, v in search.items()}, space, {})
            example = "; ".join(e.rule for e in first.problems()[:1])
            errs.append(AdvisorInputError("search", "no combination of these choices is a valid plan"
                                          + (f" (the first choices break: {example})" if example else ""),
                                          None, show_value=False))
    return errs


def resolve_targets(name: str, arch: dict[str, Any]) -> tuple[str, ...] | str:
    """A target-set name (attention, mlp, all-linear) or "a,b,c" → the Plan's lora_targets."""
    if name == "all-linear":
        return "all-linear"
    sets = arch.get("lora_target_sets", {})
    if name in sets:
        return tuple(sets[name])
    return tuple(t.strip() for t in name.split(",") if t.strip())


def plan_from_params(params: dict[str, Any], space: SearchSpace, arch: dict[str, Any]) -> Plan:
    """The Plan for one point of the space (the fixed values filled in).

    A knob named like a Plan field passes straight through; a knob missing from ``params`` (a point
    chosen part way), or holding no value where it does not apply, keeps the Plan's default. The
    fields the space sets from its fixed values are derived here.
    """
    fixed, plan = space.fixed, space.plan
    fields = field_names(plan)
    values = {k: v for k, v in params.items() if k in fields and v is not None}
    card = space.card or Card()
    for name in CARD_DECIDED:  # a space's `auto`: the card's value here (advisor.core.card_rules)
        if values.get(name) == AUTO:
            values[name] = card.choice(name, values)
    method = values.get("method", plan.method)
    mb = values.get("micro_batch", plan.micro_batch)
    r = values.get("lora_r", plan.lora_r)
    values.update(
        compute_dtype=compute_dtype_for(values.get("precision", plan.precision)),
        # LoRA on stacked experts takes no dropout (peft's ParamWrapper refuses it): the space's dropout applies
        # elsewhere
        lora_r=r, lora_alpha=float(fixed["lora_alpha_ratio"] * r),
        lora_dropout=0.0 if values.get("lora_experts") and method != "full" else float(fixed["lora_dropout"]),
        lora_targets=(resolve_targets(params.get("lora_targets") or "attention", arch) if method != "full"
                      else ("q_proj",)),
        grad_accum=max(1, math.ceil(fixed["global_batch"] / mb)),
        **space.fixed_fields,  # the workload
    )
    made = plan(**values)
    if space.gpus > 1:  # every data-parallel rank runs micro_batch x grad_accum sequences of the global batch
        from advisor.memory.sharding import data_parallel_ranks

        ranks = data_parallel_ranks(space.gpus, made)
        made = made.with_(grad_accum=max(1, math.ceil(fixed["global_batch"] / (mb * ranks))))
    return made


def _as_field(value: Any, k) -> Any:
    """A fixed value as its Plan field holds it: for a tuple field, the list or the one value that the space's YAML or
    an override gives (``image_sizes=[1280x720, 640x480]``, ``image_sizes=1280x720``) as a tuple."""
    if not isinstance(k.default, tuple) or isinstance(value, tuple):
        return value
    return tuple(value) if isinstance(value, list) else (value,)


def point_of(plan: Plan, space: SearchSpace, arch: dict[str, Any]) -> dict[str, Any] | None:
    """The point of ``space`` whose plan is ``plan`` (each knob's choice that gives the plan's value: a target
    set's name for its modules, ``auto`` for the card's precision...); None when some knob has no such choice.
    The inverse of plan_from_params, for proposing a plan the tuner made itself (a simpler variant of an
    answer) through the sampler's own parameters."""
    point: dict[str, Any] = {}
    workload = space.workload
    for name, k in search_knobs(space.plan).items():
        if name not in space.search:
            continue
        if not k.applies_to({**workload, **point}):
            point[name] = k.inactive
            continue
        want = getattr(plan, name)
        for choice in space.search[name]:
            if getattr(plan_from_params({**point, name: choice}, space, arch), name) == want:
                point[name] = choice
                break
        else:
            return None
    return point if plan_from_params(point, space, arch) == plan else None


# ----------------------------------------------------------------------------- conditional knobs

# Plan fields set by another knob (derived in plan_from_params): a rule reported under one is the knob's
_FIELD_KNOB = {"compute_dtype": "precision", "lora_alpha": "lora_r", "grad_accum": "micro_batch"}

Check = Callable[[Plan], list[AdvisorInputError]]
"""A plan → every rule it breaks (Plan.problems, plus what a model adds: its modules for lora_targets)."""
Ask = Callable[[str, str, list], Any]
"""(Optuna parameter name, knob, the values offered) → the value chosen."""


def model_rules(model, gpu=None) -> Check:
    """The plan rules for one model on one card: Plan.problems, the adapter targets its layers really have (and,
    for LoRA on stacked experts, that it has some: advisor.core.adapters), and what runs on ``gpu`` for the model's
    class (advisor.core.card_rules; None: no card known)."""
    from advisor.core.adapters import expert_problems, lora_targets

    card = Card.of(gpu, model)

    def check(plan: Plan) -> list[AdvisorInputError]:
        errs = plan.problems() + checkpoint_depth_problems(plan, model.num_layers)
        if not errs and plan.peft:
            errs = expert_problems(model, plan)
            if not errs:
                try:
                    lora_targets(model, plan)
                except AdvisorInputError as e:
                    errs = [e]
        return errs + card.problems(plan)

    return check


class DeadEnd(LookupError):
    """No value of a knob is allowed after the knobs chosen before it (a rule the lookahead missed)."""

    def __init__(self, knob: str, params: dict[str, Any]):
        super().__init__(f"no value of {knob} is allowed after {params}")
        self.knob = knob
        self.params = params


def param_name(knob: str, offered: list, choices: list) -> str:
    """The Optuna parameter name of a knob asked with ``offered`` out of the space's ``choices``.

    Optuna fixes a categorical parameter's choices at its first use, so a knob asked with only some
    of its choices gets a name of its own, e.g. ``quantization[nf4|fp4]``.
    """
    if list(offered) == list(choices):
        return knob
    return f"{knob}[{'|'.join(map(str, offered))}]"


class Conditions:
    """The plan rules applied to a space's knobs, for one model (memoized: make one per study).

    A value is offered for a knob when some valid plan (every rule checked) extends the point so far
    with it, so a walk never runs into a dead end. The search for that plan is pruned by the partial
    check: the point so far breaks no rule reported under a knob already chosen (the knobs not chosen
    yet keep the Plan's defaults), and every later knob still has a value that breaks none.
    """

    def __init__(self, space: SearchSpace, arch: dict[str, Any] | None = None, check: Check | None = None):
        self.space = space
        self.arch = arch or {}
        self.check: Check = check or space.plan.problems
        self.knobs = search_knobs(space.plan)
        self.order = [k for k in self.knobs if k in space.search]
        self._flag_field = {k.flag: k.name for k in knobs(space.plan)}
        self.workload = space.workload
        self._breaks: dict[frozenset, bool] = {}
        self._offered: dict[tuple, list] = {}
        self._complete: dict[tuple, bool] = {}

    def _knob_of(self, where: str) -> str:
        name = self._flag_field.get(where, where)
        return _FIELD_KNOB.get(name, name)

    def applies(self, knob: str, params: dict[str, Any]) -> bool:
        """Does ``knob`` mean anything for the point chosen so far?"""
        return self.knobs[knob].applies_to({**self.workload, **params})

    def inactive(self, knob: str) -> Any:
        """The value ``knob`` holds where it does not apply."""
        return self.knobs[knob].inactive

    def breaks(self, params: dict[str, Any]) -> bool:
        """Does the point so far break a rule reported under one of its knobs (or under a fixed value)?"""
        key = frozenset(params.items())
        hit = self._breaks.get(key)
        if hit is None:
            knobs_hit = [self._knob_of(e.where) for e in self.check(plan_from_params(params, self.space, self.arch))]
            hit = any(k in params or k not in self.knobs for k in knobs_hit)
            self._breaks[key] = hit
        return hit

    def _settles(self, knob: str, params: dict[str, Any]) -> bool:
        k = self.knobs[knob]
        values = list(self.space.search[knob]) + ([k.inactive] if k.applies is not None else [])
        return any(not self.breaks({**params, knob: v}) for v in values)

    def _leads_on(self, i: int, params: dict[str, Any], v: Any) -> bool:
        """Does value ``v`` of knob ``order[i]`` after ``params`` lead to at least one valid plan?"""
        point = {**params, self.order[i]: v}
        return (not self.breaks(point)
                and all(self._settles(j, point) for j in self.order[i + 1:])  # cheap pruning first
                and self._completes(i + 1, point))

    def _allowed(self, i: int, params: dict[str, Any]) -> list:
        """The values of knob ``order[i]`` after ``params`` that lead to at least one valid plan."""
        key = (i, frozenset(params.items()))
        if key not in self._offered:
            self._offered[key] = [v for v in self.space.search[self.order[i]] if self._leads_on(i, params, v)]
        return self._offered[key]

    def _completes(self, i: int, params: dict[str, Any]) -> bool:
        """Is there a valid plan that extends ``params`` (knobs ``order[:i]`` chosen)? Depth first, stopping
        at the first one found (usually on the first path), memoized."""
        key = (i, frozenset(params.items()))
        hit = self._complete.get(key)
        if hit is None:
            if i == len(self.order):
                hit = not self.check(plan_from_params(params, self.space, self.arch))
            elif not self.applies(self.order[i], params):
                hit = self._completes(i + 1, {**params, self.order[i]: self.inactive(self.order[i])})
            elif key in self._offered:
                hit = bool(self._offered[key])
            else:
                hit = any(self._leads_on(i, params, v) for v in self.space.search[self.order[i]])
            self._complete[key] = hit
        return hit

    def offered(self, knob: str, params: dict[str, Any]) -> list:
        """The values of ``knob`` after ``params`` (the knobs before it) that lead to a valid plan, in the space's
        order."""
        return self._allowed(self.order.index(knob), params)

    def walk(self, ask: Ask) -> dict[str, Any]:
        """One point, each knob in turn: not asked where it does not apply or where one value is left."""
        params: dict[str, Any] = {}
        for knob in self.order:
            if not self.applies(knob, params):
                params[knob] = self.inactive(knob)
                continue
            offered = self.offered(knob, params)
            if not offered:
                raise DeadEnd(knob, params)
            params[knob] = offered[0] if len(offered) == 1 else ask(
                param_name(knob, offered, self.space.search[knob]), knob, offered)
        return params

    def _grid_values(self, knob: str, params: dict[str, Any]) -> Iterator[Any]:
        """The values the grid takes for ``knob`` after ``params``: its inactive value where it does not apply, else
        the space's choices that break no rule with the knobs before it."""
        if not self.applies(knob, params):
            yield self.inactive(knob)
            return
        for v in self.space.search[knob]:
            if not self.breaks({**params, knob: v}):
                yield v

    def points(self) -> Iterator[dict[str, Any]]:
        """Every valid point, depth first in the space's order."""

        def rest(params: dict[str, Any], i: int) -> Iterator[dict[str, Any]]:
            if i == len(self.order):
                if not self.check(plan_from_params(params, self.space, self.arch)):
                    yield params
                return
            knob = self.order[i]
            for v in self._grid_values(knob, params):
                yield from rest({**params, knob: v}, i + 1)

        return rest({}, 0)

    def holds(self, point: dict[str, Any]) -> bool:
        """Whether ``points()`` yields ``point``, by its own rules along the one path to it (without enumerating a
        grid that may hold millions of points)."""
        params: dict[str, Any] = {}
        for knob in self.order:
            if knob not in point or point[knob] not in self._grid_values(knob, params):
                return False
            params[knob] = point[knob]
        return params == point and not self.check(plan_from_params(params, self.space, self.arch))

    def optuna_params(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """A point under the Optuna parameter names a walk asks, for ``enqueue_trial`` (None: no walk reaches it).

        A point written before a knob existed (a ladder rung, an older study's) takes the knob's default."""
        named: dict[str, Any] = {}
        renamed = _renames(self.knobs)
        params = dict(params)
        for old, (new, convert) in renamed.items():
            if old in params:
                params.setdefault(new, convert(params.pop(old)))
        params = {**{k.name: k.default for k in self.knobs.values() if not k.search.required}, **params}

        def ask(name: str, knob: str, offered: list) -> Any:
            value = params[knob] if knob in params else None
            if value not in offered:
                raise DeadEnd(knob, params)
            named[name] = value
            return value

        try:
            got = self.walk(ask)
        except DeadEnd:
            return None
        if any(got[k] != params[k] for k in got if k in params and self.applies(k, got)):
            return None
        return named
