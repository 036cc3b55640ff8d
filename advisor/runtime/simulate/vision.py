"""The training step of a vision-language model: the batch its processor makes, what trains, the tower apart.

- The model is the ``*ForConditionalGeneration`` class of the config (``AutoModelForImageTextToText``): the vision
  tower, the projector (Qwen's merger, a ``multi_modal_projector``) and the language model.
- The batch is the processor's: the model's own image processor (transformers, built from its settings, nothing
  downloaded) run on blank images of the workload's sizes gives ``pixel_values`` and the grid / tile tensors
  (``image_grid_thw``; Mllama's ``aspect_ratio_ids`` / ``aspect_ratio_mask`` / ``cross_attention_mask``;
  Gemma 3's ``token_type_ids``), and the placeholder tokens are expanded in ``input_ids`` as the processor does;
  text tokens fill the rest of the sequence. Labels mask the image placeholders (-100), as TRL's and
  LLaMA-Factory's collators do.
- What trains: the tower frozen by default (LLaMA-Factory ``freeze_vision_tower: true``, ms-swift ``freeze_vit``),
  LoRA on it, or full; the projector frozen or trained (LLaMA-Factory ``freeze_multi_modal_projector``);
  LoRA reaches the language model's linears only, unless the tower's are asked for (peft ``target_modules`` as
  full module paths: ``all-linear`` would reach the tower's).
- Checkpointing: transformers' ``activation_checkpointing_enable`` checkpoints every ``GradientCheckpointingLayer``,
  the tower's blocks included; the tower's blocks keep their own setting (``tower_checkpointing``).
- The ledger shows the tower apart: storages are tagged ``vision_tower`` or ``projector`` (the tracker's
  ``part``), by the parameter they belong to (weights, adapters, gradients, optimizer states) or by the module whose
  forward or backward made them (saved activations, attention workspaces).

Under fake tensors the values the model reads in Python (the grid, the placeholder positions) come from
advisor.runtime.simulate.vision_shadow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.core.errors import AdvisorInputError
from advisor.runtime.build import IGNORE_INDEX, TrainingSetup

PARTS = ("vision_tower", "projector")
TOWER_MODES = ("frozen", "lora", "full")
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
SIMULATED = (*QWEN, "gemma3", "mllama", "internvl", "smolvlm", "llava_onevision", "mistral3")
"""The vision-language model types whose processor batch ``processor_batch`` builds."""
PIXELS_READ = ("smolvlm",)
"""Model types whose forward reads the pixels' values: SmolVLMModel.get_image_features drops the all-zero padding
images (``pixel_values == 0.0``, then a boolean index), so under fake tensors the pixels carry their real values
(vision_shadow) for that index's shape."""


@dataclass(frozen=True)
class VisionSettings:
    """What the vision side of one training step is: the images of a sample and what trains."""

    images: tuple[tuple[int, int], ...] = ((448, 448),)
    """(width, height) of each image of a sample, in pixels."""
    min_pixels: int | None = None
    """Qwen's pixel floor per image (the processor's ``size.shortest_edge``); None: the processor's default."""
    max_pixels: int | None = None
    """Qwen's pixel budget per image (``size.longest_edge``); None: the processor's default."""
    tower: str = "frozen"
    """frozen, lora or full."""
    projector_trained: bool = False
    tower_checkpointing: bool = False
    """Checkpoint the tower's blocks (apart from the language model's ``gradient_checkpointing``)."""

    def validate(self) -> None:
        if self.tower not in TOWER_MODES:
            raise AdvisorInputError("vision tower", f"must be one of {', '.join(TOWER_MODES)}", self.tower)
        for w, h in self.images:
            if w < 1 or h < 1:
                raise AdvisorInputError("--image-size", "each image needs a width and height of at least 1 pixel",
                                        f"{w}x{h}")


def vision_settings(plan) -> VisionSettings:
    """The vision settings of ``plan``'s vision fields (advisor.core.plan: ``image_sizes`` as ``WxH``,
    ``min_pixels`` / ``max_pixels``, ``vision_tower``, ``train_projector``, ``vision_gradient_checkpointing``); a
    plan without images traces its text alone (the tower loaded, not run), as the closed form counts it."""
    images = tuple(tuple(int(x) for x in str(size).lower().split("x")) for size in plan.image_sizes)
    return VisionSettings(images=images, min_pixels=plan.min_pixels,
                          max_pixels=plan.max_pixels, tower=plan.vision_tower,
                          projector_trained=bool(plan.train_projector),
                          tower_checkpointing=bool(plan.vision_gradient_checkpointing))


def is_vision(spec) -> bool:
    """``spec`` describes a vision-language model (its config has a ``vision_config``)."""
    return isinstance(getattr(spec, "config", None), dict) and "vision_config" in spec.config


# --------------------------------------------------------------------------- the model


def build_vl_model(spec, plan, device: str, num_layers: int | None, attn: str, dtype,
                   tower_layers: int | None = None, layers: tuple[int, ...] | None = None):
    """The ``*ForConditionalGeneration`` model of ``spec`` (``num_layers`` language-model layers, ``tower_layers``
    tower blocks where given), in ``dtype``, with ``attn`` in every sub-model."""
    import torch
    from transformers import AutoModelForImageTextToText

    from transformers import initialization

    cfg = vl_config(spec, num_layers, tower_layers, layers)
    cfg.use_cache = False
    cfg.get_text_config().use_cache = False
    init = initialization.TORCH_INIT_FUNCTIONS
    original = init["trunc_normal_"]
    # SigLIP's lecun_normal_ draws by rejection (torch.nn.init._no_grad_trunc_normal_ loops while ``mask.any()``),
    # which a fake tensor, whose ``any`` answers True, never leaves; the values are never read: draw and clamp
    init["trunc_normal_"] = lambda t, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: t.normal_(
        mean, std, generator=generator).clamp_(a, b)
    try:
        with torch.device(device):
            return AutoModelForImageTextToText.from_config(cfg, dtype=dtype, attn_implementation=attn)
    finally:
        init["trunc_normal_"] = original


def vl_config(spec, num_layers: int | None = None, tower_layers: int | None = None,
              layers: tuple[int, ...] | None = None):
    """The transformers config of ``spec``, the language model cut to ``num_layers`` layers (or the layers at the
    indices ``layers``: advisor.runtime.build.select_layers) and the tower to ``tower_layers`` blocks (the
    full-attention / deepstack / intermediate indices kept among them)."""
    import copy

    from advisor.core.architecture import config_object
    from advisor.runtime.build import select_layers

    cfg = config_object(copy.deepcopy(spec.config))
    text = cfg.get_text_config()
    if layers is not None:
        select_layers(text, spec, layers)
        if getattr(text, "cross_attention_layers", None) is not None:
            text.cross_attention_layers = [k for k, i in enumerate(layers) if i in text.cross_attention_layers]
    elif num_layers is not None:
        text.num_hidden_layers = num_layers
        if getattr(text, "layer_types", None):
            text.layer_types = list(text.layer_types)[:num_layers]
        if getattr(text, "cross_attention_layers", None) is not None:  # Mllama
            text.cross_attention_layers = [i for i in text.cross_attention_layers if i < num_layers]
    if tower_layers is not None:
        v = cfg.vision_config
        key = "depth" if hasattr(v, "depth") else "num_hidden_layers"
        setattr(v, key, tower_layers)
        for k in ("fullatt_block_indexes", "deepstack_visual_indexes", "intermediate_layers_indices"):
            if getattr(v, k, None) is not None:
                setattr(v, k, [i for i in getattr(v, k) if i < tower_layers])
    return cfg


def tower_and_projectors(model) -> tuple[Any, list]:
    """(the vision tower module, the projector modules) of a ``*ForConditionalGeneration`` model (peft-wrapped or
    not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    for name in ("visual", "vision_tower", "vision_model"):
        tower = getattr(inner, name, None)
        if tower is not None:
            break
    else:
        raise AdvisorInputError("--model", f"no vision tower found in {type(base).__name__}", type(base).__name__)
    projectors = [m for m in (getattr(inner, "multi_modal_projector", None), getattr(inner, "connector", None),
                              getattr(tower, "merger", None)) if m is not None]
    projectors += list(getattr(tower, "deepstack_merger_list", None) or [])
    return tower, projectors


def part_of_parameters(model) -> dict[int, str]:
    """id(parameter) -> the part it belongs to (vision_tower or projector); the language model's are absent."""
    tower, projectors = tower_and_projectors(model)
    parts = {id(p): "vision_tower" for p in tower.parameters()}
    for m in projectors:
        parts.update({id(p): "projector" for p in m.parameters()})
    return parts


def language_model(model):
    """The language model inside a ``*ForConditionalGeneration`` model (peft-wrapped or not): ``model.language_model``,
    SmolVLM's ``model.text_model``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    return getattr(inner, "language_model", None) or inner.text_model


def language_layers(model):
    return language_model(model).layers


def apply_trainable(model, settings: VisionSettings, method: str) -> None:
    """The tower and projector trained or frozen as ``settings`` say (after the plan's method set the rest)."""
    tower, projectors = tower_and_projectors(model)
    for p in tower.parameters():
        p.requires_grad_(settings.tower == "full")
    for m in projectors:
        for p in m.parameters():
            p.requires_grad_(settings.projector_trained)


def enable_checkpointing(model, plan, settings: VisionSettings, checkpoint_set: tuple[int, ...] | None = None) -> None:
    """The language model's layers checkpointed as the plan says (``checkpointed_layers``: all of them, or
    ``checkpoint_layers`` of them; ``checkpoint_set`` overrides which, as positions among the built decoder layers),
    the tower's blocks as ``settings.tower_checkpointing`` says. Enabled as Trainer enables it
    (``activation_checkpointing_enable``: non-reentrant checkpoint, input gradients on every sub-model's embeddings),
    then each block's own flag."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from advisor.core.plan import checkpointed_layers

    if not (plan.gradient_checkpointing or settings.tower_checkpointing):
        return
    model.activation_checkpointing_enable()
    tower, _ = tower_and_projectors(model)
    in_tower = {id(m) for m in tower.modules()}
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    decoder = [m for m in blocks if id(m) not in in_tower]
    chosen = set(checkpoint_set if checkpoint_set is not None else checkpointed_layers(plan, len(decoder)))
    for m in blocks:
        m.gradient_checkpointing = settings.tower_checkpointing if id(m) in in_tower else False
    for i, m in enumerate(decoder):
        m.gradient_checkpointing = i in chosen


def lora_modules(model, spec, plan, settings: VisionSettings) -> list[str]:
    """The full module paths peft adapts: the language model's linears of the plan's targets, and every linear of
    the tower (not the projector) when the tower gets LoRA. Full paths, so that ``all-linear`` or a short name
    (``q_proj``: SigLIP's attention has one too) never reaches the tower unless asked."""
    import torch

    from advisor.runtime.build import lora_targets

    targets, _ = lora_targets(spec, plan)
    names = set(targets) if targets else {n for n in spec.linear_shapes()}
    tower, projectors = tower_and_projectors(model)
    in_tower = {id(m) for m in tower.modules()} - {id(m) for p in projectors for m in p.modules()}
    in_projector = {id(m) for p in projectors for m in p.modules()}
    lm = {id(m) for m in language_model(model).modules()}
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        if id(m) in lm and name.split(".")[-1] in names:
            out.append(name)
        elif settings.tower == "lora" and id(m) in in_tower and id(m) not in in_projector:
            out.append(name)
    return out


# --------------------------------------------------------------------------- the batch


def image_processor(spec, settings: VisionSettings):
    """The model's own image processor, built from its settings (no download): Qwen2-VL's for the Qwen family,
    Gemma 3's, Mllama's, GOT-OCR2's for InternVL."""
    import transformers

    cfg = spec.config
    v = cfg["vision_config"]
    mt = spec.config["model_type"]
    stored = (getattr(spec, "processor", None) or {}).get("image") or {}  # the catalog's preprocessor settings
    if mt in QWEN:
        patch = stored.get("patch_size", v.get("patch_size", 16 if mt.startswith("qwen3") else 14))
        kwargs = dict(patch_size=patch, merge_size=stored.get("merge_size", v.get("spatial_merge_size", 2)),
                      temporal_patch_size=stored.get("temporal_patch_size", v.get("temporal_patch_size", 2)))
        lo = settings.min_pixels or stored.get("min_pixels") or (65536 if mt.startswith("qwen3") else 3136)
        hi = settings.max_pixels or stored.get("max_pixels") or (16777216 if mt.startswith("qwen3") else 12845056)
        return transformers.Qwen2VLImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, **kwargs)
    if mt == "gemma3":
        side = stored.get("size", v.get("image_size", 896))
        return transformers.Gemma3ImageProcessorPil(size={"height": side, "width": side})
    if mt == "mllama":
        side = v.get("image_size", 560)
        return transformers.MllamaImageProcessorPil(size={"height": side, "width": side},
                                                    max_image_tiles=v.get("max_num_tiles", 4))
    if mt == "internvl":
        side = v.get("image_size", [448, 448])
        side = side[0] if isinstance(side, (list, tuple)) else side
        return transformers.GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True,
                                                     min_patches=1, max_patches=12)
    if mt == "llava_onevision":  # 384-pixel crops (preprocessor_config.json size), the config's pinpoints
        side = stored.get("size", v.get("image_size", 384))
        pins = [[int(a), int(b)] for a, b in cfg["image_grid_pinpoints"]]
        return transformers.LlavaOnevisionImageProcessorPil(size={"height": side, "width": side},
                                                            image_grid_pinpoints=pins)
    if mt == "mistral3":  # PixtralProcessor gives its image processor patch x merge as the patch (whole cells)
        cell = stored.get("patch_size", v.get("patch_size", 14)) * stored.get("spatial_merge_size",
                                                                             cfg.get("spatial_merge_size", 2))
        return transformers.PixtralImageProcessorPil(patch_size=cell, size={"longest_edge": stored.get(
            "longest_edge", v.get("image_size", 1540))})
    if mt == "smolvlm":  # the catalog's preprocessor_config.json fields (size, max_image_size, do_image_splitting)
        return transformers.SmolVLMImageProcessorPil(size={"longest_edge": stored["longest_edge"]},
                                                     max_image_size={"longest_edge": stored["tile_size"]},
                                                     do_image_splitting=stored.get("do_image_splitting", True))
    raise AdvisorInputError("--model", f"no image processor known for {mt} in the simulation", mt)


def _images(settings: VisionSettings):
    import numpy as np

    return [np.zeros((h, w, 3), dtype=np.uint8) for w, h in settings.images]


def processor_batch(spec, plan, settings: VisionSettings, seed: int = 0) -> dict:
    """One micro-batch of real tensors, as the model's processor and a collator make it: every sample has the
    workload's images and text tokens up to ``plan.seq_len`` in all."""
    import torch

    from advisor.core.architecture import config_object

    cfg, mt = spec.config, spec.config["model_type"]
    # the special tokens as the model built from the config sees them: a field the config leaves out takes its
    # config class's default (InternVL3.5-8B-HF has no image_token_id: 151667)
    conf = config_object(cfg)
    proc = image_processor(spec, settings)
    b, s = plan.micro_batch, plan.seq_len
    vocab = cfg.get("text_config", {}).get("vocab_size", spec.vocab_size)
    g = torch.Generator().manual_seed(seed)
    out: dict = {}
    if not settings.images:  # a text-only sample: the collator's ids and labels, no pixels, no placeholder ids
        special = [getattr(conf, k, None) for k in ("image_token_id", "image_token_index", "video_token_id",
                                                     "vision_start_token_id", "boi_token_index")]
        ids = torch.randint(0, min([vocab] + [t for t in special if isinstance(t, int)]), (b, s), generator=g)
        return dict(input_ids=ids, labels=ids.clone())
    if mt == "mllama":
        o = proc(images=[_images(settings)] * b, return_tensors="pt")
        image_token = conf.image_token_index
        spans = [[image_token] for _ in settings.images]
        out.update(pixel_values=o["pixel_values"], aspect_ratio_ids=o["aspect_ratio_ids"],
                   aspect_ratio_mask=o["aspect_ratio_mask"])
        num_tiles = o["num_tiles"]
    elif mt == "llava_onevision":  # one image: its crops (1, crops, 3, 384, 384); several: one crop each
        from advisor.core.vision_tokens import count_image

        n = len(settings.images)
        o = proc(images=[_images(settings)] if n > 1 else _images(settings), return_tensors="pt")
        image_token = conf.image_token_index
        # the processor's <image> tokens (LlavaOnevisionProcessor._get_number_of_features, vision_tokens.py)
        tokens = [count_image(spec, w, h, images_in_sample=n).tokens for w, h in settings.images]
        spans = [[image_token] * k for k in tokens]
        pv = o["pixel_values"] if n == 1 else o["pixel_values"].reshape(n, -1, *o["pixel_values"].shape[-3:])
        out.update(pixel_values=torch.cat([pv] * b), image_sizes=torch.cat([o["image_sizes"]] * b))
        if n > 1:  # the model patches a sample's single image only (get_image_features' need_patching)
            out["batch_num_images"] = torch.tensor([n] * b)
    elif mt == "mistral3":  # each image resized in whole cells, padded to the largest: (images, 3, H, W)
        o = proc(images=_images(settings) * b, return_tensors="pt")
        image_token = conf.image_token_index
        cell = int(proc.patch_size["height"]) if isinstance(proc.patch_size, dict) else int(proc.patch_size)
        rows_cols = [(int(h) // cell, int(w) // cell) for h, w in o["image_sizes"][:len(settings.images)].tolist()]
        # PixtralProcessor.replace_image_token: [IMG] per cell, [IMG_BREAK] per row, the last [IMG_END]; the two
        # markers are text tokens here (their ids are the tokenizer's, not the config's)
        spans = [([image_token] * cols + [image_token - 1]) * rows for rows, cols in rows_cols]
        tokens = [rows * cols for rows, cols in rows_cols]
        out.update(pixel_values=o["pixel_values"], image_sizes=o["image_sizes"])
    elif mt == "smolvlm":  # a sample's images as one nested list: (1, crops of every image, 3, tile, tile)
        o = proc(images=[_images(settings)], return_tensors="pt", return_row_col_info=True)
        tokens = image_tokens(spec, o, settings)
        image_token = conf.image_token_id
        spans = [[image_token] * n for n in tokens]  # the <image> tokens only counted (as InternVL's)
        out.update(pixel_values=torch.cat([o["pixel_values"]] * b),
                   pixel_attention_mask=torch.cat([o["pixel_attention_mask"]] * b))
    else:
        o = proc(images=_images(settings), return_tensors="pt")
        tokens = image_tokens(spec, o, settings)
        if mt in QWEN:
            start, end = conf.vision_start_token_id, cfg.get("vision_end_token_id")
            image_token = conf.image_token_id
            spans = [[start] + [image_token] * n + ([end] if end is not None else []) for n in tokens]
            out.update(pixel_values=torch.cat([o["pixel_values"]] * b),
                       image_grid_thw=torch.cat([o["image_grid_thw"]] * b))
        elif mt == "gemma3":
            image_token = conf.image_token_index
            spans = [[conf.boi_token_index] + [image_token] * n + [conf.eoi_token_index]
                     for n in tokens]
            out.update(pixel_values=torch.cat([o["pixel_values"]] * b))
        else:  # internvl: <img> + context tokens + </img>, the image tokens only counted as such
            image_token = conf.image_token_id
            spans = [[image_token] * n for n in tokens]
            out.update(pixel_values=torch.cat([o["pixel_values"]] * b))
    placeholders = [t for span in spans for t in span]
    special = min(t for t in [image_token, *placeholders] if t is not None)
    # ``seq_len`` text tokens beside the images' placeholders (advisor.memory.training: the language model's
    # sequence holds both)
    text = torch.randint(0, min(vocab, special), (b, s), generator=g)
    s = s + len(placeholders)
    ids = torch.cat([torch.tensor([placeholders] * b, dtype=torch.long), text], dim=1)
    labels = ids.clone()
    labels[ids == image_token] = IGNORE_INDEX
    out.update(input_ids=ids, labels=labels)
    if mt == "gemma3":
        out["token_type_ids"] = (ids == image_token).long()
    if mt in QWEN:  # the processor's mm_token_type_ids: 1 at image placeholders (2 at video ones)
        out["mm_token_type_ids"] = (ids == image_token).long()
    if mt == "mllama":
        from transformers.models.mllama.processing_mllama import (convert_sparse_cross_attention_mask_to_dense,
                                                                  get_cross_attention_token_mask)

        masks = [get_cross_attention_token_mask(row.tolist(), image_token) for row in ids]
        dense = convert_sparse_cross_attention_mask_to_dense(masks, num_tiles, cfg["vision_config"].get(
            "max_num_tiles", 4), s)
        out["cross_attention_mask"] = torch.from_numpy(dense)
    return out


def image_tokens(spec, processed, settings: VisionSettings) -> list[int]:
    """The placeholder tokens of each image in the text sequence, from the processor's output (Mllama: none, its
    images are read by cross-attention)."""
    cfg, mt = spec.config, spec.config["model_type"]
    if mt in QWEN:
        merge = cfg["vision_config"].get("spatial_merge_size", 2)
        return [int(t * h * w) // merge ** 2 for t, h, w in processed["image_grid_thw"].tolist()]
    if mt == "gemma3":
        return [cfg.get("mm_tokens_per_image", 256)] * len(settings.images)
    if mt == "internvl":
        v = cfg["vision_config"]
        side = v.get("image_size", [448, 448])
        patch = v.get("patch_size", [14, 14])
        side, patch = (side[0] if isinstance(side, list) else side), (patch[0] if isinstance(patch, list) else patch)
        per_tile = int((side // patch) ** 2 * cfg.get("downsample_ratio", 0.5) ** 2)
        return [int(n) * per_tile for n in processed["num_patches"]]
    if mt == "smolvlm":  # SmolVLMProcessor's image_seq_len per crop: (tile / patch)^2 / scale_factor^2
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        per_crop = int(spec.processor["image"]["image_seq_len"])
        return [get_image_prompt_string(int(r), int(c), per_crop, fake_token_around_image="<fake_token_around_image>",
                                        image_token="<image>", global_image_token="<global-img>").count("<image>")
                for r, c in zip(processed["rows"][0], processed["cols"][0])]
    return [0] * len(settings.images)


def batch_for(spec, plan, settings: VisionSettings, fake: bool, device: str, seed: int = 0) -> dict:
    """``processor_batch`` as the step sees it: real tensors copied to ``device`` (each tracked as the collator's
    allocation), or fake ones of the same shapes carrying the integer tensors' values
    (advisor.runtime.simulate.vision_shadow)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from advisor.runtime.simulate.vision_shadow import with_shadow

    with _disable_current_modes():
        real = processor_batch(spec, plan, settings, seed)
    if not fake:
        return {k: v.to(device, copy=True) for k, v in real.items()}
    import torch

    out = {}
    for k, v in real.items():
        if k == "pixel_values" and spec.config.get("model_type") in PIXELS_READ:
            out[k] = with_shadow(v)
        elif v.dtype.is_floating_point:
            out[k] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
        else:
            out[k] = with_shadow(v)
    return out


# --------------------------------------------------------------------------- the setup


@dataclass
class VisionTrainingSetup(TrainingSetup):
    """A vision-language model's step: micro-batches are the processor's dicts."""

    vision: VisionSettings = field(default_factory=VisionSettings)

    def make_batch(self, seed: int = 0):
        from advisor.runtime.tensors import is_fake

        return batch_for(self.spec, self.plan, self.vision, is_fake(next(iter(self.model.parameters()))),
                         self.device, seed)

    def micro_step(self, batch, labels=None):
        """Forward with the batch (labels in it), the model's causal-LM loss, backward."""
        self._phase("forward")
        with self._autocast():
            loss = self.model(**batch).loss
        if self.plan.grad_accum > 1:
            loss = loss / self.plan.grad_accum
        self._phase("backward")
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def train_step(self, batches) -> list:
        from advisor.runtime.tensors import is_fake

        losses = []
        for n, batch in enumerate(batches):
            if n >= self.plan.grad_accum:
                break
            loss = self.micro_step(batch)
            losses.append(loss if is_fake(loss) else float(loss))
        self.optimizer_step()
        return losses


def simulated_vision(model, plan, parts: dict) -> dict:
    """A simulated report's ``extra["vision"]`` (advisor.memory.vision.vision_summary reads it): the sample as the
    processor counts it (advisor.core.vision_tokens), the tower LoRA's modules, and in place of the closed form's
    vision terms the traced peak's tower and projector bytes by category (``parts``: ``tag_parts``)."""
    from advisor.core.vision_tokens import count_sample
    from advisor.memory.vision import tower_lora_modules

    vis = count_sample(model, plan)
    b = plan.micro_batch
    modules, note = tower_lora_modules(model, plan)
    in_text = vis.text_tokens if vis else 0
    return {"sample": vis.to_dict() if vis else None, "language_model_seq_len": plan.seq_len + in_text,
            "vision_tokens": (vis.vision_tokens if vis else 0) * b, "image_tokens": (vis.text_tokens if vis else 0) * b,
            "lora_modules": list(modules), "lora_targets_note": note,
            "ledger": {part: {k: int(v) for k, v in cats.items()} for part, cats in parts.items()},
            "ledger_source": "simulation: the tower's and projector's storages live at the traced peak, by category"}


def simulation_gap(spec, plan) -> str:
    """What of ``plan`` the simulation of ``spec`` cannot trace ('' when it can trace it all): the tuner leaves such a
    plan to the closed form, where that describes it, and says so."""
    if spec.is_vision_language and spec.config.get("model_type") not in SIMULATED:
        return (f"the simulation does not build {spec.config.get('model_type')}'s processor batch "
                f"(it builds {', '.join(SIMULATED)})")
    why = unsupported(plan) if spec.is_vision_language else None
    return f"the simulation of a vision-language model does not trace {why}" if why else ""


def unsupported(plan) -> str | None:
    """Why ``plan`` cannot be traced on a vision-language model here (None: it can)."""
    if plan.loss != "plain":
        return f"loss {plan.loss!r} (the simulation of vision-language models runs the model's own loss)"
    if plan.packing:
        return "packing (Qwen's 3-D rotary positions of packed samples are not built here)"
    if plan.activation_offload:
        return "activation offload"
    return None


def build_vision_setup(spec, plan, settings: VisionSettings | None = None, *, device: str = "cpu",
                       num_layers: int | None = None, tower_layers: int | None = None,
                       layers: tuple[int, ...] | None = None, seed: int = 0,
                       target_device: str | None = None, on_grad=None,
                       checkpoint_set: tuple[int, ...] | None = None) -> VisionTrainingSetup:
    """The vision-language model of ``spec`` with ``plan`` and ``settings`` applied, and its optimizer: the steps of
    advisor.runtime.build.build_training_setup (the plan's attention and dtype, checkpointing as Trainer enables it,
    peft LoRA with fp32 adapters, Trainer's optimizer for the target device), with the tower and projector trained
    or frozen as ``settings`` say and LoRA placed by module path (``lora_modules``)."""
    import contextlib

    import torch

    from advisor.runtime.build import _attention, _module_to_is_noop, build_optimizer, torch_dtype
    from advisor.runtime.tensors import is_fake

    plan.validate()
    settings = settings if settings is not None else vision_settings(plan)
    settings.validate()
    why = unsupported(plan)
    if why is not None:
        raise AdvisorInputError("--backend", f"the simulation of a vision-language model does not trace {why}",
                                "simulate", show_value=False)
    if settings.tower == "lora" and not plan.peft:
        raise AdvisorInputError("--method", "LoRA on the vision tower needs a LoRA method", plan.method)
    target = target_device or device
    notes: list[str] = []
    torch.manual_seed(seed)
    attn = _attention(spec, plan, target, notes)
    model = build_vl_model(spec, plan, device, num_layers, attn, torch_dtype(plan.param_dtype), tower_layers, layers)
    fake = is_fake(next(iter(model.parameters())))
    if plan.quantized:  # every nn.Linear bitsandbytes converts, the tower's too (transformers replace_with_bnb_linear)
        from advisor.runtime.simulate.standins import quantize_model

        quantize_model(model, spec, plan, device=device, impl="standin" if fake else "bnb", target_device=target)
    if plan.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        apply_trainable(model, settings, plan.method)
    enable_checkpointing(model, plan, settings, checkpoint_set)
    if plan.peft:
        from peft import LoraConfig, get_peft_model

        modules = lora_modules(model, spec, plan, settings)
        config = LoraConfig(r=plan.lora_r, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout,
                            target_modules=modules, bias="none", task_type="CAUSAL_LM", use_dora=plan.dora)
        with _module_to_is_noop() if fake else contextlib.nullcontext():
            model = get_peft_model(model, config)
        if fake:  # peft's autocast_adapter_dtype, which .to would have applied (advisor.runtime.build._apply_lora)
            for _, p in model.named_parameters():
                if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.to(torch.float32)
        tower, projectors = tower_and_projectors(model)
        if settings.tower == "full":
            for p in tower.parameters():
                p.requires_grad_(True)
        for m in projectors:
            for p in m.parameters():
                p.requires_grad_(settings.projector_trained)
    model.train()
    if on_grad is not None:
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(on_grad)
    optimizer = build_optimizer(model, plan, target, fake)
    scaler = None
    if plan.precision == "mixed_fp16" and not fake:
        scaler = torch.amp.GradScaler("cuda" if device.startswith("cuda") else "cpu")
    return VisionTrainingSetup(model=model, optimizer=optimizer, plan=plan, spec=spec, device=device,
                               target_device=target, scaler=scaler, notes=notes, vision=settings)


# --------------------------------------------------------------------------- the ledger's parts


def tag_parts(model, tracker) -> list:
    """Tag what the tower and the projectors allocate with their part (``tracker.part``): in the forward from
    each one's forward pre-hook to its forward hook; in the backward from when the gradient of its output is
    computed (a hook on the output) to when the gradient of its input is (a hook on the input), where the part
    that called it resumes. Forward hooks only (module backward hooks break on peft models)."""
    import torch

    tower, projectors = tower_and_projectors(model)
    handles = []
    stack: list = []

    def setter(part):
        def hook(_grad):
            tracker.part = part
        return hook

    def modules():
        yield tower, "vision_tower"
        for m in projectors:
            yield m, "projector"

    for module, part in modules():
        def pre(_m, args, kwargs, part=part):
            stack.append(tracker.part)
            enclosing = tracker.part
            tracker.part = part
            if enclosing is not None:
                for a in (*args, *kwargs.values()):
                    if isinstance(a, torch.Tensor) and a.requires_grad:
                        a.register_hook(setter(enclosing))

        def post(_m, _args, _kwargs, out, part=part):
            tracker.part = stack.pop() if stack else None
            tensors = [out] if isinstance(out, torch.Tensor) else [
                t for t in (out.values() if hasattr(out, "values") else out if isinstance(out, (list, tuple)) else ())
                if isinstance(t, torch.Tensor)]
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(setter(part))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    return handles


def tag_part_storages(model, tracker, optimizer) -> None:
    """What a part keeps from step to step is the part's: its parameters, their gradients and optimizer states."""
    import torch

    parts = part_of_parameters(model)
    states = getattr(optimizer, "state", None) or {}
    for p in model.parameters():
        part = parts.get(id(p))
        if part is None:
            continue
        tensors = [p] + ([p.grad] if p.grad is not None else [])
        state = states.get(p) if hasattr(states, "get") else None
        tensors += [v for v in (state or {}).values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            rec = tracker.record_of(t)
            if rec is not None:
                rec.part = part


def parts_ledger(live, groups: dict[int, str]) -> dict[str, dict[str, int]]:
    """{part: {category: bytes}} of the live records that belong to the tower or a projector."""
    out: dict[str, dict[str, int]] = {}
    for rec in live:
        part = getattr(rec, "part", None)
        if part is None:
            continue
        cat = groups.get(rec.uid, "transient")
        d = out.setdefault(part, {})
        d[cat] = d.get(cat, 0) + rec.nbytes
    return out
