"""The closed-form ledger of a mixture of experts, what it counts and the rules around it: weights as
transformers + bitsandbytes store them, gpt-oss's MXFP4 rule, LoRA on the experts as a knob (its rules, its
adapters, its exports), the default attention targets on DeepSeek's latent attention, several GPUs.

The ledger against the simulation at real size is tests/test_analytic_vs_simulate.py (the ``moe`` tests)."""

from __future__ import annotations

import json

import pytest
import yaml

from advisor.cli import main
from advisor.core.adapters import adapted_modules, export_targets, target_parameters
from advisor.core.card_rules import mxfp4_kept, ships_mxfp4
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.memory.training import estimate_training

GIB = 2**30


def _estimate(capsys, *args) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_qlora_of_qwen3_30b_keeps_its_experts_in_bf16(capsys):
    """bitsandbytes converts ``type(module) is nn.Linear`` only: the expert stacks and the router stay bf16, so
    "QLoRA" of Qwen3-30B-A3B holds 55.6 GiB of weights (reports/moe_findings.md section 2), not Unsloth's ~17 GB."""
    d = _estimate(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--method", "qlora", "--gradient-checkpointing")
    spec = resolve_model("qwen30b-a3b")
    desc = spec.description
    quantized = sum(m.in_features * m.out_features for layer in desc.layers for m in layer.linears
                    if m.quantized_by_bnb)
    assert d["answered_by"] == "closed form" and d["source"] == "estimated"
    assert d["device"]["weights"] == quantized // 2 + (spec.params_total - quantized) * 2
    assert round(d["device"]["weights"] / GIB, 2) == 55.6  # the simulation's figure (new_architectures.md)
    assert desc.params_by_category["experts"] * 2 < d["device"]["weights"]


def test_gpt_oss_trains_its_mxfp4_experts_in_bf16(capsys):
    d = _estimate(capsys, "--model", "openai/gpt-oss-20b", "--method", "lora")
    assert d["answered_by"] == "closed form"
    assert round(d["device"]["weights"] / GIB, 2) == 38.96 and d["device"]["quant_constants"] == 0
    assert any("MXFP4 experts are dequantized to bf16 at load" in n and "cannot train MXFP4" in n for n in d["notes"])


def test_the_mxfp4_card_rule():
    gpt_oss, qwen = resolve_model("gpt-oss-20b"), resolve_model("qwen30b-a3b")
    assert ships_mxfp4(gpt_oss) and not ships_mxfp4(qwen)
    h100, t4, v100 = resolve_gpu("h100-sxm"), resolve_gpu("t4"), resolve_gpu("v100-16gb")
    assert not mxfp4_kept(gpt_oss, h100, training=True)            # transformers cannot train MXFP4
    assert mxfp4_kept(gpt_oss, h100, training=False)               # inference with Triton and kernels
    assert mxfp4_kept(gpt_oss, t4, training=False)                 # compute capability 7.5 is enough
    assert not mxfp4_kept(gpt_oss, v100, training=False)           # sm70: dequantized with a warning
    assert not mxfp4_kept(gpt_oss, h100, training=False, kernels=False)
    assert not mxfp4_kept(qwen, h100, training=False)


def test_lora_on_the_experts_in_the_ledger():
    spec = resolve_model("qwen30b-a3b")
    attention = estimate_training(spec, Plan(method="lora", gradient_checkpointing=True, lora_dropout=0.0))
    experts = estimate_training(spec, Plan(method="lora", gradient_checkpointing=True, lora_dropout=0.0,
                                           lora_experts=True))
    moe = spec.moe
    per_expert = sum(e.in_features + e.out_features for e in spec.description.layers[0].experts if e.in_features)
    added = 16 * moe.num_experts * per_expert * spec.num_layers  # r x E x (in + out) per stack and layer
    assert experts.extra["params_trainable"] - attention.extra["params_trainable"] == added
    assert experts.device["adapter_weights"] - attention.device["adapter_weights"] == 4 * added
    no_ckpt = estimate_training(spec, Plan(method="lora", lora_dropout=0.0, lora_experts=True))
    stacks = spec.description.params_by_category["experts"] * 2
    # without checkpointing every layer saves its folded bf16 stacks: more than the expert weights themselves
    assert no_ckpt.device["activations"] > stacks


def test_lora_experts_rules_and_search():
    from advisor.search.space import load_space, model_rules, plan_from_params

    assert Plan(method="lora", lora_experts=True).problems()[0].where == "--lora-experts"
    assert any(e.where == "--dora" for e in Plan(method="lora", lora_experts=True, lora_dropout=0.0,
                                                 dora=True).problems())
    dense = model_rules(resolve_model("qwen7b"))(Plan(method="lora", lora_experts=True, lora_dropout=0.0))
    assert dense and "no stacked experts" in dense[0].rule
    assert not model_rules(resolve_model("qwen30b-a3b"))(Plan(method="lora", lora_experts=True, lora_dropout=0.0))
    space = load_space("default")
    assert space.search["lora_experts"] == [False, True]
    arch = resolve_model("qwen30b-a3b").arch
    plan = plan_from_params({"method": "lora", "lora_experts": True}, space, arch)
    assert plan.lora_experts and plan.lora_dropout == 0.0  # the space's dropout applies where dropout is possible
    assert plan_from_params({"method": "lora"}, space, arch).lora_dropout == space.fixed["lora_dropout"]


def test_quality_of_lora_on_the_experts():
    from advisor.search.quality import quality_of, value_key

    attention = Plan(method="lora", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), lora_dropout=0.0)
    experts = attention.with_(lora_experts=True)
    assert value_key(attention, "lora_targets") == "attention" and value_key(experts, "lora_targets") == "all-linear"
    assert quality_of(experts).pickable and quality_of(experts).accuracy_loss < quality_of(attention).accuracy_loss
    assert quality_of(experts).kinds["lora_experts=true"] == "near-exact"


def test_the_default_targets_are_the_models_own_attention(capsys):
    spec = resolve_model("deepseek-v2-lite")
    assert adapted_modules(spec, Plan()) == ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    d = _estimate(capsys, "--model", "deepseek-v2-lite", "--seq-len", "512")
    assert d["answered_by"] == "closed form" and d["extra"]["lora_modules"] == adapted_modules(spec, Plan())
    with pytest.raises(Exception, match="k_proj"):  # named explicitly, they are still checked
        adapted_modules(spec, Plan(lora_targets=("q_proj", "k_proj")))


def test_the_exports_write_what_runs(tmp_path):
    from advisor.configs.export import export_plan
    from advisor.configs.read import read_config

    spec = resolve_model("qwen30b-a3b")
    # all-linear on Qwen3-MoE: peft would rewrite it onto the experts and the router, and raise with dropout 0.05
    plan = Plan(method="lora", lora_targets="all-linear")
    assert export_targets(spec, plan) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    experts = Plan(method="lora", lora_experts=True, lora_dropout=0.0)
    out = export_plan(spec, experts, tmp_path / "e")
    assert "llamafactory" in out.skipped and "target_parameters" in out.skipped["llamafactory"]
    advisor = yaml.safe_load(out["advisor"].read_text())
    assert advisor["lora"]["target_parameters"] == target_parameters(spec) == ["experts.gate_up_proj",
                                                                                "experts.down_proj"]
    assert yaml.safe_load(out["trl"].read_text())["lora_target_parameters"] == target_parameters(spec)
    assert yaml.safe_load(out["axolotl"].read_text())["lora_target_parameters"] == target_parameters(spec)
    for fmt in ("advisor", "trl", "axolotl"):
        assert read_config(out[fmt])[1].lora_experts is True
    gpt_oss = yaml.safe_load(export_plan(resolve_model("gpt-oss-20b"), Plan(method="lora"), tmp_path / "g",
                                         formats=["advisor"])["advisor"].read_text())
    assert gpt_oss["model"]["dequantize_mxfp4"] is True  # train.py loads with Mxfp4Config(dequantize=True)


def test_several_gpus_say_expert_parallelism_is_not_planned(capsys):
    d = _estimate(capsys, "--model", "qwen30b-a3b", "--gpus", "4", "--sharding", "fsdp")
    assert any("expert parallelism" in n and "not planned" in n for n in d["notes"])


def test_the_dense_levers_apply_to_a_mixture_of_experts():
    """One ledger for dense and MoE models: each lever the dense ledger has is described on a mixture of experts
    (held to the simulation in tests/test_analytic_vs_simulate.py), but a full AdaLomo fine-tune (the run fails)."""
    from advisor.core.plan import LOW_RANK_OPTIMIZERS, OPTIMIZERS
    from advisor.memory.closed_form import closed_form_describes

    spec = resolve_model("olmoe-1b-7b")
    plans = [Plan(method="lora", loss="fused-linear"), Plan(method="lora", quantization="int8"),
             Plan(method="lora", offload="zero2_cpu"), Plan(method="lora", activation_offload=True),
             Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=8), Plan(method="lora", packing=True),
             Plan(method="lora", dora=True), Plan(method="lora", optimizer="adamw_torch_fused",
                                                  optimizer_in_backward=True)]
    plans += [Plan(method="full" if o in LOW_RANK_OPTIMIZERS else "lora", optimizer=o) for o in OPTIMIZERS]
    for plan in plans:
        assert closed_form_describes(spec, plan)[0], plan.short()
    described, why = closed_form_describes(spec, Plan(method="full", optimizer="adalomo"))
    assert not described and "AdaLomo" in why
    # the ledger counts each: an activation offload moves the saved activations off the device
    plain = estimate_training(spec, Plan(method="lora", seq_len=4096))
    offloaded = estimate_training(spec, Plan(method="lora", seq_len=4096, activation_offload=True))
    assert offloaded.device["activations"] < plain.device["activations"] / 4
