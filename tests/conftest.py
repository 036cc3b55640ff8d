"""Shared fixtures: every test runs with a private HOME / HF cache, never the user's."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from matrix import MARK as FULL_MATRIX  # tests/matrix.py: the marker's one name

# CI explores the same examples on every run (a failure there is reproducible, never a dice roll);
# local runs keep exploring new ones
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# the host budget a command detects is never the test machine's RAM (advisor/core/host.py): a machine with room for
# every plan, for module-scoped fixtures and child processes too; a test of the host rule sets its own
os.environ["ADVISOR_HOST_RAM"] = "1TiB"
# one compute thread per process: the two xdist workers (and the children they start) already fill the two cores, and
# torch's default of a thread per core for each of them oversubscribes them (the real-execution tests of
# tests/test_simulate.py: 45 s with it, 38 s without); set before anything imports torch, and inherited by children
os.environ.setdefault("OMP_NUM_THREADS", "1")


# ------------------------------------------------------------------------------------------- the run's shape

DURATIONS = Path(__file__).parent / "data" / "durations.json"


def pytest_addoption(parser):
    parser.addoption("--full-matrix", action="store_true", default=False,
                     help="also run the full matrices (tests marked full_matrix; docs/testing.md)")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{FULL_MATRIX}: a case of a full matrix whose representatives run by default; "
                                       "deselected unless --full-matrix (docs/testing.md)")


SLOW_OVER = 1.0
"""Seconds: a test measured over this (tests/data/durations.json) is slow, as if it carried @pytest.mark.slow, so the
fast loop stays under two minutes on 2 cores."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The full matrices only with --full-matrix; the tests measured over SLOW_OVER marked slow (before -m reads the
    marks); then the files in order of their measured time, longest first (tests/data/durations.json, written by
    benchmarks/test_durations.py --order), each file's tests in their own order: the two xdist workers
    (--dist worksteal) then end together instead of one finishing a long file alone."""
    if not config.getoption("--full-matrix"):
        dropped = [i for i in items if i.get_closest_marker(FULL_MATRIX)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if not i.get_closest_marker(FULL_MATRIX)]
    measured = json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.exists() else {}
    files, tests = measured.get("files", {}), measured.get("tests", {})
    for item in items:
        if tests.get(item.nodeid, 0.0) > SLOW_OVER and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    position = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (-files.get(i.path.name, 0.0), position[id(i)]))


# CI's coverage (.ci/coveragerc) reads the tuner, the probe, calibrate and the callbacks. Coverage's
# `patch = subprocess` hands every child Python COVERAGE_PROCESS_CONFIG; here only the children that run the probe's
# and calibrate's own code get it, in those modules' own tests, and the rest (CLIs, exported scripts, DeepSpeed's
# compiler, the wheel's venv, the third-party validators) start untraced.
COVERED_TESTS = ("test_tune*.py", "test_*_tune.py", "test_probe*.py", "test_*_probe*.py", "test_calibration.py",
                 "test_integrations.py", "test_measured_quality.py", "test_workers.py")
"""The tests of what the coverage report reads (the tuner, the probe, calibrate, the callbacks): the tracer runs in
the test process for these only (it slows a traced step by about a third)."""
COVERED_CHILDREN = ("advisor.runtime.probe._worker", "advisor.runtime.probe._overheads")
CHILDREN_COVERED_IN = ("test_probe*.py", "test_*_probe*.py", "test_calibration.py")
"""The tests of the probe and of calibrate, whose children are traced: elsewhere (the tuner's and the measured quality's
real runs) the same children run untraced."""


UNREPORTED_WORK = (("advisor.runtime.simulate.extrapolate", "_simulate"), ("advisor.runtime.simulate.rl", "rl_report"),
                   ("advisor.runtime.simulate.load", "simulate_load"),
                   ("advisor.runtime.simulate.inference", "trace_serving_extrapolated"))
"""The simulation's entry points: none of their code is in the coverage report, and the tracer slows their many small
Python calls by about half, so inside the covered tests the thread that runs one is untraced meanwhile."""


@pytest.fixture(autouse=True)
def _simulations_untraced(request, monkeypatch):
    if _running_coverage() is None or not _named(request.node, COVERED_TESTS):
        yield
        return
    import importlib

    for module, name in UNREPORTED_WORK:
        owner = importlib.import_module(module)
        monkeypatch.setattr(owner, name, _untraced(getattr(owner, name)))
    yield


def _untraced(work):
    """``work`` with this thread's trace function off while it runs (coverage's tracer in the other threads, the
    tuner's trials and the test's own, keeps running: stopping coverage would stop it there for good)."""
    def run(*args, **kwargs):
        tracer = sys.gettrace()
        sys.settrace(None)
        try:
            return work(*args, **kwargs)
        finally:
            sys.settrace(tracer)

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cov = _running_coverage()
    paused = cov is not None and not _named(item, COVERED_TESTS)
    if paused:
        cov.stop()
    try:
        yield
    finally:
        if paused:
            cov.start()


def _running_coverage():
    if "coverage" not in sys.modules:
        return None
    import coverage

    return coverage.Coverage.current()


class _CoveredChildren(subprocess.Popen):
    config = ""
    """The coverage settings handed to the children in COVERED_CHILDREN (set per test)."""

    def __init__(self, args, *rest, env=None, **kw):
        words = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
        if any(m in words for m in COVERED_CHILDREN):
            env = {**(os.environ if env is None else env), "COVERAGE_PROCESS_CONFIG": self.config}
        super().__init__(args, *rest, env=env, **kw)


def _named(item, patterns) -> bool:
    return any(fnmatch.fnmatch(item.path.name, p) for p in patterns)


@pytest.fixture(autouse=True)
def _children_untraced(request, monkeypatch):
    config = os.environ.get("COVERAGE_PROCESS_CONFIG")  # coverage's patch sets it; monkeypatch puts it back after
    if config:
        monkeypatch.delenv("COVERAGE_PROCESS_CONFIG")
        if _named(request.node, CHILDREN_COVERED_IN):
            monkeypatch.setattr(_CoveredChildren, "config", config)
            monkeypatch.setattr(subprocess, "Popen", _CoveredChildren)
            from advisor.runtime.probe._zygote import Zygote

            fork = Zygote.fork

            def covered_fork(self, argv, env, *rest):  # a CPU probe forked from the zygote, measured the same way
                if any(m in argv for m in COVERED_CHILDREN):
                    env = {**env, "COVERAGE_PROCESS_CONFIG": config}
                return fork(self, argv, env, *rest)

            monkeypatch.setattr(Zygote, "fork", covered_fork)
    yield


@pytest.fixture(scope="session", autouse=True)
def _simulations_traced_once(tmp_path_factory):
    """One folder of traced steps for the whole run (advisor/runtime/simulate/disk_cache.py): both xdist workers, and
    the CLIs they start, share it (a worker's temporary folder sits in the run's own), so a model and plan asked by
    several tests are traced once."""
    from advisor.runtime.simulate.disk_cache import ENV

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "simulations"
    os.environ.setdefault(ENV, str(folder))
    yield


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    # never the user's GPU calibration
    monkeypatch.setenv("ADVISOR_MEMORY_CALIBRATION", str(tmp_path / "memory_calibration.json"))
    # probes' throughput calibration (advisor/speed/calibration.py) in the test's own folder
    monkeypatch.setenv("ADVISOR_SPEED_CALIBRATION", str(tmp_path / "speed_calibration.json"))
    # model descriptions derived at run time (advisor/core/architecture_store.py) in the test's own folder
    monkeypatch.setenv("ADVISOR_ARCHITECTURE_CACHE", str(tmp_path / "architectures"))
    yield


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Qwen2 with a 300-token byte-level BPE tokenizer trained here, saved like a hub model."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("tiny-qwen2")
    lines = ["the quick brown fox jumps over the lazy dog", "weights gradients optimizer states activations",
             "fine tune a small model on the cpu for one step", "low rank adapters on quantized base weights"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(out)
    cfg = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    data = out / "data.jsonl"
    data.write_text("\n".join(json.dumps({"text": line}) for line in lines) + "\n")
    return out
