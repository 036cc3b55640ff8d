"""The GPU path's probes through the CUDA test double ($ADVISOR_CUDA_DOUBLE): each runs its real training step
in a child process on the CPU, while everything above the boundary takes its cuda branches: the child's
readings and budget cap (a real out-of-memory), `advisor probe` (cuda by default where a GPU is detected, then
both calibrations), `advisor calibrate`, and `advisor preflight --probe`. The tuner: tests/test_tune_cuda.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from advisor.core.catalog import CUDA_DOUBLE_ENV, CUDA_DOUBLE_SUFFIX, MIB, detect_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.runtime.cuda_double import CONTEXT_BYTES, DRIVER
from advisor.runtime.probe import run_probe
from advisor.runtime.simulate.tiny import tiny_spec

pytestmark = pytest.mark.slow  # a probe's child imports transformers and peft: about 10 s each
GPU = "rtx-4090"
SPEC = tiny_spec("qwen2", num_layers=2, vocab_size=512)
PLAN = Plan(method="lora", seq_len=32, lora_dropout=0.0)


@pytest.fixture
def double(monkeypatch):
    """The double switched on for this test and the children it starts; the GPU it is detected as."""
    monkeypatch.setenv(CUDA_DOUBLE_ENV, GPU)
    return detect_gpu()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(SPEC.config))
    return d


def test_a_cuda_probe_runs_its_step_on_the_cpu_and_answers_as_cuda(double):
    cpu = run_probe(SPEC, PLAN, device="cpu", steps=1, warmup=1)
    r = run_probe(SPEC, PLAN, device="cuda", steps=1, warmup=1, memory_limit_bytes=2**30)
    assert cpu.ok and r.ok, (cpu.message, r.message)
    # cuda, every branch: the allocator's counters, NVML, the GPU's name, the budget cap (2 GiB: not reached)
    assert r.device == "cuda" and r.test_double == GPU and cpu.test_double is None
    assert r.gpu_name == double.name and r.gpu_name.endswith(CUDA_DOUBLE_SUFFIX) and r.versions["driver"] == DRIVER
    assert r.peak_reserved_bytes >= r.peak_allocated_bytes > 0 and r.alloc_retries == 0
    assert r.peak_reserved_bytes % (2 * MIB) == 0  # segments of 2 / 20 MiB
    assert CONTEXT_BYTES < r.nvml_peak_bytes <= r.peak_reserved_bytes + CONTEXT_BYTES
    assert "test double" in r.memory_method and any("CUDA test double" in n for n in r.notes)
    assert r.tokens_per_s > 0 and len(r.step_times_s) == 1 and len(r.losses) == 2
    # from the CPU run's own measurements: the same tensors, counted as the caching allocator counts them
    assert r.breakdown == cpu.breakdown
    assert r.losses[0] == pytest.approx(cpu.losses[0], rel=1e-4)
    assert abs(r.peak_allocated_bytes - cpu.peak_allocated_bytes) <= 0.05 * cpu.peak_allocated_bytes


def test_eval_fidelity_is_measured_through_the_double(double, tiny_model):
    """Real weights: the bf16 reference on the "GPU" (then emptied from its cache), the plan's base against it,
    eval loss before and after, the training data tokenized by the model's tokenizer. (A 4-bit base of this
    32-wide model cannot run eval on the CPU: bitsandbytes' CPU packing needs rows of at least its 64-value
    block, on the CPU path as here.)"""
    spec = resolve_model(str(tiny_model))
    r = run_probe(spec, Plan(method="lora", seq_len=32, lora_dropout=0.0), device="cuda", steps=1, warmup=0,
                  weights_dir=str(tiny_model), data=str(tiny_model / "data.jsonl"), max_eval_tokens=256)
    assert r.ok and r.device == "cuda" and r.test_double == GPU, r.message
    assert r.tokenizer == "model" and r.weights == str(tiny_model) and r.fidelity_tokens > 16
    assert r.fidelity_kl == pytest.approx(0.0, abs=1e-6)  # the bf16 plan is the reference itself
    assert r.eval_loss_base > 0 and r.eval_loss_after > 0 and r.nvml_peak_bytes > CONTEXT_BYTES


def test_a_cuda_probe_without_a_gpu_or_the_double_is_an_error_naming_it(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.delenv(CUDA_DOUBLE_ENV, raising=False)
    r = run_probe(SPEC, PLAN, device="cuda", steps=1, warmup=0)
    assert r.status == "error" and "torch sees no CUDA GPU" in r.message and r.test_double is None


def test_the_budget_cap_is_a_real_out_of_memory_in_the_child(double):
    # logits alone: 16 x 2048 x 512 x 4 B = 64 MiB, over the 48 MiB the budget leaves beside the CUDA context
    big = Plan(method="full", seq_len=2048, micro_batch=16)
    budget = CONTEXT_BYTES + 48 * MIB
    r = run_probe(SPEC, big, device="cuda", steps=1, warmup=0, memory_limit_bytes=budget)
    assert r.status == "oom" and r.device == "cuda" and r.test_double == GPU and r.budget_bytes == budget, r.message
    assert ("can't allocate memory" in r.message or "out of memory" in r.message.lower()
            or "over the budget" in r.message)
    # a budget that cannot hold the CUDA context: out of memory before the model is built
    r = run_probe(SPEC, PLAN, device="cuda", steps=1, warmup=0, memory_limit_bytes=100 * MIB)
    assert r.status == "oom" and "CUDA context alone" in r.message and r.steps_done == 0


def test_advisor_probe_runs_on_the_detected_gpu_and_calibrates_it(double, tiny_dir, capsys):
    from advisor.cli import main
    from advisor.commands.probe import render
    from advisor.memory.calibration import calibration_for
    from advisor.runtime.probe import ProbeResult
    from advisor.speed.throughput import predict_throughput

    code = main(["probe", "--model", str(tiny_dir), "--method", "lora", "--seq-len", "32", "--lora-dropout", "0",
                 "--steps", "1", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["status"] == "ok", d["message"]
    assert d["device"] == "cuda" and d["test_double"] == GPU  # cuda by default: a GPU is detected
    # measured beats predicted: both of this GPU's calibrations now hold the probe, and predictions say so
    model = resolve_model(str(tiny_dir))
    assert predict_throughput(model, Plan.from_dict(d["plan"]), double).source == "calibrated (1 probe)"
    cal = calibration_for(double.name)
    assert cal.probes == 1 and cal.cuda_context_bytes == CONTEXT_BYTES and "cuda test double" in cal.label
    text = render(ProbeResult.from_dict(d))
    assert "on cuda: OK" in text and double.name in text and "CUDA test double" in text


def test_advisor_calibrate_measures_the_gpu_and_predictions_use_it(double, tiny_dir, capsys):
    from advisor.cli import main
    from advisor.memory import calibration as cal
    from advisor.memory.overhead import overhead_of

    before = overhead_of(10 * MIB, double)
    assert before.source.startswith("estimated") and before.parts["cuda_context"] == 500 * MIB  # the prior
    code = main(["calibrate", "--model", str(tiny_dir), "--probes", "1", "--num-layers", "2", "--timeout", "300"])
    out = capsys.readouterr().out
    assert code == 0, out
    label = f"calibrated on {double.name} (2 probes)"
    assert out.startswith(f"{label} [measured]: CUDA context {CONTEXT_BYTES // MIB} MiB, cuBLAS workspace 0 MiB")
    probes = cal.load()
    assert [p.workload for p in probes][0] == "idle process, first matmul" and len(probes) == 2
    assert all(p.gpu == double.name and p.driver == DRIVER for p in probes)
    after = overhead_of(10 * MIB, double)
    assert (after.source == label and after.parts["cuda_context"] == CONTEXT_BYTES
            and after.parts["cublas_workspace"] == 0)


def _preflight(config, *argv):
    proc = subprocess.run([sys.executable, "-m", "advisor", "preflight", str(config), *argv, "--json"],
                          capture_output=True, text=True, timeout=600)  # the double is inherited from os.environ
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None), proc.stderr


def test_preflight_probe_runs_on_the_double_held_to_the_budget(double, tiny_dir, tmp_path):
    from advisor.configs.export import export_plan

    config = export_plan(resolve_model(str(tiny_dir)), PLAN, tmp_path, formats=["advisor"])["advisor"]
    code, d, err = _preflight(config, "--probe", "--gpu-budget", "2GiB", "--backend", "estimate")
    assert d is not None, err
    assert d["gpu"]["name"] == double.name and not d["gpu_assumed"]
    probe = next(f for f in d["findings"] if f["check"] == "memory.probe")
    assert probe["severity"] == "ok", probe
    assert f"measured on the cuda test double ({GPU}; the step ran on the CPU) held to 2.00 GiB" in probe["title"]
    assert probe["data"]["test_double"] == GPU and probe["data"]["nvml_peak_bytes"] > CONTEXT_BYTES
    # a budget the CUDA context alone does not fit: the probe's real out-of-memory makes it NO-GO
    code, d, err = _preflight(config, "--probe", "--gpu-budget", "100MiB", "--backend", "estimate")
    assert code == 1 and d is not None and d["verdict"] == "NO-GO", err
    probe = next(f for f in d["findings"] if f["check"] == "memory.probe")
    assert probe["severity"] == "error" and probe["title"].startswith("probe oom:") and "CUDA context" in probe["title"]
    assert "cuda test double" in probe["evidence"] and probe["data"]["test_double"] == GPU
