"""Every backend (estimate, simulate, cpu, cuda) keeps the one contract (advisor.runtime.backends._base):
the same plan in, a MemoryReport with every ledger category out; options typed, an unknown or unused one
an error; a run that fails raises BackendFailed with its status. cuda runs through the CUDA test double
without a GPU."""

from __future__ import annotations

import pytest

from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory.ledger import CATEGORIES, MemoryReport
from advisor.runtime.backends import (BACKENDS, FAILURE_STATUSES, STAGES, Backend, BackendFailed, BackendOptions,
                                      Stage, get_backend, stages_of)

SEQ = 32
PLAN = Plan(method="lora", seq_len=SEQ, lora_dropout=0.0)
# small enough for a probe to be quick; what each backend may be given
QUICK = {"steps": 1, "warmup": 1, "timeout": 240.0}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def spec():
    from advisor.runtime.simulate.tiny import tiny_spec

    return tiny_spec("qwen2", num_layers=2, vocab_size=512)


# the cpu backend runs a real probe in a child process (seconds each)
@pytest.fixture(params=[pytest.param(b, marks=pytest.mark.slow) if b == "cpu" else b for b in BACKENDS])
def backend(request) -> Backend:
    if request.param == "cuda" and not _has_cuda():
        # no GPU: the CUDA test double stands in (advisor/runtime/cuda_double.py); the child runs on the CPU
        request.getfixturevalue("monkeypatch").setenv("ADVISOR_CUDA_DOUBLE", "rtx-4090")
    return get_backend(request.param)


def _options(b: Backend, **extra) -> BackendOptions:
    return BackendOptions(**{k: v for k, v in {**QUICK, **extra}.items() if k in b.accepts})


def test_the_list_is_the_registry():
    assert BACKENDS == ("estimate", "simulate", "cpu", "cuda")
    with pytest.raises(AdvisorInputError, match="--backend"):
        get_backend("nope")


def test_is_a_backend(backend):
    assert isinstance(backend, Backend)
    assert backend.name in BACKENDS and backend.source in ("estimated", "simulated", "measured")
    assert backend.accepts <= set(BackendOptions.__dataclass_fields__)


def test_same_plan_in_every_ledger_field_out(backend, spec):
    report = backend.measure(spec, PLAN, None, _options(backend))
    assert isinstance(report, MemoryReport)
    assert list(report.device) == list(CATEGORIES)
    assert report.source == backend.source and report.backend == backend.name
    assert 0 < report.tensor_peak_bytes <= report.peak_bytes
    assert report.device["adapter_weights"] > 0 and report.device["weights"] > 0
    assert report.to_dict()["peak_bytes"] == report.peak_bytes


def test_unknown_option_is_an_error_not_silence(backend, spec):
    with pytest.raises(AdvisorInputError, match="backend option budget_byts"):
        backend(spec, PLAN, None, budget_byts=2**20)
    with pytest.raises(AdvisorInputError, match="no such option"):
        BackendOptions.of(memory_limit_bytes=2**20)


def test_an_option_the_backend_does_not_use_is_an_error(backend, spec):
    unused = sorted(set(BackendOptions.__dataclass_fields__) - backend.accepts)
    assert unused, f"the {backend.name} backend uses every option"
    value = {"layers": 2, "data": "x.jsonl", "weights_dir": "w"}.get(unused[0], 1)
    with pytest.raises(AdvisorInputError, match=f"backend option {unused[0]}: the {backend.name} backend does not use"):
        backend.measure(spec, PLAN, None, BackendOptions(**{unused[0]: value}))


def test_a_run_over_its_budget_fails_with_its_status(backend, spec):
    if "budget_bytes" not in backend.accepts:
        pytest.skip(f"the {backend.name} backend computes the ledger; it runs nothing that could fail")
    # logits alone: 16 x 2048 x 512 x 4 B = 64 MiB, over a 48 MiB budget enforced for real
    big = Plan(method="full", seq_len=2048, micro_batch=16)
    with pytest.raises(BackendFailed) as caught:
        backend.measure(spec, big, None, _options(backend, budget_bytes=48 * 2**20))
    e = caught.value
    assert e.status == "oom" and e.status in FAILURE_STATUSES and e.backend == backend.name
    assert e.result is not None and e.result.status == "oom" and e.result.budget_bytes == 48 * 2**20
    assert "status oom" in str(e)


def test_failure_type_rejects_an_unknown_status():
    with pytest.raises(ValueError):
        BackendFailed("cpu", "ok", "")


def test_each_backend_declares_its_stages(backend):
    """The tuner runs what the backend declares: the closed form first, cheapest to dearest, the backend's own
    measurement last, and a stage that decides feasibility."""
    stages = backend.stages
    assert stages and all(isinstance(st, Stage) for st in stages) and stages_of(backend.name) == stages
    assert stages[0].name == "estimate" and stages[0].backend == "estimate"
    assert stages[-1].backend == backend.name
    assert [STAGES.index(st.name) for st in stages] == sorted({STAGES.index(st.name) for st in stages})
    assert all(st.backend in BACKENDS for st in stages)
    assert any(st.decides for st in stages)
    assert not stages[0].finalists_only  # every plan is estimated
    assert all(st.name == "probe" for st in stages if st.on_target_gpu)


def test_a_stage_of_no_known_kind_is_refused():
    with pytest.raises(ValueError, match="stage must be one of"):
        Stage("guess", "estimate", decides=True)


def test_the_tuner_runs_the_declared_stages_not_backend_names():
    """Which stages a trial goes through comes from the backend's declaration, never from the study's backend name
    typed into the tuner."""
    import inspect

    import advisor.search.tuner as tuner

    for method in (tuner.Tuner._evaluate, tuner.Tuner._estimate_stage, tuner.Tuner._probe_stage):
        source = inspect.getsource(method)
        assert "s.backend" not in source, f"{method.__name__} reads the backend's name"
