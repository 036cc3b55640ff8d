"""report.html: one self-contained page (inline CSS and SVG, no script, no request of any kind).

A Content-Security-Policy of ``default-src 'none'`` makes the "offline" promise checkable: a
browser refuses (and logs) any fetch the page would try.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from advisor import __version__
from advisor.memory.ledger import CATEGORIES, LABELS
from advisor.ui.report._data import ReportData
from advisor.ui.render import gpu_peak_text, host_peak_text, step_and_run_rows
from advisor.ui.report._format import (SOURCE_HELP, acc_text, gpu_line, host_budget_text, plan_rows, space_source,
                                       tps_text, value_text)
from advisor.ui.report._plots import plot_titles
from advisor.search.select import TrialRecord, run_peak

CSS = """
:root { color-scheme: light dark; --bg:#ffffff; --fg:#1d1f23; --muted:#5b6270; --card:#f4f5f7; --border:#d9dce1;
  --accent:#2f6fb3; --good:#2e7d32; --warn:#b26a00; --bad:#c62828; }
@media (prefers-color-scheme: dark) { :root { --bg:#14161a; --fg:#e4e6ea; --muted:#a0a7b3; --card:#1d2026;
  --border:#363a44; --accent:#82b3ea; --good:#7cc47f; --warn:#f0a848; --bad:#ef7a7a; } }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "DejaVu Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.6em; margin: 0 0 4px; } h2 { font-size: 1.25em; margin: 36px 0 10px;
  padding-bottom: 4px; border-bottom: 1px solid var(--border); } h3 { font-size: 1.05em; margin: 18px 0 6px; }
p, li { max-width: 80ch; } .muted { color: var(--muted); } a { color: var(--accent); }
nav { margin: 10px 0 0; font-size: .92em; } nav a { margin-right: 14px; white-space: nowrap; }
.card { background: var(--card); border: 1px solid var(--border); border-radius: 8px; padding: 14px 18px; }
.answer { border-left: 4px solid var(--good); }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr)); gap: 16px; }
table { border-collapse: collapse; font-size: .9em; margin: 6px 0; }
th, td { text-align: left; padding: 4px 10px 4px 0; border-bottom: 1px solid var(--border); vertical-align: top; }
th { color: var(--muted); font-weight: 600; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
tr.winner td { background: color-mix(in srgb, var(--good) 14%, transparent); }
.state-complete { color: var(--good); } .state-pruned { color: var(--warn); } .state-failed { color: var(--bad); }
.src { display: inline-block; font-size: .72em; padding: 0 5px; margin-left: 4px; border-radius: 4px;
  border: 1px solid var(--border); color: var(--muted); vertical-align: 1px; white-space: nowrap; }
.src-measured { border-color: var(--good); color: var(--good); }
.src-simulated { border-color: var(--accent); color: var(--accent); }
.notes li { color: var(--muted); } code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .88em; }
td:first-child { white-space: nowrap; } pre.cmd { white-space: pre-wrap; word-break: break-all; }
pre { background: var(--card); border: 1px solid var(--border); border-radius: 6px; padding: 10px; overflow-x: auto; }
figure { margin: 10px 0 18px; } figcaption { color: var(--muted); font-size: .88em; margin-top: 4px; }
svg.plot { width: 100%; height: auto; color: var(--fg); display: block; }
svg.plot text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
details summary { cursor: pointer; color: var(--accent); }
"""  # noqa: E501 (the stylesheet's text as the page carries it)


def src(kind: str) -> str:
    if not kind:
        return ""
    return f'<span class="src src-{escape(kind)}" title="{escape(SOURCE_HELP.get(kind, kind))}">{escape(kind)}</span>'


def _table(head: list[str], rows: list[list[str]], num: set[int] = frozenset(), row_class=None) -> str:
    h = "".join(f'<th{" class=num" if i in num else ""}>{c}</th>' for i, c in enumerate(head))
    body = []
    for k, row in enumerate(rows):
        cls = f' class="{row_class[k]}"' if row_class and row_class[k] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td{" class=num" if i in num else ""}>{c}</td>'
                                           for i, c in enumerate(row)) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{h}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _figure(plots: dict[str, str], key: str, caption: str) -> str:
    if key not in plots:
        return ""
    return (f'<figure id="plot-{key}" aria-label="{escape(plot_titles()[key])}">{plots[key]}'
            f"<figcaption>{caption}</figcaption></figure>")


def question(d: ReportData) -> str:
    s = d.description
    m, space = s.model, s.space
    counts = d.counts()
    rows = [
        ["Model", f"<b>{escape(m.name)}</b> <span class=muted>({escape(m.hf_id or '')}, "
                  f"{m.params_total:,} parameters)</span>"],
        ["GPU", escape(gpu_line(s))],
        ["Memory budget", f"<b>{escape(s.budget.text)}</b> = {s.budget.bytes:,} bytes, "
                          f"{d.headroom:.0%} kept free"],
        ["Host memory budget", escape(host_budget_text(s, d.fmt))],
        ["Accuracy tolerance", f"{s.tolerance} (KL nats/token)"],
        ["Backend", f"{escape(s.backend)} <span class=muted>(last stage of each trial)</span>"],
        ["Trials", f"{len(d.records)} in the study ("
                   + ", ".join(f"{n} {escape(k)}" for k, n in sorted(counts.items())) + f"); {s.trials} planned"],
        ["Search space", f"{escape(space.name)} <span class=muted>{escape(space_source(space))}</span>"],
    ]
    knobs = [[escape(k), escape(value_text(v))] for k, v in space.search.items()]
    knobs += [[escape(k), escape(value_text(v)) + " <span class=muted>(fixed)</span>"]
              for k, v in space.fixed.items()]
    knobs += [[escape(o), "<span class=muted>(override)</span>"] for o in space.overrides]
    return ('<section id="question"><h2>The question</h2><div class="grid"><div>'
            + _table(["", ""], rows) + "</div><div><h3>Search space</h3>" + _table(["knob", "values"], knobs)
            + "</div></div></section>")


def _ledger_table(d: ReportData, r: TrialRecord) -> str:
    rows = []
    for cat in CATEGORIES:
        n = r.ledger.get(cat, 0)
        if n:
            share = f"{100 * n / r.peak_bytes:.1f}%" if r.peak_bytes else ""
            rows.append([escape(LABELS[cat]), escape(d.fmt(n)) + src(r.source), share])
    rows += [[f"<b>{escape(label)}</b>", f"<b>{escape(value)}</b>" + src(r.source), "100%" if n == 0 else ""]
             for n, (label, value) in enumerate(step_and_run_rows(r, d.fmt))]
    for cat in CATEGORIES:
        if r.host_ledger.get(cat):
            rows.append([escape(LABELS[cat]) + " <span class=muted>(host)</span>",
                         escape(d.fmt(r.host_ledger[cat])) + src(r.host_source or r.source), ""])
    if r.host_peak_bytes or r.host_bytes:
        rows.append(["<b>Peak in host memory</b>", f"<b>{escape(host_peak_text(r, d.fmt))}</b>"
                     + src(r.host_source or r.source), ""])
    return _table(["Category", "Bytes", "Share"], rows, num={1, 2})


def answer(d: ReportData) -> str:
    best = d.best
    expl = "".join(f"<li>{escape(line)}</li>" for line in d.selection.explanation)
    if best is None:
        return (f'<section id="answer"><h2>The answer</h2><div class="card"><p><b>No plan fits.</b></p>'
                f"<ul>{expl}</ul></div></section>")
    left = d.budget_bytes - run_peak(best)
    head = (f'<div class="card answer"><p style="font-size:1.1em;margin:0 0 6px">Winner <b>#{best.number}</b>: '
            f"<code>{escape(best.plan_short)}</code></p><p style='margin:0'>"
            f"<b>{tps_text(best)}</b> tokens/s{src(best.tokens_per_s_source)} · peak "
            f"<b>{escape(gpu_peak_text(best, d.fmt))}"
            f"</b>{src(best.source)} of {escape(d.fmt(d.budget_bytes))} "
            f"({escape(d.fmt(left))} left{src(best.source)}) · "
            + (f"host peak <b>{escape(host_peak_text(best, d.fmt))}</b>{src(best.host_source or best.source)} · "
               if best.host_peak_bytes or best.host_bytes else "")
            + f"accuracy loss <b>{acc_text(best)}</b>{src(best.accuracy_source)}</p></div>")
    plan = _table(["Setting", "Value"], [[escape(a), escape(b)] for a, b in plan_rows(best.plan)])
    exports = _exports(d)
    return (f'<section id="answer"><h2>The answer</h2>{head}<h3>Why</h3><ul>{expl}</ul>'
            f'<div class="grid"><div><h3>Plan</h3>{plan}</div><div><h3>Memory ledger of the winner</h3>'
            f"{_ledger_table(d, best)}</div></div>{exports}</section>")


SEGMENT_COLOR = {"resident": "#4c72b0", "vllm": "#dd8452", "phase": "#55a868"}
SEGMENT_LABEL = {"resident": "trainer's resident state (weights, adapters, optimizer)", "vllm": "what vLLM holds",
                 "phase": "what the phase adds (KV cache, activations, log-prob head, merge)"}


def phases_section(d: ReportData) -> str:
    """GRPO/DPO: one stacked bar per phase of the winner's step against the budget, the phase that sets the peak
    marked, and what vLLM's pool holds (advisor.ui.phase_view's numbers, rendered here)."""
    pic = d.phases
    if pic is None:
        return ""
    scale = pic.scale(d.budget_bytes)
    budget_at = 100 * d.budget_bytes / scale
    rows = []
    for bar in pic.bars:
        cells = "".join(
            f'<span title="{escape(SEGMENT_LABEL[k])}: {escape(d.fmt(v))}" style="display:inline-block;height:18px;'
            f'width:{100 * v / scale:.2f}%;background:{SEGMENT_COLOR[k]}"></span>'
            for k, v in bar.segments.items() if v > 0)
        name = f"<b>{escape(bar.name)} ◀ peak</b>" if bar.peak else escape(bar.name)
        rows.append(f'<tr><td>{name}</td><td style="width:60%"><div style="position:relative;white-space:nowrap">'
                    f'{cells}<span style="position:absolute;left:{budget_at:.2f}%;top:-3px;height:24px;'
                    f'border-left:2px dashed #c44e52" title="budget"></span></div></td>'
                    f'<td class=num>{escape(d.fmt(bar.live_bytes))}{src("estimated")}</td>'
                    f"<td class=muted>{escape(bar.what)}</td></tr>")
    legend = " ".join(f'<span style="display:inline-block;width:10px;height:10px;background:{SEGMENT_COLOR[k]}">'
                      f"</span> {escape(SEGMENT_LABEL[k])}" for k in SEGMENT_COLOR)
    out = [f'<section id="phases"><h2>The {escape(pic.task.upper())} step, phase by phase</h2>',
           f"<p>{escape(pic.step_peak_phase)} sets the step's peak; the run peaks at "
           f"<b>{escape(d.fmt(pic.run_peak_bytes))}</b>{src('estimated')} during {escape(pic.run_peak_phase)}. "
           f"Dashed: the budget ({escape(d.fmt(d.budget_bytes))}).</p>",
           f'<table><tr><th>Phase</th><th>Live memory</th><th>Bytes</th><th>What sets it</th></tr>{"".join(rows)}'
           f'</table><p class=muted>{legend}</p>']
    v = pic.vllm
    if v is not None:
        parts = "".join(f'<span title="{escape(k)}: {escape(d.fmt(n))}" style="display:inline-block;height:18px;'
                        f'width:{100 * n / max(v.pool_bytes, 1):.2f}%;background:{c}"></span>'
                        for (k, n), c in zip(v.parts.items(), ("#dd8452", "#8172b3", "#937860")) if n > 0)
        where = "on each server GPU" if v.engine == "vllm-server" else "on the training GPU"
        state = ("it cannot start" if not v.starts else
                 "it holds one generation batch" if v.holds_batch else "short of one generation batch: it preempts")
        out.append(f"<h3>What vLLM holds</h3><p>Its pool, {escape(d.fmt(v.pool_bytes))} {where}: weights "
                   f"{escape(d.fmt(v.weights_bytes))}, KV cache {escape(d.fmt(v.kv_cache_bytes))} "
                   f"({v.kv_tokens:,} tokens for a batch of {v.batch_tokens:,}: {state}), CUDA graphs and reserve "
                   f"{escape(d.fmt(v.reserve_bytes))}"
                   + ("; asleep while the trainer scores and trains" if v.asleep_while_training else "")
                   + f'.</p><div style="width:60%;white-space:nowrap">{parts}</div>')
    return "".join(out) + "</section>"


def _exports(d: ReportData) -> str:
    if not d.exports:
        return ("<h3>Exports</h3><p class=muted>No exported configs beside the study. To write them (advisor.yaml, "
                "DeepSpeed JSON, train.py, axolotl and LLaMA-Factory YAML), run the same tune command again with "
                "<code>--export DIR</code>: the study is finished, so it only exports.</p>")
    parts = ["<h3>Exports</h3>"]
    for e in d.exports:
        parts.append(f"<p>In <code>{escape(e['dir'])}</code>:</p>")
        for f in e["files"]:
            body = f"<pre>{escape(f['text'])}</pre>" if f["text"] is not None else "<p class=muted>(not text)</p>"
            parts.append(f"<details><summary><code>{escape(f['name'])}</code></summary>{body}</details>")
    return "".join(parts)


def trials_table(d: ReportData) -> str:
    best = d.best.number if d.best else None
    front = d.pareto_numbers
    times = {t["number"]: t for t in d.timeline}
    rows, classes = [], []
    for r in d.records:
        mark = " ★" if r.number == best else (" ◆" if r.number in front else "")
        rows.append([f"#{r.number}{mark}", f'<span class="state-{escape(r.state)}">{escape(r.state)}</span>',
                     escape(r.stage), escape(r.ladder), f"<code>{escape(r.plan_short)}</code>",
                     (escape(gpu_peak_text(r, d.fmt)) + src(r.source)) if r.peak_bytes else "",
                     (tps_text(r) + src(r.tokens_per_s_source)) if r.tokens_per_s else "",
                     (acc_text(r) + src(r.accuracy_source)) if r.accuracy_loss is not None else "",
                     f"{r.seconds:.2f}" if r.state in ("complete", "pruned") else "",
                     _clock(times.get(r.number, {}).get("started", "")), escape(r.reason)])
        classes.append("winner" if r.number == best else "")
    return _table(["#", "state", "stage", "ladder rung", "plan", "peak", "tokens/s", "acc. loss", "s", "started",
                   "why pruned"], rows, num={5, 6, 7, 8}, row_class=classes)


def _clock(iso: str) -> str:
    """The time of day of an ISO timestamp, the full timestamp on hover."""
    return f'<span title="{escape(iso)}">{escape(iso[11:19])}</span>' if len(iso) >= 19 else escape(iso)


def comparisons(d: ReportData, plots: dict[str, str]) -> str:
    if not d.comparisons:
        return ('<section id="compare"><h2>Predicted vs simulated vs measured</h2><p class=muted>Only one kind of '
                "number exists for each trial of this study (backend "
                f"{escape(d.description.backend)}): nothing to compare.</p></section>")
    rows = []
    for c in d.comparisons:
        peaks = [(escape(d.fmt(c.peak[k])) + src(k)) if k in c.peak else ""
                 for k in ("estimated", "simulated", "measured")]
        tps = [(f"{c.tokens_per_s[k]:,.0f}" + src(k)) if k in c.tokens_per_s else "" for k in ("predicted", "measured")]
        rows.append([f"#{c.number}", f"<code>{escape(c.plan_short)}</code>", *peaks, *tps])
    return ('<section id="compare"><h2>Predicted vs simulated vs measured</h2><p class=muted>The estimated peak and '
            "predicted throughput are recomputed for the report from each trial's plan; the simulated and measured "
            "numbers are the ones the trial recorded.</p>"
            + _figure(plots, "compare", "Peak per trial from each source, against the budget.")
            + _table(["#", "plan", "peak estimated", "peak simulated", "peak measured", "tokens/s predicted",
                      "tokens/s measured"], rows, num={2, 3, 4, 5, 6}) + "</section>")


def environment(d: ReportData) -> str:
    e = d.environment
    rows = [["GPU", escape(f"{e['gpu']} ({e['gpu_key']})") + (" — assumed" if e["gpu_assumed"] else "")],
            ["GPU detected", "yes" if e["gpu_detected"] else "no"],
            ["NVIDIA driver", escape(str(e["driver"]))], ["CUDA", escape(str(e["cuda"]))]]
    rows += [[escape(k), escape(v or "not installed")] for k, v in e["versions"].items()]
    rendered = e["rendered_with"]
    return ('<section id="environment"><h2>Environment and how to reproduce</h2><div class="grid"><div>'
            "<h3>Recorded with the study</h3>" + _table(["", ""], rows) + "</div><div><h3>Reproduce</h3>"
            f'<pre class="cmd">{escape(d.reproduce)}</pre><p class=muted>Storage: <code>{escape(d.storage)}</code></p>'
            f"<p class=muted>Report rendered by vram-advisor {escape(__version__)} on Python "
            f"{escape(rendered['python'])}, {escape(rendered['platform'])}.</p></div></div></section>")


def render_html(d: ReportData, plots: dict[str, str]) -> str:
    best = d.best
    title = f"vram-advisor report: {d.study}"
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    notes = "".join(f"<li>{escape(n)}</li>" for n in d.notes)
    legend = " ".join(f"{src(k)} {escape(v)}" for k, v in SOURCE_HELP.items())
    losses = (_figure(plots, "losses", "Training loss at each probe step (measured).") if "losses" in plots else
              "<p class=muted>No trial was probed on real hardware (backend "
              f"{escape(d.description.backend)}), so there are no loss curves.</p>")
    body = [
        f"<header><h1>{escape(title)}</h1><p class=muted>{escape(d.description.model.name)} on "
        f"{escape(d.description.budget.text)} · {len(d.records)} trials · generated {now}</p>",
        '<nav><a href="#question">Question</a><a href="#answer">Answer</a>'
        + ('<a href="#phases">Phases</a>' if d.phases is not None else "") + '<a href="#pareto">Pareto</a>'
        '<a href="#ledger">Ledger</a><a href="#trials">Trials</a><a href="#losses">Loss</a>'
        '<a href="#compare">Predicted vs measured</a><a href="#environment">Environment</a></nav></header>',
        f'<p class="muted" style="margin-top:14px">Where each number comes from: {legend}</p>',
        f'<ul class="notes">{notes}</ul>' if notes else "",
        question(d), answer(d), phases_section(d),
        '<section id="pareto"><h2>Memory against throughput</h2>'
        + _figure(plots, "pareto", "Every trial with a peak and a throughput. ◆ in the table: on the Pareto front "
                  "(throughput, accuracy loss and memory together, so a front point may look dominated here when it "
                  "wins on accuracy). Dashed: the budget; dotted: the budget less headroom.")
        + "</section>",
        '<section id="ledger"><h2>Where the memory goes, per trial</h2>'
        + _figure(plots, "ledger", "Ledger categories stacked at each trial's peak, with the source of the numbers "
                  "after each bar. Trials pruned before any estimate (invalid plans) have no bar.") + "</section>",
        '<section id="trials"><h2>Trials</h2>'
        + _figure(plots, "timeline", "When each trial ran, coloured by outcome; on the right, why it was pruned.")
        + trials_table(d) + "</section>",
        f'<section id="losses"><h2>Loss curves</h2>{losses}</section>',
        comparisons(d, plots), environment(d),
    ]
    desc = f"winner #{best.number}" if best else "no plan fits"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f'<meta name="description" content="{escape(desc)}"><link rel="icon" href="data:,">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
            + "\n".join(body) + "</main></body></html>\n")
