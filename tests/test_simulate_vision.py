"""The simulation of vision-language models: the processor's batch traced under fake tensors equals the same step on
real CPU tensors (peak, phase, every ledger category, the tower's and projector's parts), for tiny Qwen2.5-VL,
Qwen3-VL, Gemma 3, Llama-3.2-Vision (Mllama), InternVL, LLaVA-OneVision, Mistral 3 and SmolVLM models; LoRA reaches
only what it is asked to; the tower frozen, LoRA'd or trained, each checkpointing on or off."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from advisor.core.plan import Plan  # noqa: E402
from advisor.memory.ledger import CATEGORIES  # noqa: E402
from advisor.runtime.simulate.runner import trace_step  # noqa: E402
from advisor.runtime.simulate.vision import (VisionSettings, image_processor, image_tokens,  # noqa: E402
                                             lora_modules, processor_batch, tower_and_projectors)
from advisor.runtime.simulate.vision_tiny import TINY_VL, tiny_vl_spec  # noqa: E402
from matrix import matrix_params  # noqa: E402  (tests/matrix.py)

FAMILIES = sorted(TINY_VL)
IMAGES = {"qwen2_5_vl": ((84, 56),), "qwen3_vl": ((96, 64),), "gemma3": ((100, 80),), "mllama": ((40, 28),),
          "internvl": ((112, 56),), "smolvlm": ((100, 60),), "llava_onevision": ((60, 40),), "mistral3": ((100, 60),)}
METHODS = {"lora": dict(method="lora", lora_targets="all-linear"), "full": dict(method="full")}


def _equal(spec, plan, settings):
    fake = trace_step(spec, plan, fake=True, vision=settings)
    real = trace_step(spec, plan, fake=False, vision=settings)
    # the same tolerance as tests/test_simulate.py and test_simulate_moe.py: 1% of the peak, per category
    assert abs(fake.peak_bytes - real.peak_bytes) <= 0.01 * real.peak_bytes, (fake.peak_bytes, real.peak_bytes)
    assert fake.peak_phase == real.peak_phase
    for cat in CATEGORIES:
        assert abs(fake.ledger[cat] - real.ledger[cat]) <= 0.01 * real.peak_bytes, cat
    assert set(fake.parts) == set(real.parts)
    for part in real.parts:
        for cat in set(fake.parts[part]) | set(real.parts[part]):
            got, want = fake.parts[part].get(cat, 0), real.parts[part].get(cat, 0)
            assert abs(got - want) <= 0.01 * real.peak_bytes, (part, cat, got, want)
    return fake, real


def test_simulation_equals_real_execution():
    """Qwen2.5-VL (window and full-attention blocks), LoRA on the language model, both checkpointings."""
    spec = tiny_vl_spec("qwen2_5_vl")
    plan = Plan(seq_len=96, gradient_checkpointing=True, **METHODS["lora"])
    settings = VisionSettings(images=IMAGES["qwen2_5_vl"], projector_trained=True, tower_checkpointing=True)
    fake, _ = _equal(spec, plan, settings)
    assert fake.parts["vision_tower"]["weights"] > 0 and fake.parts["projector"]["adapter_weights"] > 0


# every family, LoRA and full, the tower frozen and trained, each with one of the four checkpointing pairs (the
# language model's, the tower's), the pairs rotated across families so that each family meets all four and each
# (method, tower) meets every pair: 20 runs instead of the 80 of the full product (each is a real CPU step)
CHECKPOINTING = list(itertools.product((False, True), (False, True)))
MATRIX = [(f, m, t, *CHECKPOINTING[(i + j) % 4]) for i, f in enumerate(FAMILIES)
          for j, (m, t) in enumerate(itertools.product(METHODS, ("frozen", "trained")))]


# by default one run per family covering every method, tower setting and checkpointing pair; all of MATRIX with
# --full-matrix (tests/matrix.py)
@pytest.mark.slow
@pytest.mark.parametrize("family,method,tower,lm_ckpt,tower_ckpt", matrix_params(
    MATRIX, lambda c: [("family", c[0]), ("method", c[1]), ("tower", c[2]), ("ckpt", c[3], c[4])],
    ids=lambda c: "{}-{}-{}-lm{:d}-vit{:d}".format(*c)))
def test_simulation_equals_real_execution_every_family(family, method, tower, lm_ckpt, tower_ckpt):
    spec = tiny_vl_spec(family)
    plan = Plan(seq_len=96, gradient_checkpointing=lm_ckpt, **METHODS[method])
    mode = "frozen" if tower == "frozen" else ("lora" if method == "lora" else "full")
    settings = VisionSettings(images=IMAGES[family], tower=mode, projector_trained=tower != "frozen",
                              tower_checkpointing=tower_ckpt)
    fake, _ = _equal(spec, plan, settings)
    # what a trained tower holds at any peak: its adapters (LoRA) or its optimizer states (full; its gradients are
    # made last in backward, after the language model's peak)
    held = fake.parts["vision_tower"]
    trained = held.get("gradients", 0) + held.get("adapter_weights", 0) + held.get("optimizer_states", 0)
    assert (trained > 0) == (tower != "frozen")


def test_lora_reaches_the_language_model_only_unless_the_tower_is_asked_for():
    """all-linear on a vision-language model: the language model's linears; the tower's only with tower LoRA, the
    projector's never (it trains in full or not at all)."""
    from advisor.runtime.simulate.vision import vl_config
    from transformers import AutoModelForImageTextToText

    spec = tiny_vl_spec("gemma3")  # SigLIP's attention has q_proj / k_proj / v_proj too
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(vl_config(spec))
    plan = Plan(seq_len=64, **METHODS["lora"])
    tower, projectors = tower_and_projectors(model)
    tower_names = {n for n, m in model.named_modules() if any(m is x for x in tower.modules())}
    lm_only = lora_modules(model, spec, plan, VisionSettings())
    assert lm_only and all(".language_model." in n for n in lm_only)
    with_tower = lora_modules(model, spec, plan, VisionSettings(tower="lora"))
    added = set(with_tower) - set(lm_only)
    assert added and added <= tower_names
    projector_names = {n for n, m in model.named_modules() if any(m is x for p in projectors for x in p.modules())}
    assert not added & projector_names


@pytest.mark.parametrize("family,size,want", [("qwen2_5_vl", (1024, 768), 999), ("qwen3_vl", (1024, 768), 768),
                                              ("gemma3", (1024, 768), 16), ("smolvlm", (1024, 768), 20)])
def test_the_batch_is_the_processors(family, size, want):
    """pixel_values and image_grid_thw are the image processor's own output for the image, and the placeholders in
    input_ids are its image-token count (999 for 1024x768 on Qwen2.5-VL, 768 on Qwen3-VL; the tiny Gemma 3 pools
    to its mm_tokens_per_image; the tiny SmolVLM cuts 2 x 2 tiles of 32 pixels and the whole image, 4 tokens each)."""
    import numpy as np

    spec = tiny_vl_spec(family)
    settings = VisionSettings(images=(size,))
    batch = processor_batch(spec, Plan(seq_len=64, micro_batch=2), settings)
    image = np.zeros((size[1], size[0], 3), np.uint8)
    if family == "smolvlm":  # a sample's images as one nested list, the tiles' rows and columns with them
        direct = image_processor(spec, settings)(images=[[image]], return_tensors="pt", return_row_col_info=True)
    else:
        direct = image_processor(spec, settings)(images=[image], return_tensors="pt")
    assert image_tokens(spec, direct, settings) == [want]
    assert batch["pixel_values"].shape == (2 * direct["pixel_values"].shape[0], *direct["pixel_values"].shape[1:])
    if "image_grid_thw" in direct:
        assert torch.equal(batch["image_grid_thw"], torch.cat([direct["image_grid_thw"]] * 2))
    image_token = spec.config.get("image_token_id", spec.config.get("image_token_index"))
    assert batch["input_ids"].shape[0] == 2 and batch["input_ids"].shape[1] >= 64 + want  # text beside the images
    assert ((batch["input_ids"] == image_token).sum(1) == want).all()
    assert (batch["labels"][batch["input_ids"] == image_token] == -100).all()


def test_mllama_tiles_and_cross_attention_mask_are_the_processors():
    """Llama-3.2-Vision: tiles, aspect-ratio ids and mask from MllamaImageProcessor, one <|image|> token, the
    cross-attention mask over every tile the image has."""
    spec = tiny_vl_spec("mllama")
    batch = processor_batch(spec, Plan(seq_len=31), VisionSettings(images=((56, 28),)))
    assert batch["pixel_values"].shape == (1, 1, 4, 3, 28, 28)
    assert batch["aspect_ratio_ids"].shape == (1, 1) and batch["aspect_ratio_mask"].shape == (1, 1, 4)
    assert batch["cross_attention_mask"].shape == (1, 32, 1, 4)
    assert int(batch["cross_attention_mask"][0, 1, 0].sum()) == int(batch["aspect_ratio_mask"].sum()) == 2


def test_a_quantized_base_simulates_as_it_runs():
    """QLoRA on a vision-language model: every nn.Linear bitsandbytes converts, the tower's too (real bitsandbytes
    on the CPU against the simulation's stand-ins), the tower's weights quantized with the language model's."""
    spec = tiny_vl_spec("qwen2_5_vl")
    plan = Plan(seq_len=96, method="qlora", quantization="nf4", lora_targets="all-linear", gradient_checkpointing=True)
    fake, _ = _equal(spec, plan, VisionSettings(images=IMAGES["qwen2_5_vl"]))
    plain, _ = _equal(spec, Plan(seq_len=96, method="lora", lora_targets="all-linear", gradient_checkpointing=True),
                      VisionSettings(images=IMAGES["qwen2_5_vl"]))
    assert fake.parts["vision_tower"]["weights"] < plain.parts["vision_tower"]["weights"]


def test_smolvlm_micro_batch_and_several_images_simulate_as_they_run():
    """SmolVLM at micro-batch 2 with two images a sample (the pixels' real values ride with the fake tensors, for
    get_image_features' drop of padding images): the simulated step equals the real one, LoRA on the language model
    with both checkpointings."""
    spec = tiny_vl_spec("smolvlm")
    plan = Plan(seq_len=64, micro_batch=2, gradient_checkpointing=True, **METHODS["lora"])
    settings = VisionSettings(images=((100, 60), (40, 30)), tower_checkpointing=True)
    batch = processor_batch(spec, plan, settings)
    # each image resized to the 64-pixel longest edge (40x30 enlarged), 2 x 2 tiles and the whole image
    assert batch["pixel_values"].shape[:2] == (2, 5 + 5)
    assert int((batch["input_ids"][0] == spec.config["image_token_id"]).sum()) == 4 * 10
    _equal(spec, plan, settings)


@pytest.mark.parametrize("family", ["llava_onevision", "mistral3"])
def test_llava_onevision_and_mistral3_at_micro_batch_two_simulate_as_they_run(family):
    """LLaVA-OneVision (anyres crops, image_sizes; a sample of two images one crop each, batch_num_images) and
    Mistral 3 (Pixtral on any size in whole cells, image_sizes, the patch merger) at micro-batch 2: the placeholders
    are the processor's count (the model checks them against its features) and the simulated step equals the real
    one, with one image a sample and with two."""
    from advisor.core.vision_tokens import count_image

    spec = tiny_vl_spec(family)
    plan = Plan(seq_len=64, micro_batch=2, gradient_checkpointing=True, **METHODS["lora"])
    for images in (IMAGES[family], IMAGES[family] + ((30, 50),)):
        settings = VisionSettings(images=images, projector_trained=True, tower_checkpointing=True)
        batch = processor_batch(spec, plan, settings)
        image_token = spec.config["image_token_index"]
        want = sum(count_image(spec, w, h, images_in_sample=len(images)).tokens for w, h in images)
        if family == "llava_onevision":
            assert ((batch["input_ids"] == image_token).sum(1) == want).all()
        else:  # an [IMG] per cell and a break per row: count_image's tokens in all, beside the 64 text tokens
            assert batch["input_ids"].shape[1] == 64 + want
        _equal(spec, plan, settings)
