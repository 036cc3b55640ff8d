"""The quality model (advisor/data/quality.yaml, advisor/search/quality.py): every lever covered, with sources,
combined as documented, and the doc page generated from the same data."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from advisor.core.data_files import load_data_file
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import Range, Workload, knob, knobs
from advisor.core.plan import (ATTENTION, DTYPES, LOSSES, LOW_RANK_OPTIMIZERS, METHODS, OFFLOADS, OPTIMIZERS,
                               PRECISIONS, QUANTIZATIONS, Plan)
from advisor.search import quality as q
from tests.benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED_QUALITY = ROOT.parent.parent / "shared" / "published_runs" / "quality.json"
RECIPE = Plan(method="lora", quantization="none", precision="bf16", lora_r=16, lora_alpha=32.0,
              lora_targets="all-linear", optimizer="adamw_torch_fused")
"""The usual recipe: bf16 LoRA on all linear layers with the default AdamW."""
BOOL_LEVERS = ("double_quant", "dora", "gradient_checkpointing", "activation_offload", "optimizer_in_backward",
               "packing", "expandable_segments")
DYNAMICS_OPTIMIZERS = ("lomo", "adalomo", "adafactor", "sgd", "galore_adamw", "galore_adamw_8bit",
                       "galore_adamw_layerwise", "apollo_adamw")


def raw() -> dict:
    return copy.deepcopy(load_data_file(q.DATA_FILE))


def full(**kw) -> Plan:
    return Plan(method="full", quantization="none", precision="mixed_bf16", optimizer="adamw_torch_fused").with_(**kw)


# ---------------------------------------------------------------------------------------------- the data file


def test_data_file_loads_and_validates():
    assert q.validate_quality_data(raw()) == []
    data = q.quality_data()
    assert data.default_regime in data.regimes
    assert data.default_tolerance == 0.05  # the unit is unchanged: the CLI's default tolerance stays meaningful
    assert set(data.entries) == set(q.LEVER_VALUES)


def test_every_lever_of_the_plan_has_entries_and_the_workload_none():
    """Which Plan fields are levers comes from their declarations (``Knob.workload``), not from a list of names."""
    entries = q.quality_data().entries
    for k in knobs(Plan):
        if k.is_lever:
            assert k.name in entries, f"Plan.{k.name} is a lever without a quality entry"
        else:
            assert k.name not in entries and k.name not in q.LEVER_VALUES, f"Plan.{k.name} is the workload"
    assert {k.name for k in knobs(Plan) if not k.is_lever} >= {"seq_len", "eval_batch", "max_new_tokens"}


def test_a_new_workload_knob_needs_no_entry_and_a_new_lever_does():
    @dataclass(frozen=True)
    class LongerPlan(Plan):
        images_per_sample: int = knob(0, help="images per sample (the user's data)", range=Range(low=0, whole=True),
                                      workload=Workload())
        frobnicate: bool = knob(False, help="a made-up lever")

    values = q.lever_values(LongerPlan)
    assert "images_per_sample" not in values and values["frobnicate"] == ("false", "true")
    plan = LongerPlan(method="lora", images_per_sample=3)
    assert not q.uncovered_levers(plan)  # the workload is never priced
    assert q.uncovered_levers(plan.with_(frobnicate=True)) == ["frobnicate=True: no quality entry for this lever"]


@pytest.mark.parametrize("plan", [Plan(), Plan(method="lora", quantization="int8", compute_dtype="fp16"),
                                  Plan(method="qlora", quantization="nf4", compute_dtype="fp32"),
                                  Plan(method="full", optimizer="galore_adamw", gradient_checkpointing=True,
                                       checkpoint_layers=3)],
                         ids=["lora", "int8", "nf4", "full-galore"])
def test_a_lever_takes_part_where_its_declaration_says_it_applies(plan):
    """One rule: compute_dtype is the 4-bit dequantization dtype (Plan's declaration), so an 8-bit base prices none."""
    for k in knobs(Plan):
        if k.is_lever:
            assert q.applies(plan, k.name) == k.applies_to(vars(plan)), k.name
    used = {e.lever for e in q.quality_of(plan).levers}
    assert ("compute_dtype" in used) == plan.four_bit


@pytest.mark.parametrize("lever, values", [
    ("method", METHODS), ("quantization", QUANTIZATIONS), ("precision", PRECISIONS), ("optimizer", OPTIMIZERS),
    ("attn_impl", ATTENTION), ("offload", OFFLOADS), ("loss", LOSSES), ("compute_dtype", DTYPES),
    *[(lever, ("false", "true")) for lever in BOOL_LEVERS]])
def test_every_value_of_every_plan_tuple_has_an_entry(lever, values):
    entries = q.quality_data().entries[lever]
    for value in values:
        assert entries.get(value), f"{lever}={value} has no entry in quality.yaml"
        for e in entries[value]:
            assert e.source.strip() and e.does.strip() and e.measured.strip(), f"{lever}={value}: entry incomplete"
            assert e.kind in q.KINDS and e.basis in q.BASES


def test_every_optimizer_of_every_method_gets_an_entry_or_is_named_uncovered():
    for method in METHODS:
        for opt in OPTIMIZERS:
            if opt in LOW_RANK_OPTIMIZERS and method != "full":
                continue
            plan = (full() if method == "full" else RECIPE.with_(method=method, quantization=
                    "nf4" if method == "qlora" else "none")).with_(optimizer=opt)
            used, uncovered = q.lever_effects(plan)
            assert any(e.lever == "optimizer" for e in used) or any(u.startswith(f"optimizer={opt}")
                                                                   for u in uncovered), (method, opt)


@pytest.mark.parametrize("mutate, names", [
    (lambda d: d["levers"]["optimizer"]["lomo"][0].update(foo=1), "levers.optimizer.lomo[0].foo"),
    (lambda d: d["levers"].update(flux_capacitor={"any": {}}), "levers.flux_capacitor"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["levers"]["optimizer"].pop("sgd"), "levers.optimizer.sgd"),
    (lambda d: d["levers"]["loss"].update(magic={}), "levers.loss.magic"),
    (lambda d: d["levers"]["packing"]["true"].update(accuracy_loss=0.01), "levers.packing.true"),
    (lambda d: d["levers"]["quantization"]["nf4"].update(token_factor=0.5), "levers.quantization.nf4.token_factor"),
    (lambda d: d["levers"]["quantization"]["nf4"].pop("source"), "levers.quantization.nf4.source"),
    (lambda d: d["levers"]["lora_r"]["any"][0]["when"].update(colour=["red"]), "when.colour"),
    (lambda d: d["levers"]["lora_r"]["any"].pop(0), "levers.lora_r.any"),      # r >= 16 in sft left uncovered
    (lambda d: d["hyperparameters"].pop("lomo"), "hyperparameters.lomo"),
    (lambda d: d["hyperparameters"]["sgd"].update(momentum=0.9), "hyperparameters.sgd.momentum"),
])
def test_bad_data_is_an_error_naming_the_key(mutate, names):
    data = raw()
    mutate(data)
    errs = q.validate_quality_data(data)
    assert errs, "the validator accepted a broken file"
    assert any(names in str(e) for e in errs), [str(e) for e in errs]
    with pytest.raises(AdvisorInputError):
        q.parse_quality_data(data)


def test_evidence_ids_are_points_of_the_published_quality_file():
    if not PUBLISHED_QUALITY.exists():
        pytest.skip("../shared/published_runs/quality.json is not in this checkout")
    known = {p["id"] for p in json.loads(PUBLISHED_QUALITY.read_text("utf-8"))}
    cited = {x for row in q.lever_table() for x in row.evidence}
    cited |= {x for spec in q.quality_data().hyperparameters.values()
              for e in (spec if isinstance(spec, list) else [spec]) for x in e.get("evidence", ())}
    assert cited - known == set()


def test_the_reference_hyperparameters_are_the_exports_adamw_values():
    from advisor.configs._base import ADAM, STARTING_LEARNING_RATE as LEARNING_RATE

    ref = q.quality_data().hyperparameters["reference"]
    assert ref["learning_rate"] == {"full": LEARNING_RATE["full"], "peft": LEARNING_RATE["lora"]}
    assert ref["max_grad_norm"] == ADAM["max_grad_norm"]


def test_the_doc_page_is_generated_from_the_yaml():
    page = ROOT / "docs" / "quality.md"
    assert page.read_text("utf-8") == load_benchmark("quality_table").render(), \
        "docs/quality.md is stale: run python benchmarks/quality_table.py"


# ------------------------------------------------------------------------------------------------- the model


def test_the_usual_recipe_is_the_zero_point():
    effect = q.quality_of(RECIPE)
    assert effect.accuracy_loss == 0 and effect.token_factor == 1
    assert effect.pickable and effect.dynamics == ()
    assert q.quality_of(full()).accuracy_loss == 0  # the reference itself


@pytest.mark.parametrize("change", [
    dict(gradient_checkpointing=True), dict(gradient_checkpointing=True, checkpoint_layers=7),
    dict(activation_offload=True), dict(loss="chunked"), dict(loss="fused-linear"), dict(packing=True),
    dict(expandable_segments=True), dict(attn_impl="eager"), dict(attn_impl="flash_attention_2"),
    dict(micro_batch=4, grad_accum=2), dict(eval_batch=8, max_new_tokens=64), dict(optimizer="adamw_torch"),
    dict(optimizer="paged_adamw_32bit"), dict(lora_dropout=0.0)])
def test_exact_levers_cost_exactly_zero(change):
    plan = RECIPE.with_(**change)
    effect = q.quality_of(plan)
    assert (effect.accuracy_loss, effect.token_factor) == (0.0, 1.0)
    assert all(k in ("exact", "near-exact") for label, k in effect.kinds.items() if label.split("=")[0] in change)
    assert q.quality_tie(q.quality_of(RECIPE), effect)


def test_a_4bit_base_costs_the_same_whatever_its_compute_dtype_and_constants():
    qlora = RECIPE.with_(method="qlora", quantization="nf4")
    losses = {q.quality_of(qlora.with_(double_quant=dq, compute_dtype=dt)).accuracy_loss
              for dq in (False, True) for dt in ("bf16", "fp32")}
    assert losses == {q.quality_of(qlora).accuracy_loss}


def test_offload_is_exact():
    for offload in ("zero2_cpu", "zero3_cpu"):
        assert q.quality_of(full(offload=offload, optimizer="adamw_torch")).accuracy_loss == 0


def test_nf4_loses_less_than_fp4_and_int8_least():
    loss = {fmt: q.quality_of(RECIPE.with_(method="qlora" if fmt in ("nf4", "fp4") else "lora",
                                            quantization=fmt)).accuracy_loss for fmt in QUANTIZATIONS}
    assert loss["none"] == 0 < loss["int8"] < loss["nf4"] < loss["fp4"]


def test_a_measured_kl_replaces_the_quantization_prior():
    plan = RECIPE.with_(method="qlora", quantization="nf4")
    effect = q.quality_of(plan, measured_kl=0.011)
    assert effect.accuracy_source == "measured"
    assert effect.accuracy_loss == pytest.approx(0.011)
    assert q.quality_of(plan).accuracy_source == "prior"


def test_losses_add_and_token_factors_multiply(monkeypatch):
    nf4_attention = RECIPE.with_(method="qlora", quantization="nf4", lora_targets=("q_proj", "k_proj", "v_proj",
                                                                                  "o_proj"))
    parts = [q.quality_of(RECIPE.with_(method="qlora", quantization="nf4")).accuracy_loss,
             q.quality_of(RECIPE.with_(lora_targets=("q_proj", "v_proj"))).accuracy_loss]
    assert q.quality_of(nf4_attention).accuracy_loss == pytest.approx(sum(parts))
    # two levers with token factors (none of the shipped ones combine two): a copy of the data with a second one
    data = raw()
    data["levers"]["packing"]["true"].update(kind="cost", token_factor=1.5, basis="judgment")
    patched = q.parse_quality_data(data)
    monkeypatch.setattr(q, "quality_data", lambda: patched)
    effect = q.quality_of(full(optimizer="galore_adamw", packing=True))
    assert effect.token_factor == pytest.approx(1.05 * 1.5)


def test_capacity_depends_on_the_regime():
    sft, domain, cpt = (q.quality_of(RECIPE, regime) for regime in ("sft", "domain", "cpt"))
    assert sft.accuracy_loss == 0
    tolerance = q.quality_data().default_tolerance
    assert domain.accuracy_loss > tolerance and domain.token_factor > 1  # Biderman et al.: r16 on code/math
    assert q.quality_of(RECIPE.with_(lora_r=256, lora_alpha=512), "domain").accuracy_loss < tolerance
    assert cpt.accuracy_loss > tolerance
    assert all(q.quality_of(full(), r).accuracy_loss == 0 for r in ("sft", "domain", "cpt"))
    with pytest.raises(AdvisorInputError, match="--regime"):
        q.quality_of(RECIPE, "rlhf")


def test_target_sets_are_classified_by_the_architectures_module_names():
    assert q.target_class("all-linear") == "all-linear"
    assert q.target_class(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")) \
        == "all-linear"
    assert q.target_class(("gate_proj", "up_proj", "down_proj")) == "mlp"
    assert q.target_class(("q_proj", "v_proj")) == "attention"
    assert q.target_class(("qkv_proj", "o_proj")) == "attention"   # phi3's fused names
    assert q.target_class(("down_proj",)) == "other"
    assert q.target_class(("not_a_module",)) == "other"


def test_levers_without_a_source_are_uncovered_and_unpickable():
    # the seeds' answer in issue 23: QLoRA with LOMO. No source trained adapters with LOMO.
    seeds = Plan(method="qlora", quantization="nf4", lora_r=64, lora_alpha=128, activation_offload=True,
                 optimizer="lomo", micro_batch=8)
    effect = q.quality_of(seeds)
    assert not effect.pickable
    assert [u.split(":")[0] for u in q.uncovered_levers(seeds)] == ["optimizer=lomo"]
    assert q.uncovered_levers(RECIPE.with_(lora_targets=("down_proj",)))[0].startswith("lora_targets=other")
    assert q.uncovered_levers(full(optimizer="galore_adamw", optim_rank=4096))[0].startswith("optim_rank=4096")
    assert q.uncovered_levers(RECIPE.with_(lora_dropout=0.3))[0].startswith("lora_dropout=0.3")


def test_dynamics_levers_are_reported():
    assert q.dynamics_levers(RECIPE) == []
    assert q.dynamics_levers(full(optimizer="lomo")) == ["optimizer=lomo"]
    assert q.dynamics_levers(full(optimizer="adafactor")) == ["optimizer=adafactor"]
    assert q.dynamics_levers(RECIPE.with_(optimizer_in_backward=True)) == ["optimizer_in_backward=true"]
    assert q.dynamics_levers(full(optimizer="galore_adamw")) == ["optimizer=galore_adamw", "optim_rank=128",
                                                                 "optim_proj_gap=200"]
    assert q.dynamics_levers(RECIPE.with_(micro_batch=4), global_batch=8) == ["global_batch=changed"]
    assert q.dynamics_levers(RECIPE.with_(micro_batch=4, grad_accum=2), global_batch=8) == []
    assert q.quality_of(full(optimizer="lomo")).dynamics == ("optimizer=lomo",)


def test_near_exact_optimizer_states_are_within_noise_of_adamw():
    base = q.quality_of(full())
    for opt in ("adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit", "adamw_torch_4bit"):
        effect = q.quality_of(full(optimizer=opt))
        assert effect.kinds[f"optimizer={opt}"] == "near-exact"
        assert q.quality_tie(base, effect)


def test_a_quality_difference_decides_only_beyond_the_noise_of_the_levers_that_differ():
    recipe = q.quality_of(RECIPE)
    assert not q.quality_tie(recipe, q.quality_of(RECIPE.with_(method="qlora", quantization="fp4")))
    assert q.quality_tie(recipe, q.quality_of(RECIPE.with_(quantization="int8")))
    delta, noise = q.quality_difference(recipe, q.quality_of(RECIPE.with_(method="qlora", quantization="nf4")))
    assert delta == pytest.approx(0.02) and noise == pytest.approx(0.01)


def test_time_to_quality_ranks_by_tokens_needed_over_speed():
    slow_exact = q.time_to_quality(1000.0, q.quality_of(full()))
    fast_needs_more = q.time_to_quality(1500.0, q.quality_of(RECIPE, "domain"))   # x4 tokens
    assert slow_exact < fast_needs_more
    with pytest.raises(AdvisorInputError):
        q.time_to_quality(0.0, q.quality_of(RECIPE))


@pytest.mark.parametrize("opt", DYNAMICS_OPTIMIZERS)
def test_recommended_hyperparameters_exist_for_each_dynamics_optimizer(opt):
    plan = full(optimizer=opt)
    assert q.quality_of(plan).kinds[f"optimizer={opt}"] == "dynamics"
    hp = q.recommended_hyperparameters(plan)
    assert hp["learning_rate"] > 0 and hp["max_grad_norm"] >= 0
    assert hp["why"].strip() and hp["sources"] and all(s.strip() for s in hp["sources"])
    assert hp["reference"]["learning_rate"] == q.quality_data().hyperparameters["reference"]["learning_rate"]["full"]


def test_a_step_inside_backward_exports_no_clipping():
    for plan in (full(optimizer="lomo"), full(optimizer="adalomo"), full(optimizer="galore_adamw_layerwise"),
                 RECIPE.with_(optimizer_in_backward=True)):
        hp = q.recommended_hyperparameters(plan)
        assert hp["max_grad_norm"] == 0, plan.optimizer
    assert q.recommended_hyperparameters(RECIPE.with_(optimizer_in_backward=True))["learning_rate"] == 2e-4


def test_adamw_needs_no_other_hyperparameters():
    assert q.recommended_hyperparameters(RECIPE) == {}
    assert q.recommended_hyperparameters(full(optimizer="paged_adamw_8bit")) == {}


def test_apollo_mini_gets_its_own_scale():
    mini = q.recommended_hyperparameters(full(optimizer="apollo_adamw", optim_rank=1))
    assert mini["optim_args"]["scale_type"] == "tensor"
    assert q.recommended_hyperparameters(full(optimizer="apollo_adamw"))["optim_args"]["scale_type"] == "channel"


def test_the_effect_serializes():
    d = q.quality_of(RECIPE.with_(packing=True)).to_dict()
    json.dumps(d)
    assert d["pickable"] and any("packing" in n for n in d["notes"])


def test_a_plan_field_the_model_does_not_know_is_uncovered_when_set(monkeypatch):
    # a lever added to Plan later (other helpers add knobs): unpickable until quality.yaml covers it
    monkeypatch.setattr(q, "LEVER_VALUES", {k: v for k, v in q.LEVER_VALUES.items() if k != "dora"})
    assert any(u.startswith("dora=True") for u in q._unknown_fields(RECIPE.with_(dora=True)))
    assert q._unknown_fields(RECIPE) == []
