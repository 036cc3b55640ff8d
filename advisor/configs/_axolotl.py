"""axolotl.yaml: the plan as an axolotl config (``axolotl train axolotl.yaml``), written and read back.

Field names and types from axolotl 0.19's config schema, ``src/axolotl/utils/schemas/``:
``model.py`` (base_model, trust_remote_code, output_dir), ``peft.py`` LoraConfig (adapter,
load_in_8bit, load_in_4bit, lora_r, lora_alpha: int, lora_dropout, lora_target_modules,
lora_target_linear, bnb_config_kwargs), ``training.py`` (micro_batch_size,
gradient_accumulation_steps, learning_rate, optimizer, lr_scheduler, num_epochs), ``config.py``
(sequence_len, pad_to_sequence_len, bf16, fp16, tf32, gradient_checkpointing,
gradient_checkpointing_kwargs, attn_implementation, chunked_cross_entropy, deepspeed, max_steps,
warmup_steps, logging_steps, save_steps, val_set_size); the documented reference is
docs/config-reference.qmd in axolotl-ai-cloud/axolotl. tests/test_export_thirdparty.py validates
the output with axolotl's own ``validate_config`` (in CI: .ci/thirdparty-envs.sh), and always against the
field list in tests/data/axolotl_fields.txt. What axolotl turns on beyond the file: docs/exports.md.

What axolotl cannot express, and so is refused rather than approximated: fp32 master weights
under autocast (``bf16: true`` loads the weights in bf16: axolotl's precision is the Plan's pure
bf16/fp16), and a non-integer lora_alpha. The 4-bit compute dtype goes through
``bnb_config_kwargs`` (axolotl merges it into its BitsAndBytesConfig after setting its own).

Reading takes axolotl's own defaults for what a file leaves out (nf4 with double quantization for
qlora, ``bf16: auto`` as bf16, sequence_len 512, adamw_torch_fused). The keys a knob declares for
"axolotl" (advisor.core.plan) are written and read by advisor.configs._keys; this module handles the
knobs it declares ``Custom``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.configs.formats import FORMATS
from advisor.configs._base import (ADAM, LR_SCHEDULER, OPTIM_ALIASES, TORCH_DTYPE, TORCH_TO_PLAN, WARMUP_STEPS, Collect,
                                   comment_block, dump_yaml, env_note, env_prefix, ExportContext, fsdp_refusal,
                                   plan_summary, require_int_alpha, training_hyperparameters, Unsupported,
                                   vision_script_rules, write_text)
from advisor.configs import _rl_tools
from advisor.configs._deepspeed import read_offload
from advisor.configs._keys import DECLARED, fill, flat, read_declared, refuse_unexpressible
from advisor.configs._training_args import GALORE_TARGETS, all_layers_only, optim_args, read_optim_args
from advisor.memory.tiled_mlp import num_shards
from advisor.core.plan import ALL_LINEAR, ATTENTION, LOW_RANK_OPTIMIZERS, RL_TASKS, compute_dtype_for

FILENAME = FORMATS["axolotl"].filename
FORMAT = "axolotl"
HIDDEN_STATES = "hidden_states"
"""axolotl's activation_offloading value for checkpoint offload (utils/schemas/config.py, axolotl >= 0.18)."""


def axolotl_config(ctx: ExportContext) -> dict[str, Any]:
    plan = ctx.plan
    if plan.precision.startswith("mixed"):
        raise Unsupported(FORMAT, f"axolotl loads the weights in the autocast dtype; it has no {plan.precision} "
                          "(fp32 weights with 16-bit autocast)")
    alpha = require_int_alpha(FORMAT, plan)
    cfg: dict[str, Any] = {
        "base_model": ctx.model_id,
        "trust_remote_code": False,
        "load_in_8bit": plan.quantization == "int8",
        "load_in_4bit": plan.four_bit,
    }
    if plan.peft:
        cfg["adapter"] = plan.method  # lora | qlora
        if plan.four_bit:
            cfg["bnb_config_kwargs"] = {
                "bnb_4bit_quant_type": plan.quantization,
                "bnb_4bit_use_double_quant": bool(plan.double_quant),
                "bnb_4bit_compute_dtype": TORCH_DTYPE[plan.compute_dtype],
            }
        cfg["lora_r"] = DECLARED
        cfg["lora_alpha"] = alpha
        cfg["lora_dropout"] = DECLARED
        from advisor.core.adapters import export_parameters, export_targets, language_model_regex

        targets = export_targets(ctx.spec, plan)
        if ctx.spec.is_vision_language:  # a regex on the language model: short names would reach the tower
            cfg["lora_target_modules"] = language_model_regex(ctx.spec, plan)
        elif targets == "all-linear":
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = list(targets)
        parameters = export_parameters(ctx.spec, plan)
        if parameters:
            cfg["lora_target_parameters"] = parameters  # axolotl: needs lora_dropout 0 (peft ParamWrapper)
    cfg.update(_multimodal_fields(ctx))
    cfg.update({
        "datasets": [{"path": "data.jsonl", "ds_type": "json", "type": "chat_template"} if ctx.spec.is_vision_language
                     else {"path": "data.jsonl", "ds_type": "json", "type": "completion", "field": "text"}],
        "val_set_size": 0.0,
        "output_dir": "./outputs",
        "sequence_len": DECLARED,
        "pad_to_sequence_len": True,
        "sample_packing": DECLARED,
        "micro_batch_size": DECLARED,
        "eval_batch_size": DECLARED,
        "gradient_accumulation_steps": DECLARED,
        "num_epochs": 1.0,
        "optimizer": plan.optimizer,
        "learning_rate": training_hyperparameters(plan)["learning_rate"],
        "lr_scheduler": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        "weight_decay": ADAM["weight_decay"],
        "max_grad_norm": training_hyperparameters(plan)["max_grad_norm"],
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "tf32": False,
        "gradient_checkpointing": bool(plan.gradient_checkpointing),
    })
    if plan.gradient_checkpointing:
        cfg["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    cfg["attn_implementation"] = plan.attn_impl
    cfg.update(_lever_fields(plan))
    cfg["peft_use_dora"] = DECLARED
    if ctx.fsdp:
        raise Unsupported(FORMAT, fsdp_refusal(ctx, "is written for transformers' Trainer only"))
    if ctx.zero_stage is not None:
        cfg["deepspeed"] = ctx.deepspeed_path
    cfg["logging_steps"] = 10
    cfg["save_steps"] = 500
    refuse_unexpressible(plan, FORMAT)
    cfg.update(_memory_lever_fields(plan, ctx.spec))
    from advisor.configs._rope import rope_overrides

    rope = rope_overrides(ctx.spec, plan)
    if rope:  # --rope-scaling: axolotl 0.19 sets each key on the loaded config (loaders/utils.py; rope_scaling is gone)
        cfg["overrides_of_model_config"] = rope
    cfg = fill(cfg, ctx.file_plan, FORMAT)  # a vision-language sample's image tokens within sequence_len
    if plan.task in RL_TASKS:  # rl: grpo|dpo (advisor.configs._rl_tools)
        cfg = _rl_tools.axolotl_rl(cfg, ctx)
    return cfg


LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
VISION_TEMPLATES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen2_vl",
                    "qwen3_vl_moe": "qwen2_vl", "gemma3": "gemma3", "mllama": "llama3_2_vision"}
"""axolotl's chat_template for a vision-language model_type (docs/multimodal.qmd per model; Qwen3-VL and Qwen2.5-VL
take qwen2_vl's); the others use the checkpoint's own template (tokenizer_default)."""


def _multimodal_fields(ctx: ExportContext) -> dict[str, Any]:
    """axolotl's multimodal keys (docs/multimodal.qmd "Usage"): the processor, batches built at training time, the
    columns kept for the collator, no sample packing; ``freeze_mm_modules`` freezes the tower and the projector
    (utils/freeze.py: every parameter under vision_tower / visual / multi_modal_projector / ...)."""
    if not ctx.spec.is_vision_language:
        return {}
    vision_script_rules(ctx, FORMAT, "axolotl's multimodal path")
    template = VISION_TEMPLATES.get(ctx.spec.config.get("model_type"))
    return {"processor_type": "AutoProcessor", "skip_prepare_dataset": True, "remove_unused_columns": False,
            "freeze_mm_modules": True, **({"chat_template": template} if template else {})}


def _lever_fields(plan) -> dict[str, Any]:
    """The loss: chunked_cross_entropy; Liger's plugin with only its fused linear cross-entropy
    (src/axolotl/integrations/liger/README.md: plugins, liger_fused_linear_cross_entropy)."""
    out: dict[str, Any] = {}
    if plan.loss == "chunked":
        out["chunked_cross_entropy"] = True
    elif plan.loss == "fused-linear":
        out["plugins"] = [LIGER_PLUGIN]
        out["liger_fused_linear_cross_entropy"] = True
    return out


def _memory_lever_fields(plan, spec) -> dict[str, Any]:
    """The low-rank optimizer's arguments and activation offload (optimizer_in_backward: refused by its
    declaration; some of the layers checkpointed: refused here)."""
    all_layers_only(FORMAT, plan, spec)
    out: dict[str, Any] = {}
    if plan.optimizer in LOW_RANK_OPTIMIZERS:
        out["optim_target_modules"] = list(GALORE_TARGETS)
        out["optim_args"] = optim_args(plan)
    if plan.activation_offload:
        if not plan.gradient_checkpointing:
            # axolotl's validator: "activation_offloading requires gradient_checkpointing" (schemas/validation.py)
            raise Unsupported(FORMAT, "its activation_offloading requires gradient_checkpointing; the plan offloads "
                                      "activations without checkpointing (use the advisor.yaml or trl.yaml export)")
        if plan.task in RL_TASKS:
            raise Unsupported(FORMAT, "its DPO / GRPO trainers have no checkpoint offload (ActivationOffloadingMixin "
                                      "is its SFT trainer's, core/trainers/base.py): use the trl.yaml export")
        # checkpoint offload: axolotl >= 0.18's activation_offloading: hidden_states offloads only the checkpointed
        # layers' inputs to pinned host memory (monkeypatch/checkpoint_activation_offload.py
        # CheckpointHiddenStatesOffload, on a side stream with max_fwd_stash_size 2: up to two inputs still on the
        # GPU while their copies run); its true is TRL's offloader of every activation, which the plan does not size
        out["activation_offloading"] = HIDDEN_STATES
    if plan.sp_degree > 1:
        # axolotl's context_parallel_size is ring attention by ring-flash-attn, which its validator ties to
        # flash_attention_2 and (packed) micro-batch 1 (utils/schemas/validation.py check_context_parallel_size)
        if plan.sp_backend != "ring":
            raise Unsupported(FORMAT, "its context_parallel_size is ring attention (ring-flash-attn); Ulysses is not "
                                      "offered: use --sp-backend ring, or the advisor.yaml / trl.yaml export")
        if plan.attn_impl != "flash_attention_2":
            raise Unsupported(FORMAT, "its ring attention (context_parallel_size) needs --attn-impl flash_attention_2")
        if plan.packing and plan.micro_batch > 1:
            raise Unsupported(FORMAT, "ring-flash-attn takes packed sequences at --micro-batch 1 only")
    out.update(tiled_mlp_keys(plan, spec))
    return out


def tiled_mlp_keys(plan, spec) -> dict[str, Any]:
    """The tiled MLP is axolotl's ``tiled_mlp`` (monkeypatch/tiled_mlp: ALST's TiledMLP on the model's MLP class),
    with ALST's shard count written out: axolotl's own default is ceil(seq / 32768) shards, not the
    ceil(seq_len / hidden_size) the plan sizes (utils/schemas/config.py tiled_mlp_num_shards)."""
    if not plan.tiled_mlp:
        return {}
    return {"tiled_mlp": True, "tiled_mlp_num_shards": num_shards(spec, plan)}


def write(ctx: ExportContext, out_dir: Path) -> Path:
    if ctx.spec.is_vision_language and ctx.plan.task in RL_TASKS:
        raise Unsupported(FORMAT, f"the exported {ctx.plan.task.upper()} run trains text models only")
    cfg = axolotl_config(ctx)
    header = comment_block([
        "axolotl config written by vram-advisor.",
        *plan_summary(ctx),
        "",
        f"Run:  {_launch(ctx)}",
        *env_note(ctx, FILENAME),
        *(_rl_tools.axolotl_header(ctx) if ctx.plan.task in RL_TASKS else _data_note(ctx)),
        *([f"deepspeed: {ctx.deepspeed_path} (by its absolute path: edit it if the folder moves)."]
          if ctx.zero_stage is not None else []),
    ])
    if ctx.plan.task == "grpo":  # the reward module trl.reward_funcs names
        write_text(out_dir / _rl_tools.REWARDS_FILE, _rl_tools.REWARDS_TEMPLATE)
    return write_text(out_dir / FILENAME, dump_yaml(cfg, header))


def _data_note(ctx: ExportContext) -> list[str]:
    if ctx.spec.is_vision_language:
        return ["Replace `datasets` with yours (here: data.jsonl of {\"messages\": [...], \"images\": [...]}, "
                "axolotl's",
                "multimodal chat_template format). axolotl neither cuts nor drops a sample longer than sequence_len",
                f"(docs/multimodal.qmd): keep text and image tokens within {ctx.file_plan.seq_len:,}, the length "
                "planned", f"({ctx.plan.seq_len:,} of text and the planned images'), as sequence_len says.",
                *_pixel_note(ctx)]
    return ["Replace `datasets` with yours (here: data.jsonl, one {\"text\": ...} per line). pad_to_sequence_len",
            "keeps every batch at sequence_len tokens, the length the memory plan was sized for."]


def _pixel_note(ctx: ExportContext) -> list[str]:
    """axolotl has no key for the processor's pixel budget: the images must be no larger than the planned ones."""
    budget = ctx.file_plan.max_pixels if ctx.file_plan.max_pixels != ctx.plan.max_pixels else None
    return [f"axolotl has no key for the processor's max_pixels: resize your images to at most {budget:,} pixels",
            "(the planned ones' size), or a larger one takes more tokens than planned."] if budget else []


def _launch(ctx: ExportContext) -> str:
    """axolotl's training entry point, one process per GPU under accelerate (axolotl docs: multi-gpu)."""
    if ctx.gpus == 1:
        return f"{env_prefix(ctx.plan)}axolotl train {ctx.file(FILENAME)}"
    return (f"{env_prefix(ctx.plan)}accelerate launch --num_processes {ctx.gpus} -m axolotl.cli.train "
            f"{ctx.file(FILENAME)}")


# --------------------------------------------------------------------------- reading


def read(data: dict, c: Collect, plan_type: type) -> tuple[str | None, dict, dict]:
    f: dict[str, Any] = {}
    name = c.get(data, "base_model", "base_model", "str")
    if name is None:
        c.bad("base_model", "the model to train is required", None)
    adapter = data.get("adapter") or None
    q4 = c.get(data, "load_in_4bit", "load_in_4bit", "bool", False, record=False)
    q8 = c.get(data, "load_in_8bit", "load_in_8bit", "bool", False, record=False)
    bf16 = data.get("bf16", "auto")
    if bf16 == "auto":
        c.defaulted.append("bf16")  # axolotl picks bf16 where the GPU has it
        bf16 = True
    fp16 = c.get(data, "fp16", "fp16", "bool", False, record=False)
    bf16 = bool(bf16) or bool(data.get("bfloat16"))
    fp16 = bool(fp16) or bool(data.get("float16"))
    if bf16 and fp16:
        c.bad("fp16", "bf16 and fp16 cannot both be on", True)
    f["precision"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    f["method"], f["quantization"] = "full", "none"
    if adapter not in (None, "lora", "qlora"):
        c.bad("adapter", "must be lora, qlora or empty (full fine-tuning)", adapter)
    elif adapter == "qlora" or (adapter == "lora" and q4):
        if adapter == "lora" and q4:
            c.bad("adapter", "axolotl quantizes to 4 bits only with adapter: qlora", adapter)
        bnb = data.get("bnb_config_kwargs") or {}
        f["method"] = "qlora"
        f["quantization"] = c.choice(bnb.get("bnb_4bit_quant_type", "nf4"), {"nf4": "nf4", "fp4": "fp4"},
                                     "bnb_config_kwargs.bnb_4bit_quant_type")
        f["double_quant"] = c.get(bnb, "bnb_4bit_use_double_quant", "bnb_config_kwargs.bnb_4bit_use_double_quant",
                                  "bool", True, record=False)  # axolotl's default: on
        f["compute_dtype"] = c.choice(bnb.get("bnb_4bit_compute_dtype", TORCH_DTYPE[compute_dtype_for(f["precision"])]),
                                      TORCH_TO_PLAN, "bnb_config_kwargs.bnb_4bit_compute_dtype")
        if not q4:
            c.bad("load_in_4bit", "adapter: qlora needs load_in_4bit: true", q4)
    elif adapter == "lora":
        f["method"] = "lora"
        f["quantization"] = "int8" if q8 else "none"
    elif q4 or q8:
        c.bad("adapter", "load_in_4bit / load_in_8bit need an adapter (axolotl refuses them for full fine-tuning)",
              adapter)
    read_declared(c, plan_type, FORMAT, flat(data), f)
    _rl_tools.read_axolotl_rl(data, c, f)
    if f["method"] != "full":
        f["lora_alpha"] = float(c.get(data, "lora_alpha", "lora_alpha", "num", 16))  # axolotl's default
        if data.get("lora_target_linear"):
            f["lora_targets"] = ALL_LINEAR
        else:
            f["lora_targets"] = c.targets(data.get("lora_target_modules"), "lora_target_modules")
            if data.get("lora_target_modules") is None:
                c.bad("lora_target_modules", "is required unless lora_target_linear: true", None)
        f["lora_experts"] = c.expert_parameters(data.get("lora_target_parameters"), "lora_target_parameters",
                                                "mlp.experts.gate_up_proj")
    gc = data.get("gradient_checkpointing", False)
    if gc not in (True, False, None):
        c.bad("gradient_checkpointing", "only true/false are planned (offloaded checkpoints are not)", gc)
    f["gradient_checkpointing"] = bool(gc is True)
    f["optimizer"] = c.choice(data.get("optimizer", "adamw_torch_fused"), OPTIM_ALIASES, "optimizer")
    if "optimizer" not in data:
        c.defaulted.append("optimizer")
    read_optim_args(data.get("optim_args"), "optim_args", c, f)
    offload = data.get("activation_offloading", False)
    if offload not in (HIDDEN_STATES, False, None):
        c.bad("activation_offloading", f"only {HIDDEN_STATES} (checkpoint offload) or false are planned (true / legacy "
              "/ disk are TRL's offloader of every activation, which replaces recompute for LoRA)", offload)
    f["activation_offload"] = offload == HIDDEN_STATES
    if f["activation_offload"]:  # axolotl turns checkpointing on for it (core/builders/base.py)
        f["gradient_checkpointing"] = True
    if (data.get("context_parallel_size") or data.get("sequence_parallel_degree") or 1) > 1:
        f["sp_backend"] = "ring"  # axolotl's context parallelism is ring-flash-attn's
        if data.get("sequence_parallel_degree") and not data.get("context_parallel_size"):
            f["sp_degree"] = c.get(data, "sequence_parallel_degree", "sequence_parallel_degree", "int")
    f["tiled_mlp"] = c.get(data, "tiled_mlp", "tiled_mlp", "bool", False, record=False) or False
    if f["tiled_mlp"] and not isinstance(data.get("tiled_mlp_num_shards"), int):
        c.bad("tiled_mlp_num_shards", "is required with tiled_mlp, a whole number: axolotl's default (seq / 32768 "
              "shards) is not ALST's ceil(seq_len / hidden_size) the plan sizes", data.get("tiled_mlp_num_shards"))
    attn = data.get("attn_implementation")
    if attn is None:
        attn = ("flash_attention_2" if data.get("flash_attention") else "eager" if data.get("eager_attention")
                else "sdpa")
    f["attn_impl"] = c.choice(attn, {a: a for a in ATTENTION}, "attn_implementation")
    from advisor.configs._rope import read_rope

    if data.get("rope_scaling"):  # axolotl 0.19's deprecated.py refuses it: "should now be a key under model_config"
        c.bad("rope_scaling", "axolotl no longer takes it: put rope_parameters under overrides_of_model_config",
              data["rope_scaling"])
    where = "model_config" if "model_config" in data else "overrides_of_model_config"  # the field and its alias
    f["rope_scaling"] = read_rope(data.get(where), where, c)
    f["loss"] = ("fused-linear" if data.get("liger_fused_linear_cross_entropy") or data.get("cut_cross_entropy")
                 else "chunked" if data.get("chunked_cross_entropy") else "plain")
    f["offload"], ds = read_offload(c, data.get("deepspeed"), "deepspeed")
    if data.get("processor_type") and f["method"] == "full" and not c.get(
            data, "freeze_mm_modules", "freeze_mm_modules", "bool", False, record=False):
        f["vision_tower"], f["train_projector"] = "full", True  # a multimodal full fine-tune trains every weight
    return name, f, {"deepspeed": ds}
