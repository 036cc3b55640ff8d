"""A model's description for the memory ledger, derived from transformers itself (issue 24, prototype).

The hand-written ``architectures.yaml`` says, per ``model_type``, which linear modules a decoder layer
has, how many norms, whether q/k are normed. Here the same facts (and those a mixture of experts or a
new attention scheme adds) are read off the real model class: ``describe_architecture`` builds the model
on the meta device from its config (no weights, no memory: ``torch.device("meta")``), walks one decoder
layer after another and classifies every parameter by the module that holds it:

- ``nn.Linear`` modules (what bitsandbytes replaces: ``transformers/integrations/bitsandbytes.py``
  ``replace_with_bnb_linear`` converts ``type(module) is nn.Linear`` only), with in/out features and bias;
- stacked expert parameters (3-D ``nn.Parameter``, experts x a x b, and their 2-D biases), which no
  quantizer of bitsandbytes touches;
- the router (a 2-D parameter with one row per expert, in a module that is not ``nn.Linear``);
- norms (1-D weights of a module whose class name ends in ``Norm``), and the rest (attention sinks,
  Gated DeltaNet's ``A_log`` / ``dt_bias`` / ``conv1d``).

The attention of each layer and what it keeps per token when serving is read from transformers' own
cache: a forward pass of the meta model with ``use_cache=True`` over 1 and 2 tokens fills one cache
layer per decoder layer (``DynamicLayer``: full attention, ``DynamicSlidingWindowLayer``: a window,
``LinearAttentionLayer``: a fixed recurrent state). Bytes per token are the difference between the two;
what does not grow is a fixed state per sequence. Multi-head latent attention (DeepSeek-V2/V3) caches the
compressed latent, not the heads (``deepseek_v2/modeling_deepseek_v2.py`` ``forward``: "Cache read / write
is performed while the latent KV is still compressed"), and the measured cache says so by itself.

Importing this module imports neither torch nor transformers (only ``describe_architecture`` does).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.core.errors import AdvisorInputError

CATEGORIES = ("embedding", "lm_head", "attention", "mlp", "shared_experts", "experts", "router", "norms", "other")
"""Where each parameter of the model goes (a tied output projection counts once, as ``embedding``)."""

ATTENTION_PREFIXES = ("self_attn", "attn", "attention", "linear_attn", "mixer", "self_attention")
"""First component of a module's path inside a decoder layer that marks it as the layer's attention."""


@dataclass(frozen=True)
class LinearModule:
    """One ``nn.Linear`` of a decoder layer."""

    name: str
    """Path inside the decoder layer (``self_attn.q_proj``, ``mlp.shared_expert.up_proj``)."""
    in_features: int
    out_features: int
    bias: bool
    role: str
    """attention, mlp, shared_experts or router (Qwen3-Next's ``shared_expert_gate`` is an nn.Linear)."""
    quantized_by_bnb: bool
    """bitsandbytes would replace it (``type(module) is nn.Linear`` and not in transformers'
    ``get_keys_to_not_convert``)."""

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ExpertParameter:
    """A stacked expert parameter: one slice per expert (``mlp.experts.gate_up_proj``)."""

    name: str
    shape: tuple[int, ...]
    """As stored: (experts, a, b) for weights, (experts, n) for biases."""
    in_features: int
    """Input width of one expert's matmul (0 for a bias)."""
    out_features: int
    """Output width of one expert's matmul (the bias length for a bias)."""
    transposed: bool
    """Stored (experts, in, out) (gpt-oss) rather than (experts, out, in) (``use_experts_implementation``'s
    ``is_transposed``)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class CacheLayer:
    """What one decoder layer keeps in transformers' cache when serving, per sequence."""

    kind: str
    """full, sliding, linear (a recurrent state) or mla (a compressed latent)."""
    bytes_per_token: int
    """Growth per token, in the model dtype (0 for a recurrent state)."""
    max_tokens: int | None
    """Tokens kept at most (a sliding window keeps ``window - 1``: ``DynamicSlidingWindowLayer``); None: all."""
    fixed_bytes: int
    """Bytes that do not grow with the sequence (Gated DeltaNet's conv and recurrent states, the latter fp32)."""
    cache_class: str


@dataclass(frozen=True)
class LayerDescription:
    """One decoder layer."""

    index: int
    attention: str
    """full, sliding, linear or mla."""
    sliding_window: int | None
    linears: tuple[LinearModule, ...]
    experts: tuple[ExpertParameter, ...]
    num_experts: int
    """Routed experts (0 for a dense layer)."""
    experts_per_token: int
    router_params: int
    norm_params: int
    norm_count: int
    other_params: tuple[tuple[str, tuple[int, ...]], ...]
    """Parameters that are neither linear, expert, router nor norm: (path, shape)."""
    cache: CacheLayer | None
    params: int
    """Every parameter of the layer."""

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) by short name, the shape of ``ModelSpec.linear_shapes()``."""
        return {m.short: (m.in_features, m.out_features) for m in self.linears}

    def category_params(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for m in self.linears:
            out[m.role] += m.in_features * m.out_features + (m.out_features if m.bias else 0)
        out["experts"] += sum(e.numel for e in self.experts)
        out["router"] += self.router_params
        out["norms"] += self.norm_params
        out["other"] += sum(_numel(s) for _, s in self.other_params)
        return out


@dataclass(frozen=True)
class ArchitectureDescription:
    """A decoder-only model as the ledger needs it, derived from a meta-device build."""

    model_type: str
    model_class: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype_bytes: int
    """Bytes per element the cache figures assume (the model's dtype)."""
    layers: tuple[LayerDescription, ...]
    embedding_params: int
    lm_head_params: int
    """0 when tied to the embedding."""
    final_norm_params: int
    params_total: int
    """Unique parameters (tied weights once), as ``sum(p.numel() for p in model.parameters())``."""
    params_by_category: dict[str, int] = field(default_factory=dict)
    experts_implementation: str | None = None
    """transformers' default experts implementation for this class (grouped_mm), None for a dense model."""
    attn_implementation: str | None = None
    """The attention transformers picks by default (gpt-oss: eager, since sdpa cannot add the sinks)."""
    final_logit_softcapping: float | None = None
    build_seconds: float = 0.0
    cache_seconds: float = 0.0

    @property
    def is_moe(self) -> bool:
        return any(layer.num_experts for layer in self.layers)

    def kv_cache_bytes(self, tokens: int) -> int:
        """Cache bytes of one sequence of ``tokens`` tokens, every layer (window caps and fixed states included)."""
        total = 0
        for layer in self.layers:
            c = layer.cache
            if c is None:
                continue
            kept = tokens if c.max_tokens is None else min(tokens, c.max_tokens)
            total += c.bytes_per_token * kept + c.fixed_bytes
        return total

    def kv_bytes_per_token_uncapped(self) -> int:
        """Sum over layers of the per-token growth, as if no window capped it (the dense formula's figure)."""
        return sum(layer.cache.bytes_per_token for layer in self.layers if layer.cache is not None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# --------------------------------------------------------------------------- building


def hf_config(config: Any, *, trust_remote_code: bool = False):
    """A transformers config from config.json fields (a dict) or a config object; the text model's config
    for a multimodal one (Gemma-3 4B-27B's ``text_config``)."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        cfg = config
    elif isinstance(config, dict):
        if "model_type" not in config:
            raise AdvisorInputError("--model", "config.json has no model_type", "", show_value=False)
        fields = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "dtype")}
        try:
            cfg = AutoConfig.for_model(config["model_type"], **fields)
        except (KeyError, ValueError) as e:
            raise AdvisorInputError("--model", f"transformers does not know model_type {config['model_type']!r} ({e})",
                                    config["model_type"]) from None
    else:
        raise AdvisorInputError("--model", "a config must be a dict of config.json fields or a transformers config",
                                type(config).__name__)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return text


def build_meta_model(config: Any, *, dtype: str = "bfloat16", num_layers: int | None = None,
                     trust_remote_code: bool = False):
    """The causal-LM model of ``config`` on the meta device (shapes and dtypes only, no memory)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(hf_config(config, trust_remote_code=trust_remote_code))
    if num_layers is not None:
        cfg.num_hidden_layers = num_layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types)[:num_layers]
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype),
                                                    trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise AdvisorInputError("--model", f"transformers cannot build {cfg.model_type} on the meta device ({e})",
                                cfg.model_type, show_value=False) from e


def decoder_layers(model):
    """The decoder layers (``model.model.layers`` for every causal LM of transformers 5 we know)."""
    import torch

    base = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    raise AdvisorInputError("--model", f"{type(model).__name__} has no decoder layers at .model.layers",
                            type(model).__name__, show_value=False)


# --------------------------------------------------------------------------- classification


def _role(path: str) -> str:
    head = path.split(".", 1)[0]
    if head in ATTENTION_PREFIXES:
        return "attention"
    if ".shared_expert" in f".{path}" or "shared_experts" in path:
        return "router" if path.endswith("shared_expert_gate") else "shared_experts"
    return "mlp"


def _experts_module_flags(module) -> tuple[bool, int]:
    """(stored transposed, number of experts) of a stacked-experts module."""
    transposed = bool(getattr(module, "is_transposed", False))
    n = getattr(module, "num_experts", None) or getattr(module, "num_local_experts", None) or 0
    return transposed, int(n)


def describe_layer(layer, index: int, *, not_converted: set[str], prefix: str, num_experts_hint: int,
                   top_k: int) -> LayerDescription:
    import torch

    linears: list[LinearModule] = []
    experts: list[ExpertParameter] = []
    router = norms = norm_count = 0
    others: list[tuple[str, tuple[int, ...]]] = []
    n_experts = 0
    for path, module in layer.named_modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        full = f"{prefix}.{path}" if path else prefix
        if isinstance(module, torch.nn.Linear):
            linears.append(LinearModule(
                name=path, in_features=module.in_features, out_features=module.out_features,
                bias=module.bias is not None, role=_role(path),
                quantized_by_bnb=type(module) is torch.nn.Linear and full not in not_converted))
            continue
        cls = type(module).__name__
        stacked = not isinstance(module, torch.nn.modules.conv._ConvNd) and any(p.dim() == 3 for _, p in own)
        if stacked:  # stacked experts: weights (E, a, b) and their biases (E, n)
            transposed, n = _experts_module_flags(module)
            n_experts = max(n_experts, n or own[0][1].shape[0])
            for name, p in own:
                shape = tuple(int(d) for d in p.shape)
                if p.dim() == 3:
                    a, b = shape[1], shape[2]
                    i, o = (a, b) if transposed else (b, a)
                else:
                    i, o = 0, shape[-1]
                experts.append(ExpertParameter(f"{path}.{name}", shape, i, o, transposed))
            continue
        if cls.endswith("Norm") or "RMSNorm" in cls or "LayerNorm" in cls:
            norms += sum(p.numel() for _, p in own)
            norm_count += 1
            continue
        rows = {int(p.shape[0]) for _, p in own if p.dim() >= 1}
        is_router = ("Router" in cls or path.endswith(".gate") or path.endswith(".router")) and (
            num_experts_hint in rows or n_experts in rows)
        if is_router:
            router += sum(p.numel() for _, p in own)
            continue
        others += [(f"{path}.{name}" if path else name, tuple(int(d) for d in p.shape)) for name, p in own]
    total = sum(p.numel() for p in layer.parameters())
    attn_kind, window = "full", None
    return LayerDescription(index=index, attention=attn_kind, sliding_window=window, linears=tuple(linears),
                            experts=tuple(experts), num_experts=n_experts,
                            experts_per_token=top_k if n_experts else 0, router_params=router,
                            norm_params=norms, norm_count=norm_count, other_params=tuple(others), cache=None,
                            params=total)


def keys_not_converted(model) -> set[str]:
    """The modules a quantizer of transformers leaves alone by default: tied weights, the module of the last
    parameter, the output embedding (transformers/quantizers/base.py ``get_keys_to_not_convert``, restated: importing
    ``transformers.quantizers`` imports torchao and costs ~3 s; tests/test_architecture_derivation.py checks that
    both agree)."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    keys = set(tied.values()) | set(tied.keys())
    keys.add(list(model.named_parameters())[-1][0])
    head = model.get_output_embeddings()
    keys |= {name for name, module in model.named_modules() if head is not None and module is head}
    return {k.removesuffix(".weight") for k in keys}


def _num_experts_of(cfg) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return 0


# --------------------------------------------------------------------------- the cache, measured on meta


def _cache_tensors(layer) -> tuple[int, dict[str, int]]:
    """(bytes, {name: bytes}) of the tensors one cache layer holds."""
    import torch

    found: dict[str, int] = {}
    for name, value in vars(layer).items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            found[name] = value.numel() * value.element_size()
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, torch.Tensor):
                    found[f"{name}[{k}]"] = v.numel() * v.element_size()
    return sum(found.values()), found


def measure_cache(model) -> list[CacheLayer]:
    """Run the meta model over 1 and 2 tokens with ``use_cache=True`` and read each cache layer's tensors."""
    import torch

    sizes = []
    classes = []
    windows = []
    for tokens in (1, 2):
        ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        layers = getattr(cache, "layers", None)
        if layers is None:
            raise AdvisorInputError("--model", f"{type(model).__name__} returned no layered cache", "",
                                    show_value=False)
        sizes.append([_cache_tensors(layer)[0] for layer in layers])
        classes = [type(layer).__name__ for layer in layers]
        windows = [getattr(layer, "sliding_window", None) for layer in layers]
    out_layers = []
    for one, two, cls, window in zip(sizes[0], sizes[1], classes, windows):
        per_token = two - one
        fixed = one - per_token
        if "Linear" in cls:
            kind = "linear"
        elif "Sliding" in cls or "Chunked" in cls:
            kind = "sliding"
        else:
            kind = "full"
        max_tokens = int(window) - 1 if kind == "sliding" and isinstance(window, int) else None
        out_layers.append(CacheLayer(kind=kind, bytes_per_token=int(per_token), max_tokens=max_tokens,
                                     fixed_bytes=int(fixed), cache_class=cls))
    return out_layers


def probe_cache(cfg, layer_types: list[str], num_layers: int, *, dtype: str = "bfloat16",
                trust_remote_code: bool = False) -> list[CacheLayer]:
    """The cache of every layer, measured on a meta model cut after the first layer of each kind
    (``config.layer_types``; one layer when the config has none): layers of one kind keep the same cache."""
    first: dict[str, int] = {}
    for i, t in enumerate(layer_types[:num_layers]):
        first.setdefault(t, i)
    probe_layers = max(first.values()) + 1 if first else 1
    model = build_meta_model(cfg, dtype=dtype, num_layers=probe_layers, trust_remote_code=trust_remote_code)
    measured = measure_cache(model)
    if not first:
        return [measured[0]] * num_layers
    return [measured[first[layer_types[i]]] for i in range(num_layers)]


# --------------------------------------------------------------------------- the description


def describe_architecture(config: Any, *, dtype: str = "bfloat16", with_cache: bool = True,
                          trust_remote_code: bool = False) -> ArchitectureDescription:
    """Everything the ledger needs to know of a model's structure, from a meta-device build of its config."""
    import dataclasses

    import torch

    cfg = hf_config(config, trust_remote_code=trust_remote_code)
    start = time.perf_counter()
    model = build_meta_model(cfg, dtype=dtype, trust_remote_code=trust_remote_code)
    build_seconds = time.perf_counter() - start
    layers = decoder_layers(model)
    layer_prefix = next(n for n, m in model.named_modules() if m is layers)
    not_converted = keys_not_converted(model)
    top_k = int(getattr(cfg, "num_experts_per_tok", 0) or getattr(cfg, "experts_per_token", 0) or 0)
    hint = _num_experts_of(cfg)
    described = [describe_layer(layer, i, not_converted=not_converted, prefix=f"{layer_prefix}.{i}",
                                num_experts_hint=hint, top_k=top_k) for i, layer in enumerate(layers)]

    cache_seconds = 0.0
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    if with_cache:
        start = time.perf_counter()
        cache = probe_cache(cfg, layer_types, len(described), dtype=dtype, trust_remote_code=trust_remote_code)
        cache_seconds = time.perf_counter() - start
    else:
        cache = [None] * len(described)
    window = getattr(cfg, "sliding_window", None)
    final = []
    for layer, module, c in zip(described, layers, cache):
        attn = getattr(module, "self_attn", None)
        kind = c.kind if c is not None else None
        if kind is None:  # no cache measured: the config's layer types
            t = layer_types[layer.index] if layer.index < len(layer_types) else "full_attention"
            kind = {"sliding_attention": "sliding", "linear_attention": "linear",
                    "chunked_attention": "sliding"}.get(t, "full")
        if attn is not None and hasattr(attn, "kv_a_proj_with_mqa"):
            kind = "mla"
            if c is not None:
                c = dataclasses.replace(c, kind="mla")
        final.append(dataclasses.replace(layer, attention=kind, sliding_window=window if kind == "sliding" else None,
                                         cache=c))

    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    embedding_params = embed.weight.numel()
    lm_head_params = 0 if tied or head is None else sum(p.numel() for p in head.parameters())
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    by_cat = dict.fromkeys(CATEGORIES, 0)
    for layer in final:
        for k, v in layer.category_params().items():
            by_cat[k] += v
    by_cat["embedding"] = embedding_params
    by_cat["lm_head"] = lm_head_params
    layer_params = sum(layer.params for layer in final)
    final_norm = total - layer_params - embedding_params - lm_head_params
    by_cat["norms"] += final_norm
    experts_impl = getattr(model.config, "_experts_implementation", None) if any(
        layer.num_experts for layer in final) else None
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return ArchitectureDescription(
        model_type=cfg.model_type, model_class=type(model).__name__, num_layers=len(final),
        hidden_size=int(cfg.hidden_size), vocab_size=int(embed.weight.shape[0]), tie_word_embeddings=tied,
        dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size(), layers=tuple(final),
        embedding_params=embedding_params, lm_head_params=lm_head_params, final_norm_params=final_norm,
        params_total=total, params_by_category=by_cat, experts_implementation=experts_impl,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        final_logit_softcapping=softcap, build_seconds=build_seconds, cache_seconds=cache_seconds)


def summary_rows(desc: ArchitectureDescription) -> list[tuple[str, str]]:
    """A short, printable summary (for benchmarks and reports)."""
    kinds: dict[str, int] = {}
    for layer in desc.layers:
        key = layer.attention + (f"({layer.sliding_window})" if layer.sliding_window else "")
        kinds[key] = kinds.get(key, 0) + 1
    first = desc.layers[0]
    moe = next((layer for layer in desc.layers if layer.num_experts), None)
    rows = [("class", desc.model_class), ("layers", str(desc.num_layers)),
            ("attention", ", ".join(f"{k} x{v}" for k, v in kinds.items())),
            ("vocab", f"{desc.vocab_size:,}" + (" (tied)" if desc.tie_word_embeddings else "")),
            ("params", f"{desc.params_total:,}")]
    if moe is not None:
        rows.append(("experts", f"{moe.num_experts} x top-{moe.experts_per_token}: "
                     + ", ".join(f"{e.name} {e.shape}" for e in moe.experts)))
    rows.append(("layer-0 linears", ", ".join(f"{m.name} {m.in_features}->{m.out_features}" for m in first.linears)))
    return rows
