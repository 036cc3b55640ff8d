"""The simulate backend: the tracked step under fake tensors equals the same step on real tensors;
stand-ins equal real bitsandbytes; optimizer states have bitsandbytes' real sizes."""

from __future__ import annotations

import functools
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
               for m, ckpt, opt in itertools.product(METHODS, (False, True),
                                                     ("adamw_torch", "adamw_8bit", "adafactor"))]


# the levers of issue 15 that run on the CPU: the fused linear loss (its stand-in, the same code on fake and
# real tensors), the chunked loss, DoRA traced from peft, packed documents (the block-diagonal mask)
LOSS_LEVERS = [Plan(seq_len=96, loss="fused-linear", **METHODS["full"]),
          Plan(seq_len=96, loss="fused-linear", gradient_checkpointing=True, **METHODS["lora"]),
          Plan(seq_len=96, loss="chunked", **METHODS["lora"]),
          Plan(seq_len=96, dora=True, **METHODS["lora"]),
          Plan(seq_len=96, dora=True, gradient_checkpointing=True, **METHODS["lora"]),
          Plan(seq_len=96, dora=True, lora_dropout=0.0, method="lora"),
          Plan(seq_len=96, packing=True, micro_batch=2, **METHODS["lora"]),
          Plan(seq_len=96, packing=True, attn_impl="eager", **METHODS["lora"]),
          # --doc-len: four documents of 24; 40 + 40 + 16 (the last cut); one document (no packed row, no mask)
          Plan(seq_len=96, packing=True, doc_len=24, **METHODS["lora"]),
          Plan(seq_len=96, packing=True, doc_len=40, attn_impl="eager", **METHODS["lora"]),
          Plan(seq_len=96, packing=True, doc_len=96, **METHODS["lora"]),
          Plan(seq_len=96, packing=True, loss="fused-linear", gradient_checkpointing=True, **METHODS["full"])]


def rel(a: int, b: int) -> float:
    return abs(a - b) / b


# the fast loop keeps each method with and without checkpointing (AdamW); the other optimizers are slow
@pytest.mark.parametrize("plan", [p if p.optimizer == "adamw_torch" else pytest.param(p, marks=pytest.mark.slow)
                                  for p in SIM_VS_REAL], ids=lambda p: p.short())
def test_simulation_equals_real_execution(plan):
    fake = trace_step(SPEC, plan, fake=True)
    real = trace_step(SPEC, plan, fake=False)
    assert rel(fake.peak_bytes, real.peak_bytes) < 0.01, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 0.01 * real.peak_bytes, cat


@pytest.mark.parametrize("plan,target", [
    (Plan(method="qlora", quantization="nf4", seq_len=96), "cuda"),
    pytest.param(Plan(method="qlora", quantization="fp4", double_quant=True, seq_len=96, gradient_checkpointing=True),
                 "cuda", marks=pytest.mark.slow),
    (Plan(method="lora", quantization="int8", seq_len=96), "cpu"),
], ids=lambda x: x.short() if isinstance(x, Plan) else x)
def test_standins_equal_real_bitsandbytes(plan, target):
    standin = trace_step(SPEC, plan, fake=False, quant_impl="standin", target_device=target)
    real = trace_step(SPEC, plan, fake=False, quant_impl="bnb", target_device=target)
    assert rel(standin.peak_bytes, real.peak_bytes) < 0.01
    for cat in ("weights", "quant_constants"):
        assert standin.ledger[cat] == real.ledger[cat] > 0


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adamw_torch",
                                       "adafactor"])
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


# slow: DoRA and packing again, with checkpointing or two sequences (each is in the fast loop once)
@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if (p.dora or p.packing) and (
    p.gradient_checkpointing or p.micro_batch > 1) else p for p in LOSS_LEVERS], ids=lambda p: p.short())
def test_lever_simulation_equals_real_execution(plan):
    fake = trace_step(SPEC, plan, fake=True)
    real = trace_step(SPEC, plan, fake=False)
    # fake tensors lift a few Python scalars into 512-byte constants that real tensors never allocate
    assert abs(fake.peak_bytes - real.peak_bytes) <= 4 * 512, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 4 * 512, cat


def test_dora_magnitudes_are_trained_adapter_weights():
    """peft's DoRA adds one fp32 magnitude per output feature of each adapted module: the ledger's count."""
    from advisor.memory.training import param_breakdown
    from advisor.runtime.build import build_training_setup

    plan = Plan(seq_len=32, dora=True, **METHODS["lora"])
    setup = build_training_setup(SPEC, plan)
    trained = sum(p.numel() for p in setup.model.parameters() if p.requires_grad)
    assert trained == param_breakdown(SPEC, plan).trainable
    assert any("lora_magnitude_vector" in n for n, _ in setup.model.named_parameters())


def test_fused_linear_standin_loss_equals_the_models_own_loss():
    """The stand-in computes the same mean next-token loss (fp32 here) and the same input gradient."""
    from advisor.runtime.simulate.fused_loss import fused_linear_causal_lm_loss

    spec = tiny_spec("qwen2", num_layers=1)
    from advisor.runtime.build import build_training_setup

    setup = build_training_setup(spec, Plan(method="full", precision="fp32", seq_len=40))
    ids, labels = setup.make_batch(0)
    model = setup.model
    want = model(input_ids=ids, labels=labels).loss
    want.backward()
    g_want = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    got = fused_linear_causal_lm_loss(model, ids, labels)
    got.backward()
    assert torch.allclose(got, want, rtol=1e-5), (float(got), float(want))
    assert torch.allclose(model.model.embed_tokens.weight.grad, g_want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tokens", [64 * 9, 64 * 9 + 20])
def test_fused_linear_loop_run_in_part_under_fake_tensors_equals_the_whole_loop(tokens, monkeypatch):
    """Under fake tensors the stand-in runs its first two chunks and its last (the rest repeat the second): the
    live peak and the caching allocator's replay (allocated and reserved) equal those of every chunk run."""
    from torch._subclasses import FakeTensorMode

    import advisor.runtime.simulate.fused_loss as fl
    from advisor.memory.allocator import replay
    from advisor.runtime.simulate.tracker import LiveBytes

    def run():
        tracker = LiveBytes()
        with FakeTensorMode(), tracker:
            h = torch.randn(tokens, 64, dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(4096, 64, dtype=torch.bfloat16, requires_grad=True)
            y = torch.randint(0, 4096, (tokens,))
            fl.fused_linear_cross_entropy(h, w, y).backward()
        r = replay(tracker.allocator_events())
        return tracker.peak.bytes, r.allocated_peak_bytes, r.reserved_peak_bytes, len(tracker.records)

    assert tokens // fl.liger_chunk_tokens(tokens, 64, 4096) > 3
    part = run()
    monkeypatch.setattr(fl, "_chunk_starts", lambda _input, n, chunk: list(range(0, n, chunk)))
    whole = run()
    assert part[:3] == whole[:3] and part[3] < whole[3]


def test_liger_chunk_rule():
    """liger fused_linear_cross_entropy_forward: next_power_of_2(cdiv(BT, cdiv(V, H))), at most BT."""
    from advisor.memory.loss_dora_packing import liger_chunk_tokens  # the ledger's and the stand-in's one rule

    # liger's own example in its source comment: BT = 4096 * 4, V = 32000, H = 4096 -> chunk 2048
    assert liger_chunk_tokens(4096 * 4, 4096, 32000) == 2048
    assert liger_chunk_tokens(1024, 3584, 152064) == 32  # Qwen2.5-7B at seq 1024: inc 43 -> cdiv 24 -> 32
    assert liger_chunk_tokens(8, 4096, 1000) == 8


# ------------------------------------------------------------------------ issue 15: optimizers, checkpointing, offload

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
    # DeepSpeed's TiledMLP: ceil(320 / 128) = 3 shards, the last one shorter
    Plan(method="lora", lora_targets="all-linear", seq_len=320, gradient_checkpointing=True, tiled_mlp=True),
]


@functools.cache
def _first_fake_trace_of_the_process(spec) -> None:
    """The first fake trace of a process counts 2 KiB of forward transient once (a lazily built fake constant, not
    the model's): byte equality is held from the second trace on, as every simulation but a process's first runs."""
    trace_step(spec, LEVERS[0], fake=True)


# torchao and GaLore steps on real tensors take seconds each
@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p.optimizer.startswith((
    "adamw_torch_8bit", "adamw_torch_4bit", "galore")) else p for p in LEVERS], ids=lambda p: p.short())
def test_levers_simulate_exactly_as_they_run(plan):
    """The real libraries (torch fused AdamW, torchao, galore-torch, apollo-torch, lomo-optim, transformers'
    checkpoint offload) traced under fake tensors equal the same step on real CPU tensors, byte for byte
    in every phase and category, host memory included."""
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    _first_fake_trace_of_the_process(spec)
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


@pytest.mark.parametrize("optimizer", ["adamw_torch_fused", *(pytest.param(o, marks=pytest.mark.slow) for o in (
    "adamw_torch_8bit", "adamw_torch_4bit", "galore_adamw", "galore_adamw_8bit")), "apollo_adamw", "adalomo", "lomo"])
def test_optimizer_state_sizes_are_the_libraries_real_ones(optimizer):
    """The state each library allocates (real, on the CPU) equals the ledger's formula within 2%."""
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=256, intermediate_size=512)
    plan = Plan(method="full", seq_len=32, optimizer=optimizer, optim_rank=16)
    t = trace_step(spec, plan, fake=False)
    got = t.phases["forward"].ledger["optimizer_states"]
    want = optimizer_state_bytes(spec, plan, param_breakdown(spec, plan))
    assert abs(got - want) <= 0.02 * max(want, 1) + 16384, (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("plan", [Plan(method="lora", micro_batch=2, grad_accum=6, seq_len=64),
                                  Plan(method="full", gradient_checkpointing=True, optimizer="adamw_torch_fused",
                                       micro_batch=1, grad_accum=5, seq_len=64)], ids=lambda p: p.short())
def test_two_traced_micro_steps_give_the_whole_accumulation(plan):
    """A traced step runs two of its grad_accum micro-batches (runner.TRACED_MICRO_STEPS): the later ones
    repeat the second allocation for allocation. The step, its ledger and its allocator replay equal the
    whole accumulation's, but for what each extra micro-batch leaves alive in the trace loop: its input ids
    and labels (made up front; a real data loader makes one batch at a time) and its loss scalars."""
    from advisor.memory.allocator import replay

    whole = trace_step(SPEC, plan, micro_steps=None)
    two = trace_step(SPEC, plan)
    per_batch = 2 * plan.micro_batch * plan.seq_len * 8 + 1024  # int64 ids and labels, loss scalars (512 B blocks)
    losses = (plan.grad_accum - 2) * per_batch
    assert 0 <= whole.peak_bytes - two.peak_bytes <= losses and whole.peak_phase == two.peak_phase
    for c in CATEGORIES:
        assert abs(whole.ledger[c] - two.ledger[c]) <= losses, c
    assert abs(replay(whole.events).reserved_peak_bytes - replay(two.events).reserved_peak_bytes) <= 2 * 2**20
