"""The typed study description: a JSON round trip, old studies still load, and every reader (tuner,
worker, export, report, TUI) rebuilds the model and GPU from it the same way."""

from __future__ import annotations

import json

import pytest

from advisor.cli import build_parser
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.units import Budget
from advisor.search.description import ATTR, StudyDescription, gpu_from_dict, model_from_dict
from advisor.search.space import load_space


def _description(**changes) -> StudyDescription:
    d = StudyDescription(model=resolve_model("qwen7b"), gpu=resolve_gpu("rtx-4090"),
                         budget=Budget(24 * 10**9, "GB", "24GB"),
                         space=load_space("default", ["micro_batch=[1,2]"]), backend="simulate", gpu_assumed=True,
                         headroom=0.1, tolerance=0.02, seed=3, trials=7, gpus=2, sharding="fsdp",
                         versions={"torch": "2.13.0"}, environment={"driver": None})
    return StudyDescription(**{**d.__dict__, **changes})


def test_json_round_trip():
    d = _description()
    text = json.dumps(d.to_dict())
    back = StudyDescription.from_dict(json.loads(text))
    assert back == d
    assert back.model.config == d.model.config and back.versions == d.versions
    assert back.to_dict() == d.to_dict()
    assert back.target.gpu_assumed and back.target.budget.bytes == 24 * 10**9


def test_the_stored_keys_are_the_ones_studies_have_always_had():
    keys = set(_description().to_dict())
    assert keys >= {"model", "gpu", "gpu_assumed", "budget", "space", "backend", "headroom", "tolerance", "seed",
                    "trials", "gpus", "sharding", "versions", "environment"}


def test_an_old_study_still_loads():
    """What `advisor tune` stored before gpus, sharding and task existed, with a ModelSpec field since removed."""
    new = _description().to_dict()
    old = {k: v for k, v in new.items() if k not in ("gpus", "sharding", "task")}
    old["model"] = {**old["model"], "retired_field": 1}
    d = StudyDescription.from_dict(old)
    assert (d.gpus, d.sharding, d.task) == (1, "zero3", "train")
    assert d.model == resolve_model("qwen7b") and d.space.search["micro_batch"] == [1, 2]


def test_a_spec_missing_a_field_is_resolved_again_by_name():
    m = resolve_model("qwen7b").to_dict()
    del m["params_total"]
    assert model_from_dict(m) == resolve_model("qwen7b")
    g = resolve_gpu("a100-80gb").to_dict()
    del g["mem_bw_gbs"]
    assert gpu_from_dict(g) == resolve_gpu("a100-80gb")


@pytest.fixture()
def study(tmp_path):
    from advisor.commands.tune import build_settings
    from advisor.search.tuner import Tuner

    args = build_parser().parse_args(["tune", "--model", "qwen7b", "--gpu", "rtx-4090", "--gpu-budget", "24GB",
                                      "--backend", "estimate", "--trials", "3", "--study", "desc",
                                      "--reports-dir", str(tmp_path)])
    settings = build_settings(args)
    tuner = Tuner(settings)
    tuner.run()
    return settings, tuner


def test_tune_stores_it_and_a_worker_export_and_report_read_it_back(study, tmp_path):
    from advisor.search.tuner import settings_from_study
    from advisor.ui.report import gather, open_study, resolve_storage

    settings, tuner = study
    stored = StudyDescription.from_dict(tuner.study.user_attrs[ATTR])
    assert stored == settings.description()
    joined = settings_from_study(settings.storage, settings.study_name)
    assert joined.description() == stored and joined.backend == "estimate"
    storage, folder = resolve_storage(str(tmp_path / "desc"), None, None, str(tmp_path))
    data = gather(open_study(storage, None, folder))
    assert data.description == stored and data.best is not None

    from advisor.configs.trial_export import export_trial
    from advisor.ui.tui.state import StudyInfo

    written = export_trial(data.best, str(tmp_path / "out"), ["advisor"], model=stored.model, gpu=stored.gpu,
                           study_name="desc")
    assert "trial: " in written["advisor"].read_text()
    # the TUI reads the stored JSON through the same type, with the same selection settings
    info = StudyInfo.from_description("desc", tuner.study.user_attrs[ATTR])
    assert info.description == stored and (info.headroom, info.tolerance) == (stored.headroom, stored.tolerance)


def test_a_study_stored_before_the_settings_were_declared_loads():
    """The JSON `advisor tune` stored before the study settings were declared once (written by that version for
    qwen0.5b on two RTX 4090s under ZeRO-2, a given host budget, the domain regime and two overrides)."""
    from pathlib import Path

    stored = json.loads((Path(__file__).parent / "data" / "study_description_before_declarations.json").read_text())
    d = StudyDescription.from_dict(stored)
    assert d.model == resolve_model("qwen0.5b") and d.gpu == resolve_gpu("rtx-4090")
    assert (d.budget.text, d.backend, d.trials, d.gpus, d.sharding, d.regime) == ("24GB", "estimate", 3, 2, "zero2",
                                                                                   "domain")
    assert d.host_budget.text == "32GB" and not d.host_detected and d.data is None and d.quality_tokens is None
    assert d.space.search["micro_batch"] == [1, 2] and d.space.overrides == ("method=lora", "micro_batch=[1,2]")
    again = d.to_dict()
    # every key it had, written back as it was (the GPU's entry may carry catalog fields added since)
    assert {k: ({kk: again[k][kk] for kk in stored[k]} if k == "gpu" else again[k]) for k in stored} == stored
    # a tune naming that study with the same settings takes it up; with another GPU count it is refused
    base = ["tune", "--model", "qwen0.5b", "--gpu", "rtx-4090", "--gpu-budget", "24GB", "--backend", "estimate",
            "--host-budget", "32GB", "--sharding", "zero2", "--regime", "domain", "--study", "old", "method=lora",
            "micro_batch=[1,2]"]
    from advisor.search.settings import TuneSettings

    same = TuneSettings.from_flags(build_parser().parse_args(base + ["--gpus", "2"]), stored=stored)
    assert same.gpus == 2 and same.study_name == "old"
    from advisor.core.errors import AdvisorInputError

    with pytest.raises(AdvisorInputError, match=r"^--gpus: study 'old' was made with gpus 2, not 1;"):
        TuneSettings.from_flags(build_parser().parse_args(base), stored=stored)
