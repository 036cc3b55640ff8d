"""RoPE scaling (--rope-scaling TYPE:FACTOR, issue 31): its parse and refusals, the ceiling of --seq-len max, the
real rope code in the simulation (equal to real CPU execution), and the ledger at real size."""

from __future__ import annotations

import json
import math

import pytest

from advisor.cli import main
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.core.rope import parse_rope_scaling, rope_parameters, scaled_context


@pytest.mark.parametrize("text,value", [("yarn:4", "yarn:4"), ("YARN:4.0", "yarn:4"), ("linear:2.5", "linear:2.5"),
                                        ("dynamic:1", "dynamic:1"), ("llama3:8", "llama3:8"), ("none", "none")])
def test_parse(text, value):
    assert parse_rope_scaling(text) == value


@pytest.mark.parametrize("text", ["yarn", "yarn:0.5", "yarn:x", "ntk:2", "yarn:inf", "longrope:2"])
def test_parse_errors_name_the_flag_and_value(text):
    with pytest.raises(AdvisorInputError) as e:
        parse_rope_scaling(text)
    assert e.value.where == "--rope-scaling" and repr(text) in str(e.value) and "\n" not in str(e.value)


def test_cli_parse_error_is_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--model", "llama8b", "--gpu", "h200", "--rope-scaling", "yarn:0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "--rope-scaling" in err[-1] and "'yarn:0.5'" in err[-1]


def test_a_plan_file_with_a_bad_value_is_refused():
    problems = Plan(rope_scaling="yarn:half").problems()
    assert [p.where for p in problems] == ["--rope-scaling"]


def test_length_past_the_context_is_refused_naming_the_flag(capsys):
    assert main(["estimate", "--model", "llama8b", "--gpu", "h200", "--seq-len", "200000"]) != 0
    err = capsys.readouterr().err
    assert "--seq-len" in err and "--rope-scaling yarn:2 extends it to 262,144" in err


def test_the_flag_lifts_the_refusal_and_a_longer_length_is_refused_again(capsys):
    args = ["estimate", "--model", "llama8b", "--gpu", "h200", "--method", "lora", "--gradient-checkpointing",
            "--json"]
    assert main(args + ["--seq-len", "200000", "--rope-scaling", "yarn:2"]) == 0
    capsys.readouterr()
    assert main(args + ["--seq-len", "300000", "--rope-scaling", "yarn:2"]) != 0
    err = capsys.readouterr().err
    assert "262,144 tokens (yarn:2 x 131,072)" in err and "--rope-scaling yarn:3" in err


@pytest.mark.slow
def test_seq_len_max_ceiling_is_factor_times_the_context(capsys):
    """advisor estimate --rope-scaling yarn:4 --seq-len max on Llama-3.1-8B: the search goes up to 4 x 131,072."""
    assert main(["estimate", "--model", "llama8b", "--gpu", "h200", "--method", "full", "--sharding", "zero3",
                 "--offload", "zero3_cpu", "--gradient-checkpointing", "--attn-impl", "flash_attention_3",
                 "--loss", "fused-linear", "--rope-scaling", "yarn:4", "--seq-len", "max", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len_search"]["ceiling"] == 4 * 131072
    assert out["max_seq_len"] > 131072  # past the trained context, which stopped it before


def test_rope_parameters_per_type():
    base = {"rope_type": "default", "rope_theta": 5e5}
    yarn, longest = rope_parameters(base, 131072, "yarn:4")
    assert yarn == {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 131072}
    assert longest == scaled_context(131072, "yarn:4") == 524288
    dyn, longest = rope_parameters(base, 4096, "dynamic:2")
    assert dyn["rope_type"] == "dynamic" and longest == 4096  # dynamic NTK rescales past max_position_embeddings
    l3, _ = rope_parameters(base, 8192, "llama3:8")
    assert l3["low_freq_factor"] == 1.0 and l3["high_freq_factor"] == 4.0


torch = pytest.importorskip("torch")

from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.memory.ledger import CATEGORIES  # noqa: E402
from advisor.runtime.build import hf_config  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.tiny import tiny_spec  # noqa: E402

TINY = tiny_spec("llama", num_layers=2, max_position_embeddings=64)
"""A trained context of 64 tokens, so that a 96-token step runs past it (dynamic NTK recomputes its inv_freq)."""
ROPES = ["linear:2", "dynamic:2", "yarn:2", "llama3:2"]


@pytest.mark.parametrize("rope", ROPES)
def test_the_built_model_runs_the_scaled_rope(rope):
    from transformers import AutoModelForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_get_mscale

    cfg = hf_config(TINY, Plan(rope_scaling=rope), None, "sdpa")
    model = AutoModelForCausalLM.from_config(cfg)
    rotary = model.model.rotary_emb
    kind = rope.split(":")[0]
    assert rotary.rope_type == kind
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](cfg)
    assert torch.equal(rotary.inv_freq, inv_freq) and rotary.attention_scaling == scaling
    if kind == "yarn":
        assert scaling == pytest.approx(yarn_get_mscale(2.0)) and scaling > 1  # YaRN's attention factor (eq. 21)
    default = AutoModelForCausalLM.from_config(hf_config(TINY, Plan(), None, "sdpa")).model.rotary_emb.inv_freq
    assert not torch.equal(rotary.inv_freq, default) or kind == "dynamic"  # dynamic rescales only past 64 tokens


@pytest.mark.parametrize("rope", ROPES)
def test_simulation_with_rope_scaling_equals_real_execution(rope):
    plan = Plan(method="lora", lora_targets="all-linear", seq_len=96, rope_scaling=rope)
    fake = trace_step(TINY, plan, fake=True)
    real = trace_step(TINY, plan, fake=False)
    # fake tensors lift a few Python scalars into 512-byte constants that real tensors never allocate
    assert abs(fake.peak_bytes - real.peak_bytes) <= 4 * 512, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 4 * 512, cat


def test_rope_scaling_adds_no_step_memory_on_the_real_step():
    """What a scaling adds is its inv_freq ([head_dim / 2] fp32, as the default rope's) and, for dynamic NTK past the
    trained context, one recomputed inv_freq; cos / sin are [b, s, head_dim] for every type (YaRN's attention factor
    scales them in place of the default's 1.0): the real step's peak moves by at most those few hundred bytes."""
    plan = Plan(method="lora", lora_targets="all-linear", seq_len=96)
    base = trace_step(TINY, plan, fake=False).peak_bytes
    for rope in ROPES:
        peak = trace_step(TINY, plan.with_(rope_scaling=rope), fake=False).peak_bytes
        assert abs(peak - base) <= 4 * 512, (rope, peak, base)


@pytest.mark.slow
@pytest.mark.parametrize("rope", ["yarn:4", "dynamic:2", "linear:2"])
def test_ledger_within_3_percent_of_the_simulation_with_rope_scaling(rope):
    """Llama-3.2-1B at 4,096 tokens: the closed form within 3% of the simulation, which builds the model with the
    scaled rope, and the simulated peak the same as without it."""
    from advisor.memory.training import estimate_training
    from advisor.runtime.simulate.extrapolate import simulate

    spec = resolve_model("llama-3.2-1b-instruct")
    plan = Plan(method="lora", gradient_checkpointing=True, seq_len=4096, rope_scaling=rope)
    sim = simulate(spec, plan).peak_bytes
    est = estimate_training(spec, plan).tensor_peak_bytes
    assert abs(est - sim) / sim < 0.03, (est, sim)
    assert math.isclose(sim, simulate(spec, plan.with_(rope_scaling="none")).peak_bytes, rel_tol=1e-4)


@pytest.mark.parametrize("fmt,section", [("advisor", "model"), ("trl", "model_init_kwargs"),
                                         ("axolotl", "overrides_of_model_config")])
def test_each_exports_overrides_load_the_scaled_rope(fmt, section, tiny_model, tmp_path):
    """What advisor.yaml's model section (train.py), trl.yaml's model_init_kwargs (SFTTrainer / train_trl.py) and
    axolotl's overrides_of_model_config carry, applied as each applies it, gives the model the scaled rope; and each
    file reads back to the plan."""
    import yaml
    from transformers import AutoConfig, AutoModelForCausalLM

    from advisor.configs.export import export_plan
    from advisor.configs.read import read_config

    spec = resolve_model("qwen7b")
    plan = Plan(method="lora", gradient_checkpointing=True, seq_len=65536, rope_scaling="yarn:2")
    path = export_plan(spec, plan, tmp_path, [fmt])[fmt]
    overrides = yaml.safe_load(path.read_text())[section]
    if fmt == "axolotl":  # axolotl sets each key on the loaded config (loaders/utils.py load_model_config)
        cfg = AutoConfig.from_pretrained(tiny_model)
        for key in ("rope_parameters", "max_position_embeddings"):
            setattr(cfg, key, overrides[key])
        model = AutoModelForCausalLM.from_pretrained(tiny_model, config=cfg)
    else:  # from_pretrained(**kwargs) sets them on the loaded config
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model, **{k: overrides[k] for k in ("rope_parameters", "max_position_embeddings")})
    assert model.model.rotary_emb.rope_type == "yarn" and model.config.max_position_embeddings == 65536
    assert model.model.rotary_emb.attention_scaling > 1
    _, back, _ = read_config(path, check_fields=False)
    assert back.rope_scaling == "yarn:2"


def test_llamafactory_refuses_a_factor_it_would_not_compute(tmp_path):
    from advisor.configs.export import export_plan

    spec = resolve_model("qwen7b")
    with pytest.raises(AdvisorInputError, match=r"ceil\(cutoff_len / 32,768\) = 2: use --rope-scaling yarn:2"):
        export_plan(spec, Plan(method="lora", seq_len=65536, rope_scaling="yarn:4"), tmp_path, ["llamafactory"])
    with pytest.raises(AdvisorInputError, match="none at cutoff_len 1,024"):
        export_plan(spec, Plan(method="lora", seq_len=1024, rope_scaling="yarn:2"), tmp_path, ["llamafactory"])


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train", "trl"])
def test_exported_script_trains_a_step_with_the_scaled_rope(script, tiny_model, tmp_path):
    """train.py (advisor.yaml's model section) and train_trl.py (trl.yaml's model_init_kwargs) load the model with the
    scaled rope and train a step on the CPU (exported for Qwen2.5-7B, run on the tiny copy: --model-path)."""
    from export_runs import run_export_script

    from advisor.configs.export import export_plan

    plan = Plan(method="lora", seq_len=32, rope_scaling="yarn:2")
    written = export_plan(resolve_model("qwen7b"), plan, tmp_path / "export", [script])
    path = tmp_path / "export" / ("train.py" if script == "train" else "train_trl.py")
    assert written
    proc, summary = run_export_script(path, "--data", str(tiny_model / "data.jsonl"), "--max-steps", "1",
                                      "--model-path", str(tiny_model), "--output-dir", str(tmp_path / "ckpt"),
                                      "--no-save")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["steps"] == 1 and math.isfinite(summary["train_loss"])
    assert "'rope_type': 'yarn'" in proc.stdout and "max_position_embeddings=65536" in proc.stdout
