"""The analytic ledger of one training step: closed-form bytes per category.

One path for dense models and mixtures of experts: the weights, gradients and optimizer states come from the
model's parameter tensors (advisor.memory.tensors; OPTIMIZER_STATES is the one table of optimizer states), the
activations from each decoder layer's terms (``layer_terms``: a dense layer here, routed experts, latent attention
and attention sinks in advisor.memory.experts), and the phases of the step (the loss, backward, a recomputed or
last layer, the end of backward, the optimizer step) and every lever (loss, offload, activation offload, partial
checkpointing, DoRA, packing, the step inside backward, LLM.int8) are built once from those.

Each formula carries a one-line citation. Notation: T = micro_batch * seq_len tokens, h hidden,
i intermediate, V vocabulary, L layers, p = bytes of the activation dtype.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from advisor.core.architecture import LayerDescription
from advisor.core.catalog import GpuSpec, ModelSpec
from advisor.core.errors import AdvisorInputError
from advisor.memory.ledger import MemoryReport, empty
from advisor.memory.overhead import overhead_of as framework_overhead_of
from advisor.core.plan import DTYPE_BYTES, Plan, checkpointed_layers
from advisor.core.adapters import adapted_modules
from advisor.memory import experts, loss_dora_packing, sequence_parallel, tensors, tiled_mlp, vision
from advisor.memory.experts import (FP32_NORM_WEIGHT, SHARED_INPUT, linear_input_of, normalized_bytes,  # noqa: F401
                                     sliding_mask_bytes, sliding_window_applies)
from advisor.memory.host import OFFLOAD_MIN_BYTES, host_memory, pinned_block_bytes, pinned_bytes_of
from advisor.memory.tensors import DQ_BLOCK, NF4_BLOCK, four_bit_constant_bytes  # noqa: F401 (re-exported)

OPT8_BLOCK = 256          # blockwise 8-bit optimizer block (bitsandbytes optim/optimizer.py, Dettmers et al. 2022)
OPT8_MIN_SIZE = 4096      # tensors smaller than this keep 32-bit states (bitsandbytes min_8bit_size)
ZERO2_REDUCE_BUCKET = 2e8  # DeepSpeed reduce_bucket_size in our exported config (deepspeed.ai/docs/config-json)
ZERO3_PREFETCH = 5e7       # DeepSpeed stage3_prefetch_bucket_size default (deepspeed.ai/docs/config-json)
CE_CHUNK_TOKENS = 256      # tokens per chunk of the chunked cross-entropy option (runtime.build runs it with this)


@dataclass(frozen=True)
class ParamBreakdown:
    """The model's parameters split the way memory treats them."""

    linear: int           # decoder-layer nn.Linear weights (what bitsandbytes quantizes)
    other: int            # embeddings, lm_head, norms, biases, stacked experts, routers (kept in the compute dtype)
    adapter: int          # LoRA A and B (and DoRA's magnitudes, LoRA on the expert stacks)
    lora_modules: tuple[str, ...]
    trainable: int        # what gets a gradient and an optimizer state (the adapters, or every parameter, less idle)
    idle: frozenset[int] = frozenset()  # decoder layers whose trainable tensors are never stepped (stepped_skip)


def param_breakdown(model: ModelSpec, plan: Plan) -> ParamBreakdown:
    """The linears bitsandbytes converts (every layer's ``quantized_by_bnb`` linears; stacked experts, routers,
    norms, embeddings and biases stay in the compute dtype: transformers/integrations/bitsandbytes.py:189 converts
    ``type(module) is nn.Linear`` only); the adapters (advisor.memory.tensors.adapter_shapes)."""
    modules = adapted_modules(model, plan) if plan.peft else []
    linear = experts.quantized_linear_params(model)
    adapter = sum(tensors.trainable_sizes(model, plan, modules)) if plan.peft else 0
    idle = stepped_skip(model, plan)
    if plan.peft:
        trainable = sum(tensors.trainable_sizes(model, plan, modules, idle)) if idle else adapter
    else:
        trainable = model.params_total - sum(layer.params for layer in model.description.layers if layer.index in idle)
    return ParamBreakdown(linear, model.params_total - linear, adapter, tuple(modules), trainable, idle)


def stepped_skip(model: ModelSpec, plan: Plan) -> frozenset[int]:
    """The decoder layers whose trainable tensors get no gradient and no optimizer state (tensors.idle_layers),
    where the optimizer is torch's or bitsandbytes' on the GPU; DeepSpeed flattens every parameter that requires
    grad into its partitions, stepped or not (deepspeed/runtime/zero/stage_1_and_2.py ``bit16_groups``)."""
    return tensors.idle_layers(model, plan) if plan.offload == "none" else frozenset()


def weight_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> tuple[int, int]:
    """(weights, quantization constants) of the base model."""
    other_b = DTYPE_BYTES[plan.param_dtype]
    # a router the class keeps in fp32 whatever the dtype (DeepSeek's gate.weight, _keep_in_fp32_modules_strict)
    router = experts.fp32_router_params(model) * (4 - other_b)
    if plan.four_bit:
        # NF4/FP4: two 4-bit values per byte (Dettmers et al. 2023, QLoRA §3)
        return int(pb.linear * 0.5 + pb.other * other_b + router), four_bit_constant_bytes(pb.linear, plan)
    if plan.quantization == "int8":
        # LLM.int8: int8 weight + one fp32 scale per output row (Dettmers et al. 2022, bitsandbytes Int8Params.SCB)
        rows = sum(m.out_features for layer in model.description.layers for m in layer.linears if m.quantized_by_bnb)
        return int(pb.linear * 1 + pb.other * other_b + router), int(rows * 4)
    return int(model.params_total * other_b + router), 0


def fsdp_offload_gpu_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> tuple[int, int]:
    """(weights, gradients) on one GPU under FSDP2 CPU offload (torch fully_shard with CPUOffloadPolicy, as accelerate
    utils/fsdp_utils.py ``fsdp2_prepare_model`` wraps a transformers model): every parameter's shard lives on the host
    and each unit is all-gathered to the GPU for its forward and backward. Units: each decoder layer, the input
    embedding, and the tail (final norm + output head) with ``reshard_after_forward=False``, so the tail stays gathered
    from the end of forward through the start of backward, while the layer running and the next one prefetched are
    gathered beside it. Gathered bytes are the stored ones: 4-bit weights in their float ``bnb_4bit_quant_storage``
    (n/2 bytes), the rest in the parameter dtype, trainable ones (LoRA's, or a full fine-tune's after accelerate's
    upcast) in fp32. The quantization constants are not parameters: bitsandbytes' QuantState moves to the GPU with
    its weight when fully_shard moves the unit there (Params4bit.to) and stays whole (counted as the ledger's
    quant_constants). Gradients: one unit's, unsharded, before the reduce-scatter sends its shard to the host."""
    d = model.description
    weights, _ = weight_bytes(model, plan, pb)
    per_weight = weights / model.params_total if model.params_total else 0  # stored bytes per base parameter
    p = DTYPE_BYTES[plan.param_dtype]  # MixedPrecisionPolicy(param_dtype): what an all-gather of a 16-bit run moves
    adapter_per_layer = pb.adapter / model.num_layers if plan.peft else 0
    layer_params = max(layer.params for layer in d.layers)
    full = plan.method == "full"
    layer = layer_params * (p if full else per_weight) + adapter_per_layer * 4
    tail = ((d.lm_head_params or d.embedding_params) + d.final_norm_params) * p
    gathered = int(max(tail, d.embedding_params * p) + 2 * layer)
    # the unsharded gradients of the unit in backward (the tail's first, then each layer's), fp32: LoRA's adapters
    # are fp32 (peft autocast_adapter_dtype), a full fine-tune's parameters upcast by accelerate
    unit_trainable = max(d.lm_head_params or d.embedding_params, layer_params) if full else adapter_per_layer
    return gathered, int(unit_trainable * 4)


def trainable_dtype_bytes(plan: Plan) -> int:
    """Bytes per trainable parameter (and its gradient)."""
    # peft upcasts fp16/bf16 adapters to fp32 (peft get_peft_model autocast_adapter_dtype=True)
    return 4 if plan.peft else DTYPE_BYTES[plan.param_dtype]


def fp32_router_extra(model: ModelSpec, plan: Plan) -> int:
    """Bytes an fp32 router's tensor adds over the trainable dtype, per tensor of its size (its gradient and each
    Adam moment follow the parameter's dtype: zeros_like(param))."""
    return 0 if plan.peft else experts.fp32_router_params(model) * (4 - trainable_dtype_bytes(plan))


# --------------------------------------------------------------------------- optimizer states (one table)


def _adam_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    # exp_avg and exp_avg_sq, zeros_like(param) (torch/optim/adamw.py _init_group); an fp32 router's in fp32
    return 2 * pb.trainable * trainable_dtype_bytes(plan) + 2 * fp32_router_extra(model, plan)


def _bnb32_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    # bitsandbytes 32-bit states are fp32 whatever the param dtype (bnb Optimizer2State.init_state)
    return 2 * pb.trainable * 4


def _bnb8_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    # 8-bit blockwise: 1 B per value per state + fp32 absmax per 256 values; tensors under min_8bit_size keep fp32
    # states (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"); Trainer.create_optimizer keeps
    # nn.Embedding weights in 32-bit states (GlobalOptimManager override)
    sizes = [tensors.numel(s) for s in trainable_tensors(model, plan, pb)]
    small = sum(n for n in sizes if n < OPT8_MIN_SIZE) + (0 if plan.peft else model.embedding_params)
    return int(2 * (pb.trainable - small) * (1 + 4 / OPT8_BLOCK) + 2 * small * 4)


def _adafactor_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    # factored second moment, no first moment: a row and a column vector per matrix (the last two dimensions, the
    # leading ones kept: exp_avg_sq_row shape[:-1], exp_avg_sq_col shape[:-2] + shape[-1:]), a full one per vector
    # (Shazeer & Stern 2018; transformers.optimization.Adafactor with beta1=None, _get_options)
    elems = sum(tensors.numel(s[:-1]) + tensors.numel(s[:-2]) * s[-1] if len(s) >= 2 else s[0]
                for s in trainable_tensors(model, plan, pb))
    return int(elems * trainable_dtype_bytes(plan))


def _no_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    # plain SGD without momentum (torch.optim.SGD momentum=0); LOMO's update inside backward (Lv et al. 2023)
    return 0


def _torchao8_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    return torchao_state_bytes(model, plan, pb, 8)


def _torchao4_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    return torchao_state_bytes(model, plan, pb, 4)


def _low_rank_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    return low_rank_state_bytes(model, plan, pb)


def _adalomo_states(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    return adalomo_state_bytes(model, plan, pb)


OPTIMIZER_STATES = {
    "adamw_torch": _adam_states, "adamw_torch_fused": _adam_states,  # the same two moments (torch adamw.py)
    "paged_adamw_32bit": _bnb32_states,
    "adamw_8bit": _bnb8_states, "paged_adamw_8bit": _bnb8_states,
    "adafactor": _adafactor_states,
    "sgd": _no_states, "lomo": _no_states,
    "adamw_torch_8bit": _torchao8_states, "adamw_torch_4bit": _torchao4_states,
    "galore_adamw": _low_rank_states, "galore_adamw_8bit": _low_rank_states,
    "galore_adamw_layerwise": _low_rank_states, "apollo_adamw": _low_rank_states,
    "adalomo": _adalomo_states,
}
"""Each optimizer (TrainingArguments.optim) -> the bytes of its persistent states after the first step, on the GPU:
the one table memory reads. An optimizer missing here has no memory term, and the ledger refuses it."""


def optimizer_states_of(optimizer: str):
    """The state function of ``optimizer`` (OPTIMIZER_STATES), or a one-line error naming it."""
    try:
        return OPTIMIZER_STATES[optimizer]
    except KeyError:
        raise AdvisorInputError("--optimizer", "the memory ledger has no optimizer-state term for it "
                                f"(advisor.memory.training.OPTIMIZER_STATES has {', '.join(OPTIMIZER_STATES)})",
                                optimizer) from None


def optimizer_state_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Persistent optimizer state after the first step."""
    states = optimizer_states_of(plan.optimizer)
    if plan.offload != "none":
        return 0  # on the host: see host_bytes
    return states(model, plan, pb)


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
    return max(tensors.numel(s) for s in trainable_tensors(model, plan, pb))


# --------------------------------------------------------------------------- saved activations, layer by layer


def linear_inputs(layer: LayerDescription) -> list[tuple[str, int]]:
    """The distinct inputs of a layer's nn.Linears, (what reads it, its width): linears fed the same tensor share
    one (q/k/v and MLA's q_proj / kv_a_proj read the normed hidden state, gate and up the MLP's input)."""
    seen: dict[str, int] = {}
    for m in layer.linears:
        seen.setdefault(linear_input_of(m), m.in_features)
    return list(seen.items())


def int8_held_inputs(model: ModelSpec, plan: Plan, layer: LayerDescription | None = None) -> list[int]:
    """The inputs LLM.int8 linears hold as plain attributes of their autograd context (bitsandbytes
    MatMul8bitLt.forward: ``ctx.tensors = (CAt, subA, A)``), not through save_for_backward, so that saved-tensor
    hooks (activation offload, checkpointing) never see them: each distinct input of a quantized linear but
    o_proj's (the attention output, which the attention saves as well)."""
    return [x for name, x in _int8_inputs(model, plan, layer) if not name.endswith(".o_proj")]


def int8_held_bytes(model: ModelSpec, plan: Plan, layer: LayerDescription | None = None) -> int:
    """What one layer's LLM.int8 linears hold on their autograd context whatever hooks or checkpointing do:
    int8_held_inputs, and o_proj's input (the attention output)."""
    return sum(x for _, x in _int8_inputs(model, plan, layer))


def _int8_inputs(model: ModelSpec, plan: Plan, layer: LayerDescription | None) -> list[tuple[str, int]]:
    if plan.quantization != "int8":
        return []
    layer = layer or model.description.layers[0]
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    quantized = {m.name.rsplit(".", 1)[0] for m in layer.linears if m.quantized_by_bnb}
    return [(name, p * T * width) for name, width in linear_inputs(layer) if name.rsplit(".", 1)[0] in quantized]


def layer_saved_tensors(model: ModelSpec, plan: Plan, pb: ParamBreakdown,
                        layer: LayerDescription | None = None) -> list[int]:
    """The bytes of each tensor one decoder layer saves for backward (no checkpointing), one entry per tensor
    (an activation offload pins each in a block of its own: advisor.memory.host). A layer with routed experts,
    latent attention or attention sinks: advisor.memory.experts.layer_saved_tensors, with LLM.int8's inputs."""
    layer = layer or model.description.layers[0]
    if layer.num_experts or layer.attention == "mla" or model.is_moe:
        out = experts.layer_saved_tensors(model, plan, layer, list(pb.lora_modules))
        # DoRA's and packing's per-layer terms, on the attention linears and the sdpa call both kinds share
        out += [x for x in (loss_dora_packing.dora_layer_activation_bytes(model, plan, pb.lora_modules),
                            0 if layer.attention == "mla" else loss_dora_packing.packed_layer_bytes(model, plan)) if x]
        if plan.method == "full":
            return out
        # LLM.int8 linears keep their inputs (MatMul8bitLt ctx.tensors) where a frozen nn.Linear saves nothing;
        # latent attention's o_proj reads a contiguous copy of the attention output, not the output itself
        return out + ([x for _, x in _int8_inputs(model, plan, layer)] if layer.attention == "mla"
                      else int8_held_inputs(model, plan, layer))
    return dense_layer_saved_tensors(model, plan, pb, layer)


def dense_layer_saved_tensors(model: ModelSpec, plan: Plan, pb: ParamBreakdown, layer: LayerDescription) -> list[int]:
    """What a dense decoder layer (q/k/v/o attention, a gated MLP of nn.Linears, norms) saves for backward."""
    b, s = plan.micro_batch, plan.seq_len
    T = b * s
    p = DTYPE_BYTES[plan.activation_dtype]
    h = model.hidden_size
    qd, kvd = model.q_dim, model.kv_dim
    shapes = model.linear_shapes()
    arch = model.arch or {}

    def input_saved(module: str) -> bool:
        # a frozen base linear saves its input only when its weight trains (full: aten linear backward) or
        # for LLM.int8 (MatMul8bitLt keeps A); MatMul4Bit keeps only the packed weight and a frozen
        # nn.Linear nothing (bitsandbytes/autograd/_functions.py); LoRA's own inputs are counted below
        return plan.method == "full" or plan.quantization == "int8"

    saved: list[int] = []
    full = plan.method == "full"
    nb = normalized_bytes(model, plan)
    # RMSNorm: fp32 copy of the input and rsqrt saved by pow/mul (transformers LlamaRMSNorm.forward);
    # the normalized input too when the norm weight trains
    for _ in range(arch.get("norms_per_layer", 2)):
        saved += [4 * T * h, 4 * T] + ([nb * T * h] if full else [])
    attn_in = [m for m in shapes if m in ("q_proj", "k_proj", "v_proj", "qkv_proj")]
    mlp_in = [m for m in shapes if m in ("gate_proj", "up_proj", "gate_up_proj")]
    if any(input_saved(m) for m in attn_in):
        saved.append(p * T * h)
    if arch.get("qk_norm"):
        saved += [4 * T * qd, 4 * T * kvd, 4 * T * model.num_heads, 4 * T * model.num_kv_heads]
        if full:
            saved += [nb * T * qd, nb * T * kvd]  # the per-head norms' normalized q and k, their weights train
    # attention: q and k after RoPE, v, output, and the fp32 logsumexp (FlashAttention-2, Dao 2023 §3.1)
    saved += [p * T * qd, p * T * kvd, p * T * kvd, p * T * qd, 4 * b * model.num_heads * s]
    saved.append(sliding_mask_bytes(model, plan, layer))
    if experts.effective_attention(model, plan) == "eager":
        # eager keeps fp32 softmax and its bf16 copy, b x heads x s x s (transformers eager_attention_forward)
        # and repeat_kv's expanded k and v
        saved += [4 * b * model.num_heads * s * s, p * b * model.num_heads * s * s, p * T * (qd - kvd),
                  p * T * (qd - kvd)]
        if (model.config or {}).get("attn_logit_softcapping"):
            # soft-capped scores: tanh saves its output, b x heads x s x s (Gemma2 eager_attention_forward)
            saved.append(p * b * model.num_heads * s * s)
    # o_proj's input is the attention output itself (flash/sdpa return it so that transpose(1, 2) is
    # contiguous: no copy), already counted above
    mlp = tiled_mlp.mlp_saved_tensors(model, plan, pb, any(input_saved(m) for m in mlp_in), input_saved("down_proj"))
    if tiled_mlp.tiles(model, plan):
        # TiledMLP saves only the MLP's input; its shards' tensors exist one shard at a time, in its backward
        saved.append(tiled_mlp.saved_input_bytes(model, plan))
    else:
        saved += mlp
    for m in pb.lora_modules:
        if tiled_mlp.tiles(model, plan) and m in tiled_mlp.MLP_LINEARS:
            continue  # counted in the MLP's saved tensors above
        fan_in = shapes[m][0]
        # peft casts the input to the fp32 adapter dtype; lora_A saves it, lora_B saves A's output
        # (peft/tuners/lora/layer.py Linear.forward)
        saved += tiled_mlp.lora_saved(plan, T, fan_in)
    saved.append(loss_dora_packing.dora_layer_activation_bytes(model, plan, pb.lora_modules))
    saved.append(loss_dora_packing.packed_layer_bytes(model, plan))
    return [x for x in saved if x]


def layer_backward_transient(model: ModelSpec, plan: Plan, pb: ParamBreakdown, layer: LayerDescription) -> int:
    """The most one layer's backward holds beyond what it saved: for a dense layer three intermediate-sized
    gradients, in the backward of the gated product (aten mul backward makes the gate's and the up projection's
    while down_proj's input gradient is still held: traced, Qwen2.5-0.5B at 2K and 6.8K tokens); routed experts:
    advisor.memory.experts."""
    if layer.num_experts or layer.attention == "mla" or model.is_moe:
        return experts.layer_backward_transient(model, plan, layer, list(pb.lora_modules))
    if tiled_mlp.tiles(model, plan):
        return tiled_mlp.backward_transient(model, plan, pb)
    return 3 * DTYPE_BYTES[plan.activation_dtype] * plan.micro_batch * plan.seq_len * model.intermediate_size


@dataclass(frozen=True)
class LayerTerms:
    """What the decoder layers hold, layer by layer: the ledger's phases are built from these alone."""

    saved: tuple[int, ...]
    """Bytes each layer saves for backward without checkpointing, by layer index."""
    tensors: tuple[tuple[int, ...], ...]
    """The tensors each layer saves, by layer index (an activation offload pins each in a block of its own)."""
    int8_held: tuple[int, ...]
    """What each layer's LLM.int8 linears hold on their autograd context, by layer index (int8_held_bytes)."""
    int8_inputs: tuple[tuple[int, ...], ...]
    """Of those, the inputs hooks never see (int8_held_inputs), by layer index."""
    backward_temp: int
    """The most one layer's backward holds beyond its saved tensors (the largest kind's)."""
    stash: int
    """TRL's forward stash under activation offload: the last FWD_STASH (5) tensors of >= 1 KiB the last layer
    saved, still on the device until backward begins (advisor.runtime.build.offload_hooks)."""

    @property
    def biggest(self) -> int:
        return max(self.saved)


FWD_STASH = 5  # TRL OffloadActivations max_fwd_stash_size (trl/models/activation_offloading.py)


def layer_terms(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> LayerTerms:
    """Every decoder layer's terms, computed once per kind of layer (LayerDescription.kind_key); a layer the step
    never calls (tensors.idle_layers) holds nothing."""
    d = model.description
    saved = [0] * d.num_layers
    lists: list[tuple[int, ...]] = [()] * d.num_layers
    held = [0] * d.num_layers
    inputs: list[tuple[int, ...]] = [()] * d.num_layers
    temp = 0
    for layer, indices in tensors.run_layer_kinds(model, plan):
        kind = tuple(layer_saved_tensors(model, plan, pb, layer))
        h8 = int8_held_bytes(model, plan, layer)
        i8 = tuple(int8_held_inputs(model, plan, layer))
        for ix in indices:
            saved[ix], lists[ix], held[ix], inputs[ix] = sum(kind), kind, h8, i8
        temp = max(temp, layer_backward_transient(model, plan, pb, layer))
    return LayerTerms(tuple(saved), tuple(lists), tuple(held), tuple(inputs), temp,
                      offload_stash(model, plan, d.layers[-1]))


def sequence_parallel_layer_terms(lt: LayerTerms, model: ModelSpec, plan: Plan) -> LayerTerms:
    """A sequence-parallel rank's layer terms: the shard's, and each attention layer's replicated k/v heads when the
    ranks outnumber them (advisor.memory.sequence_parallel.kv_replication_bytes)."""
    extra = sequence_parallel.kv_replication_bytes(model, plan)
    if not extra:
        return lt
    attends = [layer.attention != "linear" for layer in model.description.layers]
    saved = tuple(x + extra if x and a else x for x, a in zip(lt.saved, attends))
    tensors = tuple(t + (extra,) if t and a else t for t, a in zip(lt.tensors, attends))
    return replace(lt, saved=saved, tensors=tensors)


def offload_stash(model: ModelSpec, plan: Plan, last: LayerDescription) -> int:
    """TRL's forward stash: the last FWD_STASH tensors the last layer saved. A dense layer: its MLP's gate,
    activation and up outputs (p*T*i each) and the second norm's fp32 input and rsqrt (transformers Qwen2MLP /
    RMSNorm; traced). Routed experts: the last of what grouped_mm_experts_forward saves (experts.routed_saved)."""
    if not plan.activation_offload or plan.gradient_checkpointing:
        return 0
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    if last.num_experts:
        routed = [x for x in experts.routed_saved(model, plan, last) if x >= OFFLOAD_MIN_BYTES]
        return sum(routed[-FWD_STASH:])
    return 3 * p * T * model.intermediate_size + 4 * T * model.hidden_size + 4 * T


def logits_bytes(model: ModelSpec, plan: Plan) -> tuple[int, int]:
    """(forward, backward) transient of the logits and the loss (GRPO / DPO: TRL's fused log-prob head,
    advisor.memory.rl)."""
    if plan.task != "sft":
        from advisor.memory.rl_head import head_bytes

        return head_bytes(model, plan)
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
    if (model.arch or {}).get("logit_softcap"):
        bwd += p * TV  # the tanh output, saved for the soft-capping's backward, still held (Gemma2ForCausalLM.forward)
    return int(fwd), int(bwd)


def _packing_dora_activation_bytes(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> int:
    """Held through forward and backward: the packed-documents mask, less DoRA's first layer."""
    return (loss_dora_packing.packed_mask_bytes(model, plan)
            - loss_dora_packing.dora_first_layer_saving(model, plan, pb.lora_modules))


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
    """The analytic ledger of one measured step (after warm-up: optimizer states exist), dense or a mixture of
    experts: the layers' terms (layer_terms: advisor.memory.experts for routed experts and latent attention), the
    same phases for both. A GRPO or DPO plan's step is advisor.memory.rl's (``step_ledger``: this ledger with TRL's
    head and what the task keeps resident). A vision-language model's tower (advisor.memory.vision) is laid over the
    same phases, and its language model's sequence holds the image tokens beside ``--seq-len`` text tokens."""
    if plan.task != "sft":
        raise ValueError(f"estimate_training counts a supervised step; a {plan.task} plan's is "
                         "advisor.memory.rl.step_ledger's")
    return estimate_step(model, plan, gpu)


def estimate_step(model: ModelSpec, plan: Plan, gpu: GpuSpec | None = None, *,
                  head: tuple[int, int] | None = None, reference_forward: int = 0) -> MemoryReport:
    """``estimate_training``'s ledger of a supervised step. ``head``: the (forward, backward) transient of the
    output head and loss instead of ``logits_bytes``' (TRL's fused log-prob head of a GRPO/DPO step);
    ``reference_forward``: a no-grad forward of a reference model run after the forward and before backward, every
    saved activation alive (DPOTrainer._compute_loss), its peak transient."""
    plan.validate()
    sharded, plan = plan, sequence_parallel.rank_plan(plan)  # one rank's shard of a sequence-parallel step
    vis = None
    if vision.applies(model, plan):
        from advisor.core.vision_tokens import count_sample

        vis = count_sample(model, plan)
        asked = plan
        if vis is not None and vis.text_tokens:
            plan = plan.with_(seq_len=plan.seq_len + vis.text_tokens)
    pb = param_breakdown(model, plan)
    weights, consts = weight_bytes(model, plan, pb)
    tb = trainable_dtype_bytes(plan)
    # LoRA's weights: on the GPU, except under FSDP's CPU offload (sharded on the host, gathered with their unit:
    # fsdp_offload_gpu_bytes counts them in the gathered weights)
    adapters = pb.adapter * 4 if plan.peft and plan.offload != "fsdp_cpu" else 0
    # an fp32 router's gradient stays fp32 in a full fine-tune (its parameter's dtype)
    grads = pb.trainable * tb + fp32_router_extra(model, plan)
    states = optimizer_state_bytes(model, plan, pb)
    host = empty()
    masters = 0
    notes: list[str] = moe_notes(model, plan) + sequence_parallel.sequence_parallel_notes(model, sharded)
    p = DTYPE_BYTES[plan.activation_dtype]
    full = plan.method == "full"

    if plan.offload != "none":
        # ZeRO-Offload keeps fp32 master weights, fp32 Adam moments and fp32 gradients on the host
        # (Ren et al. 2021, ZeRO-Offload §4; deepspeed.ai/tutorials/zero-offload): advisor.memory.host counts
        # them buffer by buffer, pinned or pageable
        # the GPU keeps gradient buckets until they are copied out (reduce_bucket_size)
        grads = int(min(pb.trainable, ZERO2_REDUCE_BUCKET) * tb)
        if plan.offload == "zero3_cpu":
            # ZeRO-3 offload_param: parameters live on the host; the GPU gathers a layer at a time plus
            # the prefetch bucket (stage3_prefetch_bucket_size) (Rajbhandari et al. 2021, ZeRO-Infinity)
            live = max(max(layer.params for layer in model.description.layers), model.embedding_params) * 2 \
                + ZERO3_PREFETCH
            weights = int(min(model.params_total, live) * DTYPE_BYTES[plan.param_dtype])
        if plan.offload == "fsdp_cpu":
            weights, grads = fsdp_offload_gpu_bytes(model, plan, pb)

    lt = sequence_parallel_layer_terms(layer_terms(model, plan, pb), model, sharded)
    layer_acts = lt.biggest
    L = model.num_layers
    T = plan.micro_batch * plan.seq_len
    h = model.hidden_size
    x = p * T * h  # one layer's input, what a checkpointed layer keeps (Chen et al. 2016)
    # final norm: fp32 input and rsqrt; its normalized input too when the norm weight trains
    final_norm = 4 * T * h + 4 * T + (normalized_bytes(model, plan) * T * h if full else 0)
    head_input = x if full else 0
    levers = activation_levers(model, plan, pb, lt, final_norm, head_input) \
        if plan.activation_offload or plan.checkpoint_layers is not None else None
    if levers is not None:
        acts, recomputed = levers["loss"], levers["recomputed"]
        notes.append(levers["note"])
    elif plan.gradient_checkpointing:
        # HF checkpointing keeps each layer's input; one layer is recomputed at a time in backward,
        # after the loss's backward (Chen et al. 2016; transformers GradientCheckpointingLayer)
        # MatMul8bitLt keeps its input on ctx.tensors, not save_for_backward, so checkpointing cannot drop
        # it: every layer keeps its linears' inputs (bitsandbytes/autograd/_functions.py MatMul8bitLt.forward)
        acts = L * x + sum(lt.int8_held) + final_norm + head_input
        recomputed = layer_acts
    else:
        acts = sum(lt.saved) + final_norm + head_input
        recomputed = 0
    acts += _packing_dora_activation_bytes(model, plan, pb)
    acts += sequence_parallel.position_ids_bytes(sharded)
    packed_mask = loss_dora_packing.packed_mask_bytes(model, plan)  # held to the end of backward (every layer's input)
    logits_fwd, logits_bwd = head if head is not None else logits_bytes(model, plan)

    # the largest dequantized weight of a 4/8-bit layer exists during its matmul (bitsandbytes dequantize_4bit)
    dequant = max((m.in_features * m.out_features for layer in model.description.layers for m in layer.linears
                   if m.quantized_by_bnb), default=0) * p if plan.quantized else 0
    # autocast caches the low-precision copy of every trainable fp32 weight in the forward region
    # (torch/csrc/autograd/autocast_mode.cpp cached_cast); weights that do not train are cast each time
    autocast_cache = pb.linear * p if plan.precision.startswith("mixed") and full else 0
    grads_held = grads if plan.grad_accum > 1 else 0
    # a full fine-tune's gradients while the last layer's backward runs: the output head's (a tied head's is the
    # embedding's), the final norm's and the last layer's own (traced); at the end of backward all but an untied
    # embedding's, which comes after the first layer's backward (aten embedding_dense_backward)
    d = model.description
    first_pass = full and plan.grad_accum == 1 and plan.offload == "none"
    last_grads = grads_held or (((d.lm_head_params or d.embedding_params) + d.final_norm_params
                                 + d.layers[-1].params) * tb if first_pass else 0)
    end_grads = grads - (model.embedding_params * tb if first_pass and d.lm_head_params else 0)
    opt_temp = optimizer_transient_bytes(model, plan, pb) if plan.offload == "none" else 0
    # backward of one layer: gradients of its largest activations, and a dequantized weight
    layer_bwd_temp = lt.backward_temp + dequant
    # ring attention's backward gathers the whole sequence's k and v again and makes their full-length gradients
    # before the reduce-scatter (torch context parallel, cp_comm_strategy allgather): modelled, not traced
    layer_bwd_temp += 2 * sequence_parallel.ring_exchange_bytes(model, sharded)
    if plan.activation_offload and not plan.gradient_checkpointing and not model.is_moe and not any(
            layer.attention == "mla" for layer in model.description.layers):
        # the offload's layer phases count the layer's saved tensors whole, though TRL's hooks bring back the
        # MLP's first and the attention's after: one intermediate-sized gradient fewer holds them within 3% of
        # the trace (tests/test_analytic_vs_simulate.py), two errors in one until those phases count the tensors
        # as they come back
        layer_bwd_temp -= p * T * model.intermediate_size
    # full fine-tuning: embedding_dense_backward makes a vocab x hidden gradient, added into the tied /
    # existing one at the end of backward (aten embedding_backward; traced)
    # (an untied embedding's first gradient is the .grad itself: no separate sum; traced on Qwen2.5-7B)
    emb_bwd_temp = model.embedding_params * DTYPE_BYTES[plan.param_dtype] \
        if full and (model.tie_word_embeddings or plan.grad_accum > 1) else 0

    phases = {
        "loss": dict(gradients=grads_held, activations=acts, transient=logits_fwd + autocast_cache),
        "backward": dict(gradients=grads_held, activations=acts, transient=logits_bwd + autocast_cache),
        "backward-end": dict(gradients=end_grads, activations=((x + recomputed) if plan.gradient_checkpointing
                                                               else layer_acts) + packed_mask,
                             transient=layer_bwd_temp + autocast_cache),
        # after the first layer's backward: the embedding's gradient, no activations left
        "backward-embedding": dict(gradients=grads, activations=0, transient=emb_bwd_temp + autocast_cache),
        "optimizer": dict(gradients=grads, activations=0, transient=opt_temp),
    }
    if plan.gradient_checkpointing:
        # the last layer is recomputed first, while every layer's input is still held and before most
        # gradients exist; each layer input is released after its backward (torch.utils.checkpoint)
        # every layer's input, and what LLM.int8 linears hold on their context inside the checkpointed layers
        phases["backward-recompute"] = dict(gradients=last_grads,
                                            activations=L * x + sum(lt.int8_held) + recomputed + packed_mask,
                                            transient=layer_bwd_temp + autocast_cache)
    else:
        # the last layer's backward, every layer's activations still held (the logits are gone by then)
        phases["backward-layers"] = dict(gradients=last_grads, activations=acts,
                                         transient=layer_bwd_temp + autocast_cache)
    if levers is not None:
        apply_activation_levers(phases, levers, last_grads, layer_bwd_temp + autocast_cache)
    if plan.updates_in_backward:
        apply_update_in_backward(model, plan, pb, phases)
    _add_lever_phases(phases, model, plan, pb)
    if reference_forward:
        # the policy's head output and saved tensors stay while the reference runs (DPOTrainer._compute_loss)
        phases["reference-forward"] = dict(gradients=grads_held, activations=acts,
                                           transient=logits_fwd + reference_forward + autocast_cache)
    tower = None
    if vision.applies(model, plan):
        ratio = states / (pb.trainable * tb) if pb.trainable else 0.0
        tower = vision.estimate_vision(model, asked, vis, ratio)
        vision.add_to_phases(phases, tower)
        weights += tower.weights
        consts += tower.quant_constants
        adapters += tower.adapter_weights
        states += tower.optimizer_states
    peak_phase, at_peak = max(phases.items(), key=lambda kv: sum(kv[1].values()))

    device = empty()
    device.update(weights=weights, quant_constants=consts, adapter_weights=adapters,
                  optimizer_states=states, master_weights=masters, **at_peak)
    spilled: dict[str, int] = {}
    notes += paged_spill(device, spilled, plan, gpu)
    hm = host_memory(model, plan, activations_pinned=offloaded_activation_blocks(
        model, plan, pb, lt), spill_bytes=spilled.get("optimizer_states", 0))
    host.update(hm.by_category())
    notes += hm.notes
    # the highest moment besides the optimizer step's: a sharded run steps its shard only, so where the step's
    # temporaries set the peak on one GPU another moment may set it on each of N (advisor.memory.sharding)
    others = [v for k, v in phases.items() if k != "optimizer"]
    rest = dict(max(others, key=lambda v: sum(v.values()))) if others and peak_phase == "optimizer" else None
    return _report(device, host, hm, notes, plan, gpu, peak_phase, max(logits_fwd, logits_bwd),
                   {"params_trainable": pb.trainable, "lora_modules": list(pb.lora_modules),
                    **({"moment_besides_optimizer": rest} if rest else {}),
                    "lora_experts": bool(plan.peft and plan.lora_experts),
                    "activations_per_layer_bytes": layer_acts, "saved_activations_bytes": int(acts),
                    **({"vision": {**tower.to_dict(), "sample": vis.to_dict() if vis else None,
                                   "language_model_seq_len": plan.seq_len}} if tower is not None else {})})


def moe_notes(model: ModelSpec, plan: Plan) -> list[str]:
    """What a mixture of experts' ledger says about its router, its adapters and gpt-oss's MXFP4 weights."""
    if not model.is_moe:
        return []
    notes = [experts.router_note(model)]
    if plan.peft:
        from advisor.core.adapters import lora_targets

        notes += lora_targets(model, plan)[1]
    return notes + gpt_oss_weight_notes(model, plan)


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


def gpt_oss_weight_notes(model: ModelSpec, plan: Plan) -> list[str]:
    """gpt-oss ships its experts in MXFP4; training holds them in bf16 (advisor.core.card_rules.mxfp4_kept)."""
    from advisor.core.card_rules import mxfp4_training_note

    note = mxfp4_training_note(model, plan)
    return [note] if note else []


# --------------------------------------------------------------------------- optimizer implementations
# (fused, torchao low-bit, low-rank, LOMO)

# torchao low-bit AdamW block, as transformers passes it (trainer_optimizer._get_torchao_adamw)
AO_BLOCK = 256
AO_MIN_SIZE = 4096        # torchao quantizes tensors of >= 4096 values whose size divides the block (optim/adam.py)
AO_QMAP = {8: 256 * 4, 4: 16 * 4}  # one fp32 code map per quantized state tensor (torchao subclass_8bit / _4bit)
ALLOC_BLOCK = 512         # CUDA caching allocator's smallest block (c10 CUDACachingAllocator kMinBlockSize)


def _blocks(n: int) -> int:
    return -(-n // ALLOC_BLOCK) * ALLOC_BLOCK


def trainable_tensors(model: ModelSpec, plan: Plan, pb: ParamBreakdown) -> list[tuple[int, ...]]:
    """Shapes of the trainable tensors: (out, in) for matrices, (n,) for vectors, expert stacks as stored (what
    per-tensor optimizers allocate state for, tensor by tensor: advisor.memory.tensors)."""
    return tensors.trainable_shapes(model, plan, pb.lora_modules, pb.idle)


_numel = tensors.numel


def low_rank_targets(model: ModelSpec, plan: Plan) -> list[tuple[int, int]]:
    """(out, in) of every weight GaLore / APOLLO project: the nn.Linears of the decoder layers
    (advisor.runtime.build.GALORE_TARGETS; transformers' Trainer skips a matching module that is not an nn.Linear,
    so stacked experts and routers get plain Adam states); a layer the step skips has no gradient to project."""
    idle = stepped_skip(model, plan)
    return [(m.out_features, m.in_features) for layer in model.description.layers if layer.index not in idle
            for m in layer.linears]


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
    shapes = tensors.param_shapes(model)  # at __init__, stepped or not
    if plan.peft:
        shapes += tensors.trainable_shapes(model, plan, pb.lora_modules)
    return sum(_blocks(4 * s[0]) + (_blocks(4 * s[1]) if len(s) == 2 else 0) for s in shapes)


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
        # (embedding / head, an expert stack): exp_avg_sq.sqrt() and exp_avg / denom, full size (galore_torch/adamw.py)
        if opt == "galore_adamw_8bit":
            return low_rank_spike_bytes(model, plan, tb)  # bitsandbytes updates the other tensors in place
        rest = max(_without([_numel(s) for s in trainable_tensors(model, plan, pb)],
                            [o * i for o, i in low_rank_targets(model, plan)]))
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


def activation_levers(model: ModelSpec, plan: Plan, pb: ParamBreakdown, lt: LayerTerms, final_norm: int,
                      head_input: int) -> dict:
    """Saved activations with k of L layers checkpointed and / or activation offload, layer by layer.

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
    chosen = set(checkpointed_layers(plan, L)) - tensors.idle_layers(model, plan)  # a skipped layer saves no input
    k = len(chosen)
    top = max(chosen) if chosen else -1
    plain = [i for i in range(L) if i not in chosen]
    # non-checkpointed layers under the top checkpointed one (the first recomputed): still held when it is
    below_top = sum(lt.saved[i] for i in plain if i < top)
    last_checkpointed = (L - 1) in chosen
    held8 = sum(lt.int8_held[i] for i in chosen)
    host = 0
    if plan.activation_offload and plan.gradient_checkpointing:
        # each checkpointed layer's input on the host (the rotary tables are keyword arguments bound into the
        # recomputed function, not saved: modeling_layers.GradientCheckpointingLayer); one comes back at a time
        host = k * x
        # LLM.int8 linears keep their inputs on ctx inside the checkpointed layers too (int8_held_inputs)
        held_inputs, back = held8, x
        rest = sum(lt.saved[i] for i in plain)
        stash = 0
    elif plan.activation_offload:
        # every saved tensor of >= 1 KiB in the decoder that is not a Parameter: the activations, and the
        # transposed views of the linear weights that matmul saves for the input gradient (views are not
        # Parameters); the head and the loss keep theirs on the device (advisor.runtime.build)
        weight_views = offloaded_weight_views(model, plan)
        # LLM.int8 linears keep their inputs on ctx, which the hooks never see: they stay on the device (and
        # o_proj's, the attention output, also goes to the host as the attention saves it)
        host = sum(lt.saved[i] - sum(lt.int8_inputs[i]) for i in range(L)) + weight_views
        held_inputs, back, rest = 0, 0, sum(lt.int8_held)
        stash = lt.stash
    else:
        held_inputs, back, rest, stash = k * x + held8, 0, sum(lt.saved[i] for i in plain), 0
    loss = held_inputs + rest + final_norm + head_input + stash
    recomputed = lt.saved[top] if chosen else 0
    if plan.activation_offload and not plan.gradient_checkpointing:
        recompute_held, layers_held = None, lt.saved[-1] + final_norm + head_input
    else:
        recompute_held = (held_inputs if not plan.activation_offload else back + held8) + below_top + recomputed
        layers_held = None if last_checkpointed else loss - stash
    what = (f"checkpointing {k} of {L} layers" if plan.gradient_checkpointing else "no checkpointing") + \
        (", activations offloaded to pinned host memory" if plan.activation_offload else "")
    return {"loss": loss, "recomputed": recomputed, "host": int(host), "recompute": recompute_held,
            "layers": layers_held, "end": (x if chosen else 0) + lt.biggest, "stash": stash, "note": what}


def offloaded_weight_views(model: ModelSpec, plan: Plan) -> int:
    """The transposed views of frozen 16-bit nn.Linear weights that matmul saves for the input's gradient: not
    Parameters, so TRL's OffloadActivations copies them to the host (a 4/8-bit linear saves its packed weight,
    a Parameter, instead: bitsandbytes MatMul4Bit)."""
    if plan.quantized:
        return 0
    idle = tensors.idle_layers(model, plan)
    return DTYPE_BYTES[plan.activation_dtype] * sum(m.in_features * m.out_features
                                                    for layer in model.description.layers if layer.index not in idle
                                                    for m in layer.linears)


def checkpoint_offload_inputs(model: ModelSpec, plan: Plan) -> int:
    """Checkpoint offload: how many layer inputs go to the host, one per checkpointed layer the step runs (each
    batch x seq x hidden in the activation dtype: save_on_cpu around checkpoint, transformers modeling_utils
    _activation_checkpointing_enable)."""
    if not (plan.activation_offload and plan.gradient_checkpointing):
        return 0
    return len(set(checkpointed_layers(plan, model.num_layers)) - tensors.idle_layers(model, plan))


def checkpoint_offload_bytes(model: ModelSpec, plan: Plan) -> int:
    """The bytes checkpoint offload copies to the host in one forward, and back in backward: each checkpointed
    layer's input, micro_batch x seq_len x hidden x activation bytes (Chen et al. 2016's checkpoint; the tensors
    themselves, not their pinned blocks)."""
    return checkpoint_offload_inputs(model, plan) * DTYPE_BYTES[plan.activation_dtype] * plan.micro_batch \
        * plan.seq_len * model.hidden_size


def offloaded_activation_blocks(model: ModelSpec, plan: Plan, pb: ParamBreakdown, lt: LayerTerms | None = None) -> int:
    """Pinned host bytes of an activation offload, one power-of-two block per copy (advisor.memory.host): with
    checkpointing, each checkpointed layer's input (save_on_cpu around checkpoint); without, a copy each time a
    decoder op saves a tensor of at least 1 KiB that is not a Parameter (TRL's rule): offloaded_layer_copies per
    layer, the first layer's saves for an input gradient it does not need left out, and the final norm's."""
    if not plan.activation_offload:
        return 0
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    if plan.gradient_checkpointing:
        return checkpoint_offload_inputs(model, plan) * pinned_block_bytes(p * T * model.hidden_size)
    lt = lt or layer_terms(model, plan, pb)
    total = 0
    for layer, indices in tensors.run_layer_kinds(model, plan):
        copies = offloaded_layer_copies(model, plan, pb, layer, lt, indices[0])
        total += len(indices) * pinned_bytes_of(copies)
        if 0 in indices:  # the first layer's input needs no gradient: what it saves for one is not made
            uncopied = experts.first_layer_uncopied(model, plan, layer, list(pb.lora_modules))
            total -= pinned_bytes_of(copies) - pinned_bytes_of(_present_without(copies, uncopied))
    return total + pinned_bytes_of(x for x in experts.final_norm_copies(model, plan) if x >= OFFLOAD_MIN_BYTES)


def _present_without(values: list[int], remove: list[int]) -> list[int]:
    left = list(values)
    for v in remove:
        if v in left:
            left.remove(v)
    return left


def offloaded_layer_copies(model: ModelSpec, plan: Plan, pb: ParamBreakdown, layer: LayerDescription,
                           lt: LayerTerms, ix: int) -> list[int]:
    """The host copies one layer's offload makes, one per save (the hook copies a tensor each time an op saves
    it, advisor.runtime.build.offload_hooks): the layer's saved tensors of at least 1 KiB but the inputs LLM.int8
    holds on its context, and offload_copies (the tensors saved more than once or made outside the layer). The
    transposed weight views a linear saves share their parameter's storage: not copied (TRL's ``param_storages``)."""
    per_layer = [int(t) for t in lt.tensors[ix] if t >= OFFLOAD_MIN_BYTES]
    # never offloaded: what the int8 linears hold on their ctx, and the storages saved in another shape
    per_layer = _present_without(per_layer, list(lt.int8_inputs[ix]) + offload_skipped(model, plan, layer))
    return per_layer + [x for x in offload_copies(model, plan, layer, list(pb.lora_modules)) if x >= OFFLOAD_MIN_BYTES]


def offload_copies(model: ModelSpec, plan: Plan, layer: LayerDescription, modules: list[str]) -> list[int]:
    """What an offload copies beyond the layer's saved storages (layer_saved_tensors), one entry per extra save;
    the GPU holds each storage once, so only the host count reads these (dense and routed layers alike:
    advisor.memory.experts.offload_copies, beside the per-part lists it corrects)."""
    return experts.offload_copies(model, plan, layer, modules)


def offload_skipped(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """The entries of layer_saved_tensors an offload does not copy as such (advisor.memory.experts.offload_skipped:
    k and v saved expanded, eager attention's logsumexp and output)."""
    return experts.offload_skipped(model, plan, layer)


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
