"""Findings: what a check found, how sure it is, the evidence, and the fix. Shared by
`advisor preflight` and `advisor doctor`; rendered by the CLI, serialised to JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    check: str
    """Stable identifier of the check (e.g. memory.fit, config.pad-token, env.bf16)."""
    severity: str
    """ok, info, warning (RISKY) or error (NO-GO)."""
    title: str
    """One line a person reads first."""
    evidence: str = ""
    """The numbers or text the finding rests on."""
    fixes: tuple[str, ...] = ()
    """What to do, most effective first."""
    area: str = ""
    """environment, config, memory, time, log."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable details."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fixes"] = list(self.fixes)
        return d


def verdict(findings: list[Finding]) -> str:
    """GO (nothing worse than info), RISKY (a warning), NO-GO (an error)."""
    if any(f.severity == "error" for f in findings):
        return "NO-GO"
    if any(f.severity == "warning" for f in findings):
        return "RISKY"
    return "GO"


def print_findings(findings: list[Finding], header: str | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if header:
        console.print(header)
    style = {"ok": "green", "info": "cyan", "warning": "yellow", "error": "red"}
    for f in findings:
        console.print(f"[{style[f.severity]}]{f.severity.upper():8}[/] [bold]{escape(f.title)}[/]", highlight=False)
        if f.evidence:
            console.print(f"         {escape(f.evidence)}", highlight=False)
        for fix in f.fixes:
            console.print(f"         → {escape(fix)}", highlight=False)
