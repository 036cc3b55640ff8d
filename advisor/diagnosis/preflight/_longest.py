"""``advisor preflight --seq-len max``: the longest sequence the config's plan fits, and its finding.

The search is advisor.memory.longest's (the one advisor estimate asks: bisection on the run's peak, by the token on
the closed form, by ``STEP`` tokens on the simulation); this module checks the question can be asked of the config
and says the answer. Calculation only: a finding, rendered by the CLI.
"""

from __future__ import annotations

from advisor.core.errors import AdvisorInputError
from advisor.core.plan import SEQ_MAX, Plan
from advisor.core.units import Budget
from advisor.diagnosis.findings import Finding
from advisor.memory.ledger import LABELS
from advisor.memory.longest import LongestFit


def asked(seq_len, max_seq_len: int | None, budget: Budget | None, plan: Plan) -> bool:
    """Whether ``--seq-len`` asks for the longest (``max``); a one-line input error where it cannot be answered."""
    if seq_len is not None and max_seq_len is not None:
        raise AdvisorInputError("--seq-len", "give --seq-len or --max-seq-len, not both", seq_len)
    if seq_len != SEQ_MAX:
        return False
    if budget is None:
        raise AdvisorInputError("--seq-len", "max needs a budget to fit: give --gpu-budget or --gpu", seq_len)
    if plan.task == "grpo":  # GRPO's sequences are max_prompt_length + max_completion_length, not seq_len
        raise AdvisorInputError("--seq-len", "max is the longest training sequence; a GRPO config's length is "
                                "max_prompt_length + max_completion_length", seq_len)
    return True


def finding(fit: LongestFit, budget: Budget, by: str) -> Finding:
    """What the search found: the longest length and what stops the next step (an error where none fits)."""
    data = {"max_seq_len": fit.max_seq_len, "search": fit.to_dict()}
    if fit.max_seq_len is None:
        return Finding("memory.longest", "error", f"--seq-len max: not even {fit.step:,} tokens fit {budget}",
                       f"peak {budget.format(fit.peak_bytes)} at {fit.step:,} tokens ({by})",
                       ("lower the micro-batch, turn on gradient checkpointing or load the base in 4-bit; or run "
                        "`advisor tune --seq-len max` for the plan that reaches farthest",), "memory", data)
    if fit.at_ceiling:
        why = (f"the model's context ({fit.ceiling:,} tokens); longer needs --rope-scaling (yarn:FACTOR reaches "
               "FACTOR x max_position_embeddings)")
    else:
        stops = LABELS.get(fit.stops, fit.stops or "the peak").lower()
        why = (f"{fit.next_seq_len:,} tokens peak at {budget.format(fit.next_peak_bytes)}: {stops} grows most "
               f"over that step")
    return Finding("memory.longest", "ok", f"longest sequence that fits: {fit.max_seq_len:,} tokens (peak "
                   f"{budget.format(fit.peak_bytes)} of {budget})",
                   f"{why}; bisection on the {by}, by {fit.step} token{'s' if fit.step > 1 else ''}, "
                   f"{fit.measured} lengths measured", (), "memory", data)
