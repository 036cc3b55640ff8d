"""Sequence parallelism (--sp-degree): one rank traced under PyTorch's fake process group equals a real gloo run of
every rank; the closed form holds to that trace; the rules and the step-time exchange."""

from __future__ import annotations

import json
import os
import socket

import pytest

from advisor.cli import main
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory.ledger import CATEGORIES
from advisor.memory.sequence_parallel import (kv_replication_bytes, local_seq_len, rank_plan,
                                              sequence_parallel_problems)
from advisor.runtime.simulate.runner import trace_step
from advisor.runtime.simulate.tiny import tiny_spec

SPEC = tiny_spec("qwen2", num_layers=2)  # 4 heads, 2 k/v heads
LORA = dict(method="lora", lora_targets="all-linear")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, plan: Plan, out) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        trace = trace_step(SPEC, plan, fake=False, sp_rank=rank)
        out.put((rank, trace.peak_bytes, trace.peak_phase, trace.ledger))
    finally:
        dist.destroy_process_group()


def real_ranks(plan: Plan) -> dict[int, tuple]:
    """Every rank of ``plan``'s sequence-parallel group, run for real on the CPU over gloo (one process each)."""
    from forked import forkserver_context  # tests/forked.py: the ranks fork from a process that imported DeepSpeed

    ctx = forkserver_context()
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, plan.sp_degree, port, plan, out)) for r in range(plan.sp_degree)]
    for p in procs:
        p.start()
    results = dict((r, rest) for r, *rest in (out.get(timeout=600) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.slow  # each rank traces a real step
@pytest.mark.parametrize("plan", [Plan(seq_len=512, sp_degree=2, **LORA),
                                  Plan(seq_len=512, sp_degree=4, gradient_checkpointing=True, **LORA)],
                         ids=lambda p: p.short())
def test_fake_process_group_rank_equals_real_gloo_run(plan):
    """DeepSpeed's Ulysses attention on rank 0 under the fake process group allocates what each rank of a real gloo
    run does (their all-to-alls exchange real data there)."""
    fake = trace_step(SPEC, plan, fake=True)
    real = real_ranks(plan)
    for rank, (peak, phase, ledger) in real.items():
        assert phase == fake.peak_phase, rank
        assert abs(peak - fake.peak_bytes) <= 0.01 * peak, (rank, peak, fake.peak_bytes)
        for cat in CATEGORIES:
            assert abs(fake.ledger[cat] - ledger[cat]) <= 0.01 * peak, (rank, cat)


@pytest.mark.slow
@pytest.mark.parametrize("degree,kw", [(2, {}), (4, {}), (4, dict(gradient_checkpointing=True)),
                                       (2, dict(method="full"))])
def test_closed_form_within_3_percent_of_the_traced_rank(degree, kw):
    from advisor.memory.training import estimate_training

    plan = Plan(seq_len=8192, sp_degree=degree, **{"method": "lora", **kw})  # the q/k/v/o targets
    traced = trace_step(SPEC, plan, fake=True)
    est = estimate_training(SPEC, plan)
    assert abs(est.tensor_peak_bytes - traced.peak_bytes) <= 0.03 * traced.peak_bytes
    assert any("sequence parallel over" in n for n in est.notes)


def test_a_rank_holds_its_shard_and_the_replicated_kv_heads():
    from advisor.memory.training import estimate_training

    plan = Plan(seq_len=8192, sp_degree=4, **LORA)
    assert local_seq_len(plan) == 2048 and rank_plan(plan).seq_len == 2048 and rank_plan(plan).sp_degree == 1
    # 4 ranks, 2 k/v heads: each k/v head twice (UlyssesSPAttentionHF kv_replication_factor)
    assert kv_replication_bytes(SPEC, plan) == 2 * 1 * 2 * 2048 * SPEC.kv_dim
    assert kv_replication_bytes(SPEC, plan.with_(sp_degree=2)) == 0
    one = estimate_training(SPEC, plan.with_(seq_len=8192, sp_degree=1))
    assert estimate_training(SPEC, plan).tensor_peak_bytes < one.tensor_peak_bytes / 2  # the overhead is fixed


def test_rules_name_the_flag():
    assert Plan(sp_degree=2, attn_impl="eager").problems()[0].where == "--attn-impl"
    odd = Plan(sp_degree=3, **LORA)
    assert "heads" in str(sequence_parallel_problems(SPEC, odd)[0])
    problems = sequence_parallel_problems(SPEC, Plan(sp_degree=2, **LORA), gpus=3)
    assert problems and problems[0].where == "--sp-degree" and "--gpus 3" in str(problems[0])
    assert sequence_parallel_problems(SPEC, Plan(sp_degree=2, sp_backend="ring", **LORA), gpus=4) == []
    with pytest.raises(AdvisorInputError, match="--sp-degree"):
        Plan(sp_degree=0).validate()


def test_step_time_counts_the_exchange_and_the_whole_sequence_attention():
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.speed.throughput import predict_throughput

    model, gpu = resolve_model("qwen7b"), resolve_gpu("a100-80gb")
    plan = Plan(method="full", seq_len=32768, sp_degree=4, attn_impl="flash_attention_2", gradient_checkpointing=True)
    sp = predict_throughput(model, plan, gpu, 4, "zero3")
    shard = predict_throughput(model, rank_plan(plan), gpu, 4, "zero3")
    assert sp.terms["sequence_parallel"] > 0 and shard.terms["sequence_parallel"] == 0
    assert sp.terms["attention"] == pytest.approx(4 * shard.terms["attention"], rel=0.2)
    ring = predict_throughput(model, plan.with_(sp_backend="ring"), gpu, 4, "zero3")
    assert ring.terms["sequence_parallel"] > 0


@pytest.mark.slow
def test_estimate_answers_a_sequence_parallel_run(capsys):
    args = ["estimate", "--model", "qwen7b", "--gpu", "a100-80gb", "--gpus", "4", "--method", "full", "--sharding",
            "zero3", "--attn-impl", "flash_attention_2", "--packing", "--seq-len", "16384", "--json"]
    assert main(args + ["--sp-degree", "4"]) == 0
    sp = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    assert sp["plan"]["sp_degree"] == 4 and sp["peak_bytes"] < whole["peak_bytes"]
    assert sp["step_terms"]["sequence_parallel"] > 0
    assert main(args + ["--sp-degree", "3"]) != 0
    assert "--sp-degree" in capsys.readouterr().err


ULYSSES = Plan(method="full", seq_len=16384, sp_degree=4, attn_impl="flash_attention_2", packing=True,
               gradient_checkpointing=True)
RING_FSDP = Plan(method="lora", seq_len=16384, sp_degree=4, sp_backend="ring", gradient_checkpointing=True)
RING_FA2 = RING_FSDP.with_(attn_impl="flash_attention_2")


def _exported(plan: Plan, sharding: str, out):
    from advisor.configs.export import export_plan
    from advisor.core.catalog import resolve_model

    return export_plan(resolve_model("qwen7b"), plan, out, gpus=4, sharding=sharding)


@pytest.mark.parametrize("plan,sharding,formats", [
    (ULYSSES, "zero3", {"advisor", "trl"}),      # axolotl's context parallelism is ring only; LLaMA-Factory has none
    (RING_FSDP, "fsdp", {"advisor", "trl"}),     # torch context parallel: FSDP2 and sdpa
    (RING_FA2, "zero3", {"axolotl"}),            # ring-flash-attn: flash_attention_2
], ids=["ulysses", "ring-fsdp", "ring-fa2"])
def test_exports_write_sequence_parallelism_and_read_it_back(plan, sharding, formats, tmp_path):
    from advisor.configs.read import read_config

    written = _exported(plan, sharding, tmp_path)
    assert formats <= set(written) and not ({"advisor", "axolotl", "llamafactory", "trl"} - formats) & set(written)
    assert "llamafactory" in written.skipped
    for fmt in formats:
        _, back, _ = read_config(written[fmt])
        assert (back.sp_degree, back.sp_backend) == (plan.sp_degree, plan.sp_backend), fmt


def test_trl_script_builds_accelerates_parallelism_config(tmp_path):
    """long_context_setup.py (beside train.py and train_trl.py) builds accelerate's own ParallelismConfig (the Trainer
    shards batches by it), and trl.yaml otherwise parses with TRL's parser (the sequence_parallel mapping is the
    script's, as vision is)."""
    import importlib.util

    import yaml
    from accelerate import ParallelismConfig
    from trl import ModelConfig, SFTConfig, TrlParser

    written = _exported(ULYSSES, "zero3", tmp_path)
    cfg = yaml.safe_load(written["trl"].read_text())
    sp = cfg.pop("sequence_parallel")
    assert "import long_context_setup" in (tmp_path / "train_trl.py").read_text()
    assert "import long_context_setup" in (tmp_path / "train.py").read_text()
    spec = importlib.util.spec_from_file_location("long_context_setup", tmp_path / "long_context_setup.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    pc = script.parallelism_config(sp, cfg["attn_implementation"])
    assert isinstance(pc, ParallelismConfig) and pc.sp_size == 4 and pc.sp_backend == "deepspeed"
    assert pc.sp_handler.sp_attn_implementation == "flash_attention_2"
    ring = script.parallelism_config({"size": 4, "backend": "ring"}, "sdpa")
    assert ring.cp_size == 4 and ring.cp_backend == "torch"
    rest = tmp_path / "rest.yaml"
    rest.write_text(yaml.safe_dump(cfg))
    sft, _ = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        args=["--config", str(rest), "--output_dir", str(tmp_path / "out"), "--use_cpu", "True"])
    assert sft.max_length == ULYSSES.seq_len


@pytest.mark.timeout(900)
def test_axolotl_validator_takes_its_ring_attention_keys(tmp_path):
    """axolotl 0.19's validate_config passes the exported context_parallel_size (flash_attention_2, micro-batch 1)
    up to importing ring-flash-attn, which needs a CUDA build of flash-attn this machine has none of."""
    import subprocess

    from test_export_thirdparty import AXOLOTL_CHECK, _env, _python

    python = _python("ADVISOR_AXOLOTL_PYTHON", "axolotl.utils.config")
    written = _exported(RING_FA2, "zero3", tmp_path)
    proc = subprocess.run([python, "-c", AXOLOTL_CHECK, f"{written['axolotl']}:4"], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 or "ring_flash_attn is not installed" in proc.stderr, proc.stderr[-3000:]
    bad = _exported(RING_FA2.with_(attn_impl="sdpa"), "zero3", tmp_path / "sdpa")
    assert "axolotl" not in bad and "flash_attention_2" in bad.skipped["axolotl"]
