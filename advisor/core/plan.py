"""The Plan: every knob the search turns, frozen, validated, and round-tripped through JSON.

A Plan says *how* to fine-tune; the ModelSpec says *what*. Invalid combinations are rejected
with the rule they break (``Plan.validate``), all rules at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from advisor.core.errors import AdvisorInputError, ConfigErrors

METHODS = ("full", "lora", "qlora")
QUANTIZATIONS = ("none", "int8", "nf4", "fp4")
DTYPES = ("bf16", "fp16", "fp32")
PRECISIONS = ("bf16", "fp16", "fp32", "mixed_bf16", "mixed_fp16")
OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adafactor", "sgd",
              # transformers 5 OptimizerNames (training_args.py): fused torch AdamW (the default), torchao
              # low-bit AdamW, GaLore / APOLLO low-rank projections, LOMO / AdaLomo (update inside backward)
              "adamw_torch_fused", "adamw_torch_8bit", "adamw_torch_4bit", "galore_adamw", "galore_adamw_8bit",
              "galore_adamw_layerwise", "apollo_adamw", "lomo", "adalomo")
LOW_RANK_OPTIMIZERS = ("galore_adamw", "galore_adamw_8bit", "galore_adamw_layerwise", "apollo_adamw")
"""Optimizers that project each targeted weight's gradient to rank ``optim_rank`` (full fine-tuning only)."""
FUSED_BACKWARD_OPTIMIZERS = ("lomo", "adalomo", "galore_adamw_layerwise")
"""Optimizers that update each parameter inside backward and free its gradient at once."""
PAGED_OPTIMIZERS = ("paged_adamw_8bit", "paged_adamw_32bit")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
OFFLOADS = ("none", "zero2_cpu", "zero3_cpu")
LOSSES = ("plain", "chunked", "fused-linear")
"""plain: the model's own loss over all logits; chunked: the output projection and loss over chunks of
tokens, each recomputed in backward; fused-linear: the projection fused with cross-entropy, gradients
computed in the forward (Liger's fused linear cross-entropy, Apple's cut cross-entropy)."""
ALL_LINEAR = "all-linear"

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Plan:
    """One way to fine-tune a model: method, memory techniques and shapes of a step."""

    method: str = "lora"
    """full (every weight trained), lora (adapters on a bf16/fp16 or 8-bit base), qlora (adapters on a 4-bit base)."""
    quantization: str = "none"
    """How the frozen base weights are stored: none, int8 (LLM.int8), nf4 or fp4 (bitsandbytes 4-bit)."""
    double_quant: bool = False
    """Quantize the 4-bit absmax constants again (bnb_4bit_use_double_quant)."""
    compute_dtype: str = "bf16"
    """dtype quantized weights are dequantized to for the matmul (bnb_4bit_compute_dtype)."""
    precision: str = "bf16"
    """Weights and training math: bf16/fp16/fp32 (pure), mixed_bf16/mixed_fp16 (fp32 weights, autocast)."""
    lora_r: int = 16
    """LoRA rank: more capacity, more adapter memory."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.05
    """Dropout on the adapter input (0 saves the dropout mask and copy)."""
    lora_targets: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get adapters, or "all-linear"."""
    dora: bool = False
    """DoRA (peft use_dora): a trained magnitude vector per adapted module; its forward re-runs the base
    matmul on the dropped-out input and keeps an fp32 copy of the weight for backward."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input and recompute the rest in backward (~1/3 more compute)."""
    optimizer: str = "adamw_torch"
    """Optimizer (TrainingArguments.optim names)."""
    micro_batch: int = 1
    """Sequences per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradients held between them)."""
    seq_len: int = 1024
    """Tokens per sequence (the padded length of the longest batch, or the packed length)."""
    packing: bool = False
    """Pack several documents into each sequence of seq_len tokens (position_ids restart per document:
    no padding, no cross-document attention); without it a batch is padded to its longest document."""
    attn_impl: str = "sdpa"
    """Attention implementation: sdpa, eager (materializes the scores), flash_attention_2."""
    offload: str = "none"
    """none, zero2_cpu (DeepSpeed ZeRO-2, optimizer on the CPU), zero3_cpu (ZeRO-3, parameters and optimizer on the CPU)."""
    loss: str = "plain"
    """How the loss is computed: plain, chunked or fused-linear (see LOSSES)."""
    expandable_segments: bool = False
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator grows one segment per pool
    in 2/20 MiB pages instead of one cudaMalloc per block size, so freed memory is reused across sizes
    (less reserved beyond the live tensors; slower first allocations, no CUDA IPC of the tensors)."""
    eval_batch: int = 0
    """Sequences per evaluation forward (per_device_eval_batch_size); 0: the micro-batch."""
    max_new_tokens: int = 0
    """Tokens generated per sequence by a generation-based evaluation; 0: the run does not generate."""
    # ---- optimizer implementation, checkpointing granularity, activation offload (issue 15, levers 1-3)
    optim_rank: int = 128
    """GaLore / APOLLO projection rank (TrainingArguments optim_args "rank=", transformers' default 128)."""
    optim_proj_gap: int = 200
    """Steps between GaLore / APOLLO projection updates (optim_args "update_proj_gap="; an SVD spike each time)."""
    optimizer_in_backward: bool = False
    """Step each parameter's optimizer inside backward, as soon as its gradient exists, and free the gradient
    (torchtune optimizer_in_bwd): no full gradient buffer; needs grad_accum 1, no clipping."""
    checkpoint_layers: int | None = None
    """With gradient_checkpointing: how many decoder layers are checkpointed (None: all of them)."""
    activation_offload: bool = False
    """Keep saved activations in pinned host memory (with checkpointing: the checkpointed layer inputs,
    transformers' activation_checkpointing_kwargs offload; without: TRL/torchtune activation offloading)."""

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
        return self.quantization in ("nf4", "fp4")

    @property
    def param_dtype(self) -> str:
        """dtype the unquantized weights are held in."""
        return "fp32" if self.precision.startswith("mixed") or self.precision == "fp32" else self.precision

    @property
    def activation_dtype(self) -> str:
        """dtype the forward pass computes in."""
        if self.precision.startswith("mixed"):
            return self.precision.split("_")[1]
        return self.precision

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq_len * self.grad_accum

    # ------------------------------------------------------------------ validation

    def problems(self) -> list[AdvisorInputError]:
        """Every rule this plan breaks (empty when it is valid)."""
        errs: list[AdvisorInputError] = []

        def bad(key: str, rule: str, value: Any) -> None:
            errs.append(AdvisorInputError(flag_of(key), rule, value))

        for key, allowed in (("method", METHODS), ("quantization", QUANTIZATIONS), ("compute_dtype", DTYPES),
                             ("precision", PRECISIONS), ("optimizer", OPTIMIZERS), ("attn_impl", ATTENTION),
                             ("offload", OFFLOADS), ("loss", LOSSES)):
            if getattr(self, key) not in allowed:
                bad(key, f"must be one of {', '.join(allowed)}", getattr(self, key))
        for key in ("micro_batch", "grad_accum", "seq_len", "optim_rank", "optim_proj_gap"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(key, "must be a whole number of at least 1", v)
        for key in ("eval_batch", "max_new_tokens"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                bad(key, "must be a whole number of at least 0 (0: the default)", v)
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
        if self.peft:
            if not isinstance(self.lora_r, int) or isinstance(self.lora_r, bool) or self.lora_r < 1:
                bad("lora_r", "the LoRA rank must be a whole number of at least 1", self.lora_r)
            if not isinstance(self.lora_alpha, (int, float)) or self.lora_alpha <= 0:
                bad("lora_alpha", "LoRA alpha must be greater than 0", self.lora_alpha)
            if not isinstance(self.lora_dropout, (int, float)) or not 0 <= self.lora_dropout < 1:
                bad("lora_dropout", "LoRA dropout must be in [0, 1)", self.lora_dropout)
            targets = self.lora_targets
            if targets != ALL_LINEAR and (not isinstance(targets, tuple) or not targets
                                          or not all(isinstance(t, str) and t for t in targets)):
                bad("lora_targets", f"must be a list of module names or {ALL_LINEAR}", targets)
        errs += self._lever_problems()
        if self.attn_impl == "flash_attention_2" and self.activation_dtype == "fp32":
            bad("attn_impl", "flash_attention_2 computes in fp16/bf16 only; use sdpa or eager with fp32",
                self.attn_impl)
        if self.offload != "none":
            if self.optimizer != "adamw_torch":
                bad("optimizer", "DeepSpeed CPU offload runs its own CPU Adam: use adamw_torch with offload",
                    self.optimizer)
            if self.quantization == "int8":
                bad("offload", "DeepSpeed ZeRO cannot partition bitsandbytes 8-bit weights", self.offload)
            if self.offload == "zero3_cpu" and self.four_bit:
                bad("offload", "ZeRO-3 parameter offload of 4-bit bitsandbytes weights is not planned here; "
                    "use zero2_cpu with qlora", self.offload)
        optimizer_problems(self, bad)
        if self.precision in ("fp16",) and self.method == "full":
            bad("precision", "pure fp16 full fine-tuning diverges (no fp32 master weights): use mixed_fp16 or bf16",
                self.precision)
        return errs

    def _lever_problems(self) -> list[AdvisorInputError]:
        """The rules of the loss, DoRA and packing knobs."""
        errs: list[AdvisorInputError] = []
        if not isinstance(self.dora, bool):
            errs.append(AdvisorInputError(flag_of("dora"), "must be true or false", self.dora))
        elif self.dora and not self.peft:
            errs.append(AdvisorInputError(flag_of("dora"), "DoRA decomposes LoRA adapters: use method lora "
                                          "(a full fine-tune has none)", self.method))
        elif self.dora and self.quantized:
            errs.append(AdvisorInputError(flag_of("dora"), "DoRA over a quantized base is not planned here (peft "
                                          "dequantizes the base weight in each forward): use quantization none",
                                          self.quantization))
        if not isinstance(self.packing, bool):
            errs.append(AdvisorInputError(flag_of("packing"), "must be true or false", self.packing))
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
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        known = {f.name for f in fields(cls)} | {"chunked_ce"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AdvisorInputError("plan", f"unknown key(s) {', '.join(unknown)}", unknown, show_value=False)
        data = dict(data)
        if "chunked_ce" in data:  # configs and studies written before the loss knob
            legacy = data.pop("chunked_ce")
            if legacy and "loss" not in data:
                data["loss"] = "chunked"
        if "lora_targets" in data:
            data["lora_targets"] = normalize_targets(data["lora_targets"])
        return cls(**data)

    def with_(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    def short(self) -> str:
        """A one-line summary, for tables."""
        parts = [self.method]
        if self.quantized:
            parts.append(self.quantization + ("+dq" if self.double_quant else ""))
        if self.peft:
            targets = self.lora_targets if isinstance(self.lora_targets, str) else ",".join(
                t.removesuffix("_proj") for t in self.lora_targets)
            parts.append(f"r{self.lora_r}[{targets}]" + ("+dora" if self.dora else ""))
        parts.append(self.precision)
        if self.gradient_checkpointing:
            parts.append("ckpt" if self.checkpoint_layers is None else f"ckpt{self.checkpoint_layers}")
        if self.activation_offload:
            parts.append("act-offload")
        parts.append(self.optimizer + (f"(r{self.optim_rank})" if self.optimizer in LOW_RANK_OPTIMIZERS else "")
                     + ("+in-bwd" if self.optimizer_in_backward else ""))
        if self.offload != "none":
            parts.append(self.offload)
        parts.append(f"b{self.micro_batch}x{self.grad_accum} s{self.seq_len}")
        if self.attn_impl != "sdpa":
            parts.append(self.attn_impl)
        if self.loss == "chunked":
            parts.append("chunked-ce")  # the name short() used before the loss knob (kept: studies key on it)
        elif self.loss != "plain":
            parts.append(self.loss + "-ce")
        if self.packing:
            parts.append("packed")
        if self.expandable_segments:
            parts.append("expandable")
        if self.eval_batch:
            parts.append(f"eval-b{self.eval_batch}")
        if self.max_new_tokens:
            parts.append(f"gen{self.max_new_tokens}")
        return " ".join(parts)


_FLAGS = {
    "micro_batch": "--micro-batch", "grad_accum": "--grad-accum", "seq_len": "--seq-len",
    "lora_r": "--lora-r", "lora_alpha": "--lora-alpha", "lora_dropout": "--lora-dropout",
    "lora_targets": "--lora-targets", "gradient_checkpointing": "--gradient-checkpointing",
    "attn_impl": "--attn-impl", "compute_dtype": "--compute-dtype", "double_quant": "--double-quant",
    "loss": "--loss", "dora": "--dora", "packing": "--packing",
    "checkpoint_layers": "--checkpoint-layers",
    "activation_offload": "--activation-offload", "optimizer_in_backward": "--optimizer-in-backward",
    "optim_rank": "--optim-rank", "optim_proj_gap": "--optim-proj-gap",
    "eval_batch": "--eval-batch", "max_new_tokens": "--max-new-tokens",
    "expandable_segments": "--expandable-segments",
}


def flag_of(key: str) -> str:
    """The CLI flag a Plan field is set with."""
    return _FLAGS.get(key, "--" + key.replace("_", "-"))


def normalize_targets(value: Any) -> tuple[str, ...] | str:
    """"all-linear", "q_proj,v_proj" or a list → the Plan's form."""
    if isinstance(value, str):
        if value.strip() == ALL_LINEAR:
            return ALL_LINEAR
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(t) for t in value)
    return value


def default_quantization(method: str) -> str:
    return "nf4" if method == "qlora" else "none"


def lora_target_modules(plan: Plan, layer_linears: list[str]) -> list[str]:
    """The decoder-layer linear modules that get adapters under ``plan`` (all-linear → every one)."""
    if not plan.peft:
        return []
    if plan.lora_targets == ALL_LINEAR:
        return list(layer_linears)
    missing = [t for t in plan.lora_targets if t not in layer_linears]
    if missing:
        raise AdvisorInputError(
            "--lora-targets", f"module(s) {', '.join(missing)} not in this model's layers "
            f"(it has {', '.join(layer_linears)})", ",".join(plan.lora_targets), show_value=False)
    return [t for t in layer_linears if t in plan.lora_targets]


def optimizer_problems(plan: Plan, bad) -> None:
    """The rules of the optimizer implementation, the step inside backward and partial checkpointing
    (levers of issue 15); each broken rule is reported through ``bad(key, rule, value)``."""
    opt = plan.optimizer
    if opt in LOW_RANK_OPTIMIZERS and plan.method != "full":
        bad("optimizer", "GaLore and APOLLO project full-rank weight gradients: use them with --method full",
            opt)
    in_bwd = opt in FUSED_BACKWARD_OPTIMIZERS or plan.optimizer_in_backward
    if in_bwd and plan.grad_accum != 1:
        what = opt if opt in FUSED_BACKWARD_OPTIMIZERS else "--optimizer-in-backward"
        bad("grad_accum", f"{what} updates the weights inside backward, so there is no gradient to accumulate: "
            "gradient accumulation must be 1", plan.grad_accum)
    if plan.optimizer_in_backward:
        if opt in FUSED_BACKWARD_OPTIMIZERS:
            bad("optimizer_in_backward", f"{opt} already updates inside backward", plan.optimizer_in_backward)
        if plan.offload != "none":
            bad("optimizer_in_backward", "DeepSpeed CPU offload runs its own optimizer step", plan.optimizer_in_backward)
        if plan.precision == "mixed_fp16":
            bad("optimizer_in_backward", "fp16 loss scaling must unscale every gradient before any step: use bf16",
                plan.precision)
    if opt in ("lomo", "adalomo") and plan.precision == "mixed_fp16":
        bad("optimizer", "LOMO keeps its own loss scaler; the Trainer's fp16 GradScaler cannot wrap it: use bf16",
            opt)
    k = plan.checkpoint_layers
    if k is not None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            bad("checkpoint_layers", "must be a whole number of at least 1 (or unset for every layer)", k)
        elif not plan.gradient_checkpointing:
            bad("checkpoint_layers", "checkpointing k layers needs --gradient-checkpointing on", k)


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


def every_n_layers(k: int, num_layers: int) -> int | None:
    """The ``every_n_layers`` that checkpoints exactly ``k`` of ``num_layers`` layers, if there is one."""
    for n in range(1, num_layers + 1):
        if len(range(0, num_layers, n)) == k:
            return n
    return None
