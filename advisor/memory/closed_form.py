"""Which models the closed-form ledger (advisor.memory.training) describes, and who answers for the others.

The closed form has terms for dense decoder layers (attention q/k/v/o or a fused qkv, a gated MLP or a fused
gate_up, norms, optional q/k norms, a final soft-capping; sliding-window and local/global layers at any sequence,
their explicit masks counted once the sequence reaches the window), and for the mixtures of experts of
advisor.memory.experts.COVERED (Qwen3-MoE, OLMoE, Mixtral, gpt-oss, DeepSeek-V2-Lite: stacked experts, the
router, latent attention under sdpa, gpt-oss's sinks and windows, dense and shared-expert MLPs) under every lever
of the dense ledger. A model it cannot describe (another family of experts, linear attention, modules it
has no term for) is answered by the simulation instead: the real model code on fake tensors
(advisor.runtime.simulate), never by a wrong formula and never refused. ``closed_form_describes`` is the one rule
``advisor estimate``, ``tune`` and ``preflight`` follow (through the estimate backend); the output says which of
the two answered (``answered_by``).

The sliding-window terms, measured (closed form against the simulation, tensor peak, one sequence): Gemma-3-1B
(512-token window) at 2,048 tokens +0.09% (LoRA), -0.03% (full fine-tuning), +0.76% (full, eager); before the
sliding layers' mask bias and Gemma's fp32 norm products were counted, -1.3% and -5.1%.
"""

from __future__ import annotations

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan, has_vision_input
from advisor.memory.experts import COVERED, ROUTERS

CLOSED_FORM = "closed form"
SIMULATION = "simulation"

ATTENTION_LAYOUTS = (frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), frozenset({"qkv_proj", "o_proj"}))
"""The attention linears the closed form has terms for (training.layer_activation_bytes)."""
MLP_LAYOUTS = (frozenset({"gate_proj", "up_proj", "down_proj"}), frozenset({"gate_up_proj", "down_proj"}))
"""The gated MLP linears it has terms for."""
TOWERS_NOT_DESCRIBED = {
    "smolvlm": "SmolVLM's vision side (every tile's pixels, copied again where get_image_features drops padding "
               "images, and the connector's pixel shuffle into a bias-free projection): the closed form has terms "
               "for one crop's pixels and a merger's norm and linears",
}
"""Vision-language families whose tower and projector, run on an image, the closed form's vision terms
(advisor.memory.vision) do not describe; without an image their weights and trainable state are all it counts."""


def closed_form_describes(model: ModelSpec, plan: Plan | None = None) -> tuple[bool, str]:
    """(whether the closed-form ledger describes ``model`` under ``plan``, why or why not), in one line."""
    d = model.description
    if d.is_moe:
        return moe_described(model, plan)
    kinds = d.attention_kinds()
    linear = sum(1 for layer in d.layers if layer.attention == "linear")
    if linear:
        return False, (f"linear-attention layers ({linear} of {d.num_layers}, with a recurrent state): the closed form "
                       "has terms for softmax attention only")
    if any(layer.attention == "mla" for layer in d.layers):
        return False, "multi-head latent attention: the closed form has terms for q/k/v/o attention only"
    tower_gap = TOWERS_NOT_DESCRIBED.get(model.config.get("model_type", "")) if model.vision is not None else None
    if tower_gap and plan is not None and has_vision_input(plan):
        return False, tower_gap
    cross = model.vision.cross_attention_layers if model.vision is not None else ()
    if cross and plan is not None and has_vision_input(plan):
        return False, (f"cross-attention layers reading the image ({len(cross)} of {d.num_layers}): the closed form "
                       "has terms for self-attention only")
    # a plan without images: Mllama's cross-attention layers are loaded and skipped (tensors.idle_layers)
    if not d.homogeneous_except(frozenset(cross)):
        return False, ("decoder layers of different kinds ("
                       + ", ".join(f"{k} x{n}" for k, n in kinds.items()) + "): the closed form describes one layer")
    first = next(layer for layer in d.layers if layer.index not in cross)
    attention = frozenset(m.short for m in first.linears if m.role == "attention")
    mlp = frozenset(m.short for m in first.linears if m.role != "attention")
    if attention not in ATTENTION_LAYOUTS or mlp not in MLP_LAYOUTS:
        return False, (f"layer modules the closed form has no terms for ({', '.join(m.short for m in first.linears)})")
    if first.other_params:
        return False, ("layer parameters the closed form has no terms for ("
                       + ", ".join(name for name, _ in first.other_params) + ")")
    if cross:
        return True, (f"dense decoder layers the closed form describes; the {len(cross)} cross-attention layers are "
                      "skipped without an image (MllamaTextModel.forward): their weights only")
    return True, "dense decoder layers (attention, gated MLP, norms) the closed form describes"


def moe_described(model: ModelSpec, plan: Plan | None) -> tuple[bool, str]:
    """The rule for a mixture of experts: the families of advisor.memory.experts.COVERED, with their routers,
    attention (q/k/v/o with sdpa or eager, gpt-oss's eager with sinks, DeepSeek's latent attention with sdpa), and
    every lever of advisor.memory.training (the dense ledger's), but a full AdaLomo fine-tune."""
    d = model.description
    moe = d.moe
    share = d.params_by_category.get("experts", 0) / max(d.params_total, 1)
    what = f"a mixture of experts ({moe.num_experts} experts, top-{moe.experts_per_token}, {share:.0%} of the " \
           "parameters in stacked experts)"
    if model.model_type not in COVERED or model.model_type not in ROUTERS:
        return False, (f"{what} of a family ({model.model_type}) whose router and experts the closed form has no terms "
                       f"for (it covers {', '.join(COVERED)})")
    if any(layer.attention == "linear" for layer in d.layers):
        return False, f"{what} with linear-attention layers: the closed form has terms for softmax attention only"
    if moe.output_router_logits:
        return False, (f"{what} with the load-balancing loss on (output_router_logits): its router logits are not "
                       "counted")
    if d.mla is not None and d.mla.q_lora_rank:
        return False, (f"{what} with a compressed query (q_lora_rank): the closed form has terms for "
                       "DeepSeek-V2-Lite's MLA")
    if (model.config or {}).get("topk_method", "greedy") != "greedy":
        return False, f"{what} with group-limited routing: the closed form has terms for greedy top-k routing"
    if plan is not None:
        out = []
        if plan.optimizer == "adalomo" and plan.method == "full":
            # lomo_optim's AdaLomo factors a matrix's second moment and cannot broadcast it over a 3-D stack
            out.append("AdaLomo on the stacked experts (its factored moment is for matrices: the run fails)")
        if d.mla is not None and plan.attn_impl == "eager":
            out.append("eager latent attention")
        if out:
            return False, f"{what} with {', '.join(out)}: the mixture-of-experts closed form has no terms for it"
    return True, (f"{what}: expert weights as transformers stores them, routed activations of tokens x "
                  f"top-{moe.experts_per_token} rows, the router (advisor.memory.experts)")


RESIDENT_RESET = dict(loss="plain", optimizer="adamw_torch", offload="none", activation_offload=False,
                      checkpoint_layers=None, optimizer_in_backward=False, packing=False, dora=False)
"""Levers that move no weight on or off the GPU (DeepSpeed offload here is ZeRO-2's, of optimizer states)."""


def resident_weights_floor(model: ModelSpec, plan: Plan) -> int | None:
    """Bytes every plan like ``plan`` keeps on the GPU whatever its loss, optimizer and activation levers: the
    weights and their quantization constants, counted from the model's description for any kind of layer
    (advisor.memory.training.weight_bytes: the nn.Linears bitsandbytes converts, everything else in the compute
    dtype), so a lower bound that spares a simulation when the weights alone are over a budget, also for a plan
    or a model the closed form cannot answer. None: no floor known (ZeRO-3's and FSDP's offload move the weights)."""
    from advisor.memory.training import param_breakdown, weight_bytes

    if plan.offload in ("zero3_cpu", "fsdp_cpu"):
        return None
    reset = plan.with_(**RESIDENT_RESET)
    weights, consts = weight_bytes(model, reset, param_breakdown(model, reset))
    return weights + consts
