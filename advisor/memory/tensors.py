"""The model's parameter tensors and the trainable ones, shape by shape, read from its description.

What per-tensor memory is allocated for: optimizer states (each optimizer keeps its state per parameter tensor,
torch/optim/optimizer.py ``state[p]``), DeepSpeed's host buffers, the step inside backward. One list for dense
layers and mixtures of experts alike: every decoder layer's linears, biases, stacked experts, router, norms and
other parameters (advisor.core.architecture.LayerDescription), then the embedding, the final norm and an untied
output head.
"""

from __future__ import annotations

from advisor.core.catalog import ModelSpec
from advisor.core.plan import Plan, has_vision_input

Shape = tuple[int, ...]


def idle_layers(model: ModelSpec, plan: Plan) -> frozenset[int]:
    """The decoder layers a training step never calls: Mllama's cross-attention layers when the sample holds no
    image (transformers MllamaTextModel.forward skips a cross-attention layer without cross_attention_states).
    Their weights and adapters are loaded; they save nothing, and their parameters get no gradient, so no
    optimizer state either (torch.optim and bitsandbytes step only a parameter whose ``grad`` is not None)."""
    v = model.vision
    if v is None or not v.cross_attention_layers or has_vision_input(plan):
        return frozenset()
    return frozenset(v.cross_attention_layers)


def run_layer_kinds(model: ModelSpec, plan: Plan) -> list:
    """``ArchitectureDescription.layer_kinds`` over the layers the step calls: (layer, its indices) of each kind
    with at least one layer that is not in ``idle_layers``."""
    idle = idle_layers(model, plan)
    kinds = [(layer, [ix for ix in indices if ix not in idle]) for layer, indices in model.description.layer_kinds()]
    return [(layer, indices) for layer, indices in kinds if indices]


NF4_BLOCK = 64
"""Values per absmax block of 4-bit (NF4/FP4) weights: bitsandbytes' default, which transformers' BitsAndBytesConfig
keeps (``Params4bit`` and ``functional.quantize_4bit`` turn ``blocksize=None`` into 64, bitsandbytes 0.50
nn/modules.py and functional.py). The ledger, the load phase and the simulation's stand-ins all use this one."""
DQ_BLOCK = 256
"""Absmax values per fp32 constant under double quantization: ``quantize_4bit(compress_statistics=True)``
quantizes the absmax with ``quantize_blockwise(..., blocksize=256)`` (bitsandbytes 0.50 functional.py)."""


def four_bit_constant_bytes(quantized_params: float, plan: Plan) -> int:
    """Bytes of bitsandbytes' 4-bit quantization constants for this many quantized weights: one fp32 absmax per
    64-value block (Dettmers et al. 2023, QLoRA §3); with double quantization the absmax as 8-bit plus one fp32
    constant per 256 absmax (QLoRA §3 "Double Quantization")."""
    blocks = quantized_params / NF4_BLOCK
    return int(blocks * 1 + blocks / DQ_BLOCK * 4 if plan.double_quant else blocks * 4)


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def param_shapes(model: ModelSpec, skip: frozenset[int] = frozenset()) -> list[Shape]:
    """Every parameter tensor of the model: (out, in) per linear (nn.Linear.weight), (out,) per bias, each expert
    stack as stored, the router (experts x hidden), every norm's weight, the rest (sinks, convolutions) as
    stored; the embedding (vocab x hidden), the final norm, an untied head. ``skip``: decoder layers left out."""
    d = model.description
    out: list[Shape] = []
    for layer in d.layers:
        if layer.index in skip:
            continue
        for m in layer.linears:
            out.append((m.out_features, m.in_features))
            if m.bias:
                out.append((m.out_features,))
        out += [e.shape for e in layer.experts]
        if layer.router_params:
            out.append((layer.num_experts, layer.router_params // max(layer.num_experts, 1)))
        out += [(n.params,) for n in layer.norms]
        out += [tuple(s) for _, s in layer.other_params]
    out.append((model.vocab_size, d.embedding_params // max(model.vocab_size, 1)))
    if d.final_norm_params:
        out.append((d.final_norm_params,))
    if d.lm_head_params:
        out.append((model.vocab_size, d.lm_head_params // max(model.vocab_size, 1)))
    return out


def adapter_shapes(model: ModelSpec, plan: Plan, modules: list[str] | tuple[str, ...],
                   skip: frozenset[int] = frozenset()) -> list[Shape]:
    """The LoRA tensors: A (r x in) and B (out x r) per adapted linear and layer (peft/tuners/lora/layer.py
    update_layer), DoRA's magnitude (out,) per adapted linear (peft DoraLinearLayer), and with ``lora_experts`` a
    ParamWrapper's A (r*E x in) and B (out x r*E) per expert stack (peft/tuners/lora/layer.py:2455-2456)."""
    if not plan.peft:
        return []
    r = plan.lora_r
    out: list[Shape] = []
    for layer in model.description.layers:
        if layer.index in skip:
            continue
        for m in layer.linears:
            if m.short in modules:
                out += [(r, m.in_features), (m.out_features, r)] + ([(m.out_features,)] if plan.dora else [])
        if plan.lora_experts:
            for e in layer.experts:
                if e.in_features:
                    out += [(r * layer.num_experts, e.in_features), (e.out_features, r * layer.num_experts)]
    return out


def trainable_shapes(model: ModelSpec, plan: Plan, modules: list[str] | tuple[str, ...],
                     skip: frozenset[int] = frozenset()) -> list[Shape]:
    """The trainable tensors: the adapters under PEFT, every parameter in a full fine-tune (``skip``: decoder
    layers left out, such as ``idle_layers``, whose tensors the optimizer never steps)."""
    return adapter_shapes(model, plan, modules, skip) if plan.peft else param_shapes(model, skip)


def trainable_sizes(model: ModelSpec, plan: Plan, modules: list[str] | tuple[str, ...],
                    skip: frozenset[int] = frozenset()) -> list[int]:
    """Elements of each trainable tensor."""
    return [numel(s) for s in trainable_shapes(model, plan, modules, skip)]
