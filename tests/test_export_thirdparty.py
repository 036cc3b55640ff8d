"""axolotl and LLaMA-Factory exports against those tools.

Always: every key we write is a documented field (tests/data/*_fields.txt, extracted from the
tools' own schemas, sources cited in the files).

With the tools' environments: each export is loaded by the tool's own parser and validator, in a child process
of a virtual environment holding the tool (neither is a dependency of vram-advisor; both pin their own
libraries). ``.ci/thirdparty-envs.sh`` builds them (axolotl 0.19.0, LLaMA-Factory 0.9.5, each with
``--no-deps`` and what its config parsing imports) and prints ADVISOR_AXOLOTL_PYTHON and
ADVISOR_LLAMAFACTORY_PYTHON, the interpreters these tests run:

    eval "$(bash .ci/thirdparty-envs.sh)" && pytest tests/test_export_thirdparty.py

- axolotl: ``axolotl.utils.config.validate_config`` with the target GPU's capabilities, as ``axolotl train``'s
  ``load_cfg`` calls it after ``prepare_plugins`` (what it leaves out needs the model's config from the hub).
- LLaMA-Factory: ``llamafactory.hparams.parser.get_train_args``, what ``llamafactory-cli train`` runs before any
  model is loaded, in a one-process torch.distributed launch (as torchrun sets it up; LLaMA-Factory refuses
  anything else), with the target GPU's bf16 support.

Under CI (``CI`` set) a missing environment fails the test instead of skipping it.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from advisor.core.catalog import resolve_model
from advisor.core.vision_tokens import sequence_tokens
from advisor.configs._llamafactory import LF_GALORE_OPTIM
from advisor.configs.export import export_plan
from advisor.core.plan import Plan

DATA = Path(__file__).parent / "data"

PLANS = [
    ("qwen7b", Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit", grad_accum=8,
                    gradient_checkpointing=True), 1),
    ("qwen7b", Plan(method="qlora", quantization="fp4", precision="fp16", compute_dtype="fp16",
                    lora_targets="all-linear", offload="zero2_cpu", loss="chunked", attn_impl="flash_attention_2"), 1),
    ("qwen7b", Plan(method="lora", quantization="int8", lora_r=8, lora_alpha=16.0, optimizer="adamw_8bit",
                    attn_impl="eager", lora_dropout=0.0), 1),
    ("qwen7b", Plan(method="full", precision="bf16", optimizer="adafactor", micro_batch=4, seq_len=2048), 1),
    ("qwen7b", Plan(method="full", precision="mixed_bf16", offload="zero3_cpu", gradient_checkpointing=True), 1),
    # Liger's fused linear loss, DoRA, packed documents
    ("qwen7b", Plan(method="lora", lora_targets="all-linear", dora=True, packing=True, loss="fused-linear"), 1),
    ("qwen7b", Plan(method="lora", eval_batch=4), 1),  # the eval batch the plan's run peak was decided with
    # the optimizers with their own keys (GaLore, APOLLO: optim_target_modules / optim_args, LLaMA-Factory's use_*)
    ("qwen7b", Plan(method="full", precision="bf16", optimizer="galore_adamw_8bit", gradient_checkpointing=True), 1),
    ("qwen7b", Plan(method="full", precision="bf16", optimizer="apollo_adamw"), 1),
    ("qwen7b", Plan(method="full", precision="bf16", optimizer="adalomo"), 1),
    ("qwen7b", Plan(method="qlora", quantization="nf4", loss="fused-linear", packing=True,
                    expandable_segments=True), 1),
    # activation offload without checkpointing (axolotl refuses: its validator requires checkpointing)
    ("gemma-3-12b", Plan(method="lora", activation_offload=True), 1),
    # checkpoint offload at long length (axolotl activation_offloading: hidden_states, LLaMA-Factory use_unsloth_gc)
    ("qwen7b", Plan(method="lora", gradient_checkpointing=True, activation_offload=True, seq_len=32768,
                    loss="fused-linear"), 1),
    # tiled MLP at long length (axolotl tiled_mlp with ALST's tiled_mlp_num_shards; LLaMA-Factory has no key)
    ("qwen7b", Plan(method="lora", gradient_checkpointing=True, tiled_mlp=True, seq_len=32768, loss="fused-linear"), 1),
    # vision-language: the multimodal keys, LoRA on the language model alone, the tower and projector frozen
    ("qwen2.5-vl-7b", Plan(method="qlora", quantization="nf4", image_sizes=("1280x720",), gradient_checkpointing=True),
     1),
    ("gemma-3-12b-it", Plan(method="full", precision="bf16", image_sizes=("1024x768",), optimizer="adamw_8bit"), 1),
    # several GPUs: ZeRO-3 sharding and DDP
    # RoPE scaling past the trained context (32,768): LLaMA-Factory's factor is ceil(cutoff_len / 32,768)
    ("qwen7b", Plan(method="lora", gradient_checkpointing=True, seq_len=65536, rope_scaling="yarn:2"), 1),
    ("qwen7b", Plan(method="lora", gradient_checkpointing=True, seq_len=98304, rope_scaling="linear:3"), 1),
    ("meta-llama/Llama-3.1-70B-Instruct", Plan(method="lora", gradient_checkpointing=True), 8),
    ("qwen7b", Plan(method="qlora", quantization="nf4", gradient_checkpointing=True), 8),
]
"""(model, plan, GPUs): each exported with sharding zero3 (DDP for the last: the --sharding ddp plan)."""
SHARDING = {len(PLANS) - 1: "ddp"}


def _fields(name: str) -> set[str]:
    lines = (DATA / name).read_text().splitlines()
    out = {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}
    if name == "axolotl_fields.txt":
        out |= _fields("axolotl_liger_fields.txt")  # the Liger plugin's own arguments
    return out


def _export(fmt: str, tmp_path: Path) -> list[tuple[Plan, int, Path, int]]:
    """(plan, GPUs, the file, the sequence cap it must hold: a vision-language sample's image tokens beside its text)
    of each plan ``fmt`` can express."""
    out = []
    for i, (model, plan, gpus) in enumerate(PLANS):
        spec = resolve_model(model)
        written = export_plan(spec, plan, tmp_path / str(i), gpus=gpus, sharding=SHARDING.get(i, "zero3"))
        if fmt in written:
            out.append((plan, gpus, written[fmt], sequence_tokens(spec, plan)))
    return out


@pytest.mark.parametrize("fmt,fields_file", [("axolotl", "axolotl_fields.txt"),
                                             ("llamafactory", "llamafactory_fields.txt")])
def test_every_key_is_a_documented_field(fmt, fields_file, tmp_path):
    documented = _fields(fields_file)
    assert len(documented) > 300  # the whole list, not a hand-picked subset
    files = _export(fmt, tmp_path)
    assert len(files) >= 4
    for _, _, path, _ in files:
        keys = set(yaml.safe_load(path.read_text()))
        assert keys <= documented, (path.name, sorted(keys - documented))


def _python(var: str, module: str) -> str:
    """The interpreter of a tool's environment (``var``), which must import ``module``; skips where it is not set,
    except under CI."""
    python = os.environ.get(var)
    if not python:
        if os.environ.get("CI"):
            pytest.fail(f"{var} is not set: .ci/run builds it with .ci/thirdparty-envs.sh")
        pytest.skip(f"{var} is not set (see the module docstring: .ci/thirdparty-envs.sh)")
    probe = subprocess.run([python, "-c", f"import {module}"], env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0, f"{python} cannot import {module}: {probe.stderr[-2000:]}"
    return python


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tool's own packages, not ours
    return dict(env, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                DO_NOT_TRACK="1", AXOLOTL_DO_NOT_TRACK="1", **extra)


AXOLOTL_CHECK = textwrap.dedent("""
    import json, sys, yaml
    import torch
    from axolotl.utils.config import prepare_plugins, validate_config
    from axolotl.utils.dict import DictDefault
    out = []
    for arg in sys.argv[1:]:
        path, gpus = arg.rsplit(":", 1)
        cfg = DictDefault(yaml.safe_load(open(path)))
        cfg.axolotl_config_path = path
        prepare_plugins(cfg)
        # the target GPU (an H100: bf16, sm_90) and process count, as gpu_capabilities() reports them there
        caps = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": int(gpus), "compute_capability": "sm_90"}
        m = validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": torch.__version__.split("+")[0]})
        out.append({"adapter": m.adapter, "load_in_4bit": bool(m.load_in_4bit), "load_in_8bit": bool(m.load_in_8bit),
                    "lora_r": m.lora_r, "lora_alpha": m.lora_alpha, "sequence_len": m.sequence_len,
                    "micro_batch_size": m.micro_batch_size,
                    "gradient_accumulation_steps": m.gradient_accumulation_steps,
                    "optimizer": str(getattr(m.optimizer, "value", m.optimizer)), "bf16": m.bf16, "fp16": m.fp16,
                    "gradient_checkpointing": bool(m.gradient_checkpointing),
                    "activation_offloading": m.activation_offloading,
                    "attn_implementation": m.attn_implementation,
                    "chunked_cross_entropy": m.chunked_cross_entropy, "deepspeed": m.deepspeed,
                    "bnb_config_kwargs": m.bnb_config_kwargs, "lora_target_linear": m.lora_target_linear,
                    "lora_target_modules": m.lora_target_modules, "processor_type": m.processor_type,
                    "freeze_mm_modules": bool(m.freeze_mm_modules), "chat_template": str(m.chat_template or ""),
                    "kernels": sorted(k for k in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel",
                                                  "lora_embedding_kernel") if m.get(k))})
    print("RESULT " + json.dumps(out))
""")

LLAMAFACTORY_CHECK = textwrap.dedent("""
    import json, os, sys, yaml
    import torch
    from llamafactory.hparams import parser
    if not torch.cuda.is_available():
        parser.is_torch_bf16_gpu_available = lambda: True  # the target GPU's (pure_bf16 is refused without it)
    out = []
    for arg in sys.argv[1:]:
        path, gpus = arg.rsplit(":", 1)
        cfg = yaml.safe_load(open(path))
        if not torch.cuda.is_available():
            cfg["use_cpu"] = True  # transformers refuses bf16 without a GPU otherwise
        m, d, t, f, g = parser.get_train_args(cfg)
        out.append({"quantization_bit": m.quantization_bit, "quantization_type": m.quantization_type,
                    "double_quantization": m.double_quantization, "flash_attn": str(m.flash_attn),
                    "disable_gradient_checkpointing": m.disable_gradient_checkpointing,
                    "finetuning_type": f.finetuning_type, "lora_rank": f.lora_rank, "lora_alpha": f.lora_alpha,
                    "lora_target": f.lora_target, "pure_bf16": f.pure_bf16, "cutoff_len": d.cutoff_len,
                    "per_device_train_batch_size": t.per_device_train_batch_size,
                    "gradient_accumulation_steps": t.gradient_accumulation_steps, "optim": str(t.optim.value),
                    "bf16": t.bf16, "fp16": t.fp16, "deepspeed": bool(t.deepspeed),
                    "enable_liger_kernel": m.enable_liger_kernel, "use_unsloth_gc": m.use_unsloth_gc,
                    "rope_scaling": getattr(m.rope_scaling, "value", m.rope_scaling)})
    print("RESULT " + json.dumps(out))
""")


def _run(python: str, script: str, env: dict, files: list[tuple[Plan, int, Path]], cwd: Path) -> list[dict]:
    """Each file checked from ``cwd``, a directory that is not the export's (the paths in it must resolve)."""
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([python, "-c", script, *(f"{p}:{g}" for _, g, p, _ in files)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.timeout(900)  # a child Python importing torch and the tool: about 40 s alone on 2 cores
def test_axolotl_parser_accepts_the_exports(tmp_path):
    python = _python("ADVISOR_AXOLOTL_PYTHON", "axolotl.utils.config")
    files = _export("axolotl", tmp_path)
    assert len(files) == len(PLANS) - 2  # mixed_bf16 and activation offload without checkpointing: refused
    results = _run(python, AXOLOTL_CHECK, _env(), files, tmp_path / "elsewhere")
    assert len(results) == len(files)
    for (plan, _, _, cap), got in zip(files, results):
        vision = bool(plan.image_sizes)
        assert (got["processor_type"] == "AutoProcessor") == vision and got["freeze_mm_modules"] == vision
        if vision and plan.peft:  # a regex on the language model: no tower linear matches it
            assert got["lora_target_modules"].startswith("model\\.(?:language_model|text_model)\\.")
        assert got["adapter"] == (plan.method if plan.peft else None)
        assert got["load_in_4bit"] == plan.four_bit and got["load_in_8bit"] == (plan.quantization == "int8")
        assert got["sequence_len"] == cap and got["micro_batch_size"] == plan.micro_batch
        assert got["gradient_accumulation_steps"] == plan.grad_accum and got["optimizer"] == plan.optimizer
        assert got["bf16"] == (plan.precision == "bf16") and got["fp16"] == (plan.precision == "fp16")
        assert got["gradient_checkpointing"] == plan.gradient_checkpointing
        assert (got["activation_offloading"] == "hidden_states") == plan.activation_offload  # checkpoint offload
        assert got["attn_implementation"] == plan.attn_impl
        assert bool(got["chunked_cross_entropy"]) == plan.chunked_ce
        if plan.peft:
            assert got["lora_r"] == plan.lora_r and got["lora_alpha"] == plan.lora_alpha
            assert bool(got["lora_target_linear"]) == (plan.lora_targets == "all-linear")
            # beyond the plan: axolotl turns its LoRA kernels on where the file does not say (docs/exports.md)
            assert not got["kernels"] or set(got["kernels"]) <= set(_documented_extras("axolotl"))
        if plan.four_bit:
            assert got["bnb_config_kwargs"]["bnb_4bit_quant_type"] == plan.quantization
    zero = [got for (plan, gpus, _, _), got in zip(files, results) if plan.offload != "none" or gpus > 1]
    assert sum(bool(got["deepspeed"]) for got in zero) == 2  # the offload plan and the ZeRO-3 one; DDP has none


def _documented_extras(tool: str) -> list[str]:
    """The keys docs/exports.md lists as what ``tool`` turns on beyond the plan."""
    text = (Path(__file__).parents[1] / "docs" / "exports.md").read_text()
    return [k for k in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
            if f"`{k}`" in text] if tool == "axolotl" else []


@pytest.mark.timeout(900)
def test_llamafactory_parser_accepts_the_exports(tmp_path):
    python = _python("ADVISOR_LLAMAFACTORY_PYTHON", "llamafactory.hparams.parser")
    files = _export("llamafactory", tmp_path)
    # the chunked loss, offload without checkpointing and the tiled MLP have no LLaMA-Factory key: refused
    assert len(files) == len(PLANS) - 3
    # one process of a torch.distributed launch, as torchrun sets it up (FORCE_TORCHRUN=1 in the exported command)
    env = _env(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000), DISABLE_VERSION_CHECK="0")
    results = _run(python, LLAMAFACTORY_CHECK, env, files, tmp_path / "elsewhere")
    for (plan, gpus, _, cap), got in zip(files, results):
        assert got["finetuning_type"] == ("lora" if plan.peft else "full")
        assert got["quantization_bit"] == {"none": None, "int8": 8, "nf4": 4, "fp4": 4}[plan.quantization]
        if plan.four_bit:
            assert got["quantization_type"] == plan.quantization
            assert got["double_quantization"] == plan.double_quant
        assert got["flash_attn"] == {"sdpa": "sdpa", "eager": "disabled", "flash_attention_2": "fa2"}[plan.attn_impl]
        assert got["disable_gradient_checkpointing"] == (not plan.gradient_checkpointing)
        # beyond the plan: with packing LLaMA-Factory cuts one token off cutoff_len (docs/exports.md)
        assert got["cutoff_len"] == cap - plan.packing
        # GaLore / APOLLO: LLaMA-Factory's use_galore / use_apollo over its base optimizer
        assert got["optim"] == {**LF_GALORE_OPTIM, "apollo_adamw": "adamw_torch"}.get(plan.optimizer, plan.optimizer)
        assert got["per_device_train_batch_size"] == plan.micro_batch
        assert got["gradient_accumulation_steps"] == plan.grad_accum
        assert got["bf16"] == (plan.activation_dtype == "bf16") and got["fp16"] == (plan.activation_dtype == "fp16")
        assert got["enable_liger_kernel"] == (plan.loss == "fused-linear")
        assert got["use_unsloth_gc"] == plan.activation_offload  # checkpoint offload (the others are refused)
        # --rope-scaling: the type; LLaMA-Factory's factor, ceil(cutoff_len / max_position_embeddings), is the plan's
        assert got["rope_scaling"] == (None if plan.rope_scaling == "none" else plan.rope_scaling.split(":")[0])
        if plan.peft:
            assert got["lora_rank"] == plan.lora_r and got["lora_alpha"] == plan.lora_alpha
    assert [got["deepspeed"] for got in results] == [
        plan.offload != "none" or (gpus > 1 and i != len(files) - 1) for i, (plan, gpus, _, _) in enumerate(files)]
