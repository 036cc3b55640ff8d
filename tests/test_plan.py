from __future__ import annotations

import json

import pytest

from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.plan import ALL_LINEAR, Plan, lora_target_modules


def test_defaults_are_valid_and_round_trip():
    for plan in (Plan(), Plan(method="full", optimizer="adafactor"),
                 Plan(method="qlora", quantization="nf4", double_quant=True, lora_targets=ALL_LINEAR),
                 Plan(method="lora", quantization="int8", offload="none", loss="chunked")):
        plan.validate()
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@pytest.mark.parametrize("changes,flag", [
    (dict(method="qlora"), "--quantization"),                       # qlora needs 4-bit
    (dict(method="lora", quantization="nf4"), "--quantization"),    # 4-bit + adapters is qlora
    (dict(method="full", quantization="int8"), "--quantization"),
    (dict(double_quant=True), "--double-quant"),
    (dict(lora_r=0), "--lora-r"),
    (dict(lora_alpha=0), "--lora-alpha"),
    (dict(lora_dropout=1.0), "--lora-dropout"),
    (dict(lora_targets=()), "--lora-targets"),
    (dict(seq_len=0), "--seq-len"),
    (dict(micro_batch=-1), "--micro-batch"),
    (dict(optimizer="adamw_8bit", offload="zero2_cpu"), "--optimizer"),
    (dict(precision="fp32", attn_impl="flash_attention_2"), "--attn-impl"),
    (dict(method="full", precision="fp16"), "--precision"),
    (dict(method="nope"), "--method"),
])
def test_invalid_combinations_name_the_rule(changes, flag):
    with pytest.raises(AdvisorInputError) as e:
        Plan(**changes).validate()
    assert str(e.value).startswith(flag)


def test_all_errors_at_once():
    with pytest.raises(ConfigErrors) as e:
        Plan(method="qlora", lora_r=0, double_quant=False, optimizer="sgd", offload="zero3_cpu").validate()
    assert len(e.value.errors) >= 2


def test_unknown_key_in_dict():
    with pytest.raises(AdvisorInputError, match="unknown key"):
        Plan.from_dict({"methd": "lora"})


def test_targets_must_exist_in_the_model():
    layers = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert lora_target_modules(Plan(lora_targets=ALL_LINEAR), layers) == layers
    with pytest.raises(AdvisorInputError, match="--lora-targets.*qkv_proj"):
        lora_target_modules(Plan(lora_targets=("qkv_proj",)), layers)



def test_lever_rules():
    from advisor.core.plan import checkpointed_layers, every_n_layers

    assert Plan(method="full", optimizer="galore_adamw").problems() == []
    [e] = Plan(method="lora", optimizer="apollo_adamw").problems()
    assert e.where == "--optimizer" and "--method full" in e.rule
    [e] = Plan(optimizer="adalomo", grad_accum=2).problems()
    assert e.where == "--grad-accum" and "must be 1" in e.rule
    [e] = Plan(optimizer_in_backward=True, grad_accum=8).problems()
    assert e.where == "--grad-accum"
    [e] = Plan(checkpoint_layers=4).problems()
    assert e.where == "--checkpoint-layers" and "--gradient-checkpointing" in e.rule
    [e] = Plan(optimizer="lomo", optimizer_in_backward=True).problems()
    assert e.where == "--optimizer-in-backward"
    # transformers' every_n_layers choice where one gives k layers, even spans otherwise
    assert checkpointed_layers(Plan(gradient_checkpointing=True, checkpoint_layers=14), 28) == tuple(range(0, 28, 2))
    assert len(checkpointed_layers(Plan(gradient_checkpointing=True, checkpoint_layers=11), 28)) == 11
    assert every_n_layers(4, 28) == 7 and every_n_layers(11, 28) is None
    assert Plan(method="full", optimizer="galore_adamw", gradient_checkpointing=True, checkpoint_layers=4,
                activation_offload=True).short() == "full bf16 ckpt4 act-offload galore_adamw(r128) b1x1 s1024"
