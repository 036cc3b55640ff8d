"""Checkpoint offload (issue 31): ``--checkpoint-offload`` is activation offload with checkpointing, each checkpointed
layer's input hidden state in pinned host memory (transformers' save_on_cpu around checkpoint; Unsloth's offloaded
gradient checkpointing, ALST's activation checkpoint offload). Its GPU and host terms at long length, its host-link
term, its flag and its exports."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from advisor.cli import main
from advisor.commands.common import add_plan_flags, add_plan_override_flags, plan_from_args, plan_overrides
from advisor.configs._base import ExportContext, Unsupported
from advisor.configs.export import export_plan
from advisor.configs.read import canonical, read_config
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory.host import pinned_block_bytes
from advisor.memory.training import checkpoint_offload_bytes
from advisor.runtime.backends import get_backend
from advisor.speed.throughput import predict_throughput

LLAMA = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
H200 = resolve_gpu("h200")
LONG = Plan(method="full", offload="zero3_cpu", gradient_checkpointing=True, loss="fused-linear", seq_len=65536)


def _plan(*argv: str) -> Plan:
    p = argparse.ArgumentParser()
    add_plan_flags(p)
    return plan_from_args(p.parse_args(list(argv)))


def test_the_flag_is_activation_offload_with_checkpointing():
    assert _plan("--checkpoint-offload") == Plan(activation_offload=True, gradient_checkpointing=True)
    assert _plan("--checkpoint-offload", "--activation-offload") == _plan("--checkpoint-offload")
    assert _plan("--activation-offload") == Plan(activation_offload=True)  # TRL's offload: no checkpointing implied


def test_tune_takes_the_flag_as_two_fixed_knobs():
    p = argparse.ArgumentParser()
    add_plan_override_flags(p)
    args = p.parse_args(["--checkpoint-offload"])
    assert plan_overrides(args) == ["activation_offload=true", "gradient_checkpointing=true"]
    with pytest.raises(AdvisorInputError, match="--checkpoint-offload"):
        plan_overrides(args, ["gradient_checkpointing=false"])


def test_at_long_length_the_inputs_live_on_the_host():
    """Llama-3.1-8B at 64K: 32 inputs of 65536 x 4096 x 2 B (512 MiB, a power of two: its own pinned block) on the
    host; the GPU's saved activations fall by all but the one brought back for its layer's recompute."""
    off = get_backend("estimate").measure(LLAMA, LONG, H200)
    on = get_backend("estimate").measure(LLAMA, LONG.with_(activation_offload=True), H200)
    x = 65536 * 4096 * 2
    assert checkpoint_offload_bytes(LLAMA, LONG.with_(activation_offload=True)) == 32 * x
    assert on.host_memory.pinned["activations"] == 32 * pinned_block_bytes(x) == 32 * x
    assert on.host_bytes - off.host_bytes == 32 * x
    assert off.peak_bytes - on.peak_bytes > 25 * x
    # a length that is not a power of two: the host holds blocks, the link moves the tensors
    odd = LONG.with_(activation_offload=True, seq_len=40000)
    assert get_backend("estimate").measure(LLAMA, odd, H200).host_memory.pinned["activations"] == \
        32 * pinned_block_bytes(40000 * 4096 * 2) > checkpoint_offload_bytes(LLAMA, odd) == 32 * 40000 * 4096 * 2


def test_the_host_budget_counts_the_offloaded_inputs(capsys):
    argv = ["estimate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h200", "--method", "lora",
            "--gradient-checkpointing", "--loss", "fused-linear", "--seq-len", "65536", "--json"]
    assert main(argv + ["--host-budget", "16GB"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--checkpoint-offload", "--host-budget", "16GB"]) == 0
    offloaded = json.loads(capsys.readouterr().out)
    assert plain["host_fits"] and not offloaded["host_fits"]  # 16 GiB of inputs: over 16GB less its reserve
    assert offloaded["host_bytes"] - plain["host_bytes"] == 32 * 65536 * 4096 * 2


def test_the_step_adds_both_copies_over_the_host_link_unhidden():
    """save_on_cpu copies on the compute stream: 2 x the inputs' bytes / (PCIe 5.0 x16 64 GB/s x 0.8)."""
    plan = LONG.with_(activation_offload=True)
    with_offload = predict_throughput(LLAMA, plan, H200)
    without = predict_throughput(LLAMA, LONG, H200)
    want = 2 * 32 * 65536 * 4096 * 2 / (64e9 * 0.8)
    assert with_offload.terms["activation_offload"] == pytest.approx(want)
    assert without.terms["activation_offload"] == 0
    assert with_offload.step_seconds == pytest.approx(without.step_seconds + want, rel=1e-6)


def test_the_longest_sequence_grows(capsys):
    """On an L40S (48 GB) the saved activations stop the search at 75,534 tokens; with the inputs offloaded it reaches
    the model's trained context (131,072). On an H200 both reach that ceiling (77.3 vs 43.6 GB at 131,072)."""
    argv = ["estimate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l40s", "--method", "full",
            "--sharding", "zero3", "--offload", "zero3_cpu", "--gradient-checkpointing", "--loss", "fused-linear",
            "--seq-len", "max", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["seq_len_search"]
    assert main(argv + ["--checkpoint-offload"]) == 0
    offloaded = json.loads(capsys.readouterr().out)["seq_len_search"]
    assert plain["stops"] == "activations" and not plain["at_ceiling"]
    assert offloaded["max_seq_len"] > plain["max_seq_len"] and offloaded["at_ceiling"]


def test_each_tool_writes_it_under_its_own_key(tmp_path):
    plan = Plan(method="lora", gradient_checkpointing=True, activation_offload=True).validate()
    spec = resolve_model("qwen7b")
    written = export_plan(spec, plan, tmp_path, ["advisor", "trl", "axolotl", "llamafactory"])
    axolotl = yaml.safe_load(written["axolotl"].read_text())
    assert axolotl["activation_offloading"] == "hidden_states" and axolotl["gradient_checkpointing"] is True
    assert yaml.safe_load(written["llamafactory"].read_text())["use_unsloth_gc"] is True
    trl = yaml.safe_load(written["trl"].read_text())
    assert trl["gradient_checkpointing_kwargs"]["offload"] is True and not trl.get("activation_offloading")
    for fmt in ("advisor", "trl", "axolotl", "llamafactory"):
        back = read_config(written[fmt], check_fields=False)[1]
        assert back == canonical(plan.with_(loss="fused-linear") if fmt == "trl" else plan), fmt


def test_tools_without_it_refuse_with_a_reason(tmp_path):
    from advisor.configs._axolotl import axolotl_config
    from advisor.configs._llamafactory import llamafactory_config

    spec = resolve_model("qwen7b")
    trl_offload = Plan(method="lora", activation_offload=True).validate()  # no checkpointing: TRL's offload
    with pytest.raises(Unsupported, match="use_unsloth_gc"):
        llamafactory_config(ExportContext(spec, trl_offload))
    dpo = Plan(task="dpo", method="lora", gradient_checkpointing=True, activation_offload=True).validate()
    with pytest.raises(Unsupported, match="DPO / GRPO trainers have no checkpoint offload"):
        axolotl_config(ExportContext(spec, dpo))
    every = tmp_path / "axolotl.yaml"  # axolotl's true is TRL's offloader of every activation: not read as this
    every.write_text(yaml.safe_dump({"base_model": "Qwen/Qwen2.5-7B-Instruct", "adapter": "lora", "lora_r": 8,
                                     "lora_alpha": 16, "lora_target_linear": True, "bf16": True,
                                     "gradient_checkpointing": True, "activation_offloading": True}))
    with pytest.raises(Exception, match="activation_offloading"):
        read_config(every, check_fields=False)


def test_the_simulation_runs_the_offload_as_a_real_cpu_step_does():
    """The flag's plan through transformers' own save_on_cpu: the fake-tensor trace equals the real CPU step, GPU and
    host, phase by phase (the lever's place in tests/test_simulate.py LEVERS, here from the flag)."""
    pytest.importorskip("torch")
    from advisor.runtime.simulate.runner import trace_step
    from advisor.runtime.simulate.tiny import tiny_spec

    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    plan = _plan("--checkpoint-offload", "--method", "full", "--seq-len", "64")
    trace_step(spec, plan, fake=True)  # a process's first fake trace counts a lazily built constant once
    fake, real = trace_step(spec, plan, fake=True), trace_step(spec, plan, fake=False)
    assert set(fake.phases) == set(real.phases)
    for name, ph in real.phases.items():
        assert fake.phases[name].ledger == ph.ledger, name
        assert fake.phases[name].host_bytes == ph.host_bytes, name
    assert max(ph.host_bytes for ph in real.phases.values()) >= 2 * 64 * 128 * 2  # two inputs on the host
