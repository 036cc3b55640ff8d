"""The images of a served prompt, and what vLLM holds for a vision-language model beside the language model.

A prompt's images become tokens of its sequence (counted by the model's own image processor,
advisor.core.vision_tokens): they take context and KV cache like text (vLLM refuses a prompt unless max_model_len
holds "the number of text tokens plus multimodal tokens"). vLLM itself does not know the served images: it sizes its
multimodal memory on the largest item the processor can make (the pixel bound, ``max_pixels``) and on
``limit_mm_per_prompt``, in three places:

- the tower's weights (the tower and the projector), loaded unless every modality's limit is 0 for a family whose
  class then builds no tower (serve_priors.yaml ``vision``);
- the encoder cache: ``profile_run`` keeps the dummy encoder outputs of ``max_items_per_batch`` items of the
  largest size alive while it profiles the language model (vllm/v1/worker/gpu_model_runner.py ``profile_run``:
  ``self.encoder_cache["tmp"] = dict(enumerate(dummy_encoder_outputs))`` before ``_dummy_run``), so the reserve
  outside the KV cache holds them;
- the tower's own activation on its own sequence of patches (before the 2x2 merge: four times the items' tokens for
  Qwen2.5-VL), when ``profile_run`` runs ``embed_multimodal`` on that dummy batch, with the batch's pixels.

vLLM keeps the peak of that profiling run outside the KV cache (gpu_worker.py ``determine_available_memory``), so
the plan's activation reserve is the larger of the tower's phase and the language model's phase.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from advisor.core.catalog import ModelSpec
from advisor.core.errors import AdvisorInputError

COMPUTE_BYTES = 2
"""bf16 activations and encoder outputs (the model dtype vLLM serves a 16-bit checkpoint in)."""
PIXEL_BYTES = 4
"""The processor's pixel_values are fp32; the tower casts them to its dtype itself (qwen2_5_vl.py
``Qwen2_5_VisionTransformer.forward``: ``x.to(device=self.device, dtype=self.dtype)``)."""
VLLM_HUGE_SIDE = 9999999
"""vLLM's largest image: ``get_image_size_with_most_features`` resizes a 9999999 x 9999999 image within the
processor's pixel bounds (vllm/model_executor/models/qwen2_vl.py ``Qwen2VLProcessingInfo``)."""


@dataclass(frozen=True)
class ServeVision:
    """A served prompt's images and video, and the largest item vLLM profiles with (hashable: it rides on a
    ServePlan through the serving grid)."""

    image_tokens_per_image: tuple[int, ...]
    """Language-model tokens of each image of a prompt (the processor's count)."""
    image_tokens: int
    video_tokens: int
    vision_tokens: int
    """The tower's own sequence over a prompt's images and video (its patches, before merging)."""
    in_text: bool
    """The image tokens sit in the language model's sequence (False: read by cross-attention)."""
    limits: tuple[tuple[str, int], ...]
    """vLLM's limit_mm_per_prompt: (modality, items) for image and video."""
    item_tokens: int
    """Embeddings of the largest item vLLM profiles with (``get_mm_max_tokens_per_item``)."""
    item_patches: int
    """The tower's patches for that item."""
    item_pixel_values: int
    """Pixel values (fp32 elements) of that item as the processor makes them."""
    processor_kwargs: tuple[tuple[str, int], ...] = ()
    """The pixel bounds given (``--mm-processor-kwargs``); empty: the processor's own."""
    processor: str = ""
    sample: str = "{}"
    """VisionInput.to_dict() of a prompt, as JSON (kept hashable)."""

    @property
    def tokens(self) -> int:
        """Tokens a prompt's images and video take in the language model's sequence."""
        return self.image_tokens + self.video_tokens if self.in_text else 0

    @property
    def enabled(self) -> bool:
        """Some modality may reach the tower (a limit above 0)."""
        return any(n for _, n in self.limits)

    def limit_mm_per_prompt(self) -> str:
        """The `--limit-mm-per-prompt` JSON (vLLM's documented form, e.g. '{"image": 2, "video": 0}')."""
        return json.dumps(dict(self.limits))

    def mm_processor_kwargs(self) -> str | None:
        return json.dumps(dict(self.processor_kwargs)) if self.processor_kwargs else None

    def to_dict(self) -> dict[str, Any]:
        sample = json.loads(self.sample)
        return {"image_tokens_per_image": list(self.image_tokens_per_image), "image_tokens": self.image_tokens,
                "video_tokens": self.video_tokens, "vision_tokens": self.vision_tokens,
                "tokens_in_text_sequence": self.tokens, "limit_mm_per_prompt": dict(self.limits),
                "mm_processor_kwargs": dict(self.processor_kwargs), "processor": self.processor,
                "vllm_max_item": {"tokens": self.item_tokens, "vision_tokens": self.item_patches},
                "images": sample.get("images", []), "video": sample.get("video")}


def _pixel_values(model: ModelSpec, patches: int, images: int) -> int:
    """fp32 pixel values of ``patches`` patches: C x t x P x P per patch (Qwen: 3 x 2 x 14 x 14 = 1176, vision.py's
    formula), or the whole fixed-size image of a fixed-resolution processor (SigLIP: C x S x S)."""
    v = model.vision
    if v.image_size:
        return images * v.in_channels * v.image_size ** 2
    return patches * v.in_channels * v.temporal_patch_size * v.patch_size ** 2


def serve_vision(model: ModelSpec, sample) -> ServeVision | None:
    """What ``sample`` (a Plan holding image_sizes, the pixel bounds and the video flags) becomes for ``model``;
    None for a model without a tower. A vision-language model served text only has limits of 0."""
    from advisor.core.plan import has_vision_input, vision_model_problems
    from advisor.core.vision_tokens import count_image, count_sample, processor_name

    problems = vision_model_problems(sample, model.vision is not None, model.name)
    if problems:
        from advisor.core.knobs import format_value

        raise AdvisorInputError(problems[0].where, problems[0].rule, format_value(problems[0].value))
    if model.vision is None:
        return None
    vis = count_sample(model, sample) if has_vision_input(sample) else None
    images = len(sample.image_sizes)
    video = 1 if vis is not None and vis.video is not None else 0
    limits = (("image", images), ("video", video))
    kwargs = tuple((k, int(getattr(sample, k))) for k in ("max_pixels", "min_pixels") if getattr(sample, k))
    item_tokens = item_patches = item_pixels = 0
    if images:
        # the largest image the processor makes within its bounds (vllm qwen2_vl.py get_max_image_tokens)
        big = count_image(model, VLLM_HUGE_SIDE, VLLM_HUGE_SIDE, min_pixels=sample.min_pixels,
                          max_pixels=sample.max_pixels, images_in_sample=images)
        # a tiling processor (InternVL, LLaVA-OneVision) cuts most tiles at some aspect ratio, not the square: the
        # largest of the prompt's own images when it makes more (a lower bound of vLLM's largest item)
        big = max([big, *(vis.images if vis else ())], key=lambda i: (i.tokens, i.vision_tokens))
        item_tokens, item_patches = big.tokens, big.vision_tokens
        item_pixels = _pixel_values(model, big.vision_tokens, 1)
    if vis is not None and vis.video is not None and vis.video.tokens > item_tokens:
        # vLLM profiles the modality with the most tokens per item (MultiModalBudget.get_modality_with_max_tokens);
        # its largest video is the prompt's own here (vLLM's 14-frame dummy at the image bound is not replayed)
        item_tokens, item_patches = vis.video.tokens, vis.video.vision_tokens
        item_pixels = _pixel_values(model, vis.video.vision_tokens, 1)
    img_cls = ((model.processor or {}).get("image") or {}).get("class", "")
    return ServeVision(
        image_tokens_per_image=tuple(i.tokens for i in vis.images) if vis else (),
        image_tokens=vis.image_tokens if vis else 0, video_tokens=vis.video_tokens if vis else 0,
        vision_tokens=vis.vision_tokens if vis else 0, in_text=vis.in_text if vis else True, limits=limits,
        item_tokens=item_tokens, item_patches=item_patches, item_pixel_values=item_pixels,
        processor_kwargs=kwargs, processor=processor_name(img_cls) if img_cls else "",
        sample=json.dumps(vis.to_dict() if vis else {}, sort_keys=True))


def check_context(vision: ServeVision | None, context_len: int, flag: str = "--context-len") -> None:
    """The context must hold a prompt's image tokens and at least one text token (vLLM: max_model_len holds
    "the number of text tokens plus multimodal tokens")."""
    if vision is not None and vision.tokens >= context_len:
        raise AdvisorInputError(flag, f"a prompt's images alone take {vision.tokens:,} tokens "
                                f"({' + '.join(map(str, vision.image_tokens_per_image))} per image"
                                f"{f' + {vision.video_tokens} video' if vision.video_tokens else ''}): "
                                "raise the context or lower --max-pixels", context_len)


# --------------------------------------------------------------------------- vLLM's multimodal ledger

def tower_loaded(model: ModelSpec, vision: ServeVision | None) -> bool:
    """vLLM loads the tower unless every limit is 0 for a family that then builds none (serve_priors.yaml)."""
    from advisor.core.serve_priors import load_priors

    if model.vision is None:
        return False
    if vision is not None and vision.enabled:
        return True
    return model.config.get("model_type") not in load_priors()["vision"]["skip_tower_model_types"]


def tower_weight_bytes(model: ModelSpec, weight_format: str) -> tuple[int, int]:
    """(weights, scales) of the tower and projector in the format vLLM holds them for the plan's weight format
    (serve_priors.yaml ``vision.tower_format``): 16-bit, or fp8 linears with one fp32 scale per output channel
    (the language model's fp8 scheme); what is not a linear (patch embedding, norms) stays 16-bit."""
    from advisor.core.serve_priors import load_priors
    from advisor.memory.vision import tower_blocks

    v = model.vision
    fmt = load_priors()["vision"]["tower_format"][weight_format]
    if fmt != "fp8":
        return int(v.params * COMPUTE_BYTES), 0
    linears = [(tower_blocks(model), v.block_linears), (1, v.projector_linears)]
    weights = sum(n * m.in_features * m.out_features for n, ms in linears for m in ms)
    rows = sum(n * m.out_features for n, ms in linears for m in ms)
    return int(weights + (v.params - weights) * COMPUTE_BYTES), int(rows * 4)


def encoder_budget(vision: ServeVision, max_num_batched_tokens: int) -> tuple[int, int]:
    """(encoder compute budget, encoder cache size) in embeddings: both default to max_num_batched_tokens and are
    raised to the largest item (vllm/v1/core/encoder_cache_manager.py ``compute_mm_encoder_budget``:
    ``_get_max_num_batched_encoder_embeds`` and ``_get_encoder_cache_size``: max(default, max_tokens_per_mm_item))."""
    if not vision.enabled or not vision.item_tokens:
        return 0, 0
    return max(max_num_batched_tokens, vision.item_tokens), max(max_num_batched_tokens, vision.item_tokens)


def items_per_batch(vision: ServeVision, max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
    """Items of the largest size ``profile_run`` encodes at once (vllm/multimodal/encoder_budget.py
    ``MultiModalBudget._get_max_items``: min(encoder budget // item tokens, max_num_seqs x items per prompt), at
    least 1, items per prompt = max(1, min(limit, max_model_len // item tokens)); chunked prefill is on)."""
    compute, cache = encoder_budget(vision, max_num_batched_tokens)
    budget = min(compute, cache)  # MultiModalBudget.get_encoder_budget
    if not budget:
        return 0
    limit = max(n for _, n in vision.limits)
    per_prompt = max(1, min(limit, max_model_len // vision.item_tokens))
    return max(1, min(budget // vision.item_tokens, max_num_seqs * per_prompt))


def embedding_width(model: ModelSpec) -> int:
    """Width of one encoder output: the language model's hidden size, times 1 + the deepstack levels Qwen3-VL's
    tower returns concatenated with it (vllm/model_executor/models/qwen3_vl.py ``Qwen3_VisionTransformer.forward``:
    ``torch.cat([hidden_states] + deepstack_feature_lists, dim=1)``)."""
    return model.hidden_size * (1 + len(model.vision.deepstack_layers))


def encoder_cache_bytes(model: ModelSpec, vision: ServeVision, max_num_batched_tokens: int, max_model_len: int,
                        max_num_seqs: int) -> int:
    """The dummy encoder outputs profile_run keeps cached through the language model's profiling: items x tokens
    per item x width x 2 bytes (gpu_model_runner.py ``profile_run``: outputs of ``max_items_per_batch`` items,
    each expanded to ``max_tokens_by_modality`` rows when shorter)."""
    n = items_per_batch(vision, max_num_batched_tokens, max_model_len, max_num_seqs)
    return n * vision.item_tokens * embedding_width(model) * COMPUTE_BYTES


def tower_widths_per_patch(model: ModelSpec) -> int:
    """Activation widths one patch holds at the peak of a tower block, no grad (vllm qwen2_5_vl.py
    ``Qwen2_5_VisionBlock.forward``): in the MLP the block input, the attention output, norm2's output and the new
    residual (4 x w) beside the fused gate_up output (2 x i) and act_and_mul's product (i) (a plain fc1/act/fc2 MLP:
    fc1's output and its activation, 2 x i); in attention the input and norm1's output (2w), fused qkv (3w), the
    rotary's concatenated and rotated q/k (4w) and the output (w). Attention itself holds no scores: vLLM's ViT runs
    flash-attention varlen or sdpa per image (``Qwen2_5_VisionAttention.forward``), for which vision.py's
    ``attention_bytes`` is 0."""
    from advisor.memory.vision import _mlp_kind

    v = model.vision
    w, i = v.hidden_size, v.intermediate_size
    mlp = 4 * w + (3 if _mlp_kind(model) == "swiglu" else 2) * i
    return max(mlp, 10 * w)


def tower_activation_bytes(model: ModelSpec, patches: int, pixel_values: int) -> int:
    """The tower's forward over ``patches`` patches: the batch's fp32 pixels (alive through the whole profiling run:
    ``profile_run`` holds ``batched_dummy_mm_inputs``) and a block's working set, ``tower_widths_per_patch`` x 2 B
    per patch; vision.py ``attention_bytes`` (0 for flash / sdpa) for the attention workspace of an image."""
    from advisor.core.plan import Plan
    from advisor.memory.vision import attention_bytes

    workspace, _ = attention_bytes(model, Plan(attn_impl="sdpa"), patches)
    return int(pixel_values * PIXEL_BYTES + COMPUTE_BYTES * patches * tower_widths_per_patch(model) + workspace)


def vllm_vision_terms(model: ModelSpec, vision: ServeVision | None, plan) -> dict[str, int]:
    """vLLM's multimodal terms of a plan: ``vision_weights``, ``vision_constants``, ``encoder_cache`` (the cached
    dummy outputs), ``tower_profile`` (the tower's profiling forward with its pixels) and ``pixel_values`` (the
    dummy batch's pixels, alive through the language model's profiling too)."""
    out = {"vision_weights": 0, "vision_constants": 0, "encoder_cache": 0, "tower_profile": 0, "pixel_values": 0}
    if not tower_loaded(model, vision):
        return out
    out["vision_weights"], out["vision_constants"] = tower_weight_bytes(model, plan.weight_format)
    if vision is None or not vision.enabled or not vision.item_tokens:
        return out
    n = items_per_batch(vision, plan.batched_tokens, plan.context_len, plan.concurrency)
    out["encoder_cache"] = encoder_cache_bytes(model, vision, plan.batched_tokens, plan.context_len,
                                               plan.concurrency)
    out["pixel_values"] = n * vision.item_pixel_values * PIXEL_BYTES
    out["tower_profile"] = tower_activation_bytes(model, n * vision.item_patches, n * vision.item_pixel_values)
    return out


def hf_tower_bytes(model: ModelSpec, vision: ServeVision | None, batch: int) -> int:
    """transformers' generate runs the tower on every prompt's images before the prefill: the batch's patches
    through a block (the same widths) with their pixels."""
    if vision is None or not vision.vision_tokens:
        return 0
    sample = json.loads(vision.sample)
    pixels = sum(_pixel_values(model, i["vision_tokens"], 1) for i in sample.get("images", []))
    if sample.get("video"):
        pixels += _pixel_values(model, sample["video"]["vision_tokens"], 1)
    return tower_activation_bytes(model, batch * vision.vision_tokens, batch * pixels)
