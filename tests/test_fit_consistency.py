"""One feasibility rule (advisor.core.fit), held at its boundary by every part that applies it.

The plan's peak sits exactly between the two rules the advisor once had: ``peak x (1 + headroom) <=
budget`` (estimate, the renderer) said it fits, ``peak <= budget x (1 - headroom)`` (the tuner,
pre-flight, the callback) said it does not. Now `advisor estimate`, the renderer, the tuner's pruning
and selection, the TUI's and the report's selection, pre-flight's verdict and the Trainer callback all
say "does not fit" at that budget,
and all say "fits" at a budget just large enough under the one rule.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from advisor.cli import build_parser, main
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.fit import fits
from advisor.core.plan import Plan
from advisor.core.units import Budget
from advisor.runtime.backends import get_backend
from advisor.search.space import load_space, plan_from_params

HEADROOM = 0.05
GPU = "rtx-4090"
# one point of the default space, every knob pinned (a study of one plan)
PINNED = {"method": "qlora", "quantization": "nf4", "double_quant": True, "lora_r": 16, "lora_targets": "attention",
          "gradient_checkpointing": True, "optimizer": "paged_adamw_8bit", "micro_batch": 1, "precision": "bf16",
          "attn_impl": "sdpa", "offload": "none", "chunked_ce": False, "expandable_segments": True}
OVERRIDES = [f"{k}={json.dumps(v)}" for k, v in PINNED.items()] + ["trials=1"]


@pytest.fixture(scope="module")
def case():
    spec = resolve_model("qwen7b")
    space = load_space("default", OVERRIDES)
    plan = plan_from_params(PINNED, space, spec.arch or {})
    from advisor.memory.phases import run_peak_bytes
    from advisor.runtime.phases import with_phases

    gpu = resolve_gpu(GPU)
    peak = run_peak_bytes(with_phases(spec, plan, gpu, get_backend("estimate").measure(spec, plan, gpu)))
    between = math.ceil(peak * (1 + HEADROOM))        # the old estimate rule: fits; the one rule: does not
    enough = math.ceil(peak / (1 - HEADROOM)) + 16      # the one rule: fits
    assert peak * (1 + HEADROOM) <= between and peak > between * (1 - HEADROOM)
    return SimpleNamespace(spec=spec, plan=plan, peak=peak, budgets={"between": between, "enough": enough})


def _estimate_argv(plan: Plan) -> list[str]:
    argv = ["--method", plan.method, "--quantization", plan.quantization, "--lora-r", str(plan.lora_r),
            "--lora-alpha", str(plan.lora_alpha), "--lora-dropout", str(plan.lora_dropout),
            "--lora-targets", ",".join(plan.lora_targets), "--optimizer", plan.optimizer,
            "--micro-batch", str(plan.micro_batch), "--grad-accum", str(plan.grad_accum), "--seq-len",
            str(plan.seq_len), "--precision", plan.precision, "--attn-impl", plan.attn_impl]
    argv += ["--double-quant"] * plan.double_quant + ["--gradient-checkpointing"] * plan.gradient_checkpointing
    argv += ["--expandable-segments"] * plan.expandable_segments
    return argv


@pytest.mark.parametrize("which,expected", [("between", False), ("enough", True)])
def test_estimate_verdict_and_renderer(case, capsys, which, expected):
    budget = case.budgets[which]
    argv = ["estimate", "--model", "qwen7b", "--gpu", GPU, "--gpu-budget", str(budget), *_estimate_argv(case.plan)]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"] == case.plan.to_dict() and d.get("run_peak_bytes", d["peak_bytes"]) == case.peak
    assert d["fits"] is expected and d["headroom"] == HEADROOM
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("FITS" in out) is expected and ("TIGHT" in out) is (not expected) and "DOES NOT FIT" not in out


@pytest.mark.parametrize("which,expected", [("between", False), ("enough", True)])
def test_tuner_prunes_and_selects_by_the_same_rule(case, tmp_path, which, expected, monkeypatch):
    import advisor.search.tuner as tuner_module
    from advisor.commands.tune import build_settings
    from advisor.search.tuner import Tuner

    # the estimate's own rule, as decided: an answer at the edge is otherwise simulated before it is given
    monkeypatch.setattr(tuner_module, "EDGE_MARGIN", -1.0)

    args = build_parser().parse_args(["tune", "--model", "qwen7b", "--gpu", GPU, "--gpu-budget",
                                      str(case.budgets[which]), "--backend", "estimate", "--reports-dir",
                                      str(tmp_path), "--study", which, *OVERRIDES])
    tuner = Tuner(build_settings(args))
    tuner.run()
    evaluated = [r for r in tuner.records() if r.duplicate_of is None and r.state in ("complete", "pruned")]
    assert evaluated and all(r.plan == case.plan.to_dict() and (r.run_peak_bytes or r.peak_bytes) == case.peak
                             for r in evaluated)
    assert {r.state for r in evaluated} == {"complete" if expected else "pruned"}
    assert (tuner.selection().best is not None) is expected
    # the TUI and the report choose from the same stored study by the same rule
    from advisor.search.description import ATTR
    from advisor.ui.report import gather, open_study, resolve_storage
    from advisor.ui.tui.state import Board, StudyInfo

    board = Board(StudyInfo.from_description(which, tuner.study.user_attrs[ATTR]), tuner.records())
    assert (board.selection.best is not None) is expected
    storage, folder = resolve_storage(str(tmp_path / which), None, None, str(tmp_path))
    assert (gather(open_study(storage, None, folder)).best is not None) is expected


@pytest.mark.parametrize("which,expected", [("between", "warning"), ("enough", "ok")])
def test_preflight_memory_check(case, tmp_path, which, expected):
    from advisor.configs.export import export_plan
    from advisor.diagnosis.preflight import PreflightInput, run_preflight

    config = export_plan(case.spec, case.plan, tmp_path, formats=["advisor"])["advisor"]
    result = run_preflight(PreflightInput(config=str(config), gpu_budget=str(case.budgets[which]), gpu=GPU,
                                          backend="estimate"))
    mem = next(f for f in result.findings if f.check == "memory.fit")
    assert mem.data["peak_bytes"] == case.peak and mem.severity == expected
    if expected == "warning":
        assert result.verdict != "GO" and result.exit_code == 1


@pytest.mark.parametrize("which,expected", [("between", True), ("enough", False)])
def test_trainer_callback_stops_by_the_same_rule(case, which, expected):
    pytest.importorskip("transformers")
    from advisor.integrations import MemoryGuardCallback

    guard = MemoryGuardCallback(case.spec, case.plan, budget_bytes=case.budgets[which], check_steps=1,
                                memory_reader=lambda: case.peak)  # the run measured exactly the plan's peak
    args = SimpleNamespace(per_device_eval_batch_size=8, eval_strategy="no")
    control = guard.on_step_end(args, SimpleNamespace(global_step=1),
                                SimpleNamespace(should_training_stop=False, should_evaluate=False))
    assert guard.projected_peak == case.peak
    assert control.should_training_stop is expected


def test_the_rule_itself(case):
    for which, expected in (("between", False), ("enough", True)):
        assert fits(case.peak, case.budgets[which], HEADROOM) is expected
    from advisor.ui.render import verdict_lines

    report = get_backend("estimate").measure(case.spec, case.plan, resolve_gpu(GPU))
    lines = verdict_lines(report, Budget(case.budgets["between"], "GiB", "between"), HEADROOM)
    assert "TIGHT" in lines[-1]
