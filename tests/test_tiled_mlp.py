"""Tiled MLP (issue 31): ``--tiled-mlp`` runs DeepSpeed ALST's TiledMLP on each dense decoder MLP (ceil(seq / hidden)
sequence shards, each recomputed in backward). Its flag and rules, its real code path (the simulation under fake
tensors equals the real CPU step, byte for byte), its ledger (within 3% of the simulation), its step-time term, its
quality (the same gradients), and its exports (written, read back, run)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import yaml

torch = pytest.importorskip("torch")

from advisor.cli import main  # noqa: E402
from advisor.commands.common import add_plan_flags, plan_from_args  # noqa: E402
from advisor.configs._base import ExportContext, Unsupported  # noqa: E402
from advisor.configs.export import export_plan  # noqa: E402
from advisor.configs.read import canonical, read_config  # noqa: E402
from advisor.core.catalog import resolve_gpu, resolve_model  # noqa: E402
from advisor.core.errors import AdvisorInputError  # noqa: E402
from advisor.core.plan import Plan  # noqa: E402
from advisor.memory import tiled_mlp as ledger_terms  # noqa: E402
from advisor.memory.training import estimate_training  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402
from advisor.speed.throughput import predict_throughput  # noqa: E402

SPEC = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=512)  # seq 512: 4 shards of 128


def _plan(*argv: str) -> Plan:
    p = argparse.ArgumentParser()
    add_plan_flags(p)
    return plan_from_args(p.parse_args(list(argv)))


def test_the_flag_and_its_rules_name_it_in_one_line():
    assert _plan("--tiled-mlp") == Plan(tiled_mlp=True)
    assert Plan(tiled_mlp=True).short().endswith("tiled-mlp") and "tiled" not in Plan().short()
    for bad in (dict(dora=True), dict(method="lora", quantization="int8"), dict(activation_offload=True)):
        with pytest.raises(AdvisorInputError) as e:
            Plan(tiled_mlp=True, **bad).validate()
        assert str(e.value).startswith("--tiled-mlp: ") and "\n" not in str(e.value)
    Plan(tiled_mlp=True, activation_offload=True, gradient_checkpointing=True).validate()  # checkpoint offload


def test_alst_shard_count():
    llama = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert ledger_terms.num_shards(llama, Plan(seq_len=131072)) == 32  # ceil(131072 / 4096)
    assert (ledger_terms.num_shards(llama, Plan(seq_len=4097)) == 2
            and ledger_terms.num_shards(llama, Plan(seq_len=9)) == 1)
    assert ledger_terms.shard_tokens(llama, Plan(seq_len=4097, micro_batch=2)) == math.ceil(2 * 4097 / 2)
    assert not ledger_terms.tiles(resolve_model("qwen3-30b-a3b"), Plan(tiled_mlp=True))  # routed experts: untiled


def test_the_real_step_runs_deepspeeds_tiledmlp_with_the_same_gradients():
    """The quality entry's claim: the tiled step's loss and every gradient equal the untiled step's (fp32, within
    float rounding: the shards' weight gradients are summed in another order)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    from advisor.runtime.build import build_training_setup

    def grads(tiled: bool):
        plan = Plan(method="full", precision="fp32", seq_len=512, tiled_mlp=tiled)
        setup = build_training_setup(SPEC, plan, seed=3)
        ids, labels = setup.make_batch(seed=1)
        seen = []
        if tiled:
            original = TiledMLP.forward
            TiledMLP.forward = staticmethod(lambda ctx, *a: (seen.append(a[3]), original(ctx, *a))[1])
        try:
            loss = setup.model(input_ids=ids, labels=labels).loss
            loss.backward()
        finally:
            if tiled:
                TiledMLP.forward = staticmethod(original)
        assert seen == ([4, 4] if tiled else [])  # both layers' MLPs, ceil(512 / 128) shards
        return loss.item(), {n: p.grad.clone() for n, p in setup.model.named_parameters()}

    (plain_loss, plain), (tiled_loss, tiled) = grads(False), grads(True)
    assert tiled_loss == pytest.approx(plain_loss, rel=1e-6)
    for name, g in plain.items():
        assert torch.allclose(tiled[name], g, rtol=1e-4, atol=1e-6), name


PLANS = [Plan(method="full", seq_len=512, tiled_mlp=True),
         Plan(method="lora", lora_targets="all-linear", seq_len=512, tiled_mlp=True),
         Plan(method="lora", lora_targets="all-linear", seq_len=512, micro_batch=2, gradient_checkpointing=True,
              tiled_mlp=True),
         Plan(method="qlora", quantization="nf4", lora_targets="all-linear", seq_len=512, gradient_checkpointing=True,
              loss="fused-linear", tiled_mlp=True)]


@pytest.mark.parametrize("plan", [p if i < 2 else pytest.param(p, marks=pytest.mark.slow) for i, p in enumerate(PLANS)],
                         ids=lambda p: p.short())
def test_the_simulation_equals_the_real_cpu_step(plan):
    """DeepSpeed's TiledMLP under fake tensors allocates what it does on real CPU tensors, phase by phase."""
    trace_step(SPEC, plan.with_(tiled_mlp=False), fake=True)  # a process's first fake trace allocates a lazy constant
    fake = trace_step(SPEC, plan, fake=True)
    real = trace_step(SPEC, plan, fake=False)
    assert any(n.startswith("tiled MLP: DeepSpeed TiledMLP on 2 decoder MLP") for n in fake.notes)
    assert set(fake.phases) == set(real.phases)
    for name, ph in real.phases.items():
        assert fake.phases[name].ledger == ph.ledger, name
    assert fake.peak_bytes == real.peak_bytes


def test_tiling_lowers_the_traced_peak_on_the_tiny_model():
    for plan in PLANS[:2]:
        assert trace_step(SPEC, plan, fake=True).peak_bytes < 0.8 * trace_step(
            SPEC, plan.with_(tiled_mlp=False), fake=True).peak_bytes


def _within(model: str, plan: Plan, tolerance: float = 0.03) -> None:
    from advisor.runtime.simulate.extrapolate import simulate

    spec = resolve_model(model)
    sim, est = simulate(spec, plan).peak_bytes, estimate_training(spec, plan).tensor_peak_bytes
    assert abs(est - sim) < tolerance * sim, f"analytic {est:,} vs simulated {sim:,} ({(est - sim) / sim:+.2%})"


def test_the_ledger_within_3_percent_of_the_simulation_quick():
    _within("llama-3.2-1b-instruct", Plan(method="lora", seq_len=4096, loss="fused-linear", gradient_checkpointing=True,
                                          tiled_mlp=True))


@pytest.mark.slow
@pytest.mark.parametrize("model,plan", [
    ("llama-3.2-1b-instruct", Plan(method="lora", seq_len=4096, loss="fused-linear", tiled_mlp=True)),
    ("llama-3.2-1b-instruct", Plan(method="full", seq_len=4096, loss="fused-linear", gradient_checkpointing=True,
                                   tiled_mlp=True)),
    ("qwen2.5-7b-instruct", Plan(method="lora", seq_len=8192, loss="fused-linear", tiled_mlp=True)),
    ("qwen2.5-7b-instruct", Plan(method="lora", seq_len=16384, loss="fused-linear", gradient_checkpointing=True,
                                 tiled_mlp=True)),
    ("qwen2.5-7b-instruct", Plan(method="qlora", quantization="nf4", lora_targets="all-linear", seq_len=16384,
                                 loss="fused-linear", gradient_checkpointing=True, tiled_mlp=True)),
    ("qwen2.5-7b-instruct", Plan(method="lora", lora_targets="all-linear", seq_len=8192, micro_batch=2,
                                 gradient_checkpointing=True, tiled_mlp=True)),
], ids=lambda x: x if isinstance(x, str) else x.short())
def test_the_ledger_within_3_percent_of_the_simulation(model, plan):
    _within(model, plan)


LLAMA = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
LONG = Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, loss="fused-linear", seq_len=32768)


def test_at_long_length_the_mlp_keeps_its_input_instead_of_its_intermediates():
    """Llama-3.1-8B QLoRA at 32K without checkpointing: each layer keeps x (T x h) where it kept three T x i
    intermediates; the layer's backward holds x's gradient and one 4096-token shard's tensors, not T x i ones."""
    plan = LONG.with_(gradient_checkpointing=False)
    plain, tiled = estimate_training(LLAMA, plan), estimate_training(LLAMA, plan.with_(tiled_mlp=True))
    T, h, i = 32768, 4096, 14336
    saved = plain.extra["activations_per_layer_bytes"] - tiled.extra["activations_per_layer_bytes"]
    assert saved == 3 * 2 * T * i - 2 * T * h
    with_ckpt = estimate_training(LLAMA, LONG.with_(tiled_mlp=True))
    assert with_ckpt.tensor_peak_bytes < estimate_training(LLAMA, LONG).tensor_peak_bytes - 2 * T * i


def test_the_step_runs_the_mlp_forward_once_more():
    gpu = resolve_gpu("rtx-4090")
    plain = predict_throughput(LLAMA, LONG, gpu)
    tiled = predict_throughput(LLAMA, LONG.with_(tiled_mlp=True), gpu)
    assert plain.terms.get("tiled_mlp", 0.0) == 0.0 and tiled.terms["tiled_mlp"] > 0
    assert tiled.step_seconds > plain.step_seconds
    # the MLP's forward GEMMs alone (3 x T x h x i x 2 FLOPs per layer) are a floor of the term
    unquantized = LONG.with_(method="lora", quantization="none")
    t = predict_throughput(LLAMA, unquantized.with_(tiled_mlp=True), gpu).terms["tiled_mlp"]
    assert t > 32 * 3 * 2 * 32768 * 4096 * 14336 / (gpu.bf16_tflops * 1e12)


def test_estimate_seq_len_max_goes_further_with_it(capsys):
    argv = ["estimate", "--model", "llama8b", "--method", "qlora", "--gpu", "rtx-4090", "--gradient-checkpointing",
            "--loss", "fused-linear", "--seq-len", "max", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--tiled-mlp"]) == 0
    tiled = json.loads(capsys.readouterr().out)
    assert tiled["plan"]["tiled_mlp"] is True and tiled["fits"]
    assert tiled["max_seq_len"] > 1.2 * plain["max_seq_len"]


def test_its_quality_entry_is_exact():
    from advisor.core.data_files import load_data_file

    entry = load_data_file("quality.yaml")["levers"]["tiled_mlp"]
    assert (entry["true"]["kind"] == entry["false"]["kind"] == "exact"
            and "Arctic Long Sequence Training" in entry["true"]["source"])


# --------------------------------------------------------------------------- exports

EXPORTED = Plan(method="lora", lora_targets="all-linear", gradient_checkpointing=True, seq_len=32768,
                loss="fused-linear", tiled_mlp=True)


def test_exports_write_it_and_read_it_back(tmp_path):
    written = export_plan(LLAMA, EXPORTED, tmp_path, ["advisor", "trl", "axolotl"])
    advisor = yaml.safe_load(written["advisor"].read_text())
    assert advisor["advisor"]["tiled_mlp"] is True
    axolotl = yaml.safe_load(written["axolotl"].read_text())
    assert axolotl["tiled_mlp"] is True and axolotl["tiled_mlp_num_shards"] == 8  # ceil(32768 / 4096), ALST's
    trl = written["trl"].read_text()
    assert yaml.safe_load(trl)["tiled_mlp"] is True and "`trl sft` ignores it" in trl
    for fmt in ("advisor", "trl", "axolotl"):
        assert read_config(written[fmt], check_fields=False)[1] == canonical(EXPORTED), fmt
    untiled = export_plan(LLAMA, EXPORTED.with_(tiled_mlp=False), tmp_path / "off", ["advisor", "axolotl", "trl"])
    assert "tiled_mlp" not in yaml.safe_load(untiled["advisor"].read_text())["advisor"]
    assert not any(k.startswith("tiled_mlp") for fmt in ("axolotl", "trl")
                   for k in yaml.safe_load(untiled[fmt].read_text()))


def test_llamafactory_refuses_it_with_the_reason():
    from advisor.configs._llamafactory import llamafactory_config

    with pytest.raises(Unsupported, match="no tiled-MLP key"):
        llamafactory_config(ExportContext(LLAMA, EXPORTED))


def test_an_axolotl_file_without_alsts_shard_count_is_refused(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text(yaml.safe_dump({"base_model": "meta-llama/Llama-3.1-8B-Instruct", "adapter": "lora", "lora_r": 8,
                                    "lora_alpha": 16, "lora_target_linear": True, "tiled_mlp": True}))
    with pytest.raises((AdvisorInputError, Exception), match="tiled_mlp_num_shards"):
        read_config(path, check_fields=False)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,script", [(("advisor", "train"), "train.py"), (("trl",), "train_trl.py")],
                         ids=["train.py", "train_trl.py"])
def test_the_exported_script_tiles_the_mlps_and_trains_a_step(tiny_model, tmp_path, fmt, script):
    """The exported script applies DeepSpeed's TiledMLP to the tiny model's two MLPs (hidden 32, 96 tokens: 3
    shards) and trains a step on the CPU."""
    from export_runs import run_export_script  # tests/export_runs.py

    plan = Plan(method="lora", lora_targets="all-linear", seq_len=96, tiled_mlp=True, lora_r=4, lora_alpha=8.0)
    export_plan(resolve_model("qwen0.5b"), plan, tmp_path / "export", list(fmt))
    proc, s = run_export_script(tmp_path / "export" / script, "--data", str(tiny_model / "data.jsonl"), "--max-steps",
                                "1", "--model-path", str(tiny_model), "--output-dir", str(tmp_path / "ckpt"),
                                "--no-save")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"]) and s["tiled_mlps"] == 2
    assert "tiled MLP: DeepSpeed TiledMLP on 2 decoder MLP(s)" in proc.stdout + proc.stderr
