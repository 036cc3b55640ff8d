"""`advisor tune` on a vision-language model: the sample's images are the space's fixed workload (a tuple field from
one flag or a list), every searched plan carries them, and a plan the simulation of vision-language models cannot
trace is left to the closed form (held within 3% of that simulation: tests/test_vision_ledger.py)."""

from __future__ import annotations

import json

from advisor.cli import main
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.runtime.simulate.vision import simulation_gap
from advisor.search.space import load_space, plan_from_params

VL = resolve_model("qwen2-vl-2b")


def test_the_images_are_a_fixed_tuple_from_one_value_or_a_list():
    for override, want in (("image_sizes=1280x720", ("1280x720",)),
                           ("image_sizes=[1280x720, 640x480]", ("1280x720", "640x480"))):
        space = load_space("default", [override])
        plan = plan_from_params(next(space.grid()), space, VL.arch)
        assert plan.image_sizes == want


def test_what_the_vision_simulation_cannot_trace_is_named():
    fused = Plan(method="lora", loss="fused-linear", image_sizes=("448x448",))
    assert "loss 'fused-linear'" in simulation_gap(VL, fused)
    assert simulation_gap(VL, Plan(method="qlora", quantization="nf4", image_sizes=("448x448",))) == ""
    assert simulation_gap(resolve_model("qwen0.5b"), Plan(method="lora", loss="fused-linear")) == ""


def test_tune_answers_a_vision_language_model(tmp_path, capsys):
    code = main(["tune", "--model", "qwen2-vl-2b", "--gpu-budget", "24GB", "--image-size", "448x448", "--backend",
                 "estimate", "--trials", "6", "--json", "--reports-dir", str(tmp_path / "r"),
                 "--export", str(tmp_path / "out")])
    assert code == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["plan"]["image_sizes"] == ["448x448"] and best["plan"]["vision_tower"] == "frozen"
    # every format builds the processor's batches: LLaMA-Factory's template names the model's plugin, axolotl's
    # multimodal keys, and the scripts' vision side (vision_setup.py beside them, a vision section to read)
    import yaml

    out = tmp_path / "out"
    lf = yaml.safe_load((out / "llamafactory.yaml").read_text())
    assert lf["template"] == "qwen2_vl" and lf["dataset"] == "mllm_demo"
    assert yaml.safe_load((out / "axolotl.yaml").read_text())["processor_type"] == "AutoProcessor"
    assert "vision" in yaml.safe_load((out / "advisor.yaml").read_text())
    assert "vision" in yaml.safe_load((out / "trl.yaml").read_text())
    assert (out / "vision_setup.py").is_file() and (out / "train.py").is_file()
