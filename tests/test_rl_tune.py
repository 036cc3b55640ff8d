"""`advisor tune --task grpo|dpo`: the GRPO/DPO spaces (the workload fixed, the levers searched), SFT spaces and
their study names untouched, the usual recipe (TRL's defaults with LoRA), the GPU-count rules, and the answer's
generation settings and phases (small studies on the estimate backend)."""

from __future__ import annotations

import json

import pytest

from advisor.cli import build_parser, main
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import searched
from advisor.core.plan import Plan
from advisor.search.space import list_spaces, load_space

RL_LEVERS = ("generation", "vllm_gpu_memory_utilization", "vllm_sleep", "vllm_gpus", "steps_per_generation",
             "reference", "padding_free")


def test_the_rl_levers_are_searched_knobs():
    assert set(RL_LEVERS) <= {k.name for k in searched(Plan)}


@pytest.mark.parametrize("name", [n for n in list_spaces() if n not in ("grpo", "dpo")])
def test_sft_spaces_hold_no_rl_lever(name):
    """An SFT space's search (its identity, hence its study name) is what it was before the GRPO/DPO levers."""
    space = load_space(name)
    assert not set(RL_LEVERS) & set(space.search)
    assert "task" not in space.fixed


def test_an_sft_space_refuses_an_rl_lever():
    with pytest.raises(AdvisorInputError, match="not a lever of --task sft"):
        load_space("default", ["generation=[vllm-colocate]"])


def test_the_grpo_space_fixes_the_workload_and_searches_the_levers():
    space = load_space("grpo", ["num_generations=4", "max_completion_length=256", "beta=0.04"])
    assert space.workload["task"] == "grpo" and space.workload["num_generations"] == 4
    assert not {"num_generations", "max_completion_length", "beta", "task"} & set(space.search)
    c = space.conditions()
    assert c.offered("generation", {}) == ["vllm-colocate", "transformers", "vllm-server"]
    # the knobs' applies see the task: vLLM's pool is asked with vllm-colocate only, the reference with beta > 0
    assert c.applies("vllm_sleep", {"generation": "vllm-colocate"})
    assert not c.applies("vllm_sleep", {"generation": "transformers"})
    assert c.applies("reference", {"method": "lora"})
    assert not load_space("grpo").conditions().applies("reference", {"method": "lora"})  # beta 0: no reference
    point = next(space.grid())
    from advisor.search.space import plan_from_params

    p = plan_from_params(point, space, {})
    assert (p.task, p.num_generations, p.max_completion_length, p.beta) == ("grpo", 4, 256, 0.04)


def test_the_dpo_space_searches_the_reference():
    space = load_space("dpo", ["seq_len=2048"])
    assert space.workload["task"] == "dpo" and space.fixed["seq_len"] == 2048
    assert space.conditions().offered("reference", {"method": "lora"}) == ["adapter", "precomputed", "copy"]
    assert "adapter" not in space.conditions().offered("reference", {"method": "full"})


def test_task_picks_its_space():
    from advisor.search.settings import space_for_task

    assert space_for_task("default", ("task=grpo",)) == "grpo"
    assert space_for_task("default", ("task=dpo",)) == "dpo"
    assert space_for_task("default", ("task=sft",)) == "default"
    assert space_for_task("low-memory", ("task=grpo",)) == "low-memory"


def test_gpu_count_rules():
    from advisor.search.tuner import gpu_count_problems, train_gpus

    plan = Plan(task="grpo", method="lora", micro_batch=1, grad_accum=8, steps_per_generation=1)
    [e] = gpu_count_problems(plan, 1)  # 1 completion per generation batch: not whole groups of 8
    assert "divisible by num_generations" in e.rule
    assert gpu_count_problems(plan, 8) == []
    server = Plan(task="grpo", method="lora", generation="vllm-server", vllm_gpus=2, micro_batch=8, grad_accum=1)
    assert "leaves none to train" in gpu_count_problems(server, 2)[0].rule
    assert train_gpus(8, server) == 6 and gpu_count_problems(server, 3) == []


def test_the_usual_recipe_is_trls_defaults_with_lora():
    from advisor.search.recipe import usual_recipe

    label, params = usual_recipe(load_space("grpo"), "bf16", lambda p: True)
    assert "lora" in label and params["method"] == "lora" and params["gradient_checkpointing"] is True
    assert params["generation"] == "transformers" and params["steps_per_generation"] is None
    label, params = usual_recipe(load_space("grpo"), "bf16", lambda p: p["method"] == "qlora")
    assert params["method"] == "qlora" and params["quantization"] == "nf4"
    label, params = usual_recipe(load_space("dpo"), "bf16", lambda p: True)
    assert params["method"] == "lora" and params["reference"] == "adapter"


def _tune(tmp_path, capsys, *extra):
    code = main(["tune", "--model", "qwen7b", "--backend", "estimate", "--json", "--trials", "5",
                 "--reports-dir", str(tmp_path), *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_a_grpo_study_answers_with_its_generation_and_phases(tmp_path, capsys):
    code, d = _tune(tmp_path, capsys, "--task", "grpo", "--gpu", "a100-80gb", "--gpu-budget", "80GB",
                    "--num-generations", "4", "--max-completion-length", "256")
    assert code == 0 and "-grpo-" in d["study"]
    assert d["recipe"]["plan"]["method"] == "lora" and d["recipe"]["plan"]["generation"] == "transformers"
    best = d["best"]
    assert best["plan"]["num_generations"] == 4 and best["plan"]["max_completion_length"] == 256
    rl = d["rl"]
    assert rl["workload"]["num_generations"] == 4 and "generation" in rl["levers"]
    assert {"generate", "train"} <= set(rl["phases"]) and rl["run_peak_phase"] in rl["phases"]
    if rl["levers"]["generation"] == "vllm-colocate":
        assert rl["generation"]["pool_bytes"] > rl["generation"]["weights_bytes"] > 0 and rl["generation"]["kv_tokens"]
    # no proposal breaks TRL's divisibility rule: the conditions hold it
    assert not [t for t in d["trials"] if "divisible" in (t["reason"] or "")]


def test_a_dpo_study(tmp_path, capsys):
    code, d = _tune(tmp_path, capsys, "--task", "dpo", "--gpu", "a100-80gb", "--gpu-budget", "80GB",
                    "--seq-len", "512")
    assert code == 0 and d["best"]["plan"]["task"] == "dpo" and d["best"]["plan"]["seq_len"] == 512
    assert d["rl"]["levers"]["reference"] in ("adapter", "precomputed", "copy") and "train" in d["rl"]["phases"]


def test_an_invalid_pinned_grpo_plan_is_an_invalid_trial_with_the_reason(tmp_path):
    from advisor.commands.tune import build_settings
    from advisor.search.quality import quality_of
    from advisor.search.tuner import Tuner

    args = build_parser().parse_args(["tune", "--task", "grpo", "--model", "qwen7b", "--gpu", "a100-80gb",
                                      "--gpu-budget", "80GB", "--backend", "estimate", "--reports-dir", str(tmp_path)])
    tuner = Tuner(build_settings(args))
    plan = Plan(task="grpo", method="lora", micro_batch=1, grad_accum=8, steps_per_generation=1)
    assert "divisible by num_generations" in tuner._invalid(plan, quality_of(plan, None))


@pytest.mark.parametrize("name", ["grpo", "dpo"])
def test_every_point_of_a_pinned_rl_space_is_a_valid_plan(name):
    """The SFT levers pinned (the full grid is tests/test_space.py's, slow): the task's levers' grid holds only valid
    plans, each knob asked where it applies."""
    from advisor.core.catalog import resolve_model
    from advisor.search.space import plan_from_params

    pins = ["method=[lora,qlora]", "quantization=[nf4,none]", "double_quant=true", "lora_r=16",
            "lora_targets=all-linear", "optimizer=adamw_torch_fused", "offload=none", "activation_offload=false",
            "expandable_segments=false", "beta=0.04"]
    space = load_space(name, pins)
    arch = resolve_model("qwen7b").arch
    points = list(space.grid())
    assert points and all(not plan_from_params(p, space, arch).problems() for p in points)
    if name == "grpo":
        assert {p["generation"] for p in points} == {"vllm-colocate", "transformers", "vllm-server"}
        assert all(p["vllm_sleep"] == 0 for p in points if p["generation"] != "vllm-colocate")  # not asked: inactive
