"""The decoder layers as the step-time model counts them: one ``LayerKind`` per kind of layer (its attention,
window, linear modules, routed experts), with how many layers of that kind the model has.

Derived from the model's description (advisor.core.architecture: a meta-device build of the config), so a dense
model is one kind (or two where sliding-window and full layers alternate), DeepSeek-V2's dense first layer and its
routed layers are two, and Qwen3-Next's Gated DeltaNet layers and its full-attention layers are two. Nothing here
imports torch.

``describes(model)`` is the rule of what the step-time model can predict: softmax attention (full, sliding window,
multi-head latent attention), Gated DeltaNet linear attention, a dense gated MLP, shared experts and routed experts.
A layer it has no term for (another recurrent mixer, cross-attention) leaves the model unpredicted, said in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from advisor.core.catalog import ModelSpec, peft_moved_lora_names
from advisor.core.dtypes import dtype_bytes

ATTENTION_KINDS = ("full", "sliding", "mla", "linear")
"""Attention kinds with terms: softmax over every earlier token, over a window, multi-head latent attention
(DeepSeek-V2/V3), and Gated DeltaNet's chunked linear attention (Qwen3-Next)."""


@dataclass(frozen=True)
class ExpertGemm:
    """One stacked expert matmul (``gate_up_proj``, ``down_proj``): every expert's in x out weight."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    """A per-expert bias (gpt-oss), gathered per routed row and added after the grouped matmul."""


@dataclass(frozen=True)
class RoutedExperts:
    """The routed experts of one layer: each token runs ``top_k`` of ``num_experts`` (transformers
    ``grouped_mm_experts_forward``: tokens x top_k rows sorted by expert, two grouped matmuls)."""

    num_experts: int
    top_k: int
    gemms: tuple[ExpertGemm, ...]
    width: int
    """One expert's intermediate width (what the activation runs over)."""
    router_params: int
    router_bytes: int
    """Bytes per element of the router's weight and logits matmul (DeepSeek-V2 keeps it in fp32)."""

    @property
    def params(self) -> int:
        return self.num_experts * sum(g.in_features * g.out_features for g in self.gemms)


@dataclass(frozen=True)
class LayerKind:
    """Decoder layers that cost the same: same attention kind and window, same modules."""

    count: int
    """How many decoder layers are of this kind."""
    attention: str
    """full, sliding, mla or linear."""
    window: int | None
    """Tokens a sliding-window layer attends to (None: every earlier token)."""
    linears: tuple[tuple[str, int, int], ...]
    """(short name, in, out) of every ``nn.Linear`` of the layer, run over every token: attention projections, a
    dense MLP, shared experts, Qwen3-Next's shared-expert gate."""
    quantized: tuple[str, ...]
    """Short names of the linears bitsandbytes replaces (``type(module) is nn.Linear``); experts and routers are
    not ``nn.Linear`` and stay in the compute dtype."""
    biased: int
    """Linears with a bias."""
    mlp_width: int
    """Width of a dense gated MLP (0: none, the layer routes to experts)."""
    shared_width: int
    """Width of the always-on shared expert(s) (0: none)."""
    shared_gate: bool
    """A sigmoid gate scales the shared expert's output (Qwen3-Next's ``shared_expert_gate``)."""
    experts: RoutedExperts | None
    norms: int
    """Norms over the hidden width (q/k norms are in ``qk_norm``)."""
    qk_norm: bool
    other_params: int
    """Parameters that are neither linear, expert, router nor norm (sinks, Gated DeltaNet's A_log and conv1d)."""
    attention_gated: bool
    """The attention output is multiplied by a sigmoid gate from a doubled q_proj (Qwen3-Next's full layers)."""

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    def shape(self, name: str) -> tuple[int, int]:
        """(in, out) of the linear called ``name`` in this layer."""
        for n, i, o in self.linears:
            if n == name:
                return i, o
        raise KeyError(name)

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _, _ in self.linears)


def _width_after(linears, role: str) -> int:
    """The intermediate width of a gated MLP of ``role``: the input of its last linear (down_proj's in)."""
    mine = [m for m in linears if m.role == role]
    return mine[-1].in_features if mine else 0


def _kind_of(layer, model: ModelSpec) -> tuple:
    d = model.description
    experts = None
    if layer.num_experts:
        gemms = tuple(ExpertGemm(e.name.rsplit(".", 1)[-1], e.in_features, e.out_features,
                                 any(b.in_features == 0 and b.name == e.name + "_bias" for b in layer.experts))
                      for e in layer.experts if e.in_features)
        moe = d.moe
        width = moe.moe_intermediate_size if moe is not None else gemms[-1].in_features
        experts = RoutedExperts(num_experts=layer.num_experts, top_k=layer.experts_per_token, gemms=gemms,
                                width=int(width), router_params=layer.router_params,
                                router_bytes=dtype_bytes(layer.router_dtype) if layer.router_dtype else 2)
    linears = tuple((m.short, m.in_features, m.out_features) for m in layer.linears)
    # Qwen3-Next's shared_expert_gate (hidden -> 1) is an nn.Linear run over every token; the router proper is not
    gate = any(m.role == "router" and m.out_features == 1 for m in layer.linears)
    q = next((o for n, _, o in linears if n == "q_proj"), 0)
    gated = layer.attention in ("full", "sliding") and q == 2 * model.num_heads * model.head_dim
    return (layer.attention, layer.sliding_window if layer.attention == "sliding" else None, linears,
            tuple(m.short for m in layer.linears if m.quantized_by_bnb), sum(1 for m in layer.linears if m.bias),
            _width_after(layer.linears, "mlp"), _width_after(layer.linears, "shared_experts"), gate, experts,
            sum(1 for n in layer.norms if not n.is_qk_norm), any(n.is_qk_norm for n in layer.norms),
            sum(_numel(s) for _, s in layer.other_params), gated)


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


@lru_cache(maxsize=64)
def layer_kinds(model: ModelSpec) -> tuple[LayerKind, ...]:
    """The model's decoder layers grouped by kind, in order of first appearance."""
    found: dict[tuple, int] = {}
    for layer in model.description.layers:
        key = _kind_of(layer, model)
        found[key] = found.get(key, 0) + 1
    return tuple(LayerKind(count, *key) for key, count in found.items())


def describes(model: ModelSpec) -> tuple[bool, str]:
    """(whether the step-time model has terms for every layer of ``model``, why or why not), in one line."""
    d = model.description
    unknown = sorted({layer.attention for layer in d.layers} - set(ATTENTION_KINDS))
    if unknown:
        return False, f"attention of kind {', '.join(unknown)}: the step-time model has no term for it"
    la = d.linear_attention
    if any(layer.attention == "linear" for layer in d.layers) and (
            la is None or not (la.num_value_heads and la.key_head_dim and la.value_head_dim)):
        return False, ("a recurrent layer that is not Gated DeltaNet (no linear_num_value_heads / linear_key_head_dim "
                       "in the config): the step-time model has no term for it")
    if any(layer.attention == "mla" for layer in d.layers) and d.mla is None:
        return False, "latent attention without its widths in the config"
    for kind in layer_kinds(model):
        if kind.attention in ("full", "sliding") and "o_proj" not in kind.names() and "qkv_proj" not in kind.names():
            return False, f"attention modules the step-time model has no term for ({', '.join(kind.names())})"
        if not kind.mlp_width and not kind.experts and not kind.shared_width:
            return False, f"a layer without an MLP it knows ({', '.join(kind.names())})"
    parts = []
    if d.is_moe:
        parts.append(f"routed experts ({d.moe.num_experts}, top-{d.moe.experts_per_token})")
    kinds = d.attention_kinds()
    parts.append("attention " + ", ".join(f"{k} x{n}" for k, n in kinds.items()))
    return True, "; ".join(parts)


def adapted_linears(model: ModelSpec, adapted: tuple[str, ...]) -> tuple[str, ...]:
    """The linears of the plan's LoRA targets that the run really adapts: on a mixture of experts, the names peft
    would move to the stacked experts and the router are left out (advisor.runtime.build.lora_targets has the rule;
    architectures.yaml ``peft_moe_target_rewrite``)."""
    if not model.is_moe:
        return adapted
    moved = peft_moved_lora_names(model.model_type)
    return tuple(m for m in adapted if m not in moved)


def plan_adapts_experts(plan) -> bool:
    """Whether the plan puts LoRA on the stacked experts (peft ``target_parameters``: a ``lora.ParamWrapper`` per
    stack). The lever is the plan's ``lora_experts`` knob (issue 24's LoRA-on-experts lever); a plan without it
    adapts no expert."""
    return bool(getattr(plan, "peft", False) and getattr(plan, "lora_experts", False))
