"""The vision tower and projector of a vision-language model, derived from a meta-device build of the whole model.

transformers 5 builds every vision-language class we catalogue as ``model.model.<tower>`` beside
``model.model.language_model`` (``visual`` for Qwen2-VL / Qwen2.5-VL / Qwen3-VL, whose merger sits inside it;
``vision_tower`` + ``multi_modal_projector`` for Gemma 3, LLaVA-OneVision, Mistral-3, InternVL; ``vision_model`` +
``multi_modal_projector`` for Mllama, + ``connector`` for SmolVLM). Nothing here is written per family: the tower's
blocks are its longest ``nn.ModuleList``, a block's ``nn.Linear`` modules are read as they are, and the projector is
every module the model names as one (``PROJECTOR_NAMES``).

What the config says that the build cannot (the patch, the merge, the window blocks, the image size, the tokens per
image) is read from the config object, field by field, with the field named beside each.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

PROJECTOR_NAMES = ("merger", "deepstack_merger_list", "multi_modal_projector", "connector", "mlp1")
"""Child modules that map the tower's features into the language model's width (Qwen's ``visual.merger`` and
Qwen3-VL's ``visual.deepstack_merger_list``; ``model.multi_modal_projector`` elsewhere; SmolVLM's ``connector``)."""


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear``: its path, its shape and whether it has a bias."""

    name: str
    """Its path (inside a decoder layer or a tower block: ``self_attn.q_proj``, ``attn.qkv``; or inside the model)."""
    in_features: int
    out_features: int
    bias: bool

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class VisionLinear(Linear):
    """One ``nn.Linear`` of a tower block (``attn.qkv``, ``mlp.fc1``) or of the projector, by its path inside the
    model (``model.visual.merger.mlp.0``)."""


@dataclass(frozen=True)
class VisionFacts:
    """A vision tower and its projector, as memory and time planning need them."""

    model_class: str
    """The whole model's class (``Qwen2_5_VLForConditionalGeneration``)."""
    tower_path: str
    """Where the tower sits (``model.visual``)."""
    tower_class: str
    tower_params: int
    """Parameters of the tower, the projector left out."""
    projector_params: int
    """Parameters of the projector / merger (Qwen3-VL's deepstack mergers included)."""
    depth: int
    """Blocks of the tower."""
    hidden_size: int
    """The tower's width."""
    num_heads: int
    intermediate_size: int
    """Width of a block's MLP."""
    block_params: int
    """Parameters of one block (the first)."""
    block_linears: tuple[VisionLinear, ...]
    """A block's ``nn.Linear`` modules, as built."""
    block_norms: int
    """Norm modules in a block (each holds a width-wide activation in backward)."""
    projector_linears: tuple[VisionLinear, ...]
    hidden_act: str | None
    patch_size: int
    """Pixels per patch side (``vision_config.patch_size``)."""
    spatial_merge_size: int
    """Patches merged per side into one language-model token (Qwen: 2; 1 where the projector pools instead)."""
    temporal_patch_size: int
    """Frames per patch (Qwen: 2, an image is repeated to fill it; 1 elsewhere)."""
    in_channels: int
    image_size: int | None
    """A fixed input resolution (SigLIP's 896: every image is resized to it); None: dynamic resolution."""
    tokens_per_image: int | None
    """Language-model tokens per image when fixed (Gemma 3's ``mm_tokens_per_image``); None: from the grid."""
    full_attention_blocks: tuple[int, ...] | None
    """Blocks that attend over the whole image where the others attend within windows (Qwen2.5-VL's
    ``fullatt_block_indexes``); None: every block attends over the whole image."""
    window_size: int | None
    """Window side in pixels of the windowed blocks (Qwen2.5-VL's ``window_size``: 112, 8x8 patches)."""
    deepstack_layers: tuple[int, ...]
    """Blocks whose features feed extra mergers into the first decoder layers (Qwen3-VL)."""
    cross_attention_layers: tuple[int, ...]
    """Decoder layers that read the image by cross-attention (Llama-3.2-Vision); empty: image tokens in the text."""
    tower_supports_flash_attn: bool
    tower_supports_sdpa: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // max(self.num_heads, 1)

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("block_linears", "projector_linears"):
                v = [vars(m) for m in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VisionFacts:
        known = {f.name for f in fields(cls)}
        v = {k: val for k, val in d.items() if k in known}
        for name in ("block_linears", "projector_linears"):
            v[name] = tuple(VisionLinear(**m) for m in v.get(name) or ())
        for name in ("deepstack_layers", "cross_attention_layers"):
            v[name] = tuple(v.get(name) or ())
        if v.get("full_attention_blocks") is not None:
            v["full_attention_blocks"] = tuple(v["full_attention_blocks"])
        return cls(**v)


def _int(cfg, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, (list, tuple)) and value:  # InternViT's [448, 448] and [14, 14]
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _tower_and_projectors(model):
    """(path, tower module) and [(path, projector module)] of a vision-language model built by transformers."""
    import torch

    base = getattr(model, "model", model)
    tower = None
    projectors = []
    for name, child in base.named_children():
        if name == "language_model":
            continue
        if name in PROJECTOR_NAMES:
            projectors.append((f"model.{name}", child))
        elif tower is None and sum(p.numel() for p in child.parameters()) > 0:
            tower = (f"model.{name}", child)
    if tower is None:
        return None, []
    for name, child in tower[1].named_children():
        if name in PROJECTOR_NAMES:
            projectors.append((f"{tower[0]}.{name}", child))
    del torch
    return tower, projectors


def _blocks(tower):
    """The tower's blocks: its longest ``nn.ModuleList`` of identical modules (``blocks``, ``encoder.layers``)."""
    import torch

    best = None
    for name, module in tower.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and "merger" not in name:
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    return best


def describe_vision(model, config) -> VisionFacts | None:
    """The tower and projector of ``model`` (a vision-language model on the meta device) and what ``config`` (its
    transformers config) says of them; None for a model without a tower."""
    import torch

    vcfg = getattr(config, "vision_config", None)
    if vcfg is None:
        return None
    tower, projectors = _tower_and_projectors(model)
    if tower is None:
        return None
    tower_path, tower_module = tower
    projector_ids = {id(p) for _, m in projectors for p in m.parameters()}
    tower_params = sum(p.numel() for p in tower_module.parameters() if id(p) not in projector_ids)
    projector_params = sum(p.numel() for _, m in projectors for p in m.parameters())
    # parameters the model holds outside any child: LLaVA-OneVision's image_newline (the vector closing each row of
    # image features), counted with the projector (what maps the tower's features into the language model)
    projector_params += sum(p.numel() for p in getattr(model, "model", model).parameters(recurse=False))
    found = _blocks(tower_module)
    if found is None:
        return None
    _, blocks = found
    first = blocks[0]
    linears = tuple(VisionLinear(n, m.in_features, m.out_features, m.bias is not None)
                    for n, m in first.named_modules() if isinstance(m, torch.nn.Linear))
    norms = sum(1 for _, m in first.named_modules()
                if type(m).__name__.endswith("Norm") and any(True for _ in m.parameters(recurse=False)))
    proj_linears = tuple(VisionLinear(f"{path}.{n}" if n else path, m.in_features, m.out_features, m.bias is not None)
                         for path, mod in projectors for n, m in mod.named_modules() if isinstance(m, torch.nn.Linear))
    width = _int(vcfg, "embed_dim", "hidden_size")
    mlp = [m for m in linears if m.in_features == width and m.out_features not in (width, 3 * width)]
    intermediate = mlp[0].out_features if mlp else _int(vcfg, "intermediate_size")
    full_blocks = getattr(vcfg, "fullatt_block_indexes", None)
    window = getattr(vcfg, "window_size", None) if full_blocks else None
    image_size = _int(vcfg, "image_size", default=0) or None
    dynamic = hasattr(vcfg, "spatial_merge_size") or hasattr(vcfg, "temporal_patch_size")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cross = tuple(getattr(text, "cross_attention_layers", None) or ())
    tokens = getattr(config, "mm_tokens_per_image", None)
    act = getattr(vcfg, "hidden_act", None)
    tower_cls = type(tower_module)
    return VisionFacts(
        model_class=type(model).__name__, tower_path=tower_path, tower_class=tower_cls.__name__,
        tower_params=int(tower_params), projector_params=int(projector_params), depth=len(blocks),
        hidden_size=width, num_heads=_int(vcfg, "num_heads", "num_attention_heads"),
        intermediate_size=int(intermediate),
        block_params=sum(p.numel() for p in first.parameters()), block_linears=linears, block_norms=norms,
        projector_linears=proj_linears, hidden_act=str(act) if act else None,
        patch_size=_int(vcfg, "patch_size", default=14), spatial_merge_size=_int(vcfg, "spatial_merge_size", default=1),
        temporal_patch_size=_int(vcfg, "temporal_patch_size", default=1),
        in_channels=_int(vcfg, "in_channels", "in_chans", "num_channels", default=3),
        image_size=None if dynamic or not isinstance(image_size, int) else int(image_size),
        tokens_per_image=int(tokens) if isinstance(tokens, int) else None,
        full_attention_blocks=tuple(int(i) for i in full_blocks) if full_blocks else None,
        window_size=int(window) if isinstance(window, int) else None,
        deepstack_layers=tuple(int(i) for i in (getattr(vcfg, "deepstack_visual_indexes", None) or ())),
        cross_attention_layers=tuple(int(i) for i in cross),
        tower_supports_flash_attn=bool(getattr(tower_cls, "_supports_flash_attn", False)),
        tower_supports_sdpa=bool(getattr(tower_cls, "_supports_sdpa", False)))
