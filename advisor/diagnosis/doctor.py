"""`advisor doctor`: match an error log to causes and fixes (troubleshooting.yaml), with the
advisor's own numbers where it can (for an OOM: which ledger categories exceed the card)."""

from __future__ import annotations

import re
from typing import Any

from advisor.core.data_files import load_data_file
from advisor.diagnosis.findings import Finding
from advisor.core.units import format_bytes

_UNIT = {"b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40}  # PyTorch prints binary units
# PyTorch's OOM message (c10/cuda/CUDACachingAllocator.cpp): "Tried to allocate 1.95 GiB. GPU 0 has a
# total capacity of 23.65 GiB of which 1.05 GiB is free. ... this process has 22.58 GiB memory in use.
# Of the allocated memory 21.90 GiB is allocated by PyTorch, and 256.60 MiB is reserved by PyTorch but unallocated."
_OOM_FIELDS = {
    "tried": r"Tried to allocate ([\d.]+) ([KMGT]?i?B)",
    "total": r"total capacity of ([\d.]+) ([KMGT]?i?B)",
    "free": r"of which ([\d.]+) ([KMGT]?i?B) is free",
    "in_use": r"this process has ([\d.]+) ([KMGT]?i?B) memory in use",
    "allocated": r"([\d.]+) ([KMGT]?i?B) is allocated by PyTorch",
    "reserved_unallocated": r"([\d.]+) ([KMGT]?i?B) is reserved by PyTorch but unallocated",
}


def knowledge() -> list[dict[str, Any]]:
    return load_data_file("troubleshooting.yaml")


def parse_oom(text: str) -> dict[str, int]:
    """The byte counts PyTorch's CUDA OOM message states."""
    out = {}
    for key, pattern in _OOM_FIELDS.items():
        m = re.search(pattern, text)
        if m:
            out[key] = int(float(m.group(1)) * _UNIT[m.group(2).lower().replace("ib", "b")])
    return out


def fix_line(fix: str | dict) -> str:
    return fix if isinstance(fix, str) else fix["fix"]


def already_done(fix: str | dict, plan) -> bool:
    """Whether ``plan`` already applies ``fix`` (its ``done_when``: plan field -> the values that apply it)."""
    if plan is None or isinstance(fix, str):
        return False
    return any(getattr(plan, field) in values for field, values in fix.get("done_when", {}).items())


def diagnose(text: str, report=None, plan=None) -> list[Finding]:
    """Findings for every known symptom the log shows; ``report`` (a MemoryReport of the run's plan)
    adds the ledger's view of an OOM, and ``plan`` (the run's Plan) leaves out the fixes it already applies."""
    findings = []
    for entry in knowledge():
        hits = [m for p in entry["patterns"] for m in [re.search(p, text, re.IGNORECASE)] if m]
        if not hits:
            continue
        line = _line_of(text, hits[0].start())
        evidence = f"log: {line.strip()[:200]}"
        data: dict[str, Any] = {"matched": hits[0].group(0)}
        fixes = [fix_line(f) for f in entry["fixes"] if not already_done(f, plan)]
        done = [fix_line(f) for f in entry["fixes"] if already_done(f, plan)]
        if done:
            data["already_applied"] = done
            evidence += f"; left out, the config already does it: {'; '.join(done)}"
        if entry["id"] in ("cuda-oom", "fragmentation"):
            numbers = parse_oom(text)
            data["oom"] = numbers
            if numbers:
                evidence += "; " + ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in numbers.items())
            if entry["id"] == "fragmentation" and numbers.get("reserved_unallocated", 0) < numbers.get("tried", 1):
                continue  # fragmentation matters only when the free-but-reserved memory could have served it
            if entry["id"] == "cuda-oom" and report is not None:
                over = ledger_over(report, numbers.get("total"))
                if over:
                    evidence += f"; advisor ledger: {over}"
        if entry["id"].startswith("rl-") and report is not None:
            evidence += rl_evidence(report, plan)
        findings.append(Finding(check=f"log.{entry['id']}", severity=entry.get("severity", "error"),
                                title=f"{entry['symptom']}: {entry['cause']}",
                                evidence=evidence, fixes=tuple(fixes), area="log",
                                data={**data, "source": entry.get("source", "")}))
    return findings


def rl_evidence(report, plan) -> str:
    """The advisor's view of a GRPO/DPO run for its RL entries: the run's peak with every completion at its
    longest, the phase that sets it, and vLLM's pool (advisor.memory.rl)."""
    phases = report.run_phases.phases if getattr(report, "run_phases", None) is not None else {}
    if not phases:
        return ""
    out = f"; advisor: the run peaks at {format_bytes(report.run_peak_bytes)} ({report.source}) during " \
          f"{report.run_peak_phase}"
    if plan is not None and plan.task == "grpo":
        out += f", every completion at max_completion_length {plan.max_completion_length:,}"
    gen = report.extra.get("generation") if isinstance(report.extra, dict) else None
    if gen and gen.get("engine") != "transformers":
        out += (f"; vLLM's pool {format_bytes(gen['pool_bytes'])} (weights {format_bytes(gen['weights_bytes'])}, KV "
                f"cache {format_bytes(gen['kv_cache_bytes'])})")
    return out


def ledger_over(report, capacity: int | None, fmt=format_bytes) -> str:
    """Which ledger categories alone fill the card: the largest ones, added until they pass ``capacity``."""
    items = sorted(((k, v) for k, v in report.device.items() if v > 0), key=lambda kv: -kv[1])
    if not items:
        return ""
    running, used = 0, []
    for k, v in items:
        running += v
        used.append(f"{k.replace('_', ' ')} {fmt(v)}")
        if capacity and running > capacity:
            what = f"{used[0]} alone exceeds" if len(used) == 1 else f"{' + '.join(used)} = {fmt(running)} exceed"
            return f"{what} the card's {fmt(capacity)} (predicted peak {fmt(report.peak_bytes)}, {report.source})"
    return f"predicted peak {fmt(report.peak_bytes)} ({report.source}); largest: " + ", ".join(used[:3])


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)]
