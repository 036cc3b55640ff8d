"""Search spaces: YAML files in ``advisor/data/spaces/`` (or the user's), validated with every error at once.

A space has ``fixed`` values (the job: sequence length, global batch...) and ``search`` choices
(the knobs). ``key=value`` overrides on the command line set either: a single value pins a knob.

Knobs are conditional (Optuna's define-by-run): a point of the space is chosen one knob at a time,
in the order of ``SEARCH_KEYS``, and each knob is asked only where it means something (``WHEN``) and
only with the values the plan rules (``Plan.problems``) allow after the knobs chosen before it
(``Conditions``). Every point the tuner proposes is therefore a valid plan. How a new knob declares
its condition: see the comment above ``WHEN`` and ``advisor/data/spaces/README.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.plan import (ATTENTION, LOSSES, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS, QUANTIZATIONS, Plan,
                               checkpoint_depth_problems, flag_of, lora_target_modules)

SPACES_DIR = Path(__file__).resolve().parents[1] / "data" / "spaces"
"""The shipped search spaces (package data: they travel in the wheel)."""
DEFAULT_TRIALS = 40
"""Finished trials a study aims for when its space names none (``trials:``)."""

# knob -> allowed values (None: any positive int). The order is the order a point is chosen in:
# a knob comes after every knob its plan rules involve.
SEARCH_KEYS: dict[str, tuple | None] = {
    "method": METHODS, "quantization": QUANTIZATIONS, "double_quant": (True, False), "lora_r": None,
    "lora_targets": None, "dora": (True, False), "gradient_checkpointing": (True, False),
    "checkpoint_layers": None, "activation_offload": (True, False),
    "optimizer": OPTIMIZERS, "micro_batch": None,
    "precision": PRECISIONS, "attn_impl": ATTENTION, "offload": OFFLOADS, "loss": LOSSES, "packing": (True, False),
    "optimizer_in_backward": (True, False),
    "expandable_segments": (True, False),
}
# knobs a space file may leave out (spaces written before the knob existed): the choice it then has
# (every layer checkpointed when checkpointing, activations on the device, the optimizer step after backward)
OPTIONAL_KNOBS: dict[str, list] = {"expandable_segments": [False], "checkpoint_layers": [None],
                                   "activation_offload": [False], "optimizer_in_backward": [False]}
LEVER_KNOBS: dict[str, list] = {"dora": [False], "loss": ["plain"], "packing": [False]}
"""The loss / DoRA / packing knobs a space file may leave out: the Plan's default."""
LEGACY_KNOBS = {"chunked_ce": ("loss", lambda v: "chunked" if v else "plain")}
"""Knobs of older space files → (the knob now, the value now)."""
FIXED_KEYS = {"seq_len": "int", "global_batch": "int", "lora_dropout": "dropout", "lora_alpha_ratio": "positive"}
# fixed values a space may leave out (0: the run does not evaluate / generate, as the exported configs):
# they put evaluation at that batch and generation-based evaluation in the run's peak (advisor.memory.phases)
OPTIONAL_FIXED_KEYS = {"eval_batch": 0, "max_new_tokens": 0}
KNOWN_FIXED_KEYS = (*FIXED_KEYS, *OPTIONAL_FIXED_KEYS)

# Where a knob applies at all, and the value it takes where it does not (it is then never asked).
# A knob without an entry applies everywhere. Which *values* a knob may take is not written here:
# it follows from the plan rules (Plan.problems) through Conditions.
#
# Adding a knob: (1) a Plan field whose default breaks no rule; (2) its rules in Plan.problems(),
# each reported under the knob that comes last in SEARCH_KEYS among the knobs the rule involves;
# (3) an entry in SEARCH_KEYS placed after those knobs (plan_from_params passes a knob named like a
# Plan field straight through); (4) an entry here if it means nothing for some points (a DoRA flag
# without adapters, a number of checkpointed layers without checkpointing). tests/test_space.py
# samples every shipped space and fails on any proposal that is not a valid plan.
FOUR_BIT = ("nf4", "fp4")
WHEN: dict[str, tuple[Callable[[dict[str, Any]], bool], Any]] = {
    "double_quant": (lambda p: p.get("quantization") in FOUR_BIT, False),  # constants of 4-bit weights only
    "lora_r": (lambda p: p.get("method") != "full", None),  # adapters only
    "lora_targets": (lambda p: p.get("method") != "full", None),
    "dora": (lambda p: p.get("method") != "full", False),  # decomposes adapters: none in a full fine-tune
    "checkpoint_layers": (lambda p: bool(p.get("gradient_checkpointing")), None),  # k of L only with checkpointing
}


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space."""

    name: str
    trials: int
    fixed: dict[str, Any]
    search: dict[str, list]
    source: str = ""
    overrides: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "trials": self.trials, "fixed": self.fixed, "search": self.search,
                "source": self.source, "overrides": list(self.overrides)}

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


def load_space(ref: str = "default", overrides: list[str] | tuple[str, ...] = ()) -> SearchSpace:
    """Load, apply ``key=value`` overrides, validate (all errors at once)."""
    data, source = read_space_file(ref, "train")
    fixed = dict(data.get("fixed") or {})
    search = _lever_defaults(dict(data.get("search") or {}))
    for key, default in OPTIONAL_KNOBS.items():
        search.setdefault(key, list(default))
    errors: list[AdvisorInputError] = []
    for text, key, value in parsed_overrides(overrides, errors):
        if key in LEGACY_KNOBS:
            key, value = LEGACY_KNOBS[key][0], [LEGACY_KNOBS[key][1](v) for v in
                                                (value if isinstance(value, list) else [value])]
        if key in SEARCH_KEYS:
            search[key] = value if isinstance(value, list) else [value]
        elif key in KNOWN_FIXED_KEYS or key == "trials":
            if key == "trials":
                data["trials"] = value
            else:
                fixed[key] = value
        else:
            errors.append(AdvisorInputError(key, f"unknown key; knobs: {', '.join(SEARCH_KEYS)}; "
                                                 f"fixed: {', '.join(KNOWN_FIXED_KEYS)}", text))
    errors += _check(data, fixed, search)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
    return SearchSpace(name=str(data.get("name") or Path(source).stem), trials=int(data.get("trials", 40)),
                       fixed=fixed, search=search, source=source, overrides=tuple(overrides))


def _lever_defaults(search: dict) -> dict:
    """Fill the knobs a space may leave out; read an older space's knobs as today's (chunked_ce → loss)."""
    for old, (new, convert) in LEGACY_KNOBS.items():
        if old in search and new not in search:
            values = search.pop(old)
            search[new] = list(dict.fromkeys(convert(v) for v in values)) if isinstance(values, list) else values
    return {**{k: v for k, v in LEVER_KNOBS.items() if k not in search}, **search}


def _lever_point(params: dict[str, Any]) -> dict[str, Any]:
    """A point with the lever knobs' defaults filled in and older knobs read as today's."""
    params = dict(params)
    for old, (new, convert) in LEGACY_KNOBS.items():
        if old in params:
            params.setdefault(new, convert(params.pop(old)))
    return {**{k: v[0] for k, v in LEVER_KNOBS.items()}, **params}


def _check(data: dict, fixed: dict, search: dict) -> list[AdvisorInputError]:
    errs: list[AdvisorInputError] = []
    trials = data.get("trials", 40)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        errs.append(AdvisorInputError("trials", "must be a whole number of at least 1", trials))
    for key in fixed:
        if key not in KNOWN_FIXED_KEYS:
            errs.append(AdvisorInputError(f"fixed.{key}", f"unknown key (known: {', '.join(KNOWN_FIXED_KEYS)})", key,
                                          show_value=False))
    for key in OPTIONAL_FIXED_KEYS:
        v = fixed.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            errs.append(AdvisorInputError(f"fixed.{key}", "must be a whole number of at least 0", v))
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
    for key in search:
        if key not in SEARCH_KEYS:
            errs.append(AdvisorInputError(f"search.{key}", f"unknown knob (known: {', '.join(SEARCH_KEYS)})", key,
                                          show_value=False))
    for key, allowed in SEARCH_KEYS.items():
        values = search.get(key)
        if not isinstance(values, list) or not values:
            errs.append(AdvisorInputError(f"search.{key}", "must be a non-empty list of choices", values))
            continue
        for v in values:
            if allowed is not None and v not in allowed:
                errs.append(AdvisorInputError(f"search.{key}", f"must be among {', '.join(map(str, allowed))}", v))
            elif key in ("lora_r", "micro_batch") and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                errs.append(AdvisorInputError(f"search.{key}", "choices must be whole numbers of at least 1", v))
            elif key == "checkpoint_layers" and v is not None and (not isinstance(v, int) or isinstance(v, bool)
                                                                   or v < 1):
                errs.append(AdvisorInputError(f"search.{key}", "choices are null (every layer) or whole numbers "
                                                               "of at least 1", v))
            elif key == "lora_targets" and not (isinstance(v, str) and v):
                errs.append(AdvisorInputError(f"search.{key}", "choices are set names (attention, mlp, all-linear) "
                                                               "or comma-separated module names", v))
    if not errs:
        space = SearchSpace(name="", trials=1, fixed=fixed, search=search)
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


_PLAN_FIELDS = tuple(f.name for f in fields(Plan))


def plan_from_params(params: dict[str, Any], space: SearchSpace, arch: dict[str, Any]) -> Plan:
    """The Plan for one point of the space (the fixed values filled in).

    A knob named like a Plan field passes straight through; a knob missing from ``params`` (a point
    chosen part way) keeps the Plan's default.
    """
    fixed = space.fixed
    values = {k: v for k, v in params.items() if k in _PLAN_FIELDS}
    method = values.get("method", Plan.method)
    precision = values.get("precision", Plan.precision)
    mb = values.get("micro_batch", Plan.micro_batch)
    r = params.get("lora_r") or 16
    values.update(
        double_quant=bool(params.get("double_quant")),
        compute_dtype="fp16" if "fp16" in precision else "fp32" if precision == "fp32" else "bf16",
        lora_r=r, lora_alpha=float(fixed["lora_alpha_ratio"] * r), lora_dropout=float(fixed["lora_dropout"]),
        lora_targets=(resolve_targets(params.get("lora_targets") or "attention", arch) if method != "full"
                      else ("q_proj",)),
        grad_accum=max(1, math.ceil(fixed["global_batch"] / mb)), seq_len=fixed["seq_len"],
        **{key: int(fixed.get(key, default)) for key, default in OPTIONAL_FIXED_KEYS.items()},
    )
    return Plan(**values)


# ----------------------------------------------------------------------------- conditional knobs

# Plan fields set by another knob (derived in plan_from_params): a rule reported under one is the knob's
_FIELD_KNOB = {"compute_dtype": "precision", "lora_alpha": "lora_r", "grad_accum": "micro_batch"}
_FLAG_FIELD = {flag_of(name): name for name in _PLAN_FIELDS}

Check = Callable[[Plan], list[AdvisorInputError]]
"""A plan → every rule it breaks (Plan.problems, plus what a model adds: its modules for lora_targets)."""
Ask = Callable[[str, str, list], Any]
"""(Optuna parameter name, knob, the values offered) → the value chosen."""


def model_rules(model) -> Check:
    """The plan rules for one model: Plan.problems, then the adapter targets its layers really have."""
    linears = list(model.linear_shapes())

    def check(plan: Plan) -> list[AdvisorInputError]:
        errs = plan.problems() + checkpoint_depth_problems(plan, model.num_layers)
        if not errs and plan.peft:
            try:
                lora_target_modules(plan, linears)
            except AdvisorInputError as e:
                errs = [e]
        return errs

    return check


class DeadEnd(LookupError):
    """No value of a knob is allowed after the knobs chosen before it (a rule the lookahead missed)."""

    def __init__(self, knob: str, params: dict[str, Any]):
        super().__init__(f"no value of {knob} is allowed after {params}")
        self.knob = knob
        self.params = params


def applies(knob: str, params: dict[str, Any]) -> bool:
    """Does ``knob`` mean anything for the point chosen so far?"""
    rule = WHEN.get(knob)
    return rule is None or bool(rule[0](params))


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
        self.check: Check = check or Plan.problems
        self.order = [k for k in SEARCH_KEYS if k in space.search]
        self._breaks: dict[frozenset, bool] = {}
        self._offered: dict[tuple, list] = {}
        self._complete: dict[tuple, bool] = {}

    @staticmethod
    def _knob_of(where: str) -> str:
        name = _FLAG_FIELD.get(where, where)
        return _FIELD_KNOB.get(name, name)

    def breaks(self, params: dict[str, Any]) -> bool:
        """Does the point so far break a rule reported under one of its knobs (or under a fixed value)?"""
        key = frozenset(params.items())
        hit = self._breaks.get(key)
        if hit is None:
            knobs = [self._knob_of(e.where) for e in self.check(plan_from_params(params, self.space, self.arch))]
            hit = any(k in params or k not in SEARCH_KEYS for k in knobs)
            self._breaks[key] = hit
        return hit

    def _settles(self, knob: str, params: dict[str, Any]) -> bool:
        values = list(self.space.search[knob]) + ([WHEN[knob][1]] if knob in WHEN else [])
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
            elif not applies(self.order[i], params):
                hit = self._completes(i + 1, {**params, self.order[i]: WHEN[self.order[i]][1]})
            elif key in self._offered:
                hit = bool(self._offered[key])
            else:
                hit = any(self._leads_on(i, params, v) for v in self.space.search[self.order[i]])
            self._complete[key] = hit
        return hit

    def offered(self, knob: str, params: dict[str, Any]) -> list:
        """The values of ``knob`` after ``params`` (the knobs before it) that lead to a valid plan, in the space's order."""
        return self._allowed(self.order.index(knob), params)

    def walk(self, ask: Ask) -> dict[str, Any]:
        """One point, each knob in turn: not asked where it does not apply or where one value is left."""
        params: dict[str, Any] = {}
        for knob in self.order:
            if not applies(knob, params):
                params[knob] = WHEN[knob][1]
                continue
            offered = self.offered(knob, params)
            if not offered:
                raise DeadEnd(knob, params)
            params[knob] = offered[0] if len(offered) == 1 else ask(
                param_name(knob, offered, self.space.search[knob]), knob, offered)
        return params

    def points(self) -> Iterator[dict[str, Any]]:
        """Every valid point, depth first in the space's order."""

        def rest(params: dict[str, Any], i: int) -> Iterator[dict[str, Any]]:
            if i == len(self.order):
                if not self.check(plan_from_params(params, self.space, self.arch)):
                    yield params
                return
            knob = self.order[i]
            if not applies(knob, params):
                yield from rest({**params, knob: WHEN[knob][1]}, i + 1)
                return
            for v in self.space.search[knob]:
                if not self.breaks({**params, knob: v}):
                    yield from rest({**params, knob: v}, i + 1)

        return rest({}, 0)

    def optuna_params(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """A point under the Optuna parameter names a walk asks, for ``enqueue_trial`` (None: no walk reaches it)."""
        named: dict[str, Any] = {}
        params = _lever_point(params)  # a point written before the lever knobs
        params = {**{k: v[0] for k, v in OPTIONAL_KNOBS.items()}, **params}  # a ladder point predates them

        def ask(name: str, knob: str, offered: list) -> Any:
            # a point written before an optional knob existed takes the knob's default choice
            value = params[knob] if knob in params else OPTIONAL_KNOBS.get(knob, [None])[0]
            if value not in offered:
                raise DeadEnd(knob, params)
            named[name] = value
            return value

        try:
            got = self.walk(ask)
        except DeadEnd:
            return None
        if any(got[k] != params[k] for k in got if k in params and applies(k, got)):
            return None
        return named
