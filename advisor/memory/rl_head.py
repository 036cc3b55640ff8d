"""TRL's GRPO / DPO training step as the supervised ledger counts it: the rows and tokens one forward holds, and
TRL's fused log-prob head in place of the logits (advisor.memory.training asks here; advisor.memory.rl builds the
rest of the task on it)."""

from __future__ import annotations

from advisor.core.catalog import ModelSpec
from advisor.core.plan import DPO, DTYPE_BYTES, GRPO, RL_TASKS, Plan

TOKEN_TILE = 4096
"""Tokens per projection tile of TRL's chunked log-prob (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE)."""
VOCAB_TILE = 32768
"""Vocabulary columns per tile (trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE)."""


def is_rl(plan: Plan) -> bool:
    return plan.task in RL_TASKS


def sequence_tokens(plan: Plan) -> int:
    """Tokens of one sequence the trainer forwards: GRPO prompt + completion, DPO max_length (each of chosen and
    rejected)."""
    return plan.max_prompt_length + plan.max_completion_length if plan.task == GRPO else plan.seq_len


def forward_rows(plan: Plan) -> int:
    """Sequences in one forward of the trainer: GRPO micro_batch completions; DPO chosen and rejected concatenated
    (trl DPOTrainer: the collator stacks [chosen, rejected], 2 x per_device_train_batch_size rows)."""
    return 2 * plan.micro_batch if plan.task == DPO else plan.micro_batch


def scored_tokens(plan: Plan) -> int:
    """Positions the fused head scores per forward: GRPO the completion tokens (``logits_to_keep``; prompts are
    labelled -100 and dropped: add_fused_lm_head's compact path); DPO every position of the longest chosen and
    rejected at most (their prompts are masked too, but the ledger takes the longest completion: the whole row)."""
    if plan.task == GRPO:
        return plan.micro_batch * plan.max_completion_length
    return forward_rows(plan) * plan.seq_len


def step_plan(plan: Plan) -> Plan:
    """The supervised step the SFT ledger counts for a GRPO/DPO plan: its rows at its sequence length (the head
    is swapped for TRL's fused one by the caller)."""
    return plan.with_(task="sft", seq_len=sequence_tokens(plan), micro_batch=forward_rows(plan), loss="plain",
                      packing=False)


def fused_head_bytes(model: ModelSpec, plan: Plan, tokens: int, *, grad: bool) -> tuple[int, int]:
    """(forward, backward) transient of TRL's fused LM head over ``tokens`` scored positions
    (trl/kernels/chunked_logprob.py ChunkedLogProbFunction; trl/trainer/utils.py add_fused_lm_head).

    Forward: the compact hidden states of the scored positions (``hidden_states[mask]``, N x h in the compute dtype,
    saved for backward), one [min(N, 4096), 32768] projection tile, and ten fp32 per-token vectors (running max, sums,
    target logit, log_z, log-probs, entropy...). Backward (``grad``): an fp32 gradient of the hidden states (N x h,
    cast back to the compute dtype for autograd), the tile again, the saved vectors, and an fp32 gradient of the
    head's weight (V x h) when it trains (a full fine-tune)."""
    p = DTYPE_BYTES[plan.activation_dtype]
    h, V = model.hidden_size, model.vocab_size
    tile = min(tokens, TOKEN_TILE) * min(V, VOCAB_TILE) * p
    fwd = tokens * h * p + tile + 10 * tokens * 4
    if not grad:
        return int(fwd), 0
    head_grad = V * h * 4 if plan.method == "full" else 0
    bwd = tokens * h * (p + 4 + p) + tile + 4 * tokens * 4 + head_grad
    return int(fwd), int(bwd)


def head_bytes(model: ModelSpec, plan: Plan) -> tuple[int, int]:
    """The training step's head transient of a GRPO/DPO plan (advisor.memory.training.logits_bytes asks here)."""
    return fused_head_bytes(model, plan, scored_tokens(plan), grad=True)
