"""The report's plots: matplotlib figures rendered to SVG text for inlining (no files, no network).

Readable on light and dark pages: the figure background is transparent, data use mid-tone
colours, and text, axes and reference lines are drawn in a sentinel colour that ``_svg``
replaces with ``currentColor``, so they take the page's text colour (prefers-color-scheme).
matplotlib is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import io
import re
from typing import Any

from advisor.memory.ledger import CATEGORIES, LABELS
from advisor.search.select import run_peak
from advisor.ui.report._data import ReportData

INK = "#010203"  # sentinel → currentColor
CATEGORY_COLORS = {
    "weights": "#4C78A8", "quant_constants": "#9D755D", "adapter_weights": "#54A24B", "gradients": "#E45756",
    "optimizer_states": "#F58518", "master_weights": "#B279A2", "activations": "#72B7B2",
    "transient": "#D6A90F", "overhead": "#8C8C8C",
}
STATE_COLORS = {"complete": "#54A24B", "pruned": "#F58518", "failed": "#E45756", "running": "#4C78A8",
                "waiting": "#8C8C8C"}
CUT = 1.7  # ledger bars longer than this many budgets are cut at the axis
SOURCE_MARKERS = {"estimated": "o", "simulated": "s", "measured": "D"}
KIND_COLORS = {"estimated": "#4C78A8", "simulated": "#F58518", "measured": "#54A24B",
               "predicted": "#4C78A8"}
RC = {
    "svg.fonttype": "none", "svg.hashsalt": "vram-advisor", "font.size": 9, "font.family": "sans-serif",
    "text.color": INK, "axes.edgecolor": INK, "axes.labelcolor": INK, "xtick.color": INK, "ytick.color": INK,
    "axes.facecolor": "none", "figure.facecolor": "none", "savefig.facecolor": "none", "legend.frameon": False,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": INK, "grid.alpha": 0.15,
}


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot, no global backend: savefig picks the SVG canvas

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig, key: str) -> str:
    """SVG text for inlining: no XML prolog or metadata, ids prefixed per plot, sentinel → currentColor."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", transparent=True, metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{key}-{m.group(1)}"', text)
    text = re.sub(r'(xlink:href|href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{key}-{m.group(2)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{key}-{m.group(1)})", text)
    text = text.replace(INK, "currentColor")
    text = re.sub(r'<svg ([^>]*?)width="[^"]+" height="[^"]+"',
                  rf'<svg \1class="plot" data-plot="{key}" role="img"', text, count=1)
    return text


def _gb(data: ReportData, n: float) -> float:
    from advisor.core.units import unit_factor

    return n / unit_factor(data.unit)


def _budget_lines(ax, data: ReportData, vertical: bool = True) -> None:
    line = ax.axvline if vertical else ax.axhline
    line(_gb(data, data.budget_bytes), color=INK, lw=1.2, ls="--", label=f"budget {data.fmt(data.budget_bytes)}")
    line(_gb(data, data.budget_bytes * (1 - data.headroom)), color=INK, lw=0.8, ls=":",
         label=f"budget less {data.headroom:.0%} headroom")


def render_all(data: ReportData) -> dict[str, str]:
    """{plot key: SVG text} for every plot this study has data for."""
    import matplotlib

    out: dict[str, str] = {}
    with matplotlib.rc_context(RC):
        for key, fn in (("pareto", pareto), ("ledger", ledger_bars), ("timeline", timeline_plot),
                        ("losses", loss_curves), ("compare", comparison_plot)):
            fig = fn(data)
            if fig is not None:
                out[key] = _svg(fig, key)
    return out


def pareto(data: ReportData):
    done = [r for r in data.records if r.peak_bytes and r.tokens_per_s]
    if not done:
        return None
    fig = _figure(8.0, 4.6)
    ax = fig.add_subplot()
    front = data.pareto_numbers
    best = data.best
    feasible = {t.number for t in data.selection.feasible}
    for source, marker in SOURCE_MARKERS.items():
        groups = (
            ("Pareto front", "#4C78A8", [r for r in done if r.number in front and r.source == source], 70),
            ("feasible", "#72B7B2", [r for r in done if r.number in feasible and r.number not in front
                                     and r.source == source], 40),
            ("pruned / not feasible", "#E45756", [r for r in done if r.number not in feasible
                                                  and r.source == source], 40),
        )
        for label, color, rows, size in groups:
            if rows:
                ax.scatter([_gb(data, run_peak(r)) for r in rows], [r.tokens_per_s for r in rows], s=size,
                           marker=marker, color=color, alpha=0.85, edgecolors="none",
                           label=f"{label} ({source} peak)", zorder=3)
    if best is not None:
        ax.scatter([_gb(data, run_peak(best))], [best.tokens_per_s], s=260, marker="*", color="#D6A90F",
                   edgecolors=INK, linewidths=0.6, label=f"winner #{best.number}", zorder=4)
    _budget_lines(ax, data)
    ax.set_xlim(0, max(_gb(data, data.budget_bytes), max(_gb(data, run_peak(r)) for r in done)) * 1.05)
    ax.set_ylim(0, max(r.tokens_per_s for r in done) * 1.12)
    _label_points(ax, [(_gb(data, run_peak(r)), r.tokens_per_s, f"#{r.number}") for r in done])
    sources = sorted({r.tokens_per_s_source for r in done if r.tokens_per_s_source})
    ax.set_xlabel(f"peak GPU memory of the run ({data.unit}; source per marker: ○ estimated, □ simulated, ◇ measured)")
    ax.set_ylabel(f"throughput (tokens/s, {' / '.join(sources) or 'predicted'})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def _label_points(ax, points: list[tuple[float, float, str]]) -> None:
    """Small labels beside points, moved down a line at a time where they would overlap another; a label moved off
    its point is tied to it by a thin leader line, and never moved more than a fifth of the plot's height."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    height_pt = ax.figure.get_size_inches()[1] * 72 * ax.get_position().height  # the axes' height in points
    placed: list[tuple[float, float]] = []
    for x, y, text in sorted(points, key=lambda p: (-p[1], p[0])):
        fx, fy = (x - x0) / (x1 - x0), (y - y0) / (y1 - y0)
        dy = 0.0
        while any(abs(fx - px) < 0.045 and abs(fy + dy - py) < 0.035 for px, py in placed) and dy - 0.035 >= -0.2:
            dy -= 0.035
        placed.append((fx, fy + dy))
        leader = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "alpha": 0.6, "shrinkA": 0, "shrinkB": 2}} if dy else {}
        ax.annotate(text, (x, y), xytext=(5, 3 + dy * height_pt), textcoords="offset points", fontsize=7, alpha=0.85,
                    **leader)


def ledger_bars(data: ReportData):
    rows = [r for r in data.records if r.ledger and r.peak_bytes]
    if not rows:
        return None
    fig = _figure(9.0, 1.6 + 0.27 * len(rows))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    budget = _gb(data, data.budget_bytes)
    peaks = [_gb(data, r.peak_bytes) for r in rows]
    cap = budget * CUT if max(peaks) > budget * CUT else max(max(peaks), budget)  # far-over bars are cut
    left = [0.0] * len(rows)
    for cat in CATEGORIES:
        vals = [_gb(data, r.ledger.get(cat, 0)) for r in rows]
        if not any(vals):
            continue
        drawn = [max(0.0, min(a + v, cap) - min(a, cap)) for a, v in zip(left, vals)]
        ax.barh(ys, drawn, left=[min(a, cap) for a in left], color=CATEGORY_COLORS.get(cat, "#8C8C8C"), height=0.7,
                label=LABELS[cat], edgecolor="none")
        left = [a + v for a, v in zip(left, vals)]
    best = data.best.number if data.best else None
    labels = []
    for y, r, peak in zip(ys, rows, peaks):
        labels.append(f"#{r.number} {'winner' if r.number == best else r.state}")
        cut = "» " if peak > cap else " "
        ax.text(max(min(peak, cap), budget), y, f" {cut}{data.fmt(r.peak_bytes)} {r.source}", va="center",
                fontsize=7)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    _budget_lines(ax, data)
    ax.set_xlim(0, cap * 1.28)
    ax.set_xlabel(f"GPU memory at the peak ({data.unit}), by ledger category"
                  + (f"; bars over {cap:.0f} {data.unit} cut (») " if max(peaks) > cap else ""))
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=4, fontsize=8)
    return fig


def short_reason(reason: str, limit: int = 66) -> str:
    reason = reason.strip()
    return reason if len(reason) <= limit else reason[: limit - 1].rstrip() + "…"


def timeline_plot(data: ReportData):
    rows = [t for t in data.timeline if t["start_s"] is not None]
    if not rows:
        return None
    by_number = {r.number: r for r in data.records}
    fig = _figure(9.0, 1.4 + 0.24 * len(rows))
    ax = fig.add_subplot()
    span = max((t["end_s"] or t["start_s"]) for t in rows) or 1.0
    for state, color in STATE_COLORS.items():
        sel = [t for t in rows if t["state"] == state]
        if not sel:
            continue
        widths = [max((t["end_s"] if t["end_s"] is not None else span) - t["start_s"], span * 0.004) for t in sel]
        ax.barh([t["number"] for t in sel], widths, left=[t["start_s"] for t in sel], color=color, height=0.7,
                label=state)
    ax.set_ylim(max(t["number"] for t in rows) + 0.7, min(t["number"] for t in rows) - 0.7)
    ax.set_yticks([t["number"] for t in rows], [f"#{t['number']}" for t in rows], fontsize=7)
    ax.set_xlabel("seconds since the first trial started")
    ax.grid(axis="y", visible=False)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    best = data.best.number if data.best else None
    notes = []
    for t in rows:
        r = by_number[t["number"]]
        note = "winner" if r.number == best else r.state
        if r.reason:
            note = short_reason(r.reason) if r.state != "complete" else f"{note} {short_reason(r.reason)}"
        notes.append(note)
    right.set_yticks([t["number"] for t in rows], notes, fontsize=7)
    right.tick_params(length=0)
    right.grid(False)
    right.spines["right"].set_visible(False)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(STATE_COLORS), fontsize=8)
    return fig


def loss_curves(data: ReportData):
    probed = [r for r in data.records if r.losses]
    if not probed:
        return None
    fig = _figure(8.0, 3.8)
    ax = fig.add_subplot()
    for r in probed:
        ax.plot(range(1, len(r.losses) + 1), r.losses, marker="o", ms=3, lw=1.4, label=f"#{r.number} (measured)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("probe step")
    ax.set_ylabel("training loss (measured)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def comparison_plot(data: ReportData):
    rows = [c for c in data.comparisons if len(c.peak) > 1]
    if not rows:
        return None
    fig = _figure(9.0, 1.6 + 0.45 * len(rows))
    ax = fig.add_subplot()
    kinds = [k for k in ("estimated", "simulated", "measured") if any(k in c.peak for c in rows)]
    h = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        ys = [j + (i - (len(kinds) - 1) / 2) * h for j, c in enumerate(rows) if kind in c.peak]
        vals = [_gb(data, c.peak[kind]) for c in rows if kind in c.peak]
        ax.barh(ys, vals, height=h * 0.9, color=KIND_COLORS[kind], label=f"{kind} peak")
        for y, v in zip(ys, vals):
            ax.text(v, y, f" {v:,.2f} {data.unit}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"#{c.number}" for c in rows], fontsize=8)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    _budget_lines(ax, data)
    ax.set_xlim(0, max(_gb(data, data.budget_bytes), max(_gb(data, v) for c in rows for v in c.peak.values())) * 1.15)
    ax.set_xlabel(f"peak GPU memory ({data.unit})")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=3, fontsize=8)
    return fig


def plot_titles() -> dict[str, Any]:
    return {"pareto": "Memory against throughput", "ledger": "Ledger of each trial's training step",
            "timeline": "Trial timeline", "losses": "Loss curves of probed trials",
            "compare": "Predicted vs simulated vs measured peak"}
