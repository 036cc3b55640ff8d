"""The simulated GRPO / DPO step (advisor.runtime.simulate.rl: TRL's own loss and fused log-prob code on the simulated
model, under fake tensors) equals TRL's real GRPOTrainer / DPOTrainer training a tiny model on the CPU, phase by phase
(score, train, optimizer) and category by category."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from advisor.core.plan import Plan  # noqa: E402
from advisor.runtime.simulate.rl import RL_CATEGORIES, trace_rl_step  # noqa: E402
from advisor.runtime.simulate.rl_real import measure_trl_step  # noqa: E402
from advisor.runtime.simulate.rl_trl import RLWorkload  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402

SPEC = tiny_spec("qwen2", num_layers=2)
METHODS = {"lora": dict(method="lora", lora_targets="all-linear"), "full": dict(method="full"),
           "qlora": dict(method="qlora", quantization="nf4", double_quant=True, lora_targets="all-linear")}
TOLERANCE = 16 * 512
"""Bytes a phase's peak and each category may differ by: the trainer's own scalars (its loss accumulator, metrics,
the gradient norm) are a few 512-byte blocks the simulated step does not make."""


def grpo(beta: float, reference: str = "auto") -> RLWorkload:
    return RLWorkload(task="grpo", max_prompt_length=16, max_completion_length=16, num_generations=4, beta=beta,
                      reference=reference)


def dpo(reference: str = "auto") -> RLWorkload:
    return RLWorkload(task="dpo", max_prompt_length=12, max_completion_length=20, beta=0.1, reference=reference)


# GRPO: beta 0 (no reference), the PEFT base with the adapter disabled, a frozen copy (full fine-tuning)
# DPO: the disabled adapter, a frozen copy, log-probs computed before training
CASES = [(m, ckpt, rl) for m, ckpt in itertools.product(METHODS, (False, True)) for rl in (
    [grpo(0.0), grpo(0.04)] + [dpo(), dpo("precomputed")] if m != "full" else [grpo(0.0), grpo(0.04), dpo()])]
FAST = {("lora", False, "grpo", 0.04)}


def case_id(case) -> str:
    m, ckpt, rl = case
    return f"{rl.task}-{m}-{'ckpt' if ckpt else 'nockpt'}-beta{rl.beta}-{rl.reference_kind(m != 'full')}"


def plan_of(method: str, ckpt: bool, rl: RLWorkload) -> Plan:
    micro = 4 if rl.task == "grpo" else 2
    return Plan(seq_len=rl.max_prompt_length + rl.max_completion_length, micro_batch=micro, precision="fp32"
                if method != "qlora" else "bf16", gradient_checkpointing=ckpt, **METHODS[method])


@pytest.mark.parametrize("case", [c if (c[0], c[1], c[2].task, c[2].beta) in FAST else
                                  pytest.param(c, marks=pytest.mark.slow) for c in CASES], ids=case_id)
def test_simulated_rl_step_equals_trl(case):
    method, ckpt, rl = case
    plan = plan_of(method, ckpt, rl)
    sim = trace_rl_step(SPEC, plan, rl, fake=True, target_device="cpu")
    real = measure_trl_step(SPEC, plan, rl)
    scored = rl.task == "grpo" and rl.beta > 0
    assert set(sim.phases) == set(real.phases) == ({"score", "train", "optimizer"} if scored else {"train", "optimizer"})
    for name, phase in real.phases.items():
        got = sim.phases[name]
        assert abs(got.bytes - phase.bytes) <= TOLERANCE, (name, got.bytes, phase.bytes)
        for cat in RL_CATEGORIES:
            assert abs(got.ledger[cat] - phase.ledger[cat]) <= TOLERANCE, (name, cat, got.ledger[cat], phase.ledger[cat])
    assert sim.peak_phase == real.peak_phase
    # what the case is about is there: a copy's weights, the fused head's tile, the rollout's tensors
    assert (sim.ledger["reference"] > 0) == (sim.reference == "copy")
    assert sim.phases["train"].ledger["logits"] > 0
