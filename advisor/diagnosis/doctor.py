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


def already_done(fix: str | dict, plan, log: str = "") -> bool:
    """Whether ``plan`` already applies ``fix`` (its ``done_when``: plan field -> the values that apply it), or the
    log shows it applied (its ``done_in_log``: a traceback through peft means adapters are trained)."""
    if isinstance(fix, str):
        return False
    if fix.get("done_in_log") and re.search(fix["done_in_log"], log):
        return True
    return plan is not None and any(getattr(plan, field) in values
                                    for field, values in fix.get("done_when", {}).items())


def offered(fixes: list, plan, log: str) -> tuple[list[str], list[str]]:
    """(the fixes to offer, in order, and those left out as already applied): a fix whose ``first_in_log`` pattern
    the log shows comes first, saying why; one with ``only_in_log`` is offered only where the log asks for it."""
    wanted = [f for f in fixes if isinstance(f, str) or not f.get("only_in_log") or re.search(f["only_in_log"], log)]
    done = [fix_line(f) for f in wanted if already_done(f, plan, log)]
    todo = [f for f in wanted if not already_done(f, plan, log)]
    first = [f for f in todo if isinstance(f, dict) and f.get("first_in_log")
             and re.search(f["first_in_log"]["pattern"], log)]
    lines = [f"{fix_line(f)} ({f['first_in_log']['why']})" for f in first]
    return lines + [fix_line(f) for f in todo if f not in first], done


def excerpt(line: str, width: int = 200) -> str:
    """``line`` cut to ``width`` characters at a word boundary, marked where it was cut."""
    line = line.strip()
    if len(line) <= width:
        return line
    cut = line[:width].rsplit(" ", 1)[0]
    return cut + " …"


def diagnose(text: str, report=None, plan=None, gpu=None) -> list[Finding]:
    """Findings for every known symptom the log shows; ``report`` (a MemoryReport of the run's plan)
    adds the ledger's view of an OOM, ``plan`` (the run's Plan) leaves out the fixes it already applies, and ``gpu``
    (the card the config was planned for) is held against the card the log's OOM message describes."""
    findings = []
    for entry in knowledge():
        hits = [m for p in entry["patterns"] for m in [re.search(p, text, re.IGNORECASE)] if m]
        if not hits:
            continue
        line = _line_of(text, hits[0].start())
        evidence = f"log: {excerpt(line)}"
        data: dict[str, Any] = {"matched": hits[0].group(0)}
        fixes, done = offered(entry["fixes"], plan, text)
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
            if entry["id"] == "cuda-oom" and gpu is not None and numbers.get("total"):
                other = card_mismatch(numbers["total"], gpu)
                if other:
                    findings.append(other)
        if entry["id"].startswith("rl-") and report is not None:
            evidence += rl_evidence(report, plan)
        findings.append(Finding(check=f"log.{entry['id']}", severity=entry.get("severity", "error"),
                                title=f"{entry['symptom']}: {entry['cause']}",
                                evidence=evidence, fixes=tuple(fixes), area="log",
                                data={**data, "source": entry.get("source", "")}))
    return findings


def card_mismatch(total: int, gpu) -> Finding | None:
    """A warning when the card the OOM happened on is not the card the config was planned for: the OOM message's
    total capacity is within the catalog's BUDGET_MATCH of the card's memory either way (the usable memory PyTorch
    reports is a little below the card's: an RTX 4090 of 24 GiB reports 23.65 GiB)."""
    from advisor.core.catalog import BUDGET_MATCH

    if BUDGET_MATCH * gpu.memory_bytes <= total <= gpu.memory_bytes / BUDGET_MATCH:
        return None
    return Finding(check="log.other-card", severity="warning",
                   title=f"the log's GPU has {format_bytes(total)} in all; the config was planned for {gpu.name} "
                         f"({format_bytes(gpu.memory_bytes)})",
                   evidence="PyTorch's OOM message: total capacity; the config: advisor.gpu",
                   fixes=(f"plan for the card the run uses: advisor tune ... --gpu-budget {format_bytes(total)}",),
                   area="log", data={"log_total_bytes": total, "config_gpu": gpu.key})


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
