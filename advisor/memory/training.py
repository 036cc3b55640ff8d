"""The analytic ledger of one training step: closed-form bytes per category, in microseconds.

Each formula carries a one-line citation. Notation: T = micro_batch * seq_len tokens, h hidden,
i intermediate, V vocabulary, L layers, p = bytes of the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.memory.ledger import MemoryReport, empty
from advisor.memory.overhead import overhead_of as framework_overhead_of
from advisor.core.plan import DTYPE_BYTES, Plan, lora_target_modules

NF4_BLOCK = 64            # bitsandbytes Params4bit default blocksize (bitsandbytes/nn/modules.py)
DQ_BLOCK = 256            # nested (double) quantization block of the absmax (bitsandbytes functional.quantize_4bit)
OPT8_BLOCK = 256          # blockwise 8-bit optimizer block (bitsandbytes optim/optimizer.py, Dettmers et al. 2022)
OPT8_MIN_SIZE = 4096      # tensors smaller than this keep 32-bit states (bitsandbytes min_8bit_size)
ZERO2_REDUCE_BUCKET = 2e8  # DeepSpeed reduce_bucket_size in our exported config (deepspeed.ai/docs/config-json)
ZERO3_PREFETCH = 5e7       # DeepSpeed stage3_prefetch_bucket_size default (deepspeed.ai/docs/config-json)
CE_CHUNK_TOKENS = 256      # tokens per chunk of the chunked cross-entropy option


@dataclass(frozen=True)
class ParamBreakdown:
    """The model's parameters split the way memory treats them."""

    linear: int           # decoder-layer linear weights (what bitsandbytes quantizes)
    other: int            # embeddings, lm_head, norms, biases (kept in the compute dtype)
    adapter: int          # LoRA A and B
    lora_modules: tuple[str, ...]
    trainable: int


def param_breakdown(model: ModelSpec, plan: Plan) -> ParamBreakdown:
    shapes = model.linear_shapes()
    linear = model.num_layers * model.layer_linear_params()
    targets = lora_target_modules(plan, list(shapes))
    # LoRA adds A (r x in) and B (out x r) to each targeted module (Hu et al. 2021, eq. 3)
    adapter = model.num_layers * sum(plan.lora_r * (shapes[m][0] + shapes[m][1]) for m in targets)
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
        return int(pb.linear * 0.5 + pb.other * other_b), int(consts)
    if plan.quantization == "int8":
        # LLM.int8: int8 weight + one fp32 scale per output row (Dettmers et al. 2022, bitsandbytes Int8Params.SCB)
        rows = model.num_layers * sum(o for _, o in model.linear_shapes().values())
        return int(pb.linear * 1 + pb.other * other_b), int(rows * 4)
    return int(model.params_total * other_b), 0


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
            plan.lora_r * d for m in pb.lora_modules for d in shapes[m] if plan.lora_r * d < OPT8_MIN_SIZE)
    norms_biases = model.num_layers * (model.layer_norm_params() + sum(model.layer_bias_params().values()))
    return norms_biases + model.hidden_size


def _adafactor_elems(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    shapes = model.linear_shapes()
    if plan.peft:
        return model.num_layers * sum(plan.lora_r + shapes[m][0] + plan.lora_r + shapes[m][1]
                                      for m in pb.lora_modules)
    per_layer = sum(i + o for i, o in shapes.values()) + model.layer_norm_params() + sum(
        model.layer_bias_params().values())
    emb = model.vocab_size + model.hidden_size
    head = 0 if model.tie_word_embeddings else model.vocab_size + model.hidden_size
    return model.num_layers * per_layer + emb + head + model.hidden_size


def optimizer_transient_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Temporaries of the optimizer step on top of parameters, gradients and states."""
    tb = trainable_dtype_bytes(plan)
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

    saved = 0
    # RMSNorm: fp32 copy of the input and rsqrt saved by pow/mul (transformers LlamaRMSNorm.forward);
    # the normalized input too when the norm weight trains
    norm = 4 * T * h + 4 * T + (p * T * h if plan.method == "full" else 0)
    saved += arch.get("norms_per_layer", 2) * norm
    attn_in = [m for m in shapes if m in ("q_proj", "k_proj", "v_proj", "qkv_proj")]
    mlp_in = [m for m in shapes if m in ("gate_proj", "up_proj", "gate_up_proj")]
    if any(input_saved(m) for m in attn_in):
        saved += p * T * h
    if arch.get("qk_norm"):
        saved += 4 * T * (qd + kvd) + 4 * T * (model.num_heads + model.num_kv_heads)
    # attention: q and k after RoPE, v, output, and the fp32 logsumexp (FlashAttention-2, Dao 2023 §3.1)
    saved += p * T * (2 * qd + 2 * kvd) + 4 * b * model.num_heads * s
    if plan.attn_impl == "eager":
        # eager keeps fp32 softmax and its bf16 copy, b x heads x s x s (transformers eager_attention_forward)
        # and repeat_kv's expanded k and v
        saved += (4 + p) * b * model.num_heads * s * s + p * T * 2 * (qd - kvd)
    # o_proj's input is the attention output itself (flash/sdpa return it so that transpose(1, 2) is
    # contiguous: no copy), already counted above
    if any(input_saved(m) for m in mlp_in):
        saved += p * T * h
    # gated MLP: gate output (activation input), activation output and up output (the product's inputs)
    saved += 3 * p * T * i
    if input_saved("down_proj"):
        saved += p * T * i
    for m in pb.lora_modules:
        fan_in = shapes[m][0]
        # peft casts the input to the fp32 adapter dtype; lora_A saves it, lora_B saves A's output
        # (peft/tuners/lora/layer.py Linear.forward)
        saved += 4 * T * fan_in + 4 * T * plan.lora_r
        if plan.lora_dropout > 0:
            saved += T * fan_in  # dropout mask, 1 byte per element
    return int(saved)


def logits_bytes(model: ModelSpec, plan: Plan) -> tuple[int, int]:
    """(forward, backward) transient of the logits and the loss."""
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


def estimate_training(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None) -> MemoryReport:
    """The analytic ledger of one measured step (after warm-up: optimizer states exist)."""
    plan.validate()
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
        # (Ren et al. 2021, ZeRO-Offload §4; deepspeed.ai/tutorials/zero-offload)
        host["optimizer_states"] = pb.trainable * 8
        host["master_weights"] = pb.trainable * 4
        host["gradients"] = pb.trainable * 4
        # the GPU keeps gradient buckets until they are copied out (reduce_bucket_size)
        grads = int(min(pb.trainable, ZERO2_REDUCE_BUCKET) * tb)
        if plan.offload == "zero3_cpu":
            # ZeRO-3 offload_param: parameters live on the host; the GPU gathers a layer at a time plus
            # the prefetch bucket (stage3_prefetch_bucket_size) (Rajbhandari et al. 2021, ZeRO-Infinity)
            host["weights"] = weights
            live = max(model.layer_params(), model.embedding_params) * 2 + ZERO3_PREFETCH
            weights = int(min(model.params_total, live) * DTYPE_BYTES[plan.param_dtype])
        notes.append("offload: optimizer states, fp32 masters and gradients in host memory")

    layer_acts = layer_activation_bytes(model, plan, pb)
    L = model.num_layers
    T = plan.micro_batch * plan.seq_len
    h = model.hidden_size
    # final norm: fp32 input and rsqrt; its bf16 normalized input too when the norm weight trains
    final_norm = 4 * T * h + 4 * T + (p * T * h if plan.method == "full" else 0)
    head_input = p * T * h if plan.method == "full" else 0
    if plan.gradient_checkpointing:
        # HF checkpointing keeps each layer's input; one layer is recomputed at a time in backward,
        # after the loss's backward (Chen et al. 2016; transformers GradientCheckpointingLayer)
        acts = L * p * T * h + final_norm + head_input
        recomputed = layer_acts
        if plan.quantization == "int8":
            # MatMul8bitLt keeps its input on ctx.tensors, not save_for_backward, so checkpointing cannot drop
            # it: every layer keeps its linears' inputs (bitsandbytes/autograd/_functions.py MatMul8bitLt.forward)
            acts += L * p * T * (2 * h + model.q_dim + model.intermediate_size)
    else:
        acts = L * layer_acts + final_norm + head_input
        recomputed = 0
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
    emb_bwd_temp = model.embedding_params * DTYPE_BYTES[plan.param_dtype] if plan.method == "full" else 0

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
        phases["backward-recompute"] = dict(gradients=grads_held, activations=L * p * T * h + recomputed,
                                            transient=layer_bwd_temp + autocast_cache)
    else:
        # the last layer's backward, every layer's activations still held (the logits are gone by then)
        phases["backward-layers"] = dict(gradients=grads_held, activations=acts,
                                         transient=layer_bwd_temp + autocast_cache)
    peak_phase, at_peak = max(phases.items(), key=lambda kv: sum(kv[1].values()))

    device = empty()
    device.update(weights=weights, quant_constants=consts, adapter_weights=adapters,
                  optimizer_states=states, master_weights=masters, **at_peak)
    tensor_peak = sum(device.values())
    over = framework_overhead_of(tensor_peak, gpu, expandable_segments=getattr(plan, "expandable_segments", False))
    device["overhead"] = over.total
    notes += over.notes()
    return MemoryReport(
        source="estimated", backend="estimate", device=device, host=host,
        tensor_peak_bytes=int(tensor_peak), peak_bytes=int(tensor_peak + over.total), peak_phase=peak_phase,
        notes=tuple(notes), reserved_peak_bytes=int(tensor_peak + over.parts["fragmentation"]),
        extra={"params_trainable": pb.trainable, "lora_modules": list(pb.lora_modules), "overhead_parts": over.parts,
               "overhead_source": over.source, "fragmentation_source": over.fragmentation_source,
               "activations_per_layer_bytes": layer_acts, "saved_activations_bytes": int(acts)},
    )
