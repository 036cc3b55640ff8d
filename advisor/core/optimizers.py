"""The optimizers a plan may name, each declared once in ``advisor/data/optimizers.yaml``.

The Plan's ``--optimizer`` choices and its kinds (low-rank, inside backward, paged), the names config files
use for each, and how the real step calls backward derive from this declaration. The optimizer's memory,
step-time and quality terms live with their models and are required for every optimizer declared here (none
falls back to another's): tests/test_lever_values.py holds each to all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError, ConfigErrors

DATA_FILE = "optimizers.yaml"
STATES = ("none", "moments", "8bit", "4bit", "factored", "low-rank")
"""What an optimizer keeps per trainable parameter after the first step (optimizers.yaml's header)."""
FLAGS = ("low_rank", "in_backward", "fused_backward", "paged")
KEYS = ("state", "aliases", *FLAGS, "source")


@dataclass(frozen=True)
class Optimizer:
    """One optimizer's declaration (optimizers.yaml)."""

    name: str
    """TrainingArguments.optim: the name the run is built with."""
    state: str
    """STATES: what it keeps per trainable parameter ("none": nothing)."""
    source: str
    aliases: tuple[str, ...] = ()
    """Other names config files use for it."""
    low_rank: bool = False
    """Projects each targeted weight's gradient to rank ``optim_rank`` (GaLore, APOLLO)."""
    in_backward: bool = False
    """Updates each parameter inside backward and frees its gradient at once."""
    fused_backward: bool = False
    """The run calls ``optimizer.fused_backward(loss, lr)`` instead of ``loss.backward()`` (LOMO's API)."""
    paged: bool = False
    """States in CUDA unified memory (bitsandbytes paged optimizers)."""

    @property
    def stateful(self) -> bool:
        return self.state != "none"


def parse_optimizers(raw: Any) -> dict[str, Optimizer]:
    """optimizers.yaml's content, validated (every problem at once, each naming its key)."""
    errs: list[AdvisorInputError] = []

    def bad(where: str, rule: str, value: Any = None, show: bool = True) -> None:
        errs.append(AdvisorInputError(f"{DATA_FILE}: {where}", rule, value, show_value=show))

    if not isinstance(raw, dict) or not raw:
        bad("top level", "must map each optimizer name to its declaration", type(raw).__name__)
        raise errs[0]
    out: dict[str, Optimizer] = {}
    seen: dict[str, str] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            bad(str(name), "must be a mapping of declaration keys", spec)
            continue
        for key in spec:
            if key not in KEYS:
                bad(f"{name}.{key}", f"unknown key (known: {', '.join(KEYS)})", key)
        if spec.get("state") not in STATES:
            bad(f"{name}.state", f"must be one of {', '.join(STATES)}", spec.get("state"))
        if not isinstance(spec.get("source"), str) or not spec["source"].strip():
            bad(f"{name}.source", "required: a non-empty line", spec.get("source"))
        for flag in FLAGS:
            if not isinstance(spec.get(flag, False), bool):
                bad(f"{name}.{flag}", "must be true or false", spec.get(flag))
        aliases = spec.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
            bad(f"{name}.aliases", "must be a list of names", aliases)
            aliases = []
        if spec.get("fused_backward") and not spec.get("in_backward"):
            bad(f"{name}.fused_backward", "an optimizer with its own backward updates inside it: set in_backward",
                True)
        for n in (name, *aliases):
            if n in seen:
                bad(f"{name}.aliases" if n != name else str(name), f"{n!r} already names {seen[n]}", n)
            seen[n] = str(name)
        if not errs:
            out[str(name)] = Optimizer(name=str(name), state=spec["state"], source=spec["source"],
                                       aliases=tuple(aliases), **{f: spec.get(f, False) for f in FLAGS})
    if len(errs) == 1:
        raise errs[0]
    if errs:
        raise ConfigErrors(errs)
    return out


@lru_cache(maxsize=1)
def optimizers() -> dict[str, Optimizer]:
    """Every declared optimizer by name, in the file's order (read once; read-only)."""
    return parse_optimizers(load_data_file(DATA_FILE))


def optimizer(name: str) -> Optimizer:
    """The declaration of ``name``; an optimizer not declared is an error naming the flag, never another's terms."""
    try:
        return optimizers()[name]
    except KeyError:
        raise AdvisorInputError("--optimizer", f"not declared in advisor/data/{DATA_FILE} (declared: "
                                f"{', '.join(optimizers())})", name) from None


def optimizer_aliases() -> dict[str, str]:
    """Every name a config file may use for an optimizer → the Plan's name (each name is read as itself)."""
    out: dict[str, str] = {}
    for o in optimizers().values():
        out[o.name] = o.name
        out.update({a: o.name for a in o.aliases})
    return out


def names_where(flag: str) -> tuple[str, ...]:
    """The optimizers whose declaration sets ``flag`` (FLAGS), in the file's order."""
    if flag not in FLAGS:
        raise KeyError(f"{flag!r} is not an optimizer flag (flags: {', '.join(FLAGS)})")
    return tuple(n for n, o in optimizers().items() if getattr(o, flag))


__all__ = ["DATA_FILE", "FLAGS", "Optimizer", "STATES", "names_where", "optimizer", "optimizer_aliases", "optimizers",
           "parse_optimizers"]
