"""Flags and resolution shared by the subcommands (estimate, probe, tune, preflight...)."""

from __future__ import annotations

import argparse
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.core.plan import (ATTENTION, DTYPES, LOSSES, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS, QUANTIZATIONS,
                               Plan, default_quantization, normalize_targets)


def whole_number(flag: str, minimum: int = 1):
    """argparse type: an int of at least ``minimum`` (argparse names the flag in its message)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {text!r})")
        return value
    return parse


def positive_int(flag: str):
    return whole_number(flag, 1)


def number(flag: str, low: float | None = None, low_inclusive: bool = False, high: float | None = None):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number (got {text!r})") from None
        if low is not None and (value < low or (value == low and not low_inclusive)):
            raise argparse.ArgumentTypeError(f"must be {'at least' if low_inclusive else 'greater than'} {low} (got {text!r})")
        if high is not None and value >= high:
            raise argparse.ArgumentTypeError(f"must be below {high} (got {text!r})")
        return value
    return parse


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and GPU")
    g.add_argument("--model", required=True, help="catalog name or alias (qwen7b, llama8b...), hub id, or a local directory with config.json")
    g.add_argument("--trust-remote-code", action="store_true", help="allow running model code shipped in a model directory")
    g.add_argument("--gpu", help="GPU from the catalog (rtx-4090, a100-80gb, h100...); default: the detected GPU")
    g.add_argument("--gpu-budget", help='memory budget: "24GB", "24 GiB", "24000MiB" or "90%%" of the GPU (GB = GiB = 2^30 bytes)')


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training plan")
    g.add_argument("--method", choices=METHODS, default="lora", help="full fine-tune, LoRA, or QLoRA (default: lora)")
    g.add_argument("--quantization", choices=QUANTIZATIONS, help="base weight storage (default: nf4 for qlora, else none)")
    g.add_argument("--double-quant", action="store_true", help="4-bit double quantization of the absmax constants")
    g.add_argument("--compute-dtype", choices=DTYPES, help="dtype quantized weights compute in (default: the precision's)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16", help="weights and math: bf16, fp16, fp32, mixed_bf16, mixed_fp16")
    g.add_argument("--seq-len", type=positive_int("--seq-len"), default=1024, help="tokens per sequence (default 1024)")
    g.add_argument("--micro-batch", type=positive_int("--micro-batch"), default=1, help="sequences per forward/backward (default 1)")
    g.add_argument("--grad-accum", type=positive_int("--grad-accum"), default=1, help="micro-batches per optimizer step (default 1)")
    g.add_argument("--gradient-checkpointing", action="store_true", help="recompute each layer in backward")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw_torch", help="optimizer (TrainingArguments.optim names)")
    g.add_argument("--lora-r", type=positive_int("--lora-r"), default=16, help="LoRA rank (default 16)")
    g.add_argument("--lora-alpha", type=number("--lora-alpha", low=0), default=32.0, help="LoRA alpha (default 32)")
    g.add_argument("--lora-dropout", type=number("--lora-dropout", low=0, low_inclusive=True, high=1), default=0.05, help="LoRA dropout (default 0.05)")
    g.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated module names, or all-linear")
    g.add_argument("--attn-impl", choices=ATTENTION, default="sdpa", help="attention implementation (default sdpa)")
    g.add_argument("--offload", choices=OFFLOADS, default="none", help="DeepSpeed CPU offload (default none)")
    add_lever_flags(g)
    g.add_argument("--expandable-segments", action="store_true",
                   help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less memory reserved beyond the tensors")
    g.add_argument("--eval-batch", type=int, default=0,
                   help="sequences per evaluation forward (default 0: the micro-batch)")
    g.add_argument("--max-new-tokens", type=int, default=0,
                   help="tokens a generation-based evaluation generates per sequence (default 0: none)")
    add_memory_lever_flags(g)
    add_gpus_flags(p)


def add_lever_flags(g) -> None:
    """--loss (--chunked-ce), --dora, --packing."""
    g.add_argument("--loss", choices=LOSSES, default=None,
                   help="plain (all logits), chunked (chunks recomputed in backward) or fused-linear (Liger's fused "
                        "linear cross-entropy: no logits) (default plain)")
    g.add_argument("--chunked-ce", action="store_true", help="the same as --loss chunked")
    g.add_argument("--dora", action="store_true", help="DoRA adapters (peft use_dora): magnitude vectors, more memory")
    g.add_argument("--packing", action="store_true",
                   help="pack documents into full sequences of --seq-len (no padding; position_ids per document)")


def loss_from_args(args: argparse.Namespace) -> str:
    """--loss, or chunked for the --chunked-ce alias; the two must agree."""
    loss = getattr(args, "loss", None)
    if getattr(args, "chunked_ce", False):
        if loss not in (None, "chunked"):
            raise AdvisorInputError("--chunked-ce", f"is --loss chunked, which contradicts --loss {loss}", loss)
        return "chunked"
    return loss or "plain"
def add_memory_lever_flags(g) -> None:
    """Optimizer step inside backward, low-rank optimizer knobs, checkpointing granularity, activation offload."""
    g.add_argument("--optimizer-in-backward", action="store_true",
                   help="step each parameter inside backward and free its gradient (torchtune optimizer_in_bwd; "
                        "needs --grad-accum 1)")
    g.add_argument("--optim-rank", type=positive_int("--optim-rank"), default=128,
                   help="GaLore / APOLLO projection rank (default 128)")
    g.add_argument("--optim-proj-gap", type=positive_int("--optim-proj-gap"), default=200,
                   help="steps between GaLore / APOLLO projection updates (default 200)")
    g.add_argument("--checkpoint-layers", type=positive_int("--checkpoint-layers"), default=None, metavar="K",
                   help="checkpoint K decoder layers only (implies --gradient-checkpointing; default: all)")
    g.add_argument("--activation-offload", action="store_true",
                   help="keep saved activations in pinned host memory (with checkpointing: the layer inputs)")


def memory_lever_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The Plan fields of add_memory_lever_flags."""
    k = getattr(args, "checkpoint_layers", None)
    return dict(optimizer_in_backward=getattr(args, "optimizer_in_backward", False),
                optim_rank=getattr(args, "optim_rank", 128), optim_proj_gap=getattr(args, "optim_proj_gap", 200),
                checkpoint_layers=k, activation_offload=getattr(args, "activation_offload", False),
                gradient_checkpointing=bool(args.gradient_checkpointing or k is not None))


def add_gpus_flags(p: argparse.ArgumentParser) -> None:
    from advisor.memory.sharding import DEFAULT_SHARDING, STRATEGIES

    g = p.add_argument_group("several GPUs")
    g.add_argument("--gpus", type=positive_int("--gpus"), default=1, help="data-parallel GPUs (per-GPU ledger)")
    g.add_argument("--sharding", choices=STRATEGIES, default=DEFAULT_SHARDING,
                   help="how model state is split across --gpus (ZeRO-2/3, FSDP full shard, or replicated)")


def plan_from_args(args: argparse.Namespace) -> Plan:
    precision = args.precision
    compute = args.compute_dtype or ("fp16" if "fp16" in precision else "fp32" if precision == "fp32" else "bf16")
    plan = Plan(
        method=args.method,
        quantization=args.quantization or default_quantization(args.method),
        double_quant=args.double_quant,
        compute_dtype=compute,
        precision=precision,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        lora_targets=normalize_targets(args.lora_targets),
        optimizer=args.optimizer,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        seq_len=args.seq_len,
        attn_impl=args.attn_impl,
        offload=args.offload,
        loss=loss_from_args(args),
        dora=bool(getattr(args, "dora", False)),
        packing=bool(getattr(args, "packing", False)),
        expandable_segments=getattr(args, "expandable_segments", False),
        eval_batch=getattr(args, "eval_batch", 0),
        max_new_tokens=getattr(args, "max_new_tokens", 0),
        **memory_lever_fields(args),
    )
    return plan.validate()


def target_from_args(args: argparse.Namespace, **rules: Any):
    """The command's Target (model, GPU, budget, whether the GPU is assumed) from --model, --gpu and
    --gpu-budget, by the one rule every command uses (advisor.core.target.resolve_target; ``rules`` are
    its keyword options)."""
    from advisor.core.target import resolve_target

    return resolve_target(args.model, gpu=getattr(args, "gpu", None), gpu_budget=getattr(args, "gpu_budget", None),
                          trust_remote_code=getattr(args, "trust_remote_code", False), **rules)


def check_plan_against_model(model, plan) -> None:
    """Model-dependent rules (LoRA targets that exist, sequence within the model's context)."""
    from advisor.core.plan import lora_target_modules

    lora_target_modules(plan, list(model.linear_shapes()))
    if plan.checkpoint_layers is not None and plan.checkpoint_layers > model.num_layers:
        raise AdvisorInputError("--checkpoint-layers", f"{model.name} has {model.num_layers} decoder layers",
                                plan.checkpoint_layers)
    if model.max_position_embeddings and plan.seq_len > model.max_position_embeddings:
        raise AdvisorInputError("--seq-len", f"longer than {model.name}'s context of {model.max_position_embeddings:,} tokens",
                                plan.seq_len)


def add_study_flags(p: argparse.ArgumentParser) -> None:
    """STUDY or --storage/--study, as advisor.search.locate.resolve_storage reads them (report, export)."""
    p.add_argument("study", nargs="?", metavar="STUDY",
                   help="study folder holding study.db (reports/<study>/), its study.db, or a study name under "
                        "--reports-dir")
    p.add_argument("--storage", help="Optuna storage URL instead of STUDY (e.g. postgresql://user@host/db)")
    p.add_argument("--study", dest="study_name", metavar="NAME",
                   help="study name inside the storage (needed when it holds more than one)")
    p.add_argument("--reports-dir", default="reports", help="where a bare STUDY name is looked up")
