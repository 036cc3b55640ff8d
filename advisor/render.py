"""Rendering result objects for people: rich tables on the terminal. No calculation here."""

from __future__ import annotations

from typing import Any

from advisor.ledger import LABELS, MemoryReport
from advisor.units import Budget, format_bytes


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


def verdict_lines(report: MemoryReport, budget: Budget | None, headroom: float = 0.05) -> list[str]:
    """Fits / does not fit, with the headroom left, in the unit the user typed."""
    lines = [f"Tensor peak {_fmt(report.tensor_peak_bytes, budget)} + overhead "
             f"{_fmt(report.device.get('overhead', 0), budget)} = [bold]{_fmt(report.peak_bytes, budget)}[/] "
             f"({report.source}, peak during {report.peak_phase})"]
    if budget is not None:
        needed = report.peak_bytes * (1 + headroom)
        left = budget.bytes - report.peak_bytes
        if needed <= budget.bytes:
            lines.append(f"[green]FITS[/] in {budget}: {budget.format(left)} left "
                         f"({100 * left / budget.bytes:.1f}% headroom)")
        elif report.peak_bytes <= budget.bytes:
            lines.append(f"[yellow]TIGHT[/] in {budget}: only {budget.format(left)} left, under the "
                         f"{headroom:.0%} headroom")
        else:
            lines.append(f"[red]DOES NOT FIT[/] in {budget}: {budget.format(-left)} over")
    return lines


def print_estimate(result: dict[str, Any], report: MemoryReport, budget: Budget | None) -> None:
    from rich.console import Console

    console = Console()
    model = result["model"]
    head = f"[bold]{model['name']}[/] ({model['params_total']:,} parameters)"
    if result.get("plan_short"):
        head += f" · {result['plan_short']}"
    if result.get("gpu"):
        head += f" · {result['gpu']['name']}"
    console.print(head)
    console.print(ledger_table(report, budget))
    for line in verdict_lines(report, budget):
        console.print(line)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]")
    if "kv_cache_bytes_per_token" in report.extra:
        console.print(f"KV cache: {report.extra['kv_cache_bytes_per_token']:,} bytes per token, "
                      f"{report.extra['tokens_in_flight']:,} tokens in flight")
