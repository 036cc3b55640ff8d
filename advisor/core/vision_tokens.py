"""How many tokens an image or a video becomes, counted by the model's own processor.

The processor is transformers' own class, built from the settings the catalog stores beside the model's config
(models.yaml ``processor``: preprocessor_config.json's fields), never downloaded: Qwen's ``smart_resize`` to
multiples of patch x merge (28 for Qwen2-VL / Qwen2.5-VL, 32 for Qwen3-VL) within [min_pixels, max_pixels]
(``Qwen2VLImageProcessor.get_number_of_image_patches``); Gemma 3's fixed 896-pixel square (4096 patches pooled into
``mm_tokens_per_image`` = 256 tokens); InternVL's 448-pixel tiles and thumbnail (``GotOcr2ImageProcessor``);
LLaVA-OneVision's anyres 384-pixel tiles plus the whole image (``select_best_resolution`` and
``LlavaOnevisionProcessor._get_number_of_features``); Pixtral's (Mistral 3) resize within ``longest_edge`` to whole
28-pixel cells (``get_resize_output_image_size``), an [IMG] per cell and a break per row; SmolVLM2's tiles within
``longest_edge`` plus the whole image, ``image_seq_len`` tokens each
(``SmolVLMImageProcessor.get_number_of_image_patches``, ``processing_smolvlm.get_image_prompt_string``). Where
torchvision is absent transformers 5 builds the PIL backend of the same processor (``<Class>Pil``: the same resize
arithmetic), which is what is used then.

Two sequences come out of an image: the tower's own (``vision_tokens``: its patches, before merging) and the
language model's (``tokens``: what the text sequence holds, after the merger or the pooling). A plan is sized on the
largest sample of a batch: the sizes given are that sample's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from advisor.core.errors import AdvisorInputError


@dataclass(frozen=True)
class ImageTokens:
    """One image as the processor makes it."""

    size: tuple[int, int]
    """(width, height) as given."""
    resized: tuple[int, int]
    """(width, height) the processor resizes it to."""
    grid: tuple[int, int, int]
    """(frames, rows, columns) of patches the tower sees (Qwen's ``image_grid_thw``; frames 1 for an image)."""
    vision_tokens: int
    """The tower's sequence: its patches (Gemma 3: 4096 per 896-pixel crop)."""
    tokens: int
    """The language model's tokens for it (after the 2x2 merge; Gemma 3's 256)."""
    crops: int = 1
    """Crops or tiles the processor cut the image into (1: the whole image)."""

    def to_dict(self) -> dict[str, Any]:
        return {"size": f"{self.size[0]}x{self.size[1]}", "resized": f"{self.resized[0]}x{self.resized[1]}",
                "grid_thw": list(self.grid), "vision_tokens": self.vision_tokens, "tokens": self.tokens,
                "crops": self.crops}


@dataclass(frozen=True)
class VideoTokens:
    """One video as the video processor makes it."""

    frames: int
    """Frames sampled (a multiple of the temporal patch)."""
    frame_size: tuple[int, int]
    """(width, height) of a frame as given (or as planned: a frame that fills the per-frame budget)."""
    resized: tuple[int, int]
    grid: tuple[int, int, int]
    """(temporal patches, rows, columns)."""
    vision_tokens: int
    tokens: int
    max_pixels: int
    """The per-frame budget the frames were resized within (after a total budget lowered it)."""

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "frame_size": f"{self.frame_size[0]}x{self.frame_size[1]}",
                "resized": f"{self.resized[0]}x{self.resized[1]}", "grid_thw": list(self.grid),
                "vision_tokens": self.vision_tokens, "tokens": self.tokens, "max_pixels_per_frame": self.max_pixels}


@dataclass(frozen=True)
class VisionInput:
    """What one sample's images and video become."""

    images: tuple[ImageTokens, ...] = ()
    video: VideoTokens | None = None
    in_text: bool = True
    """The image tokens sit in the language model's sequence (False: read by cross-attention, Llama-3.2-Vision)."""
    processor: str = ""
    """The processor class that counted them."""
    settings: dict = field(default_factory=dict)
    """The bounds used (min/max pixels, per-frame budget, fps, frames)."""

    @property
    def image_tokens(self) -> int:
        return sum(i.tokens for i in self.images)

    @property
    def video_tokens(self) -> int:
        return self.video.tokens if self.video else 0

    @property
    def tokens(self) -> int:
        """Language-model tokens the images and the video take."""
        return self.image_tokens + self.video_tokens

    @property
    def text_tokens(self) -> int:
        """Tokens they add to the language model's sequence (0 where it reads them by cross-attention)."""
        return self.tokens if self.in_text else 0

    @property
    def vision_tokens(self) -> int:
        """The tower's own sequence over the sample, before merging."""
        return sum(i.vision_tokens for i in self.images) + (self.video.vision_tokens if self.video else 0)

    def sequences(self) -> list[tuple[int, tuple[int, int, int]]]:
        """(patches, grid) of each sequence the tower attends within (one per image, one per video)."""
        out = [(i.vision_tokens, i.grid) for i in self.images]
        if self.video:
            out.append((self.video.vision_tokens, self.video.grid))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"image_tokens_per_image": [i.tokens for i in self.images], "image_tokens": self.image_tokens,
                "video_tokens": self.video_tokens, "vision_tokens": self.vision_tokens,
                "tokens_in_text_sequence": self.text_tokens, "processor": self.processor,
                "settings": dict(self.settings), "images": [i.to_dict() for i in self.images],
                "video": self.video.to_dict() if self.video else None}


# --------------------------------------------------------------------------- the processors

CACHE_FILE = "image_tokens.json"
"""What the processors answered before, kept beside the derived descriptions in the user cache
(advisor.core.architecture_store.cache_dir): importing transformers' image processors costs seconds, a lookup
nothing. Keyed by the processor's class, its settings, the size and the transformers version."""
_ANSWERS: dict[str, Any] | None = None


def _cache_path():
    from advisor.core.architecture_store import cache_dir

    return cache_dir() / CACHE_FILE


def _remembered(key: tuple, compute):
    """``compute()``'s answer (a JSON value) for ``key``, from the user cache where a processor gave it before."""
    import json
    import os
    import tempfile
    from importlib import metadata

    global _ANSWERS
    if _ANSWERS is None:
        try:
            _ANSWERS = json.loads(_cache_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            _ANSWERS = {}
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover - transformers is a dependency
        version = "unknown"
    text = json.dumps([version, *key], separators=(",", ":"))
    if text in _ANSWERS:
        return _ANSWERS[text]
    value = compute()
    _ANSWERS[text] = value
    try:
        path = _cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_ANSWERS, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache asks the processor again next time
    return value


def processor_name(cls: str) -> str:
    """The class that counts: ``cls``, or its PIL backend where torchvision is absent (as ``_processor_class``)."""
    import importlib.util

    return cls + "Pil" if importlib.util.find_spec("torchvision") is None else cls


@lru_cache(maxsize=None)
def _processor_class(name: str):
    """transformers' image processor class ``name``, its PIL backend where torchvision is absent (transformers 5
    falls back to it itself, with a warning; asking for it by name says so without one)."""
    import importlib.util

    import transformers

    if importlib.util.find_spec("torchvision") is None and hasattr(transformers, name + "Pil"):
        return getattr(transformers, name + "Pil")
    return getattr(transformers, name)


@lru_cache(maxsize=64)
def _qwen_processor(cls: str, patch: int, merge: int, temporal: int, min_pixels: int, max_pixels: int):
    return _processor_class(cls)(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                                 min_pixels=min_pixels, max_pixels=max_pixels)


def _image_settings(spec) -> dict[str, Any]:
    settings = (spec.processor or {}).get("image")
    if not settings:
        raise AdvisorInputError("--image-size", f"{spec.name} has no image processor in the catalog (a text model, or "
                                "a vision-language model the catalog does not describe)", spec.name, show_value=False)
    return settings


def count_image(spec, width: int, height: int, *, min_pixels: int | None = None,
                max_pixels: int | None = None, images_in_sample: int = 1) -> ImageTokens:
    """The tokens of one ``width`` x ``height`` image for ``spec``'s processor (its bounds, or the plan's), one of
    ``images_in_sample`` images in its sample (LLaVA-OneVision cuts tiles only for a sample's single image)."""
    s = _image_settings(spec)
    cls = s["class"]
    if cls == "Qwen2VLImageProcessor":
        lo = int(min_pixels or s["min_pixels"])
        hi = int(max_pixels or s["max_pixels"])
        if lo > hi:
            raise AdvisorInputError("--min-pixels", f"is above the pixel budget {hi:,}", lo)
        patch, merge, temporal = int(s["patch_size"]), int(s["merge_size"]), int(s["temporal_patch_size"])
        def ask():
            proc = _qwen_processor(cls, patch, merge, temporal, lo, hi)
            try:
                n = int(proc.get_number_of_image_patches(height, width, {"min_pixels": lo, "max_pixels": hi}))
            except ValueError as e:  # smart_resize refuses an aspect ratio beyond 200
                return {"error": str(e)}
            return {"patches": n, "resized": list(_qwen_resize(height, width, patch * merge, lo, hi))}
        answer = _remembered((cls, patch, merge, temporal, lo, hi, width, height), ask)
        if "error" in answer:
            raise AdvisorInputError("--image-size", answer["error"], f"{width}x{height}")
        patches, (rh, rw) = answer["patches"], answer["resized"]
        return ImageTokens(size=(width, height), resized=(rw, rh), grid=(1, rh // patch, rw // patch),
                           vision_tokens=patches, tokens=patches // (merge * merge))
    if cls == "Gemma3ImageProcessor":
        if s.get("do_pan_and_scan"):
            raise AdvisorInputError("--image-size", "pan and scan is not planned here", spec.name, show_value=False)
        side = int(s["size"])
        patch = spec.vision.patch_size
        return ImageTokens(size=(width, height), resized=(side, side), grid=(1, side // patch, side // patch),
                           vision_tokens=(side // patch) ** 2, tokens=int(s["tokens_per_image"]))
    if cls == "GotOcr2ImageProcessor":  # InternVL: 448-pixel tiles by the aspect ratio, plus a thumbnail
        side = int(s["size"])
        lo, hi, crop = int(s["min_patches"]), int(s["max_patches"]), bool(s["crop_to_patches"])
        tiles = _remembered((cls, side, lo, hi, crop, width, height), lambda: int(
            _tile_processor(cls, side, lo, hi, crop).get_number_of_image_patches(height, width, {})))
        patch = spec.vision.patch_size
        per_tile = (side // patch) ** 2 + 1  # InternViT's patches and its CLS token
        return ImageTokens(size=(width, height), resized=(side, side), grid=(tiles, side // patch, side // patch),
                           vision_tokens=tiles * per_tile, tokens=tiles * int(s["tokens_per_image"]), crops=tiles)
    # Llama 3.2 Vision: up to max_image_tiles 560-pixel tiles, read by cross-attention
    if cls == "MllamaImageProcessor":
        side, most = int(s["size"]), int(s["max_image_tiles"])
        used = _remembered((cls, side, most, width, height), lambda: _mllama_tiles(cls, side, most, width, height))
        patch = spec.vision.patch_size
        per_tile = (side // patch) ** 2 + 1  # 40 x 40 patches and a CLS token
        # the tower runs every tile slot, the unused ones padded (MllamaVisionModel: batch x images x max tiles)
        return ImageTokens(size=(width, height), resized=(side, side), grid=(most, side // patch, side // patch),
                           vision_tokens=most * per_tile, tokens=int(s["tokens_per_image"]), crops=used)
    if cls == "LlavaOnevisionImageProcessor":  # LLaVA-OneVision: anyres 384-pixel tiles plus the whole image
        side, per_crop = int(s["size"]), int(s["num_image_tokens"])
        aspect, strategy = str(s["vision_aspect_ratio"]), str(s["vision_feature_select_strategy"])
        patch = spec.vision.patch_size
        if images_in_sample > 1:  # several images: each padded square into one 384 crop, no tiles (the image
            # processor's need_patching), and the processor's num_image_tokens + 1 (its newline) each
            tokens = per_crop + 1 - (1 if strategy == "default" else 0)
            return ImageTokens(size=(width, height), resized=(side, side), grid=(1, side // patch, side // patch),
                               vision_tokens=(side // patch) ** 2, tokens=tokens)
        pins = [[int(a), int(b)] for a, b in spec.config["image_grid_pinpoints"]]
        answer = _remembered((cls, side, per_crop, aspect, strategy, pins, width, height),
                             lambda: _onevision_count(cls, side, per_crop, aspect, strategy, pins, width, height))
        crops = int(answer["crops"])
        bh, bw = answer["best"]
        # the tower runs every crop (LlavaOnevisionModel.get_image_features): 27 x 27 SigLIP patches each, no CLS
        return ImageTokens(size=(width, height), resized=(bw, bh), grid=(crops, side // patch, side // patch),
                           vision_tokens=crops * (side // patch) ** 2, tokens=int(answer["tokens"]), crops=crops)
    if cls == "PixtralImageProcessor":  # Mistral 3 / Pixtral: any size up to longest_edge, in 28-pixel cells
        patch, merge, edge = int(s["patch_size"]), int(s["spatial_merge_size"]), int(s["longest_edge"])
        rh, rw = _remembered((cls, patch, merge, edge, width, height),
                             lambda: _pixtral_resize(cls, patch * merge, edge, width, height))
        rows, cols = rh // (patch * merge), rw // (patch * merge)
        # the text: an [IMG] per cell and an [IMG_BREAK] (the last one [IMG_END]) per row
        # (PixtralProcessor.replace_image_token); the tower: every 14-pixel patch, one sequence per image
        return ImageTokens(size=(width, height), resized=(rw, rh), grid=(1, rh // patch, rw // patch),
                           vision_tokens=(rh // patch) * (rw // patch), tokens=(cols + 1) * rows)
    if cls == "SmolVLMImageProcessor":  # SmolVLM2: tiles of tile_size within longest_edge, plus the whole image
        edge, tile, per_tile = int(s["longest_edge"]), int(s["tile_size"]), int(s["image_seq_len"])
        split = bool(s.get("do_image_splitting", True))
        rows, cols, tokens = _remembered((cls, edge, tile, per_tile, split, width, height),
                                         lambda: _smolvlm_count(cls, edge, tile, per_tile, split, width, height))
        crops = rows * cols + 1 if rows or cols else 1
        side = tile // spec.vision.patch_size
        # the tower runs every crop at tile x tile (SmolVLMModel.get_image_features: batch x crops images), its
        # (tile / patch)^2 patches each; the connector's pixel shuffle leaves image_seq_len tokens a crop
        return ImageTokens(size=(width, height), resized=(max(cols, 1) * tile, max(rows, 1) * tile),
                           grid=(crops, side, side), vision_tokens=crops * side * side, tokens=tokens, crops=crops)
    raise AdvisorInputError("--image-size", f"the {cls} of {spec.name} has no token count here", spec.name,
                            show_value=False)


def _smolvlm_count(cls: str, edge: int, tile: int, per_tile: int, split: bool, width: int, height: int) -> list:
    """[rows, columns, <image> tokens] of one image for SmolVLM: the image processor's own
    ``get_number_of_image_patches`` (resized to ``longest_edge``, cut into ``max_image_size`` tiles, plus the whole
    image; no tiles when it fits one), and the ``<image>`` tokens of the prompt string SmolVLMProcessor writes for it
    (processing_smolvlm ``get_image_prompt_string``: ``image_seq_len`` per tile and for the global image; the
    ``<fake_token_around_image>``, ``<row_r_col_c>`` and ``<global-img>`` markers beside them are not counted)."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    proc = _processor_class(cls)(size={"longest_edge": edge}, max_image_size={"longest_edge": tile},
                                 do_image_splitting=split)
    _, rows, cols = proc.get_number_of_image_patches(height, width, {})
    text = get_image_prompt_string(int(rows), int(cols), per_tile, fake_token_around_image="<fake_token_around_image>",
                                   image_token="<image>", global_image_token="<global-img>")
    return [int(rows), int(cols), text.count("<image>")]


def _pixtral_resize(cls: str, cell: int, edge: int, width: int, height: int) -> list[int]:
    """The (height, width) Pixtral's image processor resizes an image to: its own ``get_resize_output_image_size``
    within ``longest_edge``, in whole cells of patch x merge pixels (PixtralProcessor passes that product as the
    processor's patch size)."""
    import importlib

    import numpy as np

    module = importlib.import_module(_processor_class(cls).__module__)
    rh, rw = module.get_resize_output_image_size(np.zeros((height, width, 3), dtype=np.uint8), size=(edge, edge),
                                                 patch_size=(cell, cell))
    return [int(rh), int(rw)]


def _onevision_count(cls: str, side: int, per_crop: int, aspect: str, strategy: str, pins: list,
                     width: int, height: int) -> dict:
    """LLaVA-OneVision's crops and tokens for one image, by transformers' own arithmetic: the image processor's
    ``select_best_resolution`` picks the tile grid (its ``get_image_patches`` cuts that grid plus the whole image),
    and ``LlavaOnevisionProcessor._get_number_of_features`` counts the language model's tokens (the base crop, the
    tiles unpadded to the image's aspect and pooled past ``anyres_max_9``, a newline per row). The processor is made
    without its tokenizer (nothing is downloaded): only the attributes that count are set."""
    from transformers import LlavaOnevisionProcessor
    from transformers.image_processing_utils import select_best_resolution

    best_h, best_w = select_best_resolution((height, width), pins)
    proc = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)
    proc.image_processor = _processor_class(cls)(size={"height": side, "width": side}, image_grid_pinpoints=pins)
    proc.num_image_tokens, proc.vision_aspect_ratio = per_crop, aspect
    tokens = int(proc._get_number_of_features(height, width, side, side))
    if strategy == "default":  # replace_image_token: the CLS dropped
        tokens -= 1
    return {"crops": 1 + (int(best_h) // side) * (int(best_w) // side), "best": [int(best_h), int(best_w)],
            "tokens": tokens}


@lru_cache(maxsize=16)
def _tile_processor(cls: str, side: int, lo: int, hi: int, crop: bool):
    return _processor_class(cls)(size={"height": side, "width": side}, min_patches=lo, max_patches=hi,
                                 crop_to_patches=crop)


@lru_cache(maxsize=256)
def _mllama_tiles(cls: str, side: int, most: int, width: int, height: int) -> int:
    """Tiles Llama 3.2 Vision's processor cuts an image into: its own ``get_optimal_tiled_canvas``."""
    import importlib

    module = importlib.import_module(_processor_class(cls).__module__)
    canvas_h, canvas_w = module.get_optimal_tiled_canvas(image_height=height, image_width=width,
                                                         max_image_tiles=most, tile_size=side)
    return int(canvas_h // side) * int(canvas_w // side)


def _qwen_resize(height: int, width: int, factor: int, lo: int, hi: int) -> tuple[int, int]:
    """The resized (height, width): transformers' own ``smart_resize`` (qwen2_vl image processing)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize(height, width, factor, min_pixels=lo, max_pixels=hi)


def video_frames(spec, plan) -> int:
    """Frames the video processor samples: ``--video-frames`` as given, or ``--video-seconds`` x fps (the
    processor's, or ``--video-fps``), each bounded by the processor's min and max frames (or ``--max-frames``) and
    rounded to whole temporal patches (transformers' ``Qwen2VLVideoProcessor.sample_frames``)."""
    v = (spec.processor or {}).get("video") or {}
    temporal = spec.vision.temporal_patch_size if spec.vision else 1
    hi = int(plan.max_frames or v.get("max_frames", 768))
    lo = int(v.get("min_frames", 1))
    if plan.video_frames:
        n = min(plan.video_frames, hi)
    elif plan.video_seconds:
        fps = float(plan.video_fps or v.get("fps", 2.0))
        n = min(max(int(plan.video_seconds * fps), lo), hi)
    else:
        return 0
    return max(temporal, math.floor(n / temporal) * temporal) if temporal > 1 else n


def count_video(spec, plan) -> VideoTokens | None:
    """The tokens of the sample's video: its frames, each resized within the per-frame budget (the processor's,
    ``--video-max-pixels``, lowered by ``--video-total-pixels``), grouped in temporal patches of 2 frames."""
    frames = video_frames(spec, plan)
    if not frames:
        return None
    v = (spec.processor or {}).get("video")
    if not v:
        raise AdvisorInputError("--video-frames", f"{spec.name} has no video processor in the catalog", spec.name,
                                show_value=False)
    img = _image_settings(spec)
    patch, merge, temporal = int(img["patch_size"]), int(img["merge_size"]), int(img["temporal_patch_size"])
    lo = int(v["min_pixels"])
    hi = int(plan.video_max_pixels or v["max_pixels"])
    if plan.video_total_pixels:  # qwen_vl_utils fetch_video: max(min(VIDEO_MAX_PIXELS, total / nframes * 2), ...)
        hi = max(min(hi, int(plan.video_total_pixels / frames * temporal)), int(lo * 1.05))
    side = math.isqrt(hi)  # a frame as large as the budget allows (the worst case of any frame size)
    factor = patch * merge
    def ask():
        if v["class"] == "Qwen3VLVideoProcessor":  # its budget bounds frames x height x width
            from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as resize3

            return list(resize3(frames, side, side, temporal, factor, min_pixels=lo, max_pixels=hi * frames))
        return list(_qwen_resize(side, side, factor, lo, hi))
    rh, rw = _remembered((v["class"], frames, side, temporal, factor, lo, hi), ask)
    grid = (frames // temporal, rh // patch, rw // patch)
    patches = grid[0] * grid[1] * grid[2]
    return VideoTokens(frames=frames, frame_size=(side, side), resized=(rw, rh), grid=grid, vision_tokens=patches,
                       tokens=patches // (merge * merge), max_pixels=hi)


def sequence_tokens(spec, plan) -> int:
    """The language model's sequence one planned sample fills: ``seq_len`` text tokens and the tokens its images and
    video take there (what a tool's sequence cap must hold: TRL's max_length, LLaMA-Factory's cutoff_len, axolotl's
    sequence_len count image placeholders too)."""
    sample = count_sample(spec, plan)
    return plan.seq_len + (sample.text_tokens if sample is not None else 0)


def pixel_budget(spec) -> dict | None:
    """The image processor's settings where it resizes within a pixel budget (Qwen-VL's smart_resize within
    ``max_pixels``); None for a fixed size (Gemma 3's 896 square, InternVL's tiles) or a text model."""
    image = (spec.processor or {}).get("image") or {}
    return image if spec.is_vision_language and "max_pixels" in image else None


def planned_pixel_budget(spec, plan) -> int | None:
    """The ``max_pixels`` that lets the plan's own images through as planned and scales any larger one down to
    their tokens: the largest planned image's resized pixels, for a processor that resizes within a pixel budget
    (Qwen-VL's smart_resize); None where the plan sets its own budget, names no image, or the processor's size is
    fixed (an exported run then takes the data's images at the plan's budget)."""
    if plan.max_pixels or not plan.image_sizes or pixel_budget(spec) is None:
        return None
    sample = count_sample(spec, plan)
    return max(w * h for w, h in (i.resized for i in sample.images))


def count_sample(spec, plan) -> VisionInput | None:
    """What the plan's sample (``--image-size`` each, the video) becomes for ``spec``; None without images or
    video."""
    from advisor.core.plan import image_size_of

    if not (plan.image_sizes or plan.video_frames or plan.video_seconds):
        return None
    images = tuple(count_image(spec, *image_size_of(s), min_pixels=plan.min_pixels, max_pixels=plan.max_pixels,
                               images_in_sample=len(plan.image_sizes)) for s in plan.image_sizes)
    video = count_video(spec, plan)
    img = (spec.processor or {}).get("image", {})
    settings = {k: img[k] for k in ("min_pixels", "max_pixels", "size", "tokens_per_image", "longest_edge",
                                    "tile_size", "image_seq_len") if k in img}
    if plan.min_pixels:
        settings["min_pixels"] = plan.min_pixels
    if plan.max_pixels:
        settings["max_pixels"] = plan.max_pixels
    vision = spec.vision
    return VisionInput(images=images, video=video, in_text=not (vision and vision.cross_attention_layers),
                       processor=processor_name(img["class"]) if img else "", settings=settings)
