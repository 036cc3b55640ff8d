"""One declaration per study setting: what `advisor tune` says about a setting of a study, written once,
beside the field of ``TuneSettings`` (advisor.search.settings) that holds it.

A study setting is declared with ``setting(default, help=..., ...)``: a ``dataclasses.field`` whose
metadata holds a ``Setting``, as a Plan knob is declared with ``knob(...)`` (advisor.core.knobs).
Everything else derives from these declarations, never listed again:

- the command line: each setting's tune flag, its parse type and choices, its help and default
  (``add_setting_flags``), and how the parsed flags resolve into the setting's value (``resolve``);
- the study's stored description: the settings with a ``key`` are the fields of ``StudyDescription``
  (``description_type``), written to and read from the study's JSON by their key (``encode``/``decode``;
  ``missing``: what an older study that lacks the key holds);
- which question the study answers: the settings marked ``answer`` take part in the default study name
  and are compared when a study is resumed (``identity``; ``yields``: a value the stored one replaces, as a
  host budget detected on this machine yields to the one the study was made for).

The resolved settings are frozen: nothing changes them after they are made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "NO_DEFAULT"})()
"""A setting every study must be given (the model, the GPU, the budget, the space)."""


@dataclass(frozen=True)
class Setting:
    """One study setting's declaration (see the module docstring)."""

    name: str
    default: Any
    help: str
    flag: str | None = None
    """The tune flag that sets it; None: no flag of its own (resolved beside another: gpu_assumed)."""
    cli: Mapping[str, Any] = field(default_factory=dict)
    """argparse options of the flag beyond its help (type, choices, metavar, required, action, default), and
    ``range``: the numbers it takes (advisor.core.knobs.Range, parsed as a knob's flag is)."""
    resolve: Callable[[Any], Any] | None = None
    """(the parsed flags being resolved, advisor.search.settings.Resolving) → the value; None: the flag's value."""
    key: str | None = None
    """The key in the study's stored JSON ("host_budget.detected": inside another key's object); None: not
    stored (how this run goes, not what the study is: the storage URL, the heartbeat)."""
    encode: Callable[[Any], Any] | None = None
    """The value → JSON (None: as it is)."""
    decode: Callable[[Any], Any] | None = None
    """JSON → the value (None: as it is)."""
    missing: Any = NO_DEFAULT
    """What an older study's JSON without the key holds (a callable: from the whole stored object); NO_DEFAULT:
    the setting's default."""
    recorded: Callable[[], Any] | None = None
    """What the description records when the settings hold nothing (the library versions when it is made)."""
    answer: bool = False
    """The setting changes the answer: it takes part in the default study name, and a resumed study whose
    stored value differs is refused."""
    identity: Callable[[Any], Any] | None = None
    """What of the value identifies the question (None: its JSON); compared between a study and a rerun."""
    yields: str | None = None
    """The name of a boolean setting: where it holds, this value is a guess (detected) and the stored one
    replaces it when a study is resumed, and it stays out of the default study name."""
    shown: Callable[[Any], str] | None = None
    """The value as a message says it (None: its JSON)."""
    late: bool = False
    """Resolved after every other setting, from them (the study name, the storage)."""
    flag_text: Callable[[Any], str | None] | None = None
    """(the stored description) → the flag's text that sets this value again, None: the flag is left out (a
    GPU only assumed); None declared: the value as text, left out when it is None."""

    @property
    def stored(self) -> bool:
        return self.key is not None

    @property
    def dest(self) -> str | None:
        """The argparse attribute of the flag."""
        return self.cli.get("dest") or (self.flag.lstrip("-").replace("-", "_") if self.flag else None)

    def to_json(self, value: Any) -> Any:
        return self.encode(value) if self.encode is not None and value is not None else value

    def from_json(self, raw: Any) -> Any:
        return self.decode(raw) if self.decode is not None and raw is not None else raw

    def identity_of(self, value: Any) -> Any:
        """What of ``value`` identifies the question (JSON-able)."""
        if value is None:
            return None
        return self.identity(value) if self.identity is not None else self.to_json(value)

    def show(self, value: Any) -> str:
        if value is None:
            return "none"
        return self.shown(value) if self.shown is not None else json.dumps(self.to_json(value), default=str)


def setting(default: Any = NO_DEFAULT, *, help: str, flag: str | None = None,  # noqa: A002
            cli: Mapping[str, Any] | None = None, resolve: Callable | None = None, key: str | None = None,
            encode: Callable | None = None, decode: Callable | None = None, missing: Any = NO_DEFAULT,
            recorded: Callable | None = None, answer: bool = False, identity: Callable | None = None,
            yields: str | None = None, shown: Callable | None = None, late: bool = False,
            flag_text: Callable | None = None, compare: bool = True) -> Any:
    """A field of the study settings with its declaration (the field's name is filled in by ``settings_of``)."""
    spec = Setting(name="", default=default, help=help, flag=flag, cli=dict(cli or {}), resolve=resolve, key=key,
                   encode=encode, decode=decode, missing=missing, recorded=recorded, answer=answer,
                   identity=identity, yields=yields, shown=shown, late=late, flag_text=flag_text)
    meta = {"setting": spec}
    if default is NO_DEFAULT:
        return dataclasses.field(metadata=meta, compare=compare)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta, compare=compare)
    return dataclasses.field(default=default, metadata=meta, compare=compare)


@lru_cache(maxsize=None)
def settings_of(cls: type) -> tuple[Setting, ...]:
    """Every setting of a settings class (a subclass adds its own), in field order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting(...) (advisor.search.setting)")
        out.append(dataclasses.replace(spec, name=f.name))
    names = {s.name for s in out}
    keys = [s.key for s in out if s.stored]
    if len(keys) != len(set(keys)):
        raise TypeError(f"{cls.__name__}: two settings are stored under one key")
    for s in out:
        if s.yields is not None and s.yields not in names:
            raise TypeError(f"setting {s.name} yields where {s.yields!r} holds, which is not a setting of "
                            f"{cls.__name__}")
    return tuple(out)


def setting_of(cls: type, name: str) -> Setting:
    for s in settings_of(cls):
        if s.name == name:
            return s
    raise KeyError(name)


# --------------------------------------------------------------------------- the stored description


def to_stored(settings: tuple[Setting, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object of the stored settings, each under its key (a dotted key inside its parent's object)."""
    out: dict[str, Any] = {}
    for s in settings:
        if not s.stored:
            continue
        head, _, tail = s.key.partition(".")
        value = s.to_json(values[s.name])
        if tail:
            if isinstance(out.get(head), dict):
                out[head][tail] = value
        else:
            out[head] = value
    return out


def stored_raw(s: Setting, d: Mapping[str, Any]) -> tuple[bool, Any]:
    """(whether the stored object holds the setting's key, its raw JSON)."""
    head, _, tail = s.key.partition(".")
    if head not in d:
        return False, None
    raw = d[head]
    if tail:
        if not isinstance(raw, dict) or tail not in raw:
            return False, None
        raw = raw[tail]
    return True, raw


def from_stored(settings: tuple[Setting, ...], d: Mapping[str, Any]) -> dict[str, Any]:
    """The stored settings' values from a study's JSON (this version's or an older study's)."""
    values: dict[str, Any] = {}
    for s in settings:
        if not s.stored:
            continue
        present, raw = stored_raw(s, d)
        if present and raw is not None:
            values[s.name] = s.from_json(raw)
        elif present:
            values[s.name] = None
        elif s.missing is not NO_DEFAULT:
            values[s.name] = s.missing(d) if callable(s.missing) else s.missing
        elif s.default is NO_DEFAULT:
            raise KeyError(s.key)
        else:
            values[s.name] = s.default
    return values


class Described:
    """What a stored description does beside its fields (``description_type`` adds them)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored with the study."""
        return to_stored(settings_of(type(self)), {s.name: getattr(self, s.name) for s in settings_of(type(self))})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """The description from its stored JSON (this version's or an older study's)."""
        return cls(**from_stored(settings_of(cls), d))


@lru_cache(maxsize=None)
def description_type(settings_cls: type, base: type = Described, name: str = "StudyDescription") -> type:
    """The frozen description of a settings class: one field per stored setting, in declaration order, with
    the same declaration (what the study is, not how one run of it goes)."""
    fields = []
    for s, f in zip(settings_of(settings_cls), dataclasses.fields(settings_cls)):
        if s.stored:
            fields.append((f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                             compare=f.compare, metadata=f.metadata)))
    return dataclasses.make_dataclass(name, fields, bases=(base,), frozen=True, namespace={
        "__doc__": f"What one study is, as stored with it: the stored settings of {settings_cls.__name__}."})


# --------------------------------------------------------------------------- which question a study answers


def identity(settings: tuple[Setting, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that change the answer, by name → what of each identifies the question (a setting that
    yields, as a detected host budget does, stays out)."""
    return {s.name: s.identity_of(values[s.name]) for s in settings
            if s.answer and not (s.yields is not None and values.get(s.yields))}


def identity_hash(settings: tuple[Setting, ...], values: Mapping[str, Any], digits: int = 6) -> str:
    """A short hash of ``identity``, stable across runs and machines (sorted JSON, SHA-256)."""
    text = json.dumps(identity(settings, values), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def first_difference(settings: tuple[Setting, ...], stored: Mapping[str, Any],
                     values: Mapping[str, Any]) -> tuple[Setting, Any, Any] | None:
    """The first setting that changes the answer whose stored value (decoded from the study's JSON) differs
    from ``values``: (its declaration, the stored value, the new one); None when the study asks the same."""
    for s in settings:
        if not (s.answer and s.stored) or (s.yields is not None and values.get(s.yields)):
            continue
        present, raw = stored_raw(s, stored)
        if present:
            old = s.from_json(raw) if raw is not None else None
        elif s.missing is not NO_DEFAULT:
            old = s.missing(stored) if callable(s.missing) else s.missing
        else:
            old = None if s.default is NO_DEFAULT else s.default
        if s.identity_of(old) != s.identity_of(values[s.name]):
            return s, old, values[s.name]
    return None


def reproduce_flags(described: Any, texts: Mapping[str, str | None] | None = None) -> list[str]:
    """The flags that make a study with the same stored settings again, in declaration order (``texts``: a
    setting's text as the caller knows it better, by name)."""
    out: list[str] = []
    for s in settings_of(type(described)):
        if not s.stored or s.flag is None:
            continue
        if texts and s.name in texts:
            text = texts[s.name]
        elif s.flag_text is not None:
            text = s.flag_text(described)
        else:
            value = getattr(described, s.name)
            text = None if value is None else (f"{value:g}" if isinstance(value, float) else str(value))
        if text is not None:
            out += [s.flag, text]
    return out


__all__ = ["Described", "NO_DEFAULT", "Setting", "description_type", "first_difference", "from_stored", "identity",
           "identity_hash", "reproduce_flags", "setting", "setting_of", "settings_of", "to_stored"]
