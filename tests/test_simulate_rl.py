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
from matrix import matrix_params  # noqa: E402  (tests/matrix.py)

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
# DPO: the disabled adapter, a frozen copy (full fine-tuning, and once beside LoRA), log-probs computed before training
CASES = [(m, ckpt, rl) for m, ckpt in itertools.product(METHODS, (False, True)) for rl in (
    [grpo(0.0), grpo(0.04)] + [dpo(), dpo("precomputed")] if m != "full" else [grpo(0.0), grpo(0.04), dpo()])]
CASES.append(("lora", False, dpo("copy")))  # DPOTrainer given a frozen copy beside a PEFT policy
ACCUMULATED = [grpo(0.04), dpo()]
"""Two micro-batches per optimizer step: GRPO's generation batch of two micro-batches, shuffled and split
(steps_per_generation = gradient_accumulation_steps, TRL's default); DPO's accumulation window."""
FAST = {("lora", False, "grpo", 0.04)}


def case_id(case) -> str:
    m, ckpt, rl = case
    return f"{rl.task}-{m}-{'ckpt' if ckpt else 'nockpt'}-beta{rl.beta}-{rl.reference_kind(m != 'full')}"


def plan_of(method: str, ckpt: bool, rl: RLWorkload, grad_accum: int = 1) -> Plan:
    micro = 4 if rl.task == "grpo" else 2
    return Plan(seq_len=rl.max_prompt_length + rl.max_completion_length, micro_batch=micro, precision="fp32"
                if method != "qlora" else "bf16", gradient_checkpointing=ckpt, grad_accum=grad_accum, **METHODS[method])


# by default every method, checkpointing, workload, beta and reference once; all of CASES with --full-matrix
@pytest.mark.parametrize("case", matrix_params(
    [(c,) for c in CASES],
    lambda c: [("method", c[0][0]), ("ckpt", c[0][1]), ("task", c[0][2].task), ("beta", c[0][2].beta),
               ("reference", c[0][2].reference_kind(c[0][0] != "full"))],
    ids=lambda c: case_id(c[0]), slow=lambda c: (c[0][0], c[0][1], c[0][2].task, c[0][2].beta) not in FAST))
def test_simulated_rl_step_equals_trl(case):
    method, ckpt, rl = case
    check(plan_of(method, ckpt, rl), rl)


@pytest.mark.slow
@pytest.mark.parametrize("rl", ACCUMULATED, ids=lambda rl: rl.task)
def test_accumulated_rl_step_equals_trl(rl):
    check(plan_of("lora", True, rl, grad_accum=2), rl)


def check(plan: Plan, rl: RLWorkload) -> None:
    sim = trace_rl_step(SPEC, plan, rl, fake=True, target_device="cpu")
    real = measure_trl_step(SPEC, plan, rl)
    scored = rl.task == "grpo" and rl.beta > 0
    assert set(sim.phases) == set(real.phases) == ({"score", "train", "optimizer"} if scored
                                                   else {"train", "optimizer"})
    for name, phase in real.phases.items():
        got = sim.phases[name]
        assert abs(got.bytes - phase.bytes) <= TOLERANCE, (name, got.bytes, phase.bytes)
        for cat in RL_CATEGORIES:
            assert abs(got.ledger[cat] - phase.ledger[cat]) <= TOLERANCE, (name, cat, got.ledger[cat],
                                                                            phase.ledger[cat])
    assert sim.peak_phase == real.peak_phase
    # what the case is about is there: a copy's weights, the fused head's tile, the rollout's tensors
    assert (sim.ledger["reference"] > 0) == (sim.reference == "copy")
    assert sim.phases["train"].ledger["logits"] > 0 and sim.phases["train"].ledger["rollout"] > 0


def test_cuda_head_scores_only_the_completion_tokens():
    """On a GPU target the fused head scores the labelled positions only (add_fused_lm_head's compact path) and its
    Triton fold allocates nothing: the train phase's logits are one bf16 tile of micro_batch x completion rows by
    32,768 columns and a few per-token vectors; on the CPU every position of prompt and completion is scored."""
    rl = grpo(0.04)
    plan = Plan(seq_len=32, micro_batch=4, **METHODS["lora"])
    cuda = trace_rl_step(SPEC, plan, rl, fake=True, target_device="cuda").phases["train"].ledger["logits"]
    cpu = trace_rl_step(SPEC, plan, rl, fake=True, target_device="cpu").phases["train"].ledger["logits"]
    tile = plan.micro_batch * rl.max_completion_length * 32768 * 2
    assert 0 <= cuda - tile < 32 * 1024, (cuda, tile)
    assert cpu > (rl.max_prompt_length + rl.max_completion_length - 1) / rl.max_completion_length * tile


def test_simulate_backend_answers_a_grpo_plan():
    from advisor.memory.ledger import CATEGORIES
    from advisor.runtime.backends import get_backend

    plan = Plan(task="grpo", method="lora", micro_batch=4, num_generations=4, max_prompt_length=16,
                max_completion_length=16, beta=0.04)
    report = get_backend("simulate")(SPEC, plan)
    assert report.source == "simulated" and report.peak_phase == "train"
    assert set(CATEGORIES) <= set(report.device) and report.device["rollout"] > 0
    assert report.tensor_peak_bytes == sum(v for k, v in report.device.items() if k != "overhead")
    assert set(report.extra["rl_phases"]) == {"score", "train", "optimizer"}
    assert report.tensor_peak_bytes == report.extra["phase_peaks"]["train"]


@pytest.mark.slow
def test_extrapolated_rl_step_equals_the_full_trace():
    """Two traces (2 and 3 decoder layers) extended to 6 equal a trace of all 6, phase by phase."""
    from advisor.runtime.simulate.rl import simulate_rl

    spec = tiny_spec("qwen2", num_layers=6)
    plan = Plan(seq_len=32, micro_batch=4, gradient_checkpointing=True, **METHODS["lora"])
    rl = grpo(0.04)
    ext = simulate_rl(spec, plan, rl)
    full = simulate_rl(spec, plan, rl, layers="full")
    assert ext.extrapolated and not full.extrapolated
    for name, phase in full.phases.items():
        assert abs(ext.phases[name].bytes - phase.bytes) <= 4 * 512, (name, ext.phases[name].bytes, phase.bytes)


@pytest.mark.slow
def test_cli_simulates_a_dpo_plan(capsys):
    import json

    from advisor.cli import main

    args = ["estimate", "--task", "dpo", "--model", "qwen0.5b", "--method", "lora", "--seq-len", "256",
            "--gradient-checkpointing", "--json"]
    assert main(args + ["--backend", "simulate"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["source"] == "simulated" and "train" in sim["phases"] and sim["extra"]["reference"] == "adapter"
    assert set(sim["extra"]["rl_phases"]) == {"train", "optimizer"}
