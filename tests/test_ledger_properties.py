"""Properties of the analytic ledger that any honest memory model has (hypothesis)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from advisor.core.adapters import attention_linears
from advisor.core.catalog import model_catalog, resolve_model
from advisor.memory.closed_form import closed_form_describes
from advisor.memory.training import estimate_training
from advisor.core.plan import FUSED_BACKWARD_OPTIMIZERS, LOW_RANK_OPTIMIZERS, OPTIMIZERS, Plan

MODELS = st.sampled_from([n for n in model_catalog() if closed_form_describes(resolve_model(n))[0]])
METHOD_QUANT = st.sampled_from([("full", "none"), ("lora", "none"), ("lora", "int8"), ("qlora", "nf4"),
                                ("qlora", "fp4")])


@st.composite
def plans(draw):
    method, quant = draw(METHOD_QUANT)
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    if optimizer in LOW_RANK_OPTIMIZERS:
        method, quant = "full", "none"  # GaLore / APOLLO project full-rank weight gradients
    in_backward = optimizer in FUSED_BACKWARD_OPTIMIZERS or (optimizer not in FUSED_BACKWARD_OPTIMIZERS
                                                            and draw(st.booleans()) and draw(st.booleans()))
    ckpt = draw(st.booleans())
    return Plan(
        optimizer_in_backward=in_backward and optimizer not in FUSED_BACKWARD_OPTIMIZERS,
        checkpoint_layers=draw(st.sampled_from([None, 1, 4, 9])) if ckpt else None,
        activation_offload=draw(st.booleans()), optim_rank=draw(st.sampled_from([8, 128])),
        method=method, quantization=quant, double_quant=quant in ("nf4", "fp4") and draw(st.booleans()),
        lora_r=draw(st.sampled_from([1, 4, 8, 16, 64, 256])),
        lora_targets=draw(st.sampled_from([("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"),
                                           "all-linear"])),
        gradient_checkpointing=ckpt, optimizer=optimizer,
        micro_batch=draw(st.integers(1, 8)), grad_accum=1 if in_backward else draw(st.integers(1, 4)),
        seq_len=draw(st.sampled_from([128, 512, 1024, 2048, 4096])),
        loss=draw(st.sampled_from(["plain", "chunked", "fused-linear"])),
    )


def _fix_targets(name, plan):
    spec = resolve_model(name)
    if plan.lora_targets != "all-linear" and not set(plan.lora_targets) <= set(attention_linears(spec)):
        return plan.with_(lora_targets=tuple(attention_linears(spec)))  # phi3's qkv_proj, DeepSeek's MLA
    return plan


def ledger(spec, plan):
    """The closed-form ledger, where it describes the plan (the others are answered by the simulation)."""
    assume(closed_form_describes(spec, plan)[0])
    return estimate_training(spec, plan)


def peak(name, plan):
    return ledger(resolve_model(name), _fix_targets(name, plan)).tensor_peak_bytes


@settings(max_examples=60, deadline=None)
@given(MODELS, plans(), st.integers(1, 8))
def test_memory_never_decreases_with_batch(name, plan, extra):
    assert peak(name, plan.with_(micro_batch=plan.micro_batch + extra)) >= peak(name, plan)


@settings(max_examples=60, deadline=None)
@given(MODELS, plans(), st.integers(1, 4096))
def test_memory_never_decreases_with_sequence(name, plan, extra):
    assert peak(name, plan.with_(seq_len=plan.seq_len + extra)) >= peak(name, plan)


@settings(max_examples=60, deadline=None)
@given(MODELS, plans(), st.integers(1, 128))
def test_memory_never_decreases_with_rank(name, plan, extra):
    # low-bit optimizers keep tensors under a size threshold in 32-bit (see the test below): a higher rank can
    # push a LoRA matrix over it and shrink its states
    assume(not any(bits in plan.optimizer for bits in ("8bit", "4bit")))
    assert peak(name, plan.with_(lora_r=plan.lora_r + extra)) >= peak(name, plan)


def test_a_lora_matrix_crossing_the_8bit_threshold_shrinks_its_states():
    """bitsandbytes keeps the states of tensors under min_8bit_size (4096 values) in 32-bit: on Qwen2.5-0.5B
    (hidden 896) lora_A is 4 x 896 = 3,584 values at rank 4 (fp32 states, 8 B a value) and 4,480 at rank 5
    (8-bit, 2 B a value plus block absmax), so rank 5 holds less optimizer state than rank 4."""
    plan = Plan(method="lora", lora_r=4, lora_targets=("q_proj", "v_proj"), optimizer="adamw_8bit", seq_len=128)
    states = lambda p: estimate_training(resolve_model("qwen0.5b"), p).device["optimizer_states"]  # noqa: E731
    assert states(plan.with_(lora_r=5)) < states(plan) < states(plan.with_(lora_r=64))


@settings(max_examples=40, deadline=None)
@given(MODELS)
def test_weights_qlora_below_lora_below_full(name):
    spec = resolve_model(name)

    def weights(plan):
        d = ledger(spec, _fix_targets(name, plan)).device
        return d["weights"] + d["quant_constants"]

    qlora = weights(Plan(method="qlora", quantization="nf4"))
    lora = weights(Plan(method="lora"))
    full = weights(Plan(method="full", precision="mixed_bf16"))
    assert qlora < lora <= full


@settings(max_examples=60, deadline=None)
@given(MODELS, plans())
def test_checkpointing_lowers_activations(name, plan):
    spec = resolve_model(name)
    plan = _fix_targets(name, plan).with_(activation_offload=False)
    off = ledger(spec, plan.with_(gradient_checkpointing=False, checkpoint_layers=None))
    on = ledger(spec, plan.with_(gradient_checkpointing=True))
    assert on.extra["saved_activations_bytes"] < off.extra["saved_activations_bytes"]
    # the peak itself can only grow by the one layer recomputed in backward (when gradients and
    # optimizer states, not activations, set the peak)
    assert on.tensor_peak_bytes <= off.tensor_peak_bytes + on.extra["activations_per_layer_bytes"]


@settings(max_examples=60, deadline=None)
@given(MODELS, plans(), st.integers(1, 8))
def test_checkpointing_more_layers_saves_fewer_activations(name, plan, more):
    """Memory is linear in k, the checkpointed layers: more of them keep fewer activations."""
    spec = resolve_model(name)
    plan = _fix_targets(name, plan).with_(gradient_checkpointing=True, activation_offload=False)
    k = min(plan.checkpoint_layers or 1, spec.num_layers - more)
    few = ledger(spec, plan.with_(checkpoint_layers=k)).extra["saved_activations_bytes"]
    many = ledger(spec, plan.with_(checkpoint_layers=k + more)).extra["saved_activations_bytes"]
    assert many < few


@settings(max_examples=60, deadline=None)
@given(MODELS, plans())
def test_activation_offload_moves_activations_to_the_host(name, plan):
    spec = resolve_model(name)
    plan = _fix_targets(name, plan)
    kept = ledger(spec, plan.with_(activation_offload=False))
    moved = ledger(spec, plan.with_(activation_offload=True))
    assert moved.host["activations"] > 0 == kept.host["activations"]
    assert moved.extra["saved_activations_bytes"] < kept.extra["saved_activations_bytes"]
