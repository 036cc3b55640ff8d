"""Search spaces: YAML files in ``search_spaces/`` (or the user's), validated with every error at once.

A space has ``fixed`` values (the job: sequence length, global batch...) and ``search`` choices
(the knobs). ``key=value`` overrides on the command line set either: a single value pins a knob.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.plan import ATTENTION, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS, QUANTIZATIONS, Plan

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"

# knob -> allowed values (None: any positive int)
SEARCH_KEYS: dict[str, tuple | None] = {
    "method": METHODS, "quantization": QUANTIZATIONS, "double_quant": (True, False), "lora_r": None,
    "lora_targets": None, "gradient_checkpointing": (True, False), "optimizer": OPTIMIZERS, "micro_batch": None,
    "precision": PRECISIONS, "attn_impl": ATTENTION, "offload": OFFLOADS, "chunked_ce": (True, False),
}
FIXED_KEYS = {"seq_len": "int", "global_batch": "int", "lora_dropout": "dropout", "lora_alpha_ratio": "positive"}
QUANT_FOR_METHOD = {"qlora": ("nf4", "fp4"), "lora": ("none", "int8"), "full": ("none",)}


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

    def quantizations_for(self, method: str) -> list[str]:
        return [q for q in self.search["quantization"] if q in QUANT_FOR_METHOD[method]]

    def methods(self) -> list[str]:
        """Methods that have at least one allowed quantization."""
        return [m for m in self.search["method"] if self.quantizations_for(m)]

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every combination of knob values (conditional knobs only where they apply)."""
        for method in self.methods():
            peft = method != "full"
            for quant in self.quantizations_for(method):
                four_bit = quant in ("nf4", "fp4")
                dims = {
                    "double_quant": self.search["double_quant"] if four_bit else [False],
                    "lora_r": self.search["lora_r"] if peft else [None],
                    "lora_targets": self.search["lora_targets"] if peft else [None],
                    "gradient_checkpointing": self.search["gradient_checkpointing"],
                    "optimizer": self.search["optimizer"], "micro_batch": self.search["micro_batch"],
                    "precision": self.search["precision"], "attn_impl": self.search["attn_impl"],
                    "offload": self.search["offload"], "chunked_ce": self.search["chunked_ce"],
                }
                keys = list(dims)
                for combo in itertools.product(*(dict.fromkeys(dims[k]) for k in keys)):
                    yield {"method": method, "quantization": quant, **dict(zip(keys, combo))}


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
    search = dict(data.get("search") or {})
    errors: list[AdvisorInputError] = []
    for text in overrides:
        try:
            key, value = parse_override(text)
        except AdvisorInputError as e:
            errors.append(e)
            continue
        if key in SEARCH_KEYS:
            search[key] = value if isinstance(value, list) else [value]
        elif key in FIXED_KEYS or key == "trials":
            if key == "trials":
                data["trials"] = value
            else:
                fixed[key] = value
        else:
            errors.append(AdvisorInputError(key, f"unknown key; knobs: {', '.join(SEARCH_KEYS)}; "
                                                 f"fixed: {', '.join(FIXED_KEYS)}", text))
    errors += _check(data, fixed, search)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
    return SearchSpace(name=str(data.get("name") or Path(source).stem), trials=int(data.get("trials", 40)),
                       fixed=fixed, search=search, source=source, overrides=tuple(overrides))


def _check(data: dict, fixed: dict, search: dict) -> list[AdvisorInputError]:
    errs: list[AdvisorInputError] = []
    trials = data.get("trials", 40)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        errs.append(AdvisorInputError("trials", "must be a whole number of at least 1", trials))
    for key in fixed:
        if key not in FIXED_KEYS:
            errs.append(AdvisorInputError(f"fixed.{key}", f"unknown key (known: {', '.join(FIXED_KEYS)})", key,
                                          show_value=False))
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
            elif key == "lora_targets" and not (isinstance(v, str) and v):
                errs.append(AdvisorInputError(f"search.{key}", "choices are set names (attention, mlp, all-linear) "
                                                               "or comma-separated module names", v))
    if not errs and not [m for m in search["method"] if any(q in QUANT_FOR_METHOD[m] for q in search["quantization"])]:
        errs.append(AdvisorInputError("search.quantization", "no method has an allowed quantization "
                                      "(qlora needs nf4/fp4, lora none/int8, full none)", search["quantization"]))
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
    """The Plan for one point of the space (the fixed values filled in)."""
    fixed = space.fixed
    mb = params["micro_batch"]
    peft = params["method"] != "full"
    r = params.get("lora_r") or 16
    precision = params["precision"]
    return Plan(
        method=params["method"], quantization=params["quantization"],
        double_quant=bool(params.get("double_quant")),
        compute_dtype="fp16" if "fp16" in precision else "fp32" if precision == "fp32" else "bf16",
        precision=precision, lora_r=r, lora_alpha=float(fixed["lora_alpha_ratio"] * r),
        lora_dropout=float(fixed["lora_dropout"]),
        lora_targets=resolve_targets(params.get("lora_targets") or "attention", arch) if peft else ("q_proj",),
        gradient_checkpointing=params["gradient_checkpointing"], optimizer=params["optimizer"], micro_batch=mb,
        grad_accum=max(1, math.ceil(fixed["global_batch"] / mb)), seq_len=fixed["seq_len"],
        attn_impl=params["attn_impl"], offload=params["offload"], chunked_ce=params["chunked_ce"],
    )
