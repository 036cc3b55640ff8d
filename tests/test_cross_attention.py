"""Mllama (Llama-3.2-Vision) trained on text alone: its cross-attention layers are loaded and skipped
(MllamaTextModel.forward), so they hold weights and adapters but save nothing and get no gradient or optimizer
state; the tower is loaded too. The closed form describes such a plan, the simulation traces the text alone, and
both agree with the step run on real CPU tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.memory.closed_form import closed_form_describes  # noqa: E402
from advisor.memory.tensors import idle_layers  # noqa: E402
from advisor.memory.training import estimate_training, param_breakdown  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.vision import processor_batch, vision_settings  # noqa: E402
from advisor.runtime.simulate.vision_tiny import tiny_vl_spec  # noqa: E402

TINY = tiny_vl_spec("mllama")
LORA = Plan(method="lora", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), micro_batch=2, seq_len=64)


def test_cross_attention_layers_are_idle_without_an_image_only():
    assert idle_layers(TINY, LORA) == {1}
    assert idle_layers(TINY, LORA.with_(image_sizes=("40x28",))) == frozenset()
    assert idle_layers(resolve_model("qwen2.5-vl-7b-instruct"), LORA) == frozenset()


def test_the_closed_form_describes_text_only_mllama_and_hands_images_to_the_simulation():
    spec = resolve_model("llama-3.2-11b-vision")
    describes, why = closed_form_describes(spec, Plan(method="lora"))
    assert describes and "cross-attention" in why
    describes, why = closed_form_describes(spec, Plan(method="lora", image_sizes=("560x560",)))
    assert not describes and "cross-attention layers reading the image" in why


def test_idle_parameters_get_no_gradient_or_optimizer_state():
    spec = resolve_model("llama-3.2-11b-vision")
    lora = param_breakdown(spec, Plan(method="lora"))
    assert lora.trainable == lora.adapter * 32 // 40  # 8 of 40 layers skipped, every layer adapted alike
    full = param_breakdown(spec, Plan(method="full"))
    skipped = sum(layer.params for layer in spec.description.layers
                  if layer.index in spec.vision.cross_attention_layers)
    assert full.trainable == spec.params_total - skipped
    # DeepSpeed flattens every parameter that requires grad, stepped or not
    assert param_breakdown(spec, Plan(method="lora", offload="zero2_cpu")).trainable == lora.adapter


def test_a_text_only_batch_has_no_pixels():
    batch = processor_batch(TINY, LORA, vision_settings(LORA))
    assert set(batch) == {"input_ids", "labels"} and tuple(batch["input_ids"].shape) == (2, 64)
    assert int(batch["input_ids"].max()) < TINY.config["image_token_index"]


@pytest.mark.parametrize("plan", [LORA, Plan(method="full", gradient_checkpointing=True, micro_batch=2, seq_len=64)],
                         ids=["lora", "full-ckpt"])
def test_the_simulation_of_text_only_mllama_equals_the_real_step(plan):
    fake = trace_step(TINY, plan, fake=True)
    real = trace_step(TINY, plan, fake=False)
    assert abs(fake.peak_bytes - real.peak_bytes) <= 0.01 * real.peak_bytes
    # the skipped layer's parameters have no optimizer state: the states are those of the stepped ones (and a
    # 512-byte block per parameter for AdamW's step counter), not those of every layer
    pb = param_breakdown(TINY, plan)
    per_param = 8 if plan.peft else 4  # AdamW's two moments, fp32 adapters or bf16 weights
    every = pb.adapter if plan.peft else TINY.params_total
    skipped = every - pb.trainable
    assert skipped > 0
    assert abs(real.ledger["optimizer_states"] - pb.trainable * per_param) < skipped * per_param / 2


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("plan", [
    Plan(method="lora", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), optimizer="adamw_torch_fused",
         micro_batch=1, grad_accum=8, seq_len=1024),
    Plan(method="qlora", quantization="nf4", lora_targets="all-linear", gradient_checkpointing=True,
         optimizer="adamw_torch", micro_batch=2, grad_accum=4, seq_len=1024),
    Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch", micro_batch=1, seq_len=512),
], ids=["lora", "qlora-ckpt", "full-ckpt"])
def test_the_closed_form_is_within_3_percent_of_the_simulation_at_real_size(plan):
    from advisor.runtime.simulate.extrapolate import simulate

    spec = resolve_model("llama-3.2-11b-vision")
    sim = simulate(spec, plan).peak_bytes
    est = estimate_training(spec, plan).tensor_peak_bytes
    assert abs(est - sim) <= 0.03 * sim, (est, sim)
