"""axolotl and LLaMA-Factory exports against those tools.

Always: every key we write is a documented field (tests/data/*_fields.txt, extracted from the
tools' own schemas, sources cited in the files).

When the tool is importable: its own parser accepts the file and reads back our values:
axolotl's pydantic ``AxolotlInputConfig``, LLaMA-Factory's HfArgumentParser over its argument
dataclasses (``llamafactory.hparams.parser._parse_train_args``, what ``llamafactory-cli train``
runs before any model is loaded). Neither is a dependency of vram-advisor (both pin their own
torch); install them without dependencies into a separate directory and point
ADVISOR_THIRDPARTY_PATH at it (os.pathsep-separated), e.g.

    pip install --no-deps --target /tmp/tp axolotl==0.19.0 llamafactory==0.9.5 pillow datasets \
        multiprocess dill xxhash pyarrow pandas fsspec omegaconf antlr4-python3-runtime ...
    ADVISOR_THIRDPARTY_PATH=/tmp/tp pytest tests/test_export_thirdparty.py

The parser runs in a subprocess so that these packages never enter the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from advisor.core.catalog import resolve_model
from advisor.configs.export import export_plan
from advisor.core.plan import Plan

DATA = Path(__file__).parent / "data"

PLANS = [
    Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit", grad_accum=8,
         gradient_checkpointing=True),
    Plan(method="qlora", quantization="fp4", precision="fp16", compute_dtype="fp16", lora_targets="all-linear",
         offload="zero2_cpu", loss="chunked", attn_impl="flash_attention_2"),
    Plan(method="lora", quantization="int8", lora_r=8, lora_alpha=16.0, optimizer="adamw_8bit", attn_impl="eager",
         lora_dropout=0.0),
    Plan(method="full", precision="bf16", optimizer="adafactor", micro_batch=4, seq_len=2048),
    Plan(method="full", precision="mixed_bf16", offload="zero3_cpu", gradient_checkpointing=True),  # LF only
    # issue 15's levers: Liger's fused linear loss, DoRA, packed documents
    Plan(method="lora", lora_targets="all-linear", dora=True, packing=True, loss="fused-linear"),
    Plan(method="lora", eval_batch=4),  # the eval batch the plan's run peak was decided with
]


def _fields(name: str) -> set[str]:
    lines = (DATA / name).read_text().splitlines()
    out = {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}
    if name == "axolotl_fields.txt":
        out |= _fields("axolotl_liger_fields.txt")  # the Liger plugin's own arguments
    return out


def _export(fmt: str, tmp_path: Path) -> list[tuple[Plan, Path]]:
    spec = resolve_model("qwen7b")
    out = []
    for i, plan in enumerate(PLANS):
        written = export_plan(spec, plan, tmp_path / str(i))
        if fmt in written:
            out.append((plan, written[fmt]))
    return out


@pytest.mark.parametrize("fmt,fields_file", [("axolotl", "axolotl_fields.txt"),
                                             ("llamafactory", "llamafactory_fields.txt")])
def test_every_key_is_a_documented_field(fmt, fields_file, tmp_path):
    documented = _fields(fields_file)
    assert len(documented) > 300  # the whole list, not a hand-picked subset
    files = _export(fmt, tmp_path)
    assert len(files) >= 4
    for _, path in files:
        keys = set(yaml.safe_load(path.read_text()))
        assert keys <= documented, (path.name, sorted(keys - documented))


def _python_with(module: str) -> dict | None:
    """Environment in which `import module` works in a child Python, or None."""
    env = dict(os.environ, DISABLE_VERSION_CHECK="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    extra = os.environ.get("ADVISOR_THIRDPARTY_PATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, timeout=300)
    return env if probe.returncode == 0 else None


AXOLOTL_CHECK = textwrap.dedent("""
    import json, sys, yaml
    from axolotl.utils.schemas.config import AxolotlInputConfig
    out = []
    for path in sys.argv[1:]:
        m = AxolotlInputConfig(**yaml.safe_load(open(path)))
        out.append({"adapter": m.adapter, "load_in_4bit": m.load_in_4bit, "load_in_8bit": m.load_in_8bit,
                    "lora_r": m.lora_r, "lora_alpha": m.lora_alpha, "sequence_len": m.sequence_len,
                    "micro_batch_size": m.micro_batch_size, "gradient_accumulation_steps": m.gradient_accumulation_steps,
                    "optimizer": str(getattr(m.optimizer, "value", m.optimizer)), "bf16": m.bf16, "fp16": m.fp16,
                    "gradient_checkpointing": m.gradient_checkpointing, "attn_implementation": m.attn_implementation,
                    "chunked_cross_entropy": m.chunked_cross_entropy, "deepspeed": m.deepspeed,
                    "bnb_config_kwargs": m.bnb_config_kwargs, "lora_target_linear": m.lora_target_linear})
    print("RESULT " + json.dumps(out))
""")

LLAMAFACTORY_CHECK = textwrap.dedent("""
    import json, os, sys, yaml
    from llamafactory.hparams.parser import _parse_train_args
    import torch
    out = []
    for path in sys.argv[1:]:
        cfg = yaml.safe_load(open(path))
        if cfg.get("deepspeed"):
            cfg["deepspeed"] = os.path.join(os.path.dirname(path), cfg["deepspeed"])
        if not torch.cuda.is_available():
            cfg["use_cpu"] = True  # transformers refuses bf16 without a GPU otherwise
        m, d, t, f, g = _parse_train_args(cfg)
        out.append({"quantization_bit": m.quantization_bit, "quantization_type": m.quantization_type,
                    "double_quantization": m.double_quantization, "flash_attn": str(m.flash_attn),
                    "disable_gradient_checkpointing": m.disable_gradient_checkpointing,
                    "finetuning_type": f.finetuning_type, "lora_rank": f.lora_rank, "lora_alpha": f.lora_alpha,
                    "lora_target": f.lora_target, "pure_bf16": f.pure_bf16, "cutoff_len": d.cutoff_len,
                    "per_device_train_batch_size": t.per_device_train_batch_size,
                    "gradient_accumulation_steps": t.gradient_accumulation_steps, "optim": str(t.optim.value),
                    "bf16": t.bf16, "fp16": t.fp16, "deepspeed": bool(t.deepspeed),
                    "enable_liger_kernel": m.enable_liger_kernel})
    print("RESULT " + json.dumps(out))
""")


def _run(script: str, env: dict, paths: list[Path]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", script, *map(str, paths)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_axolotl_parser_accepts_the_exports(tmp_path):
    env = _python_with("axolotl.utils.schemas.config")
    if env is None:
        pytest.skip("axolotl is not importable (set ADVISOR_THIRDPARTY_PATH, see the module docstring)")
    files = _export("axolotl", tmp_path)
    for (plan, _), got in zip(files, _run(AXOLOTL_CHECK, env, [p for _, p in files])):
        assert got["adapter"] == (plan.method if plan.peft else None)
        assert got["load_in_4bit"] == plan.four_bit and got["load_in_8bit"] == (plan.quantization == "int8")
        assert got["sequence_len"] == plan.seq_len and got["micro_batch_size"] == plan.micro_batch
        assert got["gradient_accumulation_steps"] == plan.grad_accum and got["optimizer"] == plan.optimizer
        assert got["bf16"] == (plan.precision == "bf16") and got["fp16"] == (plan.precision == "fp16")
        assert got["gradient_checkpointing"] == plan.gradient_checkpointing
        assert got["attn_implementation"] == plan.attn_impl
        assert bool(got["chunked_cross_entropy"]) == plan.chunked_ce
        assert bool(got["deepspeed"]) == (plan.offload != "none")
        if plan.peft:
            assert got["lora_r"] == plan.lora_r and got["lora_alpha"] == plan.lora_alpha
            assert bool(got["lora_target_linear"]) == (plan.lora_targets == "all-linear")
        if plan.four_bit:
            assert got["bnb_config_kwargs"]["bnb_4bit_quant_type"] == plan.quantization


def test_llamafactory_parser_accepts_the_exports(tmp_path):
    env = _python_with("llamafactory.hparams.parser")
    if env is None:
        pytest.skip("llamafactory is not importable (set ADVISOR_THIRDPARTY_PATH, see the module docstring)")
    files = _export("llamafactory", tmp_path)
    assert len(files) == len(PLANS)
    for (plan, _), got in zip(files, _run(LLAMAFACTORY_CHECK, env, [p for _, p in files])):
        assert got["finetuning_type"] == ("lora" if plan.peft else "full")
        assert got["quantization_bit"] == {"none": None, "int8": 8, "nf4": 4, "fp4": 4}[plan.quantization]
        if plan.four_bit:
            assert got["quantization_type"] == plan.quantization
            assert got["double_quantization"] == plan.double_quant
        assert got["flash_attn"] == {"sdpa": "sdpa", "eager": "disabled", "flash_attention_2": "fa2"}[plan.attn_impl]
        assert got["disable_gradient_checkpointing"] == (not plan.gradient_checkpointing)
        assert got["cutoff_len"] == plan.seq_len and got["optim"] == plan.optimizer
        assert got["per_device_train_batch_size"] == plan.micro_batch
        assert got["gradient_accumulation_steps"] == plan.grad_accum
        assert got["bf16"] == (plan.activation_dtype == "bf16") and got["fp16"] == (plan.activation_dtype == "fp16")
        assert got["deepspeed"] == (plan.offload != "none")
        assert got["enable_liger_kernel"] == plan.chunked_ce
        if plan.peft:
            assert got["lora_rank"] == plan.lora_r and got["lora_alpha"] == plan.lora_alpha
