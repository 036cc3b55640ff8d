"""Each export format's keys, from the knobs' declarations (``keys=`` in advisor.core.plan's ``knob(...)``).

A format module writes and reads in its own code only what a knob declares ``Custom`` for it; the
rest comes from here:

- ``Key``: written (``fill``: at the place the module marks ``DECLARED``, else at the end of its section)
  and read (``read_declared``) as they are;
- ``Refused`` or nothing declared: a plan that sets the knob is refused (``refuse_unexpressible``);
- the key each knob is named by in errors (``error_keys``), for the plan rules a file breaks.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.core.knobs import PLAN_DEFAULT, Custom, Key, Knob, Refused, Unkeyed, knobs
from advisor.configs._base import Collect, Unsupported
from advisor.configs.formats import keyed

FORMATS = keyed()
"""The formats the knobs declare keys for (advisor.configs.formats: each format's ``keys``)."""

DECLARED: Any = type("Declared", (), {"__repr__": lambda self: "DECLARED"})()
"""A module's placeholder for a knob's declared key, where the file should hold it (filled by ``fill``)."""

Lookup = Callable[[str], "tuple[dict | None, str, str] | None"]
"""A declared key's path → (the mapping holding it, its key there, its name in errors); None: the file
has no place for it."""


def error_keys(plan_type: type, fmt: str) -> dict[str, str]:
    """Plan field → the key a person edits in a file of ``fmt`` (for the plan rules a file breaks)."""
    out = {}
    for k in knobs(plan_type):
        entry = k.keys.get(fmt)
        if isinstance(entry, (Key, Custom)) and entry.path:
            out[k.name] = entry.path
    return out


def refuse_unexpressible(plan, fmt: str) -> None:
    """Raise Unsupported when ``plan`` sets (off its default) a knob ``fmt`` refuses or declares nothing for."""
    for k in knobs(type(plan)):
        entry = k.keys.get(fmt)
        if isinstance(entry, (Key, Custom, Unkeyed)) or getattr(plan, k.name) == k.default:
            continue
        raise Unsupported(fmt, entry.reason if isinstance(entry, Refused) else f"it has no key for {k.flag}")


def _simple(plan_type: type, fmt: str) -> list[tuple[Knob, Key]]:
    return [(k, k.keys[fmt]) for k in knobs(plan_type) if isinstance(k.keys.get(fmt), Key)]


def _plain(k: Knob, value: Any) -> Any:
    if k.is_switch:
        return bool(value)
    if isinstance(k.default, float):
        return float(value)
    return value


def declared_values(plan, fmt: str) -> dict[str, Any]:
    """path → value of every declared key ``plan`` writes in ``fmt`` (where the knob applies)."""
    values = vars(plan)
    out = {}
    for k, key in _simple(type(plan), fmt):
        if not k.applies_to(values) or (key.omit_default and values[k.name] == k.default):
            continue
        out[key.path] = _plain(k, values[k.name])
    return out


def _split(path: str) -> tuple[str | None, str]:
    section, _, key = path.rpartition(".")
    return section or None, key


def fill(cfg: dict, plan, fmt: str, section: str | None = None, *, before: str | None = None) -> dict:
    """``cfg`` (one section of a file, or a flat file) with the declared keys of ``section`` in it: each at
    its ``DECLARED`` placeholder (removed where the plan does not write it), the others (a new knob's)
    before the key ``before``, or at the end."""
    values = {key: v for path, v in declared_values(plan, fmt).items() if _split(path)[0] == section
              for key in [_split(path)[1]]}
    known = {_split(key.path)[1] for _, key in _simple(type(plan), fmt) if _split(key.path)[0] == section}
    pending = {key: v for key, v in values.items() if key not in cfg}
    out: dict = {}
    for key, value in cfg.items():
        if key == before:
            out.update(pending)
            pending = {}
        if value is not DECLARED:
            out[key] = value
        elif key in values:
            out[key] = values[key]
        elif key not in known:
            raise LookupError(f"{fmt}: {key!r} is marked DECLARED but no knob declares it")
    out.update(pending)
    return out


def unplaced(plan, fmt: str, sections: dict[str, dict | None]) -> None:
    """Check that every declared key ``plan`` writes has its section in the file (a knob whose key sits in
    a section the plan leaves out must declare where it applies)."""
    for path in declared_values(plan, fmt):
        section = _split(path)[0]
        if section is not None and sections.get(section) is None:
            raise LookupError(f"{fmt}: {path} is declared, but the plan has no {section} section "
                              "(declare where the knob applies)")


def read_declared(c: Collect, plan_type: type, fmt: str, lookup: Lookup, fields: dict[str, Any]) -> None:
    """Read each declared key of ``fmt`` into ``fields``, where its knob applies (after the fields read so far)."""
    for k, key in _simple(plan_type, fmt):
        if not key.read or not k.applies_to(fields):
            continue
        found = lookup(key.path)
        if found is None:
            continue
        container, name, where = found
        container = container or {}
        default = k.default if key.default is PLAN_DEFAULT else key.default
        if k.choices is not None:
            raw = container.get(name)
            if raw is None:
                if key.lists_default:
                    c.defaulted.append(where)
                fields[k.name] = default
            else:
                fields[k.name] = c.choice(raw, {v: v for v in k.choices}, where)
            continue
        kind = "bool" if k.is_switch else "num" if isinstance(k.default, float) else "int" \
            if (k.range is not None and k.range.whole) else "raw"
        value = c.get(container, name, where, kind, default, record=key.lists_default)
        fields[k.name] = float(value) if kind == "num" and value is not None else value


def flat(data: dict) -> Lookup:
    """The lookup of a flat file (axolotl, LLaMA-Factory, TRL): each key at the top, named as it is; a dotted path
    ("vision.max_pixels") is a key of the mapping at the top (trl.yaml's ``vision``)."""
    def lookup(path: str):
        section, key = _split(path)
        if section is None:
            return data, path, path
        inner = data.get(section)
        return (inner if isinstance(inner, dict) else None), key, path
    return lookup


__all__ = ["DECLARED", "FORMATS", "Lookup", "declared_values", "error_keys", "fill", "flat", "read_declared",
           "refuse_unexpressible", "unplaced"]
