"""tune's refusal of a budget below the smallest plan says why the weights are that large and what would fit."""

from __future__ import annotations

from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.core.units import format_bytes
from advisor.memory.sharding import shard_report
from advisor.memory.training import estimate_training
from advisor.search.refusal import bf16_expert_bytes, gpus_for_zero3, what_would_fit

GIB = 2**30
QLORA = Plan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True,
             lora_targets="all-linear", optimizer="paged_adamw_8bit")


def test_a_mixture_of_experts_in_4_bits_says_its_experts_stay_bf16_and_what_fits():
    model = resolve_model("qwen30b-a3b")
    rep = estimate_training(model, QLORA)
    text = what_would_fit(model, QLORA, rep, 24 * GIB, 0.05, format_bytes)
    assert "stacked 3-D parameters" in text and "stay in bf16 under nf4" in text
    n = gpus_for_zero3(model, QLORA, rep, 24 * GIB, 0.05)
    assert f"--gpus {n} --sharding zero3" in text
    # the count is the fewest that fits: one fewer does not
    assert shard_report(rep, model, QLORA, n, "zero3").peak_bytes <= 24 * GIB * 0.95
    assert shard_report(rep, model, QLORA, n // 2, "zero3").peak_bytes > 24 * GIB * 0.95 or n == 2
    assert "another stack, not planned here" in text


def test_a_dense_model_names_no_experts():
    model = resolve_model("qwen7b")
    plan = Plan(method="full", optimizer="adamw_torch")
    assert bf16_expert_bytes(model, plan) == 0
    text = what_would_fit(model, plan, estimate_training(model, plan), 24 * GIB, 0.05, format_bytes)
    assert "experts" not in text and "--sharding zero3" in text
