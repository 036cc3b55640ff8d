"""GRPO/DPO exports: trl.yaml loaded by TRL itself into a real GRPOConfig / DPOConfig and ModelConfig (TrlParser, and
the classes built from the file's keys), each plan setting at the field TRL reads it from, the scripts compiled, the
refusals of what a format cannot say, the files read back into the same plan, and train_grpo.py / train_dpo.py each
running one real TRL step on the CPU with a tiny model built here (tests/conftest.py tiny_model; nothing
downloaded)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import py_compile
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("trl")

from advisor.configs.export import ExportContext, Unsupported, export_plan  # noqa: E402
from advisor.configs._trl import trl_config  # noqa: E402
from export_runs import run_export_script  # noqa: E402 (tests/export_runs.py)
from advisor.configs.read import read_config  # noqa: E402
from advisor.core.errors import ConfigErrors  # noqa: E402
from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.knobs import Unkeyed, knobs  # noqa: E402
from advisor.core.plan import Plan, canonical  # noqa: E402

GRPO_PLANS = {
    "qlora-vllm-sleep": Plan(task="grpo", method="qlora", quantization="nf4", gradient_checkpointing=True,
                             micro_batch=8, num_generations=8, max_prompt_length=256, max_completion_length=256,
                             generation="vllm-colocate", vllm_gpu_memory_utilization=0.35, vllm_sleep=2),
    "lora-generate-beta": Plan(task="grpo", method="lora", micro_batch=4, grad_accum=2, steps_per_generation=4,
                               num_generations=4, max_prompt_length=128, max_completion_length=512, beta=0.04),
    "full-server": Plan(task="grpo", method="full", precision="bf16", micro_batch=8, num_generations=8,
                        generation="vllm-server", vllm_gpus=2, beta=0.02, reference="copy"),
}
DPO_PLANS = {
    "lora": Plan(task="dpo", method="lora", lora_r=8, lora_targets="all-linear", seq_len=2048,
                 gradient_checkpointing=True),
    "qlora-precomputed": Plan(task="dpo", method="qlora", quantization="nf4", reference="precomputed", beta=0.2,
                              seq_len=1024, micro_batch=2),
    "full-padding-free": Plan(task="dpo", method="full", precision="bf16", attn_impl="flash_attention_2",
                              padding_free=True, seq_len=4096, activation_offload=True, reference="copy"),
}


@pytest.fixture(scope="module")
def qwen7b():
    return resolve_model("qwen7b")


def _split(cfg: dict, config_class) -> tuple[dict, dict]:
    from trl import ModelConfig

    train_fields = {f.name for f in dataclasses.fields(config_class)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = [k for k in cfg if k not in train_fields | model_fields]
    assert not unknown, f"keys neither {config_class.__name__} nor ModelConfig has: {unknown}"
    return ({k: v for k, v in cfg.items() if k in train_fields and k not in model_fields},
            {k: v for k, v in cfg.items() if k in model_fields})


@pytest.mark.parametrize("name", sorted(GRPO_PLANS))
def test_grpo_trl_yaml_is_a_grpoconfig(name, qwen7b, tmp_path):
    from trl import GRPOConfig, ModelConfig, TrlParser

    plan = GRPO_PLANS[name].validate()
    written = export_plan(qwen7b, plan, tmp_path, ["trl"])
    cfg = yaml.safe_load(written["trl"].read_text())
    train, model_kw = _split(cfg, GRPOConfig)
    g = GRPOConfig(**train, use_cpu=True)  # built from the file's keys, as the script does
    ModelConfig(**model_kw)
    parsed, model = TrlParser((GRPOConfig, ModelConfig)).parse_args_and_config(
        args=["--config", str(written["trl"]), "--output_dir", str(tmp_path / "out"), "--use_cpu", "True"])
    for args in (g, parsed):
        assert args.num_generations == plan.num_generations
        assert args.max_completion_length == plan.max_completion_length
        assert args.per_device_train_batch_size == plan.micro_batch
        assert args.gradient_accumulation_steps == plan.grad_accum
        assert args.steps_per_generation == (plan.steps_per_generation or plan.grad_accum)  # TRL's None: grad_accum
        assert args.beta == (plan.beta or 0.0)
        assert args.use_vllm == (plan.generation != "transformers")
        assert args.gradient_checkpointing == plan.gradient_checkpointing and args.optim == plan.optimizer
    if plan.generation == "vllm-colocate":
        assert g.vllm_mode == "colocate" and g.vllm_gpu_memory_utilization == plan.vllm_gpu_memory_utilization
        assert g.vllm_enable_sleep_mode == (plan.vllm_sleep == 2)
        assert g.vllm_max_model_length == plan.max_prompt_length + plan.max_completion_length
    if plan.generation == "vllm-server":
        assert g.vllm_mode == "server"
        assert f"--tensor-parallel-size {plan.vllm_gpus}" in written["trl"].read_text()
    assert model.use_peft == plan.peft and model.load_in_4bit == plan.four_bit
    assert "max_length" not in cfg and "dataset_text_field" not in cfg  # GRPOConfig has none; SFT's data key
    script = tmp_path / "train_grpo.py"
    py_compile.compile(str(script), doraise=True)
    assert "FILL IN" in script.read_text() and "FILL IN" in written["trl"].read_text()
    assert f"--max-prompt-length {plan.max_prompt_length}" in written["trl"].read_text()
    assert not (tmp_path / "train_trl.py").exists()


@pytest.mark.parametrize("name", sorted(DPO_PLANS))
def test_dpo_trl_yaml_is_a_dpoconfig(name, qwen7b, tmp_path):
    from trl import DPOConfig, ModelConfig, TrlParser

    plan = DPO_PLANS[name].validate()
    written = export_plan(qwen7b, plan, tmp_path, ["trl"])
    cfg = yaml.safe_load(written["trl"].read_text())
    train, model_kw = _split(cfg, DPOConfig)
    d = DPOConfig(**train, use_cpu=True)
    ModelConfig(**model_kw)
    parsed, _ = TrlParser((DPOConfig, ModelConfig)).parse_args_and_config(
        args=["--config", str(written["trl"]), "--output_dir", str(tmp_path / "out"), "--use_cpu", "True"])
    for args in (d, parsed):
        assert args.max_length == plan.seq_len and args.beta == (plan.beta or 0.1)
        assert args.precompute_ref_log_probs == (plan.reference == "precomputed")
        assert args.padding_free == plan.padding_free
        assert args.per_device_train_batch_size == plan.micro_batch
        assert args.activation_offloading == (plan.activation_offload and not plan.gradient_checkpointing)
    py_compile.compile(str(tmp_path / "train_dpo.py"), doraise=True)


@pytest.mark.parametrize("name", sorted(GRPO_PLANS) + sorted(DPO_PLANS))
def test_rl_trl_yaml_reads_back_the_plan(name, qwen7b, tmp_path):
    plan = canonical({**GRPO_PLANS, **DPO_PLANS}[name].validate())
    written = export_plan(qwen7b, plan, tmp_path, ["trl"])
    _, read, extras = read_config(written["trl"])
    assert extras["format"] == "trl"
    mine, theirs = plan.to_dict(), read.to_dict()
    unkeyed = {k.name for k in knobs(Plan) if isinstance(k.keys.get("trl"), Unkeyed)}  # vllm_gpus: the server's
    assert {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k] and k not in unkeyed} == {}
    if plan.task == "grpo" and plan.generation != "vllm-colocate":
        assert "max_prompt_length" in extras["defaulted"]  # the prompts are the dataset's: nothing in the file


def test_the_trl_format_refuses_what_trl_cannot_say(qwen7b):
    sleep1 = Plan(task="grpo", method="lora", generation="vllm-colocate", vllm_sleep=1)
    with pytest.raises(Unsupported, match="level 2 only"):
        trl_config(ExportContext(qwen7b, sleep1.validate()))
    copy = Plan(task="dpo", method="lora", reference="copy")
    with pytest.raises(Unsupported, match="reference"):
        trl_config(ExportContext(qwen7b, copy.validate()))
    offload = Plan(task="grpo", method="lora", activation_offload=True)
    with pytest.raises(Unsupported, match="activation_offloading"):
        trl_config(ExportContext(qwen7b, offload.validate()))


def test_sft_only_formats_skip_an_rl_plan_with_a_reason(qwen7b, tmp_path):
    result = export_plan(qwen7b, GRPO_PLANS["qlora-vllm-sleep"], tmp_path)
    assert "trl" in result and "train" not in result and "advisor" not in result
    assert "supervised fine-tuning only" in result.skipped["train"]
    assert "supervised fine-tuning only" in result.skipped["advisor"]
    assert not (tmp_path / "train.py").exists()
    with pytest.raises(ConfigErrors, match="--format train"):
        export_plan(qwen7b, DPO_PLANS["lora"], tmp_path / "x", ["train"])


@pytest.mark.slow
def test_train_grpo_runs_one_grpotrainer_step_on_cpu(tiny_model, qwen7b, tmp_path):
    plan = Plan(task="grpo", method="lora", micro_batch=4, num_generations=4, max_prompt_length=16,
                max_completion_length=8, generation="vllm-colocate", vllm_sleep=2, beta=0.04)
    export_plan(qwen7b, plan, tmp_path / "export", ["trl"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in
                                 ["the quick brown fox", "weights gradients", "fine tune a small model",
                                  "low rank adapters on quantized base weights " * 8]) + "\n")
    script = tmp_path / "export" / "train_grpo.py"
    common = ["--data", str(prompts), "--max-steps", "1", "--model-path", str(tiny_model), "--max-prompt-length",
              "16", "--output-dir", str(tmp_path / "ckpt"), "--no-save"]
    proc, s = run_export_script(script, *common)  # the reward is the user's: unwritten, the script stops and says where
    assert proc.returncode != 0 and "reward_function" in proc.stderr + proc.stdout
    proc, s = run_export_script(script, *common, "--placeholder-reward")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"])
    assert s["num_generations"] == 4 and s["max_completion_length"] == 8 and s["beta"] == 0.04
    assert s["use_vllm"] is False and "instead of vLLM" in proc.stdout  # no GPU: generate()
    assert s["prompts"] == 3 and "dropped 1 of 4 prompts" in proc.stdout  # the long prompt is over the plan's 16
    assert s["lora_modules"] == 2 * 4 and s["reference_model"] is False  # PEFT: the adapter disabled, no copy


@pytest.mark.slow
def test_train_dpo_runs_one_dpotrainer_step_on_cpu(tiny_model, qwen7b, tmp_path):
    plan = Plan(task="dpo", method="lora", micro_batch=2, seq_len=32)
    export_plan(qwen7b, plan, tmp_path / "export", ["trl"])
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) for p, c, r in
                               [("the quick", " brown fox", " lazy dog"), ("weights", " gradients", " the cpu"),
                                ("fine tune", " a small model", " quantized base")]) + "\n")
    proc, s = run_export_script(tmp_path / "export" / "train_dpo.py", "--data", str(pairs), "--max-steps", "1",
                   "--model-path", str(tiny_model), "--output-dir", str(tmp_path / "ckpt"), "--no-save")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"]) and s["train_loss"] > 0
    assert s["max_length"] == 32 and s["beta"] == 0.1 and s["precompute_ref_log_probs"] is False
    assert s["lora_modules"] == 2 * 4 and s["reference_model"] is False


# --------------------------------------------------------------------------- axolotl rl:, LLaMA-Factory stage: dpo

THIRDPARTY = [("grpo", GRPO_PLANS["qlora-vllm-sleep"]), ("grpo", GRPO_PLANS["lora-generate-beta"]),
              ("dpo", DPO_PLANS["lora"]), ("dpo", DPO_PLANS["qlora-precomputed"])]


def _tool_python(var: str, module: str) -> str:
    python = os.environ.get(var)
    if not python:
        if os.environ.get("CI"):
            pytest.fail(f"{var} is not set: .ci/run builds it with .ci/thirdparty-envs.sh")
        pytest.skip(f"{var} is not set (eval \"$(bash .ci/thirdparty-envs.sh)\")")
    return python


def _tool_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tool's own packages, not ours
    return dict(env, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                DO_NOT_TRACK="1", AXOLOTL_DO_NOT_TRACK="1", **extra)


def _toolrun_export_script(python: str, script: str, env: dict, paths: list[Path], cwd: Path) -> list[dict]:
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([python, "-c", script, *map(str, paths)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_axolotl_and_llamafactory_write_what_they_can_say(qwen7b, tmp_path):
    documented = {fmt: {ln.strip() for ln in (Path(__file__).parent / "data" / f"{fmt}_fields.txt").read_text()
                        .splitlines() if ln.strip() and not ln.startswith("#")} for fmt in ("axolotl", "llamafactory")}
    documented["axolotl"] |= {ln.strip() for ln in (Path(__file__).parent / "data" / "axolotl_liger_fields.txt")
                              .read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    for i, (task, plan) in enumerate(THIRDPARTY):
        written = export_plan(qwen7b, plan, tmp_path / str(i))
        ax = yaml.safe_load(written["axolotl"].read_text())
        assert ax["rl"] == task and set(ax) <= documented["axolotl"]
        assert ax["trl"]["beta"] == float(plan.beta if plan.beta is not None else {"grpo": 0.0, "dpo": 0.1}[task])
        if task == "grpo":
            assert "llamafactory" not in written and "no GRPO stage" in written.skipped["llamafactory"]
            assert (tmp_path / str(i) / "axolotl_rewards.py").is_file()
            py_compile.compile(str(tmp_path / str(i) / "axolotl_rewards.py"), doraise=True)
        else:
            assert ax["sequence_len"] == plan.seq_len
            if plan.reference == "precomputed":
                assert ax["precompute_ref_log_probs"] is True
                assert "precomputed reference" in written.skipped["llamafactory"]
            else:
                lf = yaml.safe_load(written["llamafactory"].read_text())
                assert lf["stage"] == "dpo" and lf["pref_loss"] == "sigmoid" and set(lf) <= documented["llamafactory"]
        for fmt in ("axolotl", "llamafactory"):
            if fmt in written:
                _, read, _ = read_config(written[fmt])
                mine, theirs = canonical(plan.validate()).to_dict(), read.to_dict()
                assert {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]} == {}, fmt


AXOLOTL_RL_CHECK = """
import json, sys, yaml
import torch
from axolotl.utils.config import prepare_plugins, validate_config
from axolotl.utils.dict import DictDefault
out = []
for path in sys.argv[1:]:
    cfg = DictDefault(yaml.safe_load(open(path)))
    cfg.axolotl_config_path = path
    prepare_plugins(cfg)
    caps = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 1, "compute_capability": "sm_90"}
    m = validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": torch.__version__.split("+")[0]})
    trl, vllm = m.trl, m.vllm
    out.append({"rl": str(getattr(m.rl, "value", m.rl)), "sequence_len": m.sequence_len, "beta": trl.beta,
                "num_generations": trl.num_generations, "max_completion_length": trl.max_completion_length,
                "use_vllm": trl.use_vllm, "vllm_mode": trl.vllm_mode,
                "sleep": getattr(trl, "vllm_enable_sleep_mode", None),
                "gpu_memory_utilization": vllm.gpu_memory_utilization if vllm else None,
                "precompute_ref_log_probs": m.precompute_ref_log_probs, "micro_batch_size": m.micro_batch_size})
print("RESULT " + json.dumps(out))
"""

LLAMAFACTORY_DPO_CHECK = """
import json, sys, yaml
import torch
from llamafactory.hparams import parser
if not torch.cuda.is_available():
    parser.is_torch_bf16_gpu_available = lambda: True
out = []
for path in sys.argv[1:]:
    cfg = yaml.safe_load(open(path))
    if not torch.cuda.is_available():
        cfg["use_cpu"] = True
    m, d, t, f, g = parser.get_train_args(cfg)
    out.append({"stage": f.stage, "pref_beta": f.pref_beta, "pref_loss": f.pref_loss, "cutoff_len": d.cutoff_len,
                "finetuning_type": f.finetuning_type, "lora_rank": f.lora_rank})
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(900)
def test_axolotl_validates_the_rl_exports(qwen7b, tmp_path):
    python = _tool_python("ADVISOR_AXOLOTL_PYTHON", "axolotl.utils.config")
    paths = [export_plan(qwen7b, plan, tmp_path / str(i), ["axolotl"])["axolotl"]
             for i, (_, plan) in enumerate(THIRDPARTY)]
    results = _toolrun_export_script(python, AXOLOTL_RL_CHECK, _tool_env(), paths, tmp_path / "elsewhere")
    for (task, plan), got in zip(THIRDPARTY, results):
        assert got["rl"] == task and got["micro_batch_size"] == plan.micro_batch
        assert got["beta"] == (plan.beta if plan.beta is not None else {"grpo": 0.0, "dpo": 0.1}[task])
        if task == "grpo":
            assert got["num_generations"] == plan.num_generations
            assert got["max_completion_length"] == plan.max_completion_length
            assert got["use_vllm"] == (plan.generation != "transformers")
            if plan.generation == "vllm-colocate":
                assert got["vllm_mode"] == "colocate" and got["sleep"] == (plan.vllm_sleep == 2)
                assert got["gpu_memory_utilization"] == plan.vllm_gpu_memory_utilization
        else:
            assert got["sequence_len"] == plan.seq_len
            assert bool(got["precompute_ref_log_probs"]) == (plan.reference == "precomputed")


@pytest.mark.timeout(900)
def test_llamafactory_parses_the_dpo_export(qwen7b, tmp_path):
    python = _tool_python("ADVISOR_LLAMAFACTORY_PYTHON", "llamafactory.hparams.parser")
    plan = DPO_PLANS["lora"]
    path = export_plan(qwen7b, plan, tmp_path, ["llamafactory"])["llamafactory"]
    env = _tool_env(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(29500 + os.getpid() % 1000), DISABLE_VERSION_CHECK="0")
    (got,) = _toolrun_export_script(python, LLAMAFACTORY_DPO_CHECK, env, [path], tmp_path / "elsewhere")
    assert got["stage"] == "dpo" and got["pref_loss"] == "sigmoid" and got["pref_beta"] == 0.1
    assert got["cutoff_len"] == plan.seq_len and got["finetuning_type"] == "lora" and got["lora_rank"] == plan.lora_r
    with pytest.raises(Unsupported, match="no GRPO stage"):
        export_plan(qwen7b, GRPO_PLANS["lora-generate-beta"], tmp_path / "g", ["llamafactory"])


@pytest.mark.slow  # a GRPOConfig / DPOConfig with its DeepSpeed config: 3 s each
@pytest.mark.parametrize("task", ["grpo", "dpo"])
def test_a_sharded_rl_exports_files_agree_on_the_learning_rate(task, qwen7b, tmp_path):
    """Issue 42: deepspeed.json's optimizer block said the SFT rate (2e-4) beside trl.yaml's and axolotl.yaml's
    1e-5; transformers' HfTrainerDeepSpeedConfig refuses the pair. One rate in every file (ZeRO on the GPUs writes no
    optimizer block at all), and the Trainer's check passes."""
    from trl import DPOConfig, GRPOConfig

    plan = (GRPO_PLANS["lora-generate-beta"] if task == "grpo" else DPO_PLANS["lora"]).validate()
    written = export_plan(qwen7b, plan, tmp_path, ["trl", "axolotl", "deepspeed"], gpus=2, sharding="zero3")
    ds = json.loads(written["deepspeed"].read_text())
    trl_cfg = yaml.safe_load(written["trl"].read_text())
    rates = {trl_cfg["learning_rate"], yaml.safe_load(written["axolotl"].read_text())["learning_rate"]}
    assert rates == {1e-5}
    assert "optimizer" not in ds  # ZeRO on the GPUs runs the planned optim, with the planned rate
    offloaded = export_plan(qwen7b, plan.with_(offload="zero3_cpu"), tmp_path / "offload", ["deepspeed"])
    assert json.loads(offloaded["deepspeed"].read_text())["optimizer"]["params"]["lr"] == 1e-5  # DeepSpeed's CPU Adam
    train, _ = _split(trl_cfg, GRPOConfig if task == "grpo" else DPOConfig)
    train.update(output_dir=str(tmp_path / "out"), deepspeed=str(written["deepspeed"]))
    args = (GRPOConfig if task == "grpo" else DPOConfig)(**train, use_cpu=True)
    assert args.hf_deepspeed_config.mismatches == []
