"""The simulate backend: the tracked step under fake tensors equals the same step on real tensors;
stand-ins equal real bitsandbytes; optimizer states have bitsandbytes' real sizes."""

from __future__ import annotations

import itertools
import json

import pytest

torch = pytest.importorskip("torch")

from advisor.memory.training import optimizer_state_bytes, param_breakdown  # noqa: E402
from advisor.runtime.backends import get_backend  # noqa: E402
from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.cli import main  # noqa: E402
from advisor.memory.ledger import CATEGORIES  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402

SPEC = tiny_spec("qwen2", num_layers=2)
METHODS = {"full": dict(method="full"), "lora": dict(method="lora", lora_targets="all-linear"),
           "qlora": dict(method="qlora", quantization="nf4", double_quant=True)}
SIM_VS_REAL = [Plan(seq_len=96, gradient_checkpointing=ckpt, optimizer=opt, **METHODS[m])
               for m, ckpt, opt in itertools.product(METHODS, (False, True), ("adamw_torch", "adamw_8bit", "adafactor"))]


def rel(a: int, b: int) -> float:
    return abs(a - b) / b


@pytest.mark.parametrize("plan", SIM_VS_REAL, ids=lambda p: p.short())
def test_simulation_equals_real_execution(plan):
    fake = trace_step(SPEC, plan, fake=True)
    real = trace_step(SPEC, plan, fake=False)
    assert rel(fake.peak_bytes, real.peak_bytes) < 0.01, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 0.01 * real.peak_bytes, cat


@pytest.mark.parametrize("plan,target", [
    (Plan(method="qlora", quantization="nf4", seq_len=96), "cuda"),
    (Plan(method="qlora", quantization="fp4", double_quant=True, seq_len=96, gradient_checkpointing=True), "cuda"),
    (Plan(method="lora", quantization="int8", seq_len=96), "cpu"),
], ids=lambda x: x.short() if isinstance(x, Plan) else x)
def test_standins_equal_real_bitsandbytes(plan, target):
    standin = trace_step(SPEC, plan, fake=False, quant_impl="standin", target_device=target)
    real = trace_step(SPEC, plan, fake=False, quant_impl="bnb", target_device=target)
    assert rel(standin.peak_bytes, real.peak_bytes) < 0.01
    for cat in ("weights", "quant_constants"):
        assert standin.ledger[cat] == real.ledger[cat] > 0


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adamw_torch", "adafactor"])
def test_optimizer_state_sizes_are_bitsandbytes_real_ones(optimizer):
    """The state bitsandbytes (real, on the CPU) allocates equals the analytic formula."""
    from advisor.runtime.build import build_training_setup

    spec = tiny_spec("llama", num_layers=2, hidden_size=128, intermediate_size=256)
    plan = Plan(method="lora", lora_r=64, lora_targets="all-linear", seq_len=32, optimizer=optimizer)
    setup = build_training_setup(spec, plan)
    setup.train_step([setup.make_batch()])
    got = sum(v.untyped_storage().nbytes() for s in setup.optimizer.state.values() for k, v in s.items()
              if torch.is_tensor(v) and k not in ("qmap1", "qmap2", "step") and v.numel() > 1)
    want = optimizer_state_bytes(spec, plan, param_breakdown(spec, plan))
    assert rel(got, want) < 0.01, (got, want)


def test_backend_report_has_every_field():
    spec = resolve_model("qwen0.5b")
    report = get_backend("simulate")(spec, Plan(method="lora", seq_len=256, gradient_checkpointing=True))
    assert report.source == "simulated" and report.backend == "simulate"
    assert set(report.device) == set(CATEGORIES)
    assert report.tensor_peak_bytes == sum(v for k, v in report.device.items() if k != "overhead")
    assert report.peak_bytes == report.tensor_peak_bytes + report.device["overhead"] > report.tensor_peak_bytes
    # every bf16 weight (each tensor rounded to 512 B as CUDA's allocator does) and the rotary buffer
    assert 0 <= report.device["weights"] - spec.params_total * 2 < 2**16
    assert report.extra["extrapolated"] and report.extra["simulation_seconds"] > 0


def test_offload_moves_optimizer_to_host():
    spec = resolve_model("qwen0.5b")
    plain = get_backend("simulate")(spec, Plan(method="full", seq_len=128))
    off = get_backend("simulate")(spec, Plan(method="full", seq_len=128, offload="zero2_cpu"))
    assert off.device["optimizer_states"] == 0 and off.host["optimizer_states"] == spec.params_total * 8
    assert off.tensor_peak_bytes < plain.tensor_peak_bytes


def test_cli_simulate_json_has_the_estimate_fields(capsys):
    args = ["estimate", "--model", "qwen0.5b", "--method", "lora", "--seq-len", "128", "--json"]
    assert main(args) == 0
    est = json.loads(capsys.readouterr().out)
    assert main(args + ["--backend", "simulate"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert set(sim) == set(est) and sim["source"] == "simulated" and est["source"] == "estimated"
    assert set(sim["ledger"]) == set(est["ledger"])


# --------------------------------------------------------------------------- issue 15: optimizers, checkpointing, offload

LEVERS = [
    Plan(method="full", seq_len=64, optimizer="adamw_torch_fused"),
    Plan(method="full", seq_len=64, optimizer="adamw_torch_8bit"),
    Plan(method="full", seq_len=64, optimizer="adamw_torch_4bit"),
    Plan(method="full", seq_len=64, optimizer="galore_adamw", optim_rank=16),
    Plan(method="full", seq_len=64, optimizer="galore_adamw_8bit", optim_rank=16),
    Plan(method="full", seq_len=64, optimizer="galore_adamw_layerwise", optim_rank=16),
    Plan(method="full", seq_len=64, optimizer="apollo_adamw", optim_rank=16),
    Plan(method="full", seq_len=64, optimizer="lomo", gradient_checkpointing=True),
    Plan(method="full", seq_len=64, optimizer="adalomo"),
    Plan(method="full", seq_len=64, optimizer="adamw_torch_fused", optimizer_in_backward=True),
    Plan(method="lora", seq_len=64, optimizer="paged_adamw_8bit", optimizer_in_backward=True),
    Plan(method="lora", seq_len=64, gradient_checkpointing=True, checkpoint_layers=1),
    Plan(method="full", seq_len=64, gradient_checkpointing=True, activation_offload=True),
    Plan(method="lora", seq_len=64, gradient_checkpointing=True, checkpoint_layers=1, activation_offload=True),
    Plan(method="qlora", quantization="nf4", seq_len=64, activation_offload=True),
]


@pytest.mark.parametrize("plan", LEVERS, ids=lambda p: p.short())
def test_levers_simulate_exactly_as_they_run(plan):
    """The real libraries (torch fused AdamW, torchao, galore-torch, apollo-torch, lomo-optim, transformers'
    checkpoint offload) traced under fake tensors equal the same step on real CPU tensors, byte for byte
    in every phase and category, host memory included."""
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    fake = trace_step(spec, plan, fake=True)
    real = trace_step(spec, plan, fake=False)
    assert set(fake.phases) == set(real.phases)
    for name, ph in real.phases.items():
        assert fake.phases[name].ledger == ph.ledger, name
        assert fake.phases[name].host_bytes == ph.host_bytes, name


def test_fused_adamw_holds_no_full_size_temporary():
    """transformers 5's default optimizer updates in place; foreach AdamW's _foreach_sqrt holds one
    full-size temporary (the issue's 70.9 vs 56.7 GiB on Qwen2.5-7B)."""
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    fused = trace_step(spec, Plan(method="full", seq_len=32, optimizer="adamw_torch_fused"), fake=True)
    foreach = trace_step(spec, Plan(method="full", seq_len=32, optimizer="adamw_torch"), fake=True)
    params = fused.phases["optimizer"].ledger["weights"]
    assert fused.phases["optimizer"].ledger["transient"] < 0.05 * params
    assert foreach.phases["optimizer"].ledger["transient"] > 0.9 * params


def test_updates_inside_backward_leave_no_gradient_buffer():
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    after = trace_step(spec, Plan(method="full", seq_len=32, optimizer="adamw_torch_fused"), fake=True)
    inside = trace_step(spec, Plan(method="full", seq_len=32, optimizer="adamw_torch_fused",
                                   optimizer_in_backward=True), fake=True)
    assert after.phases["optimizer"].ledger["gradients"] > 0
    assert inside.phases["optimizer"].ledger["gradients"] == 0


def test_activation_offload_moves_the_checkpointed_inputs_to_the_host():
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    plan = Plan(method="lora", seq_len=64, gradient_checkpointing=True)
    kept = trace_step(spec, plan, fake=True)
    moved = trace_step(spec, plan.with_(activation_offload=True), fake=True)
    assert kept.phases["forward"].host_bytes == 0
    # the two layer inputs, 64 x 128 bf16 (the rotary tables reach the layer as keyword arguments, which
    # transformers binds into the recomputed function rather than saving)
    assert moved.phases["forward"].host_bytes == 2 * 64 * 128 * 2
    assert moved.phases["forward"].ledger["activations"] < kept.phases["forward"].ledger["activations"]


@pytest.mark.parametrize("optimizer", ["adamw_torch_fused", "adamw_torch_8bit", "adamw_torch_4bit", "galore_adamw",
                                       "galore_adamw_8bit", "apollo_adamw", "adalomo", "lomo"])
def test_optimizer_state_sizes_are_the_libraries_real_ones(optimizer):
    """The state each library allocates (real, on the CPU) equals the ledger's formula within 2%."""
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=256, intermediate_size=512)
    plan = Plan(method="full", seq_len=32, optimizer=optimizer, optim_rank=16)
    t = trace_step(spec, plan, fake=False)
    got = t.phases["forward"].ledger["optimizer_states"]
    want = optimizer_state_bytes(spec, plan, param_breakdown(spec, plan))
    assert abs(got - want) <= 0.02 * max(want, 1) + 16384, (got, want)
