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
