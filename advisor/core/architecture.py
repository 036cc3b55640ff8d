"""A model's description for the memory ledger, derived from transformers itself (issue 24).

Nothing here is written per architecture. ``describe_architecture`` builds the model on the meta device from
its config (no weights, no memory: ``torch.device("meta")``), walks one decoder layer after another and
classifies every parameter by the module that holds it:

- ``nn.Linear`` modules (what bitsandbytes replaces: ``transformers/integrations/bitsandbytes.py``
  ``replace_with_bnb_linear`` converts ``type(module) is nn.Linear`` only), with in/out features, bias and role
  (attention, mlp, shared_experts, router), in the order the forward pass calls them;
- stacked expert parameters (3-D ``nn.Parameter``, experts x a x b, and their 2-D biases), which no
  quantizer of bitsandbytes touches;
- the router (a 2-D parameter with one row per expert, in a module that is not ``nn.Linear``);
- norms (the parameters of a module whose class name ends in ``Norm``), and the rest (attention sinks,
  Gated DeltaNet's ``A_log`` / ``dt_bias`` / ``conv1d``).

The attention of each layer and what it keeps per token when serving is read from transformers' own
cache: a forward pass of the meta model with ``use_cache=True`` over 1 and 2 tokens fills one cache
layer per decoder layer (``DynamicLayer``: full attention, ``DynamicSlidingWindowLayer``: a window,
``LinearAttentionLayer``: a fixed recurrent state). Bytes per token are the difference between the two;
what does not grow is a fixed state per sequence. Multi-head latent attention (DeepSeek-V2/V3) caches the
compressed latent, not the heads (``deepseek_v2/modeling_deepseek_v2.py`` ``forward``: "Cache read / write
is performed while the latent KV is still compressed"), and the measured cache says so by itself.

The model class says which attention kernels it accepts (``PreTrainedModel._supports_sdpa``,
``_supports_flash_attn``, ``_supports_flex_attn``: Gemma-2 and gpt-oss refuse sdpa in transformers 5, since sdpa
cannot soft-cap the scores or add the sinks) and which modules it keeps in fp32 (``_keep_in_fp32_modules_strict``:
DeepSeek-V2's router).

A description is stored, not rebuilt per call: ``advisor.core.architecture_store`` keeps the catalog's in a data
file and any other in the user cache. Importing this module imports neither torch nor transformers (only
``describe_architecture`` and the builders do).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.core.vision_architecture import Linear, VisionFacts

DESCRIPTION_VERSION = 1
"""Bumped whenever the description's fields or the way they are derived change (stored descriptions of another
version are derived again)."""

CATEGORIES = ("embedding", "lm_head", "attention", "mlp", "shared_experts", "experts", "router", "norms", "other")
"""Where each parameter of the model goes (a tied output projection counts once, as ``embedding``)."""

ATTENTION_PREFIXES = ("self_attn", "attn", "attention", "linear_attn", "mixer", "self_attention")
"""First component of a module's path inside a decoder layer that marks it as the layer's attention."""

QK_NORM_NAMES = ("q_norm", "k_norm", "query_norm", "key_norm")
"""Last component of the path of a norm over the queries / keys (Qwen3, Gemma-3, OLMoE)."""


@dataclass(frozen=True)
class LinearModule(Linear):
    """One ``nn.Linear`` of a decoder layer, by its path inside the layer (``self_attn.q_proj``,
    ``mlp.shared_expert.up_proj``)."""

    role: str
    """attention, mlp, shared_experts or router (Qwen3-Next's ``shared_expert_gate`` is an nn.Linear)."""
    quantized_by_bnb: bool
    """bitsandbytes would replace it (``type(module) is nn.Linear`` and not in transformers'
    ``get_keys_to_not_convert``)."""


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
        return _numel(self.shape)


@dataclass(frozen=True)
class NormModule:
    """One norm of a decoder layer."""

    name: str
    params: int
    """Its parameters (the width it normalizes for an RMSNorm or a LayerNorm without bias)."""

    @property
    def is_qk_norm(self) -> bool:
        """A norm over the queries or keys inside the attention (Qwen3's per-head, OLMoE's over all heads)."""
        return self.name.rsplit(".", 1)[-1] in QK_NORM_NAMES and self.name.split(".", 1)[0] in ATTENTION_PREFIXES


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
    """full, sliding, linear (Gated DeltaNet) or mla (multi-head latent attention)."""
    sliding_window: int | None
    """The window of a sliding-window layer (tokens), else None."""
    linears: tuple[LinearModule, ...]
    """In the order the layer's forward calls them (q, k, v before o; gate and up before down)."""
    experts: tuple[ExpertParameter, ...]
    num_experts: int
    """Routed experts (0 for a dense layer)."""
    experts_per_token: int
    """Experts each token is routed to (top-k; 0 for a dense layer)."""
    router_params: int
    router_dtype: str | None
    """dtype of the router's weight (float32 where the class keeps it so: DeepSeek-V2), None without a router."""
    norms: tuple[NormModule, ...]
    other_params: tuple[tuple[str, tuple[int, ...]], ...]
    """Parameters that are neither linear, expert, router nor norm: (path, shape)."""
    cache: CacheLayer | None
    params: int
    """Every parameter of the layer."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def norm_params(self) -> int:
        return sum(n.params for n in self.norms)

    @property
    def norm_count(self) -> int:
        return len(self.norms)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) by short name, the shape of ``ModelSpec.linear_shapes()``."""
        return {m.short: (m.in_features, m.out_features) for m in self.linears}

    def category_params(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for m in self.linears:
            out[m.role] += m.params
        out["experts"] += sum(e.numel for e in self.experts)
        out["router"] += self.router_params
        out["norms"] += self.norm_params
        out["other"] += sum(_numel(s) for _, s in self.other_params)
        return out

    def kind_key(self) -> tuple:
        """What makes two layers the same kind (everything but the index)."""
        return (self.attention, self.sliding_window, self.linears, self.experts, self.num_experts,
                self.experts_per_token, self.router_params, self.router_dtype, self.norms, self.other_params,
                self.cache, self.params)


@dataclass(frozen=True)
class MoeFacts:
    """A mixture of experts, as its config and its layers say."""

    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    """Width of one expert's MLP (the gate_up stack is 2x this)."""
    shared_expert_intermediate_size: int
    """Width of the always-on shared expert(s) MLP in total (0: none)."""
    dense_layers: tuple[int, ...]
    """Layers with a dense MLP instead of experts (DeepSeek's ``first_k_dense_replace``, Qwen's ``mlp_only_layers``)."""
    norm_topk_prob: bool | None
    output_router_logits: bool
    """The load-balancing loss is computed (config default False in every MoE class of transformers 5.24)."""
    router_aux_loss_coef: float | None


@dataclass(frozen=True)
class MlaFacts:
    """Multi-head latent attention (DeepSeek-V2/V3): the widths of the compressed query and key/value."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LinearAttentionFacts:
    """Gated DeltaNet layers (Qwen3-Next): heads and widths of the recurrent state."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int


@dataclass(frozen=True)
class ArchitectureDescription:
    """A decoder-only model as the ledger needs it, derived from a meta-device build."""

    model_type: str
    model_class: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    """The config's ``intermediate_size`` (the dense MLP's width; gpt-oss: one expert's)."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    """Rows of the embedding (what the model is built with, after the config class's defaults)."""
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str | None
    """The MLP's activation (``hidden_act`` or Gemma's ``hidden_activation``)."""
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
    """The attention transformers picks when none is asked for (gpt-oss, Gemma-2: eager, since sdpa cannot add
    the sinks or soft-cap the scores)."""
    supports_sdpa: bool = True
    supports_flash_attn: bool = True
    supports_flex_attn: bool = False
    keep_in_fp32_modules: tuple[str, ...] = ()
    """Modules the class keeps in fp32 whatever the dtype (``_keep_in_fp32_modules_strict``)."""
    final_logit_softcapping: float | None = None
    moe: MoeFacts | None = None
    mla: MlaFacts | None = None
    linear_attention: LinearAttentionFacts | None = None
    vision: VisionFacts | None = None
    """The vision tower and projector of a vision-language model (None: a text model). The counts above are the
    language model's alone."""
    transformers_version: str = ""
    build_seconds: float = field(default=0.0, compare=False)
    cache_seconds: float = field(default=0.0, compare=False)

    @property
    def is_moe(self) -> bool:
        return any(layer.num_experts for layer in self.layers)

    @property
    def homogeneous(self) -> bool:
        """Every decoder layer has the same modules and shapes (the attention kind may still alternate)."""
        return self.homogeneous_except(frozenset())

    def homogeneous_except(self, skip: frozenset[int]) -> bool:
        """``homogeneous`` over the decoder layers not in ``skip``."""
        run = [layer for layer in self.layers if layer.index not in skip]
        first = run[0]
        return all((layer.linears, layer.experts, layer.norms, layer.other_params)
                   == (first.linears, first.experts, first.norms, first.other_params) for layer in run)

    def attention_kinds(self) -> dict[str, int]:
        """Layers of each attention kind: full, sliding(window), linear, mla."""
        kinds: dict[str, int] = {}
        for layer in self.layers:
            key = layer.attention + (f"({layer.sliding_window})" if layer.sliding_window else "")
            kinds[key] = kinds.get(key, 0) + 1
        return kinds

    def layer_kinds(self) -> list[tuple[LayerDescription, tuple[int, ...]]]:
        """The distinct layers, each with the indices of the layers of its kind, in order of first appearance."""
        found: dict[tuple, tuple[LayerDescription, list[int]]] = {}
        for layer in self.layers:
            found.setdefault(layer.kind_key(), (layer, []))[1].append(layer.index)
        return [(layer, tuple(ix)) for layer, ix in found.values()]

    def supports_attention(self, impl: str) -> bool:
        """Whether the model class accepts ``attn_implementation=impl`` (eager always)."""
        if impl == "sdpa":
            return self.supports_sdpa
        if impl.startswith("flash_attention"):
            return self.supports_flash_attn
        if impl == "flex_attention":
            return self.supports_flex_attn
        return impl == "eager"

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

    # ------------------------------------------------------------------ stored form

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; the layers as their distinct kinds and the kind of each layer (``layer_pattern``)."""
        out: dict[str, Any] = {"description_version": DESCRIPTION_VERSION}
        for f in fields(self):
            if f.name in ("layers", "build_seconds", "cache_seconds"):
                continue
            out[f.name] = _plain(getattr(self, f.name))
        kinds = self.layer_kinds()
        pattern = [0] * self.num_layers
        for k, (_, indices) in enumerate(kinds):
            for i in indices:
                pattern[i] = k
        out["layer_kinds"] = [{k: v for k, v in _plain(layer).items() if k != "index"} for layer, _ in kinds]
        out["layer_pattern"] = pattern
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchitectureDescription:
        kinds = [_layer_from_dict(k) for k in d["layer_kinds"]]
        layers = tuple(_replace_index(kinds[k], i) for i, k in enumerate(d["layer_pattern"]))
        known = {f.name for f in fields(cls)} - {"layers", "build_seconds", "cache_seconds"}
        values = {k: v for k, v in d.items() if k in known}
        values["keep_in_fp32_modules"] = tuple(values.get("keep_in_fp32_modules") or ())
        values["params_by_category"] = dict(values.get("params_by_category") or {})
        for name, typ in (("moe", MoeFacts), ("mla", MlaFacts), ("linear_attention", LinearAttentionFacts)):
            if values.get(name) is not None:
                facts = dict(values[name])
                if name == "moe":
                    facts["dense_layers"] = tuple(facts["dense_layers"])
                values[name] = typ(**facts)
        if values.get("vision") is not None:
            values["vision"] = VisionFacts.from_dict(values["vision"])
        return cls(layers=layers, **values)


def _plain(value: Any) -> Any:
    """Dataclasses, tuples and dicts as JSON values (tuples become lists)."""
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _layer_from_dict(d: dict[str, Any]) -> LayerDescription:
    cache = d.get("cache")
    return LayerDescription(
        index=0, attention=d["attention"], sliding_window=d["sliding_window"],
        linears=tuple(LinearModule(**m) for m in d["linears"]),
        experts=tuple(ExpertParameter(**{**e, "shape": tuple(e["shape"])}) for e in d["experts"]),
        num_experts=d["num_experts"], experts_per_token=d["experts_per_token"], router_params=d["router_params"],
        router_dtype=d["router_dtype"], norms=tuple(NormModule(**n) for n in d["norms"]),
        other_params=tuple((name, tuple(shape)) for name, shape in d["other_params"]),
        cache=CacheLayer(**cache) if cache is not None else None, params=d["params"])


def _replace_index(layer: LayerDescription, index: int) -> LayerDescription:
    import dataclasses

    return dataclasses.replace(layer, index=index)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def config_key(config: dict[str, Any]) -> str:
    """A stable key of config.json fields (what a stored description is found by)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


# --------------------------------------------------------------------------- building


def config_object(config: dict[str, Any]):
    """A transformers config object from config.json fields (no files read, nothing downloaded). The fields are
    deep-copied: transformers edits nested ones in place (gpt-oss's rope_scaling), which would change the
    caller's config and so its config_key."""
    from transformers import AutoConfig

    if "model_type" not in config:
        raise AdvisorInputError("--model", "config.json has no model_type", "", show_value=False)
    fields_ = copy.deepcopy({k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "dtype")})
    try:
        return AutoConfig.for_model(config["model_type"], **fields_)
    except (KeyError, ValueError) as e:
        raise AdvisorInputError("--model", f"transformers does not know model_type {config['model_type']!r} ({e})",
                                config["model_type"]) from None


def hf_config(config: Any, *, trust_remote_code: bool = False):
    """A transformers config from config.json fields (a dict) or a config object; the text model's config
    for a multimodal one (Gemma-3 4B-27B's ``text_config``)."""
    from transformers import PretrainedConfig

    if isinstance(config, PretrainedConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = config_object(config)
    else:
        raise AdvisorInputError("--model", "a config must be a dict of config.json fields or a transformers config",
                                type(config).__name__)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def full_config(config: Any):
    """The transformers config of config.json fields (a dict) or a config object, as it is (a vision-language
    model's whole config, its ``text_config`` and ``vision_config`` inside)."""
    from transformers import PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    if isinstance(config, dict):
        return config_object(config)
    raise AdvisorInputError("--model", "a config must be a dict of config.json fields or a transformers config",
                            type(config).__name__)


def builds_as_causal_lm(model_type: str) -> bool:
    """transformers builds ``model_type`` with AutoModelForCausalLM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def is_vision_language(config: Any) -> bool:
    """The config is a vision-language model's (a ``vision_config`` and a class AutoModelForImageTextToText
    builds)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    cfg = full_config(config)
    return (getattr(cfg, "vision_config", None) is not None
            and cfg.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def build_meta_vl_model(config: Any, *, dtype: str = "bfloat16", num_layers: int | None = None):
    """The whole vision-language model of ``config`` (tower, projector, language model) on the meta device
    (AutoModelForImageTextToText), its language model cut to ``num_layers`` when given."""
    import torch
    from transformers import AutoModelForImageTextToText

    cfg = copy.deepcopy(full_config(config))
    if num_layers is not None:
        text = cfg.get_text_config()
        text.num_hidden_layers = num_layers
        if getattr(text, "layer_types", None):
            text.layer_types = list(text.layer_types)[:num_layers]
    try:
        with torch.device("meta"):
            return AutoModelForImageTextToText.from_config(cfg, dtype=getattr(torch, dtype))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise AdvisorInputError("--model", f"transformers cannot build {cfg.model_type} on the meta device ({e})",
                                cfg.model_type, show_value=False) from e


def build_meta_model(config: Any, *, dtype: str = "bfloat16", num_layers: int | None = None,
                     trust_remote_code: bool = False):
    """The causal-LM model of ``config`` on the meta device (shapes and dtypes only, no memory); a vision-language
    model whose language model transformers does not build alone (Qwen2-VL's, Qwen3-VL's) is built whole
    (``build_meta_vl_model``): its decoder, embedding and head are the same modules."""
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(config, dict) or "text_config" in config or "vision_config" in config:
        full = full_config(config)
        text = full.get_text_config() if hasattr(full, "get_text_config") else full
        if not builds_as_causal_lm(text.model_type) and is_vision_language(full):
            return build_meta_vl_model(full, dtype=dtype, num_layers=num_layers)
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
                   top_k: int, call_order: dict[str, int] | None = None) -> LayerDescription:
    import torch

    linears: list[LinearModule] = []
    experts: list[ExpertParameter] = []
    norms: list[NormModule] = []
    router = 0
    router_dtype = None
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
            norms.append(NormModule(path, sum(p.numel() for _, p in own)))
            continue
        rows = {int(p.shape[0]) for _, p in own if p.dim() >= 1}
        is_router = ("Router" in cls or path.endswith(".gate") or path.endswith(".router")) and (
            num_experts_hint in rows or n_experts in rows)
        if is_router:
            router += sum(p.numel() for _, p in own)
            router_dtype = str(own[0][1].dtype).removeprefix("torch.")
            continue
        others += [(f"{path}.{name}" if path else name, tuple(int(d) for d in p.shape)) for name, p in own]
    if call_order:
        # the order the forward calls them; modules it never called keep their place at the end
        registered = {m.name: i for i, m in enumerate(linears)}
        linears.sort(key=lambda m: (call_order.get(m.name, len(call_order) + registered[m.name]),))
    total = sum(p.numel() for p in layer.parameters())
    return LayerDescription(index=index, attention="full", sliding_window=None, linears=tuple(linears),
                            experts=tuple(experts), num_experts=n_experts,
                            experts_per_token=top_k if n_experts else 0, router_params=router,
                            router_dtype=router_dtype, norms=tuple(norms), other_params=tuple(others), cache=None,
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


def bnb_linear_names(model) -> list[str]:
    """Qualified names of the modules bitsandbytes replaces when transformers loads ``model`` with a
    BitsAndBytesConfig: ``type(module) is nn.Linear`` and not in ``get_keys_to_not_convert``
    (transformers/integrations/bitsandbytes.py ``replace_with_bnb_linear``); stacked experts and routers are
    not ``nn.Linear`` and stay in the compute dtype."""
    import torch

    skip = keys_not_converted(model)
    return [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and n not in skip]


def _num_experts_of(cfg) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return 0


# --------------------------------------------------------------------------- the cache and call order, on meta


def _cache_tensors(layer) -> tuple[int, dict[str, int]]:
    """(bytes, {name: bytes}) of the tensors one cache layer holds."""
    import torch

    found: dict[str, int] = {}
    for name, value in vars(layer).items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            continue  # a counter, not the cache (transformers 5.25 LinearAttentionLayer.cumulative_length_linear)
        if isinstance(value, torch.Tensor):
            found[name] = value.numel() * value.element_size()
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, torch.Tensor):
                    found[f"{name}[{k}]"] = v.numel() * v.element_size()
    return sum(found.values()), found


def run_meta_forward(model) -> tuple[list[CacheLayer], list[dict[str, int]]]:
    """Run the meta model over 1 and 2 tokens with ``use_cache=True``: each cache layer's tensors, and the order
    in which each decoder layer calls its ``nn.Linear`` modules ({path inside the layer: position})."""
    import torch

    layers = decoder_layers(model)
    order: list[dict[str, int]] = [{} for _ in layers]
    handles = []
    for i, layer in enumerate(layers):
        for path, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                def hook(_m, _args, i=i, path=path):
                    order[i].setdefault(path, len(order[i]))
                handles.append(module.register_forward_pre_hook(hook))
    sizes, classes, windows = [], [], []
    # a meta forward runs no kernel: transformers' note that flash-linear-attention is missing (hub_kernels.py) is noise
    kernels_log = logging.getLogger("transformers.integrations.hub_kernels")
    level = kernels_log.level
    kernels_log.setLevel(logging.ERROR)
    try:
        for tokens in (1, 2):
            ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True)
            cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
            cache_layers = getattr(cache, "layers", None)
            if cache_layers is None:
                raise AdvisorInputError("--model", f"{type(model).__name__} returned no layered cache", "",
                                        show_value=False)
            sizes.append([_cache_tensors(layer)[0] for layer in cache_layers])
            classes = [type(layer).__name__ for layer in cache_layers]
            windows = [getattr(layer, "sliding_window", None) for layer in cache_layers]
    finally:
        kernels_log.setLevel(level)
        for h in handles:
            h.remove()
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
    return out_layers, order


def probe_layers(cfg, layers, *, dtype: str = "bfloat16", trust_remote_code: bool = False
                 ) -> tuple[list[CacheLayer], list[dict[str, int]]]:
    """The cache and the call order of every layer, measured on a meta model cut after the first layer of each
    kind (its ``config.layer_types`` entry and its parameters' names, shapes and dtypes): layers of one kind keep
    the same cache and call their linears in the same order."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layer_types = list(getattr(text, "layer_types", None) or [])
    first: dict[tuple, int] = {}
    rep = []
    for i, layer in enumerate(layers):
        key = (layer_types[i] if i < len(layer_types) else None,
               tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters()))
        rep.append(first.setdefault(key, i))
    model = build_meta_model(cfg, dtype=dtype, num_layers=max(rep) + 1, trust_remote_code=trust_remote_code)
    cache, order = run_meta_forward(model)
    return [cache[r] for r in rep], [order[r] for r in rep]


# --------------------------------------------------------------------------- the description


def _cfg_int(cfg, *names: str, default: int = 0) -> int:
    for name in names:
        v = getattr(cfg, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _moe_facts(cfg, layers: list[LayerDescription]) -> MoeFacts | None:
    moe = [layer for layer in layers if layer.num_experts]
    if not moe:
        return None
    gate_up = next((e for e in moe[0].experts if e.in_features and "gate_up" in e.name), None)
    width = (gate_up.out_features // 2 if gate_up is not None
             else _cfg_int(cfg, "moe_intermediate_size", "intermediate_size"))
    shared = sum(m.out_features for m in moe[0].linears
                 if m.role == "shared_experts" and m.short in ("gate_proj", "w1"))
    aux = getattr(cfg, "router_aux_loss_coef", None)
    norm = getattr(cfg, "norm_topk_prob", None)
    return MoeFacts(num_experts=moe[0].num_experts, experts_per_token=moe[0].experts_per_token,
                    moe_intermediate_size=int(width), shared_expert_intermediate_size=int(shared),
                    dense_layers=tuple(layer.index for layer in layers if not layer.num_experts),
                    norm_topk_prob=bool(norm) if norm is not None else None,
                    output_router_logits=bool(getattr(cfg, "output_router_logits", False)),
                    router_aux_loss_coef=float(aux) if aux is not None else None)


def describe_architecture(config: Any, *, dtype: str = "bfloat16", with_cache: bool = True,
                          trust_remote_code: bool = False) -> ArchitectureDescription:
    """Everything the ledger needs to know of a model's structure, from a meta-device build of its config."""
    import dataclasses

    import torch
    import transformers

    cfg = hf_config(config, trust_remote_code=trust_remote_code)
    full = full_config(config) if isinstance(config, dict) else config
    vl = is_vision_language(full)
    build_from = full if vl else cfg
    start = time.perf_counter()
    model = build_meta_model(build_from, dtype=dtype, trust_remote_code=trust_remote_code)
    build_seconds = time.perf_counter() - start
    layers = decoder_layers(model)
    cache_seconds = 0.0
    if with_cache:
        start = time.perf_counter()
        cache, order = probe_layers(build_from, layers, dtype=dtype, trust_remote_code=trust_remote_code)
        cache_seconds = time.perf_counter() - start
    else:
        cache, order = [None] * len(layers), [{} for _ in layers]
    layer_prefix = next(n for n, m in model.named_modules() if m is layers)
    not_converted = keys_not_converted(model)
    top_k = int(getattr(cfg, "num_experts_per_tok", 0) or getattr(cfg, "experts_per_token", 0) or 0)
    hint = _num_experts_of(cfg)
    described = [describe_layer(layer, i, not_converted=not_converted, prefix=f"{layer_prefix}.{i}",
                                num_experts_hint=hint, top_k=top_k, call_order=order[i])
                 for i, layer in enumerate(layers)]

    layer_types = list(getattr(cfg, "layer_types", None) or [])
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
    vision = None
    if vl:  # the language model's parameters alone; the tower and projector are the vision facts
        from advisor.core.vision_architecture import describe_vision

        whole = model if hasattr(model, "get_decoder") and type(model).__name__.endswith("ConditionalGeneration") \
            else build_meta_vl_model(full, dtype=dtype, num_layers=1)
        vision = describe_vision(whole, full)
        params = list(model.get_decoder().parameters()) + ([] if head is None else list(head.parameters()))
    else:
        params = list(model.parameters())
    unique = {id(p): p for p in params}
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
    is_moe = any(layer.num_experts for layer in final)
    experts_impl = getattr(model.config, "_experts_implementation", None) if is_moe else None
    softcap = getattr(cfg, "final_logit_softcapping", None)
    heads = _cfg_int(cfg, "num_attention_heads")
    mla = None
    if any(layer.attention == "mla" for layer in final):
        q_rank = getattr(cfg, "q_lora_rank", None)
        mla = MlaFacts(kv_lora_rank=_cfg_int(cfg, "kv_lora_rank"), q_lora_rank=int(q_rank) if q_rank else None,
                       qk_nope_head_dim=_cfg_int(cfg, "qk_nope_head_dim"),
                       qk_rope_head_dim=_cfg_int(cfg, "qk_rope_head_dim"), v_head_dim=_cfg_int(cfg, "v_head_dim"))
    linear_attention = None
    if any(layer.attention == "linear" for layer in final):
        linear_attention = LinearAttentionFacts(
            num_key_heads=_cfg_int(cfg, "linear_num_key_heads"),
            num_value_heads=_cfg_int(cfg, "linear_num_value_heads"),
            key_head_dim=_cfg_int(cfg, "linear_key_head_dim"), value_head_dim=_cfg_int(cfg, "linear_value_head_dim"),
            conv_kernel=_cfg_int(cfg, "linear_conv_kernel_dim"))
    cls = type(model)
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
    return ArchitectureDescription(
        model_type=cfg.model_type, model_class=cls.__name__, num_layers=len(final),
        hidden_size=int(cfg.hidden_size), intermediate_size=_cfg_int(cfg, "intermediate_size"),
        num_heads=heads, num_kv_heads=_cfg_int(cfg, "num_key_value_heads", default=heads),
        head_dim=_cfg_int(cfg, "head_dim", default=int(cfg.hidden_size) // max(heads, 1)),
        vocab_size=int(embed.weight.shape[0]), max_position_embeddings=_cfg_int(cfg, "max_position_embeddings"),
        tie_word_embeddings=tied, hidden_act=str(act) if act else None,
        dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size(), layers=tuple(final),
        embedding_params=embedding_params, lm_head_params=lm_head_params, final_norm_params=final_norm,
        params_total=total, params_by_category=by_cat, experts_implementation=experts_impl,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        supports_sdpa=bool(getattr(cls, "_supports_sdpa", False)),
        supports_flash_attn=bool(getattr(cls, "_supports_flash_attn", False)),
        supports_flex_attn=bool(getattr(cls, "_supports_flex_attn", False)),
        keep_in_fp32_modules=tuple(sorted(getattr(cls, "_keep_in_fp32_modules_strict", None) or ())),
        final_logit_softcapping=float(softcap) if softcap else None, moe=_moe_facts(cfg, final), mla=mla,
        linear_attention=linear_attention, vision=vision, transformers_version=transformers.__version__,
        build_seconds=build_seconds, cache_seconds=cache_seconds)
