"""report.md: the same report as text, for a pull request, a wiki or a terminal (plots stay in report.html)."""

from __future__ import annotations

from advisor.memory.ledger import CATEGORIES, LABELS
from advisor.ui.report._data import ReportData
from advisor.ui.render import gpu_peak_text, host_peak_text, step_and_run_rows
from advisor.ui.report._format import (SOURCE_HELP, acc_text, gpu_line, host_budget_text, plan_rows, space_source,
                                       tps_text, value_text)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def render_markdown(d: ReportData) -> str:
    s = d.description
    m, space = s.model, s.space
    best = d.best
    lines = [f"# vram-advisor report: {d.study}", "",
             "Where each number comes from: " + "; ".join(f"*{k}*: {v}" for k, v in SOURCE_HELP.items()) + ".", ""]
    lines += [f"- {n}" for n in d.notes] + ([""] if d.notes else [])
    lines += ["## The question", "",
              f"- Model: **{m.name}** ({m.hf_id or ''}, {m.params_total:,} parameters)",
              f"- GPU: {gpu_line(s)}",
              f"- Memory budget: **{s.budget.text}** = {s.budget.bytes:,} bytes, {d.headroom:.0%} kept free",
              f"- Host memory budget: {host_budget_text(s, d.fmt)}",
              f"- Accuracy tolerance: {s.tolerance} (KL nats/token)",
              f"- Backend: {s.backend}; trials: {len(d.records)} in the study, {s.trials} planned",
              f"- Search space: {space.name} ({space_source(space)})", ""]
    knobs = [[k, value_text(v)] for k, v in space.search.items()]
    knobs += [[k, value_text(v) + " (fixed)"] for k, v in space.fixed.items()]
    lines += _table(["knob", "values"], knobs)
    lines += ["## The answer", ""]
    if best is None:
        lines += ["**No plan fits.**", ""]
    else:
        lines += [f"**Winner #{best.number}: `{best.plan_short}`**: {tps_text(best)} tokens/s "
                  f"({best.tokens_per_s_source}), peak {gpu_peak_text(best, d.fmt)} ({best.source}) of "
                  f"{d.fmt(d.budget_bytes)}"
                  + (f", host peak {host_peak_text(best, d.fmt)} ({best.host_source or best.source})"
                     if best.host_peak_bytes or best.host_bytes else "")
                  + f", accuracy loss {acc_text(best)} ({best.accuracy_source}).", ""]
    lines += [f"- {line}" for line in d.selection.explanation] + [""]
    if best is not None:
        lines += ["### Plan", ""] + _table(["setting", "value"], [list(r) for r in plan_rows(best.plan)])
        rows = [[LABELS[c], f"{d.fmt(best.ledger[c])} ({best.source})",
                 f"{100 * best.ledger[c] / best.peak_bytes:.1f}%"] for c in CATEGORIES if best.ledger.get(c)]
        rows += [[f"**{label}**", f"**{value}** ({best.source})", "100%" if n == 0 else ""]
                 for n, (label, value) in enumerate(step_and_run_rows(best, d.fmt))]
        for c in CATEGORIES:
            if best.host_ledger.get(c):
                rows.append([f"{LABELS[c]} (host)", f"{d.fmt(best.host_ledger[c])} ({best.host_source or best.source})",
                             ""])
        if best.host_peak_bytes or best.host_bytes:
            rows.append(["**Peak in host memory**",
                         f"**{host_peak_text(best, d.fmt)}** ({best.host_source or best.source})", ""])
        lines += ["### Memory ledger of the winner", ""] + _table(["category", "bytes", "share"], rows)
    if d.exports:
        lines += ["### Exports", ""]
        for e in d.exports:
            lines += [f"- `{e['dir']}`: " + ", ".join(f"`{f['name']}`" for f in e["files"])]
        lines += [""]
    lines += ["## Trials", "", "Plots (Pareto front, ledger per trial, timeline, loss curves) are in report.html.", ""]
    rows = []
    for r in d.records:
        rows.append([f"#{r.number}" + (" (winner)" if best and r.number == best.number else ""), r.state, r.stage,
                     r.plan_short, f"{gpu_peak_text(r, d.fmt)} ({r.source})" if r.peak_bytes else "",
                     f"{tps_text(r)} ({r.tokens_per_s_source})" if r.tokens_per_s else "",
                     f"{acc_text(r)} ({r.accuracy_source})" if r.accuracy_loss is not None else "", r.reason])
    lines += _table(["#", "state", "stage", "plan", "peak", "tokens/s", "acc. loss", "why pruned"], rows)
    lines += ["## Predicted vs simulated vs measured", ""]
    if not d.comparisons:
        lines += ["Only one kind of number exists for each trial of this study: nothing to compare.", ""]
    else:
        rows = [[f"#{c.number}", c.plan_short,
                 *[d.fmt(c.peak[k]) if k in c.peak else "" for k in ("estimated", "simulated", "measured")],
                 *[f"{c.tokens_per_s[k]:,.0f}" if k in c.tokens_per_s else "" for k in ("predicted", "measured")]]
                for c in d.comparisons]
        lines += _table(["#", "plan", "peak estimated", "peak simulated", "peak measured", "tokens/s predicted",
                         "tokens/s measured"], rows)
    e = d.environment
    lines += ["## Environment and how to reproduce", "",
              f"- GPU: {e['gpu']} ({e['gpu_key']}){' (assumed)' if e['gpu_assumed'] else ''}; "
              f"detected: {'yes' if e['gpu_detected'] else 'no'}",
              f"- NVIDIA driver: {e['driver']}", f"- CUDA: {e['cuda']}"]
    lines += [f"- {k}: {v or 'not installed'}" for k, v in e["versions"].items()]
    lines += ["", "```sh", d.reproduce, "```", "", f"Storage: `{d.storage}`", ""]
    return "\n".join(lines)
