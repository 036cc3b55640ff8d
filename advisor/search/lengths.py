"""The sequence length of a study's question, and what the answer needs at the lengths SFT data commonly has.

A study planned at the space's default length (no ``seq_len=`` and no ``--data``) answers for a length nobody chose
(issue 41): the answer says so, and gives the answer's plan at 2K and 4K tokens (its run peak against the same
budget, by the backend that gave the answer's own peak), so that a reader whose data is longer sees what
breaks before running it. A GRPO sequence is its prompt and completion: its completions are made longer.
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
    """The run's peak (None: the closed form does not describe the model and nothing simulated it)."""
    verdict: str
    """fits, tight, over, or unknown (advisor.core.fit.fit_verdict)."""

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "run_peak_bytes": self.run_peak_bytes, "verdict": self.verdict}


LENGTH_KNOBS = ("seq_len", "max_prompt_length", "max_completion_length")
"""The knobs that set a sequence's length: ``seq_len`` (SFT, DPO), a GRPO sequence's prompt and completion."""


def planned_tokens(values) -> int | None:
    """The tokens of one planned sequence in a plan's or a space's fixed ``values``: GRPO's prompt + completion (its
    ``seq_len`` is unused: GRPOTrainer sizes by the two), else ``seq_len``."""
    get = values.get if isinstance(values, dict) else lambda k, d=None: getattr(values, k, d)
    if get("task", "sft") == "grpo":
        prompt, completion = get("max_prompt_length"), get("max_completion_length")
        return prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
    seq = get("seq_len")
    return seq if isinstance(seq, int) else None


def at_tokens(plan, n: int):
    """``plan`` with sequences of ``n`` tokens: a GRPO plan's completions made longer (the prompt is the data's),
    another's ``seq_len``."""
    if plan.task == "grpo":
        return plan.with_(max_completion_length=n - plan.max_prompt_length)
    return plan.with_(seq_len=n)


def seq_len_chosen(settings) -> bool:
    """Whether the user gave the length: a ``seq_len=`` (GRPO: prompt or completion length) override or flag, or
    ``--data`` (its longest batch)."""
    given = any(o.split("=", 1)[0].strip() in LENGTH_KNOBS for o in settings.space.overrides)
    return given or settings.data is not None


def at_common_lengths(settings, plan, backend: str = "estimate") -> list[AtLength]:
    """The answer's ``plan`` at each of COMMON_LENGTHS longer than its own, against this study's budget, by
    ``backend`` (the one that gave the answer's own peak, so that the figures compare)."""
    from advisor.core.fit import fit_verdict
    from advisor.memory.closed_form import closed_form_describes
    from advisor.runtime.phases import run_report

    out = []
    for n in COMMON_LENGTHS:
        if n <= planned_tokens(plan) or n > settings.model.max_position_embeddings:
            continue
        longer = at_tokens(plan, n)
        if backend == "estimate" and not closed_form_describes(settings.model, longer)[0]:
            out.append(AtLength(n, None, "unknown"))
            continue
        peak = run_report(settings.model, longer, settings.gpu, backend).run_peak_bytes
        out.append(AtLength(n, peak, fit_verdict(peak, settings.budget.bytes, settings.headroom)))
    return out
