"""A --data file whose samples carry their images: each image's size read from the file (or given), the plan made on
the largest sample (its images counted by the model's own processor at the plan's pixel bounds), never cut at
seq_len."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.core.vision_tokens import count_sample
from advisor.runtime.probe import data_profile
from advisor.runtime.probe._data import read_samples
from advisor.search.settings import _data_identity, data_from_dict, data_to_dict


@pytest.fixture()
def vl_data(tmp_path):
    from PIL import Image

    Image.new("RGB", (1280, 720)).save(tmp_path / "a.png")
    Image.new("RGB", (3840, 2160)).save(tmp_path / "big.png")
    rows = [
        {"messages": [{"role": "user", "content": "describe this picture"},
                      {"role": "assistant", "content": [{"type": "text", "text": "a black frame"}]}],
         "images": ["a.png"]},
        {"messages": [{"role": "user", "content": "and this one"}], "images": [{"path": "big.png"}]},
        {"text": "a text-only sample " * 50},
        {"messages": [{"role": "user", "content": "two images"}], "images": [{"width": 640, "height": 480}, "a.png"]},
    ]
    path = tmp_path / "vl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_samples_carry_their_image_sizes(vl_data):
    samples = read_samples(vl_data)
    assert [sizes for _, sizes in samples] == [("1280x720",), ("3840x2160",), (), ("640x480", "1280x720")]
    assert samples[0][0] == "describe this picture\na black frame"


@pytest.mark.parametrize("image, why", [(3, "a path or"), ("missing.png", "cannot read the image"),
                                        ({"width": 0, "height": 5}, "at least 1")])
def test_a_bad_image_entry_names_the_flag_and_line(tmp_path, image, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "x", "images": [image]}) + "\n")
    with pytest.raises(AdvisorInputError, match=f"line 2.*{why}") as e:
        read_samples(path)
    assert e.value.where == "--data"


@pytest.mark.parametrize("max_pixels, largest", [(None, ("3840x2160",)), (1003520, ("640x480", "1280x720"))])
def test_the_plan_is_made_on_the_sample_whose_images_take_the_most_tokens(vl_data, max_pixels, largest):
    spec = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct")
    profile = data_profile(vl_data, None)
    plan = profile.sized(Plan(method="lora", max_pixels=max_pixels), spec)
    assert plan.image_sizes == largest
    image_tokens = [count_sample(spec, Plan(image_sizes=s, max_pixels=max_pixels)).text_tokens if s else 0
                    for s in profile.images]
    # seq_len is the text beside the planned images: the language model's sequence is the longest sample's
    beside = count_sample(spec, plan).text_tokens
    assert plan.seq_len + beside == max(n + k for n, k in zip(profile.lengths, image_tokens))


def test_a_text_model_or_a_text_file_is_sized_as_before(vl_data, tmp_path):
    profile = data_profile(vl_data, None)
    plan = profile.sized(Plan(method="lora", seq_len=64), resolve_model("qwen2.5-0.5b"))
    assert plan.image_sizes == () and plan.seq_len == min(max(profile.lengths), 64)
    text = tmp_path / "t.jsonl"
    text.write_text(json.dumps({"text": "hello there"}) + "\n")
    assert data_profile(text, None).images == ()


def test_images_are_part_of_the_study_identity(vl_data):
    profile = data_profile(vl_data, None)
    assert data_from_dict(data_to_dict(profile)) == profile
    text_only = data_from_dict({**data_to_dict(profile), "images": []})
    assert _data_identity(text_only) != _data_identity(profile)


def test_image_size_and_data_images_together_is_an_input_error(vl_data, capsys):
    code = main(["estimate", "--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--method", "lora", "--data", str(vl_data),
                 "--image-size", "100x100"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--image-size" in err[0] and "carry their own images" in err[0]


def test_estimate_plans_the_largest_sample_and_says_so(vl_data, capsys):
    assert main(["estimate", "--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--method", "lora", "--data", str(vl_data),
                 "--max-pixels", "1003520", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"]["largest_sample_images"] == ["640x480", "1280x720"]
    assert out["vision"]["image_tokens_per_image"] == [391, 1196]
    assert out["plan"]["seq_len"] + 391 + 1196 == out["data"]["longest_sample_tokens"]
