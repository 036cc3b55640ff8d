"""Every shipped search space loads and validates; broken ones report every error with its key."""

from __future__ import annotations

import pytest

from advisor.core.card_rules import Card
from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError, ConfigErrors
from matrix import FULL_MATRIX, matrix_params  # tests/matrix.py
from advisor.search.space import (SPACES_DIR, list_spaces, load_space, model_rules, plan_from_params,
                                  search_knobs)


def test_required_spaces_exist():
    assert {"default", "qlora", "throughput", "low-memory"} <= set(list_spaces())


# the GRPO and DPO spaces hold every SFT lever beside their own: their whole grids (millions of plans) take minutes
# each, so the SFT levers that no RL lever's rule reads are pinned (the default space walks those in full)
PINNED = {rl: ["lora_r=[16]", "double_quant=[true]", "lora_targets=[all-linear]", "expandable_segments=[false]",
               "optimizer=[adamw_torch_fused, paged_adamw_8bit, adamw_torch_8bit]"] for rl in ("grpo", "dpo")}
# the default space's grid, a quarter of it (no rule reads the allocator setting or double quantization's sibling
# choices): minutes whole on a loaded 2-core machine; its sampled proposals below cover it all
PINNED["default"] = ["expandable_segments=[false]", "double_quant=[true]"]


# the default space's grid with the knobs no rule reads between them pinned further (a sixteenth of it, every rule
# still met): by default; its whole pinned grid with --full-matrix (tests/matrix.py)
QUICK_DEFAULT = [*PINNED["default"], "lora_r=[16]", "micro_batch=[1, 8]", "checkpoint_layers=[null, 7]"]
GRIDS = [pytest.param(n, PINNED.get(n, []), id=n, marks=[pytest.mark.slow, FULL_MATRIX] if n == "default" else
                      [pytest.mark.slow] if n in PINNED else []) for n in list_spaces()]
GRIDS.append(pytest.param("default", QUICK_DEFAULT, marks=pytest.mark.slow, id="default-quick"))


@pytest.mark.parametrize("name,pins", GRIDS)
def test_space_loads_and_every_grid_point_builds_a_plan(name, pins):
    space = load_space(name, pins)
    text = (SPACES_DIR / f"{name}.yaml").read_text()
    assert text.startswith("#") and "advisor tune" in text.split("name:")[0], "header: purpose and how to run it"
    arch = resolve_model("qwen7b").arch
    points = list(space.grid())
    assert points, "a space whose every plan is invalid"
    assert all(not plan_from_params(p, space, arch).problems() for p in points), "the grid holds only valid plans"


def test_overrides_pin_and_set():
    s = load_space("default", ["method=qlora", "seq_len=2048", "micro_batch=[1,2]"])
    assert s.search["method"] == ["qlora"] and s.fixed["seq_len"] == 2048 and s.search["micro_batch"] == [1, 2]


def test_an_eval_batch_and_generation_are_optional_fixed_values():
    """Without them a plan does not evaluate (the exported configs do not); eval_batch=N puts evaluation at N in
    every plan's run, and a negative value is a one-line error naming the key."""
    arch = resolve_model("qwen7b").arch
    point = next(iter(load_space("default").grid()))
    plain = plan_from_params(point, load_space("default"), arch)
    assert plain.eval_batch == 0 and plain.max_new_tokens == 0
    space = load_space("default", ["eval_batch=8", "max_new_tokens=128"])
    plan = plan_from_params(point, space, arch)
    assert plan.eval_batch == 8 and plan.max_new_tokens == 128
    with pytest.raises(AdvisorInputError, match="fixed.eval_batch: must be a whole number of at least 0"):
        load_space("default", ["eval_batch=-1"])


def test_all_errors_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrials: 0\nfixed: {seq_len: 0, global_batch: 8, lora_dropout: 2, lora_alpha_ratio: 2}\n"
                   "search:\n  method: [qlora, sideways]\n  quantization: [nf4]\n  double_quant: [true]\n"
                   "  lora_r: [0]\n  lora_targets: [attention]\n  gradient_checkpointing: [true]\n"
                   "  optimizer: [adamw_torch]\n  micro_batch: [1]\n  precision: [bf16]\n  attn_impl: [sdpa]\n"
                   "  offload: [none]\n  chunked_ce: [false]\n  warp_drive: [on]\n")
    with pytest.raises(ConfigErrors) as e:
        load_space(str(bad))
    where = {err.where for err in e.value.errors}
    assert {"trials", "fixed.seq_len", "fixed.lora_dropout", "search.method", "search.lora_r",
            "search.warp_drive"} <= where


def test_missing_space_and_broken_yaml(tmp_path):
    with pytest.raises(AdvisorInputError, match="--space"):
        load_space("no-such-space")
    broken = tmp_path / "broken.yaml"
    broken.write_text("search: [unclosed\n")
    with pytest.raises(AdvisorInputError, match="not valid YAML"):
        load_space(str(broken))


def test_unknown_override_key():
    with pytest.raises(AdvisorInputError, match="unknown key"):
        load_space("default", ["warp=9"])


def _sample(space, spec, sampler, n):
    """``n`` proposals of a real Optuna study driven by the space's conditions (a made-up objective)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    conditions = space.conditions(spec.arch or {}, model_rules(spec))
    study = optuna.create_study(sampler=sampler)
    proposals = []
    for _ in range(n):
        trial = study.ask()
        params = conditions.walk(lambda name, knob, offered: trial.suggest_categorical(name, offered))
        proposals.append((params, dict(trial.params)))
        study.tell(trial, float(hash(tuple(sorted(map(str, params.items())))) % 1000))
    return proposals


# every space on every model; the three large spaces (about 35 s each under CI's load) on one model each by default,
# on all three with --full-matrix (tests/matrix.py)
@pytest.mark.parametrize("name,model", matrix_params(
    [(n, m) for m in ("qwen7b", "llama8b", "gemma2b") for n in list_spaces()],
    lambda c: [("space", c[0]), ("model", c[1])], ids=lambda c: f"{c[1]}-{c[0]}",
    slow=lambda c: c[0] in ("default", "grpo", "dpo")))
def test_every_sampled_proposal_is_a_valid_plan(name, model):
    import optuna
    import warnings

    spec = resolve_model(model)
    # as the tuner binds it: `auto` is the model's attention
    space = load_space(name, PINNED.get(name, []) if name != "default" else []).on_card(Card.of(None, spec))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        tpe = optuna.samplers.TPESampler(seed=0, multivariate=True, group=True, n_startup_trials=8)
    proposals = _sample(space, spec, optuna.samplers.RandomSampler(seed=1), 300) + _sample(space, spec, tpe, 60)
    check = model_rules(spec)
    for params, asked in proposals:
        plan = plan_from_params(params, space, spec.arch)
        assert not check(plan), (params, [str(e) for e in check(plan)])
        plan.validate()
        for knob, value in params.items():  # a knob that does not apply (to the space's workload too) is never asked
            declared = search_knobs()[knob]
            if not declared.applies_to({**space.workload, **params}):
                assert value == declared.inactive and not any(k.split("[")[0] == knob for k in asked), (knob, asked)
    conditions = space.conditions(spec.arch, check)
    assert all(conditions.holds(p) for p, _ in proposals), "a proposal outside the space's grid"


def test_a_grid_point_is_what_the_grid_enumerates():
    """Conditions.holds (the check of the sampled proposals above, without enumerating the grid) against the whole
    grid of a smaller space: every point in it, and each point with one knob changed to any other choice (or to its
    inactive value) exactly when the grid holds that one too."""
    space = load_space("qlora", ["micro_batch=[1, 2]"])
    c = space.conditions()
    grid = list(c.points())
    held = {tuple(sorted(p.items(), key=str)) for p in grid}
    assert grid and all(c.holds(p) for p in grid)
    verdicts = []
    for point in grid[::97]:
        for knob in c.order:
            for value in [*space.search.get(knob, []), c.inactive(knob)]:
                changed = {**point, knob: value}
                verdicts.append(c.holds(changed))
                assert verdicts[-1] == (tuple(sorted(changed.items(), key=str)) in held), changed
    assert any(verdicts) and not all(verdicts)


def test_the_rules_shape_what_is_asked():
    space = load_space("default", ["method=[full, lora]", "precision=[fp16, bf16]", "optimizer=[paged_adamw_8bit]",
                                   "offload=[none, zero2_cpu]", "quantization=[none, int8]"])
    c = space.conditions()
    assert c.offered("precision", {"method": "full"}) == ["bf16"]  # pure fp16 full fine-tuning diverges
    assert c.offered("precision", {"method": "lora"}) == ["fp16", "bf16"]
    assert c.offered("offload", {"method": "lora", "optimizer": "paged_adamw_8bit"}) == ["none"]  # CPU Adam
    asked = []
    params = c.walk(lambda name, knob, offered: asked.append(name) or offered[-1])
    assert params["method"] == "lora" and params["offload"] == "none"
    assert "offload" not in asked and not any(n.startswith("offload") for n in asked)
    assert "quantization" in asked  # lora: none or int8, all of the space's choices


def test_a_knob_asked_with_some_of_its_choices_gets_its_own_name():
    c = load_space("default").conditions()
    asked = {}
    c.walk(lambda name, knob, offered: asked.setdefault(knob, name) and offered[0])
    assert asked["method"] == "method" and asked["quantization"] == "quantization[nf4|fp4]"


def test_the_ladder_is_enqueued_under_the_names_a_walk_asks():
    c = load_space("default").conditions()
    point = {"method": "full", "quantization": "none", "double_quant": True, "lora_r": 16,
             "lora_targets": "attention", "gradient_checkpointing": False, "optimizer": "adamw_torch",
             "micro_batch": 1, "precision": "auto", "attn_impl": "auto", "offload": "none", "chunked_ce": False}
    named = c.optuna_params(point)
    assert named["method"] == "full" and not any(k.startswith(("quantization", "double_quant", "lora_")) for k in named)
    assert c.optuna_params({**point, "method": "qlora"}) is None  # qlora needs a 4-bit base: no walk gets there


def test_a_space_without_any_valid_plan_is_refused(tmp_path):
    with pytest.raises(AdvisorInputError, match="no combination of these choices is a valid plan"):
        load_space("default", ["method=qlora", "quantization=[none, int8]"])
    with pytest.raises(AdvisorInputError, match="no combination"):
        load_space("default", ["optimizer=paged_adamw_8bit", "offload=zero2_cpu"])


def test_where_a_knob_applies_depends_only_on_the_knobs_chosen_before_it():
    """Knob.applies sees the point chosen so far: on every grid point it must say the same with the knobs
    after it left out."""
    space = load_space("default")
    order = list(search_knobs())
    for n, point in enumerate(space.grid()):
        if n == 3000:
            break
        for i, name in enumerate(order):
            declared = search_knobs()[name]
            before = {k: point[k] for k in order[:i] if k in point}
            assert declared.applies_to(before) == declared.applies_to(point), (name, point)


def test_a_walk_never_runs_into_a_dead_end():
    # offload pinned to zero2_cpu: only qlora nf4 with adamw_torch is valid. lora passes a one-knob-at-a-time
    # look ahead (int8 alone, zero2_cpu alone) but has no valid completion, so it must not be offered.
    space = load_space("default", ["method=[lora, qlora]", "quantization=[int8, nf4]",
                                   "optimizer=[paged_adamw_8bit, adamw_torch]", "offload=zero2_cpu"])
    c = space.conditions()
    assert c.offered("method", {}) == ["qlora"]
    for pick in (0, -1):
        params = c.walk(lambda name, knob, offered: offered[pick])
        assert params["optimizer"] == "adamw_torch" and params["offload"] == "zero2_cpu"
        plan_from_params(params, space, {}).validate()


# 15 random spaces by default, 60 with --full-matrix (CI derandomizes hypothesis: the 15 are the 60's first)
@pytest.mark.slow
@pytest.mark.parametrize("examples", [15, pytest.param(60, marks=FULL_MATRIX)])
def test_random_spaces_only_ever_propose_valid_plans(examples):
    import random

    from hypothesis import given, settings, strategies as st

    subsets = {"method": ["full", "lora", "qlora"], "quantization": ["none", "int8", "nf4", "fp4"],
               "double_quant": [True, False], "gradient_checkpointing": [True, False],
               "optimizer": ["adamw_torch", "paged_adamw_8bit", "adafactor"], "precision": ["bf16", "fp16", "fp32"],
               "attn_impl": ["sdpa", "flash_attention_2"], "offload": ["none", "zero2_cpu", "zero3_cpu"]}

    @settings(max_examples=examples, deadline=None)
    @given(st.fixed_dictionaries({k: st.lists(st.sampled_from(v), min_size=1, unique=True)
                                  for k, v in subsets.items()}), st.integers(0, 2**16))
    def check(choices, seed):
        try:
            space = load_space("default", [f"{k}={v}" for k, v in choices.items()])
        except AdvisorInputError:
            return  # no valid plan at all: refused when loaded
        c, rng = space.conditions(), random.Random(seed)
        for _ in range(20):
            plan_from_params(c.walk(lambda name, knob, offered: rng.choice(offered)), space, {}).validate()

    check()
