"""trl.yaml + train_trl.py: the plan as a TRL ``SFTTrainer`` run (``trl sft --config trl.yaml``); and trl.yaml
read back.

trl.yaml is flat, as TRL's own CLI reads it (``TrlParser`` over ``SFTConfig`` and ``ModelConfig``):
``SFTConfig`` keys (transformers ``TrainingArguments`` plus TRL's ``max_length``, ``packing``,
``packing_strategy``, ``padding_free``, ``dataset_text_field``, ``loss_type``; trl/trainer/sft_config.py)
and ``ModelConfig`` keys (``model_name_or_path``, ``dtype``, ``attn_implementation``, ``use_peft``,
``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``, ``use_dora``, ``load_in_4bit``,
``load_in_8bit``, ``bnb_4bit_quant_type``, ``use_bnb_nested_quant``; trl/trainer/model_config.py),
field names checked against trl 1.16 in tests/test_export_trl.py by TRL's own parser.

The mapping is a table, one row per key (``ROWS``): a row returns the value for a plan, ``SKIP`` when
the key does not apply, ``DECLARED`` for a key a knob declares for "trl" (advisor.core.plan; written and
read by advisor.configs._keys), or raises ``Unsupported`` for what TRL cannot express. What TRL decides
itself:

- the loss: TRL 1.16's ``SFTTrainer`` always computes it through its fused LM head
  (trl.trainer.utils.add_fused_lm_head: 4,096-token x 32,768-vocabulary tiles, no full logits), and it
  refuses Liger's fused linear cross-entropy (``liger_kernel_config={"fused_linear_cross_entropy": True}``
  raises). A plan sized for the plain or chunked loss therefore holds no more than it was sized for;
  the header says so.
- the 4-bit compute dtype is ``dtype`` (trl get_quantization_config): a different one is refused.
- packing: ``packing_strategy: bfd`` is padding-free (position_ids per document, flash-attention's
  varlen or a block-diagonal mask), the Plan's ``packing``; without it batches are padded to their
  longest sequence (DataCollatorForLanguageModeling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from advisor.configs.formats import FORMATS
from advisor.configs._base import (ADAM, LR_SCHEDULER, PRECISION_FLAGS, TORCH_DTYPE, TORCH_TO_PLAN, VISION_SCRIPT,
                                   WARMUP_STEPS, Collect, comment_block, dump_yaml, env_note, env_prefix, ExportContext,
                                   fsdp_offloads, parallel_fields, plan_summary, require_int_alpha,
                                   sequence_parallel_rules, template, training_hyperparameters, Unsupported,
                                   vision_script_rules, write_long_context_script, write_text, write_vision_script)
from advisor.configs import _trl_rl
from advisor.configs._deepspeed import check_batch, read_offload
from advisor.configs._keys import DECLARED, fill, flat, read_declared, refuse_unexpressible
from advisor.configs._training_args import (checkpoint_layers_of, every_n, read_checkpointing, read_optimizer,
                                            read_precision, training_arguments_fields)
from advisor.core.adapters import export_parameters, export_targets
from advisor.core.plan import ALL_LINEAR, RL_TASKS, checkpointed_layers, knob_of

FILENAME = FORMATS["trl"].filename
SCRIPT = "train_trl.py"
FORMAT = "trl"
SKIP = object()
"""A row's value when its key does not apply to the plan (not written)."""


def _dtype(ctx: ExportContext) -> str:
    return PRECISION_FLAGS[ctx.plan.precision][0]


def _compute_dtype(ctx: ExportContext) -> Any:
    plan = ctx.plan
    if not plan.four_bit:
        return SKIP
    if TORCH_DTYPE[plan.compute_dtype] != _dtype(ctx):
        raise Unsupported(FORMAT, f"TRL's 4-bit compute dtype is the weights' dtype ({_dtype(ctx)}), "
                                  f"not {TORCH_DTYPE[plan.compute_dtype]}")
    return SKIP  # nothing to write: it follows dtype


def _declared(ctx: ExportContext) -> Any:
    """A key a knob declares for "trl": its value comes from the declaration (advisor.configs._keys.fill)."""
    return DECLARED


ROWS: list[tuple[str, Callable[[ExportContext], Any]]] = [
    # ModelConfig: the model, its dtype and attention, quantization, the adapters
    ("model_name_or_path", lambda ctx: ctx.model_id),
    ("dtype", _dtype),
    ("attn_implementation", _declared),
    ("load_in_4bit", lambda ctx: True if ctx.plan.four_bit else SKIP),
    ("load_in_8bit", lambda ctx: True if ctx.plan.quantization == "int8" else SKIP),
    ("bnb_4bit_quant_type", lambda ctx: ctx.plan.quantization if ctx.plan.four_bit else SKIP),
    ("use_bnb_nested_quant", _declared),
    ("bnb_4bit_quant_storage", lambda ctx: _dtype(ctx) if ctx.plan.four_bit and (ctx.zero_stage == 3 or ctx.fsdp)
     else SKIP),  # 4-bit weights sharded with the others: stored in the weights' dtype
    ("_compute_dtype", _compute_dtype),
    ("use_peft", lambda ctx: ctx.plan.peft),
    ("lora_r", _declared),
    ("lora_alpha", lambda ctx: require_int_alpha(FORMAT, ctx.plan) if ctx.plan.peft else SKIP),
    ("lora_dropout", _declared),
    ("lora_target_modules", lambda ctx: export_targets(ctx.spec, ctx.plan) if ctx.plan.peft else SKIP),
    ("lora_target_parameters", lambda ctx: export_parameters(ctx.spec, ctx.plan) or SKIP),
    ("use_dora", _declared),
    # SFTConfig: the data, the step, the loss
    ("dataset_text_field", lambda ctx: "text"),
    ("max_length", _declared),
    ("packing", lambda ctx: bool(ctx.plan.packing)),
    ("packing_strategy", lambda ctx: "bfd" if ctx.plan.packing else SKIP),
    ("loss_type", lambda ctx: "nll"),
    ("per_device_train_batch_size", _declared),
    ("per_device_eval_batch_size", _declared),
    ("gradient_accumulation_steps", _declared),
    ("gradient_checkpointing", lambda ctx: bool(ctx.plan.gradient_checkpointing)),
    ("gradient_checkpointing_kwargs", lambda ctx: {"use_reentrant": False} if ctx.plan.gradient_checkpointing
     else SKIP),
    ("optim", lambda ctx: ctx.plan.optimizer),
    ("bf16", lambda ctx: PRECISION_FLAGS[ctx.plan.precision][1]),
    ("fp16", lambda ctx: PRECISION_FLAGS[ctx.plan.precision][2]),
    ("learning_rate", lambda ctx: training_hyperparameters(ctx.plan)["learning_rate"]),
    ("lr_scheduler_type", lambda ctx: LR_SCHEDULER),
    ("warmup_steps", lambda ctx: WARMUP_STEPS),
    *((k, (lambda v: lambda ctx: v)(v)) for k, v in ADAM.items() if k != "max_grad_norm"),
    ("max_grad_norm", lambda ctx: training_hyperparameters(ctx.plan)["max_grad_norm"]),
    ("num_train_epochs", lambda ctx: 1),
    ("output_dir", lambda ctx: "outputs"),
    ("logging_steps", lambda ctx: 10),
    ("save_steps", lambda ctx: 500),
    ("report_to", lambda ctx: "none"),
    ("deepspeed", lambda ctx: parallel_fields(ctx).get("deepspeed", SKIP)),  # by absolute path: any cwd
    ("fsdp", lambda ctx: parallel_fields(ctx).get("fsdp", SKIP)),
    ("fsdp_config", lambda ctx: parallel_fields(ctx).get("fsdp_config", SKIP)),
]
"""(key, value of a plan) in the order written; keys starting with "_" are checks that write nothing."""


def trl_config(ctx: ExportContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in ROWS:
        v = value(ctx)
        if v is not SKIP and not key.startswith("_"):
            out[key] = v
    refuse_unexpressible(ctx.plan, FORMAT)
    # the optimizer's arguments, checkpointing kwargs and activation offloading, refused where TRL cannot say them
    out.update(_memory_lever_fields(ctx.plan, ctx.spec))
    out.update(_rope_fields(ctx))
    out = fill(out, ctx.file_plan, FORMAT)  # a vision-language sample's image tokens within max_length
    if ctx.plan.task in RL_TASKS:  # GRPOConfig / DPOConfig instead of SFTConfig (advisor.configs._trl_rl)
        out = _trl_rl.rl_config(out, ctx)
    if ctx.spec.is_vision_language:
        # what SFTConfig has no field for, read by train_trl.py's vision_setup.py (`trl sft` ignores the key)
        out["vision"] = fill({}, ctx.file_plan, FORMAT, "vision")  # the planned images' pixel budget
        out["remove_unused_columns"] = False  # the samples' messages and images reach TRL's collator
    if ctx.plan.sp_degree > 1:
        # accelerate's ParallelismConfig, built by train_trl.py (SFTConfig's parallelism_config is an object, not
        # a YAML value; `trl sft` ignores the key: give it an accelerate config with parallelism_config_sp_size)
        out["sequence_parallel"] = fill({}, ctx.plan, FORMAT, "sequence_parallel")
    return out


def _memory_lever_fields(plan, spec) -> dict[str, Any]:
    """SFTConfig keys (TrainingArguments' plus TRL's ``activation_offloading``, trl/trainer/sft_config.py).

    Checkpointed-input offload is TrainingArguments' ``gradient_checkpointing_kwargs.offload``; offload
    without checkpointing is TRL's own ``activation_offloading`` (OffloadActivations around the loss)."""
    out = training_arguments_fields(plan, spec)
    if plan.gradient_checkpointing and plan.checkpoint_layers is not None \
            and len(checkpointed_layers(plan, spec.num_layers)) < spec.num_layers and every_n(plan, spec) is None:
        raise Unsupported(FORMAT, f"checkpointing {plan.checkpoint_layers} of {spec.num_layers} layers is not every "
                                  "n-th layer (gradient_checkpointing_kwargs.every_n_layers); use the advisor.yaml "
                                  "+ train.py export")
    if plan.activation_offload and not plan.gradient_checkpointing:
        out["activation_offloading"] = True
    return out


def _rope_fields(ctx: ExportContext) -> dict[str, Any]:
    """--rope-scaling: SFTConfig's ``model_init_kwargs`` (SFTTrainer passes them to from_pretrained for a model
    named by its id, train_trl.py to its own from_pretrained): the config's rope_parameters and
    max_position_embeddings (advisor.configs._rope)."""
    from advisor.configs._rope import rope_overrides

    rope = rope_overrides(ctx.spec, ctx.plan)
    if rope and ctx.plan.task in RL_TASKS:
        raise Unsupported(FORMAT, "its exported GRPO / DPO scripts load the policy (and vLLM its copy) without "
                                  "model_init_kwargs: --rope-scaling is exported for SFT only")
    return {"model_init_kwargs": rope} if rope else {}


def _loss_note(plan) -> list[str]:
    if plan.loss == "fused-linear":
        return ["loss: TRL's fused LM head (no full logits), the plan's fused-linear loss in TRL's own tiling."]
    return [f"loss: the plan was sized for the {plan.loss} loss; TRL always fuses the LM head into the loss",
            "(no full logits), so a run holds at most what was planned."]


def _checkpoint_note(ctx: ExportContext) -> list[str]:
    """Header lines for a plan that checkpoints some of the layers: which, and the key that says it."""
    n = every_n(ctx.plan, ctx.spec)
    if n is None:
        return []
    k = len(checkpointed_layers(ctx.plan, ctx.spec.num_layers))
    return [f"gradient checkpointing: {k} of {ctx.spec.num_layers} layers, one in every {n} "
            f"(gradient_checkpointing_kwargs.every_n_layers: {n}),",
            "not every layer: the memory plan keeps the other layers' activations."]


def _trl_cli(ctx: ExportContext) -> str:
    """TRL's own CLI on trl.yaml (``trl sft`` starts accelerate; its ``--num_processes`` is accelerate's)."""
    procs = f" --num_processes {ctx.gpus}" if ctx.gpus > 1 else ""
    return (f"{env_prefix(ctx.plan)}trl sft --config {ctx.file(FILENAME)}{procs} "
            "--dataset_name <hub dataset with a text field>")


def template_text() -> str:
    return template(SCRIPT)


def _run_lines(ctx: ExportContext) -> list[str]:
    """How to run trl.yaml: train_trl.py, or TRL's own CLI (not for a vision-language model: ``trl sft`` builds the
    checkpoint's processor with its own pixel budget and trains what peft's names reach, the tower's included)."""
    if not ctx.spec.is_vision_language:
        return [f"Run:  {ctx.launch(SCRIPT, '--data my_data.jsonl', accelerate=True)}   (JSONL with a \"text\" field)",
                f"  or: {_trl_cli(ctx)}"]
    return [f"Run:  {ctx.launch(SCRIPT, '--data my_data.jsonl', accelerate=True)}   (JSONL of messages and images,",
            f"      see {VISION_SCRIPT}: it applies the vision mapping below; `trl sft` would ignore it, building the",
            "      checkpoint's processor at its own pixel budget and adapting the tower with the language model)."]


def write(ctx: ExportContext, out_dir: Path) -> Path:
    if ctx.plan.task not in RL_TASKS:
        vision_script_rules(ctx, FORMAT)
        sequence_parallel_rules(ctx, FORMAT)
    elif ctx.spec.is_vision_language:
        raise Unsupported(FORMAT, f"the exported {ctx.plan.task.upper()} script trains text models only")
    cfg = trl_config(ctx)
    if ctx.plan.task in RL_TASKS:
        return _write_rl(ctx, out_dir, cfg)
    header = comment_block([
        "TRL SFTTrainer config written by vram-advisor (SFTConfig + ModelConfig fields, flat).",
        *plan_summary(ctx),
        "",
        *_run_lines(ctx),
        *_loss_note(ctx.plan),
        *_checkpoint_note(ctx),
        *(["tiled_mlp: DeepSpeed's TiledMLP, applied by train_trl.py (no SFTConfig field: `trl sft` ignores it)."]
          if ctx.plan.tiled_mlp else []),
        *([f"deepspeed: {ctx.deepspeed_path} (by its absolute path: edit it if the folder moves)."]
          if ctx.zero_stage is not None else []),
        *env_note(ctx, FILENAME),
    ])
    path = write_text(out_dir / FILENAME, dump_yaml(cfg, header))
    script = write_text(out_dir / SCRIPT, template_text())
    script.chmod(0o755)
    write_vision_script(ctx, out_dir)
    write_long_context_script(ctx, out_dir)
    return path


def _write_rl(ctx: ExportContext, out_dir: Path, cfg: dict) -> Path:
    """trl.yaml as GRPOConfig / DPOConfig + ModelConfig fields, and the task's script (train_grpo.py, train_dpo.py)."""
    task = ctx.plan.task
    header = comment_block([
        f"TRL {_trl_rl.CONFIG_CLASS[task]} config written by vram-advisor ({_trl_rl.CONFIG_CLASS[task]} + ModelConfig "
        "fields, flat).",
        *plan_summary(ctx),
        "",
        *_trl_rl.header_lines(ctx),
        *([f"deepspeed: {ctx.deepspeed_path} (by its absolute path: edit it if the folder moves)."]
          if ctx.zero_stage is not None else []),
        *env_note(ctx, FILENAME),
    ])
    path = write_text(out_dir / FILENAME, dump_yaml(cfg, header))
    script = write_text(out_dir / _trl_rl.SCRIPTS[task], _trl_rl.template_text(task))
    script.chmod(0o755)
    return path


# --------------------------------------------------------------------------- reading

MODEL_KEYS = {"model_name_or_path", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
              "lora_dropout", "lora_target_modules", "use_dora", "load_in_4bit", "load_in_8bit",
              "bnb_4bit_quant_type", "use_bnb_nested_quant", "lora_task_type", "use_rslora", "trust_remote_code",
              "model_revision", "lora_modules_to_save", "lora_target_parameters", "bnb_4bit_quant_storage"}
"""ModelConfig's keys (trl/trainer/model_config.py); the rest of a flat trl.yaml is SFTConfig's."""


def read(data: dict, c: Collect, plan_type: type) -> tuple[str | None, dict, dict]:
    """A flat trl.yaml (SFTConfig + ModelConfig keys, as ``trl sft --config`` reads it) → (model, plan fields,
    extras). The 4-bit compute dtype is ``dtype`` (trl get_quantization_config); the loss is always TRL's
    fused LM head, read back as what runs: fused-linear."""
    f: dict[str, Any] = {}
    name = c.get(data, "model_name_or_path", "model_name_or_path", "str")
    if name is None:
        c.bad("model_name_or_path", "the model to train is required", None)
    training = {k: v for k, v in data.items() if k not in MODEL_KEYS}
    dtype = data.get("dtype") or "float32"
    read_precision(dtype, "dtype", training, "", c, f)
    ckpt = read_checkpointing(training, "", c, f)
    read_optimizer(training, "", c, f)
    f["offload"], ds = read_offload(c, training.get("deepspeed"), "deepspeed")
    if f["offload"] == "none" and fsdp_offloads(training.get("fsdp"), training.get("fsdp_config")):
        f["offload"] = "fsdp_cpu"
    f["quantization"] = "none"
    if c.get(data, "load_in_4bit", "load_in_4bit", "bool", False, record=False):
        f["quantization"] = c.choice(data.get("bnb_4bit_quant_type", "nf4"), {"nf4": "nf4", "fp4": "fp4"},
                                     "bnb_4bit_quant_type")  # ModelConfig's default: nf4
        f["compute_dtype"] = c.choice(dtype, TORCH_TO_PLAN, "dtype")
    elif c.get(data, "load_in_8bit", "load_in_8bit", "bool", False, record=False):
        f["quantization"] = "int8"
    if c.get(data, "use_peft", "use_peft", "bool", False, record=False):
        f["method"] = "qlora" if f["quantization"] in ("nf4", "fp4") else "lora"
        f["lora_alpha"] = float(c.get(data, "lora_alpha", "lora_alpha", "num", knob_of(plan_type, "lora_alpha").default,
                                      record=False))  # ModelConfig's default is the Plan's
        f["lora_targets"] = c.targets(data.get("lora_target_modules"), "lora_target_modules")
        if data.get("lora_target_modules") is None:
            c.bad("lora_target_modules", f"is required: list the module names or {ALL_LINEAR} (peft's per-model "
                  "default is not guessed)", None)
        f["lora_experts"] = c.expert_parameters(data.get("lora_target_parameters"), "lora_target_parameters")
    else:
        f["method"] = "full"
    task = _trl_rl.task_of(data)
    if task is not None:
        _trl_rl.read_rl(data, task, c, f)
    read_declared(c, plan_type, FORMAT, flat(data), f)
    check_batch(c, ds, f, "")
    f["activation_offload"] = bool(ckpt["kwargs"].get("offload")) or c.get(
        training, "activation_offloading", "activation_offloading", "bool", False, record=False)
    checkpoint_layers_of(ckpt, name, c, f)
    f["packing"] = c.get(data, "packing", "packing", "bool", False, record=False)
    from advisor.configs._rope import read_rope

    f["rope_scaling"] = read_rope(data.get("model_init_kwargs"), "model_init_kwargs", c)
    f["loss"] = "fused-linear"  # TRL's SFTTrainer always fuses the LM head into the loss (add_fused_lm_head)
    return name, f, {"deepspeed": ds, "fsdp": training.get("fsdp")}
