"""Pick the serving plan: feasible, above the quality floor, most served tokens, then throughput, then quality.

"Most" and "fastest" are read within ``tie_tolerance``: served tokens within it of the most are a tie broken by
throughput, and predicted throughputs within it of the fastest are a tie broken by the quality prior (a decode
roofline cannot tell a 3% difference; a format that loses accuracy must buy more than that: gpt-oss served as its
published MXFP4 rather than a 4-bit re-quantization a few percent faster on paper)."""

from __future__ import annotations

from dataclasses import dataclass, field

from advisor.search.select import non_dominated
from advisor.search.serve_grid import Candidate


@dataclass(frozen=True)
class ServeSelection:
    best: Candidate | None
    pareto: list[Candidate] = field(default_factory=list)
    """Feasible plans above the floor that no other beats on served tokens, tokens/s and quality at once."""
    explanation: str = ""
    rejected: dict[str, int] = field(default_factory=dict)
    """How many candidates were dropped, by reason."""


def select(cands: list[Candidate], quality_floor: float, tie_tolerance: float) -> ServeSelection:
    fitting = [c for c in cands if c.fits]
    good = [c for c in fitting if c.quality >= quality_floor]
    rejected = {"over_budget": len(cands) - len(fitting), "below_quality_floor": len(fitting) - len(good)}
    if not good:
        why = ("no plan fits the budget" if not fitting else
               f"every plan that fits is below the quality floor {quality_floor}")
        return ServeSelection(None, [], why, rejected)
    top = max(c.served_tokens for c in good)
    near = [c for c in good if c.served_tokens >= (1 - tie_tolerance) * top]
    fastest = max(c.throughput.tokens_per_s for c in near)
    quick = [c for c in near if c.throughput.tokens_per_s >= (1 - tie_tolerance) * fastest]
    best = max(quick, key=lambda c: (c.quality, c.throughput.tokens_per_s, -c.report.peak_bytes))
    pareto = non_dominated(good, lambda c: (c.served_tokens, c.throughput.tokens_per_s, c.quality))
    pareto.sort(key=lambda c: (-c.served_tokens, -c.throughput.tokens_per_s))
    text = (f"{best.plan.short()}: {best.served_tokens:,} tokens in flight (within {tie_tolerance:.0%} of the most, "
            f"{top:,}), {best.throughput.tokens_per_s:,.0f} tokens/s predicted (within {tie_tolerance:.0%} of the "
            f"fastest, {fastest:,.0f}), quality prior {best.quality:.3f} >= floor {quality_floor}")
    return ServeSelection(best, pareto, text, rejected)
