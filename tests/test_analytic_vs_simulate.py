"""The analytic ledger held to the simulation at real sizes: every plan within 5% (aim 2%).

The matrix (tests/plan_matrix.py): 42 plans on 8 models of 4 architectures (qwen2, llama,
qwen3, mistral; 0.5B to 14B): full / LoRA / QLoRA / LLM.int8, checkpointing on and off, five
optimizers, batches 1-4, gradient accumulation, sequences 512-4096, eager attention, chunked loss.
A failure prints every plan's error, so the formula to fix is visible at once.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from advisor.memory.training import estimate_training  # noqa: E402
from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.runtime.simulate.extrapolate import simulate  # noqa: E402
from advisor.core.knobs import knob_of  # noqa: E402
from plan_matrix import analytic_matrix  # noqa: E402  (tests/plan_matrix.py)
from matrix import matrix_params  # noqa: E402  (tests/matrix.py)

TOLERANCE = 0.05


def error(model: str, plan: Plan) -> tuple[float, int, int]:
    spec = resolve_model(model)
    sim = simulate(spec, plan).peak_bytes
    est = estimate_training(spec, plan).tensor_peak_bytes
    return (est - sim) / sim, est, sim


QUICK = [
    ("qwen2.5-7b-instruct", Plan(method="lora", gradient_checkpointing=True, seq_len=1024)),
    ("qwen2.5-0.5b-instruct", Plan(method="full", seq_len=512)),
    ("llama-3.2-1b-instruct", Plan(method="qlora", quantization="nf4", seq_len=512, optimizer="paged_adamw_8bit")),
]


@pytest.mark.parametrize("model,plan", QUICK, ids=lambda x: x if isinstance(x, str) else x.short())
def test_analytic_close_to_simulation_quick(model, plan):
    err, est, sim = error(model, plan)
    assert abs(err) < TOLERANCE, f"analytic {est:,} vs simulated {sim:,} ({err:+.2%})"


MATRIX = analytic_matrix()


def _features(row):
    """What a row of the matrix varies: the model's family, and the plan's method, quantization, optimizer,
    checkpointing, precision, loss and attention."""
    model, plan = row
    return [("family", resolve_model(model).model_type), ("method", plan.method), ("quant", plan.quantization),
            ("optimizer", plan.optimizer), ("ckpt", plan.gradient_checkpointing), ("precision", plan.precision),
            ("loss", plan.loss), ("attn", plan.attn_impl)]


def test_the_matrix_spans_sizes_and_architectures():
    assert len(MATRIX) >= 40 and len({resolve_model(m).model_type for m, _ in MATRIX}) >= 4


# each row its own case: a row that covers a family or a lever value no other default row does runs by default, the
# rest with --full-matrix (tests/matrix.py; about 1 s each alone, three times that under CI's coverage)
@pytest.mark.slow
@pytest.mark.parametrize("model,plan", matrix_params(MATRIX, _features, ids=lambda r: f"{r[0]}-{r[1].short()}"))
def test_analytic_within_5_percent_on_the_matrix(model, plan):
    err, est, sim = error(model, plan)
    assert abs(err) < TOLERANCE, (f"{model} {plan.short()}: simulated {sim / 2**30:.3f} GiB, "
                                  f"estimated {est / 2**30:.3f} GiB ({err:+.2%})")


# the loss, DoRA and packing levers at real size: the analytic ledger within 3% of the simulation
LOSS_LEVERS = [
    ("qwen2.5-7b-instruct", Plan(method="lora", loss="fused-linear", seq_len=1024)),
    ("qwen2.5-7b-instruct", Plan(method="lora", loss="fused-linear", gradient_checkpointing=True, seq_len=8192)),
    ("qwen2.5-7b-instruct", Plan(method="full", loss="fused-linear", gradient_checkpointing=True, seq_len=512)),
    ("qwen2.5-7b-instruct", Plan(method="lora", dora=True, seq_len=1024)),
    ("qwen2.5-7b-instruct", Plan(method="lora", dora=True, lora_targets="all-linear", gradient_checkpointing=True)),
    ("qwen2.5-7b-instruct", Plan(method="lora", dora=True, lora_targets="all-linear", micro_batch=2, seq_len=512)),
    ("qwen2.5-7b-instruct", Plan(method="lora", packing=True, gradient_checkpointing=True, seq_len=4096)),
    ("qwen2.5-7b-instruct", Plan(method="lora", packing=True, loss="fused-linear", micro_batch=2, seq_len=2048,
                                 gradient_checkpointing=True, lora_targets="all-linear")),
    # packed 2K documents at 16K (--doc-len): sdpa's bool mask held through the recompute, flash varlen without one
    *[("llama-3.1-8b-instruct", Plan(method="qlora", quantization="nf4", packing=True, doc_len=2048, seq_len=16384,
                                     gradient_checkpointing=True, loss="fused-linear", attn_impl=a))
      for a in ("sdpa", "flash_attention_2")],
]


@pytest.mark.slow
@pytest.mark.parametrize("model,plan", LOSS_LEVERS, ids=lambda x: x if isinstance(x, str) else x.short())
def test_analytic_within_3_percent_on_the_levers(model, plan):
    err, est, sim = error(model, plan)
    assert abs(err) < 0.03, f"analytic {est:,} vs simulated {sim:,} ({err:+.2%})"


# the levers at real size (Qwen2.5-7B, seq 1024): the ledger within 3% of the simulation; every optimizer the Plan
# declares (full fine-tuning with checkpointing: the states are a third of the peak), so a new one without a memory
# term fails here
OPTIMIZERS = knob_of(Plan, "optimizer").choices
LEVERS = [Plan(method="full", gradient_checkpointing=True, optimizer=o) for o in OPTIMIZERS] + [
    Plan(method="full", gradient_checkpointing=True, optimizer="paged_adamw_8bit", optimizer_in_backward=True),
    Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=14),
    Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=5, micro_batch=2),
    Plan(method="lora", gradient_checkpointing=True, activation_offload=True),
    Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=10, activation_offload=True),
    Plan(method="lora", activation_offload=True),
    Plan(method="qlora", quantization="nf4", activation_offload=True, micro_batch=2),
    Plan(method="lora", tiled_mlp=True, seq_len=8192, loss="fused-linear"),  # DeepSpeed's TiledMLP: 3 shards
    Plan(method="qlora", quantization="nf4", lora_r=8, activation_offload=True, micro_batch=2, grad_accum=4,
         loss="chunked", optimizer="adamw_torch_4bit"),  # the 24 GB tune's answer (the chunked loss calls the decoder)
    # LLM.int8 keeps each linear's input on its autograd context, out of reach of checkpointing and of the
    # offload's saved-tensor hooks (training.int8_held_inputs): a T4 answer was off by half without it
    Plan(method="lora", quantization="int8", gradient_checkpointing=True, micro_batch=2),
    Plan(method="lora", quantization="int8", gradient_checkpointing=True, activation_offload=True, micro_batch=2),
    Plan(method="lora", quantization="int8", activation_offload=True, micro_batch=2, loss="fused-linear"),
]


# torchao's optimizers make these simulations take seconds
@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p.optimizer in (
    "adamw_torch_8bit", "adamw_torch_4bit") else p for p in LEVERS], ids=lambda p: p.short())
def test_levers_analytic_within_3_percent(plan):
    err, est, sim = error("qwen2.5-7b-instruct", plan)
    assert abs(err) < 0.03, f"{plan.short()}: estimated {est / 2**30:.2f} GiB, simulated {sim / 2**30:.2f} GiB"


def test_every_declared_optimizer_has_a_state_term():
    """The one table memory reads (training.OPTIMIZER_STATES) holds every optimizer the Plan declares, and an
    optimizer it does not hold is refused with a one-line error, never given zero state."""
    from advisor.core.errors import AdvisorInputError
    from advisor.memory.training import OPTIMIZER_STATES, optimizer_states_of

    assert set(OPTIMIZERS) == set(OPTIMIZER_STATES)
    with pytest.raises(AdvisorInputError, match="--optimizer: the memory ledger has no optimizer-state term"):
        optimizer_states_of("adamw_hypothetical")
    spec = resolve_model("qwen2.5-0.5b-instruct")
    states = {o: estimate_training(spec, Plan(method="full", optimizer=o)).device["optimizer_states"]
              for o in OPTIMIZERS}
    assert {o for o, b in states.items() if b == 0} == {"sgd", "lomo"}  # the two that keep none


def test_the_issues_fused_and_foreach_peaks():
    """Qwen2.5-7B full bf16, checkpointing, seq 1024, micro-batch 1: a trace of the real step peaks at 56.7 GiB
    with fused AdamW and 70.9 GiB with foreach."""
    spec = resolve_model("qwen7b")
    fused = simulate(spec, Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch_fused"))
    foreach = simulate(spec, Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch"))
    assert round(fused.peak_bytes / 2**30, 1) == 56.7 and round(foreach.peak_bytes / 2**30, 1) == 70.9


# the closed form of a mixture of experts (advisor.memory.experts) within 3% of the simulation at real size:
# LoRA on the attention, LoRA on the experts too (peft target_parameters), QLoRA, full fine-tuning, each with and
# without checkpointing (reports/moe_closed_form.md has the table, benchmarks/moe_closed_form.py makes it)
MOE_MODELS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b", "mixtral-8x7b", "olmoe-1b-7b",
              "deepseek-v2-lite")
MOE_PLANS = {
    "lora": Plan(method="lora"),
    "lora-ckpt": Plan(method="lora", gradient_checkpointing=True),
    "experts": Plan(method="lora", lora_experts=True, lora_dropout=0.0),
    "experts-ckpt": Plan(method="lora", lora_experts=True, lora_dropout=0.0, gradient_checkpointing=True),
    "qlora": Plan(method="qlora", quantization="nf4"),
    "qlora-ckpt": Plan(method="qlora", quantization="nf4", gradient_checkpointing=True),
    "full": Plan(method="full", optimizer="adamw_torch_fused", loss="chunked", micro_batch=2, seq_len=2048),
    "full-ckpt": Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch_fused"),
}
MOE_QUICK = [("olmoe-1b-7b", Plan(method="lora", lora_experts=True, lora_dropout=0.0, gradient_checkpointing=True,
                                  seq_len=512)),
             ("deepseek-v2-lite", Plan(method="qlora", quantization="nf4", seq_len=512))]


@pytest.mark.parametrize("model,plan", MOE_QUICK, ids=lambda x: x if isinstance(x, str) else x.short())
def test_moe_closed_form_close_to_simulation_quick(model, plan):
    from advisor.memory.closed_form import closed_form_describes

    assert closed_form_describes(resolve_model(model), plan)[0]
    err, est, sim = error(model, plan)
    assert abs(err) < 0.03, f"analytic {est:,} vs simulated {sim:,} ({err:+.2%})"


# every model and every plan by default (each model with one plan, each plan on one model), the whole product with
# --full-matrix (tests/matrix.py)
MOE_MATRIX = [(m, name) for name in sorted(MOE_PLANS) for m in MOE_MODELS]


@pytest.mark.slow
@pytest.mark.parametrize("model,name", matrix_params(MOE_MATRIX, lambda c: [("model", c[0]), ("plan", c[1])],
                                                     ids=lambda c: f"{c[1]}-{c[0]}"))
def test_moe_closed_form_within_3_percent_at_real_size(model, name):
    err, est, sim = error(model, MOE_PLANS[name])
    assert abs(err) < 0.03, f"{model} {name}: estimated {est / 2**30:.2f} GiB, simulated {sim / 2**30:.2f} GiB"


# the levers on a mixture of experts: the same ledger as a dense model's, with the expert terms (OLMoE-1B-7B at real
# size, 4,096 tokens so that the activations are a third of the peak; each simulation takes a few seconds)
MOE_LEVERS = {
    "fused-linear": Plan(method="lora", loss="fused-linear"),
    "fused-linear-full": Plan(method="full", loss="fused-linear", gradient_checkpointing=True,
                              optimizer="adamw_torch_fused"),
    "int8": Plan(method="lora", quantization="int8"),
    "int8-ckpt": Plan(method="lora", quantization="int8", gradient_checkpointing=True),
    "zero2-offload": Plan(method="lora", offload="zero2_cpu"),
    "activation-offload": Plan(method="lora", activation_offload=True),
    "activation-offload-ckpt": Plan(method="lora", activation_offload=True, gradient_checkpointing=True),
    "partial-ckpt": Plan(method="lora", gradient_checkpointing=True, checkpoint_layers=8),
    "in-backward": Plan(method="lora", optimizer="adamw_torch_fused", optimizer_in_backward=True),
    "packing": Plan(method="lora", packing=True, gradient_checkpointing=True),
    "packing-no-ckpt": Plan(method="lora", packing=True, seq_len=2048),
    "dora": Plan(method="lora", dora=True, seq_len=1024),
    "dora-ckpt": Plan(method="lora", dora=True, gradient_checkpointing=True),
    "galore": Plan(method="full", optimizer="galore_adamw", gradient_checkpointing=True),
    "lomo-full": Plan(method="full", optimizer="lomo", gradient_checkpointing=True),
    "adafactor-full": Plan(method="full", optimizer="adafactor", gradient_checkpointing=True),
    "bnb8-full": Plan(method="full", optimizer="adamw_8bit", gradient_checkpointing=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MOE_LEVERS))
def test_moe_levers_within_3_percent(name):
    from advisor.memory.closed_form import closed_form_describes

    plan = MOE_LEVERS[name]
    plan = plan if plan.seq_len != Plan().seq_len else plan.with_(seq_len=4096)
    assert closed_form_describes(resolve_model("olmoe-1b-7b"), plan)[0]
    err, est, sim = error("olmoe-1b-7b", plan)
    assert abs(err) < 0.03, f"{name}: estimated {est / 2**30:.2f} GiB, simulated {sim / 2**30:.2f} GiB ({err:+.2%})"


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_moe_every_declared_optimizer_within_3_percent(optimizer):
    """Every optimizer the Plan declares on a mixture of experts: LoRA on the attention, or a full fine-tune where
    the optimizer projects full-rank gradients (GaLore, APOLLO); AdaLomo cannot step a 3-D expert stack."""
    from advisor.core.plan import LOW_RANK_OPTIMIZERS

    method = "full" if optimizer in LOW_RANK_OPTIMIZERS else "lora"
    plan = Plan(method=method, optimizer=optimizer, gradient_checkpointing=method == "full", seq_len=2048)
    err, est, sim = error("olmoe-1b-7b", plan)
    assert abs(err) < 0.03, f"{optimizer}: estimated {est / 2**30:.2f} GiB, simulated {sim / 2**30:.2f} GiB"
