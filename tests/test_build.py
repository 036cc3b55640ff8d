"""advisor.runtime.build: the plan applied to a real model, on real CPU tensors and under FakeTensorMode."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from advisor.memory.training import param_breakdown  # noqa: E402
from advisor.runtime.build import build_training_setup, chunked_causal_lm_loss  # noqa: E402
from advisor.core.errors import AdvisorInputError  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402

SPEC = tiny_spec("qwen2")


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("plan", [
    Plan(method="full", seq_len=64),
    Plan(method="lora", seq_len=64, gradient_checkpointing=True),
    Plan(method="lora", seq_len=64, lora_targets="all-linear", optimizer="adafactor"),
    Plan(method="qlora", quantization="nf4", double_quant=True, seq_len=64, optimizer="adamw_8bit"),
    Plan(method="lora", quantization="int8", seq_len=64, optimizer="paged_adamw_8bit"),
], ids=lambda p: p.short())
def test_real_step_trains_what_the_plan_says(plan):
    setup = build_training_setup(SPEC, plan)
    assert trainable(setup.model) == param_breakdown(SPEC, plan).trainable
    ids, labels = setup.make_batch(0)
    first = float(setup.micro_step(ids, labels))
    before = {n: p.detach().clone() for n, p in setup.model.named_parameters() if p.requires_grad}
    setup.optimizer_step()
    assert all(p.grad is None for p in setup.model.parameters())  # zero_grad(set_to_none=True)
    changed = [n for n, p in setup.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed, "the optimizer step changed no trainable parameter"
    for _ in range(8):
        setup.train_step([(ids, labels)])
    assert float(setup.micro_step(ids, labels)) < first  # it learns the batch it sees


def test_quantized_layers_are_real_bitsandbytes_on_real_tensors():
    import bitsandbytes as bnb

    setup = build_training_setup(SPEC, Plan(method="qlora", quantization="nf4", seq_len=32))
    layer = setup.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert type(layer) is bnb.nn.Linear4bit and isinstance(layer.weight, bnb.nn.Params4bit)
    assert layer.weight.dtype == torch.uint8 and layer.weight.numel() == SPEC.hidden_size * SPEC.q_dim // 2
    assert setup.model.base_model.model.lm_head.weight.dtype == torch.bfloat16  # lm_head is not quantized


def test_standins_replace_bitsandbytes_under_fake_tensors():
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        setup = build_training_setup(SPEC, Plan(method="qlora", quantization="nf4", seq_len=32))
        setup.train_step([setup.make_batch()])
    layer = setup.model.base_model.model.model.layers[0].mlp.down_proj
    assert type(layer).__name__ == "StandinLinear4bit"


def test_adamw_foreach_follows_the_target_device():
    plan = Plan(method="lora", seq_len=32)
    assert build_training_setup(SPEC, plan).optimizer.defaults["foreach"] is False
    assert build_training_setup(SPEC, plan, target_device="cuda").optimizer.defaults["foreach"] is True


def test_lora_adapters_are_fp32_and_on_the_targets():
    setup = build_training_setup(SPEC, Plan(method="lora", seq_len=32, lora_targets=("q_proj", "v_proj"), lora_r=4))
    names = [n for n, p in setup.model.named_parameters() if p.requires_grad]
    assert names and all(("q_proj" in n or "v_proj" in n) and "lora_" in n for n in names)
    assert all(p.dtype == torch.float32 for p in setup.model.parameters() if p.requires_grad)


def test_chunked_loss_equals_the_models_own_loss():
    setup = build_training_setup(SPEC, Plan(method="full", seq_len=300, precision="fp32"))
    ids, labels = setup.make_batch(1)
    labels[0, :17] = -100
    with torch.no_grad():
        want = setup.model(input_ids=ids, labels=labels).loss
        got = chunked_causal_lm_loss(setup.model, ids, labels, chunk_tokens=64)
    assert torch.allclose(want, got, rtol=1e-5)


def test_fewer_layers_and_bad_input():
    setup = build_training_setup(SPEC, Plan(method="lora", seq_len=32), num_layers=1)
    assert len(setup.model.base_model.model.model.layers) == 1
    with pytest.raises(AdvisorInputError, match="quant_impl"):
        build_training_setup(SPEC, Plan(method="lora"), quant_impl="gptq")
    with pytest.raises(AdvisorInputError, match="num_layers"):
        build_training_setup(SPEC, Plan(method="lora"), num_layers=0)
