"""Image and video tokens as the model's own processor counts them: the counts the advisor plans with
(advisor.core.vision_tokens) against transformers' processor called on real images of those sizes (PIL, on the CPU;
no download: the processor is built from the catalog's stored preprocessor settings)."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan, parse_image_size
from advisor.core.vision_tokens import _processor_class, count_image, count_sample, video_frames

pytest.importorskip("PIL")


def _processor_call(spec, width: int, height: int, **bounds):
    """(patches, tokens) of transformers' own processor run on a width x height image."""
    from PIL import Image

    s = spec.processor["image"]
    image = Image.new("RGB", (width, height))
    if s["class"] == "Qwen2VLImageProcessor":
        proc = _processor_class(s["class"])(patch_size=s["patch_size"], merge_size=s["merge_size"],
                                            temporal_patch_size=s["temporal_patch_size"],
                                            min_pixels=bounds.get("min_pixels", s["min_pixels"]),
                                            max_pixels=bounds.get("max_pixels", s["max_pixels"]))
        out = proc(images=[image], return_tensors="np")
        t, h, w = (int(x) for x in out["image_grid_thw"][0])
        assert out["pixel_values"].shape[0] == t * h * w  # one row per patch: the tower's sequence
        return t * h * w, t * h * w // s["merge_size"] ** 2
    proc = _processor_class(s["class"])(size={"height": s["size"], "width": s["size"]})
    out = proc(images=[image], return_tensors="np")
    side = out["pixel_values"].shape[-1]
    return (side // spec.vision.patch_size) ** 2, spec.config["mm_tokens_per_image"]


CASES = [  # (model, width, height, bounds, the tokens the issue states)
    ("Qwen/Qwen2.5-VL-7B-Instruct", 1024, 768, {}, 999),
    ("Qwen/Qwen2.5-VL-7B-Instruct", 3840, 2160, {"max_pixels": 1003520}, 1222),
    ("Qwen/Qwen3-VL-8B-Instruct", 1024, 768, {}, 768),
    ("google/gemma-3-12b-it", 1024, 768, {}, 256),
    ("Qwen/Qwen2-VL-7B-Instruct", 640, 480, {}, None),
    ("Qwen/Qwen2.5-VL-3B-Instruct", 100, 80, {}, None),  # under min_pixels: enlarged
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", 1920, 1080, {"max_pixels": 802816}, None),
]


@pytest.mark.parametrize("model, width, height, bounds, expected", CASES)
def test_counts_match_the_processor(model, width, height, bounds, expected):
    spec = resolve_model(model)
    counted = count_image(spec, width, height, **bounds)
    patches, tokens = _processor_call(spec, width, height, **bounds)
    assert (counted.vision_tokens, counted.tokens) == (patches, tokens)
    if expected is not None:
        assert counted.tokens == expected


def test_the_sample_adds_its_images_and_the_tower_sees_four_times_more():
    spec = resolve_model("qwen2.5-vl-7b")
    vis = count_sample(spec, Plan(image_sizes=("1024x768", "3840x2160"), max_pixels=1003520))
    assert [i.tokens for i in vis.images] == [999, 1222]
    assert vis.image_tokens == vis.text_tokens == 999 + 1222
    assert vis.vision_tokens == 4 * (999 + 1222)  # the 2x2 merge
    d = vis.to_dict()
    assert d["image_tokens_per_image"] == [999, 1222] and d["vision_tokens"] == vis.vision_tokens


def test_video_frames_and_their_budget():
    spec = resolve_model("qwen2.5-vl-7b")
    vis = count_sample(spec, Plan(video_frames=12, video_max_pixels=200704))
    assert vis.video.frames == 12 and vis.video.grid[0] == 6  # temporal patches of 2 frames
    assert vis.video.resized[0] * vis.video.resized[1] <= 200704
    assert vis.video_tokens == vis.video.grid[0] * vis.video.grid[1] * vis.video.grid[2] // 4
    lower = count_sample(spec, Plan(video_frames=12, video_max_pixels=200704, video_total_pixels=12 * 100352 // 2))
    assert lower.video_tokens < vis.video_tokens  # a total budget lowers the per-frame one
    # seconds x the processor's 2 fps, capped by --max-frames, rounded to whole temporal patches
    assert video_frames(spec, Plan(video_seconds=10)) == 20
    assert video_frames(spec, Plan(video_seconds=10, max_frames=7)) == 6
    assert video_frames(spec, Plan(video_seconds=10, video_fps=1.0)) == 10


def test_bad_image_sizes_name_the_flag():
    assert parse_image_size("1024X768") == "1024x768"
    for bad in ("1024", "0x10", "axb", "10x-3"):
        with pytest.raises(AdvisorInputError, match="--image-size"):
            parse_image_size(bad)
    assert Plan(image_sizes=("1024x",)).problems()[0].where == "--image-size"
    with pytest.raises(AdvisorInputError, match="--image-size"):
        count_image(resolve_model("qwen2.5-vl-7b"), 10000, 20)  # an aspect ratio beyond 200: smart_resize refuses


@pytest.mark.parametrize("model", ["OpenGVLab/InternVL3-8B-hf", "OpenGVLab/InternVL3_5-8B-HF"])
@pytest.mark.parametrize("width, height", [(1024, 768), (448, 448), (3840, 2160), (500, 2000)])
def test_internvl_tiles_match_the_processor(model, width, height):
    """InternVL's 448-pixel tiles plus a thumbnail (GotOcr2ImageProcessor crop_to_patches), 256 tokens each
    (InternVL3 and InternVL3.5 share the tower and the processor)."""
    from PIL import Image

    spec = resolve_model(model)
    s = spec.processor["image"]
    proc = _processor_class(s["class"])(size={"height": 448, "width": 448}, crop_to_patches=True,
                                        min_patches=s["min_patches"], max_patches=s["max_patches"])
    out = proc(images=[Image.new("RGB", (width, height))], return_tensors="np")
    counted = count_image(spec, width, height)
    assert counted.crops == int(out["num_patches"][0]) == out["pixel_values"].shape[0]
    assert counted.tokens == 256 * counted.crops and counted.vision_tokens == 1025 * counted.crops


@pytest.mark.parametrize("width, height", [(1024, 768), (448, 448), (500, 2000)])
def test_llama_vision_tiles_match_the_processor_and_stay_out_of_the_text(width, height):
    """Llama 3.2 Vision: up to 4 tiles of 560 pixels read by cross-attention; the text holds one <|image|> token."""
    from PIL import Image

    spec = resolve_model("meta-llama/Llama-3.2-11B-Vision-Instruct")
    proc = _processor_class("MllamaImageProcessor")(size={"height": 560, "width": 560}, max_image_tiles=4)
    out = proc(images=[[Image.new("RGB", (width, height))]], return_tensors="np")
    counted = count_image(spec, width, height)
    assert counted.crops == int(out["num_tiles"][0][0])
    assert out["pixel_values"].shape[2] == 4 and counted.vision_tokens == 4 * 1601  # every tile slot runs
    assert counted.tokens == 1
    assert spec.vision.cross_attention_layers == (3, 8, 13, 18, 23, 28, 33, 38)


def test_a_count_is_remembered_and_answered_without_the_processor(tmp_path, monkeypatch):
    """The processor's answer is kept in the user cache: the next process answers it without importing
    transformers' image processors (seconds saved per estimate)."""
    from advisor.core import vision_tokens

    monkeypatch.setenv("ADVISOR_ARCHITECTURE_CACHE", str(tmp_path))
    monkeypatch.setattr(vision_tokens, "_ANSWERS", None)
    spec = resolve_model("qwen2.5-vl-7b")
    first = count_image(spec, 1111, 777)
    assert (tmp_path / vision_tokens.CACHE_FILE).is_file()
    monkeypatch.setattr(vision_tokens, "_ANSWERS", None)  # a new process: read back from the file

    def no_processor(name):
        raise AssertionError("the processor was asked again")

    monkeypatch.setattr(vision_tokens, "_qwen_processor", no_processor)
    assert count_image(spec, 1111, 777) == first


def _onevision_processor(s, pins):
    """transformers' LlavaOnevisionProcessor over its own image processor and an offline word-level tokenizer that
    knows ``<image>`` (nothing downloaded; the video processor, which needs torchvision, is left out)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import LlavaOnevisionProcessor, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<image>": 1, "<video>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<image>", special=True), AddedToken("<video>", special=True)])
    proc = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)  # __init__ insists on the video processor
    proc.image_processor = _processor_class(s["class"])(size={"height": s["size"], "width": s["size"]},
                                                        image_grid_pinpoints=pins)
    proc.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    proc.video_processor = proc.chat_template = None
    proc.num_image_tokens, proc.vision_aspect_ratio = s["num_image_tokens"], s["vision_aspect_ratio"]
    proc.vision_feature_select_strategy = s["vision_feature_select_strategy"]
    proc.image_token, proc.video_token, proc.image_token_id, proc.video_token_id = "<image>", "<video>", 1, 2
    return proc


@pytest.mark.parametrize("width, height, tokens", [(1024, 768, 4725), (384, 384, 1485), (3840, 2160, None),
                                                    (500, 2000, None), (100, 80, None)])
def test_llava_onevision_tiles_match_the_processor(width, height, tokens):
    """LLaVA-OneVision: the best grid of 384-pixel tiles plus the whole image, every crop through the tower (729
    SigLIP patches each); the <image> tokens the processor writes into the text are the count planned."""
    from PIL import Image

    spec = resolve_model("llava-hf/llava-onevision-qwen2-7b-ov-hf")
    proc = _onevision_processor(spec.processor["image"], spec.config["image_grid_pinpoints"])
    out = proc(images=[Image.new("RGB", (width, height))], text=["<image>"], return_tensors="np")
    counted = count_image(spec, width, height)
    assert counted.crops == out["pixel_values"].shape[1]
    assert counted.vision_tokens == 729 * counted.crops
    assert counted.tokens == int((out["input_ids"] == 1).sum())
    if tokens is not None:
        assert counted.tokens == tokens


def test_llava_onevision_several_images_take_one_crop_each():
    """Two images in one LLaVA-OneVision sample: no tiles (the image processor patches a sample's single image
    only), each padded square into one 384 crop of 729 patches and 729 + 1 tokens, as the processor writes them."""
    from PIL import Image

    spec = resolve_model("llava-onevision-7b")
    proc = _onevision_processor(spec.processor["image"], spec.config["image_grid_pinpoints"])
    images = [Image.new("RGB", (1024, 768)), Image.new("RGB", (640, 480))]
    out = proc(images=[images], text=["<image> <image>"], return_tensors="np")
    vis = count_sample(spec, Plan(image_sizes=("1024x768", "640x480")))
    assert vis.image_tokens == int((out["input_ids"] == 1).sum()) == 2 * 730
    assert vis.vision_tokens == 729 * out["pixel_values"].shape[0] * out["pixel_values"].shape[1] == 2 * 729
    assert count_image(spec, 1024, 768).crops == 7  # alone, the same image is tiled


@pytest.mark.parametrize("width, height, tokens", [(1024, 768, 1064), (3840, 2160, None), (500, 2000, None),
                                                    (100, 80, None)])
def test_pixtral_cells_match_the_processor(width, height, tokens):
    """Mistral Small 3.1: the image resized within 1540 pixels to whole 28-pixel cells by the image processor (run
    here with the patch size PixtralProcessor gives it, patch x merge); the text gets an [IMG] per cell and a break
    per row (PixtralProcessor.replace_image_token's rows x (columns + 1), from the processed image's shape: the
    processor class itself imports the torchvision backend, absent here), the tower every 14-pixel patch."""
    from PIL import Image

    spec = resolve_model("mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    s = spec.processor["image"]
    cell = s["patch_size"] * s["spatial_merge_size"]
    proc = _processor_class(s["class"])(patch_size=cell, size={"longest_edge": s["longest_edge"]})
    out = proc(images=[Image.new("RGB", (width, height))], return_tensors="np")
    h, w = (int(x) for x in out["image_sizes"][0])
    assert out["pixel_values"].shape[-2:] == (h, w)
    counted = count_image(spec, width, height)
    assert counted.resized == (w, h) and counted.tokens == (h // cell) * (w // cell + 1)
    assert counted.vision_tokens == (h // s["patch_size"]) * (w // s["patch_size"])
    assert max(h, w) <= s["longest_edge"] + cell
    if tokens is not None:
        assert counted.tokens == tokens


@pytest.mark.parametrize("model", ["OpenGVLab/InternVL3-8B-hf", "OpenGVLab/InternVL3_5-8B-HF"])
def test_a_placeholder_token_the_config_leaves_out_is_its_config_class_default(model):
    """InternVL3.5-8B-HF's config.json has no image_token_id: the simulated batch takes InternVLConfig's default, as
    the model built from that config does, and marks one placeholder per image token (labels ignored there)."""
    from advisor.core.architecture import config_object
    from advisor.runtime.simulate.vision import VisionSettings, processor_batch

    spec = resolve_model(model)
    token = config_object(spec.config).image_token_id
    batch = processor_batch(spec, Plan(micro_batch=1, seq_len=64), VisionSettings(images=((448, 448),)))
    placeholders = int((batch["input_ids"] == token).sum())
    assert placeholders == count_image(spec, 448, 448).tokens
    assert bool((batch["labels"][batch["input_ids"] == token] == -100).all())


@pytest.mark.parametrize("model, width, height, tokens", [
    ("smolvlm2-2.2b", 1024, 768, 1053), ("smolvlm2-500m", 1024, 768, 832), ("smolvlm2-2.2b", 3840, 2160, None),
    ("smolvlm2-500m", 500, 2000, None), ("smolvlm2-2.2b", 100, 80, None), ("smolvlm2-500m", 512, 512, None)])
def test_smolvlm_tiles_match_the_processor(model, width, height, tokens):
    """SmolVLM2: the image processor (built from the catalog's size, max_image_size and do_image_splitting) resizes
    the longest edge to longest_edge, cuts tiles and adds the whole image, every crop through the tower at the tile
    size; the text gets the <image> tokens of the prompt string SmolVLMProcessor writes from the processor's rows
    and columns (get_image_prompt_string: image_seq_len per crop; SmolVLMProcessor itself needs num2words, absent
    here): 1024x768 is 3 x 4 tiles and the whole image, 13 x 81 = 1,053 tokens on the 2.2B, 13 x 64 = 832 on the
    500M."""
    from PIL import Image
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    spec = resolve_model(model)
    s = spec.processor["image"]
    proc = _processor_class(s["class"])(size={"longest_edge": s["longest_edge"]},
                                        max_image_size={"longest_edge": s["tile_size"]},
                                        do_image_splitting=s["do_image_splitting"])
    out = proc(images=[Image.new("RGB", (width, height))], return_tensors="np", return_row_col_info=True)
    crops = out["pixel_values"].shape[1]
    assert out["pixel_values"].shape[-2:] == (s["tile_size"], s["tile_size"])
    text = get_image_prompt_string(out["rows"][0][0], out["cols"][0][0], s["image_seq_len"],
                                   fake_token_around_image="<fake_token_around_image>", image_token="<image>",
                                   global_image_token="<global-img>")
    counted = count_image(spec, width, height)
    assert counted.crops == crops and counted.tokens == text.count("<image>") == crops * s["image_seq_len"]
    side = s["tile_size"] // spec.vision.patch_size
    assert counted.vision_tokens == crops * side * side
    # image_seq_len is what the connector's pixel shuffle leaves of a tile: (tile / patch)^2 / scale_factor^2
    assert s["image_seq_len"] == side * side // spec.config["scale_factor"] ** 2
    if tokens is not None:
        assert counted.tokens == tokens
