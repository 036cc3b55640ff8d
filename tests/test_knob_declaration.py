"""One declaration per knob: a boolean knob declared once, on a Plan subclass, reaches the command line, the
search space, ``short()`` and a round trip through every export format that declares a key for it, through
the real derivation code (the subclass is passed where the Plan class is); a format that declares no key
refuses a plan that turns it on; a knob declared as the user's workload is a space's fixed value, never
searched. The worked example of docs/adding-a-knob.md."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
import yaml

from advisor.commands.common import add_plan_flags, plan_from_args
from advisor.configs._keys import FORMATS
from advisor.configs.export import Unsupported, export_plan
from advisor.configs.read import read_config
from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import Key, Range, Search, Tag, Workload, knob, knob_of, knobs
from advisor.core.plan import Plan, canonical
from advisor.search.space import load_space, plan_from_params, search_knobs


@dataclass(frozen=True)
class FrobPlan(Plan):
    frobnicate: bool = knob(
        False, help="frobnicate the adapters (a made-up lever)", tag=Tag("frob"), search=Search(),
        keys={"advisor": Key("advisor.frobnicate"), "axolotl": Key("frobnicate"), "trl": Key("frobnicate")})
    """A lever that does nothing: it only has to travel."""


SPEC = resolve_model("qwen7b")
KEYED = [fmt for fmt in FORMATS if isinstance(knob_of(FrobPlan, "frobnicate").keys.get(fmt), Key)]
PLANS = [FrobPlan(frobnicate=True),
         FrobPlan(method="qlora", quantization="nf4", double_quant=True, gradient_checkpointing=True, frobnicate=True),
         FrobPlan(method="full", optimizer="adafactor", frobnicate=True)]


def test_the_knob_is_one_more_field_of_the_subclass_only():
    assert [k.name for k in knobs(FrobPlan)] == [k.name for k in knobs(Plan)] + ["frobnicate"]
    assert KEYED == ["advisor", "axolotl", "trl"]


def test_the_command_line_has_its_flag():
    parser = argparse.ArgumentParser()
    add_plan_flags(parser, FrobPlan)
    assert plan_from_args(parser.parse_args(["--frobnicate"]), FrobPlan).frobnicate is True
    assert plan_from_args(parser.parse_args([]), FrobPlan) == FrobPlan()
    assert "frobnicate the adapters" in parser.format_help()
    plain = argparse.ArgumentParser()
    add_plan_flags(plain, Plan)
    with pytest.raises(SystemExit):  # the flag belongs to the subclass's knob, not to Plan
        plain.parse_args(["--frobnicate"])


def test_the_search_space_lists_and_asks_it():
    assert list(search_knobs(FrobPlan))[-1] == "frobnicate"  # no order declared: after the numbered knobs
    # a space file written before the knob: its default is the only choice
    assert load_space("default", plan=FrobPlan).search["frobnicate"] == [False]
    space = load_space("default", ["method=lora", "quantization=none", "frobnicate=[false, true]"], plan=FrobPlan)
    asked: dict[str, list] = {}

    def ask(name, knob, offered):
        asked[knob] = list(offered)
        return offered[-1]

    params = space.conditions(SPEC.arch).walk(ask)
    assert asked["frobnicate"] == [False, True] and params["frobnicate"] is True
    plan = plan_from_params(params, space, SPEC.arch)
    assert isinstance(plan, FrobPlan) and plan.frobnicate is True and not plan.problems()
    # both values are points of the grid (its rules along the one path to each, not the grid's millions of points)
    conditions = space.conditions(SPEC.arch)
    assert conditions.holds(params) and conditions.holds({**params, "frobnicate": False})
    assert not conditions.holds({**params, "frobnicate": "sometimes"})
    with pytest.raises(AdvisorInputError, match="unknown key"):
        load_space("default", ["frobnicate=true"])  # Plan has no such knob


def test_short_shows_its_tag_last_and_only_when_on():
    assert FrobPlan().short() == Plan().short()  # studies key on short(): existing plans keep theirs
    assert FrobPlan(frobnicate=True).short() == Plan().short() + " frob"


@pytest.mark.parametrize("fmt", KEYED)
@pytest.mark.parametrize("plan", PLANS, ids=["lora", "qlora", "full"])
def test_every_format_that_declares_a_key_writes_and_reads_it_back(fmt, plan, tmp_path):
    written = export_plan(SPEC, plan, tmp_path, [fmt])
    data = yaml.safe_load(written[fmt].read_text())
    assert (data["advisor"] if fmt == "advisor" else data)["frobnicate"] is True
    _, back, _ = read_config(written[fmt], check_fields=False, plan=FrobPlan)
    expected = plan.with_(loss="fused-linear") if fmt == "trl" else plan  # TRL always fuses the LM head
    assert back == canonical(expected)
    off = plan.with_(frobnicate=False)
    _, back, _ = read_config(export_plan(SPEC, off, tmp_path / "off", [fmt])[fmt], check_fields=False, plan=FrobPlan)
    assert back.frobnicate is False


def test_a_format_without_a_key_refuses_the_plan_when_the_knob_is_on(tmp_path):
    with pytest.raises(Unsupported, match="it has no key for --frobnicate"):
        export_plan(SPEC, FrobPlan(frobnicate=True), tmp_path, ["llamafactory"])
    written = export_plan(SPEC, FrobPlan(frobnicate=True), tmp_path / "all")
    assert "no key for --frobnicate" in written.skipped["llamafactory"]
    assert set(KEYED) <= set(written)
    off = export_plan(SPEC, FrobPlan(), tmp_path / "off", ["llamafactory"])  # off: nothing to say
    assert read_config(off["llamafactory"], check_fields=False, plan=FrobPlan)[1] == FrobPlan()


@dataclass(frozen=True)
class ImagesPlan(Plan):
    images_per_sample: int = knob(0, help="images per training sample (the user's data)",
                                  range=Range(low=0, whole=True), workload=Workload())
    """The user's workload, not a lever: a space states it, the search never turns it."""


def test_a_workload_knob_is_a_fixed_value_of_a_space_never_searched():
    assert knob_of(ImagesPlan, "images_per_sample").role == "workload"
    assert "images_per_sample" not in search_knobs(ImagesPlan)
    assert plan_from_params({}, load_space("default", plan=ImagesPlan), SPEC.arch).images_per_sample == 0  # default
    space = load_space("default", ["images_per_sample=4"], plan=ImagesPlan)
    assert plan_from_params({}, space, SPEC.arch).images_per_sample == 4
    with pytest.raises(AdvisorInputError, match="fixed.images_per_sample: must be a whole number of at least 0"):
        load_space("default", ["images_per_sample=-1"], plan=ImagesPlan)
    with pytest.raises(AdvisorInputError, match="unknown key"):
        load_space("default", ["images_per_sample=4"])  # Plan has no such knob

    @dataclass(frozen=True)
    class SearchedWorkload(Plan):
        rollout_len: int = knob(64, help="tokens per rollout", range=Range(low=1, whole=True), workload=Workload(),
                                search=Search())

    with pytest.raises(TypeError, match="the user's workload, which the search never turns"):
        knobs(SearchedWorkload)
