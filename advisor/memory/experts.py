"""The expert terms of the closed-form ledger: what a mixture of experts adds to one training step, bytes per category.

A mixture of experts differs from a dense model in what memory sees (reports/moe_findings.md, measured on the CPU
where the simulation equals real execution byte for byte):

- **Weights**: the routed experts are two stacked 3-D parameters per layer, not ``nn.Linear``: transformers +
  bitsandbytes leave them (and the router) in the compute dtype under 4- and 8-bit loading
  (transformers/integrations/bitsandbytes.py:189 converts ``type(module) is nn.Linear`` only); DeepSeek keeps
  its router in fp32 (``_keep_in_fp32_modules_strict``, deepseek_v2/modeling_deepseek_v2.py:483).
- **Routed activations**: ``grouped_mm_experts_forward`` (transformers/integrations/moe.py:424-537) works on the
  S = tokens x top-k (token, expert) pairs whatever the routing: every tensor it saves is S rows wide.
- **The router**: its softmax over the experts, the top-k indices and weights (the load-balancing loss is off by
  default: ``output_router_logits`` False in every MoE config of transformers 5.24).
- **LoRA on the experts** (``Plan.lora_experts``, peft ``target_parameters``): adapters rank r x experts per stack,
  and peft's ``_LoraFactorsProxy`` folds W + s*A@B into one bf16 stack per wrapped parameter
  (``torch.baddbmm``, peft/tuners/lora/layer.py:2323), which ``grouped_mm`` saves for backward.

The saved-tensor lists below were itemized from the simulation tracker's records of a traced step at real size
(the op that made each saved storage, its shape and dtype: ``python benchmarks/moe_saved_tensors.py``); each entry
cites the source line that saves it. The phases of the step, the optimizer states and every lever are the dense
ledger's (advisor.memory.training): a layer with routed experts, latent attention or sinks gets its saved tensors
here. The model families covered are ``COVERED``; others are answered by the simulation
(advisor.memory.closed_form).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.core.architecture import LayerDescription
from advisor.core.catalog import ModelSpec
from advisor.core.plan import DTYPE_BYTES, FLASH_ATTENTION, Plan

COVERED = ("qwen3_moe", "olmoe", "mixtral", "gpt_oss", "deepseek_v2")
"""Model types whose routers, experts and attention the closed form has terms for (each checked against the
simulation at real size in tests/test_analytic_vs_simulate.py)."""



@dataclass(frozen=True)
class Router:
    """What one model family's router and expert activation save (transformers 5.24)."""

    softmax_over_experts: bool
    """An fp32 softmax over every expert, saved (T x E); else top-k over the logits, then a softmax over the k."""
    renormalized: bool | None
    """The top-k weights are divided by their sum (an in-place division: a clone of the values and the sum saved);
    None: as the config's ``norm_topk_prob``."""
    weights_fp32: bool
    """The routing weights stay fp32 (not cast back to the logits' dtype)."""
    input_fp32: bool
    """The router casts its input to fp32 (its weight is fp32)."""
    gate_tensors: int
    """S x moe_intermediate tensors the experts' gated activation saves (besides the gate_up output)."""
    source: str
    gate_halves_saved: int = 2
    """Under an offload, the S x moe_intermediate copies in place of the gate_up output's one storage: its gate and
    up halves (views, each copied on its own) and any tensor saved twice (gpt-oss's clamped gate)."""


ROUTERS = {
    "qwen3_moe": Router(True, None, False, False, 1, "qwen3_moe/modeling_qwen3_moe.py:259-268 (router); "
                        "integrations/moe.py _apply_gate: act(gate) * up saves act's output and the gate_up output"),
    "olmoe": Router(True, None, False, False, 1, "olmoe/modeling_olmoe.py:327-336"),
    "mixtral": Router(True, True, True, False, 1, "mixtral/modeling_mixtral.py:104-111 (softmax of logits.float(), "
                      "divided by the sum, never cast back)"),
    "deepseek_v2": Router(True, False, True, True, 1, "deepseek_v2/modeling_deepseek_v2.py:98-117 (greedy top-k of "
                          "an fp32 softmax, scaled, fp32)"),
    "gpt_oss": Router(False, False, False, False, 4, "gpt_oss/modeling_gpt_oss.py:126-130 (top-k of the logits, "
                      "softmax over k in their dtype); :82-88 _apply_gate saves the clamped gate, sigmoid, glu and "
                      "up+1", gate_halves_saved=3),
}


def tokens(plan: Plan) -> int:
    return plan.micro_batch * plan.seq_len


def moe_intermediate(layer: LayerDescription) -> int:
    """One expert's MLP width: the down projection's input."""
    down = next(e for e in layer.experts if e.in_features and "down" in e.name)
    return down.in_features


def effective_attention(model: ModelSpec, plan: Plan) -> str:
    """The attention the step runs: the plan's where the class accepts it, else what transformers picks
    (advisor.runtime.build._attention; flash_attention_2 and _3 save what sdpa saves: q, k, v, the output and the
    log-sum-exp, advisor.core.plan.FLASH_ATTENTION)."""
    impl = "sdpa" if plan.attn_impl in FLASH_ATTENTION else plan.attn_impl
    if model.supports_attention(impl):
        return impl
    d = model.description
    return d.attn_implementation if d.attn_implementation and model.supports_attention(d.attn_implementation) \
        else "eager"


# --------------------------------------------------------------------------- parameters


def quantized_linear_params(model: ModelSpec) -> int:
    """Weights of the linears bitsandbytes replaces, every layer (``LinearModule.quantized_by_bnb``)."""
    return sum(m.in_features * m.out_features for layer in model.description.layers for m in layer.linears
               if m.quantized_by_bnb)


def fp32_router_params(model: ModelSpec) -> int:
    """Router parameters the class keeps in fp32 whatever the dtype (DeepSeek's ``gate.weight``)."""
    return sum(layer.router_params for layer in model.description.layers if layer.router_dtype == "float32")


# --------------------------------------------------------------------------- saved activations


def norm_saved(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """Each RMSNorm: an fp32 copy of its input and the rsqrt, one per token (or per head for Qwen3's per-head q/k
    norms), saved by pow / mul; the normalized input in the compute dtype too when its weight trains
    (transformers ``*RMSNorm.forward``: ``hidden_states.to(float32)``, ``torch.rsqrt``, ``self.weight * ...``)."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    out = []
    for n in layer.norms:
        short = n.name.rsplit(".", 1)[-1]
        width = n.params
        if n.is_qk_norm:
            width = model.q_dim if short.startswith(("q", "query")) else model.kv_dim
        groups = width // n.params
        out += [4 * T * width, 4 * T * groups] + ([p * T * width] if plan.method == "full" else [])
    return out


def attention_saved(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """What one layer's attention saves, by kind (the LoRA adapters' own tensors are ``lora_saved``)."""
    b, s, T = plan.micro_batch, plan.seq_len, tokens(plan)
    p = DTYPE_BYTES[plan.activation_dtype]
    H, qd, kvd = model.num_heads, model.q_dim, model.kv_dim
    full = plan.method == "full"
    out: list[int] = []
    if layer.attention == "mla":
        mla = model.description.mla
        dqk, dv, rank = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        if full:
            # the inputs of q_proj / kv_a_proj_with_mqa (the normed hidden state), of kv_b_proj (the normed latent)
            # and of o_proj (the output made contiguous), whose weights train (aten linear backward)
            out += [p * T * model.hidden_size, p * T * rank, p * T * H * dv]
        # q and k differ in width from v (192 vs 128): sdpa runs its math path, which upcasts to fp32 and saves the
        # scaled q, k, the fp32 softmax and v (aten _scaled_dot_product_attention_math; traced)
        return out + [4 * T * H * dqk, 4 * T * H * dqk, 4 * b * H * s * s, 4 * T * H * dv]
    if full:
        out.append(p * T * model.hidden_size)  # q/k/v's input, their weights train
    impl = effective_attention(model, plan)
    sinks = any(name.endswith("sinks") for name, _ in layer.other_params)
    if impl == "eager" and sinks:
        # gpt-oss eager_attention_forward (gpt_oss/modeling_gpt_oss.py:226-256): q after RoPE, k and v expanded to
        # every head (repeat_kv), the bf16 probabilities over s + 1 columns (the sink concatenated), the max's indices
        out += [p * T * qd, p * T * qd, p * T * qd, p * b * H * s * (s + 1), 8 * b * H * s]
        if full:
            out.append(p * T * qd)  # the output made contiguous for o_proj (reshape(...).contiguous())
        return out
    # q and k after RoPE, v, the output and the fp32 logsumexp (FlashAttention-2, Dao 2023 §3.1; sdpa)
    out += [p * T * qd, p * T * kvd, p * T * kvd, p * T * qd, 4 * b * H * s]
    if impl == "eager":
        # fp32 softmax and its bf16 copy, b x heads x s x s, and repeat_kv's k and v (eager_attention_forward)
        out += [4 * b * H * s * s, p * b * H * s * s, p * T * (qd - kvd), p * T * (qd - kvd)]
    return out


def lora_saved(plan: Plan, layer: LayerDescription, modules: list[str]) -> list[int]:
    """peft casts each adapted linear's input to the fp32 adapter dtype (one copy per module), lora_A saves it and
    lora_B saves A's output; a dropout mask of 1 byte per element (peft/tuners/lora/layer.py Linear.forward)."""
    T = tokens(plan)
    out = []
    for m in layer.linears:
        if m.short in modules:
            out += [4 * T * m.in_features, 4 * T * plan.lora_r] + ([T * m.in_features] if plan.lora_dropout > 0 else [])
    return out


def dense_mlp_saved(plan: Plan, width: int, trains: bool) -> list[int]:
    """A gated MLP of nn.Linears (DeepSeek's dense first layer and shared experts): the gate and up outputs and
    act(gate) (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``); down_proj's input when its weight trains."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    return [p * T * width] * 3 + ([p * T * width] if trains else [])


def routed_saved(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """The router and the routed experts of one layer, grouped_mm_experts_forward (integrations/moe.py:424-537)."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    E, k, h = layer.num_experts, layer.experts_per_token, model.hidden_size
    S = T * k
    width = moe_intermediate(layer)
    router = ROUTERS[model.model_type]
    moe = model.moe
    full = plan.method == "full"
    trains = full or (plan.peft and plan.lora_experts)
    out: list[int] = []
    if full and router.input_fp32:
        out.append(4 * T * h)  # the router's fp32 input (F.linear(hidden.float(), weight))
    if router.softmax_over_experts:
        out += [4 * T * E, 8 * T * k]  # softmax over the experts (fp32), the top-k indices (int64)
    else:
        out += [p * T * k, 8 * T * k]  # softmax over the top-k logits, the indices
    renorm = router.renormalized if router.renormalized is not None else bool(moe and moe.norm_topk_prob)
    if renorm:
        out += [4 * T * k, 4 * T]  # the in-place division's clone of the top-k values and their sum
    # perm // top_k (the gather's index), the sort's permutation, its inverse; the gathered routing weights; the
    # group offsets (int32 cumsum)
    out += [8 * S, 8 * S, 8 * S, (4 if router.weights_fp32 else p) * S, 4 * E]
    # the gate_up grouped_mm's output (the gated activation's input), the activation's saved outputs, and the
    # down grouped_mm's output (saved by the multiply by the routing weights)
    out += [p * S * 2 * width] + [p * S * width] * router.gate_tensors + [p * S * h]
    if trains:
        # grouped_mm saves its input when its weight trains: the gathered hidden states, the down projection's input
        out += [p * S * h, p * S * width]
    if plan.peft and plan.lora_experts:
        r = plan.lora_r
        for e in layer.experts:
            if e.in_features:
                # the folded stack W + s * A @ B (torch.baddbmm, peft layer.py:2323), saved by grouped_mm, and the
                # compute-dtype copies of A and B it was made from (get_delta_factors' .to(param.dtype))
                out += [p * e.numel, p * r * E * e.in_features, p * r * E * e.out_features]
    return out


def layer_saved_tensors(model: ModelSpec, plan: Plan, layer: LayerDescription, modules: list[str]) -> list[int]:
    """Every tensor one decoder layer saves for backward (no checkpointing), one entry per tensor."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    full = plan.method == "full"
    out = norm_saved(model, plan, layer) + attention_saved(model, plan, layer) + lora_saved(plan, layer, modules)
    mlp = [m for m in layer.linears if m.role in ("mlp", "shared_experts")]
    router = ROUTERS.get(model.model_type)
    if full and (mlp or (layer.num_experts and not router.input_fp32)):
        out.append(p * T * model.hidden_size)  # the MLP's input (the normed hidden state): its weights train
    if mlp:
        width = next(m.out_features for m in mlp if m.short in ("gate_proj", "up_proj", "w1", "w3"))
        out += dense_mlp_saved(plan, width, full)
    if layer.num_experts:
        out += routed_saved(model, plan, layer)
    return [x for x in out if x]


# --------------------------------------------------------------------------- an offload's copies per save


def norm_copies(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """Each RMSNorm saves its fp32 input and its rsqrt twice, pow and mean-then-rsqrt's mul both keeping them
    (transformers ``*RMSNorm.forward``: ``hidden_states.pow(2)`` saves the input, ``hidden_states *
    torch.rsqrt(variance + eps)`` saves both): a second copy of norm_saved's two; Gemma's norms save their fp32
    ``1 + weight`` as well (Gemma3RMSNorm.forward)."""

    T = tokens(plan)
    out = []
    for n in layer.norms:
        width = n.params
        if n.is_qk_norm:
            width = model.q_dim if n.name.rsplit(".", 1)[-1].startswith(("q", "query")) else model.kv_dim
        out += [4 * T * width, 4 * T * (width // n.params)]
        if model.model_type in FP32_NORM_WEIGHT:
            out.append(4 * n.params)  # Gemma's fp32 (1 + weight), saved by ``output * (1.0 + self.weight.float())``
    return out


def rope_copies(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """RoPE's cos and sin, made once before the layers, saved by each of the four multiplies of q and k
    (transformers ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``, the same for k), b x s x head_dim;
    gpt-oss rotates the two halves apart (``_apply_rotary_emb``: four multiplies each of q and k, by half-width cos
    and sin); latent attention multiplies q and k by one complex64 ``freqs_cis`` of rope_dim / 2 (DeepSeek-V2
    ``apply_rotary_emb``)."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    if layer.attention == "linear":
        return []
    if layer.attention == "mla":
        return [8 * T * (model.description.mla.qk_rope_head_dim // 2)] * 2
    if model.model_type == "gpt_oss":
        return [p * T * (model.head_dim // 2)] * 8
    return [p * T * model.head_dim] * 4


def attention_copies(model: ModelSpec, plan: Plan, layer: LayerDescription) -> tuple[list[int], list[int]]:
    """Where the attention's saves differ from its storages (attention_saved / the dense list): (copied, not
    copied). k and v are saved expanded to every head (repeat_kv) by eager attention, and by sdpa under an
    explicit mask (transformers sdpa_attention.use_gqa_in_sdpa: sdpa's enable_gqa only without one), in place of
    the unexpanded k and v; eager saves no logsumexp, and its output, a fresh ``.contiguous()`` copy, only where
    o_proj saves it (its weight trains)."""

    b, s, T, p = plan.micro_batch, plan.seq_len, tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    if layer.attention == "mla":
        # sdpa's math path: the fp32 probabilities saved by the softmax and by their matmul with v
        return [4 * b * model.num_heads * s * s], []
    if any(name.endswith("sinks") for name, _ in layer.other_params):
        # gpt-oss: the probabilities without the sink's column (``probs[..., :-1]``, a view) saved by the matmul
        return [p * b * model.num_heads * s * s], []
    if layer.attention == "linear":
        return [], []
    qd, kvd = model.q_dim, model.kv_dim
    if effective_attention(model, plan) == "eager":
        skipped = [p * T * kvd, p * T * kvd, p * T * (qd - kvd), p * T * (qd - kvd), 4 * b * model.num_heads * s]
        if plan.method != "full":
            skipped.append(p * T * qd)
        return [p * T * qd] * 2, skipped
    if sliding_mask_bytes(model, plan, layer) and kvd < qd:
        return [p * T * qd] * 2, [p * T * kvd] * 2
    return [], []


def trained_linear_copies(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """Full fine-tuning: each nn.Linear saves its input (aten linear backward, for its weight's gradient), so an
    input read by several linears (q/k/v, gate/up: linear_inputs) is saved once by each, and o_proj saves the
    attention output that sdpa / flash saved as well (eager's output is a fresh ``.contiguous()`` copy only
    o_proj saves)."""
    if plan.method != "full":
        return []

    p, T = DTYPE_BYTES[plan.activation_dtype], tokens(plan)
    out, seen = [], set()
    for m in layer.linears:
        if linear_input_of(m) in seen:
            out.append(p * T * m.in_features)
        seen.add(linear_input_of(m))
    if effective_attention(model, plan) != "eager" and any(m.short == "o_proj" for m in layer.linears):
        out.append(p * T * model.q_dim)
    return out


def routed_copies(model: ModelSpec, plan: Plan, layer: LayerDescription) -> tuple[list[int], list[int]]:
    """Routed experts under an offload, (copied, not copied): the gate_up output's halves in place of the output
    (Router.gate_halves_saved). The router weight's transposed view and the stacked expert weights' (grouped_mm reads
    them through ``transpose(-1, -2)``, integrations/moe.py ``_grouped_linear``) are on their parameters' storages:
    not copied; a LoRA-folded stack is a tensor of its own, already counted."""
    if not layer.num_experts:
        return [], []
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    router = ROUTERS[model.model_type]
    S, width = T * layer.experts_per_token, moe_intermediate(layer)
    # the router's and the stacks' transposed views are on their parameters' storages: not copied
    return [p * S * width] * router.gate_halves_saved, [p * S * 2 * width]


def offload_copies(model: ModelSpec, plan: Plan, layer: LayerDescription, modules: list[str]) -> list[int]:
    """What an offload copies beyond layer_saved_tensors' storages, one entry per extra save (the hook copies a
    tensor each time an op saves it; the GPU holds the storage once)."""
    # the transposed weight views F.linear and grouped_mm save (the base's, LoRA's, the router's and the expert
    # stacks') are on their parameters' storages, which the offload leaves (TRL's param_storages): not copies
    return norm_copies(model, plan, layer) + rope_copies(model, plan, layer) \
        + trained_linear_copies(model, plan, layer) + attention_copies(model, plan, layer)[0] \
        + routed_copies(model, plan, layer)[0]


def final_norm_copies(model: ModelSpec, plan: Plan) -> list[int]:
    """The decoder's final norm runs inside the offloaded decoder (its forward hooks wrap ``model.model``): its
    fp32 input and rsqrt, each saved twice, Gemma's fp32 ``1 + weight``, and the normalized input when its
    weight trains (transformers ``*RMSNorm.forward``, as norm_saved)."""

    T, h = tokens(plan), model.hidden_size
    out = [4 * T * h, 4 * T] * 2
    if model.model_type in FP32_NORM_WEIGHT:
        out.append(4 * h)
    if plan.method == "full":
        out.append(normalized_bytes(model, plan) * T * h)
    return out


def first_layer_uncopied(model: ModelSpec, plan: Plan, layer: LayerDescription, modules: list[str]) -> list[int]:
    """What the first decoder layer does not save when its input needs no gradient (a frozen embedding: every
    plan but full fine-tuning; trl/peft enable input gradients only for checkpointing): the saves kept for the
    input's gradient up to the first trainable weights, its input norm's fp32 input and rsqrt (both saves) and,
    for the linears that read the normed input, the adapters' dropout masks (autograd saves for an input's gradient
    only when the input requires one; the weights' transposed views it also skips are never copied)."""
    if plan.method == "full":
        return []

    T = tokens(plan)
    # the layer's own input norm (input_layernorm), not one inside the attention (q/k norms, MLA's kv_a_layernorm)
    first = next((n for n in layer.norms if "." not in n.name), None)
    out = [4 * T * first.params, 4 * T] * 2 if first else []
    readers = [m for m in layer.linears if linear_input_of(m) == linear_input_of(layer.linears[0])] \
        if layer.linears else []
    for m in readers:  # the weights' transposed views are never copied (offload_copies): only the dropout masks
        if m.short in modules and plan.lora_dropout > 0:
            out.append(T * m.in_features)
    return out


def offload_skipped(model: ModelSpec, plan: Plan, layer: LayerDescription) -> list[int]:
    """Storages of layer_saved_tensors that no hook copies as such (attention_copies', routed_copies' second
    lists)."""
    return attention_copies(model, plan, layer)[1] + routed_copies(model, plan, layer)[1]


def layer_backward_transient(model: ModelSpec, plan: Plan, layer: LayerDescription, modules: list[str]) -> int:
    """The most one layer's backward holds beyond the tensors it saved: the larger of two moments (traced).

    - The MLP's backward, with everything the layer saved alive. Routed experts: the gradients of the gate_up output
      and of the gated activation (S x 2I and S x I) with the input gradient of the down grouped_mm (S x I) (aten
      grouped_mm backward). With LoRA on the experts, grouped_mm's weight backward makes the gradient of a folded
      stack (its size, in the compute dtype) for baddbmm's backward (peft layer.py:2323): first the down stack's,
      with everything saved alive, then gate_up's once the down stack and its tensors are freed.
    - The attention's backward, once the MLP's saved tensors are freed: gpt-oss's eager attention makes softmax's
      backward output, the zeros the max's backward scatters into and the scatter's output, each
      b x heads x s x (s + 1) (aten _softmax_backward_data, max.dim backward); the same three sizes are alive in
      its forward (the concatenated logits, minus their max, plus the mask)."""
    T, p = tokens(plan), DTYPE_BYTES[plan.activation_dtype]
    h = model.hidden_size
    acts = sum(layer_saved_tensors(model, plan, layer, modules))
    attention_part = sum(norm_saved(model, plan, layer)) + sum(attention_saved(model, plan, layer)) + sum(
        lora_saved(plan, layer, [m.short for m in layer.linears if m.role == "attention" and m.short in modules]))
    attention_temp = 0
    if effective_attention(model, plan) == "eager" and any(n.endswith("sinks") for n, _ in layer.other_params):
        attention_temp = 3 * p * plan.micro_batch * model.num_heads * plan.seq_len * (plan.seq_len + 1)
    if not layer.num_experts:
        width = next((m.out_features for m in layer.linears if m.short in ("gate_proj", "up_proj")), h)
        mlp_temp = 2 * p * T * width
    else:
        S = T * layer.experts_per_token
        width = moe_intermediate(layer)
        mlp_temp = p * S * 2 * width + 2 * p * S * width
        if plan.peft and plan.lora_experts:
            stacks = {("down" if "down" in e.name else "gate_up"): p * e.numel for e in layer.experts if e.in_features}
            mlp_temp += max(stacks["down"], stacks["gate_up"] - stacks["down"])
    return max(mlp_temp, attention_part + attention_temp - acts)


def layers_saved(model: ModelSpec, plan: Plan, modules: list[str]) -> tuple[int, int, int]:
    """(every layer's saved bytes, the largest layer's, the largest layer backward transient)."""
    total = biggest = temp = 0
    for layer, indices in model.description.layer_kinds():
        acts = sum(layer_saved_tensors(model, plan, layer, modules))
        total += acts * len(indices)
        biggest = max(biggest, acts)
        temp = max(temp, layer_backward_transient(model, plan, layer, modules))
    return total, biggest, temp


def mlp_forward_bytes(model: ModelSpec, plan: Plan, T: int) -> int:
    """The largest MLP temporaries of a no-grad forward of T tokens (evaluation, prefill): routed experts hold the
    gathered input, the gate_up output and the activation's output, S = T x top-k rows each
    (grouped_mm_experts_forward, integrations/moe.py:424-537); a dense or shared MLP its gate, act(gate) and up."""
    p = DTYPE_BYTES[plan.activation_dtype]
    h = model.hidden_size
    out = 0
    for layer, _ in model.description.layer_kinds():
        dense = [m.out_features for m in layer.linears if m.role in ("mlp", "shared_experts")
                 and m.short in ("gate_proj", "up_proj")]
        held = 3 * p * T * max(dense, default=0)
        if layer.num_experts:
            S = T * layer.experts_per_token
            held = max(held, p * S * (h + 3 * moe_intermediate(layer)))
        out = max(out, held)
    return out


def router_note(model: ModelSpec) -> str:
    """One line on what the router adds and leaves out."""
    moe = model.moe
    aux = ("the load-balancing loss is on (output_router_logits): every layer's router logits are kept, T x E"
           if moe.output_router_logits else
           "the load-balancing auxiliary loss is off (output_router_logits False, the config default), so no "
           "router logits are kept past their layer")
    return (f"mixture of experts: {moe.num_experts} experts, top-{moe.experts_per_token}; the routed activations are "
            f"tokens x {moe.experts_per_token} rows (grouped_mm, whatever the routing); {aux}")


SHARED_INPUT = ("q_proj", "k_proj", "v_proj", "qkv_proj", "kv_a_proj_with_mqa", "q_a_proj", "gate_proj", "up_proj",
                "gate_up_proj", "w1", "w3")
"""Linears that read their block's input (the normed hidden state) rather than a tensor of their own."""


def linear_input_of(m) -> str:
    """The name of the tensor a linear reads: ``<block>.in`` for those of SHARED_INPUT, else ``<block>.<name>``."""
    return f"{m.name.rsplit('.', 1)[0]}.{'in' if m.short in SHARED_INPUT else m.short}"


FP32_NORM_WEIGHT = ("gemma", "gemma2", "gemma3", "gemma3_text")
"""Model types whose RMSNorm multiplies by (1 + weight) in fp32 before casting back (transformers
Gemma3RMSNorm.forward: ``output * (1.0 + self.weight.float())``, then ``.type_as(x)``): the normalized input a
trained norm weight saves is fp32."""


def normalized_bytes(model: ModelSpec, plan: Plan) -> int:
    """Bytes per element of the normalized input a norm saves when its weight trains (full fine-tuning)."""
    return 4 if model.model_type in FP32_NORM_WEIGHT else DTYPE_BYTES[plan.activation_dtype]


def sliding_window_applies(plan: Plan, layer: LayerDescription) -> bool:
    """A sliding-window layer whose window the sequence reaches: its mask is no longer the plain causal one, so
    transformers builds it explicitly (masking_utils.sliding_window_causal_mask; _ignore_causal_mask_sdpa skips
    only a causal mask, and a window shorter than the sequence is not)."""
    return layer.attention == "sliding" and bool(layer.sliding_window) and plan.seq_len >= layer.sliding_window


def sliding_mask_bytes(model: ModelSpec, plan: Plan, layer: LayerDescription) -> int:
    """What a sliding-window layer under sdpa saves for its explicit mask: the boolean mask made an additive bias
    in the compute dtype, b x 1 x s x s (aten scaled_dot_product_attention: ``where(mask, 0, -inf)`` in
    convert_boolean_attn_mask, saved by the kernel for backward; traced on Gemma-3). Eager adds its float mask
    to the scores, which saves nothing (eager_attention_forward)."""
    if effective_attention(model, plan) == "eager" or plan.packing or not sliding_window_applies(plan, layer):
        return 0  # packed documents: every layer's explicit mask is loss_dora_packing.packed_layer_bytes
    return DTYPE_BYTES[plan.activation_dtype] * plan.micro_batch * plan.seq_len ** 2
