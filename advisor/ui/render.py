"""Rendering result objects for people: rich tables on the terminal. No calculation here."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from advisor.core.fit import HEADROOM, fit_verdict, host_fits, host_usable_bytes
from advisor.memory.ledger import LABELS, MemoryReport, RunPhases
from advisor.core.units import Budget, format_bytes


def _fmt(n: float, budget: Budget | None) -> str:
    return budget.format(n) if budget else format_bytes(n, "GiB")


def ledger_table(report: MemoryReport, budget: Budget | None = None, title: str = "Memory ledger"):
    """The ledger as a table: category, GPU bytes, share of the peak, host bytes."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_footer=True)
    table.add_column("Category", footer="Peak on the GPU")
    table.add_column("GPU", justify="right", footer=_fmt(report.peak_bytes, budget))
    table.add_column("Share", justify="right", footer="100%")
    has_host = report.host_bytes > 0
    if has_host:
        table.add_column("Host", justify="right", footer=_fmt(report.host_bytes, budget))
        table.columns[0].footer = "Peak on the GPU / in host memory"
    for cat, n in report.device.items():
        host_n = report.host.get(cat, 0)
        if n == 0 and host_n == 0:
            continue
        share = f"{100 * n / report.peak_bytes:.1f}%" if report.peak_bytes else "-"
        row = [LABELS.get(cat, cat), _fmt(n, budget), share]
        if has_host:
            row.append(_fmt(host_n, budget) if host_n else "")
        table.add_row(*row)
    return table


def verdict_lines(report: MemoryReport, budget: Budget | None, headroom: float = HEADROOM) -> list[str]:
    """Fits / tight / does not fit (advisor.core.fit.fit_verdict), with what is left, in the unit the user typed."""
    lines = [f"Tensor peak {_fmt(report.tensor_peak_bytes, budget)} + overhead "
             f"{_fmt(report.device.get('overhead', 0), budget)} = [bold]{_fmt(report.peak_bytes, budget)}[/] "
             f"({report.source}, peak during {report.peak_phase})"]
    parts = report.extra.get("overhead_parts") or {}
    if report.reserved_peak_bytes and "fragmentation" in parts:
        frag_src = ("replayed" if str(report.extra.get("fragmentation_source", "")).startswith("replayed")
                    else "estimated")
        ctx_src = report.extra.get("overhead_source", "estimated")
        ctx_src = ctx_src if ctx_src.startswith("calibrated") else "estimated"
        lines.append(f"[dim]reserved {_fmt(report.reserved_peak_bytes, budget)} (allocator fragmentation "
                     f"{_fmt(parts['fragmentation'], budget)}, {frag_src}); CUDA context + cuBLAS workspace "
                     f"{_fmt(parts['cuda_context'] + parts['cublas_workspace'], budget)} ({escape(ctx_src)})[/]")
    if budget is not None:
        verdict = fit_verdict(report.peak_bytes, budget.bytes, headroom)
        left = budget.bytes - report.peak_bytes
        if verdict == "fits":
            lines.append(f"[green]FITS[/] in {budget}: {budget.format(left)} left "
                         f"({100 * left / budget.bytes:.1f}% headroom)")
        elif verdict == "tight":
            lines.append(f"[yellow]TIGHT[/] in {budget}: only {budget.format(left)} left, under the "
                         f"{headroom:.0%} headroom")
        else:
            lines.append(f"[red]DOES NOT FIT[/] in {budget}: {budget.format(-left)} over")
    return lines


def host_lines(report: MemoryReport, budget: Budget | None, host_budget: Budget | None = None,
               gpus: int = 1) -> list[str]:
    """The host peak beside the GPU's: pinned and pageable, the load phase and the process, and the host rule's
    verdict against the host budget (advisor.core.fit.host_fits)."""
    hm = report.host_memory
    if hm is None:
        return []
    fmt = lambda n: _fmt(n, budget)  # noqa: E731
    peak = hm.peak_bytes * gpus
    ranks = f" ({gpus} ranks)" if gpus > 1 else ""
    lines = [f"Host peak [bold]{fmt(peak)}[/]{ranks} during {hm.peak_phase}: pinned {fmt(hm.pinned_bytes * gpus)}, "
             f"pageable {fmt(hm.pageable_bytes * gpus)} in training; load {fmt(hm.load_bytes * gpus)} "
             f"({escape(hm.load_what)}); the process {fmt(hm.baseline_bytes * gpus)}"]
    if host_budget is not None:
        usable = host_usable_bytes(host_budget.bytes)
        if host_fits(peak, host_budget.bytes):
            lines.append(f"[green]WITHIN THE HOST BUDGET[/]: {fmt(peak)} of {fmt(usable)} usable of "
                         f"{escape(str(host_budget.text))} of RAM (the rest kept for the OS)")
        else:
            lines.append(f"[red]OVER THE HOST BUDGET[/]: {fmt(peak)} > {fmt(usable)} usable of "
                         f"{escape(str(host_budget.text))} of RAM, {fmt(peak - usable)} over")
    return lines


def print_estimate(result: dict[str, Any], report: MemoryReport, budget: Budget | None,
                   headroom: float = HEADROOM, host_budget: Budget | None = None, gpus: int = 1) -> None:
    from rich.console import Console

    console = Console()
    model = result["model"]
    head = f"[bold]{model['name']}[/] ({model['params_total']:,} parameters)"
    if result.get("plan_short"):
        head += f" · {escape(result['plan_short'])}"
    if result.get("gpu"):
        head += f" · {result['gpu']['name']}" + (" (assumed from the budget)" if result.get("gpu_assumed") else "")
    console.print(head)
    console.print(ledger_table(report, budget))
    for line in verdict_lines(report, budget, headroom):
        console.print(line)
    if report.run_phases is not None:
        console.print(phase_table(report.run_phases, budget))
        for line in run_verdict_lines(report, budget, headroom):
            console.print(line)
    for line in host_lines(report, budget, host_budget, gpus):
        console.print(line)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]")
    for line in generation_lines(result.get("generation"), budget):
        console.print(line)
    if "kv_cache_bytes_per_token" in report.extra:
        console.print(f"KV cache: {report.extra['kv_cache_bytes_per_token']:,} bytes per token, "
                      f"{report.extra['tokens_in_flight']:,} tokens in flight")
    for line in throughput_lines(result):
        console.print(line)


def generation_lines(gen: dict[str, Any] | None, budget: Budget | None = None) -> list[str]:
    """GRPO's generation engine: vLLM's pool and what is in it, or generate()'s KV cache (advisor.memory.rl)."""
    if not gen:
        return []
    if gen["engine"] == "transformers":
        line = (f"Generation: generate() on the policy, {gen['sequences']} x {gen['sequence_tokens']:,} tokens: "
                f"KV cache {_fmt(gen['kv_cache_bytes'], budget)} + transient {_fmt(gen['transient_bytes'], budget)}")
    else:
        where = "on the training GPU" if gen["engine"] == "vllm-colocate" else f"on each of {gen['gpus']} server GPU(s)"
        line = (f"Generation: vLLM pool {_fmt(gen['pool_bytes'], budget)} {where}: weights "
                f"{_fmt(gen['weights_bytes'], budget)}, activations {_fmt(gen['activation_bytes'], budget)}, "
                "CUDA graphs "
                f"{_fmt(gen['cuda_graph_bytes'], budget)}, non-torch {_fmt(gen['non_torch_bytes'], budget)}, KV cache "
                f"{_fmt(gen['kv_cache_bytes'], budget)} = {gen['kv_tokens']:,} tokens "
                + ("(holds the generation batch of " if gen["holds_batch"] else "([yellow]short of[/] the batch's ")
                + f"{gen['batch_tokens']:,})")
    return [line] + [f"[dim]note: {escape(n)}[/]" for n in gen.get("notes", [])]


def throughput_lines(result: dict[str, Any], n: int = 4) -> list[str]:
    """Tokens/s and seconds per optimizer step, and the largest step-time terms (advisor/speed)."""
    info = result.get("throughput")
    if not info:
        return []
    if result.get("tokens_per_s") is None:
        return [f"Throughput: {info['source']}"]
    from advisor.speed.throughput import term_labels

    where = f" on {info['gpu']}" + (" (assumed from the budget)" if info.get("gpu_assumed") else "")
    if info.get("gpus", 1) > 1:
        where += f" x {info['gpus']}"
    lines = [f"Throughput: [bold]{result['tokens_per_s']:,.0f} tokens/s[/] ({info['source']}), "
             f"{result['step_seconds']:.3f} s per optimizer step{escape(where)}"]
    phases = info.get("phases")
    if phases:
        lines.append(f"Phases of the step ({info.get('tokens', 'tokens')}/s above): " + ", ".join(
            f"{name} {p['seconds']:.2f} s ({p['share']:.0%})" for name, p in phases.items() if p["seconds"] > 0))
    terms = result.get("step_terms") or {}
    total = sum(terms.values())
    if total > 0:
        labels = term_labels()
        top = sorted(terms.items(), key=lambda kv: -kv[1])[:n]
        lines.append("Largest terms (predicted s/step): " + ", ".join(
            f"{escape(labels.get(k, k))} {v:.3f} ({v / total:.0%})" for k, v in top))
    return lines


def phase_table(run: RunPhases, budget: Budget | None = None, title: str = "Phases of the run"):
    """One row per phase: live (allocated) and reserved bytes at its peak, the GPU's peak, what sets it."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("Phase", no_wrap=True)
    for col in ("Live", "Reserved", "Peak"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("What sets it", overflow="fold", max_width=34)
    run_peak_phase = run.run_peak_phase
    for name, ph in run.phases.items():
        label = name + (" *" if name == run_peak_phase else "")
        style = "bold" if name == run_peak_phase else ("dim" if not ph.included else "")
        what = escape(ph.what) + ("" if ph.included else " (not in this run)")
        t.add_row(label, _fmt(ph.live_bytes, budget), _fmt(ph.reserved_bytes, budget),
                  _fmt(ph.peak_bytes, budget), what, style=style)
    return t


def run_verdict_lines(report: MemoryReport, budget: Budget | None, headroom: float = HEADROOM) -> list[str]:
    """The run's peak (the highest phase) against the budget (advisor.core.fit.fit_verdict)."""
    run = report.run_phases
    peak, phase = report.run_peak_bytes, report.run_peak_phase
    lines = [f"Run peak [bold]{_fmt(peak, budget)}[/] during {phase} (* above; reserved "
             f"{_fmt(run.phases[phase].reserved_bytes, budget)}, {run.reserved_model})"]
    lines += [f"[dim]note: {n}[/]" for n in run.notes]
    if budget is not None:
        left = budget.bytes - peak
        verdict = fit_verdict(peak, budget.bytes, headroom)
        if verdict == "fits":
            lines.append(f"[green]THE RUN FITS[/] in {budget}: {budget.format(left)} left")
        elif verdict == "tight":
            lines.append(f"[yellow]THE RUN IS TIGHT[/] in {budget}: only {budget.format(left)} left")
        else:
            lines.append(f"[red]THE RUN DOES NOT FIT[/] in {budget}: {budget.format(-left)} over, during {phase}")
    return lines


# ----------------------------------------------------------------------------- tune

STATE_STYLE = {"complete": "green", "pruned": "yellow", "failed": "red", "fail": "red", "running": "cyan",
               "waiting": "dim"}
SOURCE_MARK = {"estimated": "est", "simulated": "sim", "measured": "meas", "predicted": "pred", "prior": "prior"}


def source_mark(source: str) -> str:
    """Short mark of where a number comes from ("calibrated (N probes)" predictions: cal)."""
    return "cal" if source.startswith("calibrated") else SOURCE_MARK.get(source, "")


def trials_table(records, budget: Budget, limit: int | None = None, title: str = "Trials"):
    """One row per trial: state, plan, peak vs budget, tokens/s, accuracy, and where each number comes from;
    the host peak too when any trial keeps memory on the host."""
    from rich.table import Table

    from advisor.search.select import run_peak

    t = Table(title=title, title_justify="left", expand=False)
    rows = records[-limit:] if limit else records
    # a narrow terminal wraps the plan and the reason, never cuts them (80 columns hold every column)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("state / why pruned", overflow="fold")
    t.add_column("plan", overflow="fold")
    # the host peak under the GPU's in the same column: a column of its own would squeeze the plan at 80 columns
    has_host = any(r.host_bytes for r in rows)
    # the accuracy loss is a KL divergence in nats per token (advisor.search.quality): its unit under its name
    for col in ("peak\n[dim]host[/]" if has_host else "peak", "tok/s", "acc. loss\n[dim]nats/tok[/]"):
        t.add_column(col, justify="right", overflow="fold")
    for r in rows:
        style = STATE_STYLE.get(r.state, "")
        # the source of each number on its own line keeps the number columns narrow
        # the run's peak (the highest phase), the one number feasibility and every summary use
        peak = (f"{budget.format(run_peak(r))}\n[dim]{SOURCE_MARK.get(r.source, r.source)}[/]"
                if run_peak(r) else "")
        tps = f"{r.tokens_per_s:,.0f}\n[dim]{source_mark(r.tokens_per_s_source)}[/]" if r.tokens_per_s else ""
        acc = f"{r.accuracy_loss:.3f}\n[dim]{SOURCE_MARK.get(r.accuracy_source, '')}[/]" \
            if r.accuracy_loss is not None and r.state == "complete" else ""
        state = (f"[{style}]{r.state}[/]" if style else escape(r.state)) + (f": {escape(r.reason)}" if r.reason else "")
        if has_host and peak and (r.host_peak_bytes or r.host_bytes):
            value, mark = peak.split("\n", 1)
            peak = f"{value}\n[dim]{budget.format(r.host_peak_bytes or r.host_bytes)}[/]\n{mark}"
        t.add_row(str(r.number), state, escape(r.plan_short), peak, tps, acc)
    return t


def host_budget_line(settings) -> str:
    """The tune header's host budget: the RAM, how it was set, and what the host rule leaves usable."""
    hb = settings.host_budget
    if hb is None:
        return "[dim]Host memory: not checked (a study made before host budgets)[/]"
    how = "the default; --host-budget to plan for another" if settings.host_detected else "--host-budget"
    return (f"[dim]Host budget {escape(str(hb.text))} ({how}): plans may hold "
            f"{hb.format(host_usable_bytes(hb.bytes))} in host memory, the rest kept for the OS.[/]")


class TuneProgress:
    """A progress bar and the latest trials, live on the terminal while the study runs."""

    def __init__(self, settings, enabled: bool = True):
        self.s = settings
        self.enabled = enabled
        self.records: list = []
        self._live = None

    def start(self, already_finished: int, polish_finished: int = 0) -> None:
        """Show the header; ``already_finished``: planned trials the study holds, ``polish_finished``: the trials
        the polish added after them (counted apart: the planned --trials are what the bar counts to)."""
        if not self.enabled:
            return
        from rich.console import Console, Group
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console()
        s = self.s
        from advisor.search.lengths import planned_tokens, seq_len_chosen

        seq = planned_tokens(s.space.fixed)
        length = f" · {seq:,} tokens{'' if seq_len_chosen(s) else ' (the default)'}" if isinstance(seq, int) else ""
        console.print(f"[bold]advisor tune[/] {s.model.name} on {s.budget}{length} · space {s.space.name} · "
                      f"backend {s.backend} · study {s.study_name}")
        console.print(host_budget_line(s))
        if s.gpu_assumed:
            console.print(f"[dim]No GPU detected and none named: throughput is predicted for a {s.gpu.name} "
                          f"({format_bytes(s.gpu.memory_bytes, 'GiB', 0)}), the catalog GPU the budget matches.[/]")
        if s.backend in ("simulate", "estimate"):
            console.print(f"[dim]Backend {s.backend}: memory is "
                          f"{'simulated' if s.backend == 'simulate' else 'estimated'}"
                          ", throughput predicted (step-time model), accuracy from priors: no GPU probes run.[/]")
        if already_finished or polish_finished:
            polish = f" + {polish_finished} polish" if polish_finished else ""
            console.print(f"Resuming: {already_finished} of {s.trials} planned trials{polish} already finished.")
        self._progress = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.description}"), console=console)
        self._task = self._progress.add_task("", total=max(s.trials, already_finished), completed=already_finished)
        self._group = Group(self._progress, trials_table([], s.budget))
        self._live = Live(self._group, console=console, refresh_per_second=4, transient=True)
        self._live.start()
        from advisor.runtime import progress

        self._trial = ""
        progress.add_listener(self._on_steps)  # a simulation inside a trial says so on the trials line

    def _on_steps(self, steps: tuple[str, ...]) -> None:
        if self._live is not None:
            self._progress.update(self._task, description=escape(" · ".join((self._trial, *steps)).strip(" ·")))

    def on_event(self, event) -> None:
        if not self.enabled or self._live is None:
            return
        from rich.console import Group

        from advisor.search.tuner import TrialFinished, TrialStarted, is_polish

        if isinstance(event, TrialStarted):
            self._trial = f"#{event.number} {event.plan_short}"
            self._progress.update(self._task, description=escape(self._trial))
        elif isinstance(event, TrialFinished):
            self.records.append(event.record)
            if is_polish(event.record):  # a polish trial is one more than the planned ones, never "41/40"
                task = self._progress.tasks[0]
                self._progress.update(self._task, total=(task.total or 0) + 1)
            self._progress.advance(self._task)
            self._live.update(Group(self._progress, trials_table(self.records, self.s.budget, limit=12,
                                                                 title="Latest trials")))

    def stop(self) -> None:
        if self._live is not None:
            from advisor.runtime import progress

            progress.remove_listener(self._on_steps)
            self._live.stop()
            self._live = None


def print_tune_result(settings, records, selection, exports, verbose: bool = False) -> None:
    """The answer, the usual recipe beside it and why, and what to run; ``verbose``: every trial, the Pareto front
    and the answer's ledger before them (what `advisor report` and the TUI show too)."""
    from rich.console import Console

    console = Console()
    if verbose:
        _print_trials(console, settings, records, selection)
    best = selection.best
    if best is not None and selection.recipe is not None and selection.recipe.number != best.number:
        console.print(recipe_table(selection.recipe, best, settings.budget))
    for line in selection.explanation:
        style = "bold green" if line.startswith("Chosen") else None
        console.print(escape(line), style=style, highlight=False)
    for kind, path in exports.items():
        console.print(f"exported {kind}: {path}")
    for kind, why in getattr(exports, "skipped", {}).items():
        console.print(f"not exported {kind}: {escape(str(why))}", highlight=False)
    if not verbose:
        console.print(f"[dim]{len(records)} trials, the Pareto front and the answer's ledger: --verbose, or advisor "
                      f"report {escape(settings.study_name)}[/]", highlight=False)
    if best is not None and not exports:
        console.print("Run it: add --export DIR (advisor.yaml + train.py, and the TRL, axolotl and LLaMA-Factory "
                      "configs), then advisor preflight DIR/advisor.yaml", highlight=False)


def _print_trials(console, settings, records, selection) -> None:
    """Every trial, the Pareto front, and the answer's ledger (with its host peak)."""
    from advisor.memory.ledger import MemoryReport
    from advisor.search.select import peak_phase, run_peak

    budget = settings.budget
    console.print(trials_table(records, budget, title=f"All trials ({len(records)})"))
    if selection.pareto:
        from rich.table import Table

        t = Table(title="Pareto front (throughput / accuracy / memory)", title_justify="left")
        pareto_host = any(r.host_bytes for r in selection.pareto)
        for col in ("#", "plan", "peak", *(("host",) if pareto_host else ()), "tok/s", "acc. loss\n[dim]nats/tok[/]"):
            t.add_column(col, justify="left" if col == "plan" else "right", overflow="fold")
        for r in selection.pareto:
            host = (budget.format(r.host_peak_bytes or r.host_bytes),) if pareto_host else ()
            t.add_row(str(r.number), escape(r.plan_short), budget.format(run_peak(r)), *host, f"{r.tokens_per_s:,.0f}",
                      f"{r.accuracy_loss:.3f}")
        console.print(t)
    best = selection.best
    if best is not None:
        ledger = {k: v for k, v in best.ledger.items()}
        report = MemoryReport(source=best.source, backend=settings.backend, device=ledger, host=dict(best.host_ledger),
                              tensor_peak_bytes=best.tensor_peak_bytes or 0, peak_bytes=best.peak_bytes)
        during = f"; the run peaks at {budget.format(run_peak(best))} during {peak_phase(best)}" \
            if peak_phase(best) else ""
        console.print(ledger_table(report, budget, title=f"Winner #{best.number}'s training step{during}: "
                                                         f"{escape(best.plan_short)}"))
        if best.host_peak_bytes or best.host_bytes:
            console.print(winner_host_line(best, budget, settings.host_budget))


def recipe_table(recipe, best, budget):
    """The usual recipe beside the answer: what each predicts, on the same rows."""
    from rich.table import Table

    from advisor.search.select import run_peak, time_to_quality

    t = Table(title="The usual recipe beside the answer", title_justify="left")
    t.add_column("")
    t.add_column(f"usual recipe #{recipe.number}", overflow="fold")
    t.add_column(f"answer #{best.number}", overflow="fold")

    def ttq(r):
        if not r.tokens_per_s or not best.tokens_per_s or r.state != "complete":
            return "-"
        return f"{time_to_quality(r) / time_to_quality(best):.2f}x"

    def peak(r):
        return budget.format(run_peak(r)) if run_peak(r) else "-"

    rows = [("plan", escape(recipe.plan_short), escape(best.plan_short)),
            ("tokens/s", f"{recipe.tokens_per_s:,.0f}" if recipe.tokens_per_s else "-", f"{best.tokens_per_s:,.0f}"),
            ("time to quality", ttq(recipe), ttq(best)),
            ("peak (GPU)", peak(recipe), peak(best)),
            ("peak (host)", host_peak_text(recipe, budget.format) if (recipe.host_peak_bytes or recipe.host_bytes)
             else "-", host_peak_text(best, budget.format) if (best.host_peak_bytes or best.host_bytes) else "-"),
            ("accuracy loss (KL, nats/token)",
             f"{recipe.accuracy_loss:.3f}" if recipe.accuracy_loss is not None else "-", f"{best.accuracy_loss:.3f}")]
    if recipe.state != "complete":
        rows.append(("status", escape(recipe.reason or recipe.state), "fits"))
    for row in rows:
        t.add_row(*row)
    return t


def gpu_peak_text(r, fmt) -> str:
    """A trial's GPU peak as every summary gives it: the run's (its highest phase), and the phase where not the
    training step (the ledger beside it is the step's)."""
    from advisor.search.select import peak_phase, run_peak

    return f"{fmt(run_peak(r))}{f' during {peak_phase(r)}' if peak_phase(r) else ''}"


def step_and_run_rows(r, fmt) -> list[tuple[str, str]]:
    """The closing rows of a trial's ledger: its sum, the training step's peak, and the run's peak where another
    phase sets it (labels, values)."""
    from advisor.search.select import peak_phase

    if not peak_phase(r):
        return [("Peak on the GPU", fmt(r.peak_bytes))]
    return [("Peak of the training step", fmt(r.peak_bytes)),
            (f"Peak on the GPU (the run's, during {peak_phase(r)})", fmt(r.run_peak_bytes))]


def host_peak_text(r, fmt) -> str:
    """A trial's host peak (a TrialRecord's): when it happens, and the pinned and pageable bytes in training.
    The terminal, the report and the TUI show it beside the GPU peak."""
    peak = r.host_peak_bytes or r.host_bytes
    during = " during load" if r.host_peak_phase == "load" else ""
    return (f"{fmt(peak)}{during} (in training: pinned {fmt(r.host_pinned_bytes)}, pageable "
            f"{fmt(r.host_pageable_bytes)})")


def winner_host_line(best, budget: Budget, host_budget: Budget | None) -> str:
    """The winner's host peak beside its GPU peak: pinned and pageable, against the host budget."""
    line = (f"GPU peak {budget.format(best.run_peak_bytes or best.peak_bytes)} ({best.source}) · host peak "
            f"{escape(host_peak_text(best, budget.format))} ({best.host_source or best.source})")
    if host_budget is not None:
        line += f" of {budget.format(host_usable_bytes(host_budget.bytes))} usable of {escape(str(host_budget.text))}"
    return line


# ----------------------------------------------------------------------------- catalogs


def models_table(rows: list[dict[str, Any]]):
    """The model catalog: names, hub ids and aliases whole (never cut, even at 80 columns): one alias a line."""
    from rich import box
    from rich.table import Table

    t = Table(title="Model catalog", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("name, parameters / type, hub ids", no_wrap=True)  # billions; the exact count in --json
    t.add_column("aliases", no_wrap=True)
    for r in rows:
        ids = "\n".join(f"[dim]{escape(i)}[/]" for i in [r["hf_id"], *r.get("hf_variants", [])])
        size = f"{r['params_total'] / 1e9:,.2f}B / {escape(r['model_type'])}"
        t.add_row(f"[bold]{escape(r['name'])}[/]\n{size}\n{ids}", escape("\n".join(r["aliases"])))
    return t


def gpus_table(gpus):
    """The GPU catalog: key and full name stacked in one column so that it fits 80 columns."""
    from rich import box
    from rich.table import Table

    t = Table(title="GPU catalog", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("key / name", no_wrap=True)
    for col in ("memory", "bf16\nTFLOP/s", "fp16\nTFLOP/s", "memory\nGB/s", "host\nGB/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for g in gpus:
        t.add_row(f"{escape(g.key)}\n[dim]{escape(g.name)}[/]", format_bytes(g.memory_bytes, "GiB", 1),
                  str(g.bf16_tflops or "-"), str(g.fp16_tflops), f"{g.mem_bw_gbs:,.0f}", f"{g.host_link_gbs:.0f}")
    return t


def layout_lines(result: dict) -> list[str]:
    """A several-GPU answer's run: the GPUs, the engine and the global batch each step trains
    (advisor.commands.tune.layout_fields)."""
    lay = result.get("layout") or {}
    if (lay.get("gpus") or 1) <= 1 or not lay.get("global_batch"):
        return []
    plan = (result.get("best") or {}).get("plan") or {}
    asked = lay.get("global_batch_asked")
    differs = f" (global_batch={asked} asked: rounded up to whole micro-batches)" \
        if asked and asked != lay["global_batch"] else ""
    return [f"Run: {lay['gpus']} GPUs, {lay['sharding']}; a global batch of {lay['global_batch']:,} sequences a step "
            f"= micro-batch {plan.get('micro_batch')} x accumulation {plan.get('grad_accum')} x "
            f"{lay['data_parallel_ranks']} data-parallel ranks{differs}."]


def length_lines(result: dict, fmt) -> list[str]:
    """A study at the space's default length says so, with the answer at the lengths SFT data commonly has
    (advisor.commands.tune.length_fields)."""
    seq = result.get("seq_len") or {}
    if seq.get("chosen", True) or not seq.get("tokens"):
        return []
    grpo = (result.get("rl") or {}).get("task") == "grpo"
    give = "max_completion_length=N" if grpo else "seq_len=N"
    lines = [f"Planned at {seq['tokens']:,} tokens a sequence{' (prompt + completion)' if grpo else ''}: the space's "
             f"default, not a length you gave ({give}, or --data FILE to plan for your longest batch)."]
    source = (result.get("best") or {}).get("source") or "estimated"
    for a in result.get("at_common_lengths") or ():
        longer = f"{a['seq_len']:,} tokens" + (" (longer completions)" if grpo else "")
        if a["run_peak_bytes"] is None:
            lines.append(f"  at {longer}: not estimated (the closed form does not describe this model)")
        else:
            what = {"fits": "fits", "tight": "fits only inside the headroom", "over": "does NOT fit"}[a["verdict"]]
            lines.append(f"  at {longer} this plan needs {fmt(a['run_peak_bytes'])} ({source}): {what}")
    return lines


def longest_lines(result: dict, fmt) -> list[str]:
    """What tune seq_len=max found (advisor.commands.tune.longest_fields): the longest, its plan, the study's
    length and how far the answer itself reaches."""
    search = result["seq_len_search"]
    fit = search["search"]
    stops = f"; one step more ({fit['next_seq_len']:,} tokens) needs {fmt(fit['next_peak_bytes'])}, " \
            f"{fit['stops']} growing most" if fit.get("next_seq_len") and fit.get("stops") else ""
    ceiling = " (the model's context: past it needs --rope-scaling)" if fit.get("at_ceiling") else ""
    closed = (f"; the closed form says {search['closed_form_max_seq_len']:,}"
              if search["answered_by"] != "closed form" and search.get("closed_form_max_seq_len") else "")
    lines = [f"Longest sequence that fits: {search['max_seq_len']:,} tokens{ceiling}, by {search['plan_short']} "
             f"(by the {search['answered_by']}{closed}){stops}.",
             f"The study ran at {search['study_seq_len']:,} tokens"
             + ("" if fit.get("at_ceiling") else " (within 5% of it)")
             + ": the answer above is the fastest plan there."]
    if result.get("answer_max_seq_len"):
        by = result.get("answer_seq_len_search", {}).get("answered_by", "closed form")
        lines.append(f"The answer itself reaches {result['answer_max_seq_len']:,} tokens (by the {by}).")
    return lines
