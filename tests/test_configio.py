"""Reading configs back: export → read_config gives the same Plan, for every format that can express
it; broken files are reported with every bad key at once; only safe YAML/JSON loading."""

from __future__ import annotations

import json
import math
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.core.catalog import resolve_model
from advisor.configs.read import canonical, detect_format, read_config
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.configs.export import FILENAMES, export_plan
from advisor.configs.export import Unsupported
from advisor.core.plan import (ATTENTION, FUSED_BACKWARD_OPTIMIZERS, LOW_RANK_OPTIMIZERS, OFFLOADS, OPTIMIZERS,
                               LOSS_SCALED, PRECISIONS, Plan)

SPEC = resolve_model("qwen7b")
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@st.composite
def plans(draw) -> Plan:
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    method = "full" if optimizer in LOW_RANK_OPTIMIZERS else draw(st.sampled_from(["full", "lora", "qlora"]))
    quant = {"full": st.just("none"), "lora": st.sampled_from(["none", "int8"]),
             "qlora": st.sampled_from(["nf4", "fp4"])}[method]
    q = draw(quant)
    offload = draw(st.sampled_from([o for o in OFFLOADS if o != "fsdp_cpu"]))  # one GPU: FSDP's offload needs two
    if q == "int8" or (offload == "zero3_cpu" and method == "qlora"):
        offload = "none"
    precision = draw(st.sampled_from(PRECISIONS))
    if method == "full" and precision == "fp16":
        precision = "mixed_fp16"
    attn = draw(st.sampled_from(ATTENTION))
    if attn in ("flash_attention_2", "flash_attention_3") and precision == "fp32":
        attn = "sdpa"
    if offload != "none":
        optimizer = "adamw_torch"
    in_bwd = optimizer in FUSED_BACKWARD_OPTIMIZERS or (offload == "none" and precision not in LOSS_SCALED
                                                        and draw(st.booleans()) and draw(st.booleans()))
    if optimizer in ("lomo", "adalomo") and precision in LOSS_SCALED:  # the Trainer's GradScaler cannot wrap it
        precision = "mixed_bf16"
    ckpt = draw(st.booleans())
    targets = draw(st.one_of(st.just("all-linear"),
                             st.lists(st.sampled_from(LINEARS), min_size=1, max_size=7, unique=True).map(tuple)))
    seq_len = draw(st.integers(1, 131072))
    rope_kind = draw(st.sampled_from([None, "linear", "dynamic", "yarn", "llama3"]))
    factor = draw(st.sampled_from(["LLaMA-Factory's", 2, 3.5]))  # LLaMA-Factory's: ceil(cutoff_len / context)
    factor = max(2, math.ceil(seq_len / SPEC.max_position_embeddings)) if factor == "LLaMA-Factory's" else factor
    plan = Plan(
        rope_scaling="none" if rope_kind is None else f"{rope_kind}:{factor:g}",
        method=method, quantization=q, double_quant=q in ("nf4", "fp4") and draw(st.booleans()),
        compute_dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])), precision=precision,
        lora_r=draw(st.integers(1, 256)),
        lora_alpha=draw(st.one_of(st.integers(1, 512).map(float), st.sampled_from([0.5, 12.5, 48.25]))),
        lora_dropout=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])), lora_targets=targets,
        gradient_checkpointing=ckpt, optimizer=optimizer,
        micro_batch=draw(st.integers(1, 64)), grad_accum=1 if in_bwd else draw(st.integers(1, 128)),
        optimizer_in_backward=in_bwd and optimizer not in FUSED_BACKWARD_OPTIMIZERS,
        checkpoint_layers=draw(st.sampled_from([None, 1, 7, 14, 20])) if ckpt else None,
        activation_offload=draw(st.booleans()), optim_rank=draw(st.sampled_from([8, 128, 512])),
        optim_proj_gap=draw(st.sampled_from([50, 200])),
        seq_len=seq_len, attn_impl=attn, offload=offload,
        loss=draw(st.sampled_from(["plain", "chunked", "fused-linear"])),
        dora=method == "lora" and q == "none" and draw(st.booleans()), packing=draw(st.booleans()),
    )
    if q != "int8" and not plan.dora and (plan.gradient_checkpointing or not plan.activation_offload) \
            and draw(st.booleans()):
        plan = plan.with_(tiled_mlp=True)  # not with DoRA, LLM.int8 or TRL's offload of every activation
    assert not plan.problems(), plan.problems()
    return plan


def _expressible(fmt: str, plan: Plan) -> bool:
    """What each format's documentation lets it say (see the exporter modules)."""
    int_alpha = not plan.peft or float(plan.lora_alpha).is_integer()
    some_layers = plan.gradient_checkpointing and plan.checkpoint_layers not in (None, SPEC.num_layers)
    if fmt == "trl":  # every n-th layer is TrainingArguments' every_n_layers; TRL offloads on its own
        from advisor.configs._training_args import every_n

        return (not plan.optimizer_in_backward and (not some_layers or every_n(plan, SPEC) is not None)
                and int_alpha and (not plan.four_bit or plan.compute_dtype == plan.param_dtype))
    if plan.optimizer_in_backward or some_layers:
        return False  # advisor.yaml + train.py only
    if plan.activation_offload and not plan.gradient_checkpointing:
        return False  # axolotl and LLaMA-Factory offload only with checkpointing (checkpoint offload)
    if fmt == "axolotl":
        # checkpoint offload is axolotl's activation_offloading: hidden_states
        return int_alpha and not plan.precision.startswith("mixed")
    if fmt == "llamafactory":
        ok_prec = plan.precision in (("mixed_bf16", "mixed_fp16", "bf16") if plan.method == "full"
                                     else ("bf16", "fp16"))
        pure_z3 = plan.method == "full" and plan.precision == "bf16" and plan.offload == "zero3_cpu"
        cd_ok = not plan.four_bit or plan.compute_dtype == plan.activation_dtype
        no_fa3 = plan.attn_impl != "flash_attention_3"  # LLaMA-Factory 0.9.5 lists fa3 but raises for it
        # LLaMA-Factory computes the RoPE factor itself: ceil(cutoff_len / max_position_embeddings), past it only
        context = SPEC.max_position_embeddings
        rope_ok = plan.rope_scaling == "none" or (
            plan.seq_len > context and float(plan.rope_scaling.split(":")[1]) == math.ceil(plan.seq_len / context))
        return int_alpha and ok_prec and not pure_z3 and cd_ok and plan.loss != "chunked" and no_fa3 and rope_ok \
            and not plan.tiled_mlp  # LLaMA-Factory 0.9.5 has no tiled-MLP key
    if fmt == "trl":
        return int_alpha and (not plan.four_bit or plan.compute_dtype == plan.param_dtype)
    return True


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_every_export_reads_back_to_the_same_plan(plan):
    with tempfile.TemporaryDirectory() as d:
        written = export_plan(SPEC, plan, d)
        for fmt in ("axolotl", "llamafactory"):
            assert (fmt in written) == _expressible(fmt, plan), (fmt, written.skipped.get(fmt))
        assert ("deepspeed" in written) == (plan.offload != "none")
        assert ("trl" in written) == _expressible("trl", plan), written.skipped.get("trl")
        for fmt in ("advisor", "axolotl", "llamafactory", "trl"):
            if fmt not in written:
                continue
            name, back, extras = read_config(written[fmt], check_fields=False)
            assert name == SPEC.hf_id
            # TRL fuses the LM head into the loss whatever the plan said: read back as what runs
            assert back == canonical(plan.with_(loss="fused-linear") if fmt == "trl" else plan), fmt
            assert extras["format"] == fmt and extras["defaulted"] == []
            if fmt == "advisor":
                assert extras["edited"] == {}


def test_advisor_yaml_reads_with_field_check(tmp_path):
    plan = Plan(method="qlora", quantization="nf4", double_quant=True, optimizer="paged_adamw_8bit", grad_accum=8,
                gradient_checkpointing=True)
    written = export_plan(SPEC, plan, tmp_path, ["advisor"], extra={"peak_bytes": 123, "source": "simulated"})
    name, back, extras = read_config(written["advisor"])
    assert back == plan and name == "Qwen/Qwen2.5-7B-Instruct"
    assert extras["prediction"] == {"peak_bytes": 123, "source": "simulated"}
    assert extras["sections"]["training"]["optim"] == "paged_adamw_8bit"


def test_edits_to_the_sections_win_and_are_reported(tmp_path):
    plan = Plan(method="lora", lora_r=16)
    path = export_plan(SPEC, plan, tmp_path, ["advisor"])["advisor"]
    cfg = yaml.safe_load(path.read_text())
    cfg["lora"]["r"] = 8
    cfg["training"]["per_device_train_batch_size"] = 4
    path.write_text(yaml.safe_dump(cfg))
    _, back, extras = read_config(path)
    assert back.lora_r == 8 and back.micro_batch == 4
    assert extras["edited"] == {"lora_r": [16, 8], "micro_batch": [1, 4]}


def test_every_problem_is_reported_with_its_key(tmp_path):
    path = export_plan(SPEC, Plan(method="qlora", quantization="nf4"), tmp_path, ["advisor"])["advisor"]
    cfg = yaml.safe_load(path.read_text())
    cfg["training"]["optim"] = "lion_32bit"
    cfg["training"]["per_device_train_batch_size"] = "two"
    cfg["training"]["gradient_acumulation_steps"] = 4  # typo: TrainingArguments has no such field
    cfg["lora"]["target_modules"] = None
    cfg["quantization"]["bnb_4bit_quant_type"] = "nf3"
    cfg["model"]["torch_dtype"] = "float8"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigErrors) as e:
        read_config(path)
    wheres = {err.where for err in e.value.errors}
    assert wheres == {"training.optim", "training.per_device_train_batch_size", "training.gradient_acumulation_steps",
                      "lora.target_modules", "quantization.bnb_4bit_quant_type", "model.torch_dtype"}
    msg = str(e.value)
    assert "6 error(s)" in msg and "'lion_32bit'" in msg and "adamw_torch" in msg


def test_plan_rules_are_reported_with_the_files_keys(tmp_path):
    # a 4-bit base with full fine-tuning: the plan rule, named by the key in the file
    cfg = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "stage": "sft", "finetuning_type": "lora",
           "quantization_bit": 4, "bf16": True, "cutoff_len": 512, "per_device_train_batch_size": 1,
           "optim": "paged_adamw_8bit", "deepspeed": "ds.json"}
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2,
                                                                        "offload_optimizer": {"device": "cpu"}},
                                                  "train_micro_batch_size_per_gpu": 1}))
    p = tmp_path / "lf.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(AdvisorInputError) as e:
        read_config(p)
    assert e.value.where == "optim" and "CPU Adam" in e.value.rule


def test_deepspeed_file_is_read_and_checked(tmp_path):
    plan = Plan(method="full", precision="mixed_bf16", offload="zero3_cpu", micro_batch=2)
    written = export_plan(SPEC, plan, tmp_path, ["advisor"])
    assert read_config(written["advisor"])[1] == plan
    ds = json.loads(written["deepspeed"].read_text())
    ds["train_micro_batch_size_per_gpu"] = 3
    ds["zero_optimization"]["offload_param"] = {"device": "none"}
    written["deepspeed"].write_text(json.dumps(ds))
    cfg = yaml.safe_load(written["advisor"].read_text())
    cfg["deepspeed"] = None  # the reader follows training.deepspeed to the file
    written["advisor"].write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigErrors) as e:
        read_config(written["advisor"])
    assert {err.where for err in e.value.errors} == {"training.deepspeed.zero_optimization",
                                                     "deepspeed.train_micro_batch_size_per_gpu"}
    (tmp_path / "deepspeed.json").unlink()
    with pytest.raises(AdvisorInputError, match="cannot be read"):
        read_config(written["advisor"])


def test_flat_training_arguments_json(tmp_path):
    p = tmp_path / "training_args.json"
    p.write_text(json.dumps({
        "model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "max_seq_length": 2048,
        "output_dir": "out", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True,
        "optim": "adamw_torch_fused", "gradient_checkpointing": True,
        "model": {"torch_dtype": "bfloat16"},
    }))
    name, plan, extras = read_config(p)
    assert extras["format"] == "hf" and name == "Qwen/Qwen2.5-0.5B-Instruct"
    # adamw_torch_fused is the fused kernel, read as itself (not as foreach adamw_torch: issue 15)
    assert plan == canonical(Plan(method="full", precision="bf16", micro_batch=4, grad_accum=2, seq_len=2048,
                                  optimizer="adamw_torch_fused", gradient_checkpointing=True))
    assert "model.attn_implementation" in extras["defaulted"]


def test_defaults_of_each_tool_are_used_and_listed(tmp_path):
    p = tmp_path / "lf.yaml"
    p.write_text("model_name_or_path: m\nstage: sft\nbf16: true\nlora_target: q_proj,v_proj\n")
    _, plan, extras = read_config(p)
    # LLaMA-Factory: finetuning_type lora, rank 8, alpha 2*rank, cutoff_len 2048, batch 8, checkpointing on
    assert (plan.method, plan.lora_r, plan.lora_alpha, plan.seq_len, plan.micro_batch) == ("lora", 8, 16.0, 2048, 8)
    assert plan.gradient_checkpointing and plan.lora_targets == ("q_proj", "v_proj")
    assert {"cutoff_len", "per_device_train_batch_size", "lora_rank"} <= set(extras["defaulted"])

    a = tmp_path / "ax.yaml"
    a.write_text("base_model: m\nadapter: qlora\nload_in_4bit: true\nlora_r: 32\nlora_alpha: 16\n"
                 "lora_target_linear: true\nflash_attention: true\n")
    _, plan, extras = read_config(a)
    # axolotl: nf4 + double quant by default, bf16 auto, sequence_len 512, adamw_torch_fused
    assert (plan.quantization, plan.double_quant, plan.precision, plan.seq_len) == ("nf4", True, "bf16", 512)
    assert plan.attn_impl == "flash_attention_2" and plan.lora_targets == "all-linear"
    assert {"bf16", "sequence_len", "optimizer"} <= set(extras["defaulted"])


def test_axolotl_errors_all_at_once(tmp_path):
    p = tmp_path / "ax.yaml"
    p.write_text("base_model: m\nadapter: dora\nsequence_len: 1k\nmicro_batch_size: 0\noptimizer: lion\n"
                 "gradient_checkpointing: offload\n")
    with pytest.raises(ConfigErrors) as e:
        read_config(p)
    assert {err.where for err in e.value.errors} == {"adapter", "sequence_len", "optimizer", "gradient_checkpointing"}


def test_bad_files(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(AdvisorInputError, match="mapping"):
        read_config(p)
    p.write_text("hello: [unclosed\n")
    with pytest.raises(AdvisorInputError, match="not valid YAML at line"):
        read_config(p)
    p.write_text("colour: blue\n")
    with pytest.raises(AdvisorInputError, match="cannot tell the format"):
        read_config(p)
    # safe loading only: a YAML tag that would build a Python object is refused, never executed
    marker = tmp_path / "pwned"
    p.write_text(f"base_model: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(AdvisorInputError):
        read_config(p)
    assert not marker.exists()
    with pytest.raises(AdvisorInputError, match="cannot read"):
        read_config(tmp_path / "missing.yaml")
    j = tmp_path / "c.json"
    j.write_text("{not json")
    with pytest.raises(AdvisorInputError, match="not valid JSON"):
        read_config(j)


def test_detect_format_by_keys():
    assert detect_format({"training": {}, "advisor": {}}) == "advisor"
    assert detect_format({"training": {}, "model": {}}) == "hf"
    assert detect_format({"base_model": "m"}) == "axolotl"
    assert detect_format({"model_name_or_path": "m", "finetuning_type": "lora"}) == "llamafactory"
    assert detect_format({"model_name_or_path": "m", "per_device_train_batch_size": 2}) == "hf"


@pytest.mark.parametrize("fmt", ["advisor", "axolotl", "llamafactory"])
def test_exported_files_are_named_as_registered(fmt, tmp_path):
    plan = Plan(method="lora", lora_alpha=32.0)
    written = export_plan(SPEC, plan, tmp_path, [fmt])
    assert written[fmt].name == FILENAMES[fmt]
    assert read_config(written[fmt], check_fields=False)[1] == plan


def test_unsupported_is_an_input_error():
    assert issubclass(Unsupported, AdvisorInputError)
