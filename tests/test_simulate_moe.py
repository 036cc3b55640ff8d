"""The simulation of the new architectures (issue 24): mixtures of experts (stacked experts run by grouped_mm),
gpt-oss's sinks and sliding window, Gemma-3's sliding / full layers, Qwen3-Next's linear attention, DeepSeek-V2's
latent attention and dense first layer. The traced step under fake tensors equals the same step on real CPU
tensors; layers of several kinds extrapolate to the full trace; LoRA and 4-bit touch what peft and bitsandbytes
really touch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.memory.ledger import CATEGORIES  # noqa: E402
from advisor.runtime.simulate.extrapolate import kind_traces, simulate, trace_kinds  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402
from matrix import matrix_params  # noqa: E402  (tests/matrix.py)

DEPTH = {"qwen3_moe": 2, "gpt_oss": 2, "deepseek_v2": 2, "qwen3_next": 4, "gemma3_text": 6, "olmoe": 2, "mixtral": 2}
PLANS = {"full": dict(method="full"), "lora": dict(method="lora", lora_targets="all-linear"),
         "qlora": dict(method="qlora", quantization="nf4", lora_targets="all-linear")}


def _equal(spec, plan):
    fake = trace_step(spec, plan, fake=True)
    real = trace_step(spec, plan, fake=False)
    assert abs(fake.peak_bytes - real.peak_bytes) <= 0.01 * real.peak_bytes, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 0.01 * real.peak_bytes, cat
    return fake


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "deepseek_v2", "qwen3_next", "gemma3_text"])
def test_simulation_equals_real_execution(arch):
    """One plan per architecture (LoRA on all linears with checkpointing): fake == real, byte for byte here."""
    _equal(tiny_spec(arch, num_layers=DEPTH[arch]), Plan(seq_len=48, gradient_checkpointing=True, **PLANS["lora"]))


# by default each architecture once, covering every method, checkpointing and pair of them; the whole product with
# --full-matrix (tests/matrix.py)
EVERY_METHOD = [(a, m, c) for c in (False, True) for m in sorted(PLANS) for a in sorted(DEPTH)]


@pytest.mark.slow
@pytest.mark.parametrize("arch,method,ckpt", matrix_params(
    EVERY_METHOD, lambda c: [("arch", c[0]), ("method", c[1]), ("ckpt", c[2]), ("pair", c[1], c[2])],
    ids=lambda c: f"{'ckpt' if c[2] else 'no-ckpt'}-{c[1]}-{c[0]}"))
def test_simulation_equals_real_execution_every_method(arch, method, ckpt):
    _equal(tiny_spec(arch, num_layers=DEPTH[arch]), Plan(seq_len=48, gradient_checkpointing=ckpt, **PLANS[method]))


EXTRAPOLATED = [("gemma3_text", 12, Plan(seq_len=64, **PLANS["lora"])),
                ("gemma3_text", 12, Plan(seq_len=64, gradient_checkpointing=True, **PLANS["full"])),
                ("gemma3_text", 12, Plan(seq_len=64, method="qlora", quantization="nf4")),
                ("qwen3_next", 8, Plan(seq_len=64, **PLANS["lora"])),
                ("qwen3_next", 8, Plan(seq_len=64, method="lora")),  # q/k/v/o: its linear layers train nothing
                ("qwen3_next", 8, Plan(seq_len=64, gradient_checkpointing=True, **PLANS["qlora"])),
                ("deepseek_v2", 5, Plan(seq_len=64, **PLANS["lora"])),
                ("gpt_oss", 6, Plan(seq_len=64, gradient_checkpointing=True, **PLANS["lora"]))]


# by default each architecture, method and checkpointing once (tests/matrix.py)
@pytest.mark.slow
@pytest.mark.parametrize("arch,layers,plan", matrix_params(
    EXTRAPOLATED, lambda c: [("arch", c[0]), ("method", c[2].method), ("ckpt", c[2].gradient_checkpointing)],
    ids=lambda c: f"{c[0]}-{c[1]}-{c[2].short()}"))
def test_layers_of_several_kinds_extrapolate_to_the_full_trace(arch, layers, plan):
    spec = tiny_spec(arch, num_layers=layers)
    assert len(trace_kinds(spec, plan)) == 2
    full = simulate(spec, plan, layers="full")
    extra = simulate(spec, plan, layers="auto")
    assert extra.extrapolated and extra.layer_kinds == 2
    assert abs(extra.peak_bytes - full.peak_bytes) <= 0.005 * full.peak_bytes, (extra.peak_bytes, full.peak_bytes)
    assert extra.peak_phase == full.peak_phase


def test_a_window_longer_than_the_sequence_is_full_attention():
    spec = tiny_spec("gemma3_text", num_layers=12)  # a 16-token window, 5 sliding then 1 full
    assert len(trace_kinds(spec, Plan(seq_len=8))) == 1
    assert [len(k) for k in trace_kinds(spec, Plan(seq_len=16))] == [10, 2]


def test_the_first_trace_holds_the_layers_up_to_the_first_that_trains():
    """Layers before the first one that needs a gradient save nothing: they are traced as in the model; after it,
    one layer of each kind stands for the rest, wherever it is."""
    from advisor.runtime.simulate.extrapolate import first_trainable_layer

    spec = resolve_model("qwen3-next")
    lora = Plan(method="lora", seq_len=1024)  # q/k/v/o: only the full-attention layers (every 4th) are adapted
    assert first_trainable_layer(spec, lora) == 3
    assert kind_traces(spec, trace_kinds(spec, lora), lora)[0][0] == (0, 1, 2, 3, 0, 3, 47)
    for plan in (Plan(method="lora", lora_targets="all-linear", seq_len=1024), Plan(method="full", seq_len=1024),
                 Plan(method="lora", gradient_checkpointing=True, seq_len=1024)):
        assert first_trainable_layer(spec, plan) == 0
        assert kind_traces(spec, trace_kinds(spec, plan), plan)[0][0] == (0, 0, 3, 47)
    spec = resolve_model("gemma-3-12b")
    qlora = Plan(method="qlora", quantization="nf4", seq_len=1024)
    assert kind_traces(spec, trace_kinds(spec, qlora), qlora)[0] == [(0, 0, 5, 47), (0, 0, 0, 5, 47),
                                                                      (0, 5, 0, 0, 5, 47)]


def test_the_traces_keep_the_models_first_layers_and_end_on_its_last_kind():
    # Qwen3-Next: 3 linear then 1 full, 48 layers ending on a full one; LoRA on q/k/v/o adapts the full layers only,
    # so the three linear layers before the first full one save nothing, in the model as in the traces
    spec = resolve_model("qwen3-next")
    traces, added, at = kind_traces(spec, trace_kinds(spec, Plan(seq_len=1024)))
    assert traces == [(0, 1, 2, 3, 0, 3, 47), (0, 1, 2, 3, 0, 0, 3, 47), (0, 1, 2, 3, 3, 0, 0, 3, 47)]
    assert added == [0, 1] and at == 4
    # gpt-oss-20b: sliding / full alternate, 24 layers ending on a full one
    spec = resolve_model("gpt-oss-20b")
    traces, added, _ = kind_traces(spec, trace_kinds(spec, Plan(seq_len=1024)))
    assert traces[0] == (0, 1, 0, 1, 23) and len(traces) == 3
    # DeepSeek-V2-Lite: its one dense layer is in the first part; only routed layers are added
    spec = resolve_model("deepseek-v2-lite")
    traces, added, _ = kind_traces(spec, trace_kinds(spec, Plan(seq_len=1024)))
    assert traces == [(0, 1, 1, 26), (0, 1, 1, 1, 26)] and added == [1]


def test_lora_all_linear_on_a_mixture_of_experts_leaves_out_what_peft_moves():
    """peft rewrites gate_proj/up_proj/down_proj (and all-linear) on DeepSeek-V2 into LoRA on the experts, whose
    ParamWrapper refuses lora_dropout > 0: the run adapts the attention (and the linears peft leaves) and says so."""
    from advisor.runtime.build import build_training_setup, lora_targets

    spec = resolve_model("deepseek-v2-lite")
    targets, notes = lora_targets(spec, Plan(method="lora", lora_targets="all-linear"))
    assert targets == ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    assert any("left out gate_proj, up_proj, down_proj" in n for n in notes)
    targets, _ = lora_targets(resolve_model("qwen3-next"), Plan(method="lora", lora_targets="all-linear"))
    assert {"in_proj_qkvz", "out_proj", "q_proj", "shared_expert_gate"} <= set(targets)
    assert not {"gate_proj", "up_proj", "down_proj"} & set(targets)
    # the real peft, default dropout 0.05: builds and steps, no adapter wraps a stacked expert
    tiny = tiny_spec("deepseek_v2", num_layers=2)
    plan = Plan(method="lora", lora_targets="all-linear", seq_len=16)
    assert plan.lora_dropout > 0
    setup = build_training_setup(tiny, plan)
    assert not any(type(m).__name__ == "ParamWrapper" for m in setup.model.modules())
    setup.train_step([setup.make_batch()])
    assert any("mixture of experts" in n for n in setup.notes)


def test_4bit_converts_the_linears_and_leaves_experts_and_router_in_bf16():
    """transformers + bitsandbytes convert exactly ``type(module) is nn.Linear`` (not the output embedding): the
    stacked experts and the router stay bf16 (reports/moe_findings.md section 2), in the simulation as for real."""
    from advisor.runtime.build import build_training_setup

    for arch in ("qwen3_moe", "qwen3_next"):
        setup = build_training_setup(tiny_spec(arch, num_layers=DEPTH[arch]),
                                     Plan(method="qlora", quantization="nf4", seq_len=16), quant_impl="bnb")
        base = setup.model.get_base_model()
        experts = [p for n, p in base.named_parameters() if "experts." in n and p.dim() == 3]
        assert experts and all(p.dtype == torch.bfloat16 for p in experts)
        assert base.model.layers[0].mlp.gate.weight.dtype == torch.bfloat16
        quantized = {n.rsplit(".", 1)[-1] for n, m in base.named_modules() if type(m).__name__ == "Linear4bit"}
        assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= quantized and "lm_head" not in quantized


def test_an_attention_the_class_refuses_is_traced_with_its_default():
    spec = tiny_spec("gpt_oss", num_layers=2)
    t = trace_step(spec, Plan(method="lora", seq_len=32, attn_impl="sdpa"))
    assert any("does not accept attn_implementation='sdpa'" in n and "eager" in n for n in t.notes)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "deepseek_v2"])
def test_lora_on_the_experts_simulates_as_it_runs(arch):
    """Plan.lora_experts: peft target_parameters on both expert stacks (a ParamWrapper each, adapters r x experts);
    the traced step under fake tensors equals the real CPU step, checkpointed or not."""
    from advisor.runtime.build import build_training_setup

    spec = tiny_spec(arch, num_layers=DEPTH[arch])
    for ckpt in (False, True):
        _equal(spec, Plan(method="lora", lora_experts=True, lora_dropout=0.0, seq_len=48, gradient_checkpointing=ckpt))
    setup = build_training_setup(spec, Plan(method="lora", lora_experts=True, lora_dropout=0.0, seq_len=16))
    wrappers = [m for m in setup.model.modules() if type(m).__name__ == "ParamWrapper"]
    moe_layers = sum(1 for layer in spec.description.layers if layer.num_experts)
    assert len(wrappers) == 2 * moe_layers
    from advisor.memory.tensors import trainable_sizes

    trainable = sum(p.numel() for p in setup.model.parameters() if p.requires_grad)
    from advisor.core.adapters import adapted_modules

    assert trainable == sum(trainable_sizes(spec, setup.plan, adapted_modules(spec, setup.plan)))


def test_lora_on_the_experts_refuses_dropout_and_dense_models():
    from advisor.core.errors import AdvisorInputError
    from advisor.runtime.build import build_training_setup

    errs = Plan(method="lora", lora_experts=True).problems()
    assert errs and errs[0].where == "--lora-experts" and "--lora-dropout 0" in errs[0].rule
    with pytest.raises(AdvisorInputError, match="no stacked experts"):
        build_training_setup(tiny_spec("qwen3", num_layers=2), Plan(method="lora", lora_experts=True, lora_dropout=0.0))
