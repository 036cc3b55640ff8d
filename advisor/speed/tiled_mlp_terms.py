"""Step-time term of the tiled MLP (``--tiled-mlp``: DeepSpeed ALST's TiledMLP on each dense decoder MLP).

TiledMLP runs the MLP's forward under no_grad shard by shard, and its backward runs each shard's forward again
with grad before backpropagating it (deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP: "the forward occurs
twice each iteration. And if you're using activation checkpointing it then occurs trice"): one MLP forward more
per layer and micro-batch, checkpointing or not (the checkpoint's recompute is its own term). A 4-bit MLP weight
is dequantized once per shard and pass instead of once per pass (bitsandbytes MatMul4Bit on each shard).
"""

from __future__ import annotations

from advisor.memory.tiled_mlp import MLP_LINEARS, num_shards, tiles
from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import gemm_seconds, stream_seconds
from advisor.speed.terms import all_layers, dequant_4bit_bytes_per_param, kind_lora_modules, term


def mlp_forward_seconds(s: StepInputs, kind) -> float:
    """One dense MLP's forward over the micro-batch: its gate, up and down GEMMs (M x K x N, 2 FLOPs per
    multiply-add), LoRA's narrow GEMMs on them (Hu et al. 2021 eq. 3), and SiLU(gate) * up, 5p bytes per
    intermediate element (transformers LlamaMLP.forward; as terms.layer_elementwise_bytes)."""
    if not kind.mlp_width:
        return 0.0
    M, r, p = s.tokens, s.plan.lora_r, s.act_bytes
    total = sum(gemm_seconds(s, M, n_out, k_in) for n, k_in, n_out in kind.linears if n in MLP_LINEARS)
    for mod in kind_lora_modules(s, kind):
        if mod in MLP_LINEARS:
            k_in, n_out = kind.shape(mod)
            total += gemm_seconds(s, M, r, k_in) + gemm_seconds(s, M, n_out, r)
    return total + stream_seconds(s, 5 * p * M * kind.mlp_width)


def mlp_dequant_seconds(s: StepInputs, kind) -> float:
    """One dequantization of a layer's 4-bit MLP weights (terms.dequant_4bit_bytes_per_param per weight, at the
    in-step dequantization rate)."""
    if not s.plan.four_bit or not kind.mlp_width:
        return 0.0
    q = set(kind.quantized)
    params = sum(i * o for n, i, o in kind.linears if n in MLP_LINEARS and n in q)
    return params * dequant_4bit_bytes_per_param(s) / s.dequant_4bit_bw


@term("tiled_mlp", label="tiled MLP: MLP forward again")
def tiled_mlp(s: StepInputs) -> float:
    """TiledMLP's backward runs each dense MLP's forward once more (its docstring: twice per iteration, thrice
    with checkpointing). 4-bit weights: n shards dequantize n times per pass where the untiled MLP dequantizes
    once: forward n, backward n (the shards' forward again) + n (dX), a checkpoint's recompute n, against 2 (+1),
    so (3n - 2) + checkpointed_fraction x (n - 1) dequantizations more."""
    if not tiles(s.model, s.plan):
        return 0.0
    n = num_shards(s.model, s.plan)
    extra_dequant = (3 * n - 2) + s.checkpointed_fraction * (n - 1)
    return all_layers(s, lambda s, kind: mlp_forward_seconds(s, kind) + extra_dequant * mlp_dequant_seconds(s, kind))
