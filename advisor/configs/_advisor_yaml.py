"""advisor.yaml: the plan in the field names of the classes that run it, written and read back.

Sections (each is passed with ``**section`` by the exported train.py, so the names are exact):

- ``model``: ``name_or_path`` and ``torch_dtype`` / ``attn_implementation`` /
  ``trust_remote_code`` for ``AutoModelForCausalLM.from_pretrained``; ``catalog_name`` is the
  advisor's own name for the model (train.py does not pass it on).
- ``quantization``: ``transformers.BitsAndBytesConfig`` fields, or null.
- ``lora``: ``peft.LoraConfig`` fields, or null for a full fine-tune.
- ``training``: ``transformers.TrainingArguments`` fields.
- ``deepspeed``: the DeepSpeed config (also written to deepspeed.json, which
  ``training.deepspeed`` names), or null.
- ``advisor``: what the libraries have no field for (``max_seq_length``, ``loss``, ``packing``, ``env``: the
  environment the run needs, PYTORCH_CUDA_ALLOC_CONF for the allocator settings), the
  Plan itself, and the prediction it was chosen on.

Field names checked against transformers 5.x / peft 0.17+ by constructing the classes in
tests/test_export.py.

Reading (``read``) understands the file as written, the same sections without the ``advisor`` one (a
hand-written HF setup, format "hf"), and a flat ``TrainingArguments`` JSON/YAML with ``model`` /
``quantization`` / ``lora`` / ``deepspeed`` sections (or ``model_name_or_path``) beside its keys. What
runs is what is read: the Plan comes from the library sections, not from the ``advisor.plan`` copy;
fields the libraries have no key for (sequence length, the loss) come from the ``advisor`` section.
The keys a knob declares for "advisor" (advisor.core.plan) are written and read by advisor.configs._keys;
this module handles the knobs it declares ``Custom``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.formats import FORMATS
from advisor.configs._base import (ADAM, LIGER_FUSED_LOSS_ONLY, LR_SCHEDULER, PRECISION_FLAGS, TORCH_DTYPE,
                                   TORCH_TO_PLAN, WARMUP_STEPS, alloc_env, check_command, Collect, comment_block,
                                   dump_yaml, env_prefix, ExportContext, fsdp_offloads, lora_alpha_value,
                                   parallel_fields, plan_summary, sequence_parallel_rules, training_hyperparameters,
                                   Unsupported, vision_script_rules, write_text, write_vision_script)
from advisor.configs._keys import DECLARED, fill, read_declared, refuse_unexpressible, unplaced
from advisor.configs._deepspeed import check_batch, deepspeed_config, read_offload
from advisor.configs._training_args import (checkpoint_layers_of, liger_fused_loss, read_checkpointing,
                                            read_optimizer, read_precision, training_arguments_fields)
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import ALL_LINEAR, LOSSES, knob_of

FILENAME = FORMATS["advisor"].filename
FORMAT = "advisor"
FORMAT_VERSION = 1


# --------------------------------------------------------------------------- writing


def model_section(ctx: ExportContext) -> dict[str, Any]:
    torch_dtype, _, _ = PRECISION_FLAGS[ctx.plan.precision]
    section = {
        "name_or_path": ctx.model_id,
        "catalog_name": ctx.spec.name,
        "torch_dtype": torch_dtype,
        "attn_implementation": DECLARED,
        "trust_remote_code": False,
    }
    from advisor.core.card_rules import ships_mxfp4

    if ships_mxfp4(ctx.spec) and not ctx.plan.quantized:
        # transformers cannot train MXFP4 (card_rules.yaml mxfp4): train.py loads with Mxfp4Config(dequantize=True)
        section["dequantize_mxfp4"] = True
    from advisor.configs._rope import rope_overrides

    section.update(rope_overrides(ctx.spec, ctx.plan))  # --rope-scaling: train.py passes both to from_pretrained
    return section


def quantization_section(plan) -> dict[str, Any] | None:
    if plan.quantization == "none":
        return None
    if plan.quantization == "int8":
        return {"load_in_8bit": True}
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": plan.quantization,
        "bnb_4bit_use_double_quant": DECLARED,
        "bnb_4bit_compute_dtype": TORCH_DTYPE[plan.compute_dtype],
    }


def lora_section(plan, spec=None) -> dict[str, Any] | None:
    """peft.LoraConfig's fields; ``target_modules`` as the run adapts them on ``spec`` (advisor.core.adapters:
    a mixture of experts' names peft would rewrite left out), ``target_parameters`` for LoRA on stacked experts."""
    if not plan.peft:
        return None
    from advisor.core.adapters import export_parameters, export_targets

    section = {
        "r": DECLARED,
        "lora_alpha": lora_alpha_value(plan.lora_alpha),
        "lora_dropout": DECLARED,
        "target_modules": export_targets(spec, plan),
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "use_dora": DECLARED,
    }
    parameters = export_parameters(spec, plan)
    if parameters:
        section["target_parameters"] = parameters  # peft lora.ParamWrapper on each stacked expert weight
    return section


def training_section(plan, output_dir: str = "outputs") -> dict[str, Any]:
    _, bf16, fp16 = PRECISION_FLAGS[plan.precision]
    hp = training_hyperparameters(plan)
    section: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": DECLARED,
        "per_device_eval_batch_size": DECLARED,
        "gradient_accumulation_steps": DECLARED,
        "gradient_checkpointing": bool(plan.gradient_checkpointing),
        "gradient_checkpointing_kwargs": {"use_reentrant": False} if plan.gradient_checkpointing else None,
        "optim": plan.optimizer,
        "bf16": bf16,
        "fp16": fp16,
        "learning_rate": hp["learning_rate"],
        "lr_scheduler_type": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        **ADAM,
        "max_grad_norm": hp["max_grad_norm"],
        "num_train_epochs": 1,
        "max_steps": -1,
        "logging_steps": 10,
        "save_steps": 500,
        "report_to": "none",
        "deepspeed": None,
    }
    if plan.loss == "fused-linear":
        section["use_liger_kernel"] = True
        section["liger_kernel_config"] = dict(LIGER_FUSED_LOSS_ONLY)
    return section


def sections(ctx: ExportContext) -> dict[str, Any]:
    """The whole advisor.yaml as a dict (what the file holds, comments aside)."""
    plan = ctx.plan
    refuse_unexpressible(plan, FORMAT)
    advisor: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "max_seq_length": plan.seq_len,
        "loss": plan.loss,
        "chunked_ce": bool(plan.chunked_ce),  # read by train.py files written before the loss knob
        "packing": DECLARED,
        # what TrainingArguments has no field for, applied by train.py
        "checkpoint_layers": plan.checkpoint_layers if plan.gradient_checkpointing else None,
        "activation_offload": bool(plan.activation_offload),
        "optimizer_in_backward": DECLARED,
        "plan": plan.to_dict(),
    }
    if alloc_env(plan):
        advisor["env"] = alloc_env(plan)   # train.py sets these before torch starts CUDA
    if ctx.gpu is not None:
        advisor["gpu"] = {"key": ctx.gpu.key, "name": ctx.gpu.name, "memory_bytes": ctx.gpu.memory_bytes,
                          "bf16": ctx.gpu.bf16, "sm": ctx.gpu.sm}  # what decided the precision (card_rules)
    # the run as planned: how many GPUs, how the state is split, the command that launches it
    advisor["gpus"] = ctx.gpus
    advisor["sharding"] = ctx.sharding if ctx.gpus > 1 else None
    advisor["launch"] = ctx.launch("train.py", "--data my_data.jsonl")
    if ctx.extra:
        advisor["prediction"] = _plain(ctx.extra)
    training = {**training_section(plan), **parallel_fields(ctx), **training_arguments_fields(plan, ctx.spec)}
    if ctx.spec.is_vision_language:
        training["remove_unused_columns"] = False  # the samples' messages and images reach the collator
    doc = {
        "model": model_section(ctx),
        "quantization": _sharded_storage(ctx, quantization_section(plan)),
        "lora": lora_section(plan, ctx.spec),
        "training": training,
        "deepspeed": deepspeed_config(plan, ctx.zero_stage) if ctx.zero_stage is not None else None,
        # vision_setup.py's settings (declared keys), and the collator's cap: the text and the planned sample's images
        "vision": {"max_length": ctx.file_plan.seq_len} if ctx.spec.is_vision_language else None,
        # accelerate's ParallelismConfig, built by train.py (declared keys)
        "sequence_parallel": {} if plan.sp_degree > 1 else None,
        "advisor": advisor,
    }
    unplaced(plan, FORMAT, doc)
    # the vision section as the file holds it: the planned images' pixel budget (ExportContext.file_plan)
    return {name: fill(section, ctx.file_plan if name == "vision" else plan, FORMAT, name,
                       before="plan" if name == "advisor" else None)
            if isinstance(section, dict) and name != "deepspeed" else section for name, section in doc.items()
            if section is not None or name not in OPTIONAL_SECTIONS}


OPTIONAL_SECTIONS = ("vision", "sequence_parallel")
"""Sections written only for a plan that has them (a null one is not written)."""


def _sharded_storage(ctx: ExportContext, quant: dict | None) -> dict | None:
    """4-bit weights sharded by ZeRO-3 or FSDP are stored in the weights' dtype (``bnb_4bit_quant_storage``), so
    the sharding can flatten them with the other parameters (transformers docs: FSDP/DeepSpeed with QLoRA)."""
    if quant and quant.get("load_in_4bit") and (ctx.zero_stage == 3 or ctx.fsdp):
        quant = {**quant, "bnb_4bit_quant_storage": PRECISION_FLAGS[ctx.plan.precision][0]}
    return quant


def _plain(value: Any) -> Any:
    """JSON/YAML-safe copy (tuples → lists, numbers and strings as they are, the rest as str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


HEADER = [
    "advisor.yaml - written by vram-advisor (advisor tune / advisor export).",
    "",
    "{summary}",
    "",
    "Run it:   {launch}           (JSONL with a \"text\" field, or a .txt)",
    "          {launch_short} --data d.jsonl --max-steps 100 --model-path /local/copy/of/the/model",
    "Check it: {check}",
    "",
    "Each section is passed as **section to the class named beside it, so keys are those classes'",
    "field names. Edit freely: preflight re-reads these sections, not the advisor section below.",
    "  model         -> AutoModelForCausalLM.from_pretrained (catalog_name is the advisor's name)",
    "  quantization  -> transformers.BitsAndBytesConfig (null: weights not quantized)",
    "  lora          -> peft.LoraConfig (null: full fine-tuning)",
    "  training      -> transformers.TrainingArguments",
    "  deepspeed     -> DeepSpeed config, also in deepspeed.json (null: no DeepSpeed ZeRO)",
    "  advisor       -> what those classes have no field for, the plan, and the prediction",
]
VISION_HEADER = [
    "  vision        -> vision_setup.py (beside train.py): the processor's pixel bounds, what trains in the",
    "                   tower and projector, the tower's own checkpointing (left out: frozen, off, the",
    "                   checkpoint's own processor). The model loads with AutoModelForImageTextToText; the data",
    "                   is JSONL of {\"messages\": [...], \"images\": [\"a.png\"]} (see vision_setup.py).",
]


def write(ctx: ExportContext, out_dir: Path) -> Path:
    vision_script_rules(ctx, FORMAT)
    sequence_parallel_rules(ctx, FORMAT)
    if ctx.spec.is_vision_language and ctx.plan.loss == "chunked":
        raise Unsupported(FORMAT, "train.py's chunked loss runs the language model on token ids alone (no pixel "
                                  "values): plan the plain or fused-linear loss")
    summary = "\n".join(plan_summary(ctx))
    header_lines = HEADER + (VISION_HEADER if ctx.spec.is_vision_language else [])
    if ctx.spec.is_vision_language:
        header_lines = [line.replace('(JSONL with a "text" field, or a .txt)', "(JSONL of messages and images)")
                        for line in header_lines]
    lines = "\n".join(header_lines).replace("{summary}", summary).replace(
        "{launch}", ctx.launch("train.py", "--data my_data.jsonl")).replace("{launch_short}", ctx.launch("train.py")
                                                                           ).replace(
        "{check}", check_command(ctx, FILENAME)).split("\n")
    if alloc_env(ctx.plan):
        env = env_prefix(ctx.plan).strip()
        lines.insert(next(i for i, line in enumerate(lines) if line.startswith("Check it: ")),
                     f"          (train.py sets {env} itself from advisor.env; a value in the shell wins)")
    header = comment_block(lines)
    write_vision_script(ctx, out_dir)
    return write_text(out_dir / FILENAME, dump_yaml(sections(ctx), header))


# --------------------------------------------------------------------------- reading

_SECTIONS = ("model", "quantization", "lora", "deepspeed_config", "model_name_or_path", "max_seq_length", "advisor",
             *OPTIONAL_SECTIONS)
"""Keys beside a flat TrainingArguments file's own."""


def read(data: dict, c: Collect, plan_type: type, fmt: str = "advisor") -> tuple[str | None, dict, dict]:
    """advisor.yaml (``fmt`` "advisor") / HF sections or a flat TrainingArguments ("hf") → (model, plan
    fields, extras)."""
    extras: dict[str, Any] = {}
    if fmt == "hf" and not isinstance(data.get("training"), dict):
        training = {k: v for k, v in data.items() if k not in _SECTIONS}
        sect = ""
    else:
        training = c.section(data, "training") or {}
        sect = "training."
    model = c.section(data, "model") or {}
    name = None
    for key in ("name_or_path", "pretrained_model_name_or_path", "model_name_or_path"):
        if model.get(key):
            name = c.get(model, key, f"model.{key}", "str")
            break
    if name is None and data.get("model_name_or_path"):
        name = c.get(data, "model_name_or_path", "model_name_or_path", "str")
    if name is None:
        c.bad("model.name_or_path", "the model to train is required", None)

    f: dict[str, Any] = {}
    dtype_key = "torch_dtype" if "torch_dtype" in model else "dtype"
    if dtype_key not in model:
        c.defaulted.append("model.torch_dtype")
    read_precision(model.get(dtype_key, "float32"), f"model.{dtype_key}", training, sect, c, f)
    ckpt = read_checkpointing(training, sect, c, f)
    read_optimizer(training, sect, c, f)

    ds_value = training.get("deepspeed")
    ds_where = f"{sect}deepspeed"
    if ds_value is None and isinstance(data.get("deepspeed"), dict):
        ds_value, ds_where = data["deepspeed"], "deepspeed"
    f["offload"], ds = read_offload(c, ds_value, ds_where)
    if f["offload"] == "none" and fsdp_offloads(training.get("fsdp"), training.get("fsdp_config")):
        f["offload"] = "fsdp_cpu"

    quant = c.section(data, "quantization")
    f["quantization"] = "none"
    if quant:
        _read_quantization(quant, c, f)
    lora = c.section(data, "lora")
    if lora:
        f["method"] = "qlora" if f["quantization"] in ("nf4", "fp4") else "lora"
        f["lora_alpha"] = float(c.get(lora, "lora_alpha", "lora.lora_alpha", "num", 8))  # LoraConfig's default
        t = c.targets(lora.get("target_modules"), "lora.target_modules")
        if lora.get("target_modules") is None:
            c.bad("lora.target_modules", f"is required: list the module names or {ALL_LINEAR} (peft's per-model "
                  "default is not guessed)", None)
        f["lora_targets"] = t
        f["lora_experts"] = c.expert_parameters(lora.get("target_parameters"), "lora.target_parameters")
    else:
        f["method"] = "full"
    advisor = c.section(data, "advisor") or {}
    read_declared(c, plan_type, FORMAT, _lookup(
        {"model": model, "quantization": quant, "lora": lora, "training": training, "advisor": advisor,
         **{name: c.section(data, name) for name in OPTIONAL_SECTIONS}}, sect), f)
    check_batch(c, ds, f, sect)

    f["activation_offload"] = bool(ckpt["kwargs"].get("offload")) or c.get(
        advisor, "activation_offload", "advisor.activation_offload", "bool", False, record=False)
    if advisor.get("checkpoint_layers") is not None:
        f["checkpoint_layers"] = c.get(advisor, "checkpoint_layers", "advisor.checkpoint_layers", "int", None,
                                       record=False)
        f["gradient_checkpointing"] = True
    else:
        checkpoint_layers_of(ckpt, name, c, f)
    f["seq_len"] = _seq_len(data, training, advisor, sect, c, plan_type)
    from advisor.configs._rope import read_rope

    f["rope_scaling"] = read_rope(model, "model", c)
    f["loss"] = _loss(advisor, training, c)
    env = advisor.get("env") if isinstance(advisor.get("env"), dict) else {}
    if env.get("PYTORCH_CUDA_ALLOC_CONF"):
        from advisor.memory.allocator import AllocatorConfig

        try:
            conf = AllocatorConfig.from_env(str(env["PYTORCH_CUDA_ALLOC_CONF"]))
        except AdvisorInputError as e:
            raise AdvisorInputError("advisor.env.PYTORCH_CUDA_ALLOC_CONF", e.rule,
                                    env["PYTORCH_CUDA_ALLOC_CONF"]) from None
        f["expandable_segments"] = conf.expandable_segments
    for key in ("prediction", "gpu", "gpus", "sharding"):  # gpus, sharding: the run's launch (one GPU: 1, None)
        if key in advisor:
            extras[key] = advisor[key]
    if isinstance(advisor.get("plan"), dict):
        extras["advisor_plan"] = advisor["plan"]
    extras["sections"] = {"model": model, "quantization": quant, "lora": lora, "training": training,
                          "deepspeed": ds}
    return name, f, extras


def read_hf(data: dict, c: Collect, plan_type: type) -> tuple[str | None, dict, dict]:
    """HF sections without the advisor one, or a flat TrainingArguments file ("hf") → (model, plan fields, extras)."""
    return read(data, c, plan_type, "hf")


def _lookup(sections: dict[str, dict | None], sect: str):
    """A declared path ("lora.r") → its section's mapping, key and name in errors (the training section's
    keys named bare in a flat TrainingArguments file)."""
    def lookup(path: str):
        section, _, key = path.partition(".")
        where = f"{sect}{key}" if section == "training" else path
        return sections.get(section), key, where
    return lookup


def _read_quantization(quant: dict, c: Collect, f: dict) -> None:
    q4 = c.get(quant, "load_in_4bit", "quantization.load_in_4bit", "bool", False, record=False)
    q8 = c.get(quant, "load_in_8bit", "quantization.load_in_8bit", "bool", False, record=False)
    if q4 and q8:
        c.bad("quantization.load_in_8bit", "load_in_4bit and load_in_8bit cannot both be true", q8)
    elif q4:
        qt = quant.get("bnb_4bit_quant_type", "fp4")  # BitsAndBytesConfig's default
        if "bnb_4bit_quant_type" not in quant:
            c.defaulted.append("quantization.bnb_4bit_quant_type")
        f["quantization"] = c.choice(qt, {"nf4": "nf4", "fp4": "fp4"}, "quantization.bnb_4bit_quant_type")
        cd = quant.get("bnb_4bit_compute_dtype", "float32")  # BitsAndBytesConfig's default
        if "bnb_4bit_compute_dtype" not in quant:
            c.defaulted.append("quantization.bnb_4bit_compute_dtype")
        f["compute_dtype"] = c.choice(cd, TORCH_TO_PLAN, "quantization.bnb_4bit_compute_dtype")
    elif q8:
        f["quantization"] = "int8"


def _seq_len(data: dict, training: dict, advisor: dict, sect: str, c: Collect, plan_type: type) -> int | None:
    for where_d, key in ((advisor, "max_seq_length"), (training, "max_seq_length"), (training, "max_length"),
                         (data, "max_seq_length")):
        if key in where_d:
            return c.get(where_d, key, key if where_d is data else
                         (f"advisor.{key}" if where_d is advisor else f"{sect}{key}"), "int")
    c.defaulted.append("max_seq_length")
    return knob_of(plan_type, "seq_len").default


def _loss(advisor: dict, training: dict, c: Collect) -> str | None:
    """The loss from the advisor section, TrainingArguments' Liger flags, or (files written before the loss
    knob) the advisor section's ``chunked_ce``."""
    if "loss" in advisor:
        return c.choice(advisor.get("loss"), {k: k for k in LOSSES}, "advisor.loss")
    if c.get(advisor, "chunked_ce", "advisor.chunked_ce", "bool", False, record=False):
        return "chunked"
    if liger_fused_loss(training):
        return "fused-linear"  # Trainer applies Liger's fused linear cross-entropy (its default: on)
    return "plain"


def unknown_keys(c: Collect, data: dict, extras: dict) -> None:
    """Report keys that TrainingArguments / LoraConfig / BitsAndBytesConfig do not have (imports them)."""
    secs = extras["sections"]
    _unknown_keys(c, secs["training"], "training" if isinstance(data.get("training"), dict) else "",
                  _class_fields("training"))
    _unknown_keys(c, secs["lora"], "lora", _class_fields("lora"))
    _unknown_keys(c, secs["quantization"], "quantization", _class_fields("quantization"))


def _unknown_keys(c: Collect, section: dict | None, where: str, allowed: set[str] | None) -> None:
    if section is None or allowed is None:
        return
    for key in section:
        if key not in allowed:
            c.bad(f"{where}.{key}" if where else key, "is not a field of the class this section is passed to",
                  section[key])


def _class_fields(kind: str) -> set[str] | None:
    """Field names of TrainingArguments / LoraConfig / BitsAndBytesConfig, from the installed libraries."""
    import dataclasses
    import inspect

    try:
        if kind == "training":
            from transformers import TrainingArguments

            return {f.name for f in dataclasses.fields(TrainingArguments)}
        if kind == "lora":
            from peft import LoraConfig

            return {f.name for f in dataclasses.fields(LoraConfig)}
        if kind == "quantization":
            from transformers import BitsAndBytesConfig

            return set(inspect.signature(BitsAndBytesConfig.__init__).parameters) - {"self", "kwargs"}
    except ImportError:
        return None
    return None
