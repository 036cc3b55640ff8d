"""One declaration per study setting: a setting declared once, on a TuneSettings subclass, reaches `tune --help`,
the resolved (frozen) settings, the stored description and its JSON round trip, the default study name, and the
check that a resumed study asks the same question, through the real derivation code (the subclass is passed
where TuneSettings is)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

import pytest

from advisor.commands import tune as tune_command
from advisor.core.errors import AdvisorInputError
from advisor.search.description import StudyDescription
from advisor.search.setting import setting, settings_of
from advisor.search.settings import WHOLE, TuneSettings, default_study_name, study_description_type


@dataclass(frozen=True)
class FrobSettings(TuneSettings):
    frob_level: int = setting(3, help="how hard to frobnicate (a made-up setting)", flag="--frob-level",
                              cli={"range": WHOLE}, key="frob_level", answer=True, shown=str)
    """A setting that does nothing: it only has to travel."""


def parser(settings_cls=None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="advisor")
    tune_command.add_parser(p.add_subparsers(dest="command"), settings_cls)
    return p


def tune_help(settings_cls=None) -> str:
    p = parser(settings_cls)
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["tune"].format_help()


def settings(tmp_path, *extra: str, settings_cls=FrobSettings):
    args = parser(settings_cls).parse_args(["tune", "--model", "qwen0.5b", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                                            "--backend", "estimate", "--host-budget", "32GB",
                                            "--reports-dir", str(tmp_path), *extra])
    return tune_command.build_settings(args)


def test_the_setting_is_one_more_field_of_the_subclass_only():
    assert [s.name for s in settings_of(FrobSettings)] == [s.name for s in settings_of(TuneSettings)] + ["frob_level"]
    assert "frob_level" in {f.name for f in dataclasses.fields(study_description_type(FrobSettings))}
    assert "frob_level" not in {f.name for f in dataclasses.fields(StudyDescription)}


def test_tune_help_has_its_flag():
    text = tune_help(FrobSettings)
    assert "--frob-level" in text and "how hard to frobnicate" in text
    assert "--frob-level" not in tune_help()
    with pytest.raises(SystemExit):  # the flag belongs to the subclass's setting
        parser().parse_args(["tune", "--model", "qwen0.5b", "--gpu-budget", "24GB", "--frob-level", "5"])


def test_the_flag_resolves_into_the_frozen_settings(tmp_path):
    s = settings(tmp_path, "--frob-level", "5")
    assert isinstance(s, FrobSettings) and s.frob_level == 5
    assert settings(tmp_path).frob_level == 3  # the declared default
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.frob_level = 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.host_budget = None


def test_the_stored_json_round_trip_carries_it(tmp_path):
    s = settings(tmp_path, "--frob-level", "5")
    d = s.description()
    stored = json.loads(json.dumps(d.to_dict()))
    assert stored["frob_level"] == 5
    back = type(d).from_dict(stored)
    assert back == d and back.frob_level == 5
    rebuilt = FrobSettings.from_description(back, storage=s.storage, study_name=s.study_name)
    assert rebuilt.frob_level == 5 and rebuilt.description() == d
    # an older study, stored before the setting existed, holds its default
    del stored["frob_level"]
    assert type(d).from_dict(stored).frob_level == 3


def test_it_takes_part_in_the_default_study_name_and_in_the_question(tmp_path):
    a, b = settings(tmp_path, "--frob-level", "5"), settings(tmp_path, "--frob-level", "6")
    assert a.study_name != b.study_name and a.study_name.startswith("qwen2.5-0.5b-instruct-24gb-default-")
    stored = a.describe()
    args = parser(FrobSettings).parse_args(["tune", "--model", "qwen0.5b", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                                            "--backend", "estimate", "--host-budget", "32GB", "--frob-level", "6",
                                            "--study", "mine", "--reports-dir", str(tmp_path)])
    with pytest.raises(AdvisorInputError) as e:
        FrobSettings.from_flags(args, stored=stored)
    assert str(e.value) == ("--frob-level: study 'mine' was made with frob level 5, not 6; name another study with "
                            "--study, or leave --study out for the study of these settings (the existing study is kept "
                            "as it is)")


@pytest.mark.parametrize("extra", [
    ("--gpu", "rtx-3090"), ("--gpus", "2"), ("--sharding", "fsdp"), ("--gpu-budget", "16GB"), ("seq_len=2048",),
    ("--seq-len", "2048"), ("--host-budget", "64GB"), ("--regime", "domain"), ("--headroom", "0.2"),
    ("--accuracy-tolerance", "0.1"), ("--backend", "simulate"), ("--packing",), ("--space", "qlora"),
])
def test_every_setting_that_changes_the_answer_changes_the_default_name(tmp_path, extra):
    assert settings(tmp_path, *extra, settings_cls=TuneSettings).study_name != \
        settings(tmp_path, settings_cls=TuneSettings).study_name


@pytest.mark.parametrize("extra", [("--trials", "7"), ("--seed", "3"), ("--heartbeat", "5"), ("--probe-steps", "2")])
def test_how_a_run_goes_keeps_the_study(tmp_path, extra):
    assert settings(tmp_path, *extra, settings_cls=TuneSettings).study_name == \
        settings(tmp_path, settings_cls=TuneSettings).study_name


def test_the_name_is_stable_and_readable(tmp_path):
    s = settings(tmp_path, settings_cls=TuneSettings)
    values = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    assert default_study_name(values) == s.study_name
    head, _, tail = s.study_name.rpartition("-host32gb")[0].rpartition("-")
    assert head == "qwen2.5-0.5b-instruct-24gb-default" and len(tail) == 6


def test_every_setting_is_declared_with_setting():
    with pytest.raises(TypeError, match="not declared with setting"):
        @dataclass(frozen=True)
        class Loose(TuneSettings):
            loose: int = 0

        settings_of(Loose)


def test_the_report_reproduces_it(tmp_path):
    from advisor.search.setting import reproduce_flags

    flags = reproduce_flags(settings(tmp_path, "--frob-level", "5").description())
    assert flags[flags.index("--frob-level") + 1] == "5"
    assert flags[flags.index("--host-budget") + 1] == "32GB" and flags[flags.index("--gpu") + 1] == "rtx-4090"
