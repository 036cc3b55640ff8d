"""Every default and rule in one place: a default value is a named constant in one module, and every other
module uses that name instead of writing the value again.

``DEFAULTS`` lists each consolidated default with its home. The tests read advisor/ as source (the AST, so
comments and docstrings do not count) and report every place that writes such a value again, as
``file:line  what it is  ->  use <module>.<NAME>``.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"
ROOT = PACKAGE.parent


@dataclass(frozen=True)
class Default:
    what: str
    module: str
    name: str
    value: object
    keys: tuple[str, ...]
    """Parameter, field, keyword, flag (--x-y as x_y) and mapping-key names a copy of it would be written under."""


DEFAULTS = [
    Default("headroom (fraction of the budget kept free)", "advisor.core.fit", "HEADROOM", 0.05, ("headroom",)),
    Default("accuracy tolerance (KL nats/token)", "advisor.search.select", "ACCURACY_TOLERANCE", 0.05,
            ("tolerance", "accuracy_tolerance")),
    Default("LoRA dropout", "advisor.core.plan", "LORA_DROPOUT", 0.05, ("lora_dropout",)),
    Default("sharding of a several-GPU plan", "advisor.memory.sharding", "DEFAULT_SHARDING", "zero3",
            ("sharding", "strategy")),
    Default("bitsandbytes 4-bit block size", "advisor.memory.tensors", "NF4_BLOCK", 64, ("blocksize",)),
    Default("bitsandbytes double-quantization block size", "advisor.memory.tensors", "DQ_BLOCK", 256, ()),
    Default("tokens per chunk of the chunked loss", "advisor.memory.training", "CE_CHUNK_TOKENS", 256,
            ("chunk_tokens",)),
    Default("label index the loss skips", "advisor.runtime.tensors", "IGNORE_INDEX", -100, ("ignore_index",)),
    Default("trials of a space that names none", "advisor.search.space", "DEFAULT_TRIALS", 40, ("trials",)),
    Default("TUI poll interval (seconds)", "advisor.ui.tui", "POLL_SECONDS", 1.5, ("poll", "poll_s")),
]

# The literal 0.05 is three defaults (headroom, accuracy tolerance, LoRA dropout): anywhere in advisor/ it may
# only be the value of one of these named constants (the last three are other quantities that happen to be 0.05).
ZERO_POINT_05 = {("advisor/core/fit.py", "HEADROOM"), ("advisor/search/select.py", "ACCURACY_TOLERANCE"),
                 ("advisor/core/plan.py", "LORA_DROPOUT"),
                 ("advisor/runtime/probe/_runner.py", "POLL_S"),
                 ("advisor/speed/low_rank_and_offload_terms.py", "SVD_EFFICIENCY"),
                 ("advisor/search/longest_study.py", "WITHIN")}


def _sources() -> dict[str, ast.Module]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text("utf-8"))
            for p in sorted(PACKAGE.rglob("*.py")) if "templates" not in p.parts}  # templates run elsewhere


SOURCES = _sources()


def _value(node: ast.AST) -> object:
    """The literal ``node`` writes (-100 included), or a sentinel."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    return _value


def _named_constants(tree: ast.Module) -> dict[int, str]:
    """{id of the value node: NAME} for module- and class-level ``NAME = literal`` (the places a default is named)."""
    out = {}
    for scope in [tree, *(n for n in tree.body if isinstance(n, ast.ClassDef))]:
        for node in scope.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                out[id(node.value)] = node.targets[0].id
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                out[id(node.value)] = node.target.id
    return out


def _key(node: ast.AST) -> str | None:
    """The string literal ``node`` writes, as a key name ("--lora-dropout" -> "lora_dropout")."""
    v = _value(node)
    return v.lstrip("-").replace("-", "_") if isinstance(v, str) else None


def _default_positions(tree: ast.Module):
    """(value node, the name it is the default of, how) for every place a default is written: parameter and
    field defaults, keyword arguments (``headroom=0.05``; ``add_argument("--x", default=...)`` counts as x),
    and the fallback of ``.get("x", fallback)`` / ``getattr(o, "x", fallback)``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            for arg, d in zip(positional[len(positional) - len(a.defaults):], a.defaults):
                yield d, arg.arg, "a parameter default"
            for arg, d in zip(a.kwonlyargs, a.kw_defaults):
                if d is not None:
                    yield d, arg.arg, "a parameter default"
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
                    yield stmt.value, stmt.target.id, "a field default"
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for kw in node.keywords:
                if kw.arg == "default" and func == "add_argument" and node.args:
                    yield kw.value, _key(node.args[0]), "the flag's default="
                elif kw.arg:
                    yield kw.value, kw.arg, "a keyword argument"
            if func == "get" and len(node.args) == 2:
                yield node.args[1], _key(node.args[0]), ".get() fallback"
            elif func == "getattr" and len(node.args) == 3:
                yield node.args[2], _key(node.args[1]), "getattr() fallback"


def _rel(module: str) -> str:
    path = ROOT / Path(*module.split("."))
    return (path.with_suffix(".py") if path.with_suffix(".py").exists()
            else path / "__init__.py").relative_to(ROOT).as_posix()


@pytest.mark.parametrize("d", DEFAULTS, ids=lambda d: d.name)
def test_each_default_is_named_in_its_home(d):
    assert getattr(importlib.import_module(d.module), d.name) == d.value, f"{d.module}.{d.name} is the {d.what}"


def test_no_default_is_written_twice():
    """A literal written, under a consolidated default's name, where a default goes (a parameter, a field, a
    keyword, a flag's default=, a .get() fallback) instead of the named constant: a copy of the default, or one
    that disagrees with it (speed/ once defaulted sharding to "ddp" where the CLI said "zero3")."""
    findings = []
    for path, tree in SOURCES.items():
        for node, key, how in _default_positions(tree):
            v = _value(node)
            for d in DEFAULTS:
                # a keyword argument may pass another value on purpose (trials=1): only the default's value counts
                if key in d.keys and type(v) is type(d.value) and (v == d.value or how != "a keyword argument"):
                    findings.append(f"{path}:{node.lineno}  {how} of {key} is {v!r}  ->  use {d.module}.{d.name} "
                                    f"(the {d.what})")
    assert not findings, "defaults written again instead of named:\n" + "\n".join(findings)


def test_the_literal_0_05_is_only_a_named_constant():
    """Headroom, accuracy tolerance and LoRA dropout are all 0.05: each is a named constant, written nowhere else."""
    findings = []
    for path, tree in SOURCES.items():
        named = _named_constants(tree)
        for node in ast.walk(tree):
            if _value(node) == 0.05 and isinstance(node, ast.Constant) and not isinstance(node.value, bool):
                name = named.get(id(node))
                if (path, name) not in ZERO_POINT_05:
                    where = f" (as {name})" if name else ""
                    findings.append(f"{path}:{node.lineno}  0.05{where}  ->  use core.fit.HEADROOM, "
                                    "search.select.ACCURACY_TOLERANCE or core.plan.LORA_DROPOUT")
    assert not findings, "0.05 written outside its named constants:\n" + "\n".join(findings)


ALIASES = {"BLOCKSIZE_4BIT": "NF4_BLOCK", "LEARNING_RATE": None}
"""Names the same defaults went by in other modules (LEARNING_RATE: runtime.build's is TrainingArguments' default,
named TRAINER_DEFAULT_LEARNING_RATE; the exporters' recipe rates are another quantity)."""


@pytest.mark.parametrize("d", DEFAULTS, ids=lambda d: d.name)
def test_no_second_module_defines_it(d):
    """No module but the home defines a constant of the same name (or a former alias of it)."""
    home = _rel(d.module)
    names = {d.name} | {alias for alias, target in ALIASES.items() if target == d.name}
    findings = []
    for path, tree in SOURCES.items():
        for node_id, name in _named_constants(tree).items():
            if name in names and path != home:
                findings.append(f"{path}  defines {name}  ->  use {d.module}.{d.name}")
    if d.value == -100:  # distinctive enough to look for anywhere
        findings += [f"{path}:{node.lineno}  -100  ->  use {d.module}.{d.name}" for path, tree in SOURCES.items()
                     if path != home for node in ast.walk(tree)
                     if isinstance(node, ast.UnaryOp) and _value(node) == -100]
    assert not findings, "\n".join(findings)


# MemoryReport.extra holds diagnostics to show; what a decision reads is a typed field (run_phases, measured).
TYPED = {"phases": "run_phases", "run_peak_bytes": "run_peak_bytes", "run_peak_phase": "run_peak_phase",
         "reserved_model": "run_phases.reserved_model", "phase_notes": "run_phases.notes",
         "reserved_peak_bytes": "reserved_peak_bytes", "tokens_per_s": "measured.tokens_per_s",
         "losses": "measured.losses", "fidelity_kl": "measured.fidelity_kl", "final_loss": "measured.final_loss"}
# the tuner's probe branch still reads the probe's copies in extra (kept one release by the probe backend)
PENDING: set[tuple[str, str]] = set()


def test_decisions_read_typed_fields_not_extra():
    findings = []
    for path, tree in SOURCES.items():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "extra":
                key = _value(node.slice)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "extra" and node.args):
                key = _value(node.args[0])
            if key in TYPED and (path, key) not in PENDING:
                findings.append(f"{path}:{node.lineno}  reads extra[{key!r}]  ->  MemoryReport.{TYPED[key]}")
    assert not findings, "\n".join(findings)
