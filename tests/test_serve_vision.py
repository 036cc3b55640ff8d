"""Serving a vision-language model: a prompt's image tokens in the context and the KV cache, vLLM's multimodal terms
(the tower's weights, the encoder cache, the tower's profiling forward), the exported multimodal flags, bad input.

Expected values are computed here from transformers' own processor and vLLM's formulas as their sources write them
(vllm/v1/core/encoder_cache_manager.py compute_mm_encoder_budget, vllm/multimodal/encoder_budget.py
MultiModalBudget._get_max_items), not copied from the code under test."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from advisor.cli import main

FLAGS = yaml.safe_load((Path(__file__).parent / "data" / "vllm_serve_flags.yaml").read_text())["flags"]
VL = "qwen2.5-vl-7b"


@pytest.fixture(scope="module")
def vl():
    from advisor.core.catalog import resolve_model

    return resolve_model(VL)


def processor_tokens(model, width, height, max_pixels=None):
    """LM tokens of one image by transformers' Qwen2VLImageProcessor itself (patches / merge^2)."""
    import transformers

    s = model.processor["image"]
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    hi = max_pixels or s["max_pixels"]
    proc = cls(patch_size=s["patch_size"], merge_size=s["merge_size"], temporal_patch_size=s["temporal_patch_size"],
               min_pixels=s["min_pixels"], max_pixels=hi)
    patches = proc.get_number_of_image_patches(height, width, {"min_pixels": s["min_pixels"], "max_pixels": hi})
    return patches // s["merge_size"] ** 2, patches


def sample(**kw):
    from advisor.core.plan import Plan

    return Plan(**kw).validate()


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_image_tokens_are_the_processors(vl):
    from advisor.memory.serve_vision import serve_vision

    v = serve_vision(vl, sample(image_sizes=("1024x768", "1024x768")))
    want, patches = processor_tokens(vl, 1024, 768)
    assert want == 999  # Qwen2.5-VL: 1024x768 resized to 1036x756, 37 x 27 merged tokens
    assert v.image_tokens_per_image == (want, want) and v.image_tokens == 2 * want and v.tokens == 2 * want
    assert v.vision_tokens == 2 * patches == 8 * want  # the tower's own sequence: 4x the tokens (2x2 merge)
    assert json.loads(v.limit_mm_per_prompt()) == {"image": 2, "video": 0}
    # vLLM profiles at the largest image the processor allows (get_image_size_with_most_features: 9999999 square)
    assert v.item_tokens == processor_tokens(vl, 9999999, 9999999)[0]
    small = serve_vision(vl, sample(image_sizes=("1024x768",), max_pixels=1003520))
    assert small.item_tokens == processor_tokens(vl, 9999999, 9999999, max_pixels=1003520)[0] < v.item_tokens
    assert json.loads(small.mm_processor_kwargs()) == {"max_pixels": 1003520}


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_kv_cache_grows_by_the_image_tokens_per_prompt(vl, engine):
    from advisor.memory.inference import ServePlan, estimate_inference, kv_cache_bytes_per_token
    from advisor.memory.serve_vision import serve_vision

    img = serve_vision(vl, sample(image_sizes=("1024x768",)))
    text = serve_vision(vl, sample())
    per_token = kv_cache_bytes_per_token(vl, "bf16")
    base = ServePlan(context_len=2048, concurrency=8, vision=text)
    with_image = replace(base, context_len=2048 + img.tokens, vision=img)
    a, b = (estimate_inference(vl, p, None, engine=engine) for p in (base, with_image))
    if engine == "hf":  # the static cache holds every token exactly: 999 more per prompt
        assert b.device["kv_cache"] - a.device["kv_cache"] == 8 * 999 * per_token
    else:  # vLLM's pages: whole blocks of the longer sequence
        blocks = -(-(2048 + 999) // base.block_size) * base.block_size
        assert b.kv_cache.tokens_in_flight == 8 * blocks
        assert b.device["kv_cache"] - a.device["kv_cache"] == 8 * (blocks - 2048) * per_token


def test_encoder_cache_and_tower_profile_rows(vl):
    from advisor.memory.inference import ServePlan, estimate_inference
    from advisor.memory.serve_vision import serve_vision

    v = serve_vision(vl, sample(image_sizes=("1024x768",)))
    plan = ServePlan(context_len=4096, concurrency=16, max_num_batched_tokens=2048, vision=v)
    rep = estimate_inference(vl, plan, None, engine="vllm")
    item, patches = processor_tokens(vl, 9999999, 9999999)
    # compute_mm_encoder_budget: both budgets max(max_num_batched_tokens, max tokens per item); items per batch:
    # min(budget // item, max_num_seqs x max(1, min(limit, max_model_len // item))), at least 1
    budget = max(2048, item)
    items = max(1, min(budget // item, 16 * max(1, min(1, 4096 // item))))
    assert rep.device["encoder_cache"] == items * item * vl.hidden_size * 2
    assert rep.device["vision_weights"] == (vl.vision.tower_params + vl.vision.projector_params) * 2
    # the profile reserves the larger phase: the tower over the dummy item's patches with its fp32 pixels, or the
    # language model's dummy run beside the cached outputs and the same pixels
    pixels = items * patches * 3 * 2 * 14 * 14 * 4
    lm = rep.device["transient"] + rep.device["encoder_cache"] + pixels
    tower = rep.extra["vision_profile"]["tower_phase_bytes"]
    assert tower > pixels + 2 * items * patches * vl.vision.hidden_size  # at least the residual stream
    assert rep.device["transient"] + rep.device["encoder_cache"] + rep.device["vision_activations"] == max(lm, tower)
    assert sum(rep.device.values()) == rep.peak_bytes
    # a lower pixel bound shrinks both
    low = estimate_inference(vl, replace(plan, vision=serve_vision(vl, sample(image_sizes=("1024x768",),
                                                                             max_pixels=1003520))), None)
    assert low.device["encoder_cache"] < rep.device["encoder_cache"]
    assert low.device["vision_activations"] < rep.device["vision_activations"]


def test_the_tower_is_counted_once_and_dropped_text_only(vl):
    """The catalog's params_total is the language model's: the tower is its own row, 16-bit under an int4 plan
    (served from a checkpoint that keeps it bf16), fp8 under online fp8, absent when no modality is served."""
    from advisor.memory.inference import ServePlan, estimate_inference, serve_weight_bytes
    from advisor.memory.serve_vision import serve_vision

    v = serve_vision(vl, sample(image_sizes=("640x480",)))
    tower = vl.vision.tower_params + vl.vision.projector_params
    assert serve_weight_bytes(vl, "bf16")[0] == vl.params_total * 2  # the language model alone
    int4 = estimate_inference(vl, ServePlan(weight_format="int4", vision=v), None)
    fp8 = estimate_inference(vl, ServePlan(weight_format="fp8", vision=v), None)
    assert int4.device["vision_weights"] == tower * 2
    assert tower < fp8.device["vision_weights"] < tower * 2 and fp8.device["vision_constants"] > 0
    text = estimate_inference(vl, ServePlan(vision=serve_vision(vl, sample())), None)
    assert not {"vision_weights", "encoder_cache", "vision_activations"} & set(text.device)


def _script_args(path: Path) -> list[str]:
    text = path.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec vllm serve"))
    return [t for t in shlex.split(line)[4:] if t != "$@"]


def _vllm_parser() -> argparse.ArgumentParser:
    """An argparse parser of the validated flags: choices, ranges, and JSON objects for the multimodal ones (what
    vLLM's own parser accepts: FlexibleArgumentParser reads a dict-typed flag as JSON)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    for flag, spec in FLAGS.items():
        if "json" in spec:
            p.add_argument(flag, type=json.loads)
        elif "choices" in spec:
            p.add_argument(flag, choices=[str(c) for c in spec["choices"]])
        else:
            p.add_argument(flag, type=float)
    return p


def test_export_carries_the_multimodal_flags(tmp_path, capsys, vl):
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--model", VL, "--gpu-budget", "24GB",
                             "--gpu", "rtx-4090", "--backend", "estimate", "--json", "--export", str(tmp_path),
                             "--image-size", "1024x768", "--image-size", "640x480", "--max-pixels", "1003520")
    assert code == 0, err
    d = json.loads(out)
    v = d["vision"]
    assert v["image_tokens_per_image"] == [999, processor_tokens(vl, 640, 480)[0]]
    assert v["image_tokens"] == sum(v["image_tokens_per_image"]) and v["vision_tokens"] == 4 * v["image_tokens"]
    assert v["text_tokens_per_prompt"] == d["best"]["plan"]["context_len"] - v["image_tokens"]
    from advisor.search.serve_space import load_serve_space

    # the searched contexts are the space's text contexts plus a prompt's image tokens
    assert v["text_tokens_per_prompt"] in load_serve_space("inference").search["context_len"]
    assert d["best"]["ledger"]["encoder_cache"] == v["ledger"]["encoder_cache"] > 0
    args = vars(_vllm_parser().parse_args(_script_args(tmp_path / "serve_vllm.sh")))
    assert args["limit_mm_per_prompt"] == {"image": 2, "video": 0}
    assert args["mm_processor_kwargs"] == {"max_pixels": 1003520}
    assert int(float(args["max_model_len"])) == d["best"]["plan"]["context_len"]
    for flag in ("--limit-mm-per-prompt", "--mm-processor-kwargs"):
        spec = FLAGS[flag]
        value = json.loads(json.loads((tmp_path / "vllm_args.json").read_text())["args"][flag])
        assert set(value) <= set(spec["json"]) and all(isinstance(n, int) for n in value.values())


def test_a_text_only_workload_on_a_vision_model_disables_the_encoder(tmp_path, capsys):
    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--model", VL, "--gpu-budget", "24GB",
                             "--backend", "estimate", "--json", "--export", str(tmp_path))
    assert code == 0, err
    d = json.loads(out)
    assert d["vision"]["image_tokens"] == 0 and "encoder_cache" not in d["best"]["ledger"]
    args = vars(_vllm_parser().parse_args(_script_args(tmp_path / "serve_vllm.sh")))
    assert args["limit_mm_per_prompt"] == {"image": 0, "video": 0}


def test_a_text_model_is_unchanged(capsys):
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.memory.inference import ServePlan, estimate_inference

    code, out, err = run_cli(capsys, "tune", "--task", "inference", "--model", "qwen7b", "--gpu-budget", "24GB",
                             "--gpu", "rtx-4090", "--backend", "estimate", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert "vision" not in d and "image_tokens" not in d["best"]["plan"]
    assert set(d["best"]["ledger"]) == {"weights", "quant_constants", "kv_cache", "transient", "cuda_graphs",
                                        "overhead"}
    plan = ServePlan.from_dict(d["best"]["plan"])
    rep = estimate_inference(resolve_model("qwen7b"), plan, resolve_gpu("rtx-4090"))
    assert rep.device == d["best"]["ledger"] and rep.peak_bytes == d["best"]["peak_bytes"]


@pytest.mark.parametrize("argv,flag", [
    (["--model", VL, "--image-size", "1024x768", "--context-len", "900"], "--context-len"),
    (["--model", VL, "--image-size", "1024x768", "--image-size", "1024x768", "--context-len", "1998"],
     "--context-len"),
    (["--model", "qwen7b", "--image-size", "1024x768"], "--image-size"),
    (["--model", VL, "--image-size", "1024by768"], "--image-size"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, flag):
    try:
        code, out, err = run_cli(capsys, "tune", "--task", "inference", "--gpu-budget", "24GB", "--backend",
                                 "estimate", *argv)
    except SystemExit as e:
        code, err = e.code, capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0], err


def test_estimate_takes_the_images_too(capsys):
    """`advisor estimate --task inference` reads the same flags: one plan, the images in its context."""
    base = ["estimate", "--task", "inference", "--model", VL, "--gpu", "rtx-4090", "--context-len", "4096",
            "--concurrency", "4", "--json"]
    code, out, err = run_cli(capsys, *base, "--image-size", "1024x768")
    assert code == 0, err
    d = json.loads(out)
    assert d["plan"]["image_tokens"] == 999 and d["ledger"]["encoder_cache"] > 0
    assert d["vision"]["image_tokens_per_image"] == [999] and d["vision"]["vision_tokens"] == 3996
    code, out, err = run_cli(capsys, *base[:-3], "--concurrency", "4", "--context-len", "512", "--image-size",
                             "1024x768")
    assert code == 2 and "--context-len" in err
