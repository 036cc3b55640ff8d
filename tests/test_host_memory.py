"""Host memory is a budget too: each allocation kind counted as the library allocates it (pinned save_on_cpu and
activation offload, DeepSpeed's buffers by pin_memory, a paged optimizer's spill as pageable), ``--host-budget``
and its detection, the host rule in tune, selection and pre-flight, and studies made before it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.fit import host_fits, host_overshoot, host_reserve_bytes, host_usable_bytes
from advisor.core.plan import Plan
from advisor.core.target import resolve_host_budget
from advisor.memory.host import (DEEPSPEED_PIN_MEMORY, deepspeed_buffers, deepspeed_host, param_tensors,
                                 pinned_block_bytes, process_baseline_bytes)
from advisor.runtime.backends import get_backend
from advisor.runtime.simulate.tiny import tiny_spec
from advisor.search.select import Rules, TrialRecord, select

GiB = 2**30
TINY = dict(num_layers=2, hidden_size=96, intermediate_size=224)


# ----------------------------------------------------------------------------- how each kind is allocated

def test_pinned_requests_take_power_of_two_blocks():
    assert [pinned_block_bytes(n) for n in (0, 1, 1024, 1025, 7 * 2**20, 8 * 2**20)] == \
        [0, 1, 1024, 2048, 8 * 2**20, 8 * 2**20]


def test_the_installed_torch_rounds_pinned_requests_so():
    """The rule the ledger copies, in the installed torch's own CachingHostAllocator (its header ships with the
    wheel; pinned memory itself needs a GPU)."""
    import torch

    header = Path(torch.__file__).parent / "include" / "ATen" / "core" / "CachingHostAllocator.h"
    if not header.is_file():
        pytest.skip("this torch build ships no ATen headers")
    text = header.read_text()
    assert "c10::llvm::PowerOf2Ceil(size)" in text and "size <= pinned_max_round_threshold()" in text


def test_the_exports_offload_paths_pin_what_they_copy():
    """transformers' checkpoint offload wraps checkpoint in save_on_cpu(pin_memory=True), and save_on_cpu then
    allocates pinned host tensors: the path the exported gradient_checkpointing_kwargs.offload takes."""
    from torch.autograd.graph import save_on_cpu
    from transformers import modeling_utils

    assert "save_on_cpu(pin_memory=True" in inspect.getsource(
        modeling_utils.PreTrainedModel._activation_checkpointing_enable)
    assert "pin_memory=is_pinnable" in inspect.getsource(save_on_cpu.__init__)


def test_checkpoint_offload_is_pinned_alike_in_the_estimate_and_the_simulation():
    """save_on_cpu around checkpoint: each checkpointed layer's input (48 x 96 bf16, 9 KiB) in a 16 KiB block."""
    spec = tiny_spec("qwen2", **TINY)
    plan = Plan(method="lora", seq_len=48, gradient_checkpointing=True, activation_offload=True)
    want = {"activations": 2 * pinned_block_bytes(48 * 96 * 2)}
    for backend in ("estimate", "simulate"):
        rep = get_backend(backend).measure(spec, plan, None)
        assert rep.host_memory.pinned == want and rep.host_memory.pageable == {}, backend
        assert rep.host["activations"] == rep.host_pinned_bytes == want["activations"] and rep.host_pageable_bytes == 0


@pytest.mark.slow
def test_offload_without_checkpointing_pins_each_saved_tensor_on_qwen7b():
    """TRL's rule: every saved decoder tensor of 1 KiB or more, each in a block of its own. The estimate keeps to
    the trace of the real step (whose host copies the tracker counts in the same blocks)."""
    spec = resolve_model("qwen7b")
    plan = Plan(method="lora", activation_offload=True)
    est = get_backend("estimate").measure(spec, plan, None).host_memory.pinned["activations"]
    sim = get_backend("simulate").measure(spec, plan, None).host_memory.pinned["activations"]
    assert abs(est - sim) / sim < 0.05
    raw = get_backend("estimate").measure(spec, plan.with_(gradient_checkpointing=True), None)
    assert raw.host_pinned_bytes == 28 * pinned_block_bytes(1024 * 3584 * 2)


def test_deepspeed_buffers_are_pinned_or_pageable_by_pin_memory():
    spec = resolve_model("qwen7b")
    n = spec.params_total
    plan = Plan(method="full", offload="zero2_cpu")
    pinned, pageable, _ = deepspeed_host(spec, plan, pin_optimizer=True)
    # fp32 master and gradient partitions, the 16-bit copy: one pinned block each; the largest parameter's
    # 16-bit staging buffer; CPU Adam's fp32 moments always pageable
    assert pinned == {"master_weights": pinned_block_bytes(4 * n), "weights": pinned_block_bytes(2 * n),
                      "gradients": pinned_block_bytes(4 * n) + pinned_block_bytes(2 * spec.embedding_params)}
    assert pageable == {"optimizer_states": 8 * n}
    pinned, pageable, _ = deepspeed_host(spec, plan, pin_optimizer=False)
    assert pinned == {} and pageable == {"optimizer_states": 8 * n, "master_weights": 4 * n, "weights": 2 * n,
                                         "gradients": 4 * n + 2 * spec.embedding_params}
    # ZeRO-3: the parameter partitions follow offload_param.pin_memory, the fp32 partition is pageable
    z3 = Plan(method="lora", offload="zero3_cpu")
    on = {b.name: b for b in deepspeed_buffers(spec, z3, pin_param=True)}
    off = {b.name: b for b in deepspeed_buffers(spec, z3, pin_param=False)}
    assert on["ds_tensor (parameter partitions)"].pinned and not off["ds_tensor (parameter partitions)"].pinned
    assert not on["fp32_partitioned_groups_flat"].pinned and not on["exp_avg, exp_avg_sq"].pinned
    assert off["ds_tensor (parameter partitions)"].nbytes < on["ds_tensor (parameter partitions)"].nbytes


def test_the_exported_deepspeed_json_pins_as_the_ledger_assumes():
    from advisor.configs._deepspeed import deepspeed_config

    zero = deepspeed_config(Plan(method="full", offload="zero3_cpu"))["zero_optimization"]
    assert zero["offload_optimizer"]["pin_memory"] is DEEPSPEED_PIN_MEMORY
    assert zero["offload_param"]["pin_memory"] is DEEPSPEED_PIN_MEMORY


ENGINE = r'''
import json, os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from collections import Counter
import deepspeed, torch
from transformers import AutoModelForCausalLM
from advisor.configs._deepspeed import deepspeed_config
from advisor.core.catalog import build_hf_config
from advisor.core.plan import Plan, lora_target_modules
from advisor.runtime.simulate.tiny import tiny_spec

spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
plan = Plan(**json.loads(sys.argv[1]))
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(build_hf_config(spec.config), dtype=torch.bfloat16)
if plan.peft:
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=plan.lora_r, lora_alpha=2 * plan.lora_r, lora_dropout=0.0,
                                             target_modules=lora_target_modules(plan, list(spec.linear_shapes()))))
engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                  config=deepspeed_config(plan))
zo = engine.optimizer
ids = torch.randint(0, spec.vocab_size, (1, 16))
for _ in range(plan.grad_accum):
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
size = lambda ts: sorted(Counter(t.numel() * t.element_size() for t in ts).items())
print("BUFFERS " + json.dumps({
    "single_partition_of_fp32_groups": size(zo.single_partition_of_fp32_groups),
    "param_buffer_of_bit16_for_cpu_offload_groups": size(zo.param_buffer_of_bit16_for_cpu_offload_groups),
    "single_partition_of_fp32_groups[].grad": size(g.grad for g in zo.single_partition_of_fp32_groups),
    "temp_grad_buffer_for_cpu_offload": size([zo.temp_grad_buffer_for_cpu_offload]),
    "accumulated_grads_in_cpu": size(zo.accumulated_grads_in_cpu.values()),
    "exp_avg, exp_avg_sq": size(v for st in zo.optimizer.state.values() for k, v in st.items()
                                if k in ("exp_avg", "exp_avg_sq")),
    "optimizer": type(zo.optimizer).__name__}))
'''


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero2_offload_buffers_are_those_a_real_deepspeed_engine_allocates(method, tmp_path):
    """A real DeepSpeed ZeRO-2 engine with the exported deepspeed.json (CPU Adam, offload_optimizer on the cpu),
    on a tiny Qwen2 on the CPU, two micro-batches: every host buffer it holds, tensor by tensor, is the ledger's."""
    pytest.importorskip("deepspeed")
    plan = Plan(method=method, offload="zero2_cpu", grad_accum=2, seq_len=16)
    proc = subprocess.run([sys.executable, "-c", ENGINE, json.dumps({"method": method, "offload": "zero2_cpu",
                                                                       "grad_accum": 2, "seq_len": 16})],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
                          env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BUFFERS ")), None)
    assert line, proc.stderr[-3000:]
    real = json.loads(line[len("BUFFERS "):])
    assert real.pop("optimizer") == "DeepSpeedCPUAdam"
    spec = tiny_spec("qwen2", num_layers=2, hidden_size=128, intermediate_size=256)
    ledger = {b.name: sorted(b.tensors.items()) for b in deepspeed_buffers(spec, plan)}
    assert {k: [tuple(x) for x in v] for k, v in real.items()} == ledger


def test_paged_spill_is_pageable_host_memory():
    """A paged optimizer's states are CUDA managed memory: on the host only what the driver evicts (pageable)."""
    spec = resolve_model("qwen7b")
    plan = Plan(method="full", optimizer="paged_adamw_32bit", gradient_checkpointing=True)
    rep = get_backend("estimate").measure(spec, plan, resolve_gpu("a100-40gb"))
    spill = rep.host_memory.pageable["optimizer_states"]
    assert spill > 0 and rep.host_memory.pinned == {} and rep.host["optimizer_states"] == spill
    resident = get_backend("estimate").measure(resolve_model("qwen0.5b"), plan, resolve_gpu("a100-40gb"))
    assert resident.host_bytes == 0 and resident.host_memory.pageable == {}


def test_loading_is_a_host_phase():
    """train.py loads onto its process's GPU with a device_map (one tensor staged at a time), quantized or not;
    under DeepSpeed ZeRO-2 over several GPUs every process takes the whole model from the CPU, under FSDP rank 0
    alone (cpu_ram_efficient_loading: 1/N of it per rank), under ZeRO-3 zero.Init partitions it as it is made;
    ZeRO-Offload takes it whole."""
    from advisor.memory.sharding import shard_report

    spec = resolve_model("qwen7b")
    tensor = max(param_tensors(spec)) * 2
    assert tensor == spec.embedding_params * 2
    lora_rep = get_backend("estimate").measure(spec, Plan(method="lora"), None)
    lora = lora_rep.host_memory
    assert lora.load_bytes == tensor and "device_map" in lora.load_what and lora.peak_phase == "load"
    assert lora.peak_bytes == lora.load_bytes + process_baseline_bytes()
    qlora = get_backend("estimate").measure(spec, Plan(method="qlora", quantization="nf4"), None).host_memory
    assert qlora.load_bytes == tensor
    for strategy, load in (("ddp", tensor), ("zero3", tensor), ("zero2", spec.params_total * 2),
                           ("fsdp", spec.params_total * 2 // 8)):
        sharded = shard_report(lora_rep, spec, Plan(method="lora"), 8, strategy).host_memory
        assert sharded.load_bytes == load, strategy
    offload = get_backend("estimate").measure(spec, Plan(method="full", offload="zero2_cpu"), None).host_memory
    assert offload.load_bytes == spec.params_total * 2


# ----------------------------------------------------------------------------- the budget

def test_host_budget_parses_like_the_gpu_budget(monkeypatch):
    monkeypatch.setenv("ADVISOR_HOST_RAM", "64GB")
    assert resolve_host_budget("32GB")[0].bytes == 32 * GiB
    half, detected = resolve_host_budget("50%")
    assert half.bytes == 32 * GiB and not detected  # a percentage of the detected RAM, given by the user
    budget, detected = resolve_host_budget(None)
    assert detected and budget.bytes == 64 * GiB and "ADVISOR_HOST_RAM" in budget.text
    assert resolve_host_budget(None, detect=False) == (None, False)
    for bad in ("lots", "0GB", "150%", "-3GB"):
        with pytest.raises(AdvisorInputError) as e:
            resolve_host_budget(bad)
        assert e.value.where == "--host-budget"


def test_detection_takes_the_containers_limit(monkeypatch, tmp_path):
    import psutil

    from advisor.core import host

    monkeypatch.delenv("ADVISOR_HOST_RAM")
    limit = tmp_path / "memory.max"
    limit.write_text(f"{8 * GiB}\n")
    monkeypatch.setattr(host, "CGROUP_LIMITS", (tmp_path / "absent", limit))
    ram = host.detect_host_ram()
    assert ram.source == "cgroup memory limit" and ram.bytes == min(8 * GiB, psutil.virtual_memory().total)
    limit.write_text("max\n")
    assert host.detect_host_ram().bytes == psutil.virtual_memory().total


@pytest.mark.parametrize("argv", [["estimate", "--model", "qwen7b", "--host-budget", "lots"],
                                  ["tune", "--model", "qwen7b", "--gpu-budget", "24GB", "--host-budget", "0MB"]])
def test_bad_host_budget_is_one_line_naming_the_flag(argv, tmp_path):
    extra = ["--reports-dir", str(tmp_path)] if argv[0] == "tune" else []
    proc = subprocess.run([sys.executable, "-m", "advisor", *argv, *extra], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2 and "--host-budget" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_host_rule_keeps_the_os_reserve():
    """GKE's node reservation: 3.66 GiB of 32 GiB, 5.58 GiB of 64 GiB (with the 100 MiB eviction threshold)."""
    assert round(host_reserve_bytes(32 * GiB) / GiB, 2) == 3.66
    assert round(host_reserve_bytes(64 * GiB) / GiB, 2) == 5.58
    usable = host_usable_bytes(32 * GiB)
    assert host_fits(usable, 32 * GiB) and not host_fits(usable + 1, 32 * GiB)
    assert host_overshoot(usable, 32 * GiB) == 0 and host_overshoot(2 * usable, 32 * GiB) == pytest.approx(1)
    assert host_fits(10**15, None) and host_overshoot(10**15, None) < 0


# ----------------------------------------------------------------------------- feasibility everywhere

def _rec(n, tps, host_gib):
    return TrialRecord(number=n, state="complete", plan={"method": "qlora"}, plan_short=f"plan{n}", peak_bytes=10 * GiB,
                       tokens_per_s=tps, accuracy_loss=0.01, source="estimated", host_bytes=int(host_gib * GiB),
                       host_peak_bytes=int(host_gib * GiB))


def test_selection_keeps_the_host_rule():
    records = [_rec(0, 1000, 50), _rec(1, 900, 10)]
    assert select(records, 24 * GiB, 0.05, 0.05).best.number == 0  # not checked
    assert select(records, 24 * GiB, 0.05, 0.05, rules=Rules(host_budget_bytes=32 * GiB)).best.number == 1
    # a record stored before the host peak was kept: its offloaded bytes decide
    old = TrialRecord(number=2, state="complete", plan={}, plan_short="old", peak_bytes=10 * GiB, tokens_per_s=2000,
                      accuracy_loss=0.01, host_bytes=40 * GiB)
    assert select([*records, old], 24 * GiB, 0.05, 0.05, rules=Rules(host_budget_bytes=32 * GiB)).best.number == 1


def test_tune_prunes_offload_plans_over_a_small_host_budget(tmp_path, capsys):
    """Activation offload without checkpointing pins every saved tensor: tens of GB at b8 x 1024. With 16 GB of
    RAM those plans are pruned with their host peak, pinned and pageable bytes named; the answer fits the host,
    and the Optuna constraint says so."""
    import optuna

    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--json", "--trials",
                 "10", "--host-budget", "16GB", "--reports-dir", str(tmp_path), "method=qlora",
                 "activation_offload=true"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["study"].endswith("-host16gb")
    usable = d["host_budget"]["usable_bytes"]
    assert d["host_budget"]["bytes"] == 16 * GiB and usable == int(host_usable_bytes(16 * GiB))
    over = [t for t in d["trials"] if "host peak" in t["reason"]]
    assert over, [t["reason"] for t in d["trials"]]
    for t in over:
        assert "pinned" in t["reason"] and "pageable" in t["reason"] and "16.00 GiB" in t["reason"]
        assert t["host_peak_bytes"] > usable
    best = d["best"]
    assert best["host_peak_bytes"] <= usable and best["host_pinned_bytes"] > 0  # an offload plan within it
    assert best["host_ledger"]["activations"] == best["host_pinned_bytes"]
    study = optuna.load_study(study_name=d["study"], storage=d["storage"])
    constraints = {t.number: t.system_attrs for t in study.trials}
    for t in over:
        assert constraints[t["number"]]["constraints:host_memory"] > 0
    assert constraints[best["number"]]["constraints:host_memory"] <= 0


def test_the_tune_screen_shows_the_host_budget_and_the_winners_host_peak(tmp_path, capsys):
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--trials", "6",
                 "--host-budget", "64GB", "--reports-dir", str(tmp_path), "method=qlora", "activation_offload=true",
                 "--verbose"])
    out = capsys.readouterr().out
    assert code == 0 and "Host budget 64GB (--host-budget)" in out
    assert "host peak" in out and "pinned" in out and "usable of 64GB" in out


def test_preflight_is_no_go_over_the_host_budget(tmp_path):
    from advisor.configs.export import export_plan
    from advisor.diagnosis.preflight import PreflightInput, run_preflight

    plan = Plan(method="qlora", quantization="nf4", activation_offload=True, micro_batch=8, grad_accum=1)
    cfg = export_plan(resolve_model("qwen7b"), plan, tmp_path / "out", formats=["advisor"])["advisor"]
    small = run_preflight(PreflightInput(config=str(cfg), gpu_budget="24GB", gpu="rtx-4090", backend="estimate",
                                         host_budget="32GB"))
    host = next(f for f in small.findings if f.check == "env.host-ram")
    assert small.verdict == "NO-GO" and host.severity == "error"
    assert "pinned" in host.evidence and "pageable" in host.evidence and "of 32.00 GiB of RAM" in host.title
    assert host.data["host_pinned_bytes"] > host.data["host_usable_bytes"] and host.fixes
    big = run_preflight(PreflightInput(config=str(cfg), gpu_budget="24GB", gpu="rtx-4090", backend="estimate",
                                       host_budget="256GB"))
    assert next(f for f in big.findings if f.check == "env.host-ram").severity == "ok"
    assert big.to_dict()["host_budget"]["bytes"] == 256 * GiB


def test_estimate_reports_the_host_rule(capsys):
    argv = ["estimate", "--model", "qwen7b", "--method", "qlora", "--activation-offload", "--micro-batch", "8",
            "--host-budget", "32GB"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["host_fits"] is False and d["host_peak_bytes"] > d["host_budget"]["usable_bytes"]
    assert d["host_memory"]["pinned_bytes"] == d["host_pinned_bytes"] > 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Host peak" in out and "OVER THE HOST BUDGET" in out


# ----------------------------------------------------------------------------- studies made before

def test_an_old_study_loads_with_its_host_memory_unchecked():
    from advisor.core.units import Budget
    from advisor.search.description import StudyDescription
    from advisor.search.space import load_space

    d = StudyDescription(model=resolve_model("qwen7b"), gpu=resolve_gpu("rtx-4090"),
                         budget=Budget(24 * GiB, "GB", "24GB"),
                         space=load_space("default", []), backend="estimate",
                         host_budget=Budget(64 * GiB, "GB", "64GB"))
    stored = d.to_dict()
    assert stored["host_budget"] == {"bytes": 64 * GiB, "text": "64GB", "unit": "GB", "detected": False}
    assert StudyDescription.from_dict(json.loads(json.dumps(stored))) == d
    old = {k: v for k, v in stored.items() if k != "host_budget"}
    loaded = StudyDescription.from_dict(old)
    assert loaded.host_budget is None and loaded.target.host_budget is None


def test_resuming_a_study_keeps_the_host_budget_it_was_made_for(tmp_path, capsys, monkeypatch):
    """A detected budget yields to the stored one (the study may move to another machine); a study made before
    host budgets stays unchecked; an explicit --host-budget that differs is refused."""
    import optuna

    argv = ["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--json", "--trials", "3",
            "--reports-dir", str(tmp_path), "--study", "s"]
    monkeypatch.setenv("ADVISOR_HOST_RAM", "64GB")
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["host_budget"]["detected"] and first["host_budget"]["bytes"] == 64 * GiB
    monkeypatch.setenv("ADVISOR_HOST_RAM", "16GB")
    assert main([*argv[:-4], "--trials", "4", *argv[-4:]]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["host_budget"]["bytes"] == 64 * GiB and again["n_trials"] == 4
    assert main([*argv, "--host-budget", "32GB"]) == 2
    assert "--host-budget" in capsys.readouterr().err
    # the same study as an older version stored it: no host budget
    study = optuna.load_study(study_name="s", storage=first["storage"])
    desc = dict(study.user_attrs["advisor"])
    desc.pop("host_budget")
    study.set_user_attr("advisor", desc)
    assert main([*argv[:-4], "--trials", "5", *argv[-4:]]) == 0
    assert json.loads(capsys.readouterr().out)["host_budget"] is None
    assert Counter(t.state.name for t in study.trials)["COMPLETE"] + Counter(
        t.state.name for t in study.trials)["PRUNED"] >= 5


def test_deepspeeds_native_pinning_is_held_to_the_memlock_limit(monkeypatch):
    """torch's pinning is not capped by ulimit -l; DeepSpeed's mlock-based native backend is."""
    import resource

    from advisor.diagnosis.preflight._env import host_memory_findings

    rep = get_backend("estimate").measure(resolve_model("qwen7b"), Plan(method="full", offload="zero2_cpu"), None)
    budget, _ = resolve_host_budget("1TiB")
    monkeypatch.setattr(resource, "getrlimit", lambda what: (64 * 2**10, 64 * 2**10))
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    assert [f.check for f in host_memory_findings(rep, budget)] == ["env.host-ram"]
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    memlock = [f for f in host_memory_findings(rep, budget) if f.check == "env.memlock"]
    assert memlock and memlock[0].severity == "error" and "ulimit -l" in memlock[0].title


def test_a_fleet_is_planned_with_its_nodes_ram_not_this_machines(monkeypatch):
    """8 H100s planned from a small machine: the host budget is the DGX H100 node's 2 TiB, not the laptop's RAM;
    one H100 gets an eighth of the node; a card the catalog gives no usual node keeps this machine's RAM."""
    from advisor.core.target import resolve_target

    monkeypatch.setenv("ADVISOR_HOST_RAM", "23.5GiB")
    fleet = resolve_target("llama-3.1-70b-instruct", gpu="h100-sxm", gpu_budget="80GB", gpus=8)
    assert fleet.host_budget.bytes == 2048 * GiB and fleet.host_detected
    assert "DGX H100" in fleet.host_budget.text
    one = resolve_target("qwen7b", gpu="h100-sxm", gpu_budget="80GB")
    assert one.host_budget.bytes == 256 * GiB and "1/8 of the node" in one.host_budget.text
    desktop = resolve_target("qwen7b", gpu="rtx-4090", gpu_budget="24GB")
    assert desktop.host_budget.bytes == int(23.5 * GiB) and "this machine" in desktop.host_budget.text
    given = resolve_target("qwen7b", gpu="h100-sxm", gpu_budget="80GB", host_budget="64GB", gpus=8)
    assert given.host_budget.bytes == 64 * GiB and not given.host_detected
