"""Step-time terms of the loss, DoRA, attention and packing levers (predicted; one citation each).

Each term returns (extra matmul FLOPs, extra bytes moved) of one optimizer step, beyond what the
roofline of the base step counts; advisor.speed.throughput turns them into seconds. They run as
kernels of their own (the logits' softmax, DoRA's weight norm, eager's score matrices), so their
time adds to the step instead of hiding under the matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.core.catalog import ModelSpec
from advisor.core.plan import DTYPE_BYTES, Plan, lora_target_modules


@dataclass(frozen=True)
class LeverCost:
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: "LeverCost") -> "LeverCost":
        return LeverCost(self.flops + other.flops, self.bytes + other.bytes)


def loss_cost(model: ModelSpec, plan: Plan) -> LeverCost:
    """The logits' traffic, and the chunked loss's second output projection.

    plain: bf16 logits written, read into an fp32 copy, log_softmax written, and in backward its
    gradient and _log_softmax_backward_data's output: ~p + 5 x 4 bytes per logit (transformers
    ForCausalLMLoss, aten derivatives.yaml). chunked: the same traffic plus the head's forward again in
    backward (torch.utils.checkpoint per chunk: 2 T V h FLOPs). fused-linear: one chunk of logits
    written and overwritten in place by its gradient: ~3 p bytes per logit, no recomputation (Liger
    fused_linear_cross_entropy_forward).
    """
    T = plan.tokens_per_step
    V, h = model.vocab_size, model.hidden_size
    p = DTYPE_BYTES[plan.activation_dtype]
    if plan.loss == "fused-linear":
        return LeverCost(0.0, 3 * p * T * V)
    cost = LeverCost(0.0, (p + 5 * 4) * T * V)
    if plan.loss == "chunked":
        cost += LeverCost(2.0 * T * V * h, 0.0)
    return cost


def dora_cost(model: ModelSpec, plan: Plan) -> LeverCost:
    """DoRA's extra work per adapted module (peft DoraLinearLayer.forward), per forward pass:

    the update B(A(I)) from an identity (2 i^2 r + 2 i r o FLOPs); the fp32 weight copy, the scaled
    update, their sum and its norm (~5 x 4 i o bytes); with dropout the base matmul again on the
    dropped-out input and its input gradient in backward (2 x 2 T i o FLOPs).
    """
    if not plan.dora:
        return LeverCost()
    shapes = model.linear_shapes()
    modules = lora_target_modules(plan, list(shapes))
    T = plan.tokens_per_step
    passes = (2 if plan.gradient_checkpointing else 1) * plan.grad_accum  # forward (+ recompute)
    flops = bytes_ = 0.0
    for m in modules:
        i, o = shapes[m]
        flops += passes * (2 * i * i * plan.lora_r + 2 * i * plan.lora_r * o)
        bytes_ += passes * 5 * 4 * i * o
        if plan.lora_dropout > 0:
            # forward (and its recomputation) plus the input gradient in backward
            flops += (2 * (passes // plan.grad_accum) + 2) * T * i * o
    return LeverCost(model.num_layers * flops, model.num_layers * bytes_)


def attention_cost(model: ModelSpec, plan: Plan) -> LeverCost:
    """eager attention: the b x heads x s x s scores in fp32, their softmax and its 16-bit copy written and
    read in forward, read again with their gradients in backward (transformers eager_attention_forward);
    sdpa and flash-attention keep them on chip (Dao 2023 §3.1): nothing extra."""
    if plan.attn_impl != "eager":
        return LeverCost()
    p = DTYPE_BYTES[plan.activation_dtype]
    scores = plan.micro_batch * model.num_heads * plan.seq_len ** 2 * plan.grad_accum * model.num_layers
    passes = 3 if plan.gradient_checkpointing else 2
    return LeverCost(0.0, passes * scores * (4 + 4 + 2 * p))


def attention_flops_scale(doc_lengths: list[int] | None, plan: Plan) -> float:
    """With packing each document attends only to itself: the attention term scales by
    sum(s_i^2) / (sum(s_i) * seq_len) (flash-attn varlen, a block-diagonal mask); 1 otherwise."""
    if not plan.packing or not doc_lengths:
        return 1.0
    lengths = [min(n, plan.seq_len) for n in doc_lengths if n > 0]
    total = sum(lengths)
    return sum(n * n for n in lengths) / (total * plan.seq_len) if total else 1.0


def lever_cost(model: ModelSpec, plan: Plan) -> LeverCost:
    return loss_cost(model, plan) + dora_cost(model, plan) + attention_cost(model, plan)
