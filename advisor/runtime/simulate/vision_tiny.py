"""Tiny vision-language models of each family, from configs, for the proofs that run real tensors on a CPU.

Each is a full ``*ForConditionalGeneration`` config (a ``text_config`` of two or three 64-wide layers, a
``vision_config`` of two 32-wide blocks) with the family's structure kept: Qwen2.5-VL's window and full-attention
blocks, Qwen3-VL's deepstack merger, Gemma 3's SigLIP tower and pooled projector with sliding and full layers,
Mllama's tiles, global blocks and a cross-attention layer, InternVL's tiles and pixel shuffle, LLaVA-OneVision's
anyres tiles (28 pixels, a 2 x 2 grid at most) and image newline, Mistral 3's Pixtral tower on any size within 112
pixels and its 2x2 patch merger, SmolVLM's tiles
(32 pixels within a 64-pixel longest edge, plus the whole image) and its connector's 2x2 pixel shuffle.
"""

from __future__ import annotations

import copy

from advisor.core.catalog import ModelSpec, spec_from_config

_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             vocab_size=512, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True)
_MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6}

TINY_VL = {
    "qwen2_5_vl": dict(
        text_config=dict(_TEXT, hidden_act="silu", rope_parameters=_MROPE),
        vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           fullatt_block_indexes=[1, 3], window_size=56),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503),
    "qwen3_vl": dict(
        text_config=dict(_TEXT, head_dim=16, hidden_act="silu", rope_parameters={**_MROPE, "mrope_interleaved": True}),
        vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           deepstack_visual_indexes=[1], num_position_embeddings=64),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503),
    "gemma3": dict(
        text_config=dict(_TEXT, model_type="gemma3_text", num_hidden_layers=3, head_dim=16, sliding_window=16,
                         hidden_activation="gelu_pytorch_tanh", sliding_window_pattern=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                           image_size=64, patch_size=8),
        mm_tokens_per_image=16, image_token_index=500, boi_token_index=501, eoi_token_index=502),
    "mllama": dict(
        text_config=dict(_TEXT, num_hidden_layers=3, cross_attention_layers=[1], hidden_act="silu",
                         pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_global_layers=1,
                           attention_heads=2, image_size=28, patch_size=14, max_num_tiles=4,
                           vision_output_dim=96, intermediate_layers_indices=[0, 2]),
        image_token_index=500),
    "internvl": dict(
        text_config=dict(_TEXT, model_type="qwen2", hidden_act="silu"),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                           image_size=[56, 56], patch_size=[14, 14]),
        image_token_id=500, downsample_ratio=0.5),
    "llava_onevision": dict(
        text_config=dict(_TEXT, model_type="qwen2", hidden_act="silu"),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=2, image_size=28, patch_size=14, vision_use_head=False),
        image_grid_pinpoints=[[28, 28], [28, 56], [56, 28], [56, 56]], vision_feature_layer=-1,
        vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9", image_token_index=500,
        video_token_index=501, tie_word_embeddings=True),
    "mistral3": dict(
        text_config=dict(_TEXT, model_type="mistral", head_dim=16, hidden_act="silu", sliding_window=None),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=2, head_dim=16, image_size=112, patch_size=14),
        spatial_merge_size=2, vision_feature_layer=-1, image_token_index=500, multimodal_projector_bias=False,
        tie_word_embeddings=True),
    "smolvlm": dict(
        text_config=dict(_TEXT, model_type="llama", head_dim=16, hidden_act="silu", tie_word_embeddings=False),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                           image_size=32, patch_size=8),
        image_token_id=500, scale_factor=2, tie_word_embeddings=False),
}

PROCESSOR = {
    "qwen2_5_vl": {"image": {"class": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
                             "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 12845056}},
    "qwen3_vl": {"image": {"class": "Qwen2VLImageProcessor", "patch_size": 16, "merge_size": 2,
                           "temporal_patch_size": 2, "min_pixels": 65536, "max_pixels": 16777216}},
    "gemma3": {"image": {"class": "Gemma3ImageProcessor", "size": 64, "tokens_per_image": 16,
                         "do_pan_and_scan": False}},
    "llava_onevision": {"image": {"class": "LlavaOnevisionImageProcessor", "size": 28, "num_image_tokens": 4,
                                  "vision_aspect_ratio": "anyres_max_9", "vision_feature_select_strategy": "full"}},
    "mistral3": {"image": {"class": "PixtralImageProcessor", "patch_size": 14, "spatial_merge_size": 2,
                           "longest_edge": 112}},
    "smolvlm": {"image": {"class": "SmolVLMImageProcessor", "longest_edge": 64, "tile_size": 32, "image_seq_len": 4,
                          "do_image_splitting": True}},
}
"""The processor settings the catalog stores beside each family's config (models.yaml ``processor``), at the tiny
models' sizes (Qwen's are the real ones: their patch size is the real models')."""


def tiny_vl_spec(model_type: str, num_layers: int | None = None, **vision_overrides) -> ModelSpec:
    """A tiny vision-language ModelSpec of ``model_type`` (one of ``TINY_VL``), its language model of ``num_layers``
    layers if given."""
    config = copy.deepcopy(TINY_VL[model_type])
    config["model_type"] = model_type
    if num_layers is not None:
        config["text_config"]["num_hidden_layers"] = num_layers
    config["vision_config"].update(vision_overrides)
    name = f"tiny-{model_type}"
    return spec_from_config(name, name, config, "test", None, None, processor=PROCESSOR.get(model_type))
