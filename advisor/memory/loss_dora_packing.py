"""Ledger terms of the fused linear loss, DoRA and packing (closed form, one citation each).

The training ledger (advisor.memory.training) adds these to its categories; each function returns
bytes. Notation: T = micro_batch * seq_len tokens, h hidden, V vocabulary, p = bytes of the
activation dtype, (i, o) a linear module's fan-in and fan-out, r the LoRA rank.
"""

from __future__ import annotations

from advisor.core.catalog import ModelSpec
from advisor.core.packed_docs import builds_packed_mask, documents_per_row
from advisor.core.plan import DTYPE_BYTES, FLASH_ATTENTION, Plan


# --------------------------------------------------------------------------- the loss


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy: logits of one chunk ~ BT x H elements
    (liger_kernel/ops/fused_linear_cross_entropy.py: inc_factor = cdiv(V, H); next_power_of_2(cdiv(BT, inc)))."""
    inc = -(-vocab // hidden)
    per = -(-tokens // inc)
    return max(1, min(1 << max(0, (per - 1).bit_length()), tokens))


def hidden_state_bytes(plan: Plan) -> int:
    """Bytes per element of the last hidden state: the final RMSNorm multiplies by its weight, fp32 under
    mixed precision (transformers Qwen2RMSNorm.forward: weight * hidden.to(input_dtype))."""
    return DTYPE_BYTES[plan.param_dtype] if plan.precision.startswith("mixed") else DTYPE_BYTES[plan.activation_dtype]


def fused_linear_loss_bytes(model: ModelSpec, plan: Plan) -> tuple[int, int]:
    """(forward, backward) transient of the fused linear cross-entropy: no logits, gradients made in forward.

    Forward: grad_input (BT x H, the hidden state's dtype) and, when the head trains, grad_weight (V x H)
    allocated before the chunk loop and saved for backward; one chunk's logits (chunk x V); the fp32
    loss_1d, the target mask and the shifted labels (LigerFusedLinearCrossEntropyFunction.forward,
    LigerForCausalLMLoss). Backward: grad_input and grad_weight handed to autograd as they are.
    """
    T = plan.micro_batch * plan.seq_len
    h, V = model.hidden_size, model.vocab_size
    hb = hidden_state_bytes(plan)
    chunk = liger_chunk_tokens(T, h, V)
    grad_input = hb * T * h
    head_grad = V * h * DTYPE_BYTES[plan.param_dtype] if plan.method == "full" else 0
    # chunk logits in the hidden dtype; loss_1d fp32, mask bool, padded + shifted int64 labels
    fwd = grad_input + head_grad + chunk * V * hb + 4 * T + T + 2 * 8 * T
    bwd = grad_input + head_grad
    return int(fwd), int(bwd)


# --------------------------------------------------------------------------- DoRA


def dora_magnitude_params(model: ModelSpec, plan: Plan, modules: tuple[str, ...]) -> int:
    """DoRA's trained magnitude: one value per output feature of each adapted module
    (Liu et al. 2024, eq. 5; peft DoraLinearLayer.update_layer: nn.Parameter(weight_norm))."""
    if not plan.dora:
        return 0
    shapes = model.linear_shapes()
    return model.num_layers * sum(shapes[m][1] for m in modules)


def dora_layer_activation_bytes(model: ModelSpec, plan: Plan, modules: tuple[str, ...]) -> int:
    """What one layer's DoRA modules save for backward on top of LoRA's (peft DoraLinearLayer.forward).

    With dropout the base matmul is re-run on the dropped-out input with an fp32 copy of the weight
    (weight.to(x.dtype)), which F.linear keeps for the input's gradient (4 o i); the two products with the
    trained magnitude keep base_result and lora_result (fp32, T x o each). Without dropout base_result is
    the base layer's own output (p T o). The magnitude / weight-norm vectors: 3 x 4 o.
    """
    if not plan.dora:
        return 0
    shapes = model.linear_shapes()
    T = plan.micro_batch * plan.seq_len
    p = DTYPE_BYTES[plan.activation_dtype]
    total = 0
    for m in modules:
        i, o = shapes[m]
        if plan.lora_dropout > 0:
            total += 4 * o * i + 8 * T * o
        else:
            total += p * T * o + 4 * T * o
        total += 3 * 4 * o
    return total


def dora_first_layer_saving(model: ModelSpec, plan: Plan, modules: tuple[str, ...]) -> int:
    """The fp32 weight copies the first layer does not keep: its input needs no gradient (frozen embedding,
    no checkpointing), so F.linear saves nothing for it (aten linear backward needs the weight only for
    grad_input)."""
    if not plan.dora or plan.lora_dropout <= 0 or plan.gradient_checkpointing:
        return 0
    shapes = model.linear_shapes()
    return sum(4 * shapes[m][0] * shapes[m][1] for m in modules)


def dora_forward_spike(model: ModelSpec, plan: Plan, modules: tuple[str, ...]) -> int:
    """The largest transient of one DoRA module's forward: lora_B(lora_A(eye(i))) builds the i x o update
    from an fp32 identity (kept with lora_A's input until the forward ends), then the weight norm of
    W + scaling * BA (fp32 W copy, the scaled update, the sum) (peft dora.py get_lora_weight, get_weight_norm)."""
    if not plan.dora:
        return 0
    shapes = model.linear_shapes()
    return max(4 * (i * i + i * plan.lora_r + 3 * i * o) for i, o in (shapes[m] for m in modules))


# --------------------------------------------------------------------------- packing and attention


def packed_mask_bytes(model: ModelSpec, plan: Plan) -> int:
    """The block-diagonal mask of packed documents under sdpa, built once per forward (bool b x 1 x s x s) and held
    to the end of backward: a packed row turns sdpa's causal skip off (transformers masking_utils.create_causal_mask:
    allow_is_causal_skip = False; sdpa_mask). Eager builds its additive mask with or without packing (counted with
    eager's scores); flash-attention runs varlen on cu_seqlens and builds none (flash_attention_mask); a row of
    one document is no packed row (find_packed_sequence_indices returns None)."""
    if plan.attn_impl != "sdpa" or not builds_packed_mask(plan):
        return 0
    return plan.micro_batch * plan.seq_len ** 2


def packed_layer_bytes(model: ModelSpec, plan: Plan) -> int:
    """What each layer keeps for packed documents. Under sdpa: the bool mask made an additive bias in the compute
    dtype, saved by the memory-efficient kernel (aten convert_boolean_attn_mask,
    _scaled_dot_product_efficient_attention), and k, v expanded by repeat_kv (transformers uses sdpa's
    enable_gqa only without a mask: integrations/sdpa_attention.use_gqa_in_sdpa). Under flash-attention: the
    int32 cu_seqlens of the flattened batch, saved for backward (varlen_cu_seqlens_bytes)."""
    if plan.packing and plan.attn_impl in FLASH_ATTENTION:
        return varlen_cu_seqlens_bytes(plan)
    if plan.attn_impl != "sdpa" or not builds_packed_mask(plan):
        return 0
    p = DTYPE_BYTES[plan.activation_dtype]
    T = plan.micro_batch * plan.seq_len
    return p * plan.micro_batch * plan.seq_len ** 2 + p * T * 2 * (model.q_dim - model.kv_dim)


def varlen_cu_seqlens_bytes(plan: Plan) -> int:
    """flash varlen's cumulative document lengths, int32 (documents + 1) of the flattened batch, one per layer
    (transformers prepare_fa_kwargs_from_position_ids; flash_attn FlashAttnVarlenFunc saves cu_seqlens_q/k, one
    tensor here)."""
    if not plan.packing or plan.attn_impl not in FLASH_ATTENTION:
        return 0
    return 4 * (plan.micro_batch * documents_per_row(plan) + 1)
