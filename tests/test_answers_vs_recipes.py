"""benchmarks/answers_vs_recipes.py: every recipe expressed as a Plan that keeps its key fields, and the
harness run end to end on two recipes (tests/data/recipes_sample.json: one asked, one whose model the
catalog lacks) writing a report of the expected shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark  # tests/benchmark_modules.py

PLANS = load_benchmark("recipe_plans")
BENCH = load_benchmark("answers_vs_recipes")
TABLES = PLANS.load_tables()
SAMPLE = Path(__file__).parent / "data" / "recipes_sample.json"


def _recipes() -> list[dict]:
    shared = next((p for p in PLANS.recipes_candidates() if p.is_file()), None)
    return json.loads((shared or SAMPLE).read_text(encoding="utf-8"))


def _truthy(v) -> bool:
    return bool(v) and str(v).lower() not in ("false", "no")


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda r: str(r["id"]))
def test_recipe_as_plan_round_trips_its_key_fields(recipe):
    ex = PLANS.express(recipe, TABLES)
    if ex.plan is None:
        assert any(c.startswith("as a Plan") for c in ex.cannot)
        return
    plan = ex.plan
    method = str(recipe["method"]).lower()
    assert plan.method == ("full" if method.startswith("full") else "qlora" if method.startswith("qlora") else "lora")
    assert plan.micro_batch == int(recipe["micro_batch"])
    assert plan.grad_accum == int(recipe["grad_accum"] or 1)
    assert plan.seq_len == (recipe["max_seq_len"] or TABLES["unstated_seq_len"])
    assert ex.seq_assumed == (recipe["max_seq_len"] is None)
    assert plan.packing == bool(recipe["packing"])
    assert plan.gradient_checkpointing == _truthy(recipe["grad_ckpt"])
    assert plan.activation_offload == bool(recipe["activation_offload"])
    if plan.peft:
        assert plan.lora_r == recipe["lora"]["r"] and plan.lora_alpha == recipe["lora"]["alpha"]
    if plan.method == "qlora":
        assert plan.quantization == ("fp4" if "fp4" in recipe["quant"]["type"] else "nf4")
    assert plan.optimizer_in_backward == bool((recipe.get("extra") or {}).get("optimizer_in_bwd"))
    if recipe.get("compile"):
        assert "torch.compile" in ex.cannot
    assert type(plan).from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    if ex.model is not None:  # the catalog's module names: the plan's targets exist in the model
        from advisor.core.plan import lora_target_modules

        lora_target_modules(plan, list(ex.model.linear_shapes()))


def test_cards_and_models_the_catalogs_lack_are_named():
    by_id = {str(r["id"]): PLANS.express(r, TABLES) for r in _recipes()}
    mistral = by_id["14"]
    assert mistral.model is None and "not in the model catalog" in mistral.model_note
    assert mistral.gpu is None
    litgpt = by_id["32"]
    assert litgpt.gpu.key == "a10g" and litgpt.counter == "allocated"
    assert litgpt.published_peak_bytes == pytest.approx(9.67e9) and litgpt.measured_on_card


@pytest.mark.slow
def test_harness_writes_the_report(tmp_path):
    out = tmp_path / "answers_vs_recipes.md"
    rows, summ = BENCH.run(["32", "14"], out, SAMPLE, "estimate", workdir=tmp_path / "work", progress=False, trials=6,
                           tune_backend="estimate")
    text = out.read_text(encoding="utf-8")
    for heading in ("# The advisor's answer beside the experts' recipes", "## Summary", "## Recipes",
                    "## Notes per recipe"):
        assert heading in text
    assert "| id | recipe (as a Plan) | card | recipe predicted | published | advisor's answer | gain · quality | " \
           "pre-flight | why they differ |" in text
    assert "Rejected by the advisor as not fitting" in text and "Answers that pass pre-flight" in text
    assert summ["recipes"] == 2 and summ["asked"] == 1 and summ["not_asked"] == ["14"] and summ["answers"] == 1
    row = next(r for r in rows if r["ex"].rid == "32")
    assert row["recipe"]["fit"] in ("fits", "tight", "over") and row["recipe"]["tokens_per_s"] > 0
    assert row["preflight"]["verdict"] in ("GO", "RISKY", "NO-GO")
    assert math.isfinite(row["gain"]) and isinstance(row["levers"], list)
    line32 = next(line for line in text.splitlines() if line.startswith("| 32 ("))
    assert row["recipe"]["plan"].short() in line32 and row["answer"]["plan"].short() in line32
    assert row["preflight"]["verdict"] in line32 and "9.67 GB (allocated)" in line32
    line14 = next(line for line in text.splitlines() if line.startswith("| 14 ("))
    assert "not asked" in line14 and "not in the model catalog" in line14


def test_unknown_recipe_id_is_a_one_line_error(tmp_path):
    from advisor.core.errors import AdvisorInputError

    with pytest.raises(AdvisorInputError, match="--recipes"):
        BENCH.run(["999"], tmp_path / "r.md", SAMPLE, "estimate", progress=False)
