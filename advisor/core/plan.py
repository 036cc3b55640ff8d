"""The Plan: every knob of one fine-tuning run, frozen, validated, and round-tripped through JSON.

A Plan says *how* to fine-tune (its levers) and the shape of the user's workload it is for (the sequence
length, the evaluation: knobs declared with ``Workload``); the ModelSpec says *what*. Invalid combinations are
rejected with the rule they break (``Plan.validate``), all rules at once. Each field is declared once with
``knob(...)`` (advisor.core.knobs): its flag, help, short tag, search choices, export keys and role.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from advisor.core.dtypes import DTYPE_BYTES, DTYPES  # noqa: F401  (DTYPE_BYTES: the ledgers import it from here)
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.core.knobs import (Cli, Custom, Key, Range, Refused, Search, Tag, Unkeyed, Workload, first, format_value,
                                knob, knob_of, knobs, prefer, rule_knobs, summary)
from advisor.core.optimizers import names_where, optimizer, optimizers
from advisor.core.rope import parse_rope_scaling

METHODS = ("full", "lora", "qlora")
QUANTIZATIONS = ("none", "int8", "nf4", "fp4")
PRECISIONS = ("bf16", "fp16", "fp32", "mixed_bf16", "mixed_fp16")
OPTIMIZERS = tuple(optimizers())
"""TrainingArguments.optim names, each declared once in advisor/data/optimizers.yaml (advisor.core.optimizers)."""
LOW_RANK_OPTIMIZERS = names_where("low_rank")
"""Optimizers that project each targeted weight's gradient to rank ``optim_rank`` (full fine-tuning only)."""
FUSED_BACKWARD_OPTIMIZERS = names_where("in_backward")
"""Optimizers that update each parameter inside backward and free its gradient at once."""
PAGED_OPTIMIZERS = names_where("paged")
"""Optimizers whose states live in CUDA unified memory (bitsandbytes paged)."""
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")
SP_BACKENDS = ("ulysses", "ring")
"""Sequence parallelism's exchanges (Plan.sp_backend)."""
"""The flash-attn kernels (FlashAttention-2; FlashAttention-3, the Hopper build of flash-attn's ``hopper/``, module
``flash_attn_interface``): tiled exact attention that saves q, k, v, the output and the log-sum-exp per head, no
score matrix (Dao 2023, FlashAttention-2 §3.1; Shah et al. 2024, FlashAttention-3 §3), and honours position_ids
for packed rows (transformers modeling_flash_attention_utils._flash_attention_forward, both versions)."""
OFFLOADS = ("none", "zero2_cpu", "zero3_cpu", "fsdp_cpu")
DEEPSPEED_OFFLOADS = ("zero2_cpu", "zero3_cpu")
"""The offloads DeepSpeed runs (ZeRO-Offload, its own CPU Adam); fsdp_cpu is PyTorch FSDP2's CPUOffloadPolicy, whose
optimizer is the plan's own, stepping on the host (advisor.memory.sharding.OFFLOAD_STRATEGY: the engine of each)."""
FSDP_OFFLOAD_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
"""The optimizers that step parameters FSDP offloads to the host: torch's own AdamW (its fused kernel has a CPU
implementation, torch/optim/_fused_adamw on CPU since torch 2.4); bitsandbytes' 8-bit and paged optimizers need CUDA
tensors."""
LOSSES = ("plain", "chunked", "fused-linear")
"""plain: the model's own loss over all logits; chunked: the output projection and loss over chunks of
tokens, each recomputed in backward; fused-linear: the projection fused with cross-entropy, gradients
computed in the forward (Liger's fused linear cross-entropy, Apple's cut cross-entropy)."""
SFT, GRPO, DPO = "sft", "grpo", "dpo"
TASKS = (SFT, GRPO, DPO)
"""What a plan trains: supervised fine-tuning, GRPO or DPO (TRL's SFTTrainer, GRPOTrainer, DPOTrainer)."""
TASK_WORDS = ("train", SFT, GRPO, DPO, "inference")
"""What ``--task`` takes: train is sft's alias; inference is the serving ledger of estimate and tune (no Plan)."""
RL_TASKS = (GRPO, DPO)
GENERATIONS = ("transformers", "vllm-colocate", "vllm-server")
"""GRPO's generation engines: generate() on the policy, vLLM on the training GPU (colocate), vLLM on other GPUs."""
VLLM_SLEEP_LEVELS = (0, 1, 2)
"""vLLM's sleep mode (LLM.sleep(level)): 0 awake; 1 weights offloaded to host, KV cache discarded; 2 both discarded."""
REFERENCES = ("adapter", "copy", "precomputed")
"""Where the reference log-probs come from: the adapter disabled, a frozen copy of the base, computed once (DPO)."""
TRL_BETA = {GRPO: 0.0, DPO: 0.1}
"""TRL's default beta per task (GRPOConfig.beta, DPOConfig.beta)."""
ALL_LINEAR = "all-linear"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The Plan's default LoRA targets: the attention projections. On a model whose attention has other linears
(DeepSeek's multi-head latent attention: q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj) they mean its own
attention linears (``lora_target_modules``' ``attention``)."""

LOSS_SCALED = ("fp16", "mixed_fp16")
"""Precisions trained with fp16 autocast and the Trainer's GradScaler (the exports write TrainingArguments
fp16: true for both: fp16 weights with fp32 adapters, or fp32 master weights)."""


FOUR_BIT = ("nf4", "fp4")


def compute_dtype_for(precision: str) -> str:
    """The dtype a precision computes in: its autocast dtype, or its weights' for a pure precision. It is
    also the 4-bit compute dtype a plan takes unless it says otherwise (the command line, the search)."""
    return precision.split("_")[1] if precision.startswith("mixed") else precision


def default_quantization(method: str) -> str:
    return "nf4" if method == "qlora" else "none"


# where a knob applies (Knob.applies): it may see a partial point of the search space
def _with_adapters(values) -> bool:
    return values.get("method") != "full"


def _four_bit(values) -> bool:
    return values.get("quantization") in FOUR_BIT


def _low_rank(values) -> bool:
    return values.get("optimizer") in LOW_RANK_OPTIMIZERS


def _checkpointing(values) -> bool:
    return bool(values.get("gradient_checkpointing"))


def _grpo(values) -> bool:
    return values.get("task", SFT) == GRPO


def _dpo(values) -> bool:
    return values.get("task", SFT) == DPO


def _rl(values) -> bool:
    return values.get("task", SFT) in RL_TASKS


def _not_rl(values) -> bool:
    return not _rl(values)


def _sequence_parallel(values) -> bool:
    return _not_rl(values) and (values.get("sp_degree") or 1) > 1


def _packed(values) -> bool:
    return values.get("packing") is True and _not_rl(values)


def _colocate(values) -> bool:
    return _grpo(values) and values.get("generation") == "vllm-colocate"


def _server(values) -> bool:
    return _grpo(values) and values.get("generation") == "vllm-server"


def effective_beta(values) -> float:
    """The plan's beta, or TRL's default for its task (None: TRL's)."""
    beta = values.get("beta")
    return TRL_BETA.get(values.get("task", SFT), 0.0) if beta is None else beta


def uses_reference(values) -> bool:
    """DPO always scores a reference (beta is its temperature); GRPO only with a KL term (TRL: beta 0 loads none)."""
    return _dpo(values) or (_grpo(values) and effective_beta(values) > 0)


SEQ_MAX = "max"
"""``--seq-len max``: advisor estimate answers the longest sequence that fits (advisor.memory.longest)."""


def parse_seq_len(text: str) -> int | str:
    """``--seq-len``: a whole number of tokens, or ``max``."""
    if str(text).strip().lower() == SEQ_MAX:
        return SEQ_MAX
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise AdvisorInputError("--seq-len", "must be a whole number of at least 1, or max (the longest that fits)",
                                text)
    return value


def parse_task(text: str) -> str:
    """``--task``: train is sft; inference is kept for the commands that serve (estimate, tune)."""
    import argparse

    word = text.strip().lower()
    if word not in TASK_WORDS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(TASK_WORDS)} (got {text!r})")
    return SFT if word == "train" else word


def _task_tag(plan: "Plan") -> str | None:
    if plan.task == GRPO:
        beta = effective_beta(vars(plan))
        return (f"grpo g{plan.num_generations} p{plan.max_prompt_length}+c{plan.max_completion_length}"
                + (f" beta{beta:g}" if beta else ""))
    if plan.task == DPO:
        beta = effective_beta(vars(plan))
        return "dpo" + ("" if beta == TRL_BETA[DPO] else f" beta{beta:g}")
    return None


def _generation_tag(plan: "Plan") -> str | None:
    if plan.task != GRPO:
        return None
    if plan.generation == "vllm-colocate":
        return f"vllm@{plan.vllm_gpu_memory_utilization:g}" + (f"+sleep{plan.vllm_sleep}" if plan.vllm_sleep else "")
    if plan.generation == "vllm-server":
        return f"vllm-server x{plan.vllm_gpus}"
    spg = plan.steps_per_generation
    return "generate()" + (f" spg{spg}" if spg is not None else "")


def _reference_tag(plan: "Plan") -> str | None:
    return f"ref-{plan.reference}" if uses_reference(vars(plan)) else None


def _adapter_tag(plan: "Plan") -> str | None:
    if not plan.peft:
        return None
    targets = plan.lora_targets if isinstance(plan.lora_targets, str) else ",".join(
        t.removesuffix("_proj") for t in plan.lora_targets)
    return f"r{plan.lora_r}[{targets}]"


def _loss_tag(plan: "Plan") -> str | None:
    if plan.task in RL_TASKS:
        return None  # TRL's GRPO/DPO trainers score with their own fused head: the loss knob does not apply
    if plan.loss == "chunked":
        return "chunked-ce"  # the name short() used before the loss knob (kept: studies key on it)
    return None if plan.loss == "plain" else plan.loss + "-ce"


LORA_DROPOUT = 0.05
"""The adapter dropout a plan starts from (the QLoRA paper's and peft's examples' 0.05 for 7B-13B models)."""
_TRAINING_ARGUMENTS_BATCH = 8
"""TrainingArguments.per_device_train_batch_size's default: what a TrainingArguments-based file (advisor.yaml's
training section, LLaMA-Factory, TRL) that leaves the key out trains with."""
_WHOLE = Range(low=1, whole=True)
_ZERO_OR_MORE = Range(low=0, whole=True)
_IN_BACKWARD = Refused("it has no optimizer step inside backward (torchtune optimizer_in_bwd); use lomo/adalomo, "
                       "or the advisor.yaml + train.py export")
_NOT_RUN = Unkeyed("the exported run does not evaluate: the generation-based evaluation sizes the prediction only")
_RL_ADVISOR = Refused("advisor.yaml's train.py runs supervised fine-tuning only: export GRPO/DPO to TRL")
_RL_AXOLOTL = Custom()  # rl: grpo|dpo with its trl: and vllm: sections (advisor.configs._rl_tools)
_RL_LLAMAFACTORY = Refused("LLaMA-Factory has no GRPO stage (its stages: pt, sft, rm, ppo, dpo, kto)")
_DPO_LLAMAFACTORY = Custom()  # stage: dpo, pref_beta (advisor.configs._rl_tools)
_ENV = Unkeyed("an environment variable: the header's launch command sets PYTORCH_CUDA_ALLOC_CONF")
_IN_THE_DATA = Unkeyed("the data carries its images and videos: their sizes shape the plan, not the file")
_DOCS_IN_THE_DATA = Unkeyed("the packing collator reads the documents' lengths from the data, not the file")
_NO_PIXEL_KEY = Refused("it has no key for the vision settings of the plan")
_IMAGES_ONLY = Refused("the exported script batches images only (a video's frames are not read): export a video "
                       "plan to LLaMA-Factory")


def _vision_key(name: str) -> Key:
    """A vision setting in the ``vision`` section of advisor.yaml / the ``vision`` mapping of trl.yaml, read by the
    exported script's vision_setup.py (written only off its default)."""
    return Key(f"vision.{name}", omit_default=True)


VISION_TOWER = ("frozen", "lora", "full")
"""What trains in a vision-language model's tower: nothing (the default everywhere), LoRA adapters, every weight."""


@dataclass(frozen=True)
class Plan:
    """One way to fine-tune a model: method, memory techniques and shapes of a step.

    Each field is a knob declared once (advisor.core.knobs): its help, flag, short tag, search choices
    and export keys live in its ``knob(...)``; the command line, the search space, ``short()``, the
    readers and the exporters derive from them."""

    method: str = knob(
        "lora", help="full fine-tune, LoRA, or QLoRA", choices=METHODS, tag=Tag(lambda plan: plan.method),
        search=Search(order=10, required=True),
        keys={"advisor": Custom("lora"), "axolotl": Custom("adapter"), "llamafactory": Custom("finetuning_type"),
              "trl": Custom("use_peft")})
    """full (every weight trained), lora (adapters on a bf16/fp16 or 8-bit base), qlora (adapters on a 4-bit base)."""
    quantization: str = knob(
        "none", help="base weight storage", choices=QUANTIZATIONS,
        cli=Cli(default=lambda values: default_quantization(values["method"]),
                default_means="nf4 for qlora, else none"),
        tag=Tag(), search=Search(order=20, required=True),
        keys={"advisor": Custom("quantization"), "axolotl": Custom("load_in_4bit"),
              "llamafactory": Custom("quantization_bit"), "trl": Custom("load_in_4bit")})
    """How the frozen base weights are stored: none, int8 (LLM.int8), nf4 or fp4 (bitsandbytes 4-bit)."""
    double_quant: bool = knob(
        False, help="4-bit double quantization of the absmax constants", applies=_four_bit,
        tag=Tag("+dq", after="quantization", joined=True),
        search=Search(order=30, required=True, ladder=prefer(True), frugal=prefer(True)),
        keys={"advisor": Key("quantization.bnb_4bit_use_double_quant"), "axolotl": Custom("bnb_config_kwargs"),
              "llamafactory": Key("double_quantization", default=True, listed=False),
              "trl": Key("use_bnb_nested_quant")})
    """Quantize the 4-bit absmax constants again (bnb_4bit_use_double_quant)."""
    compute_dtype: str = knob(
        "bf16", help="dtype quantized weights compute in", choices=DTYPES, applies=_four_bit,
        cli=Cli(default=lambda values: compute_dtype_for(values["precision"]), default_means="the precision's"),
        keys={"advisor": Custom("quantization.bnb_4bit_compute_dtype"), "axolotl": Custom("bnb_config_kwargs"),
              "llamafactory": Custom("bf16"), "trl": Custom("dtype")})
    """dtype quantized weights are dequantized to for the matmul (bnb_4bit_compute_dtype)."""
    precision: str = knob(
        "bf16", help="weights and math: bf16, fp16, fp32, mixed_bf16, mixed_fp16", choices=PRECISIONS,
        tag=Tag(lambda plan: plan.precision, after="lora_r"),
        search=Search(order=120, required=True, ladder=prefer("bf16", "mixed_bf16", "fp16"), frugal=first),
        keys={"advisor": Custom("training.bf16"), "axolotl": Custom("bf16"), "llamafactory": Custom("bf16"),
              "trl": Custom("bf16")})
    """Weights and training math: bf16/fp16/fp32 (pure), mixed_bf16/mixed_fp16 (fp32 weights, autocast)."""
    lora_r: int = knob(
        16, help="LoRA rank", range=_WHOLE, applies=_with_adapters, tag=Tag(_adapter_tag),
        search=Search(order=40, required=True, inactive=None, ladder=prefer(16, 8, 32), frugal=min),
        keys={"advisor": Key("lora.r", default=8), "axolotl": Key("lora_r", default=8),
              "llamafactory": Key("lora_rank", default=8), "trl": Key("lora_r")})
    """LoRA rank: more capacity, more adapter memory."""
    lora_alpha: float = knob(
        32.0, help="LoRA alpha", range=Range(low=0, low_inclusive=False), applies=_with_adapters,
        keys={"advisor": Custom("lora.lora_alpha"), "axolotl": Custom("lora_alpha"),
              "llamafactory": Custom("lora_alpha"), "trl": Custom("lora_alpha")})
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = knob(
        LORA_DROPOUT, help="LoRA dropout", range=Range(low=0, high=1), applies=_with_adapters,
        keys={"advisor": Key("lora.lora_dropout", default=0.0),
              "axolotl": Key("lora_dropout", default=0.0, listed=False),
              "llamafactory": Key("lora_dropout", default=0.0, listed=False), "trl": Key("lora_dropout")})
    """Dropout on the adapter input (0 saves the dropout mask and copy)."""
    lora_targets: tuple[str, ...] | str = knob(
        DEFAULT_TARGETS, help=f"comma-separated module names, or {ALL_LINEAR}",
        applies=_with_adapters, cli=Cli(parse=lambda text: normalize_targets(text)),
        search=Search(order=50, required=True, inactive=None, ladder=prefer("attention"), frugal=first,
                      choice=lambda v: isinstance(v, str) and bool(v),
                      choice_rule="choices are set names (attention, mlp, all-linear) or comma-separated module names"),
        keys={"advisor": Custom("lora.target_modules"), "axolotl": Custom("lora_target_modules"),
              "llamafactory": Custom("lora_target"), "trl": Custom("lora_target_modules")})
    """Module names that get adapters, or "all-linear"."""
    dora: bool = knob(
        False, help="DoRA adapters (peft use_dora): magnitude vectors, more memory", applies=_with_adapters,
        tag=Tag("+dora", after="lora_r", joined=True),
        search=Search(order=60, ladder=prefer(False), frugal=prefer(False)),
        keys={"advisor": Key("lora.use_dora", omit_default=True), "axolotl": Key("peft_use_dora", omit_default=True),
              "llamafactory": Key("use_dora", omit_default=True), "trl": Key("use_dora", omit_default=True)})
    """DoRA (peft use_dora): a trained magnitude vector per adapted module; its forward re-runs the base
    matmul on the dropped-out input and keeps an fp32 copy of the weight for backward."""
    lora_experts: bool = knob(
        False, help="LoRA on the stacked experts of a mixture of experts too (peft target_parameters: a rank-r pair "
                    "per expert; needs --lora-dropout 0)", applies=_with_adapters,
        tag=Tag("+experts", after="lora_r", joined=True),
        search=Search(order=55, ladder=prefer(False), frugal=prefer(False)),
        keys={"advisor": Custom("lora.target_parameters"), "axolotl": Custom("lora_target_parameters"),
              "llamafactory": Refused("it has no key for LoRA on expert parameters (peft target_parameters)"),
              "trl": Custom("lora_target_parameters")})
    """LoRA on the stacked expert parameters of a mixture of experts (peft ``target_parameters`` on
    ``experts.gate_up_proj`` and ``experts.down_proj``: a ``lora.ParamWrapper`` whose adapters are rank r x experts,
    peft/tuners/lora/layer.py). Its forward folds W + s*A@B into one bf16 stack per wrapped parameter, which the
    grouped expert matmul saves for backward; peft refuses it with lora_dropout != 0 or DoRA."""
    gradient_checkpointing: bool = knob(
        False, help="recompute each layer in backward", tag=Tag("ckpt"),
        search=Search(order=70, required=True, frugal=prefer(True)),
        keys={"advisor": Custom("training.gradient_checkpointing"), "axolotl": Custom("gradient_checkpointing"),
              "llamafactory": Custom("disable_gradient_checkpointing"), "trl": Custom("gradient_checkpointing")})
    """Keep only each decoder layer's input and recompute the rest in backward (~1/3 more compute)."""
    optimizer: str = knob(
        "adamw_torch", help="optimizer (TrainingArguments.optim names)", choices=OPTIMIZERS,
        tag=Tag(lambda plan: plan.optimizer), search=Search(order=100, required=True),
        keys={"advisor": Custom("training.optim"), "axolotl": Custom("optimizer"), "llamafactory": Custom("optim"),
              "trl": Custom("optim")})
    """Optimizer (TrainingArguments.optim names)."""
    micro_batch: int = knob(
        1, help="sequences per forward/backward (GRPO: completions per device, TRL's per_device_train_batch_size; "
                "DPO: preference pairs, each chosen and rejected)", range=_WHOLE,
        tag=Tag(lambda plan: f"b{plan.micro_batch}x{plan.grad_accum}"
                + ("" if plan.task == GRPO else f" s{plan.seq_len}")),
        search=Search(order=110, required=True, frugal=min),
        keys={"advisor": Key("training.per_device_train_batch_size", default=_TRAINING_ARGUMENTS_BATCH),
              "axolotl": Key("micro_batch_size", listed=True),
              "llamafactory": Key("per_device_train_batch_size", default=_TRAINING_ARGUMENTS_BATCH),
              "trl": Key("per_device_train_batch_size", default=_TRAINING_ARGUMENTS_BATCH)})
    """Sequences per forward/backward."""
    grad_accum: int = knob(
        1, help="micro-batches per optimizer step", range=_WHOLE,
        keys={"advisor": Key("training.gradient_accumulation_steps"), "axolotl": Key("gradient_accumulation_steps"),
              "llamafactory": Key("gradient_accumulation_steps"), "trl": Key("gradient_accumulation_steps")})
    """Micro-batches per optimizer step (gradients held between them)."""
    seq_len: int = knob(
        1024, help="tokens per sequence (DPO: TRL's max_length of each of chosen and rejected; GRPO: unused, "
                   "--max-prompt-length + --max-completion-length); estimate takes max: the longest that fits",
        range=_WHOLE, workload=Workload(required=True), cli=Cli(parse=lambda text: parse_seq_len(text)),
        keys={"advisor": Custom("advisor.max_seq_length"), "axolotl": Key("sequence_len", default=512),
              "llamafactory": Key("cutoff_len", default=2048), "trl": Key("max_length")})
    """Tokens per sequence (the padded length of the longest batch, or the packed length): the user's data, not a
    lever."""
    packing: bool = knob(
        False, help="pack documents into full sequences of --seq-len (no padding; position_ids per document)",
        tag=Tag("packed", after="loss"), search=Search(order=160, ladder=prefer(False), frugal=first), applies=_not_rl,
        keys={"advisor": Key("advisor.packing"), "axolotl": Key("sample_packing"), "llamafactory": Custom("packing"),
              "trl": Custom("packing")})
    """Pack several documents into each sequence of seq_len tokens (position_ids restart per document:
    no padding, no cross-document attention); without it a batch is padded to its longest document."""
    doc_len: int | None = knob(
        None, help="tokens per document packed into a sequence (--packing; --data gives its own documents' lengths)",
        range=_WHOLE, applies=_packed, workload=Workload(),
        cli=Cli(metavar="N", default_means="not stated: several per sequence, attention timed as one sequence long"),
        tag=Tag(lambda plan: f"doc{plan.doc_len}" if plan.doc_len else None, after="packing"),
        keys={"advisor": Key("advisor.doc_len", omit_default=True), "axolotl": _DOCS_IN_THE_DATA,
              "llamafactory": _DOCS_IN_THE_DATA, "trl": _DOCS_IN_THE_DATA})
    """The length of the documents packed into each sequence (advisor.core.packed_docs): with flash-attention's
    varlen kernel attention costs sum(doc_len^2), with sdpa / eager the block-diagonal mask costs the whole
    seq_len^2. The user's data, not a lever: a --data file gives it (DataProfile.sized)."""
    attn_impl: str = knob(
        "sdpa", help="attention implementation", choices=ATTENTION, tag=Tag(),
        search=Search(order=130, required=True, ladder=prefer("sdpa", "flash_attention_2"), frugal=first),
        keys={"advisor": Key("model.attn_implementation", listed=True), "axolotl": Custom("attn_implementation"),
              "llamafactory": Custom("flash_attn"), "trl": Key("attn_implementation")})
    """Attention implementation: sdpa, eager (materializes the scores), flash_attention_2, flash_attention_3 (Hopper
    only: card_rules.yaml)."""
    offload: str = knob(
        "none", help="CPU offload of the model state: DeepSpeed ZeRO-2 / ZeRO-3 offload or FSDP's (several GPUs)",
        choices=OFFLOADS,
        tag=Tag(after="optimizer"),
        search=Search(order=140, required=True, ladder=prefer("none")),
        keys={"advisor": Custom("training.deepspeed"), "axolotl": Custom("deepspeed"),
              "llamafactory": Custom("deepspeed"), "trl": Custom("deepspeed")})
    """none, zero2_cpu (DeepSpeed ZeRO-2, optimizer on the CPU), zero3_cpu (ZeRO-3, parameters and optimizer on the
    CPU), fsdp_cpu (FSDP full shard with CPU offload, parameters, gradients and optimizer on the CPU: Answer.AI's
    fsdp_qlora way of fitting a 70B QLoRA on two 24 GB cards; two or more GPUs). The offload names the engine that
    runs it on several GPUs, whatever --sharding says (advisor.memory.sharding.run_strategy)."""
    loss: str = knob(
        "plain", help="plain (all logits), chunked (chunks recomputed in backward) or fused-linear (Liger's fused "
                      "linear cross-entropy: no logits)", choices=LOSSES,
        renamed_from=("chunked_ce", lambda chunked: "chunked" if chunked else "plain"),
        cli=Cli(alias=("--chunked-ce", "chunked")), tag=Tag(_loss_tag), applies=_not_rl,
        search=Search(order=150, ladder=prefer("plain"), frugal=prefer("fused-linear", "chunked")),
        keys={"advisor": Custom("advisor.loss"), "axolotl": Custom("chunked_cross_entropy"),
              "llamafactory": Custom("enable_liger_kernel"), "trl": Custom("loss_type")})
    """How the loss is computed: plain, chunked or fused-linear (see LOSSES)."""
    expandable_segments: bool = knob(
        False, help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less memory reserved beyond the tensors",
        tag=Tag("expandable"), search=Search(order=180, ladder=prefer(True), frugal=prefer(True)),
        keys={"advisor": Custom("advisor.env.PYTORCH_CUDA_ALLOC_CONF"), "axolotl": _ENV, "llamafactory": _ENV,
              "trl": Unkeyed("an environment variable, which trl.yaml has no field for")})
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator grows one segment per pool
    in 2/20 MiB pages instead of one cudaMalloc per block size, so freed memory is reused across sizes
    (less reserved beyond the live tensors; slower first allocations, no CUDA IPC of the tensors)."""
    eval_batch: int = knob(
        0, help="sequences per evaluation forward", range=_ZERO_OR_MORE, cli=Cli(default_means="the micro-batch"),
        workload=Workload(),
        tag=Tag(lambda plan: f"eval-b{plan.eval_batch}" if plan.eval_batch else None),
        keys={"advisor": Key("training.per_device_eval_batch_size", omit_default=True, read=False),
              "axolotl": Key("eval_batch_size", omit_default=True, read=False),
              "llamafactory": Key("per_device_eval_batch_size", omit_default=True, read=False),
              "trl": Key("per_device_eval_batch_size", omit_default=True, read=False)})
    """Sequences per evaluation forward (per_device_eval_batch_size); 0: the micro-batch. The user's evaluation,
    not a lever."""
    max_new_tokens: int = knob(
        0, help="tokens a generation-based evaluation generates per sequence", range=_ZERO_OR_MORE, workload=Workload(),
        cli=Cli(default_means="none"),
        tag=Tag(lambda plan: f"gen{plan.max_new_tokens}" if plan.max_new_tokens else None),
        keys={"advisor": _NOT_RUN, "axolotl": _NOT_RUN, "llamafactory": _NOT_RUN, "trl": _NOT_RUN})
    """Tokens generated per sequence by a generation-based evaluation; 0: the run does not generate. The user's
    evaluation, not a lever."""
    rope_scaling: str = knob(
        "none", help="RoPE scaling past the model's trained context, TYPE:FACTOR (linear, dynamic, yarn, llama3; "
                     "yarn:4 reaches 4 x max_position_embeddings)", workload=Workload(),
        cli=Cli(metavar="TYPE:FACTOR", parse=lambda text: parse_rope_scaling(text), default_means="none"),
        tag=Tag(lambda plan: None if plan.rope_scaling == "none" else "rope-" + plan.rope_scaling),
        keys={"advisor": Custom("model.rope_parameters"),
              "axolotl": Custom("overrides_of_model_config.rope_parameters"),
              "llamafactory": Custom("rope_scaling"), "trl": Custom("model_init_kwargs.rope_parameters")})
    """RoPE scaling (advisor.core.rope): the model's positions rescaled so that factor x its trained context fits.
    The user's workload, not a lever: it changes the model trained (its config.json's rope_parameters, which
    inference must use too), not the memory of a step at a given length (docs/tuning.md)."""
    # ---- the optimizer's implementation, checkpointing granularity, activation offload
    optim_rank: int = knob(
        128, help="GaLore / APOLLO projection rank", range=_WHOLE, applies=_low_rank,
        tag=Tag(lambda plan: f"(r{plan.optim_rank})" if plan.optimizer in LOW_RANK_OPTIMIZERS else None,
                after="optimizer", joined=True),
        keys={"advisor": Custom("training.optim_args"), "axolotl": Custom("optim_args"),
              "llamafactory": Custom("galore_rank"), "trl": Custom("optim_args")})
    """GaLore / APOLLO projection rank (TrainingArguments optim_args "rank=", transformers' default 128)."""
    optim_proj_gap: int = knob(
        200, help="steps between GaLore / APOLLO projection updates", range=_WHOLE, applies=_low_rank,
        keys={"advisor": Custom("training.optim_args"), "axolotl": Custom("optim_args"),
              "llamafactory": Custom("galore_update_interval"), "trl": Custom("optim_args")})
    """Steps between GaLore / APOLLO projection updates (optim_args "update_proj_gap="; an SVD spike each time)."""
    optimizer_in_backward: bool = knob(
        False, help="step each parameter inside backward and free its gradient (torchtune optimizer_in_bwd; "
                    "needs --grad-accum 1)",
        tag=Tag("+in-bwd", after="optimizer", joined=True), search=Search(order=170),
        keys={"advisor": Key("advisor.optimizer_in_backward"), "axolotl": _IN_BACKWARD, "llamafactory": _IN_BACKWARD,
              "trl": _IN_BACKWARD})
    """Step each parameter's optimizer inside backward, as soon as its gradient exists, and free the gradient
    (torchtune optimizer_in_bwd): no full gradient buffer; needs grad_accum 1, no clipping."""
    checkpoint_layers: int | None = knob(
        None, help="checkpoint K decoder layers only", range=_WHOLE, applies=_checkpointing,
        cli=Cli(metavar="K", implies=("gradient_checkpointing", True), default_means="every layer"),
        tag=Tag(lambda plan: None if plan.checkpoint_layers is None else str(plan.checkpoint_layers),
                after="gradient_checkpointing", joined=True),
        search=Search(order=80),
        keys={"advisor": Custom("advisor.checkpoint_layers"), "axolotl": Custom(), "llamafactory": Custom(),
              "trl": Custom("gradient_checkpointing_kwargs")})
    """With gradient_checkpointing: how many decoder layers are checkpointed (None: all of them)."""
    activation_offload: bool = knob(
        False, help="keep saved activations in pinned host memory (with checkpointing: the layer inputs, "
                    "--checkpoint-offload)",
        cli=Cli(alias=("--checkpoint-offload", True), alias_implies=("gradient_checkpointing", True),
                alias_help="checkpoint offload (Unsloth's / ALST's): each checkpointed layer's input in pinned host "
                           "memory, counted against --host-budget"),
        tag=Tag("act-offload", after="gradient_checkpointing"), search=Search(order=90),
        keys={"advisor": Custom("advisor.activation_offload"), "axolotl": Custom("activation_offloading"),
              "llamafactory": Custom("use_unsloth_gc"), "trl": Custom("activation_offloading")})
    """Keep saved activations in pinned host memory. With checkpointing this is *checkpoint offload*
    (``--checkpoint-offload``): each checkpointed layer's input hidden state (seq x hidden x 2 B) in host memory, one
    back on the GPU per recomputed layer (transformers' gradient_checkpointing_kwargs offload: save_on_cpu around
    checkpoint; Unsloth's offloaded gradient checkpointing, ALST's activation checkpoint offload, axolotl's
    activation_offloading: hidden_states, LLaMA-Factory's use_unsloth_gc). Without: TRL/torchtune activation
    offloading of every saved activation (docs/memory.md, checkpoint offload)."""
    sp_degree: int = knob(
        1, help="sequence parallelism: GPUs that share each sequence, each holding seq_len / N of its tokens (a "
                "divisor of --gpus and of the attention heads)", range=_WHOLE, applies=_not_rl,
        tag=Tag(lambda plan: None if plan.sp_degree == 1 else f"sp{plan.sp_degree}"
                + ("" if plan.sp_backend == "ulysses" else f"-{plan.sp_backend}")),
        keys={"advisor": Key("sequence_parallel.size", omit_default=True),
              "axolotl": Key("context_parallel_size", omit_default=True),
              "llamafactory": Refused("LLaMA-Factory 0.9.5's trainer (v0 hparams) has no sequence parallelism (its v1 "
                                      "plugins and 360-LLaMA-Factory's sequence_parallel_size are other code paths)"),
              "trl": Key("sequence_parallel.size", omit_default=True)})
    """Sequence parallelism over ``sp_degree`` of the run's GPUs (docs/multi-gpu.md): each rank holds seq_len /
    sp_degree tokens of the sequence; the ranks exchange q/k/v around attention (Ulysses: all-to-all to head shards,
    Jacobs et al. 2023, DeepSpeed's ALST UlyssesSPAttentionHF) or pass k/v round a ring (ring attention, Liu et al.
    2023; torch context parallel). The embeddings and the loss are split with the sequence; a vision tower is not."""
    sp_backend: str = knob(
        "ulysses", help="sequence parallelism's exchange: ulysses (DeepSpeed ALST all-to-all, accelerate sp_backend "
                        "deepspeed) or ring (ring attention: accelerate's torch context parallel, axolotl's "
                        "ring-flash-attn)", choices=SP_BACKENDS, applies=_sequence_parallel,
        keys={"advisor": Key("sequence_parallel.backend"), "axolotl": Custom("context_parallel_size"),
              "llamafactory": Unkeyed("no sequence parallelism (--sp-degree is refused)"),
              "trl": Key("sequence_parallel.backend")})
    """ulysses: all-to-all before and after attention, each rank attending over the whole sequence with
    heads / sp_degree heads; ring: each rank keeps its queries and gathers or rotates k/v (cp_comm_strategy)."""
    tiled_mlp: bool = knob(
        False, help="tiled MLP (DeepSpeed ALST TiledMLP): the MLP over ceil(seq/hidden) sequence shards, each "
                    "recomputed in backward: one shard's intermediates alive, not the whole sequence's",
        tag=Tag("tiled-mlp"), applies=_not_rl,
        keys={"advisor": Key("advisor.tiled_mlp", omit_default=True), "axolotl": Custom("tiled_mlp"),
              "llamafactory": Refused("LLaMA-Factory 0.9.5 has no tiled-MLP key (hparams/finetuning_args.py, "
                                      "model_args.py)"),
              "trl": Key("tiled_mlp", omit_default=True)})
    """Tiled MLP (Bekman et al. 2025, ALST §3.2; deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP): each dense
    decoder layer's MLP runs under no_grad over ceil(seq_len / hidden_size) shards of the sequence, saving only its
    input; backward recomputes one shard at a time and backpropagates it (advisor.runtime.tiled_mlp). A mixture of
    experts and a vision-language model keep their MLPs whole (advisor.memory.tiled_mlp.tiles)."""
    # ---- the task: supervised fine-tuning, or GRPO / DPO on TRL's trainers (the workload), and their levers
    task: str = knob(
        SFT, help="sft (train is its alias), grpo (TRL GRPOTrainer: generate, score, train) or dpo (TRL DPOTrainer: "
                  "chosen and rejected through the policy and a reference); estimate and tune also take inference",
        choices=TASKS, workload=Workload(), cli=Cli(parse=lambda text: parse_task(text), metavar="{" + ",".join(
            TASK_WORDS) + "}"),
        tag=Tag(lambda plan: _task_tag(plan)),
        keys={"advisor": _RL_ADVISOR, "axolotl": Custom("rl"), "llamafactory": Custom("stage"),
              "trl": Custom()})  # the trainer: SFTConfig, GRPOConfig or DPOConfig fields (advisor.configs._trl_rl)
    """What the run trains: sft (supervised: the loss over the sequence), grpo (TRL GRPOTrainer: each step generates
    ``num_generations`` completions per prompt, scores them, and trains on them) or dpo (TRL DPOTrainer: chosen and
    rejected through the policy, and through a reference). The user's workload, never searched."""
    num_generations: int = knob(
        8, help="GRPO: completions per prompt (TRL num_generations; the group its advantages are relative to)",
        range=Range(low=2, whole=True), applies=_grpo, workload=Workload(),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Key("num_generations")})
    """GRPO: completions generated per prompt (GRPOConfig.num_generations, at least 2)."""
    max_prompt_length: int = knob(
        512, help="GRPO: tokens of the longest prompt (TRL 1.16 does not truncate prompts: the dataset's)",
        range=_WHOLE, applies=_grpo, workload=Workload(),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Unkeyed("TRL 1.16's GRPOConfig has no max_prompt_length: the prompts are the dataset's")})
    """GRPO: tokens of the longest prompt (the ledger sizes every sequence at prompt + completion)."""
    max_completion_length: int = knob(
        512, help="GRPO: tokens generated per completion at most (TRL max_completion_length)", range=_WHOLE,
        applies=_grpo, workload=Workload(),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Key("max_completion_length")})
    """GRPO: the longest completion (the step that OOMs after N steps is the one whose completions all reach it)."""
    beta: float | None = knob(
        None, help="the KL weight: GRPO's KL to the reference (0: no reference model) or DPO's temperature",
        range=Range(low=0), applies=_rl, workload=Workload(), cli=Cli(default_means="TRL's: grpo 0, dpo 0.1"),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _DPO_LLAMAFACTORY,
              "trl": Custom("beta")})
    """GRPO: the KL coefficient (0: TRL loads no reference model); DPO: the preference temperature. None: TRL's default
    for the task (GRPOConfig.beta 0.0, DPOConfig.beta 0.1)."""
    generation: str = knob(
        "transformers", help="GRPO: how completions are generated: transformers (generate() with its KV cache), "
                             "vllm-colocate (vLLM on the training GPU) or vllm-server (vLLM on --vllm-gpus other GPUs)",
        choices=GENERATIONS, applies=_grpo, tag=Tag(lambda plan: _generation_tag(plan)),
        search=Search(ladder=prefer("vllm-colocate", "transformers"), frugal=prefer("transformers"), within=_grpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Custom("use_vllm")})
    """GRPO: the generation engine (GRPOConfig use_vllm, vllm_mode colocate / server)."""
    vllm_gpu_memory_utilization: float = knob(
        0.3, help="vllm-colocate: the fraction of the GPU vLLM's pool takes (weights, activations, CUDA graphs, KV "
                  "cache)", range=Range(low=0, low_inclusive=False, high=1), applies=_colocate,
        search=Search(ladder=prefer(0.3), within=_grpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Key("vllm_gpu_memory_utilization")})
    """vllm-colocate: vLLM's gpu_memory_utilization (GRPOConfig.vllm_gpu_memory_utilization, TRL's default 0.3)."""
    vllm_sleep: int = knob(
        0, help="vllm-colocate: vLLM sleep mode during the training step: 0 off, 1 weights to host and KV cache "
                "discarded, 2 both discarded (TRL's vllm_enable_sleep_mode is level 2)",
        choices=VLLM_SLEEP_LEVELS, applies=_colocate, search=Search(frugal=max, within=_grpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Custom("vllm_enable_sleep_mode")})
    """vllm-colocate: what vLLM holds while the trainer scores and trains (LLM.sleep(level)); 0: its whole pool."""
    vllm_gpus: int = knob(
        1, help="vllm-server: GPUs the vLLM server runs on, apart from the training GPUs (trl vllm-serve)",
        range=_WHOLE, applies=_server, search=Search(ladder=min, within=_grpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Unkeyed("the vllm-serve command's --tensor-parallel-size / --data-parallel-size, not GRPOConfig")})
    """vllm-server: GPUs of the separate vLLM server (trl vllm-serve); the training GPUs hold none of its memory."""
    steps_per_generation: int | None = knob(
        None, help="GRPO: micro-batches trained per generation batch (TRL steps_per_generation)", range=_WHOLE,
        applies=_grpo, cli=Cli(default_means="the gradient accumulation, TRL's: one generation per optimizer step"),
        search=Search(ladder=prefer(None), within=_grpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _RL_LLAMAFACTORY,
              "trl": Key("steps_per_generation")})
    """GRPO: micro-batches per generation batch (GRPOConfig.steps_per_generation; None: grad_accum, TRL's default).
    The generation batch is micro_batch x GPUs x steps_per_generation completions."""
    reference: str = knob(
        "adapter", help="GRPO (with --beta > 0) and DPO: the reference model: adapter (the base with the adapter "
                        "disabled, no copy; lora/qlora), copy (a frozen copy of the base) or precomputed (DPO: "
                        "precompute_ref_log_probs, log-probs computed once before training)",
        choices=REFERENCES, applies=uses_reference,
        cli=Cli(default=lambda values: "copy" if values["method"] == "full" and values["task"] in RL_TASKS
                else "adapter", default_means="adapter for lora/qlora, copy for full"),
        tag=Tag(lambda plan: _reference_tag(plan)),
        search=Search(ladder=prefer("adapter", "copy"), frugal=prefer("precomputed", "adapter"), within=_rl),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _DPO_LLAMAFACTORY,
              "trl": Custom("precompute_ref_log_probs")})
    """Where the reference log-probs come from: the PEFT model with its adapter disabled (TRL's choice for a PEFT
    policy), a frozen copy of the base (TRL's for a full fine-tune), or computed once (DPO precompute_ref_log_probs)."""
    padding_free: bool = knob(
        False, help="DPO: padding-free batches (chosen and rejected flattened into one row, position_ids per sequence)",
        applies=_dpo, tag=Tag("padfree"), search=Search(ladder=prefer(False, True), within=_dpo),
        keys={"advisor": _RL_ADVISOR, "axolotl": _RL_AXOLOTL, "llamafactory": _DPO_LLAMAFACTORY,
              "trl": Key("padding_free", omit_default=True)})
    """DPO: padding-free batches (DPOConfig.padding_free; TRL 1.16 warns and falls back to padding)."""
    # ---- vision-language models: what a sample holds (the workload) and the vision levers (docs/vision.md)
    image_sizes: tuple[str, ...] = knob(
        (), help="an image of the sample, WIDTHxHEIGHT in pixels (repeat the flag for several images per sample; "
                 "plan on the largest sample of a batch)", workload=Workload(),
        cli=Cli(flag="--image-size", metavar="WxH", parse=lambda text: parse_image_size(text), repeat=True,
                default_means="no image"),
        tag=Tag(lambda plan: "img" + "+".join(plan.image_sizes) if plan.image_sizes else None),
        keys={f: _IN_THE_DATA for f in ("advisor", "axolotl", "llamafactory", "trl")})
    """The images of one sample (the largest of a batch), each ``WxH`` in pixels as the data holds them, before the
    processor resizes them: the user's data, not a lever."""
    video_frames: int = knob(
        0, help="frames of a video in the sample, as sampled", range=_ZERO_OR_MORE, workload=Workload(),
        cli=Cli(default_means="no video"),
        tag=Tag(lambda plan: f"vid{plan.video_frames}f" if plan.video_frames else None),
        keys={f: _IN_THE_DATA for f in ("advisor", "axolotl", "llamafactory", "trl")})
    """Frames of one video per sample as the processor receives them (already sampled); each frame is planned at the
    per-frame pixel budget (a frame larger than it is resized down to it). 0: no video, unless --video-seconds."""
    video_seconds: float = knob(
        0.0, help="length of a video in the sample, in seconds, sampled at --video-fps",
        range=Range(low=0), workload=Workload(), cli=Cli(default_means="none"),
        tag=Tag(lambda plan: f"vid{format_value(plan.video_seconds)}s" if plan.video_seconds else None),
        keys={f: _IN_THE_DATA for f in ("advisor", "axolotl", "llamafactory", "trl")})
    """The video's length: the processor samples ``seconds x fps`` frames (qwen_vl_utils / transformers'
    ``sample_frames``), within its min and max frames. The user's data, not a lever."""
    max_pixels: int | None = knob(
        None, help="image pixel budget: each image resized to at most this many pixels (Qwen's max_pixels)",
        range=_WHOLE, cli=Cli(metavar="PIXELS", default_means="the model's processor's"),
        tag=Tag(lambda plan: f"maxpx{plan.max_pixels}" if plan.max_pixels else None),
        keys={"advisor": _vision_key("max_pixels"), "axolotl": _NO_PIXEL_KEY, "trl": _vision_key("max_pixels"),
              "llamafactory": Key("image_max_pixels", omit_default=True)})
    """The image processor's ``max_pixels`` (Qwen's ``size.longest_edge``): resolution traded for tokens. None: the
    processor's own (preprocessor_config.json)."""
    min_pixels: int | None = knob(
        None, help="image pixel floor: each image resized to at least this many pixels (Qwen's min_pixels)",
        range=_WHOLE, cli=Cli(metavar="PIXELS", default_means="the model's processor's"),
        tag=Tag(lambda plan: f"minpx{plan.min_pixels}" if plan.min_pixels else None),
        keys={"advisor": _vision_key("min_pixels"), "axolotl": _NO_PIXEL_KEY, "trl": _vision_key("min_pixels"),
              "llamafactory": Key("image_min_pixels", omit_default=True)})
    """The image processor's ``min_pixels`` (``size.shortest_edge``). None: the processor's own."""
    video_max_pixels: int | None = knob(
        None, help="per-frame pixel budget of a video", range=_WHOLE,
        cli=Cli(metavar="PIXELS", default_means="the model's video processor's"),
        tag=Tag(lambda plan: f"vidpx{plan.video_max_pixels}" if plan.video_max_pixels else None),
        keys={"advisor": _IMAGES_ONLY, "axolotl": _NO_PIXEL_KEY, "trl": _IMAGES_ONLY,
              "llamafactory": Key("video_max_pixels", omit_default=True)})
    """The video processor's per-frame ``max_pixels``. None: the processor's own."""
    video_total_pixels: int | None = knob(
        None, help="pixel budget of a whole video (frames x per-frame pixels); lowers the per-frame budget of a "
                   "long video", range=_WHOLE, cli=Cli(metavar="PIXELS", default_means="none"),
        tag=Tag(lambda plan: f"vidtot{plan.video_total_pixels}" if plan.video_total_pixels else None),
        keys={"advisor": _IMAGES_ONLY, "axolotl": _NO_PIXEL_KEY, "trl": _IMAGES_ONLY,
              "llamafactory": Refused("it has no key for a video's total pixel budget (qwen_vl_utils "
                                      "VIDEO_TOTAL_PIXELS)")})
    """qwen_vl_utils' ``VIDEO_TOTAL_PIXELS``: the per-frame budget becomes at most ``total / frames x 2``
    (``fetch_video``: ``max_pixels = max(min(VIDEO_MAX_PIXELS, total_pixels / nframes * FRAME_FACTOR), ...)``).
    None: no total budget."""
    video_fps: float | None = knob(
        None, help="frames sampled per second of video (with --video-seconds)", range=Range(low=0, low_inclusive=False),
        cli=Cli(default_means="the model's video processor's"),
        tag=Tag(lambda plan: f"fps{format_value(plan.video_fps)}" if plan.video_fps else None),
        keys={"advisor": _IMAGES_ONLY, "axolotl": _NO_PIXEL_KEY, "trl": _IMAGES_ONLY,
              "llamafactory": Key("video_fps", omit_default=True)})
    """The video processor's sampling rate (Qwen: 2 frames per second). None: the processor's own."""
    max_frames: int | None = knob(
        None, help="most frames sampled from one video", range=_WHOLE,
        cli=Cli(default_means="the model's video processor's"),
        tag=Tag(lambda plan: f"maxf{plan.max_frames}" if plan.max_frames else None),
        keys={"advisor": _IMAGES_ONLY, "axolotl": _NO_PIXEL_KEY, "trl": _IMAGES_ONLY,
              "llamafactory": Key("video_maxlen", omit_default=True)})
    """The video processor's ``max_frames`` (LLaMA-Factory ``video_maxlen``). None: the processor's own."""
    vision_tower: str = knob(
        "frozen", help="the vision tower: frozen, LoRA adapters on its linears, or trained in full",
        choices=VISION_TOWER,
        cli=Cli(alias=("--train-vision-tower", "full")),
        tag=Tag(lambda plan: None if plan.vision_tower == "frozen" else f"vit-{plan.vision_tower}"),
        keys={"advisor": _vision_key("tower"), "axolotl": Refused("it has no key to train the vision tower"),
              "trl": _vision_key("tower"),
              "llamafactory": Custom("freeze_vision_tower")})
    """frozen (the default of every stack: ms-swift freeze_vit, LLaMA-Factory freeze_vision_tower), lora (adapters on
    the tower's linear modules, as --lora-targets names them), full (every tower weight trained)."""
    train_projector: bool = knob(
        False, help="train the projector / merger between the tower and the language model",
        tag=Tag("+proj"),
        keys={"advisor": _vision_key("train_projector"), "axolotl": Refused("it has no key to train the projector"),
              "trl": _vision_key("train_projector"),
              "llamafactory": Custom("freeze_multi_modal_projector")})
    """Train the projector (Qwen's merger, the deepstack mergers, multi_modal_projector) in full; frozen by default
    (LLaMA-Factory freeze_multi_modal_projector: true, ms-swift freeze_aligner: true)."""
    vision_gradient_checkpointing: bool = knob(
        False, help="recompute each vision-tower block in backward (apart from --gradient-checkpointing)",
        tag=Tag("vit-ckpt"),
        keys={"advisor": _vision_key("gradient_checkpointing"),
              "axolotl": Refused("it has no key for the tower's own checkpointing"),
              "trl": _vision_key("gradient_checkpointing"),
              "llamafactory": Refused("its gradient checkpointing follows the language model's; it has no key for "
                                      "the tower's own")})
    """Checkpoint the vision tower's blocks (their inputs kept, the rest recomputed in backward). Off unless given:
    transformers' ``gradient_checkpointing_enable`` turns it on for every submodule that supports it, the tower
    included, so the exported run turns it off on the tower when this is off."""

    # ------------------------------------------------------------------ derived

    @property
    def peft(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def chunked_ce(self) -> bool:
        """The chunked loss (the field this knob had before ``loss``; old configs and studies use it)."""
        return self.loss == "chunked"

    @property
    def quantized(self) -> bool:
        return self.quantization != "none"

    @property
    def four_bit(self) -> bool:
        return self.quantization in FOUR_BIT

    @property
    def param_dtype(self) -> str:
        """dtype the unquantized weights are held in."""
        return "fp32" if self.precision.startswith("mixed") or self.precision == "fp32" else self.precision

    @property
    def activation_dtype(self) -> str:
        """dtype the forward pass computes in."""
        return compute_dtype_for(self.precision)

    @property
    def updates_in_backward(self) -> bool:
        """Each parameter is updated inside backward and its gradient freed at once: LOMO, AdaLomo,
        layer-wise GaLore, or any optimizer with ``optimizer_in_backward``."""
        return self.optimizer in FUSED_BACKWARD_OPTIMIZERS or self.optimizer_in_backward

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on one GPU: GRPO its completion tokens (what its tokens/s counts), DPO
        chosen and rejected, else micro_batch x seq_len x grad_accum."""
        if self.task == GRPO:
            return self.micro_batch * self.max_completion_length * self.grad_accum
        if self.task == DPO:
            return 2 * self.micro_batch * self.seq_len * self.grad_accum
        return self.micro_batch * self.seq_len * self.grad_accum

    # ------------------------------------------------------------------ validation

    def problems(self) -> list[AdvisorInputError]:
        """Every rule this plan breaks (empty when it is valid)."""
        errs: list[AdvisorInputError] = []

        def bad(key: str, rule: str, value: Any) -> None:
            errs.append(AdvisorInputError(flag_of(key, type(self)), rule, value))

        errs += self._declared_problems(conditional=False)
        if errs:
            return errs
        if self.method == "qlora" and not self.four_bit:
            bad("quantization", "qlora trains adapters on a 4-bit base: quantization must be nf4 or fp4",
                self.quantization)
        if self.method == "lora" and self.four_bit:
            bad("quantization", "a 4-bit base with adapters is method qlora, not lora", self.quantization)
        if self.method == "full" and self.quantized:
            bad("quantization", "full fine-tuning trains every weight, which cannot stay quantized: use none",
                self.quantization)
        if self.double_quant and not self.four_bit:
            bad("double_quant", "double quantization applies to 4-bit (nf4/fp4) weights only", self.double_quant)
        errs += self._declared_problems(conditional=True)
        if self.peft:
            targets = self.lora_targets
            if targets != ALL_LINEAR and (not isinstance(targets, tuple) or not targets
                                          or not all(isinstance(t, str) and t for t in targets)):
                bad("lora_targets", f"must be a list of module names or {ALL_LINEAR}", targets)
        if self.dora is True and not self.peft:
            bad("dora", "DoRA decomposes LoRA adapters: use method lora (a full fine-tune has none)", self.method)
        elif self.dora is True and self.quantized:
            bad("dora", "DoRA over a quantized base is not planned here (peft dequantizes the base weight in each "
                "forward): use quantization none", self.quantization)
        if self.lora_experts is True and self.peft:
            if self.lora_dropout != 0:
                bad("lora_experts", f"peft's lora.ParamWrapper on the stacked experts refuses dropout "
                    f"(peft/tuners/lora/layer.py): set {flag_of('lora_dropout', type(self))} 0", self.lora_dropout)
            if self.dora is True:
                bad("dora", "peft's lora.ParamWrapper on the stacked experts refuses DoRA: use "
                    f"{flag_of('lora_experts', type(self))} off with DoRA", self.dora)
        if self.attn_impl in FLASH_ATTENTION and self.activation_dtype == "fp32":
            bad("attn_impl", f"{self.attn_impl} computes in fp16/bf16 only; use sdpa or eager with fp32",
                self.attn_impl)
        if self.sp_degree > 1 and self.attn_impl == "eager":
            # eager's 4-D mask is the local shard's; ALST discards it (UlyssesSPAttentionHF.register_with_transformers
            # refuses eager), torch context parallel replaces only sdpa's kernels
            bad("attn_impl", "sequence parallelism needs sdpa or flash attention (eager materializes a mask of the "
                "local shard that the exchange discards)", self.attn_impl)
        if self.offload in DEEPSPEED_OFFLOADS:
            if self.optimizer != "adamw_torch":
                bad("optimizer", "DeepSpeed CPU offload runs its own CPU Adam: use adamw_torch with offload",
                    self.optimizer)
            if self.quantization == "int8":
                bad("offload", "DeepSpeed ZeRO cannot partition bitsandbytes 8-bit weights", self.offload)
        if self.offload == "fsdp_cpu":
            if self.optimizer not in FSDP_OFFLOAD_OPTIMIZERS:
                bad("optimizer", "FSDP CPU offload steps the parameters on the host: use "
                    f"{' or '.join(FSDP_OFFLOAD_OPTIMIZERS)} (bitsandbytes' optimizers need CUDA tensors)",
                    self.optimizer)
            if self.quantization == "int8":
                # accelerate fsdp2_prepare_model shards only floating Params4bit; Int8Params keep int8 data and
                # their SCB statistics beside it
                bad("offload", "FSDP cannot shard bitsandbytes 8-bit weights: use nf4 / fp4 or a 16-bit base",
                    self.offload)
        if self.offload == "zero3_cpu" and self.four_bit:
            bad("offload", "ZeRO-3 parameter offload of 4-bit bitsandbytes weights is not planned here; "
                "use zero2_cpu, or fsdp_cpu on several GPUs, with qlora", self.offload)
        if self.rope_scaling != "none":
            try:
                parse_rope_scaling(self.rope_scaling)
            except AdvisorInputError as e:
                bad("rope_scaling", e.rule, self.rope_scaling)
        optimizer_problems(self, bad)
        tiled_mlp_problems(self, bad)
        rl_plan_problems(self, bad)
        vision_plan_problems(self, bad)
        if self.doc_len is not None and not _packed(vars(self)):
            bad("doc_len", f"is the length of packed documents: add {flag_of('packing')} (supervised fine-tuning)",
                self.doc_len)
        elif self.doc_len is not None and self.doc_len > self.seq_len:
            bad("doc_len", f"a packed sequence holds whole documents of at most {flag_of('seq_len')} "
                f"{self.seq_len} tokens", self.doc_len)
        if self.precision in ("fp16",) and self.method == "full":
            bad("precision", "pure fp16 full fine-tuning diverges (no fp32 master weights): use mixed_fp16 or bf16",
                self.precision)
        return errs

    def _declared_problems(self, conditional: bool) -> list[AdvisorInputError]:
        """The rules the knobs' declarations state: a value among the knob's choices, a number in its Range,
        a switch true or false. ``conditional=False``: the choices of every knob (the other rules read
        them), then the Range of each knob that applies to every plan; ``True``: the Range of the other
        knobs where they apply, and every switch."""
        errs: list[AdvisorInputError] = []
        values = vars(self)
        ks = rule_knobs(type(self))
        if not conditional:
            for k in ks.with_choices:
                if values[k.name] not in k.choices:
                    errs.append(AdvisorInputError(k.flag, f"must be one of {', '.join(k.choices)}", values[k.name]))
        for k in ks.ranged_where_it_applies if conditional else ks.ranged_always:
            v = values[k.name]
            if conditional and not k.applies(values):
                continue
            if not (v is None and k.default is None) and not k.range.holds(v):
                errs.append(AdvisorInputError(k.flag, k.range.rule, v))
        if conditional:
            errs += [AdvisorInputError(k.flag, "must be true or false", values[k.name]) for k in ks.switches
                     if not isinstance(values[k.name], bool)]
        return errs

    def validate(self) -> "Plan":
        """Return self, or raise every broken rule at once."""
        errs = self.problems()
        if len(errs) == 1:
            raise errs[0]
        if errs:
            raise ConfigErrors(errs)
        return self

    # ------------------------------------------------------------------ (de)serialization

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_targets"] = self.lora_targets if isinstance(self.lora_targets, str) else list(self.lora_targets)
        d["image_sizes"] = list(self.image_sizes)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        ks = knobs(cls)
        renamed = {k.renamed_from[0]: (k.name, k.renamed_from[1]) for k in ks if k.renamed_from}
        unknown = sorted(set(data) - {k.name for k in ks} - set(renamed))
        if unknown:
            raise AdvisorInputError("plan", f"unknown key(s) {', '.join(unknown)}", unknown, show_value=False)
        data = dict(data)
        for old, (name, convert) in renamed.items():  # configs and studies written before the knob's name
            if old in data:
                value = data.pop(old)
                data.setdefault(name, convert(value))
        if "lora_targets" in data:
            data["lora_targets"] = normalize_targets(data["lora_targets"])
        if isinstance(data.get("image_sizes"), list):
            data["image_sizes"] = tuple(data["image_sizes"])
        return cls(**data)

    def with_(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    def short(self) -> str:
        """A one-line summary, for tables (each knob's Tag; studies key on it)."""
        return summary(self)


def flag_of(key: str, plan_type: type = Plan) -> str:
    """The CLI flag a Plan field is set with."""
    try:
        return knob_of(plan_type, key).flag
    except KeyError:
        return "--" + key.replace("_", "-")


def canonical(plan: Plan) -> Plan:
    """The plan with each knob that does not apply to it (``Knob.applies``) at its default: the LoRA knobs of
    a full fine-tune, the 4-bit knobs of an unquantized plan... Two plans that train the same way compare equal."""
    values = vars(plan)
    changes = {k.name: k.default for k in knobs(type(plan))
               if not k.applies_to(values) and values[k.name] != k.default}
    return plan.with_(**changes) if changes else plan


def normalize_targets(value: Any) -> tuple[str, ...] | str:
    """"all-linear", "q_proj,v_proj" or a list → the Plan's form."""
    if isinstance(value, str):
        if value.strip() == ALL_LINEAR:
            return ALL_LINEAR
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(t) for t in value)
    return value


def lora_target_modules(plan: Plan, layer_linears: list[str], attention: list[str] | tuple[str, ...] | None = None
                        ) -> list[str]:
    """The decoder-layer linear modules that get adapters under ``plan`` (all-linear → every one). ``attention``:
    the model's attention linears, which the default targets (DEFAULT_TARGETS) stand for where the model lacks
    some of q/k/v/o."""
    if not plan.peft:
        return []
    if plan.lora_targets == ALL_LINEAR:
        return list(layer_linears)
    targets = plan.lora_targets
    if attention and tuple(targets) == DEFAULT_TARGETS and any(t not in layer_linears for t in targets):
        targets = tuple(attention)
    missing = [t for t in targets if t not in layer_linears]
    if missing:
        raise AdvisorInputError(
            "--lora-targets", f"module(s) {', '.join(missing)} not in this model's layers "
            f"(it has {', '.join(layer_linears)})", ",".join(plan.lora_targets), show_value=False)
    return [t for t in layer_linears if t in targets]


def optimizer_problems(plan: Plan, bad) -> None:
    """The rules of the optimizer implementation, the step inside backward and partial checkpointing;
    each broken rule is reported through ``bad(key, rule, value)``."""
    opt = plan.optimizer
    if opt in LOW_RANK_OPTIMIZERS and plan.method != "full":
        bad("optimizer", "GaLore and APOLLO project full-rank weight gradients: use them with --method full",
            opt)
    if plan.updates_in_backward and plan.grad_accum != 1:
        what = opt if opt in FUSED_BACKWARD_OPTIMIZERS else flag_of("optimizer_in_backward")
        bad("grad_accum", f"{what} updates the weights inside backward, so there is no gradient to accumulate: "
            "gradient accumulation must be 1", plan.grad_accum)
    if plan.optimizer_in_backward:
        if opt in FUSED_BACKWARD_OPTIMIZERS:
            bad("optimizer_in_backward", f"{opt} already updates inside backward", plan.optimizer_in_backward)
        if plan.offload != "none":
            bad("optimizer_in_backward", "CPU offload steps the optimizer on the host, after backward",
                plan.optimizer_in_backward)
        if plan.precision in LOSS_SCALED:
            bad("optimizer_in_backward", "fp16 loss scaling must unscale every gradient before any step: use bf16 "
                "(Ampere or newer), or step after backward",
                plan.precision)
    if optimizer(opt).fused_backward and plan.precision in LOSS_SCALED:
        bad("optimizer", f"{opt} runs its own backward and keeps its own loss scaler (LOMO's fused_backward); the "
            "Trainer's fp16 GradScaler cannot wrap it: use bf16 (Ampere or newer), or another optimizer",
            opt)
    if plan.checkpoint_layers is not None and not plan.gradient_checkpointing:
        bad("checkpoint_layers", f"checkpointing k layers needs {flag_of('gradient_checkpointing')} on",
            plan.checkpoint_layers)


def rl_plan_problems(plan: Plan, bad) -> None:
    """The rules of GRPO and DPO on TRL's trainers that the plan alone decides; each broken rule is reported
    through ``bad(key, rule, value)`` (the ones that need the GPU count: ``rl_problems``)."""
    if plan.task not in RL_TASKS:
        return
    values = vars(plan)
    if plan.task == DPO and plan.beta is not None and plan.beta <= 0:
        bad("beta", "DPO's beta is the preference temperature of its sigmoid loss: it must be greater than 0",
            plan.beta)
    if uses_reference(values):
        if plan.reference == "adapter" and not plan.peft:
            bad("reference", "a full fine-tune has no adapter to disable: use copy or precomputed", plan.reference)
        if plan.reference == "precomputed" and plan.task == GRPO:
            bad("reference", "GRPO scores new completions every step: its reference log-probs cannot be computed "
                "before training (precompute_ref_log_probs is DPO's); use adapter or copy", plan.reference)
        if plan.reference == "copy" and plan.task == GRPO and plan.peft:
            bad("reference", "TRL's GRPOTrainer scores a PEFT policy's reference with its adapter disabled and loads "
                "no copy: use adapter", plan.reference)
    if plan.task == GRPO and plan.generation.startswith("vllm") and plan.quantization == "int8":
        bad("generation", "vLLM does not load bitsandbytes 8-bit weights in flight (TRL VLLMGeneration refuses "
            "Linear8bitLt): use transformers generation, or nf4", plan.generation)
    if plan.padding_free and plan.task == DPO and plan.attn_impl not in FLASH_ATTENTION:
        bad("padding_free", "padding-free batches keep sequences apart by position_ids, which only "
            "flash attention honours: use --attn-impl flash_attention_2 (flash_attention_3 on Hopper)",
            plan.padding_free)


def tiled_mlp_problems(plan: Plan, bad) -> None:
    """What the tiled MLP is not planned with (its shards run under no_grad, then again in backward)."""
    if plan.tiled_mlp is not True:
        return
    if plan.dora is True:
        bad("tiled_mlp", "the tiled MLP with DoRA is not planned here (DoRA's magnitude re-runs each MLP matmul in "
            "every shard): use --dora off", plan.tiled_mlp)
    elif plan.quantization == "int8":
        bad("tiled_mlp", "the tiled MLP over LLM.int8 linears is not planned here (MatMul8bitLt keeps its inputs on "
            "ctx): use nf4 or no quantization", plan.tiled_mlp)
    elif plan.activation_offload is True and not plan.gradient_checkpointing:
        bad("tiled_mlp", "the tiled MLP under TRL's offload of every activation is not planned here: use it with "
            "--checkpoint-offload or without offload", plan.tiled_mlp)


def rl_problems(plan: Plan, gpus: int = 1) -> list[AdvisorInputError]:
    """The GRPO rules that need the data-parallel GPU count (TRL GRPOConfig.__post_init__): the generation batch,
    micro_batch x gpus x steps_per_generation completions, holds whole groups of num_generations."""
    if plan.task != GRPO:
        return []
    spg = generation_steps(plan)
    batch = plan.micro_batch * gpus * spg
    if batch % plan.num_generations:
        what = (f"{flag_of('micro_batch')} {plan.micro_batch} x {gpus} GPU(s) x {spg} step(s) per generation"
                f" ({flag_of('steps_per_generation')}, default {flag_of('grad_accum')})")
        return [AdvisorInputError(flag_of("num_generations"), f"TRL's generation batch ({what} = {batch} completions) "
                                  f"must be divisible by num_generations", plan.num_generations)]
    return []


def generation_steps(plan: Plan) -> int:
    """Micro-batches trained per generation batch: steps_per_generation, or TRL's default, the gradient
    accumulation (GRPOConfig.__post_init__)."""
    return plan.steps_per_generation if plan.steps_per_generation is not None else plan.grad_accum
def parse_image_size(text: str) -> str:
    """"1024x768" (or 1024X768, 1024*768) → "1024x768"; anything else is an input error naming --image-size."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", str(text))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise AdvisorInputError("--image-size", "must be WIDTHxHEIGHT in whole pixels (1024x768)", text)
    return f"{int(m.group(1))}x{int(m.group(2))}"


def image_size_of(text: str) -> tuple[int, int]:
    """(width, height) of an ``image_sizes`` entry."""
    w, h = parse_image_size(text).split("x")
    return int(w), int(h)


def vision_plan_problems(plan: Plan, bad) -> None:
    """The rules of the vision knobs that need no model (the model's own: ``vision_model_problems``)."""
    sizes = plan.image_sizes
    if not isinstance(sizes, tuple) or not all(isinstance(s, str) for s in sizes):
        bad("image_sizes", "must be a list of WIDTHxHEIGHT sizes", sizes)
    else:
        for s in sizes:
            try:
                parse_image_size(s)
            except AdvisorInputError as e:
                bad("image_sizes", e.rule, s)
    if plan.video_frames and plan.video_seconds:
        bad("video_seconds", f"a video is given by its frames ({flag_of('video_frames')}) or by its length "
            f"({flag_of('video_seconds')}), not both", plan.video_seconds)
    if isinstance(plan.min_pixels, int) and isinstance(plan.max_pixels, int) and plan.min_pixels > plan.max_pixels:
        bad("min_pixels", f"is above {flag_of('max_pixels')} {plan.max_pixels}", plan.min_pixels)
    if plan.vision_tower == "lora" and not plan.peft:
        bad("vision_tower", "LoRA on the vision tower needs adapters: use --method lora or qlora (or --vision-tower "
            "full with --method full)", plan.vision_tower)


def has_vision_input(plan: Plan) -> bool:
    """The sample holds an image or a video."""
    return bool(plan.image_sizes or plan.video_frames or plan.video_seconds)


VISION_INPUT_KNOBS = ("image_sizes", "video_frames", "video_seconds")
VISION_LEVER_KNOBS = ("max_pixels", "min_pixels", "video_max_pixels", "video_total_pixels", "video_fps", "max_frames",
                      "vision_tower", "train_projector", "vision_gradient_checkpointing")


def vision_model_problems(plan: Plan, is_vision_language: bool, model_name: str = "") -> list[AdvisorInputError]:
    """The model-dependent rule of the vision knobs: a text model has no tower to feed or train."""
    if is_vision_language:
        return []
    errs = []
    for name in (*VISION_INPUT_KNOBS, *VISION_LEVER_KNOBS):
        k = knob_of(type(plan), name)
        if getattr(plan, name) != k.default:
            errs.append(AdvisorInputError(k.flag, f"{model_name or 'the model'} is a text model (no vision tower): "
                                          "use a vision-language model (`advisor models` lists them)",
                                          getattr(plan, name)))
    return errs


def checkpoint_depth_problems(plan: Plan, num_layers: int) -> list[AdvisorInputError]:
    """The model-dependent rule of partial checkpointing: at most the model's decoder layers."""
    k = plan.checkpoint_layers
    if plan.gradient_checkpointing and isinstance(k, int) and k > num_layers:
        return [AdvisorInputError("--checkpoint-layers", f"the model has {num_layers} decoder layers; at most "
                                  f"{num_layers} can be checkpointed", k)]
    return []


def checkpointed_layers(plan: Plan, num_layers: int) -> tuple[int, ...]:
    """Indices of the decoder layers ``plan`` checkpoints in a model of ``num_layers`` layers.

    Every n-th layer from layer 0 where some n gives exactly k layers (what transformers'
    ``activation_checkpointing_kwargs={"every_n_layers": n}`` selects: ``layer_index % n == 0``,
    modeling_utils._set_gradient_checkpointing); otherwise the first layer of each of k equal spans.
    """
    if not plan.gradient_checkpointing:
        return ()
    k = plan.checkpoint_layers
    if k is None or k == num_layers:
        return tuple(range(num_layers))
    if k > num_layers:
        raise AdvisorInputError("--checkpoint-layers", f"the model has {num_layers} decoder layers; "
                                f"at most {num_layers} can be checkpointed", k)
    n = every_n_layers(k, num_layers)
    if n is not None:
        return tuple(range(0, num_layers, n))
    return tuple(i for i in range(num_layers) if i == 0 or (i * k) // num_layers != ((i - 1) * k) // num_layers)


def some_checkpointed(plan: Plan, num_layers: int) -> bool:
    """Whether ``plan`` checkpoints some of the ``num_layers`` decoder layers but not all (``checkpointed_layers``)."""
    return plan.gradient_checkpointing and 0 < len(checkpointed_layers(plan, num_layers)) < num_layers


def every_n_layers(k: int, num_layers: int) -> int | None:
    """The ``every_n_layers`` that checkpoints exactly ``k`` of ``num_layers`` layers, if there is one."""
    for n in range(1, num_layers + 1):
        if len(range(0, num_layers, n)) == k:
            return n
    return None
