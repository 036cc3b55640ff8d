"""The tiled MLP's ledger terms (``--tiled-mlp``: DeepSpeed ALST's TiledMLP on each dense decoder MLP).

TiledMLP (deepspeed.runtime.sequence_parallel.ulysses_sp; Bekman et al. 2025, ALST §3.2) runs the MLP under
``no_grad`` over ``n = ceil(seq_len / hidden)`` sequence shards and saves only its input ``x``; backward makes
``x``'s gradient (``zeros_like(x)``), then recomputes one shard with grad and backpropagates it, shard by shard.
So a layer keeps ``x`` where it kept the MLP's intermediates, and one shard's intermediates exist in its backward.
With checkpointing the layer's recompute runs TiledMLP's no-grad forward again, and its backward the shards.

Notation as advisor.memory.training: T = micro_batch x seq_len tokens, h hidden, i intermediate, p activation bytes.
"""

from __future__ import annotations

import math

from advisor.core.catalog import ModelSpec
from advisor.core.plan import DTYPE_BYTES, Plan

MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
"""The dense gated MLP's linears, the modules advisor.runtime.tiled_mlp tiles."""


def tiles(model: ModelSpec, plan: Plan) -> bool:
    """Whether the step tiles this model's MLPs: a dense gated MLP of a text model (a mixture of experts and a
    vision-language model keep theirs whole, advisor.runtime.build._tile_mlps and the exported scripts)."""
    return (bool(plan.tiled_mlp) and not model.is_moe and not model.is_vision_language
            and set(MLP_LINEARS) <= set(model.linear_shapes()))


def num_shards(model: ModelSpec, plan: Plan) -> int:
    """ALST's shard count, ceil(seq_len / hidden_size) (ArcticTraining tiled_mlp_forward_common)."""
    return max(1, math.ceil(plan.seq_len / model.hidden_size))


def shard_tokens(model: ModelSpec, plan: Plan) -> int:
    """Rows of the largest shard in TiledMLP's backward: the b x s tokens flattened, torch.chunk into n
    (ceil(T / n) rows; TiledMLP.backward reshapes x to (-1, hidden) before chunking)."""
    return math.ceil(plan.micro_batch * plan.seq_len / num_shards(model, plan))


def lora_saved(plan: Plan, tokens: int, fan_in: int) -> list[int]:
    """What a LoRA linear saves over ``tokens``: its fp32 input cast (lora_A's input), A's output (lora_B's input),
    and the dropout mask, 1 byte per element (peft/tuners/lora/layer.py Linear.forward)."""
    return [4 * tokens * fan_in, 4 * tokens * plan.lora_r] + ([tokens * fan_in] if plan.lora_dropout > 0 else [])


def mlp_saved_tensors(model: ModelSpec, plan: Plan, pb, input_saved: bool, down_saved: bool,
                      tokens: int | None = None) -> list[int]:
    """What the untiled gated MLP saves over ``tokens`` (default T), LoRA's own tensors apart: its input when gate
    and up train, the gate output (the activation's input), the activation output and the up output (the
    product's inputs), and down_proj's input when it trains (aten linear / silu / mul backward)."""
    T = plan.micro_batch * plan.seq_len if tokens is None else tokens
    p = DTYPE_BYTES[plan.activation_dtype]
    h, i = model.hidden_size, model.intermediate_size
    return ([p * T * h] if input_saved else []) + [p * T * i] * 3 + ([p * T * i] if down_saved else [])


def saved_input_bytes(model: ModelSpec, plan: Plan) -> int:
    """TiledMLP's one saved tensor per layer: the MLP's input x, T x h (ctx.save_for_backward(x))."""
    return DTYPE_BYTES[plan.activation_dtype] * plan.micro_batch * plan.seq_len * model.hidden_size


def backward_transient(model: ModelSpec, plan: Plan, pb) -> int:
    """The most a tiled layer's backward holds beyond what it saved: TiledMLP.backward's x_grad (zeros_like(x),
    T x h), one shard's recomputed MLP tensors (its saved tensors and LoRA's over ceil(T / n) rows) and that
    shard's three intermediate-sized gradients of the gated product (as the untiled layer's, training.
    layer_backward_transient, over the shard's rows)."""
    p = DTYPE_BYTES[plan.activation_dtype]
    rows = shard_tokens(model, plan)
    shapes = model.linear_shapes()
    full = plan.method == "full"
    shard = sum(mlp_saved_tensors(model, plan, pb, full, full, rows))
    shard += sum(sum(lora_saved(plan, rows, shapes[m][0])) for m in pb.lora_modules if m in MLP_LINEARS)
    return saved_input_bytes(model, plan) + shard + 3 * p * rows * model.intermediate_size
