"""Rendering result objects for people: rich tables on the terminal. No calculation here."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from advisor.core.fit import HEADROOM, fit_verdict
from advisor.memory.ledger import LABELS, MemoryReport
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


def print_estimate(result: dict[str, Any], report: MemoryReport, budget: Budget | None,
                   headroom: float = HEADROOM) -> None:
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
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]")
    if "kv_cache_bytes_per_token" in report.extra:
        console.print(f"KV cache: {report.extra['kv_cache_bytes_per_token']:,} bytes per token, "
                      f"{report.extra['tokens_in_flight']:,} tokens in flight")


# ----------------------------------------------------------------------------- tune

STATE_STYLE = {"complete": "green", "pruned": "yellow", "failed": "red", "running": "cyan", "waiting": "dim"}
SOURCE_MARK = {"estimated": "est", "simulated": "sim", "measured": "meas", "predicted": "pred", "prior": "prior"}


def trials_table(records, budget: Budget, limit: int | None = None, title: str = "Trials"):
    """One row per trial: state, plan, peak vs budget, tokens/s, accuracy, and where each number comes from."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", expand=False)
    for col, just in (("#", "right"), ("state", "left"), ("plan", "left"), ("peak", "right"), ("tok/s", "right"),
                      ("acc. loss", "right"), ("why pruned", "left")):
        t.add_column(col, justify=just, overflow="fold" if col == "why pruned" else "ellipsis")
    rows = records[-limit:] if limit else records
    for r in rows:
        style = STATE_STYLE.get(r.state, "")
        peak = (f"{budget.format(r.peak_bytes)} [dim]{SOURCE_MARK.get(r.source, r.source)}[/]"
                if r.peak_bytes else "")
        tps = f"{r.tokens_per_s:,.0f} [dim]{SOURCE_MARK.get(r.tokens_per_s_source, '')}[/]" if r.tokens_per_s else ""
        acc = f"{r.accuracy_loss:.3f} [dim]{SOURCE_MARK.get(r.accuracy_source, '')}[/]" \
            if r.accuracy_loss is not None and r.state == "complete" else ""
        t.add_row(str(r.number), f"[{style}]{r.state}[/]", escape(r.plan_short), peak, tps, acc, escape(r.reason))
    return t


class TuneProgress:
    """A progress bar and the latest trials, live on the terminal while the study runs."""

    def __init__(self, settings, enabled: bool = True):
        self.s = settings
        self.enabled = enabled
        self.records: list = []
        self._live = None

    def start(self, already_finished: int) -> None:
        if not self.enabled:
            return
        from rich.console import Console, Group
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console()
        s = self.s
        console.print(f"[bold]advisor tune[/] {s.model.name} on {s.budget} · space {s.space.name} · "
                      f"backend {s.backend} · study {s.study_name}")
        if s.gpu_assumed:
            console.print(f"[dim]No GPU detected and none named: throughput is predicted for a {s.gpu.name} "
                          f"({format_bytes(s.gpu.memory_bytes, 'GiB', 0)}), the catalog GPU the budget matches.[/]")
        if s.backend in ("simulate", "estimate"):
            console.print(f"[dim]Backend {s.backend}: memory is {'simulated' if s.backend == 'simulate' else 'estimated'}"
                          ", throughput predicted (roofline), accuracy from priors: no GPU probes run.[/]")
        if already_finished:
            console.print(f"Resuming: {already_finished} of {s.trials} trials already finished.")
        self._progress = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.description}"), console=console)
        self._task = self._progress.add_task("", total=s.trials, completed=already_finished)
        self._group = Group(self._progress, trials_table([], s.budget))
        self._live = Live(self._group, console=console, refresh_per_second=4, transient=True)
        self._live.start()

    def on_event(self, event) -> None:
        if not self.enabled or self._live is None:
            return
        from rich.console import Group

        from advisor.search.tuner import TrialFinished, TrialStarted

        if isinstance(event, TrialStarted):
            self._progress.update(self._task, description=escape(f"#{event.number} {event.plan_short}"))
        elif isinstance(event, TrialFinished):
            self.records.append(event.record)
            self._progress.advance(self._task)
            self._live.update(Group(self._progress, trials_table(self.records, self.s.budget, limit=12,
                                                                 title="Latest trials")))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def print_tune_result(settings, records, selection, exports) -> None:
    from rich.console import Console

    from advisor.memory.ledger import MemoryReport

    console = Console()
    budget = settings.budget
    console.print(trials_table(records, budget, title=f"All trials ({len(records)})"))
    if selection.pareto:
        from rich.table import Table

        t = Table(title="Pareto front (throughput / accuracy / memory)", title_justify="left")
        for col in ("#", "plan", "peak", "tok/s", "acc. loss"):
            t.add_column(col, justify="left" if col == "plan" else "right")
        for r in selection.pareto:
            t.add_row(str(r.number), escape(r.plan_short), budget.format(r.peak_bytes), f"{r.tokens_per_s:,.0f}",
                      f"{r.accuracy_loss:.3f}")
        console.print(t)
    best = selection.best
    if best is not None:
        ledger = {k: v for k, v in best.ledger.items()}
        report = MemoryReport(source=best.source, backend=settings.backend, device=ledger, host={},
                              tensor_peak_bytes=best.tensor_peak_bytes or 0, peak_bytes=best.peak_bytes)
        console.print(ledger_table(report, budget, title=f"Winner #{best.number}: {escape(best.plan_short)}"))
    for line in selection.explanation:
        style = "bold green" if line.startswith("Chosen") else None
        console.print(escape(line), style=style, highlight=False)
    for kind, path in exports.items():
        console.print(f"exported {kind}: {path}")
