"""The analytic ledger of one training step: closed-form bytes per category, in microseconds.

Each formula carries a one-line citation. Notation: T = micro_batch * seq_len tokens, h hidden,
i intermediate, V vocabulary, L layers, p = bytes of the activation dtype.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.memory.ledger import MemoryReport, empty
from advisor.memory.overhead import overhead_of as framework_overhead_of
from advisor.core.plan import (DTYPE_BYTES, Plan, checkpointed_layers,
                               lora_target_modules)
from advisor.core.adapters import adapted_modules, attention_linears
from advisor.memory import experts, loss_dora_packing
from advisor.memory.host import OFFLOAD_MIN_BYTES, host_memory, pinned_block_bytes, pinned_bytes_of

NF4_BLOCK = 64
"""Values per absmax block of 4-bit (NF4/FP4) weights: bitsandbytes' default, which transformers' BitsAndBytesConfig
keeps (``Params4bit`` and ``functional.quantize_4bit`` turn ``blocksize=None`` into 64, bitsandbytes 0.50
nn/modules.py and functional.py). The ledger, the load phase and the simulation's stand-ins all use this one."""
DQ_BLOCK = 256
"""Absmax values per fp32 constant under double quantization: ``quantize_4bit(compress_statistics=True)``
quantizes the absmax with ``quantize_blockwise(..., blocksize=256)`` (bitsandbytes 0.50 functional.py)."""
OPT8_BLOCK = 256          # blockwise 8-bit optimizer block (bitsandbytes optim/optimizer.py, Dettmers et al. 2022)
OPT8_MIN_SIZE = 4096      # tensors smaller than this keep 32-bit states (bitsandbytes min_8bit_size)
ZERO2_REDUCE_BUCKET = 2e8  # DeepSpeed reduce_bucket_size in our exported config (deepspeed.ai/docs/config-json)
ZERO3_PREFETCH = 5e7       # DeepSpeed stage3_prefetch_bucket_size default (deepspeed.ai/docs/config-json)
CE_CHUNK_TOKENS = 256      # tokens per chunk of the chunked cross-entropy option (runtime.build runs it with this)


@dataclass(frozen=True)
class ParamBreakdown:
    """The model's parameters split the way memory treats them."""

    linear: int           # decoder-layer linear weights (what bitsandbytes quantizes)
    other: int            # embeddings, lm_head, norms, biases (kept in the compute dtype)
    adapter: int          # LoRA A and B
    lora_modules: tuple[str, ...]
    trainable: int


def param_breakdown(model: ModelSpec, plan: Plan) -> ParamBreakdown:
    if model.is_moe:
        return moe_param_breakdown(model, plan)
    shapes = model.linear_shapes()
    linear = model.num_layers * model.layer_linear_params()
    targets = lora_target_modules(plan, list(shapes), attention_linears(model))
    # LoRA adds A (r x in) and B (out x r) to each targeted module (Hu et al. 2021, eq. 3)
    adapter = model.num_layers * sum(plan.lora_r * (shapes[m][0] + shapes[m][1]) for m in targets)
    adapter += loss_dora_packing.dora_magnitude_params(model, plan, tuple(targets))
    trainable = adapter if plan.peft else model.params_total
    return ParamBreakdown(linear, model.params_total - linear, adapter, tuple(targets), trainable)


def weight_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> tuple[int, int]:
    """(weights, quantization constants) of the base model."""
    other_b = DTYPE_BYTES[plan.param_dtype]
    if plan.four_bit:
        # NF4/FP4: two 4-bit values per byte; one fp32 absmax per 64-value block (Dettmers et al. 2023, QLoRA §3)
        blocks = pb.linear / NF4_BLOCK
        if plan.double_quant:
            # double quant: absmax as 8-bit + one fp32 constant per 256 absmax (QLoRA §3 "Double Quantization")
            consts = blocks * 1 + blocks / DQ_BLOCK * 4
        else:
            consts = blocks * 4
        return int(pb.linear * 0.5 + pb.other * other_b + experts.fp32_router_params(model) * (4 - other_b)), int(consts)
    if plan.quantization == "int8":
        # LLM.int8: int8 weight + one fp32 scale per output row (Dettmers et al. 2022, bitsandbytes Int8Params.SCB)
        rows = model.num_layers * sum(o for _, o in model.linear_shapes().values())
        return int(pb.linear * 1 + pb.other * other_b), int(rows * 4)
    # a router the class keeps in fp32 whatever the dtype (DeepSeek's gate.weight, _keep_in_fp32_modules_strict)
    return int(model.params_total * other_b + experts.fp32_router_params(model) * (4 - other_b)), 0


def moe_param_breakdown(model: ModelSpec, plan: Plan) -> ParamBreakdown:
    """A mixture of experts: the linears bitsandbytes converts (attention, shared experts, dense MLPs: every layer's
    ``quantized_by_bnb`` linears); the stacked experts, routers, norms, embeddings and biases stay in the compute
    dtype (``other``; transformers/integrations/bitsandbytes.py:189 converts ``type(module) is nn.Linear`` only).
    Adapters: LoRA on the adapted linears of each layer, and with ``lora_experts`` a rank-r pair per expert on each
    stacked weight (advisor.memory.experts.adapter_params)."""
    modules = adapted_modules(model, plan) if plan.peft else []
    linear = experts.quantized_linear_params(model)
    on_linears, on_experts = experts.adapter_params(model, plan, modules)
    adapter = on_linears + on_experts
    trainable = adapter if plan.peft else model.params_total
    return ParamBreakdown(linear, model.params_total - linear, adapter, tuple(modules), trainable)


def trainable_dtype_bytes(plan: Plan) -> int:
    """Bytes per trainable parameter (and its gradient)."""
    # peft upcasts fp16/bf16 adapters to fp32 (peft get_peft_model autocast_adapter_dtype=True)
    return 4 if plan.peft else DTYPE_BYTES[plan.param_dtype]


def optimizer_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Persistent optimizer state after the first step."""
    n = pb.trainable
    tb = trainable_dtype_bytes(plan)
    opt = plan.optimizer
    if plan.offload != "none":
        return 0  # on the host: see host_bytes
    newer = implementation_state_bytes(model, plan, pb)
    if newer is not None:
        return newer
    if opt == "adamw_torch":
        # exp_avg and exp_avg_sq, zeros_like(param) (torch/optim/adamw.py _init_group)
        return 2 * n * tb
    if opt == "paged_adamw_32bit":
        # bitsandbytes 32-bit states are fp32 whatever the param dtype (bnb Optimizer2State.init_state)
        return 2 * n * 4
    if opt in ("adamw_8bit", "paged_adamw_8bit"):
        # 8-bit blockwise: 1 B per value per state + fp32 absmax per 256 values; small tensors stay fp32
        # (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization")
        small = _small_tensor_params(model, plan, pb)
        if not plan.peft:
            # Trainer.create_optimizer keeps nn.Embedding weights in 32-bit states (GlobalOptimManager override)
            small += model.embedding_params
        big = n - small
        return int(2 * big * (1 + 4 / OPT8_BLOCK) + 2 * small * 4)
    if opt == "adafactor":
        # factored second moment: a row and a column vector per matrix, no first moment
        # (Shazeer & Stern 2018; transformers.optimization.Adafactor with beta1=None)
        return int(_adafactor_elems(model, plan, pb) * tb)
    return 0  # plain SGD without momentum keeps no state (torch.optim.SGD momentum=0)


def _small_tensor_params(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Trainable parameters in tensors below bitsandbytes' min_8bit_size (kept in 32-bit)."""
    if plan.peft:
        shapes = model.linear_shapes()
        return model.num_layers * sum(
            plan.lora_r * d for m in pb.lora_modules for d in shapes[m] if plan.lora_r * d < OPT8_MIN_SIZE) + (
            model.num_layers * sum(shapes[m][1] for m in pb.lora_modules if shapes[m][1] < OPT8_MIN_SIZE)
            if plan.dora else 0)  # DoRA magnitudes: one vector per module
    norms_biases = model.num_layers * (model.layer_norm_params() + sum(model.layer_bias_params().values()))
    return norms_biases + model.hidden_size


def _adafactor_elems(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    shapes = model.linear_shapes()
    if plan.peft:
        return model.num_layers * sum(plan.lora_r + shapes[m][0] + plan.lora_r + shapes[m][1]
                                      for m in pb.lora_modules) + loss_dora_packing.dora_magnitude_params(
            model, plan, pb.lora_modules)  # a vector's second moment is not factored (Adafactor._get_options)
    per_layer = sum(i + o for i, o in shapes.values()) + model.layer_norm_params() + sum(
        model.layer_bias_params().values())
    emb = model.vocab_size + model.hidden_size
    head = 0 if model.tie_word_embeddings else model.vocab_size + model.hidden_size
    return model.num_layers * per_layer + emb + head + model.hidden_size


def optimizer_transient_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Temporaries of the optimizer step on top of parameters, gradients and states."""
    tb = trainable_dtype_bytes(plan)
    newer = implementation_transient_bytes(model, plan, pb)
    if newer is not None:
        return newer
    if plan.optimizer == "adamw_torch":
        # foreach AdamW materialises sqrt(exp_avg_sq) for a whole parameter group
        # (torch/optim/adamw.py _multi_tensor_adamw: torch._foreach_sqrt)
        return pb.trainable * tb
    if plan.optimizer == "adafactor":
        # per parameter: grad.float(), p.float() (16-bit parameters only), update = grad**2 + eps and the
        # new update from _approx_sq_grad alive together (transformers.optimization.Adafactor.step)
        n_max = _largest_trainable(model, plan, pb)
        return n_max * (8 + (8 if tb < 4 else 0))
    return 0  # bitsandbytes updates in place; foreach SGD without momentum adds in place


def _largest_trainable(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    shapes = model.linear_shapes()
    if plan.peft:
        return max(plan.lora_r * d for m in pb.lora_modules for d in shapes[m])
    return max(model.embedding_params, max(i * o for i, o in shapes.values()))


def layer_activation_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Tensors one decoder layer saves for backward (no checkpointing)."""
    return int(sum(layer_saved_tensors(model, plan, pb)))


def layer_saved_tensors(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> list[int]:
    """The bytes of each tensor one decoder layer saves for backward (no checkpointing), one entry per tensor
    (an activation offload pins each in a block of its own: advisor.memory.host)."""
    b, s = plan.micro_batch, plan.seq_len
    T = b * s
    p = DTYPE_BYTES[plan.activation_dtype]
    h, i = model.hidden_size, model.intermediate_size
    qd, kvd = model.q_dim, model.kv_dim
    shapes = model.linear_shapes()
    arch = model.arch or {}

    def input_saved(module: str) -> bool:
        # a frozen base linear saves its input only when its weight trains (full: aten linear backward) or
        # for LLM.int8 (MatMul8bitLt keeps A); MatMul4Bit keeps only the packed weight and a frozen
        # nn.Linear nothing (bitsandbytes/autograd/_functions.py); LoRA's own inputs are counted below
        return plan.method == "full" or plan.quantization == "int8"

    saved: list[int] = []
    # RMSNorm: fp32 copy of the input and rsqrt saved by pow/mul (transformers LlamaRMSNorm.forward);
    # the normalized input too when the norm weight trains
    for _ in range(arch.get("norms_per_layer", 2)):
        saved += [4 * T * h, 4 * T] + ([p * T * h] if plan.method == "full" else [])
    attn_in = [m for m in shapes if m in ("q_proj", "k_proj", "v_proj", "qkv_proj")]
    mlp_in = [m for m in shapes if m in ("gate_proj", "up_proj", "gate_up_proj")]
    if any(input_saved(m) for m in attn_in):
        saved.append(p * T * h)
    if arch.get("qk_norm"):
        saved += [4 * T * qd, 4 * T * kvd, 4 * T * model.num_heads, 4 * T * model.num_kv_heads]
    # attention: q and k after RoPE, v, output, and the fp32 logsumexp (FlashAttention-2, Dao 2023 §3.1)
    saved += [p * T * qd, p * T * kvd, p * T * kvd, p * T * qd, 4 * b * model.num_heads * s]
    if plan.attn_impl == "eager":
        # eager keeps fp32 softmax and its bf16 copy, b x heads x s x s (transformers eager_attention_forward)
        # and repeat_kv's expanded k and v
        saved += [4 * b * model.num_heads * s * s, p * b * model.num_heads * s * s, p * T * (qd - kvd),
                  p * T * (qd - kvd)]
    # o_proj's input is the attention output itself (flash/sdpa return it so that transpose(1, 2) is
    # contiguous: no copy), already counted above
    if any(input_saved(m) for m in mlp_in):
        saved.append(p * T * h)
    # gated MLP: gate output (activation input), activation output and up output (the product's inputs)
    saved += [p * T * i] * 3
    if input_saved("down_proj"):
        saved.append(p * T * i)
    for m in pb.lora_modules:
        fan_in = shapes[m][0]
        # peft casts the input to the fp32 adapter dtype; lora_A saves it, lora_B saves A's output
        # (peft/tuners/lora/layer.py Linear.forward)
        saved += [4 * T * fan_in, 4 * T * plan.lora_r]
        if plan.lora_dropout > 0:
            saved.append(T * fan_in)  # dropout mask, 1 byte per element
    saved.append(loss_dora_packing.dora_layer_activation_bytes(model, plan, pb.lora_modules))
    saved.append(loss_dora_packing.packed_layer_bytes(model, plan))
    return [x for x in saved if x]


def logits_bytes(model: ModelSpec, plan: Plan) -> tuple[int, int]:
    """(forward, backward) transient of the logits and the loss."""
    if plan.loss == "fused-linear":
        return loss_dora_packing.fused_linear_loss_bytes(model, plan)
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    if plan.chunked_ce:
        T = min(T, CE_CHUNK_TOKENS)
    TV = T * model.vocab_size
    # logits in the compute dtype, upcast to fp32, log_softmax output saved by the loss
    # (transformers loss_utils.ForCausalLMLoss: logits.float(); F.cross_entropy)
    fwd = (p + 4 + 4) * TV
    if (model.arch or {}).get("logit_softcap"):
        fwd += 2 * p * TV  # tanh soft-capping: divided logits and tanh output (Gemma2ForCausalLM.forward)
    # backward peak: the saved fp32 log_softmax, nll_loss_backward's fp32 gradient and
    # _log_softmax_backward_data's fp32 output, all alive at once (aten derivatives.yaml; traced)
    bwd = (4 + 4 + 4) * TV
    return int(fwd), int(bwd)


def _packing_dora_activation_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Held through forward and backward: the packed-documents mask, less DoRA's first layer."""
    return loss_dora_packing.packed_mask_bytes(model, plan) - loss_dora_packing.dora_first_layer_saving(model, plan, pb.lora_modules)


def _add_lever_phases(phases: dict, model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> None:
    """DoRA's forward spike: at the last layer's forward, every activation held (loss phase's), no logits yet;
    with checkpointing again when the last layer is recomputed."""
    spike = loss_dora_packing.dora_forward_spike(model, plan, pb.lora_modules)
    if not spike:
        return
    loss = phases["loss"]
    phases["forward"] = dict(gradients=loss["gradients"], activations=loss["activations"], transient=spike)
    if "backward-recompute" in phases:
        rec = phases["backward-recompute"]
        rec["transient"] = max(rec["transient"], spike)


def estimate_training(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None) -> MemoryReport:
    """The analytic ledger of one measured step (after warm-up: optimizer states exist)."""
    plan.validate()
    if model.is_moe:
        return estimate_moe_training(model, plan, gpu)
    pb = param_breakdown(model, plan)
    weights, consts = weight_bytes(model, plan, pb)
    tb = trainable_dtype_bytes(plan)
    adapters = pb.adapter * 4 if plan.peft else 0
    grads = pb.trainable * tb
    states = optimizer_state_bytes(model, plan, pb)
    host = empty()
    masters = 0
    notes: list[str] = []
    p = DTYPE_BYTES[plan.activation_dtype]

    if plan.offload != "none":
        # ZeRO-Offload keeps fp32 master weights, fp32 Adam moments and fp32 gradients on the host
        # (Ren et al. 2021, ZeRO-Offload §4; deepspeed.ai/tutorials/zero-offload): advisor.memory.host counts
        # them buffer by buffer, pinned or pageable
        # the GPU keeps gradient buckets until they are copied out (reduce_bucket_size)
        grads = int(min(pb.trainable, ZERO2_REDUCE_BUCKET) * tb)
        if plan.offload == "zero3_cpu":
            # ZeRO-3 offload_param: parameters live on the host; the GPU gathers a layer at a time plus
            # the prefetch bucket (stage3_prefetch_bucket_size) (Rajbhandari et al. 2021, ZeRO-Infinity)
            live = max(model.layer_params(), model.embedding_params) * 2 + ZERO3_PREFETCH
            weights = int(min(model.params_total, live) * DTYPE_BYTES[plan.param_dtype])

    layer_acts = layer_activation_bytes(model, plan, pb)
    L = model.num_layers
    T = plan.micro_batch * plan.seq_len
    h = model.hidden_size
    # final norm: fp32 input and rsqrt; its bf16 normalized input too when the norm weight trains
    final_norm = 4 * T * h + 4 * T + (p * T * h if plan.method == "full" else 0)
    head_input = p * T * h if plan.method == "full" else 0
    levers = activation_levers(model, plan, pb, layer_acts, final_norm, head_input) \
        if plan.activation_offload or plan.checkpoint_layers is not None else None
    if levers is not None:
        acts, recomputed = levers["loss"], levers["recomputed"]
        notes.append(levers["note"])
    elif plan.gradient_checkpointing:
        # HF checkpointing keeps each layer's input; one layer is recomputed at a time in backward,
        # after the loss's backward (Chen et al. 2016; transformers GradientCheckpointingLayer)
        acts = L * p * T * h + final_norm + head_input
        recomputed = layer_acts
        if plan.quantization == "int8":
            # MatMul8bitLt keeps its input on ctx.tensors, not save_for_backward, so checkpointing cannot drop
            # it: every layer keeps its linears' inputs (bitsandbytes/autograd/_functions.py MatMul8bitLt.forward)
            acts += L * int8_held_bytes(model, plan)
    else:
        acts = L * layer_acts + final_norm + head_input
        recomputed = 0
    acts += _packing_dora_activation_bytes(model, plan, pb)
    logits_fwd, logits_bwd = logits_bytes(model, plan)

    # the largest dequantized weight of a 4/8-bit layer exists during its matmul (bitsandbytes dequantize_4bit)
    dequant = max(i * o for i, o in model.linear_shapes().values()) * p if plan.quantized else 0
    # autocast caches the low-precision copy of every trainable fp32 weight in the forward region
    # (torch/csrc/autograd/autocast_mode.cpp cached_cast); weights that do not train are cast each time
    autocast_cache = pb.linear * p if plan.precision.startswith("mixed") and plan.method == "full" else 0
    grads_held = grads if plan.grad_accum > 1 else 0
    opt_temp = optimizer_transient_bytes(model, plan, pb) if plan.offload == "none" else 0
    # backward of one layer: gradients of its largest activations (MLP intermediate and its input)
    layer_bwd_temp = 2 * p * T * model.intermediate_size + dequant
    # full fine-tuning: embedding_dense_backward makes a vocab x hidden gradient, added into the tied /
    # existing one at the end of backward (aten embedding_backward; traced)
    # (an untied embedding's first gradient is the .grad itself: no separate sum; traced on Qwen2.5-7B)
    emb_bwd_temp = model.embedding_params * DTYPE_BYTES[plan.param_dtype] \
        if plan.method == "full" and (model.tie_word_embeddings or plan.grad_accum > 1) else 0

    phases = {
        "loss": dict(gradients=grads_held, activations=acts, transient=logits_fwd + autocast_cache),
        "backward": dict(gradients=grads_held, activations=acts, transient=logits_bwd + autocast_cache),
        "backward-end": dict(gradients=grads, activations=(p * T * h + recomputed) if plan.gradient_checkpointing
                             else layer_acts, transient=layer_bwd_temp + autocast_cache),
        # after the first layer's backward: the embedding's gradient, no activations left
        "backward-embedding": dict(gradients=grads, activations=0, transient=emb_bwd_temp + autocast_cache),
        "optimizer": dict(gradients=grads, activations=0, transient=opt_temp),
    }
    if plan.gradient_checkpointing:
        # the last layer is recomputed first, while every layer's input is still held and before most
        # gradients exist; each layer input is released after its backward (torch.utils.checkpoint)
        # every layer's input, and what LLM.int8 linears hold on their context inside the checkpointed layers
        phases["backward-recompute"] = dict(gradients=grads_held,
                                            activations=L * (p * T * h + int8_held_bytes(model, plan)) + recomputed,
                                            transient=layer_bwd_temp + autocast_cache)
    else:
        # the last layer's backward, every layer's activations still held (the logits are gone by then)
        phases["backward-layers"] = dict(gradients=grads_held, activations=acts,
                                         transient=layer_bwd_temp + autocast_cache)
    if levers is not None:
        apply_activation_levers(phases, levers, grads_held, layer_bwd_temp + autocast_cache)
    if plan.updates_in_backward:
        apply_update_in_backward(model, plan, pb, phases)
    _add_lever_phases(phases, model, plan, pb)
    peak_phase, at_peak = max(phases.items(), key=lambda kv: sum(kv[1].values()))

    device = empty()
    device.update(weights=weights, quant_constants=consts, adapter_weights=adapters,
                  optimizer_states=states, master_weights=masters, **at_peak)
    spilled: dict[str, int] = {}
    notes += paged_spill(device, spilled, plan, gpu)
    hm = host_memory(model, plan, activations_pinned=offloaded_activation_blocks(
        model, plan, pb), spill_bytes=spilled.get("optimizer_states", 0))
    host.update(hm.by_category())
    notes += hm.notes
    return _report(device, host, hm, notes, plan, gpu, peak_phase, max(logits_fwd, logits_bwd),
                   {"params_trainable": pb.trainable, "lora_modules": list(pb.lora_modules),
                    "activations_per_layer_bytes": layer_acts, "saved_activations_bytes": int(acts)})


def _report(device: dict[str, int], host: dict[str, int], hm, notes: list[str], plan: Plan, gpu: GpuSpec | None,
            peak_phase: str, loss_transient: int, extra: dict) -> MemoryReport:
    """The estimated report of a step's device ledger: the framework overhead over its tensor peak added."""
    tensor_peak = sum(device.values())
    over = framework_overhead_of(tensor_peak, gpu, expandable_segments=plan.expandable_segments,
                                 loss_transient_bytes=loss_transient)
    device["overhead"] = over.total
    notes += over.notes()
    return MemoryReport(
        source="estimated", backend="estimate", device=device, host=host, host_memory=hm,
        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + over.total), peak_phase=peak_phase,
        notes=tuple(notes), reserved_peak_bytes=int(tensor_peak + over.parts["fragmentation"]),
        extra={**extra, "overhead_parts": over.parts, "overhead_source": over.source,
               "fragmentation_source": over.fragmentation_source, "loss_transient_bytes": int(loss_transient)},
    )


MOE_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "sgd")
"""Optimizers whose states the mixture-of-experts closed form counts (the rest: the simulation answers)."""


def moe_optimizer_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Optimizer states of a mixture of experts, tensor by tensor (experts.trainable_tensor_sizes)."""
    tb = trainable_dtype_bytes(plan)
    opt = plan.optimizer
    if opt in ("adamw_torch", "adamw_torch_fused"):
        # exp_avg and exp_avg_sq, zeros_like(param) (torch/optim/adamw.py _init_group); an fp32 router's in fp32
        return 2 * pb.trainable * tb + (0 if plan.peft else 2 * experts.fp32_router_params(model) * (4 - tb))
    if opt == "paged_adamw_32bit":
        return 2 * pb.trainable * 4  # bitsandbytes 32-bit states are fp32 (Optimizer2State.init_state)
    if opt in ("adamw_8bit", "paged_adamw_8bit"):
        # 8-bit blockwise, 1 B per value + fp32 absmax per 256; tensors under min_8bit_size keep fp32 states
        # (Dettmers et al. 2022); Trainer keeps nn.Embedding in 32-bit (GlobalOptimManager override)
        sizes = experts.trainable_tensor_sizes(model, plan, list(pb.lora_modules))
        small = sum(n for n in sizes if n < OPT8_MIN_SIZE) + (0 if plan.peft else model.embedding_params)
        return int(2 * (pb.trainable - small) * (1 + 4 / OPT8_BLOCK) + 2 * small * 4)
    return 0  # SGD without momentum keeps no state


def estimate_moe_training(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None) -> MemoryReport:
    """The closed-form ledger of one step of a mixture of experts (advisor.memory.experts has the terms).

    The same phases as a dense step (``estimate_training``): the loss (every layer's saved tensors and the logits),
    backward, the last layer's backward (or, with checkpointing, its recomputation with every layer's input held),
    the end of backward and the optimizer step. What advisor.memory.closed_form sends here is what these terms
    cover: the families of ``experts.COVERED``, the optimizers of MOE_OPTIMIZERS, no offload, no int8."""
    pb = param_breakdown(model, plan)
    modules = list(pb.lora_modules)
    weights, consts = weight_bytes(model, plan, pb)
    tb = trainable_dtype_bytes(plan)
    adapters = pb.adapter * 4 if plan.peft else 0
    # an fp32 router's gradient stays fp32 in a full fine-tune (its parameter's dtype)
    grads = pb.trainable * tb + (0 if plan.peft else experts.fp32_router_params(model) * (4 - tb))
    states = moe_optimizer_state_bytes(model, plan, pb)
    p = DTYPE_BYTES[plan.activation_dtype]
    L = model.num_layers
    T = plan.micro_batch * plan.seq_len
    h = model.hidden_size
    x = p * T * h
    full = plan.method == "full"
    notes = [experts.router_note(model)]
    if plan.peft:
        from advisor.core.adapters import lora_targets

        notes += lora_targets(model, plan)[1]
    notes += gpt_oss_weight_notes(model, plan)

    all_layers, biggest, layer_bwd = experts.layers_saved(model, plan, modules)
    # final norm: fp32 input and rsqrt; its normalized input too when the norm weight trains; the head's input
    final_norm = 4 * T * h + 4 * T + (x if full else 0)
    head_input = x if full else 0
    if plan.gradient_checkpointing:
        # each layer keeps its input (transformers GradientCheckpointingLayer); one layer is recomputed at a time
        acts = L * x + final_norm + head_input
    else:
        acts = all_layers + final_norm + head_input
    logits_fwd, logits_bwd = logits_bytes(model, plan)
    dequant = 0
    if plan.quantized:
        # the largest dequantized linear of a 4-bit layer during its matmul (bitsandbytes dequantize_4bit)
        dequant = max(m.in_features * m.out_features for layer in model.description.layers for m in layer.linears
                      if m.quantized_by_bnb) * p
    layer_temp = layer_bwd + dequant
    grads_held = grads if plan.grad_accum > 1 else 0
    # a full fine-tune's gradients while the last layer's backward runs: the output head's (untied) and final
    # norm's, and the last layer's own (traced); at the end of backward all but the embedding's, which comes after
    # the first layer's backward (aten embedding_dense_backward)
    last_grads = grads_held or ((model.lm_head_params + model.description.final_norm_params
                                 + model.description.layers[-1].params) * tb if full else 0)
    end_grads = grads - (model.embedding_params * tb if full and plan.grad_accum == 1 else 0)
    opt_temp = pb.trainable * tb if plan.optimizer == "adamw_torch" else 0  # foreach sqrt (torch adamw.py)
    emb_bwd_temp = model.embedding_params * DTYPE_BYTES[plan.param_dtype] \
        if full and (model.tie_word_embeddings or plan.grad_accum > 1) else 0
    phases = {
        "loss": dict(gradients=grads_held, activations=acts, transient=logits_fwd),
        "backward": dict(gradients=grads_held, activations=acts, transient=logits_bwd),
        "backward-end": dict(gradients=end_grads, activations=(x + biggest) if plan.gradient_checkpointing
                             else biggest, transient=layer_temp),
        "backward-embedding": dict(gradients=grads, activations=0, transient=emb_bwd_temp),
        "optimizer": dict(gradients=grads, activations=0, transient=opt_temp),
    }
    if plan.gradient_checkpointing:
        phases["backward-recompute"] = dict(gradients=last_grads, activations=L * x + biggest, transient=layer_temp)
    else:
        phases["backward-layers"] = dict(gradients=last_grads, activations=acts, transient=layer_temp)
    peak_phase, at_peak = max(phases.items(), key=lambda kv: sum(kv[1].values()))
    device = empty()
    device.update(weights=weights, quant_constants=consts, adapter_weights=adapters, optimizer_states=states,
                  master_weights=0, **at_peak)
    spilled: dict[str, int] = {}
    notes += paged_spill(device, spilled, plan, gpu)
    hm = host_memory(model, plan, spill_bytes=spilled.get("optimizer_states", 0))
    host = empty()
    host.update(hm.by_category())
    notes += hm.notes
    return _report(device, host, hm, notes, plan, gpu, peak_phase, max(logits_fwd, logits_bwd),
                   {"params_trainable": pb.trainable, "lora_modules": modules,
                    "lora_experts": bool(plan.peft and plan.lora_experts), "activations_per_layer_bytes": biggest,
                    "saved_activations_bytes": int(acts)})


def gpt_oss_weight_notes(model: ModelSpec, plan: Plan) -> list[str]:
    """gpt-oss ships its experts in MXFP4; training holds them in bf16 (advisor.core.card_rules.mxfp4_kept)."""
    from advisor.core.card_rules import mxfp4_training_note

    note = mxfp4_training_note(model, plan)
    return [note] if note else []


# --------------------------------------------------------------------------- optimizer implementations (fused, torchao low-bit, low-rank, LOMO)

AO_BLOCK = 256            # torchao low-bit AdamW block, as transformers passes it (trainer_optimizer._get_torchao_adamw)
AO_MIN_SIZE = 4096        # torchao quantizes tensors of >= 4096 values whose size divides the block (optim/adam.py)
AO_QMAP = {8: 256 * 4, 4: 16 * 4}  # one fp32 code map per quantized state tensor (torchao subclass_8bit / _4bit)
ALLOC_BLOCK = 512         # CUDA caching allocator's smallest block (c10 CUDACachingAllocator kMinBlockSize)


def _blocks(n: int) -> int:
    return -(-n // ALLOC_BLOCK) * ALLOC_BLOCK


def trainable_tensors(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> list[tuple[int, ...]]:
    """Shapes of the trainable tensors: (out, in) for matrices, (n,) for vectors (what per-tensor
    optimizers allocate state for, tensor by tensor)."""
    shapes = model.linear_shapes()
    L = model.num_layers
    if plan.peft:
        # LoRA A is (r, in), B is (out, r) (peft/tuners/lora/layer.py update_layer)
        return [t for m in pb.lora_modules for t in ((plan.lora_r, shapes[m][0]), (shapes[m][1], plan.lora_r))] * L
    arch = model.arch or {}
    norms = [(model.hidden_size,)] * arch.get("norms_per_layer", 2)
    if arch.get("qk_norm"):
        norms += [(model.head_dim,), (model.head_dim,)]
    layer = [(o, i) for i, o in shapes.values()] + [(n,) for n in model.layer_bias_params().values()] + norms
    out = layer * L + [(model.vocab_size, model.hidden_size), (model.hidden_size,)]
    if not model.tie_word_embeddings:
        out.append((model.vocab_size, model.hidden_size))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def low_rank_targets(model: ModelSpec, plan: Plan) -> list[tuple[int, int]]:
    """(out, in) of every weight GaLore / APOLLO project: the decoder-layer linears (advisor.build.GALORE_TARGETS)."""
    return [(o, i) for i, o in model.linear_shapes().values()] * model.num_layers


def projected_shape(out: int, inp: int, plan: Plan) -> tuple[tuple[int, int], tuple[int, int]]:
    """(low-rank gradient, projection matrix) shapes of one (out, in) weight.

    GaLore "std": a tall matrix is projected on the right by Vh[:r] (r x in), a wide one on the left by
    U[:, :r] (out x r); an SVD has at most min(out, in) singular vectors (galore_projector.py). APOLLO's
    random projection has exactly r rows or columns (apollo_torch/random_projector.py)."""
    r = plan.optim_rank
    if plan.optimizer.startswith("galore"):
        r = min(r, out, inp)
    if out >= inp:
        return (out, r), (r, inp)
    return (r, inp), (out, r)


def _adam_state(n: int, tb: int) -> int:
    return 2 * _blocks(n * tb)


def _bnb8_state(n: int) -> int:
    # bitsandbytes blockwise 8-bit: uint8 per value + fp32 absmax per OPT8_BLOCK, fp32 under min_8bit_size
    if n < OPT8_MIN_SIZE:
        return 2 * _blocks(n * 4)
    return 2 * (_blocks(n) + _blocks(-(-n // OPT8_BLOCK) * 4))


def torchao_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown, bits: int) -> int:
    """torchao AdamW8bit / AdamW4bit: exp_avg and exp_avg_sq as quantized subclasses (codes, an fp32 scale per
    block, the code map) for big tensors; zeros_like(param) below (torchao/optim/adam.py _new_buffer)."""
    tb = trainable_dtype_bytes(plan)
    total = 0
    for shape, count in Counter(trainable_tensors(model, plan, pb)).items():  # each distinct shape once
        n = _numel(shape)
        if n >= AO_MIN_SIZE and n % AO_BLOCK == 0:
            total += count * 2 * (_blocks(n * bits // 8) + _blocks(n // AO_BLOCK * 4) + _blocks(AO_QMAP[bits]))
        else:
            total += count * _adam_state(n, tb)
    return total


def low_rank_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """GaLore / APOLLO: Adam moments of the projected gradient and the projection matrix for each target,
    plain Adam states (param dtype) for the rest: embeddings, head, norms (GaLore §3, Zhao et al. 2024;
    APOLLO, Zhu et al. 2024; galore_torch/adamw.py, apollo_torch/apollo.py)."""
    tb = trainable_dtype_bytes(plan)
    eight = plan.optimizer == "galore_adamw_8bit"
    total = 0
    targets = low_rank_targets(model, plan)
    for out, inp in targets:
        low, proj = projected_shape(out, inp, plan)
        n = _numel(low)
        total += _bnb8_state(n) if eight else _adam_state(n, tb)
        # the projection matrix is cast back to the parameter dtype (galore_projector get_orthogonal_matrix)
        total += _blocks(_numel(proj) * tb)
    target_elems = sum(o * i for o, i in targets)
    rest = [s for s in trainable_tensors(model, plan, pb)]
    # the non-target tensors: everything but the decoder-layer matrices
    rest_elems = [_numel(s) for s in rest]
    for n in _without(rest_elems, [o * i for o, i in targets]):
        total += _bnb8_state(n) if eight else _adam_state(n, tb)
    assert target_elems >= 0
    return total


def _without(values: list[int], remove: list[int]) -> list[int]:
    left = list(values)
    for v in remove:
        left.remove(v)
    return left


def adalomo_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """AdaLomo: a factored fp32 second moment, a row and a column vector per matrix, a vector per vector
    (Lv et al. 2023; lomo_optim/adalomo.py)."""
    # every parameter gets one, trainable or not (it loops over model.named_parameters())
    tensors = trainable_tensors(model, plan.with_(method="full", quantization="none", double_quant=False), pb)
    if plan.peft:
        tensors += trainable_tensors(model, plan, pb)
    return sum(_blocks(4 * s[0]) + (_blocks(4 * s[1]) if len(s) == 2 else 0) for s in tensors)


def implementation_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int | None:
    """States of fused AdamW, torchao low-bit AdamW, GaLore/APOLLO and LOMO/AdaLomo (None: an optimizer
    optimizer_state_bytes already knows)."""
    opt = plan.optimizer
    tb = trainable_dtype_bytes(plan)
    if opt == "adamw_torch_fused":
        return 2 * pb.trainable * tb  # the same two moments as foreach AdamW (torch/optim/adamw.py)
    if opt in ("adamw_torch_8bit", "adamw_torch_4bit"):
        return torchao_state_bytes(model, plan, pb, 8 if opt.endswith("8bit") else 4)
    if opt.startswith(("galore", "apollo")):
        return low_rank_state_bytes(model, plan, pb)
    if opt == "lomo":
        return 0  # plain SGD update inside backward: no state (Lv et al. 2023, LOMO)
    if opt == "adalomo":
        return adalomo_state_bytes(model, plan, pb)
    return None


def implementation_transient_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int | None:
    """The optimizer step's temporaries for fused AdamW, torchao low-bit AdamW, GaLore/APOLLO and LOMO/AdaLomo
    (None: not one of them)."""
    opt = plan.optimizer
    tb = trainable_dtype_bytes(plan)
    if opt in ("adamw_torch_fused", "adamw_torch_8bit", "adamw_torch_4bit", "lomo", "adalomo",
               "galore_adamw_layerwise"):
        # fused AdamW updates in place in one kernel (torch._fused_adamw_); torchao's compiled step writes its
        # states in place; LOMO / AdaLomo / layer-wise GaLore step inside backward (see in_backward_bytes)
        return 0
    if opt.startswith(("galore", "apollo")):
        # the projection update of the largest target, or the plain Adam step of the largest other tensor
        # (embedding / head): exp_avg_sq.sqrt() and exp_avg / denom, full size (galore_torch/adamw.py)
        if opt == "galore_adamw_8bit":
            return low_rank_spike_bytes(model, plan, tb)  # bitsandbytes updates the other tensors in place
        rest = max(_numel(s) for s in trainable_tensors(model, plan, pb) if len(s) == 1 or s[0] == model.vocab_size)
        return max(low_rank_spike_bytes(model, plan, tb), 2 * _blocks(rest * tb))
    return None


def low_rank_spike_bytes(model: ModelSpec, plan: Plan, tb: int) -> int:
    """The projection-update step (every optim_proj_gap steps) of the largest target weight.

    GaLore: an fp32 copy of the gradient and its reduced SVD, U (m x k), S and Vh (k x n), k = min(m, n)
    (torch.linalg.svd full_matrices=False, galore_projector.get_orthogonal_matrix); then the projected-back
    update, a full m x n tensor in the gradient dtype (project_back). APOLLO: the random projection is small;
    the channel-scaled gradient is a full m x n tensor (apollo.py "scaled_grad = p.grad * ...")."""
    out, inp = max(low_rank_targets(model, plan), key=lambda s: s[0] * s[1])
    k = min(out, inp)
    if plan.optimizer.startswith("galore"):
        return (_blocks(4 * out * inp) + _blocks(4 * out * k) + _blocks(4 * k * inp) + _blocks(4 * k)
                + _blocks(tb * out * inp))
    # the scaled gradient, the update and the norm-limited copy, full size in the gradient dtype (traced)
    return 3 * _blocks(tb * out * inp)


def in_backward_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> tuple[int, int]:
    """(gradients, step temporaries) when the largest parameter is updated inside backward, right after the
    loss's backward (the output head's update; every decoder activation is still held).

    LOMO / AdaLomo: the hook copies the gradient to fp32, drops it, and updates an fp32 copy of the parameter
    (lomo_optim/lomo.py fuse_update: grad.to(float32), p.grad = None, p.data.to(float32)). An optimizer per
    parameter (torchtune optimizer_in_bwd, layer-wise GaLore) steps with the accumulated gradient alive."""
    tb = trainable_dtype_bytes(plan)
    biggest = max(_numel(s) for s in trainable_tensors(model, plan, pb))
    if plan.optimizer == "lomo":
        return 0, 2 * _blocks(biggest * 4)
    if plan.optimizer == "adalomo":
        # and the fp32 update built from the factored second moment (adalomo.py fuse_update; traced)
        return 0, 3 * _blocks(biggest * 4)
    grad = _blocks(biggest * tb)
    if plan.optimizer == "galore_adamw_layerwise":
        # the embedding and head are not projected: plain Adam (sqrt of exp_avg_sq and exp_avg / denom)
        return grad, max(low_rank_spike_bytes(model, plan, tb), 2 * grad)
    whole = optimizer_transient_bytes(model, plan, pb)
    return grad, min(whole, grad)  # one parameter's share of the step's temporaries


def apply_update_in_backward(model: ModelSpec, plan: Plan, pb: ParamBreakdown, phases: dict) -> None:
    """No full gradient buffer: during backward only the parameter being updated has a gradient, and its
    update's temporaries; nothing is left for the optimizer phase (torchtune optimizer_in_bwd; LOMO §3)."""
    grads, temp = in_backward_bytes(model, plan, pb)
    for name, ph in phases.items():
        if name == "optimizer":
            ph.update(gradients=0, transient=0)
        elif name.startswith("backward"):
            ph["gradients"] = 0  # a layer's few gradients at most, each freed by its update
    phases["backward-update"] = dict(gradients=grads, activations=phases["backward"]["activations"],
                                     transient=temp)


def activation_levers(model: ModelSpec, plan: Plan, pb: ParamBreakdown, layer_acts: int, final_norm: int,
                      head_input: int) -> dict:
    """Saved activations with k of L layers checkpointed and / or activation offload.

    Checkpointed layers keep only their input (Chen et al. 2016), the others every activation; the layers are
    advisor.plan.checkpointed_layers. With offload and checkpointing, the inputs go to pinned host memory
    (transformers activation_checkpointing_kwargs offload: save_on_cpu around checkpoint) and one comes back per
    recomputed layer; offload without checkpointing moves
    every decoder activation of >= 1 KiB to the host (TRL / torchtune OffloadActivations), one layer's coming
    back in its backward, the last FWD_STASH tensors kept on the device until backward begins."""
    L = model.num_layers
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    x = p * T * model.hidden_size
    chosen = checkpointed_layers(plan, L)
    k = len(chosen)
    int8 = int8_held_bytes(model, plan)
    top = max(chosen) if chosen else -1
    below_top = top + 1 - k if chosen else 0          # non-checkpointed layers under the top checkpointed one
    last_checkpointed = (L - 1) in chosen
    host = 0
    if plan.activation_offload and plan.gradient_checkpointing:
        # each checkpointed layer's input on the host (the rotary tables are keyword arguments bound into the
        # recomputed function, not saved: modeling_layers.GradientCheckpointingLayer); one comes back at a time
        host = k * x
        # LLM.int8 linears keep their inputs on ctx inside the checkpointed layers too (int8_held_inputs)
        held_inputs, back = k * int8, x
        rest = (L - k) * layer_acts
        stash = 0
    elif plan.activation_offload:
        # every saved tensor of >= 1 KiB in the decoder that is not a Parameter: the activations, and the
        # transposed views of the linear weights that matmul saves for the input gradient (views are not
        # Parameters); the head and the loss keep theirs on the device (advisor.runtime.build)
        weight_views = pb.linear * p if not plan.quantized else 0
        # LLM.int8 linears keep their inputs on ctx, which the hooks never see: they stay on the device (and
        # o_proj's, the attention output, also goes to the host as the attention saves it)
        host = L * (layer_acts - sum(int8_held_inputs(model, plan))) + weight_views
        held_inputs, back, rest = 0, 0, L * int8
        # TRL's forward stash, the last FWD_STASH (5) tensors the last layer saved, still on the device until
        # backward begins: the MLP's gate, activation and up outputs (p*T*i each) and the second norm's fp32
        # input and rsqrt (transformers Qwen2MLP / RMSNorm; traced)
        stash = 3 * p * T * model.intermediate_size + 4 * T * model.hidden_size + 4 * T
    else:
        held_inputs, back, rest, stash = k * (x + int8), 0, (L - k) * layer_acts, 0
    loss = held_inputs + rest + final_norm + head_input + stash
    if plan.activation_offload and not plan.gradient_checkpointing:
        recompute_held, layers_held = None, layer_acts + final_norm + head_input
    else:
        recompute_held = (held_inputs if not plan.activation_offload else back + k * int8) + below_top * layer_acts \
            + layer_acts
        layers_held = None if last_checkpointed else loss - stash
    what = (f"checkpointing {k} of {L} layers" if plan.gradient_checkpointing else "no checkpointing") + \
        (", activations offloaded to pinned host memory" if plan.activation_offload else "")
    return {"loss": loss, "recomputed": layer_acts if chosen else 0, "host": int(host), "recompute": recompute_held,
            "layers": layers_held, "end": (x if chosen else 0) + (layer_acts if chosen else layer_acts),
            "stash": stash, "note": what}


def int8_held_inputs(model: ModelSpec, plan: Plan) -> list[int]:
    """The inputs LLM.int8 linears hold as plain attributes of their autograd context (bitsandbytes
    MatMul8bitLt.forward: ``ctx.tensors = (CAt, subA, A)``), not through save_for_backward, so that saved-tensor
    hooks (activation offload, checkpointing) never see them: q/k/v's and gate/up's shared inputs (the norms'
    outputs) and down_proj's. (o_proj's is the attention output, which the attention saves as well.)"""
    if plan.quantization != "int8":
        return []
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    return [p * T * model.hidden_size, p * T * model.hidden_size, p * T * model.intermediate_size]


def int8_held_bytes(model: ModelSpec, plan: Plan) -> int:
    """What one layer's LLM.int8 linears hold on their autograd context whatever hooks or checkpointing do:
    int8_held_inputs, and o_proj's input (the attention output)."""
    if plan.quantization != "int8":
        return 0
    return sum(int8_held_inputs(model, plan)) + DTYPE_BYTES[plan.activation_dtype] * plan.micro_batch * \
        plan.seq_len * model.q_dim


def offloaded_activation_blocks(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Pinned host bytes of an activation offload, one power-of-two block per tensor (advisor.memory.host):
    with checkpointing, each checkpointed layer's input (save_on_cpu around checkpoint); without, every saved
    tensor of the decoder of at least 1 KiB and the transposed weight views (TRL's rule, as
    ``activation_levers`` counts them)."""
    if not plan.activation_offload:
        return 0
    L = model.num_layers
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    if plan.gradient_checkpointing:
        return len(checkpointed_layers(plan, L)) * pinned_block_bytes(p * T * model.hidden_size)
    per_layer = [int(x) for x in layer_saved_tensors(model, plan, pb) if x >= OFFLOAD_MIN_BYTES]
    for held in int8_held_inputs(model, plan):  # never offloaded: held on the int8 linears' ctx
        per_layer.remove(held)
    if not plan.quantized:
        per_layer += [i * o * p for i, o in model.linear_shapes().values()]
    return L * pinned_bytes_of(per_layer)


def apply_activation_levers(phases: dict, lv: dict, grads_held: int, temp: int) -> None:
    """Replace the activation terms of the step's phases by those of activation_levers."""
    phases.pop("backward-recompute", None)
    phases.pop("backward-layers", None)
    for name in ("loss", "backward"):
        phases[name]["activations"] = lv["loss"]
    phases["backward"]["activations"] = lv["loss"] - lv["stash"]
    if lv["recompute"] is not None:
        phases["backward-recompute"] = dict(gradients=grads_held, activations=lv["recompute"], transient=temp)
    if lv["layers"] is not None:
        phases["backward-layers"] = dict(gradients=grads_held, activations=lv["layers"], transient=temp)
    phases["backward-end"]["activations"] = lv["end"]



def paged_spill(device: dict, host: dict, plan: Plan, gpu: GpuSpec | None) -> list[str]:
    """Paged optimizers keep their states in CUDA unified memory (cudaMallocManaged, bitsandbytes
    ``get_paged``): when the GPU is full the driver evicts state pages to host memory instead of failing, and
    pages them back for the optimizer step (bitsandbytes docs "Paged optimizers"; Dettmers et al. 2023, QLoRA
    §3). The ledger moves the states that do not fit the GPU to the host, in place; the time it costs is
    advisor.throughput.paged_spill_seconds. Returns the note to show (none when nothing spills)."""
    from advisor.core.plan import PAGED_OPTIMIZERS

    if plan.optimizer not in PAGED_OPTIMIZERS or gpu is None or not gpu.memory_bytes:
        return []
    over = sum(v for k, v in device.items() if k != "overhead") - gpu.memory_bytes
    spill = min(device.get("optimizer_states", 0), max(0, int(over)))
    if spill <= 0:
        return []
    device["optimizer_states"] -= spill
    host["optimizer_states"] = host.get("optimizer_states", 0) + spill
    return [f"paged optimizer: {spill / 2**30:.2f} GiB of its states spill to host memory when the "
            f"{gpu.name} is full, and page back over PCIe every step"]
