"""One declaration per knob: what the advisor says about a Plan field, written once, beside the field.

A Plan field is declared with ``knob(default, help=..., ...)``: a ``dataclasses.field`` whose metadata
holds a ``Knob`` (transformers' ``TrainingArguments`` does the same with ``metadata={"help": ...}``,
and ``HfArgumentParser`` derives the command line from it). Everything else is derived from these
declarations, never listed again:

- the command line: each knob's flag, parse type, choices and help with its default
  (``advisor.commands.common.add_plan_flags`` / ``plan_from_args``), and ``flag_of``;
- ``Plan.short()`` (each knob's ``Tag``) and the value rules every knob states (choices, ranges);
- the search space (``advisor.search.space``): which knobs are searched, in which order, where each
  applies and the value it takes elsewhere, what a space file that leaves it out gets, its place in
  the ladder and in the most frugal plan;
- what the knob is: a lever (how to train, the default) or the user's workload (``Workload``: what is trained
  on what, which the search never turns, a space states among its fixed values and the quality model prices
  nothing for);
- the export formats (``advisor.configs``): the key each format writes the knob to and reads it from
  (``Key``), the key its own code handles (``Custom``), or why the format refuses a plan that sets it
  (``Refused``) or needs no key (``Unkeyed``). A format that declares nothing for a knob refuses a plan
  that sets it.

How to add a knob: docs/adding-a-knob.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

Values = Mapping[str, Any]
"""A plan's fields by name, or the knobs of a point of the search space chosen so far."""

PLAN_DEFAULT: Any = type("PlanDefault", (), {"__repr__": lambda self: "PLAN_DEFAULT"})()
"""Where a tool's default is asked for: the knob's own default."""


# --------------------------------------------------------------------------- pieces of a declaration


@dataclass(frozen=True)
class Range:
    """The numbers a knob may take (the command line parses into it; ``Plan.problems`` checks it)."""

    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None
    """Exclusive."""
    whole: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.whole and not isinstance(value, int):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return self.high is None or value < self.high

    @property
    def rule(self) -> str:
        """The rule in words, as an error says it."""
        if self.whole:
            return f"must be a whole number of at least {self.low:g}" + (" (0: the default)" if self.low == 0 else "")
        if self.high is not None:
            return f"must be in [{self.low:g}, {self.high:g})"
        return f"must be {'at least' if self.low_inclusive else 'greater than'} {self.low:g}"


@dataclass(frozen=True)
class Cli:
    """How the command line (advisor estimate / probe) sets the knob. The flag is ``--name-with-dashes``
    unless given; a boolean knob is a switch; choices and numbers parse by the knob's choices / Range."""

    flag: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    """Text → value, for a knob that is neither a choice nor a number (lora_targets)."""
    default: Callable[[Values], Any] | None = None
    """A default that follows other knobs (quantization follows the method); the flag's own default is then
    unset, and ``default_means`` says it in words."""
    default_means: str | None = None
    """What the default means, where its value alone says too little ("0: the micro-batch")."""
    alias: tuple[str, Any] | None = None
    """(flag, value): a second flag that sets this knob to ``value`` (``--chunked-ce`` is ``--loss chunked``)."""
    alias_implies: tuple[str, Any] | None = None
    """(knob, value): the alias flag also sets that knob (``--checkpoint-offload`` is ``--activation-offload
    --gradient-checkpointing``); the knob's own flag does not."""
    alias_help: str | None = None
    """What the alias flag's help says before "the same as ..." (the lever it names)."""
    implies: tuple[str, Any] | None = None
    """(knob, value): setting this knob away from its default sets that knob (``--checkpoint-layers``
    turns ``--gradient-checkpointing`` on)."""
    repeat: bool = False
    """The flag may be given several times, each one more value of a tuple knob (``--image-size 1024x768
    --image-size 640x480``: two images per sample)."""


@dataclass(frozen=True)
class Tag:
    """How ``Plan.short()`` shows the knob: a word (or a suffix glued to another knob's word).

    ``show``: a string (a boolean knob: the word when it is on), ``plan -> str | None``, or None (the
    value itself, left out at the knob's default: ``offload`` shows ``zero2_cpu``, nothing for none). Words come in
    field order, except a tag ``after`` another knob comes right after that knob's word (``joined``:
    glued to it, and left out with it). A new knob's tag comes last, and is absent at its default, so
    the summaries of existing plans (the keys studies are stored under) never change."""

    show: str | Callable[[Any], str | None] | None = None
    after: str | None = None
    joined: bool = False


def prefer(*values: Any) -> Callable[[Sequence], Any]:
    """A picker: the first of ``values`` among the space's choices, else the space's first choice."""
    def pick(choices: Sequence) -> Any:
        return next((v for v in values if v in choices), choices[0])
    return pick


def first(choices: Sequence) -> Any:
    """A picker: the space's first choice."""
    return choices[0]


@dataclass(frozen=True)
class Search:
    """How the tuner searches the knob (advisor.search.space; how-to: advisor/data/spaces/README.md)."""

    order: float | None = None
    """Where the knob is chosen in a point (ascending): after every knob its plan rules involve, since each
    rule is reported under the last of them. None: after the numbered knobs, in field order (the safe
    place for a new knob whose rules are reported under it)."""
    required: bool = False
    """A space file must list it; otherwise a space that leaves it out (one written before the knob
    existed) gets the knob's default as its only choice."""
    inactive: Any = PLAN_DEFAULT
    """The value a point holds where the knob does not apply (``Knob.applies``); it is then never asked."""
    choice: Callable[[Any], bool] | None = None
    """What one of a space's choices may be, for a knob without choices or a Range (lora_targets' set names)."""
    choice_rule: str | None = None
    ladder: Callable[[Sequence], Any] | None = None
    """The value the ladder's rungs take from the space's choices (advisor.search.ladder), where it is not
    one of the rungs' own levers; None: the rungs leave it to the space's default."""
    frugal: Callable[[Sequence], Any] | None = None
    """The value the most frugal plan takes (advisor.search.tuner.smallest_plan_report); None: the Plan's default."""
    within: Callable[[Values], bool] | None = None
    """The workloads whose spaces search the knob (a test of the space's fixed values: a GRPO lever's task); None:
    every one. A space of another workload holds no entry for it (an SFT space lists no GRPO lever), so its
    choices, its identity and its study name stay those it had before the knob existed."""

    def searched_within(self, workload: Values) -> bool:
        return self.within is None or bool(self.within(workload))


LEVER, WORKLOAD = "lever", "workload"
ROLES = (LEVER, WORKLOAD)
"""What a knob is: a lever (how the model is trained: the search may turn it, the quality model prices each of
its values) or the user's workload (what is trained on what: the task, its lengths, the batch asked for)."""


@dataclass(frozen=True)
class Workload:
    """The knob is part of the user's workload, not a lever: the search never turns it, a search space states it
    among its ``fixed`` values (advisor.search.space), and the quality model asks no entry for it (two plans of
    one workload cannot differ in it)."""

    required: bool = False
    """A space file must state it (the sequence length: set by the user's data); otherwise a space that leaves it
    out gets the knob's default."""


@dataclass(frozen=True)
class Key:
    """The key one export format writes the knob to and reads it from, as it is (one key, one value).

    ``path``: the key, a section and its key for a format with sections ("lora.use_dora"). Written
    where the knob applies, as a bool / int / float / string. Read where it applies; a file that leaves
    it out gets ``default`` (the tool's default; PLAN_DEFAULT: the knob's), listed in the reader's
    ``defaulted`` when ``listed`` (by default: when the tool's default is given)."""

    path: str
    default: Any = PLAN_DEFAULT
    listed: bool | None = None
    omit_default: bool = False
    """Write the key only when the knob is off its default (``use_dora: true``)."""
    read: bool = True
    """False: written for the tool, not read back (the evaluation batch: a file's own eval batch does not
    mean the run evaluates)."""

    @property
    def lists_default(self) -> bool:
        return self.listed if self.listed is not None else self.default is not PLAN_DEFAULT


@dataclass(frozen=True)
class Custom:
    """The format's module writes and reads the knob in its own code (several keys, a translation, a
    condition); ``path`` names the key a person edits, for errors (None: the knob's own name)."""

    path: str | None = None


@dataclass(frozen=True)
class Refused:
    """The format cannot express the knob: a plan with the knob off its default is refused, with ``reason``."""

    reason: str


@dataclass(frozen=True)
class Unkeyed:
    """The format holds no key for the knob and needs none (``reason``): a plan that sets it is written
    anyway and reads back with the knob at its default."""

    reason: str


FormatEntry = Key | Custom | Refused | Unkeyed


@dataclass(frozen=True)
class Knob:
    """One Plan field's declaration (see the module docstring)."""

    name: str
    default: Any
    help: str
    choices: tuple | None = None
    """The values the knob may take (also the command line's choices and the search's universe)."""
    range: Range | None = None
    applies: Callable[[Values], bool] | None = None
    """Where the knob means anything, from the other knobs (None: everywhere). Elsewhere it is not
    searched, not written, not read, not checked, and two plans that differ only there are the same
    (``canonical``). It may see a partial point: ``values.get("method") != "full"``."""
    renamed_from: tuple[str, Callable[[Any], Any]] | None = None
    """(old name, old value → value): the knob's name and value in older configs, studies and spaces."""
    cli: Cli = field(default_factory=Cli)
    tag: Tag | None = None
    search: Search | None = None
    """None: not searched (set from the space's fixed values or left at its default)."""
    keys: Mapping[str, FormatEntry] = field(default_factory=dict)
    """Export format name → how that format holds the knob (advisor.configs._keys.FORMATS)."""
    workload: Workload | None = None
    """Set: the knob is the user's workload (``Workload``); None: a lever."""

    @property
    def role(self) -> str:
        """``workload`` or ``lever`` (ROLES)."""
        return WORKLOAD if self.workload is not None else LEVER

    @property
    def is_lever(self) -> bool:
        return self.workload is None

    @property
    def flag(self) -> str:
        return self.cli.flag or "--" + self.name.replace("_", "-")

    @property
    def is_switch(self) -> bool:
        return isinstance(self.default, bool)

    def applies_to(self, values: Values) -> bool:
        return self.applies is None or bool(self.applies(values))

    @property
    def inactive(self) -> Any:
        """The value a point of the search space holds where the knob does not apply."""
        value = self.search.inactive if self.search is not None else PLAN_DEFAULT
        return self.default if value is PLAN_DEFAULT else value

    @property
    def default_text(self) -> str | None:
        """The help's "(default ...)" part, derived from the default (None: nothing to say)."""
        shown = (None if self.default in (None, ()) or self.cli.default or self.is_switch
                 else format_value(self.default))
        means = self.cli.default_means
        if shown is not None and means:
            return f"(default {shown}: {means})"
        if means:
            return f"(default: {means})"
        return f"(default: {shown})" if shown is not None else None


def format_value(value: Any) -> str:
    """A value as the command line writes it (32.0 → 32; a tuple → comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def knob(default: Any, *, help: str, choices: tuple | None = None, range: Range | None = None,  # noqa: A002
         applies: Callable[[Values], bool] | None = None, renamed_from: tuple[str, Callable] | None = None,
         cli: Cli | None = None, tag: Tag | None = None, search: Search | None = None,
         keys: Mapping[str, FormatEntry] | None = None, workload: Workload | None = None) -> Any:
    """A Plan field with its declaration (the field's name is filled in by ``knobs``)."""
    spec = Knob(name="", default=default, help=help, choices=choices, range=range, applies=applies,
                renamed_from=renamed_from, cli=cli or Cli(), tag=tag, search=search, keys=dict(keys or {}),
                workload=workload)
    return dataclasses.field(default=default, metadata={"knob": spec})


@lru_cache(maxsize=None)
def knobs(plan_type: type) -> tuple[Knob, ...]:
    """Every knob of a Plan class (a subclass adds its own), in field order."""
    out = []
    for f in dataclasses.fields(plan_type):
        spec = f.metadata.get("knob")
        if spec is None:
            raise TypeError(f"{plan_type.__name__}.{f.name} is not declared with knob(...) (advisor.core.knobs)")
        out.append(dataclasses.replace(spec, name=f.name))
    names = {k.name for k in out}
    words = {k.name for k in out if k.tag is not None and not k.tag.joined}
    for k in out:
        if k.cli.implies and k.cli.implies[0] not in names:
            raise TypeError(f"knob {k.name} implies {k.cli.implies[0]!r}, which is not a field of {plan_type.__name__}")
        if k.cli.alias_implies and (not k.cli.alias or k.cli.alias_implies[0] not in names):
            raise TypeError(f"knob {k.name}'s alias implies {k.cli.alias_implies[0]!r}: it needs an alias and a field "
                            f"of {plan_type.__name__}")
        if k.tag is not None and k.tag.after is not None and k.tag.after not in words:
            raise TypeError(f"knob {k.name}'s tag comes after {k.tag.after!r}, which has no word of its own in short()")
        if k.tag is not None and k.tag.joined and k.tag.after is None:
            raise TypeError(f"knob {k.name}'s tag is joined to nothing: give it after=")
        if k.workload is not None and k.search is not None:
            raise TypeError(f"knob {k.name} is the user's workload, which the search never turns: drop search=")
    return tuple(out)


@lru_cache(maxsize=None)
def levers(plan_type: type) -> tuple[Knob, ...]:
    """The knobs that say how to train (every knob but the workload's), in field order."""
    return tuple(k for k in knobs(plan_type) if k.is_lever)


@lru_cache(maxsize=None)
def workload_knobs(plan_type: type) -> tuple[Knob, ...]:
    """The knobs that are the user's workload (``Workload``), in field order."""
    return tuple(k for k in knobs(plan_type) if not k.is_lever)


@lru_cache(maxsize=None)
def lever_choices(plan_type: type) -> tuple[Knob, ...]:
    """The levers with declared choices (method, optimizer, ...): each value needs its memory, step-time and
    quality terms."""
    return tuple(k for k in levers(plan_type) if k.choices is not None)


@dataclass(frozen=True)
class RuleKnobs:
    """A Plan class's knobs grouped by the declared rule each states (``Plan._declared_problems`` checks them for
    every plan the search builds: grouped once per class)."""

    with_choices: tuple[Knob, ...]
    ranged_always: tuple[Knob, ...]
    """A Range on a knob that applies to every plan."""
    ranged_where_it_applies: tuple[Knob, ...]
    switches: tuple[Knob, ...]


@lru_cache(maxsize=None)
def rule_knobs(plan_type: type) -> RuleKnobs:
    ks = knobs(plan_type)
    return RuleKnobs(tuple(k for k in ks if k.choices is not None),
                     tuple(k for k in ks if k.range is not None and k.applies is None),
                     tuple(k for k in ks if k.range is not None and k.applies is not None),
                     tuple(k for k in ks if k.is_switch))


def knob_of(plan_type: type, name: str) -> Knob:
    for k in knobs(plan_type):
        if k.name == name:
            return k
    raise KeyError(name)


@lru_cache(maxsize=None)
def searched(plan_type: type) -> tuple[Knob, ...]:
    """The knobs the search turns, in the order a point chooses them."""
    ks = [(i, k) for i, k in enumerate(knobs(plan_type)) if k.search is not None]
    ordered = sorted(ks, key=lambda ik: (ik[1].search.order is None, ik[1].search.order or 0, ik[0]))
    return tuple(k for _, k in ordered)


def summary(plan: Any) -> str:
    """``Plan.short()``: each knob's tag, in field order, moved after (or glued to) another knob's word."""
    ks = [k for k in knobs(type(plan)) if k.tag is not None]

    def text(k: Knob) -> str | None:
        show, value = k.tag.show, getattr(plan, k.name)
        if show is None:
            return None if value == k.default else format_value(value)
        if isinstance(show, str):
            return show if value else None
        return show(plan)

    words: dict[str, str | None] = {k.name: text(k) for k in ks if not k.tag.joined}
    for k in ks:
        if k.tag.joined:
            suffix = text(k)
            if suffix and words.get(k.tag.after):
                words[k.tag.after] += suffix
    behind: dict[str | None, list[str]] = {}
    for k in ks:
        if not k.tag.joined:
            behind.setdefault(k.tag.after, []).append(k.name)

    def placed(name: str) -> list[str]:  # a word, then the words behind it (each with those behind it)
        return [name] + [w for b in behind.get(name, []) for w in placed(b)]

    order = [w for root in behind.get(None, []) for w in placed(root)]
    return " ".join(w for w in (words[n] for n in order) if w)


__all__ = ["Cli", "Custom", "Key", "Knob", "LEVER", "PLAN_DEFAULT", "ROLES", "Range", "Refused", "Search", "Tag",
           "Unkeyed", "Values", "WORKLOAD", "Workload", "first", "format_value", "knob", "knob_of", "knobs",
           "lever_choices", "levers", "prefer", "searched", "summary", "workload_knobs"]
