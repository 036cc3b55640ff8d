"""llamafactory.yaml: the plan as a LLaMA-Factory training config (``llamafactory-cli train``), written and
read back.

Field names from LLaMA-Factory 0.9.5 (hiyouga/LLaMA-Factory): the layout of
examples/train_qlora/llama3_lora_sft_otfq.yaml and examples/train_lora/llama3_lora_sft.yaml
(model_name_or_path, quantization_bit, quantization_method, stage, do_train, finetuning_type,
lora_target, dataset, template, cutoff_len, output_dir, per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, lr_scheduler_type, bf16, ...), and the argument
dataclasses in src/llamafactory/hparams/: model_args.py (quantization_type: nf4|fp4,
double_quantization, flash_attn: auto|disabled|sdpa|fa2, disable_gradient_checkpointing,
enable_liger_kernel, trust_remote_code), finetuning_args.py (lora_rank, lora_alpha: int,
lora_dropout, lora_target "all" or comma-separated, pure_bf16), data_args.py (cutoff_len) and
transformers' TrainingArguments (optim, deepspeed, ...). tests/test_export_thirdparty.py parses
the output with LLaMA-Factory's own ``get_train_args`` (in CI: .ci/thirdparty-envs.sh), and always against
tests/data/llamafactory_fields.txt. What LLaMA-Factory does beyond the file: docs/exports.md.

LLaMA-Factory semantics the mapping follows (src/llamafactory/model/adapter.py, parser.py):
gradient checkpointing is on unless ``disable_gradient_checkpointing``; weights load in the
autocast dtype; trainable parameters are upcast to fp32 unless ``pure_bf16``; the 4-bit compute
dtype is the autocast dtype. Hence full + ``bf16: true`` is the Plan's mixed_bf16, full +
``pure_bf16`` its bf16, LoRA + ``bf16: true`` its bf16 (fp32 adapters, as peft keeps them). Refused:
fp32 training (LLaMA-Factory picks a 16-bit dtype itself), LoRA over fp32 base weights, a compute
dtype other than the autocast dtype, a non-integer lora_alpha, pure_bf16 with ZeRO-3.
The fused-linear loss maps to ``enable_liger_kernel`` (Liger's fused linear cross-entropy never
holds all logits; it also swaps in Liger's RMSNorm/SwiGLU/RoPE kernels, which only lower the memory
the plan was sized for); the chunked loss has no LLaMA-Factory field and is refused. DoRA is
``use_dora``; packing is ``packing`` with ``neat_packing`` (no attention across packed documents); checkpoint
offload (activation offload with checkpointing) is ``use_unsloth_gc``.
GaLore / APOLLO are ``use_galore`` / ``galore_target`` / ``galore_rank`` / ``galore_update_interval`` /
``galore_layerwise`` and ``use_apollo`` / ``apollo_target`` / ``apollo_rank`` / ``apollo_update_interval``
(src/llamafactory/hparams/finetuning_args.py GaloreArguments, ApolloArguments; the GaLore optimizer class
follows ``optim``: adamw_torch → GaLoreAdamW, adamw_8bit → GaLoreAdamW8bit,
trainer_utils._create_galore_optimizer).

Reading takes LLaMA-Factory's own defaults for what a file leaves out (finetuning_type lora, rank 8,
alpha twice the rank, cutoff_len 2048, checkpointing on). The keys a knob declares for "llamafactory"
(advisor.core.plan) are written and read by advisor.configs._keys; this module handles the knobs it
declares ``Custom``.
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Any

from advisor.configs.formats import FORMATS
from advisor.configs._base import (HF_OPTIM_DEFAULT, LR_SCHEDULER, OPTIM_ALIASES, WARMUP_STEPS, Collect, comment_block,
                                   dump_yaml, env_note, env_prefix, ExportContext, fsdp_refusal, plan_summary,
                                   require_int_alpha, training_hyperparameters, Unsupported, write_text)
from advisor.configs import _rl_tools
from advisor.configs._deepspeed import read_offload
from advisor.configs._keys import DECLARED, fill, flat, read_declared, refuse_unexpressible
from advisor.configs._training_args import all_layers_only, read_optim_args
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import RL_TASKS, compute_dtype_for

FILENAME = FORMATS["llamafactory"].filename
FORMAT = "llamafactory"

FLASH_ATTN = {"sdpa": "sdpa", "eager": "disabled", "flash_attention_2": "fa2"}
FA3_UNSUPPORTED = ("LLaMA-Factory 0.9.5 lists flash_attn: fa3 but does not run it (model_utils/attention.py "
                   "configure_attn_implementation raises NotImplementedError for fa3, except gpt-oss's kernel; main "
                   "maps it to flash_attention_3 after 0.9.5, #10742): use --attn-impl flash_attention_2 for this "
                   "format")
"""Why an LLaMA-Factory export refuses flash_attention_3 (read in hiyouga/LLaMA-Factory v0.9.5)."""


def precision_flags(plan) -> dict[str, bool]:
    """bf16 / fp16 / pure_bf16 for the plan, or Unsupported."""
    p = plan.precision
    if plan.method == "full":
        table = {"mixed_bf16": {"bf16": True}, "mixed_fp16": {"fp16": True},
                 "bf16": {"bf16": True, "pure_bf16": True}}
    else:
        table = {"bf16": {"bf16": True}, "fp16": {"fp16": True}}
    if p not in table:
        raise Unsupported(FORMAT, f"LLaMA-Factory has no {p} for {plan.method} (it loads weights in the autocast "
                          "dtype and picks a 16-bit dtype itself)")
    flags = {"bf16": False, "fp16": False, "pure_bf16": False, **table[p]}
    if flags["pure_bf16"] and plan.offload == "zero3_cpu":
        raise Unsupported(FORMAT, "LLaMA-Factory refuses pure_bf16 with DeepSpeed ZeRO-3")
    if plan.quantized and plan.four_bit and plan.compute_dtype != plan.activation_dtype:
        raise Unsupported(FORMAT, f"LLaMA-Factory's 4-bit compute dtype is the autocast dtype "
                          f"({plan.activation_dtype}), not {plan.compute_dtype}")
    return flags


def vision_training_keys(plan) -> dict[str, bool]:
    """What trains in a vision-language model, as LLaMA-Factory says it (finetuning_args.py: freeze_vision_tower and
    freeze_multi_modal_projector, both true by default; with LoRA an unfrozen tower gets adapters on its linears,
    model_utils/visual.py patch_target_modules). Written only off LLaMA-Factory's defaults."""
    out: dict[str, bool] = {}
    if plan.vision_tower != "frozen":
        if (plan.vision_tower == "full") == plan.peft:
            raise Unsupported(FORMAT, f"LLaMA-Factory trains an unfrozen tower the way it trains the language model "
                              f"(finetuning_type {'lora' if plan.peft else 'full'}): it cannot say --vision-tower "
                              f"{plan.vision_tower} with --method {plan.method}")
        out["freeze_vision_tower"] = False
    if plan.train_projector:
        out["freeze_multi_modal_projector"] = False
    return out


VISION_TEMPLATES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl",
                    "qwen3_vl_moe": "qwen3_vl", "gemma3": "gemma3", "internvl": "intern_vl", "mllama": "mllama"}
"""A vision-language model's LLaMA-Factory template by model_type: the template names its image placeholder and
multimodal plugin (LLaMA-Factory 0.9.5 data/template.py register_template; Qwen2.5-VL uses qwen2_vl's)."""


def llamafactory_config(ctx: ExportContext) -> dict[str, Any]:
    plan = ctx.plan
    flags = precision_flags(plan)
    alpha = require_int_alpha(FORMAT, plan)
    cfg: dict[str, Any] = {"model_name_or_path": ctx.model_id, "trust_remote_code": False}
    if plan.quantized:
        cfg["quantization_bit"] = 8 if plan.quantization == "int8" else 4
        cfg["quantization_method"] = "bnb"
        if plan.four_bit:
            cfg["quantization_type"] = plan.quantization
            cfg["double_quantization"] = DECLARED
    if plan.attn_impl == "flash_attention_3":
        raise Unsupported(FORMAT, FA3_UNSUPPORTED)
    cfg["flash_attn"] = FLASH_ATTN[plan.attn_impl]
    cfg["disable_gradient_checkpointing"] = not plan.gradient_checkpointing
    cfg.update(checkpoint_offload_keys(plan))
    cfg.update(rope_scaling_keys(ctx.spec, plan))
    if plan.loss == "chunked":
        raise Unsupported(FORMAT, "LLaMA-Factory has no chunked loss: use --loss fused-linear (enable_liger_kernel)")
    if plan.loss == "fused-linear":
        cfg["enable_liger_kernel"] = True
    cfg.update({"stage": "sft", "do_train": True, "finetuning_type": "lora" if plan.peft else "full"})
    if plan.peft:
        cfg["lora_rank"] = DECLARED
        cfg["lora_alpha"] = alpha
        cfg["lora_dropout"] = DECLARED
        cfg["lora_target"] = "all" if plan.lora_targets == "all-linear" else ",".join(plan.lora_targets)
        cfg["use_dora"] = DECLARED
    cfg.update(vision_training_keys(plan))
    if flags["pure_bf16"]:
        cfg["pure_bf16"] = True
    template = VISION_TEMPLATES.get(ctx.spec.config.get("model_type")) if ctx.spec.is_vision_language else None
    cfg.update({
        "dataset": "mllm_demo" if ctx.spec.is_vision_language else "alpaca_en_demo",
        "template": template or "default",
        "cutoff_len": DECLARED,
        **({"packing": True, "neat_packing": True} if plan.packing else {}),
        "output_dir": "saves/advisor",
        "logging_steps": 10,
        "save_steps": 500,
        "per_device_train_batch_size": DECLARED,
        "per_device_eval_batch_size": DECLARED,
        "gradient_accumulation_steps": DECLARED,
        "optim": plan.optimizer,
        "learning_rate": training_hyperparameters(plan)["learning_rate"],
        "max_grad_norm": training_hyperparameters(plan)["max_grad_norm"],
        "num_train_epochs": 1.0,
        "lr_scheduler_type": LR_SCHEDULER,
        "warmup_steps": WARMUP_STEPS,
        "bf16": flags["bf16"],
        "fp16": flags["fp16"],
        "report_to": "none",
    })
    if ctx.fsdp:
        raise Unsupported(FORMAT, fsdp_refusal(ctx, "runs from an accelerate config in LLaMA-Factory, not its YAML"))
    if ctx.zero_stage is not None:
        cfg["deepspeed"] = ctx.deepspeed_path
    refuse_unexpressible(plan, FORMAT)
    cfg.update(_low_rank_fields(plan, ctx.spec))
    cfg = fill(cfg, ctx.file_plan, FORMAT)  # a vision-language sample's image tokens within cutoff_len
    if plan.task in RL_TASKS:  # stage: dpo (advisor.configs._rl_tools); GRPO refused
        cfg = _rl_tools.llamafactory_rl(cfg, ctx)
    return cfg


def checkpoint_offload_keys(plan) -> dict[str, Any]:
    """Checkpoint offload is ``use_unsloth_gc``: LLaMA-Factory's UnslothGradientCheckpointing keeps each checkpointed
    layer's input on the host (``hidden_states.to("cpu", non_blocking=True)``, pinned by torch's _to_copy) and
    brings it back for the layer's recompute (model/model_utils/checkpointing.py); offload without checkpointing
    has no key."""
    if not plan.activation_offload:
        return {}
    if not plan.gradient_checkpointing:
        raise Unsupported(FORMAT, "it has no activation offloading without checkpointing (use_unsloth_gc offloads "
                                  "the checkpointed layer inputs): use the advisor.yaml or trl.yaml export")
    return {"use_unsloth_gc": True}


def lf_rope_context(config: dict, context: int) -> int:
    """The length LLaMA-Factory scales from: the checkpoint's rope_scaling original_max_position_embeddings where it
    has one (Llama-3.1's 8,192), else max_position_embeddings (model/model_utils/rope.py configure_rope)."""
    own = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return int(own.get("original_max_position_embeddings") or context) if isinstance(own, dict) else context


def lf_rope_factor(config: dict, context: int, cutoff_len: int) -> int | None:
    """LLaMA-Factory's own factor for cutoff_len: ceil(cutoff_len / the length it scales from), None where cutoff_len
    is within it (it disables the scaling: "Input length is smaller than max length"; configure_rope)."""
    old = lf_rope_context(config, context)
    return math.ceil(cutoff_len / old) if cutoff_len > old else None


def rope_scaling_keys(spec, plan) -> dict[str, Any]:
    """--rope-scaling is ``rope_scaling: TYPE``; LLaMA-Factory computes the factor itself from cutoff_len, so a plan
    whose factor is not that one is refused with the factor that it would run."""
    from advisor.core.rope import rope_factor, rope_type

    kind = rope_type(plan.rope_scaling)
    if kind is None:
        return {}
    factor = lf_rope_factor(spec.config, spec.max_position_embeddings, plan.seq_len)
    if factor != rope_factor(plan.rope_scaling):
        old = lf_rope_context(spec.config, spec.max_position_embeddings)
        runs = (f"ceil(cutoff_len / {old:,}) = {factor}: use --rope-scaling {kind}:{factor}" if factor else
                f"none at cutoff_len {plan.seq_len:,} <= {old:,}")
        raise Unsupported(FORMAT, f"it computes the RoPE factor itself from cutoff_len, {runs} (or the advisor.yaml "
                                  f"export for {plan.rope_scaling})")
    return {"rope_scaling": kind}


def read_rope_scaling(data: dict, name: str | None, c: Collect) -> str:
    """``rope_scaling: TYPE`` back to TYPE:FACTOR, the factor LLaMA-Factory computes for cutoff_len on the model (a
    model the advisor resolves: the catalog, a directory, the HF cache)."""
    from advisor.core.rope import NONE, TYPES

    kind = data.get("rope_scaling")
    if kind in (None, NONE):
        return NONE
    if kind not in TYPES:
        c.bad("rope_scaling", f"only {', '.join(TYPES)} are planned", kind)
        return NONE
    from advisor.core.catalog import resolve_model

    try:
        spec = resolve_model(name)
    except AdvisorInputError:
        c.bad("rope_scaling", "LLaMA-Factory's factor comes from the model's context, and the advisor cannot "
              "resolve model_name_or_path", kind)
        return NONE
    factor = lf_rope_factor(spec.config, spec.max_position_embeddings, int(data.get("cutoff_len") or 2048))
    return NONE if factor is None else f"{kind}:{factor}"


LF_GALORE_OPTIM = {"galore_adamw": "adamw_torch", "galore_adamw_8bit": "adamw_8bit",
                   "galore_adamw_layerwise": "adamw_torch"}
"""The Plan's GaLore optimizer → LLaMA-Factory's optim under use_galore."""


def _low_rank_fields(plan, spec) -> dict[str, Any]:
    """GaLore / APOLLO as LLaMA-Factory's own keys (some of the layers checkpointed: refused)."""
    all_layers_only(FORMAT, plan, spec)
    out: dict[str, Any] = {}
    if plan.optimizer.startswith("galore"):
        out.update(optim=LF_GALORE_OPTIM[plan.optimizer], use_galore=True, galore_target="all",
                   galore_rank=plan.optim_rank, galore_update_interval=plan.optim_proj_gap,
                   galore_layerwise=plan.optimizer.endswith("layerwise"))
    elif plan.optimizer == "apollo_adamw":
        out.update(optim="adamw_torch", use_apollo=True, apollo_target="all", apollo_rank=plan.optim_rank,
                   apollo_update_interval=plan.optim_proj_gap)
    return out


def write(ctx: ExportContext, out_dir: Path) -> Path:
    cfg = llamafactory_config(ctx)
    header = comment_block([
        "LLaMA-Factory config written by vram-advisor.",
        *plan_summary(ctx),
        "",
        f"Run:  {_launch(ctx)}",
        "Set `dataset` (a name in your data/dataset_info.json) and `template` (the model's chat",
        "template, e.g. qwen for Qwen2.5, llama3 for Llama 3). cutoff_len is the sequence length the",
        "memory plan was sized for; longer examples are cut to it.",
        *([f"deepspeed: {ctx.deepspeed_path} (by its absolute path: edit it if the folder moves)."]
          if ctx.zero_stage is not None else []),
        *env_note(ctx, FILENAME),
    ])
    return write_text(out_dir / FILENAME, dump_yaml(cfg, header))


def _launch(ctx: ExportContext) -> str:
    """llamafactory-cli train; under DeepSpeed or on several GPUs through torchrun, which LLaMA-Factory starts with
    FORCE_TORCHRUN=1 and NPROC_PER_NODE (its README: distributed training; it refuses DeepSpeed without it)."""
    torchrun = ctx.gpus > 1 or ctx.zero_stage is not None
    prefix = f"FORCE_TORCHRUN=1 NNODES=1 NPROC_PER_NODE={ctx.gpus} " if torchrun else ""
    return f"{env_prefix(ctx.plan)}{prefix}llamafactory-cli train {ctx.file(FILENAME)}"


# --------------------------------------------------------------------------- reading


def read(data: dict, c: Collect, plan_type: type) -> tuple[str | None, dict, dict]:
    f: dict[str, Any] = {}
    name = c.get(data, "model_name_or_path", "model_name_or_path", "str")
    if name is None:
        c.bad("model_name_or_path", "the model to train is required", None)
    ft = data.get("finetuning_type", "lora")  # LLaMA-Factory's default
    if ft not in ("lora", "full"):
        c.bad("finetuning_type", "the advisor plans lora and full (not freeze or oft)", ft)
    bits = data.get("quantization_bit")
    f["quantization"] = "none"
    if bits is not None:
        if data.get("quantization_method", "bnb") not in ("bnb", "bitsandbytes"):
            c.bad("quantization_method", "only bitsandbytes (bnb) quantization is planned",
                  data.get("quantization_method"))
        if bits == 4:
            f["quantization"] = c.choice(data.get("quantization_type", "nf4"), {"nf4": "nf4", "fp4": "fp4"},
                                         "quantization_type")
        elif bits == 8:
            f["quantization"] = "int8"
        else:
            c.bad("quantization_bit", "bitsandbytes quantization is 4 or 8 bits", bits)
    bf16 = c.get(data, "bf16", "bf16", "bool", False, record=False)
    fp16 = c.get(data, "fp16", "fp16", "bool", False, record=False)
    pure = c.get(data, "pure_bf16", "pure_bf16", "bool", False, record=False)
    full = ft == "full"
    if bf16 and fp16:
        c.bad("fp16", "bf16 and fp16 cannot both be on", True)
    elif pure:
        f["precision"] = "bf16"
    elif bf16:
        f["precision"] = "mixed_bf16" if full else "bf16"
    elif fp16:
        f["precision"] = "mixed_fp16" if full else "fp16"
    else:
        c.bad("bf16", "set bf16 or fp16: without them LLaMA-Factory picks the dtype itself", None)
    if f["quantization"] in ("nf4", "fp4"):  # the 4-bit compute dtype is the autocast dtype
        f["compute_dtype"] = compute_dtype_for(f.get("precision") or plan_type.precision)
    f["method"] = "full" if full else ("qlora" if f["quantization"] in ("nf4", "fp4") else "lora")
    read_declared(c, plan_type, FORMAT, flat(data), f)
    _rl_tools.read_llamafactory_rl(data, c, f)
    if not full:
        alpha = c.get(data, "lora_alpha", "lora_alpha", "num", None)
        f["lora_alpha"] = float(alpha if alpha is not None else 2 * f["lora_r"])  # LF: rank * 2
        f["lora_targets"] = c.targets(data.get("lora_target", "all"), "lora_target", comma=True)
    f["gradient_checkpointing"] = not c.get(data, "disable_gradient_checkpointing", "disable_gradient_checkpointing",
                                            "bool", False, record=False)
    f["activation_offload"] = c.get(data, "use_unsloth_gc", "use_unsloth_gc", "bool", False, record=False)
    f["rope_scaling"] = read_rope_scaling(data, name, c)
    if f["activation_offload"] and not f["gradient_checkpointing"]:
        c.bad("use_unsloth_gc", "is LLaMA-Factory's checkpointing: it needs disable_gradient_checkpointing false", True)
    f["optimizer"] = c.choice(data.get("optim", HF_OPTIM_DEFAULT), OPTIM_ALIASES, "optim")
    _read_low_rank(data, c, f)
    f["attn_impl"] = c.choice(data.get("flash_attn", "auto"), {"auto": "sdpa", **{v: k for k, v in FLASH_ATTN.items()}},
                              "flash_attn")
    f["loss"] = "fused-linear" if data.get("enable_liger_kernel") else "plain"
    f["packing"] = bool(data.get("packing"))
    if not c.get(data, "freeze_vision_tower", "freeze_vision_tower", "bool", True, record=False):
        f["vision_tower"] = "full" if full else "lora"
    f["train_projector"] = not c.get(data, "freeze_multi_modal_projector", "freeze_multi_modal_projector", "bool",
                                     True, record=False)
    f["offload"], ds = read_offload(c, data.get("deepspeed"), "deepspeed")
    return name, f, {"deepspeed": ds}


LF_GALORE = {"adamw_torch": "galore_adamw", "adamw_torch_fused": "galore_adamw", "adamw_8bit": "galore_adamw_8bit"}
"""LLaMA-Factory's optim under use_galore → the Plan's GaLore optimizer."""


LF_LOW_RANK_DEFAULTS = {"rank": 16, "update_interval": 200}
"""LLaMA-Factory's default rank and update interval of GaLore and APOLLO (hparams/finetuning_args.py)."""


def _read_low_rank(data: dict, c: Collect, f: dict) -> None:
    """use_galore / use_apollo with their rank and interval (LLaMA-Factory's defaults: LF_LOW_RANK_DEFAULTS)."""
    read_optim_args(data.get("optim_args"), "optim_args", c, f)
    if c.get(data, "use_galore", "use_galore", "bool", False, record=False):
        layerwise = c.get(data, "galore_layerwise", "galore_layerwise", "bool", False, record=False)
        base = LF_GALORE.get(f.get("optimizer") or "")
        if base is None:
            c.bad("optim", "GaLore in LLaMA-Factory runs with optim adamw_torch or adamw_8bit", f.get("optimizer"))
            return
        f["optimizer"] = "galore_adamw_layerwise" if layerwise and base == "galore_adamw" else base
        prefix = "galore"
    elif c.get(data, "use_apollo", "use_apollo", "bool", False, record=False):
        f["optimizer"] = "apollo_adamw"
        prefix = "apollo"
    else:
        return
    f["optim_rank"] = c.get(data, f"{prefix}_rank", f"{prefix}_rank", "int", LF_LOW_RANK_DEFAULTS["rank"])
    f["optim_proj_gap"] = c.get(data, f"{prefix}_update_interval", f"{prefix}_update_interval", "int",
                                LF_LOW_RANK_DEFAULTS["update_interval"])
