"""Text drawings for the widgets, as pure functions of (records, width): the ledger as horizontal
bars against the budget line, and the memory / throughput scatter with the Pareto front.

Plain characters that every terminal and SSH session shows (block elements, box drawing).
"""

from __future__ import annotations

from rich.text import Text

from advisor.core.fit import usable_bytes
from advisor.memory.ledger import CATEGORIES, LABELS
from advisor.search.select import TrialRecord, run_peak
from advisor.ui.render import gpu_peak_text, host_peak_text

MARK = {"estimated": "e", "simulated": "s", "measured": "m", "predicted": "p", "prior": "~"}
LEGEND = "marks: e estimated · s simulated · m measured · p predicted · ~ prior"
CATEGORY_STYLE = {
    "weights": "blue", "quant_constants": "bright_blue", "adapter_weights": "magenta", "gradients": "red",
    "optimizer_states": "yellow", "master_weights": "bright_yellow", "activations": "green",
    "transient": "cyan", "overhead": "bright_black",
}
FIT_STYLE = {"ok": "green", "tight": "yellow", "over": "red", "": ""}
_EIGHTHS = " ▏▎▍▌▋▊▉"
LABEL_W = 22


def mark(source: str) -> str:
    return MARK.get(source, "?" if source else " ")


def _bar(cells: float, width: int, budget_col: int | None, limit_col: int | None, style: str) -> Text:
    """A bar ``cells`` long (eighths drawn) in a field ``width`` wide, the budget line at ``budget_col``."""
    cells = max(0.0, min(cells, float(width)))
    full = int(cells)
    part = _EIGHTHS[int((cells - full) * 8)] if full < width else ""
    body = "█" * full + (part if part.strip() else "")
    out = Text()
    for col in range(width):
        if col < len(body):
            out.append(body[col], style=style)
        elif col == budget_col:
            out.append("│", style="bold red")
        elif col == limit_col:
            out.append("┊", style="yellow")
        else:
            out.append(" ")
    return out


def ledger_lines(record: TrialRecord, budget_bytes: int, headroom: float, fmt, width: int) -> list[Text]:
    """One bar per ledger category and a stacked total, scaled so the budget line is visible."""
    if not record.ledger or record.peak_bytes is None:
        why = record.reason or ("still running" if record.state == "running" else "no memory figures")
        return [Text(f"#{record.number} {record.plan_short}: no ledger ({why})", style="dim")]
    val_w = max(len(fmt(budget_bytes)), len(fmt(record.peak_bytes))) + 1
    bar_w = max(10, width - LABEL_W - val_w - 2)
    scale = max(budget_bytes, record.peak_bytes) * 1.02
    budget_col = min(bar_w - 1, int(budget_bytes / scale * bar_w))
    limit_col = int(usable_bytes(budget_bytes, headroom) / scale * bar_w)
    left = budget_bytes - run_peak(record)
    head = Text.assemble((f"#{record.number} ", "bold"), record.plan_short, "  ",
                         (f"peak {gpu_peak_text(record, fmt)} ({record.source})", "bold"), f" of {fmt(budget_bytes)}: ",
                         (f"{fmt(abs(left))} {'left' if left >= 0 else 'over'}", "green" if left >= 0 else "red"))
    lines = [head]
    for cat in CATEGORIES:
        n = record.ledger.get(cat, 0)
        if not n:
            continue
        row = Text(f"{LABELS.get(cat, cat)[:LABEL_W]:<{LABEL_W}} ")
        row.append_text(_bar(n / scale * bar_w, bar_w, budget_col, limit_col, CATEGORY_STYLE.get(cat, "white")))
        row.append(f" {fmt(n):>{val_w}}")
        lines.append(row)
    step = "Step (stacked)" if run_peak(record) != record.peak_bytes else "Peak (stacked)"
    total = Text(f"{step:<{LABEL_W}} ", style="bold")
    stacked = Text()
    used = 0.0
    for cat in CATEGORIES:  # whole cells per category, rounded so the total lands where the peak is
        n = record.ledger.get(cat, 0)
        if not n:
            continue
        end = round((used + n) / scale * bar_w)
        start = round(used / scale * bar_w)
        stacked.append("█" * max(0, min(end, bar_w) - start), style=CATEGORY_STYLE.get(cat, "white"))
        used += n
    filled = len(stacked.plain)
    for col in range(filled, bar_w):
        stacked.append("│" if col == budget_col else "┊" if col == limit_col else " ",
                       style="bold red" if col == budget_col else "yellow")
    total.append_text(stacked)
    total.append(f" {fmt(record.peak_bytes):>{val_w}}", style="bold")
    lines.append(total)
    axis = Text(" " * (LABEL_W + 1) + "0")
    label = f"budget {fmt(budget_bytes)} │"
    pad = budget_col + 1 - 1 - len(label)
    if pad >= 1:
        axis.append(" " * pad)
        axis.append(label, style="red")
    lines.append(axis)
    if record.host_peak_bytes or record.host_bytes:
        lines.append(Text(f"{'Host memory peak':<{LABEL_W}} {host_peak_text(record, fmt)}", style="dim"))
    return lines


def pareto_lines(records: list[TrialRecord], pareto: list[TrialRecord], best: TrialRecord | None,
                 budget_bytes: int, headroom: float, fmt, width: int, height: int) -> list[Text]:
    """A scatter of peak memory (x) against tokens/s (y): ★ chosen, ◆ Pareto front, · other trials."""
    pts = [r for r in records if r.state == "complete" and run_peak(r) and r.tokens_per_s]
    legend = Text.assemble(("★", "bold green"), " chosen  ", ("◆", "bold cyan"), " Pareto front  ",
                           ("·", ""), " other complete  ", ("│", "bold red"), " budget  ",
                           ("┊", "yellow"), f" -{headroom:.0%} headroom")
    if not pts:
        return [legend, Text("no complete trial with memory and throughput yet", style="dim")]
    y_max = max(r.tokens_per_s for r in pts) * 1.08
    x_max = max(budget_bytes, max(run_peak(r) for r in pts)) * 1.04
    y_w = len(f"{y_max:,.0f}") + 1
    plot_w = max(10, width - y_w - 1)
    plot_h = max(3, height - 3)  # legend, x axis, x labels
    grid = [[(" ", "")] * plot_w for _ in range(plot_h)]
    budget_col = min(plot_w - 1, int(budget_bytes / x_max * (plot_w - 1)))
    limit_col = int(usable_bytes(budget_bytes, headroom) / x_max * (plot_w - 1))
    for row in grid:
        row[budget_col] = ("│", "bold red")
        if limit_col != budget_col:
            row[limit_col] = ("┊", "yellow")
    front = {r.number for r in pareto}

    def place(r: TrialRecord, glyph: str, style: str, label: bool) -> None:
        col = min(plot_w - 1, int(run_peak(r) / x_max * (plot_w - 1)))
        row = plot_h - 1 - min(plot_h - 1, int(r.tokens_per_s / y_max * (plot_h - 1)))
        grid[row][col] = (glyph, style)
        if label:
            tag = f"#{r.number}"
            if col + 1 + len(tag) <= plot_w and all(grid[row][c][0] in " │┊"
                                                    for c in range(col + 1, col + 1 + len(tag))):
                for k, ch in enumerate(tag):
                    grid[row][col + 1 + k] = (ch, style)

    for r in pts:
        if r.number not in front and (best is None or r.number != best.number):
            place(r, "·", "", False)
    for r in pts:
        if r.number in front and (best is None or r.number != best.number):
            place(r, "◆", "bold cyan", True)
    if best is not None and best.peak_bytes and best.tokens_per_s:
        place(best, "★", "bold green", True)
    lines = [legend]
    for i, row in enumerate(grid):
        y_val = y_max * (plot_h - 1 - i) / (plot_h - 1)
        y_lab = f"{y_val:,.0f}" if i in (0, plot_h // 2, plot_h - 1) else ""
        line = Text(f"{y_lab:>{y_w}}┤" if y_lab else " " * y_w + "│", style="dim")
        for ch, style in row:
            line.append(ch, style=style)
        lines.append(line)
    lines.append(Text(" " * y_w + "└" + "─" * plot_w, style="dim"))
    x_lab = Text(" " * (y_w + 1) + "0")
    label = f"peak →   budget {fmt(budget_bytes)}"
    pad = y_w + 1 + budget_col + 1 - len(x_lab.plain) - len(label)
    if pad >= 1:
        x_lab.append(" " * pad + "peak →   ")
        x_lab.append(f"budget {fmt(budget_bytes)}", style="red")
    else:
        x_lab.append("  peak →")
    lines.append(x_lab)
    return lines


SEGMENT_STYLE = {"resident": "blue", "vllm": "dark_orange", "phase": "green"}
SEGMENT_NAME = {"resident": "resident", "vllm": "vLLM", "phase": "phase"}


def phase_lines(picture, budget_bytes: int, fmt, width: int) -> list[Text]:
    """GRPO/DPO: one stacked bar per phase of the step (the trainer's resident state, what vLLM holds, what the phase
    adds) against the budget line, the peak phase marked, and what vLLM's pool holds (advisor.ui.phase_view)."""
    if picture is None:
        return []
    val_w = len(fmt(max(budget_bytes, picture.scale(budget_bytes)))) + 1
    bar_w = max(10, width - LABEL_W - val_w - 2)
    scale = picture.scale(budget_bytes) * 1.02
    budget_col = min(bar_w - 1, int(budget_bytes / scale * bar_w))
    lines = [Text.assemble((f"{picture.task.upper()} step by phase", "bold"), f": {picture.step_peak_phase} sets the "
                           f"step's peak; run peak {fmt(picture.run_peak_bytes)} during {picture.run_peak_phase}")]
    for bar in picture.bars:
        label = (bar.name + (" ◀ peak" if bar.peak else ""))[:LABEL_W]
        row = Text(f"{label:<{LABEL_W}} ", style="bold" if bar.peak else "")
        used = 0
        for key, n in bar.segments.items():
            start, end = round(used / scale * bar_w), round((used + n) / scale * bar_w)
            row.append("█" * max(0, min(end, bar_w) - start), style=SEGMENT_STYLE[key])
            used += n
        for col in range(len(row.plain) - LABEL_W - 1, bar_w):
            row.append("│" if col == budget_col else " ", style="bold red")
        row.append(f" {fmt(bar.live_bytes):>{val_w}}")
        lines.append(row)
    lines.append(Text("  ".join(f"█ {SEGMENT_NAME[k]}" for k in SEGMENT_STYLE), style="dim"))
    v = picture.vllm
    if v is not None:
        state = ("cannot start" if not v.starts else "holds one generation batch" if v.holds_batch
                 else "preempts: short of one generation batch")
        lines.append(Text(f"vLLM pool {fmt(v.pool_bytes)}: weights {fmt(v.weights_bytes)}, KV {fmt(v.kv_cache_bytes)} "
                          f"({v.kv_tokens:,} tokens; {state}), graphs+reserve {fmt(v.reserve_bytes)}"
                          + ("; asleep while training" if v.asleep_while_training else ""),
                          style="dark_orange"))
    return lines
