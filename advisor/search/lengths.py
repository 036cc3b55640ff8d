"""The sequence length of a study's question, and what the answer needs at the lengths SFT data commonly has.

A study planned at the space's default length (no ``seq_len=`` and no ``--data``) answers for a length nobody chose
(issue 41): the answer says so, and gives the answer's plan at 2K and 4K tokens (the closed form's run peak against
the same budget), so that a reader whose data is longer sees what breaks before running it.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMON_LENGTHS = (2048, 4096)
"""The lengths the answer is also checked at: typical SFT data runs to 2-4K tokens (chat and instruction sets)."""


@dataclass(frozen=True)
class AtLength:
    """The answer's plan at another sequence length."""

    seq_len: int
    run_peak_bytes: int | None
    """The closed form's run peak (None: the closed form does not describe the model)."""
    verdict: str
    """fits, tight, over, or unknown (advisor.core.fit.fit_verdict)."""

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "run_peak_bytes": self.run_peak_bytes, "verdict": self.verdict}


def seq_len_chosen(settings) -> bool:
    """Whether the user gave the length: a ``seq_len=`` override or flag, or ``--data`` (its longest batch)."""
    given = any(o.split("=", 1)[0].strip() == "seq_len" for o in settings.space.overrides)
    return given or settings.data is not None


def at_common_lengths(settings, plan) -> list[AtLength]:
    """The answer's ``plan`` at each of COMMON_LENGTHS longer than its own (closed form, this study's budget)."""
    from advisor.core.fit import fit_verdict
    from advisor.memory.closed_form import closed_form_describes
    from advisor.runtime.phases import run_report

    out = []
    for n in COMMON_LENGTHS:
        if n <= plan.seq_len or n > settings.model.max_position_embeddings:
            continue
        longer = plan.with_(seq_len=n)
        if not closed_form_describes(settings.model, longer)[0]:
            out.append(AtLength(n, None, "unknown"))
            continue
        peak = run_report(settings.model, longer, settings.gpu).run_peak_bytes
        out.append(AtLength(n, peak, fit_verdict(peak, settings.budget.bytes, settings.headroom)))
    return out
