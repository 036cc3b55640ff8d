"""Vision-language exports: advisor.yaml + train.py and trl.yaml + train_trl.py carry the plan's vision settings
(pixel bounds, what trains in the tower and projector, the tower's own checkpointing), their parsers read them, and
the scripts train a tiny Gemma 3 (its own processor, saved beside it; nothing downloaded) for a step on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from advisor.configs.export import Unsupported, export_plan
from advisor.configs.read import read_config
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.runtime.simulate.vision_tiny import tiny_vl_spec
from export_runs import run_export_script  # tests/export_runs.py

VISION = dict(image_sizes=("1280x720",), max_pixels=1003520, min_pixels=3136, vision_tower="lora",
              train_projector=True, vision_gradient_checkpointing=True, gradient_checkpointing=True)


@pytest.fixture(scope="module")
def qwen25vl():
    return resolve_model("qwen2.5-vl-7b")


def test_advisor_yaml_vision_section_reads_back(qwen25vl, tmp_path):
    plan = Plan(method="lora", **VISION)
    written = export_plan(qwen25vl, plan, tmp_path, ["advisor", "train"])
    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["vision"] == {"max_length": 1024 + 1196, "max_pixels": 1003520, "min_pixels": 3136, "tower": "lora",
                             "train_projector": True, "gradient_checkpointing": True}
    assert cfg["training"]["remove_unused_columns"] is False
    assert (tmp_path / "vision_setup.py").is_file() and (tmp_path / "train.py").is_file()
    _, read, _ = read_config(written["advisor"])
    for k in ("max_pixels", "min_pixels", "vision_tower", "train_projector", "vision_gradient_checkpointing"):
        assert getattr(read, k) == getattr(plan, k), k


def test_every_sequence_cap_holds_the_planned_sample_with_its_image_tokens(qwen25vl, tmp_path):
    """Issue 41: 1,024 text tokens and one 1280x720 image (1,196 tokens in the language model's sequence) are 2,220
    tokens; every tool's cap must hold them (the collator stops on a longer sample, TRL refuses to cut image
    placeholders), while advisor.yaml's plan keeps its 1,024 text tokens."""
    from advisor.core.vision_tokens import count_sample

    plan = Plan(method="lora", **VISION)
    image_tokens = count_sample(qwen25vl, plan).text_tokens
    assert image_tokens == 1196
    written = export_plan(qwen25vl, plan, tmp_path, ["advisor", "trl"])
    # axolotl and LLaMA-Factory have no key for the tower's settings: the image alone
    written.update(export_plan(qwen25vl, Plan(method="lora", image_sizes=VISION["image_sizes"]), tmp_path / "tools",
                               ["axolotl", "llamafactory"]))
    caps = {fmt: yaml.safe_load(written[fmt].read_text()) for fmt in ("advisor", "trl", "axolotl", "llamafactory")}
    assert caps["advisor"]["vision"]["max_length"] == 1024 + image_tokens
    assert caps["advisor"]["advisor"]["max_seq_length"] == 1024
    assert caps["trl"]["max_length"] == caps["axolotl"]["sequence_len"] == caps["llamafactory"]["cutoff_len"] \
        == 1024 + image_tokens
    _, read, extras = read_config(written["advisor"])
    assert read.seq_len == 1024 and "seq_len" not in extras["edited"]


def test_trl_yaml_vision_mapping_reads_back_and_trls_cli_parser_takes_the_rest(qwen25vl, tmp_path):
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    plan = Plan(method="lora", **VISION)
    written = export_plan(qwen25vl, plan, tmp_path, ["trl"])
    cfg = yaml.safe_load(written["trl"].read_text())
    assert cfg["vision"]["tower"] == "lora" and cfg["vision"]["max_pixels"] == 1003520
    assert (tmp_path / "vision_setup.py").is_file()
    # `trl sft` parses with fail_with_unknown_args=False (trl/scripts/sft.py): every key but vision is TRL's
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    *_, rest = parser.parse_args_and_config(args=["--config", str(written["trl"]), "--output_dir", str(tmp_path),
                                                  "--use_cpu", "True", "--dataset_name", "x"],
                                            return_remaining_strings=True)
    assert rest[0] == "--vision" and len(rest) == 2
    _, read, _ = read_config(written["trl"])
    assert read.max_pixels == 1003520 and read.vision_tower == "lora" and read.vision_gradient_checkpointing


@pytest.mark.parametrize("fmt", ["advisor", "trl"])
def test_vision_exports_refuse_what_the_scripts_do_not_run(qwen25vl, tmp_path, fmt):
    with pytest.raises(Unsupported, match="images only"):
        export_plan(qwen25vl, Plan(method="lora", video_frames=8), tmp_path, [fmt])
    with pytest.raises(Unsupported, match="no packing"):
        export_plan(qwen25vl, Plan(method="lora", packing=True, image_sizes=("640x480",)), tmp_path, [fmt])


def test_text_model_exports_have_no_vision_side(tmp_path):
    written = export_plan(resolve_model("qwen2.5-0.5b"), Plan(method="lora"), tmp_path, ["advisor", "trl"])
    assert "vision" not in yaml.safe_load(written["advisor"].read_text())
    assert "vision" not in yaml.safe_load(written["trl"].read_text())
    assert not (tmp_path / "vision_setup.py").exists()


def test_pixel_bounds_reach_the_image_processor_and_its_token_count(tmp_path, monkeypatch):
    """vision_setup's pixel bounds land in the checkpoint's image processor (``size``), and what that processor
    makes of a 3840x2160 image at max_pixels 1003520 is the advisor's count (1222 tokens)."""
    import numpy as np
    from transformers import AutoImageProcessor

    from advisor.core.vision_tokens import _processor_class, count_image

    spec = resolve_model("qwen2.5-vl-7b")
    s = spec.processor["image"]
    _processor_class(s["class"])(size={"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
                                 patch_size=s["patch_size"], merge_size=s["merge_size"],
                                 temporal_patch_size=s["temporal_patch_size"]).save_pretrained(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "advisor/configs/export/templates"))
    import vision_setup

    images = vision_setup.image_processor_with_bounds(str(tmp_path), {"max_pixels": 1003520})
    assert images.size["longest_edge"] == 1003520 and images.size["shortest_edge"] == s["min_pixels"]
    grid = images(images=[np.zeros((2160, 3840, 3), dtype=np.uint8)], return_tensors="np")["image_grid_thw"][0]
    assert int(grid.prod()) // s["merge_size"] ** 2 == count_image(spec, 3840, 2160, max_pixels=1003520).tokens == 1222
    assert vision_setup.image_processor_with_bounds(str(tmp_path), {}) is None
    assert AutoImageProcessor.from_pretrained(tmp_path).size["longest_edge"] == s["max_pixels"]


# --------------------------------------------------------------------------- the scripts, one step on the CPU


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """A tiny Gemma 3 (two SigLIP blocks of 32, a 64-wide language model) with a Gemma3Processor over a byte-level
    BPE tokenizer trained here, saved like a hub checkpoint; two samples with a PNG each."""
    import torch
    import transformers
    from PIL import Image
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForImageTextToText, PreTrainedTokenizerFast

    from advisor.runtime.simulate.vision import vl_config

    out = tmp_path_factory.mktemp("tiny-gemma3")
    lines = ["describe this picture", "a red square on a white field", "what colour is the square"]
    specials = ["<unk>", "<eos>", "<pad>", "<bos>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>",
                                   bos_token="<bos>", extra_special_tokens={
                                       "image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                       "eoi_token": "<end_of_image>"})
    template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}<start_of_image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
                "{{ eos_token }}{% endfor %}")
    spec = tiny_vl_spec("gemma3", vision_use_head=False)  # as Gemma 3's SigLIP: no pooling head
    side = spec.config["vision_config"]["image_size"]
    transformers.Gemma3Processor(image_processor=transformers.Gemma3ImageProcessorPil(size={"height": side,
                                                                                          "width": side}),
                                 tokenizer=fast, chat_template=template,
                                 image_seq_length=spec.config["mm_tokens_per_image"]).save_pretrained(out)
    cfg = vl_config(spec)
    ids = fast.convert_tokens_to_ids
    cfg.image_token_index, cfg.boi_token_index, cfg.eoi_token_index = (
        ids("<image_soft_token>"), ids("<start_of_image>"), ids("<end_of_image>"))
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(out)
    for k, colour in enumerate(("red", "blue")):
        Image.new("RGB", (96, 72), colour).save(out / f"img{k}.png")
    samples = [{"messages": [{"role": "user", "content": "describe this picture"},
                             {"role": "assistant", "content": f"a {c} square on a white field"}],
                "images": [f"img{k}.png"]} for k, c in enumerate(("red", "blue"))]
    (out / "data.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    return out, spec


def _linears(spec, part: str) -> int:
    """Linears of the tiny model's language-model layers (attention q,k,v,o) or the tower's blocks (all of them)."""
    if part == "language":
        return 4 * spec.config["text_config"]["num_hidden_layers"]
    return len(spec.vision.block_linears) * spec.config["vision_config"]["num_hidden_layers"]


PLANS = {
    "lora-tower-lora-projector-ckpt": (Plan(method="lora", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                                            image_sizes=("96x72",), vision_tower="lora", train_projector=True,
                                            gradient_checkpointing=True, vision_gradient_checkpointing=True,
                                            micro_batch=2, seq_len=128, precision="fp32"),
                                       {"lora": "language+tower", "tower": True, "projector": True}),
    "full-tower-frozen": (Plan(method="full", image_sizes=("96x72",), micro_batch=2, seq_len=128, precision="fp32",
                               optimizer="adamw_torch"),
                          {"lora": None, "tower": False, "projector": False}),
}


def _simulated_parts(spec, plan) -> dict[str, int]:
    """The trainable parameters of each part in the model the simulation trains for ``plan`` (real tensors)."""
    from advisor.runtime.simulate.vision import build_vision_setup, part_of_parameters

    model = build_vision_setup(spec, plan).model
    parts = part_of_parameters(model)
    out = {"vision_tower": 0, "projector": 0, "language_model": 0}
    for p in model.parameters():
        if p.requires_grad:
            out[parts.get(id(p), "language_model")] += p.numel()
    return out


def _check(proc, s, spec, plan, expect):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s["steps"] == 1 and math.isfinite(s["train_loss"]) and s["train_loss"] > 0
    parts = s["vision_trainable_params"]
    assert parts == _simulated_parts(spec, plan)  # the run trains what the memory plan simulated
    assert (parts["vision_tower"] > 0) == (expect["tower"] or expect["lora"] == "language+tower")
    assert (parts["projector"] > 0) == expect["projector"] and parts["language_model"] > 0
    if expect["lora"] == "language+tower":
        assert s["lora_modules"] == _linears(spec, "language") + _linears(spec, "tower")
    elif expect["lora"] is None:
        assert s["lora_modules"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_train_py_trains_a_vision_language_model_for_a_step_on_cpu(tiny_gemma3, tmp_path, name):
    model_dir, spec = tiny_gemma3
    plan, expect = PLANS[name]
    export_plan(spec, plan, tmp_path / "export", ["advisor", "train"])
    proc, s = run_export_script(tmp_path / "export" / "train.py", "--data", str(model_dir / "data.jsonl"),
                   "--max-steps", "1", "--model-path", str(model_dir), "--output-dir", str(tmp_path / "ckpt"),
                   "--no-save")
    _check(proc, s, spec, plan, expect)
    if plan.vision_gradient_checkpointing:
        towers = spec.config["vision_config"]["num_hidden_layers"]
        assert f"{towers} of {towers} tower blocks" in proc.stdout


@pytest.mark.slow
def test_train_trl_trains_a_vision_language_model_for_a_step_on_cpu(tiny_gemma3, tmp_path):
    model_dir, spec = tiny_gemma3
    plan, expect = PLANS["lora-tower-lora-projector-ckpt"]
    export_plan(spec, plan, tmp_path / "export", ["trl"])
    proc, s = run_export_script(tmp_path / "export" / "train_trl.py", "--data", str(model_dir / "data.jsonl"),
                   "--max-steps", "1", "--model-path", str(model_dir), "--output-dir", str(tmp_path / "ckpt"))
    _check(proc, s, spec, plan, expect)
    assert Path(s["non_lora_trainables"]).is_file()  # the projector, trained in full beside the adapters


@pytest.mark.parametrize("model_type", sorted(__import__("advisor.runtime.simulate.vision_tiny",
                                                         fromlist=["TINY_VL"]).TINY_VL))
@pytest.mark.parametrize("tower, targets", [("frozen", ("q_proj", "v_proj")), ("lora", "all-linear")])
def test_vision_setup_adapts_and_trains_what_the_simulation_does(model_type, tower, targets, monkeypatch):
    """For every family: the exported script's LoRA module paths and trained parts (vision_setup.py) are the
    simulation's (advisor.runtime.simulate.vision: lora_modules, apply_trainable), and the axolotl regex matches the
    same language-model modules."""
    import re

    import torch

    from advisor.core.adapters import language_model_regex
    from advisor.runtime.simulate.vision import apply_trainable, build_vl_model, lora_modules, vision_settings

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "advisor/configs/export/templates"))
    import vision_setup

    spec = tiny_vl_spec(model_type)
    plan = Plan(method="lora", lora_targets=targets, vision_tower=tower, train_projector=True,
                image_sizes=("64x64",))
    model = build_vl_model(spec, plan, "cpu", None, "sdpa", torch.float32)
    short = targets if isinstance(targets, str) else list(targets)
    paths = vision_setup.lora_target_paths(model, short, tower == "lora")
    assert sorted(paths) == sorted(lora_modules(model, spec, plan, vision_settings(plan)))
    if tower == "frozen":  # the axolotl regex reaches exactly the language model's modules the script adapts
        regex = language_model_regex(spec, plan)
        linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        assert sorted(n for n in linear if re.fullmatch(regex, n)) == sorted(paths)
    for p in model.parameters():
        p.requires_grad_(False)
    vision_setup.set_trainable(model, {"tower": tower, "train_projector": True})
    mine = {n for n, p in model.named_parameters() if p.requires_grad}
    for p in model.parameters():
        p.requires_grad_(False)
    apply_trainable(model, vision_settings(plan), plan.method)
    assert mine == {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_preflight_of_a_plan_the_vision_simulation_cannot_trace_is_answered_by_the_closed_form(tmp_path):
    """Issue 41: the tuner's vision-language answer with the fused-linear loss (which the vision-language simulation
    does not trace) was refused by its own pre-flight; pre-flight now does as the tuner does and says so."""
    from advisor.configs.export import export_plan
    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan
    from cli_run import advisor_json

    plan = Plan(method="lora", seq_len=1024, loss="fused-linear", gradient_checkpointing=True,
                image_sizes=("1280x720",))
    config = export_plan(resolve_model("qwen2.5-vl-7b"), plan, tmp_path, formats=["advisor"])["advisor"]
    code, d, err = advisor_json("preflight", config, "--gpu", "rtx-4090", "--gpu-budget", "24GB", "--json")
    assert code in (0, 1) and d is not None, err
    answered = [f for f in d["findings"] if f["check"] == "memory.answered-by"]
    assert answered and "does not trace loss 'fused-linear'" in answered[0]["evidence"]
    assert any(f["check"] == "memory.fit" for f in d["findings"])
