"""FSDP's CPU offload (offload fsdp_cpu): Answer.AI's fsdp_qlora way to fit a 70B QLoRA on two 24 GB cards, planned,
searched under --gpus 2+, exported and read back; and the engine of every offload decided once
(advisor.memory.sharding.run_strategy) for the ledger, the step time and the exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from advisor.cli import main
from advisor.configs.export import export_plan
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory.sharding import gpu_count_problems, run_strategy
from advisor.runtime.phases import run_report

GIB = 2**30
QLORA = Plan(method="qlora", quantization="nf4", double_quant=True, lora_targets="all-linear", lora_r=8,
             gradient_checkpointing=True, optimizer="adamw_torch", offload="fsdp_cpu", seq_len=1024)


@pytest.fixture(scope="module")
def llama70b():
    return resolve_model("llama70b")


def test_the_offload_names_its_engine_whatever_the_sharding():
    assert run_strategy(QLORA, "zero3") == "fsdp"
    assert run_strategy(QLORA.with_(offload="zero2_cpu", optimizer="adamw_torch"), "fsdp") == "zero2"
    assert run_strategy(QLORA.with_(offload="none"), "zero3") == "zero3"
    assert run_strategy(QLORA.with_(offload="none"), None) == "zero3"


def test_rules_one_gpu_bitsandbytes_optimizers_and_int8():
    assert [e.where for e in gpu_count_problems(QLORA, 1)] == ["--offload"]
    assert gpu_count_problems(QLORA, 2) == []
    assert [e.where for e in QLORA.with_(optimizer="paged_adamw_8bit").problems()] == ["--optimizer"]
    assert QLORA.with_(optimizer="adamw_torch_fused").problems() == []
    lora8 = QLORA.with_(method="lora", quantization="int8", double_quant=False)
    assert "--offload" in [e.where for e in lora8.problems()]


def test_estimate_refuses_it_on_one_gpu_in_one_line(capsys):
    code = main(["estimate", "--model", "qwen0.5b", "--method", "qlora", "--offload", "fsdp_cpu", "--gpus", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("advisor estimate: error: --offload: FSDP CPU offload")


def test_a_70b_qlora_fits_two_24gb_cards_with_the_shards_on_the_host(llama70b):
    """The GPU holds the gathered units (the output head, the layer running and the next) and the whole quantization
    constants; every shard of the parameters, gradients and optimizer states is on the host, half per rank."""
    gpu = resolve_gpu("rtx-4090")
    r = run_report(llama70b, QLORA, gpu, gpus=2, sharding="zero3")
    assert r.sharded == (2, "fsdp")
    d = r.device
    layer = max(layer.params for layer in llama70b.description.layers)
    head = llama70b.description.lm_head_params * 2
    assert head + 2 * layer * 0.5 < d["weights"] < head + 2 * layer * 0.6 + 0.2 * GIB  # 4-bit layers, bf16 head
    assert d["optimizer_states"] == 0 and d["adapter_weights"] == 0 and d["master_weights"] == 0
    assert 0.9 * GIB < d["quant_constants"] < 1.2 * GIB  # double-quantized constants of ~69B weights, not sharded
    assert r.run_peak_bytes < 16 * GIB
    # the host: the 4-bit model (~38 GiB) pinned in halves, LoRA's fp32 state; each rank quantizes the whole model
    # on the host as it loads (no rank-0 loading for bitsandbytes 4-bit)
    hm = r.host_memory
    assert 17 * GIB < hm.pinned["weights"] < 22 * GIB and hm.pinned["gradients"] > 0
    assert hm.pageable["optimizer_states"] > 0
    assert 36 * GIB < hm.load_bytes < 40 * GIB and "each process" in hm.load_what
    # without the offload, FSDP holds half of the 4-bit weights on each GPU
    assert run_report(llama70b, QLORA.with_(offload="none"), gpu, gpus=2, sharding="fsdp").device["weights"] \
        > 15 * GIB


def test_the_step_time_moves_the_shards_over_the_host_link(llama70b):
    from advisor.speed.throughput import predict_throughput

    gpu = resolve_gpu("rtx-4090")
    off = predict_throughput(llama70b, QLORA, gpu, 2, "zero3")
    assert off.terms["offload"] > 1.0 and off.terms["optimizer"] == 0  # ~19 GiB per rank each way, per micro-batch


@pytest.mark.slow  # TRL's parser in a process of its own, three exports read back: 17 s
def test_the_export_runs_fsdp_with_cpu_offload_and_reads_back(llama70b, tmp_path):
    from advisor.core.errors import ConfigErrors

    gpu = resolve_gpu("rtx-4090")
    with pytest.raises(ConfigErrors, match="FSDP's CPU offload is written for transformers' Trainer only"):
        export_plan(llama70b, QLORA, tmp_path / "no", ["deepspeed", "axolotl"], gpu=gpu, gpus=2, sharding="zero3")
    export_plan(llama70b, QLORA, tmp_path, ["advisor", "train", "trl"], gpu=gpu, gpus=2, sharding="zero3")
    trl_text = (tmp_path / "trl.yaml").read_text()
    assert "fsdp: full_shard auto_wrap offload" in trl_text and "bnb_4bit_quant_storage: bfloat16" in trl_text
    assert "--gpus 2" in trl_text  # its Check line: a TRL file cannot hold the GPU count
    # TRL's own parser (what `trl sft --config` runs), in a process of its own: TrainingArguments sets FSDP's
    # environment variables
    script = ("import sys\nfrom trl import ModelConfig, SFTConfig, TrlParser\n"
              "args = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(['--config', sys.argv[1],"
              " '--use_cpu', 'true'], fail_with_unknown_args=True)[0]\n"
              "print('OFFLOAD', args.fsdp_config.get('cpu_offload'), args.fsdp_config.get('version', 2))\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "trl.yaml")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OFFLOAD True 2" in proc.stdout  # FSDP2's CPUOffloadPolicy, what the ledger counts
    from advisor.configs.read import read_config

    for name in ("advisor.yaml", "trl.yaml"):
        _, plan, _ = read_config(tmp_path / name)
        assert plan.offload == "fsdp_cpu", name
    # train.py quantizes on the host under FSDP, not whole on each GPU
    for script in ("train.py", "train_trl.py"):
        assert 'load["device_map"] = {"": "cpu"}' in (tmp_path / script).read_text(), script


@pytest.mark.slow  # a 44-trial tune and a pre-flight of a 70B: 27 s
def test_tune_answers_the_70b_on_two_4090s_and_preflight_agrees(tmp_path, capsys):
    """Issue 41 item 6: refused 0.81 GiB over, with no way forward; now a QLoRA plan with FSDP's CPU offload, whose
    advisor.yaml pre-flight calls GO at the same peak."""
    code = main(["tune", "--model", "llama70b", "--gpus", "2", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                 "--host-budget", "128GB", "--reports-dir", str(tmp_path), "--export", str(tmp_path / "out"),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["best"]["plan"]["offload"] == "fsdp_cpu"
    peak = out["best"]["run_peak_bytes"]
    code = main(["preflight", str(tmp_path / "out" / "advisor.yaml"), "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                 "--host-budget", "128GB", "--json"])
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert code == 0 and found["memory.fit"]["data"]["peak_bytes"] == peak
    assert found["config.layout"]["data"] == {"gpus": 2, "sharding": "fsdp"}


def test_offload_rejected_without_pinning_errors():
    with pytest.raises(AdvisorInputError):
        Plan(offload="fsdp_cpu", optimizer="adamw_8bit", method="qlora", quantization="nf4").validate()
