"""The tiled MLP lever on a built model: DeepSpeed's own ``TiledMLP`` on each dense decoder MLP.

As ALST wires it (Bekman et al. 2025, "Arctic Long Sequence Training" §3.2; ArcticTraining
``tiled_mlp_forward_common``; the example in ``deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP``'s
docstring): the MLP's forward becomes ``TiledMLP.apply(mlp_forward, self, x, num_shards, compute_params)`` with
``num_shards = ceil(seqlen / hidden_size)``. TiledMLP runs each shard under ``no_grad`` and saves only ``x``;
its backward recomputes each shard with grad and backpropagates it, so one shard's intermediates are alive at a
time. Here the forward is replaced on each MLP instance (not on its class), so nothing else in the process is
patched; the shard function is the module's own class forward (peft's LoRA layers inside it run as they are).
"""

from __future__ import annotations

import math
import types

GATED = ("gate_proj", "up_proj", "down_proj")
"""A dense gated MLP's linears (LlamaMLP, Qwen2MLP, MistralMLP...): what ALST's tiled forward replaces."""


def num_shards(seqlen: int, hidden_size: int) -> int:
    """ALST's shard count: ceil(seqlen / hidden_size), at least 1 (ArcticTraining tiled_mlp_forward_common)."""
    return max(1, math.ceil(seqlen / hidden_size))


def _original_forward(module, x):
    return type(module).forward(module, x)


def _tiled_forward(self, x):
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    shards = num_shards(x.shape[-2], x.shape[-1])
    # compute_params only matter under ZeRO (ds_grad_is_ready); TiledMLP keeps those that train
    return TiledMLP.apply(_original_forward, self, x, shards, list(self.parameters()))


def dense_mlps(model) -> list:
    """The dense gated MLPs of ``model``'s decoder layers (a layer with ``self_attn`` and an ``mlp`` of gate, up
    and down linears; a routed-experts block has no gate_proj of its own, a vision block no self_attn)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and hasattr(m, "self_attn")]
    return [layer.mlp for layer in layers if all(hasattr(getattr(layer, "mlp", None), name) for name in GATED)]


def apply_tiled_mlp(model) -> int:
    """Replace each dense MLP's forward by DeepSpeed's TiledMLP over ALST's shards; returns how many."""
    mlps = dense_mlps(model)
    for m in mlps:
        m.forward = types.MethodType(_tiled_forward, m)
    return len(mlps)
