"""The CUDA test double itself, in this process (no child): detection, the readings it answers and from
what, the calibration of an idle CUDA process, the Trainer callback and the serving probe through it.
The probes, the commands and the tuner run through it in tests/test_cuda_probe_double.py and
tests/test_tune_cuda.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from advisor.core.catalog import (CUDA_DOUBLE_ENV, CUDA_DOUBLE_SUFFIX, MIB, detect_gpu, is_cuda_double,  # noqa: E402
                                  resolve_gpu)
from advisor.core.errors import AdvisorInputError  # noqa: E402
from advisor.runtime import cuda_boundary, cuda_double  # noqa: E402
from advisor.runtime.cuda_double import CONTEXT_BYTES, DRIVER, use  # noqa: E402

GPU = "rtx-4090"


@pytest.fixture(autouse=True)
def _no_double_left_running():
    yield
    assert cuda_double._ACTIVE is None, "a test left the CUDA test double counting in this process"


def test_the_switch_makes_detection_answer_the_catalog_gpu_labelled(monkeypatch):
    from advisor.core.target import resolve_target
    from advisor.runtime.backends import resolve_backend

    monkeypatch.setenv(CUDA_DOUBLE_ENV, GPU)
    gpu = detect_gpu()
    real = resolve_gpu(GPU)
    assert gpu.key == real.key and gpu.memory_bytes == real.memory_bytes and gpu.bf16_tflops == real.bf16_tflops
    assert gpu.detected and gpu.index == 0 and gpu.name == real.name + CUDA_DOUBLE_SUFFIX
    assert is_cuda_double(gpu) and not is_cuda_double(real) and "test double" in gpu.source
    assert resolve_backend("auto", gpu) == "cuda"  # cuda is the default backend where a GPU is detected
    target = resolve_target("qwen0.5b", gpu_budget="24GB")
    assert target.detected == gpu and target.gpu == gpu and not target.gpu_assumed
    assert detect_gpu(1) is None  # it holds one GPU


def test_the_switch_off_leaves_the_real_path(monkeypatch):
    monkeypatch.delenv(CUDA_DOUBLE_ENV, raising=False)
    assert cuda_boundary.double() is None and cuda_boundary.cuda() is torch.cuda
    assert cuda_boundary.tensor_device("cuda") == "cuda" and cuda_boundary.tensor_device("cpu") == "cpu"
    assert not is_cuda_double(detect_gpu())


def test_a_switch_naming_no_catalog_gpu_is_a_one_line_error(monkeypatch, capsys):
    from advisor.cli import main

    monkeypatch.setenv(CUDA_DOUBLE_ENV, "rtx-4099")
    with pytest.raises(AdvisorInputError, match=f"{CUDA_DOUBLE_ENV}: must name a catalog GPU .*rtx-4090"):
        detect_gpu()
    assert main(["estimate", "--model", "qwen0.5b", "--gpu-budget", "24GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and CUDA_DOUBLE_ENV in err and "rtx-4099" in err


def test_allocations_go_through_the_caching_allocator_model():
    """A 3 MiB tensor takes a 20 MiB segment (requests under 10 MiB: kLargeBuffer), split: 3 MiB allocated;
    a 100 kB one a 2 MiB small segment (kSmallBuffer), as c10/cuda/CUDACachingAllocator.cpp serves them."""
    before = torch.empty(1 << 20)  # made before CUDA started: not on the "GPU"
    with use(GPU) as cuda:
        assert cuda_boundary.cuda() is cuda and cuda_boundary.tensor_device("cuda") == "cpu"
        assert cuda.is_available()
        assert cuda.get_device_name(0) == resolve_gpu(GPU).name + CUDA_DOUBLE_SUFFIX
        assert cuda.get_device_properties(0).total_memory == resolve_gpu(GPU).memory_bytes
        assert cuda.memory_allocated() == 0 and cuda.memory_reserved() == 0
        nvml = cuda_boundary.nvml()
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == [], "no tensor yet: no CUDA context"
        assert nvml.nvmlDeviceGetMemoryInfo(handle).used == 0
        big = torch.empty(3 * MIB, dtype=torch.uint8)
        small = torch.empty(100_000, dtype=torch.uint8)
        assert cuda.memory_allocated() == 3 * MIB + 100_352  # 100,000 B rounded up to 512 B blocks
        assert cuda.memory_reserved() == 20 * MIB + 2 * MIB
        del big
        assert cuda.memory_allocated() == 100_352 and cuda.max_memory_allocated() == 3 * MIB + 100_352
        assert cuda.memory_reserved() == 22 * MIB, "a freed block stays cached"
        cuda.reset_peak_memory_stats()
        assert cuda.max_memory_allocated() == 100_352 and cuda.max_memory_reserved() == 22 * MIB
        cuda.empty_cache()
        assert cuda.memory_reserved() == 2 * MIB and cuda.memory_stats()["num_alloc_retries"] == 0
        # NVML: the process is its reserved memory plus a fixed CUDA context
        (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert proc.usedGpuMemory == 2 * MIB + CONTEXT_BYTES
        assert nvml.nvmlSystemGetDriverVersion() == DRIVER
        assert cuda.mem_get_info() == (resolve_gpu(GPU).memory_bytes - proc.usedGpuMemory,
                                       resolve_gpu(GPU).memory_bytes)
        del small
    assert cuda_boundary.double() is None and cuda_boundary.cuda() is torch.cuda
    cuda.reset_peak_memory_stats()  # a stopped double still answers, counting nothing more
    assert cuda.max_memory_allocated() == 0
    del before


def test_use_switches_in_and_out_and_follows_the_switch(monkeypatch):
    monkeypatch.setenv(CUDA_DOUBLE_ENV, "h100-sxm")
    with use(GPU) as cuda:
        assert cuda_boundary.double() is cuda and cuda.key == GPU
        monkeypatch.setenv(CUDA_DOUBLE_ENV, "a100-80gb")  # another GPU named: another double, the first one stopped
        other = cuda_boundary.double()
        assert other is not cuda and other.key == "a100-80gb" and cuda._tracker is None
    import os

    assert os.environ[CUDA_DOUBLE_ENV] == "h100-sxm", "use() gives the switch back as it found it"
    cuda_double.stop()


def test_a_release_inside_the_allocator_models_own_work_waits_for_it():
    """The garbage collector can free a storage while the allocator model is serving another request (on the same
    thread): that release is applied right after, never in the middle of the model's bookkeeping."""
    with use(GPU) as cuda:
        tracker, model = cuda._tracker, cuda.allocator
        block = tracker.serve(model.malloc, MIB)

        def serving():
            tracker.serve(model.free, block)  # what a collection inside malloc would do
            assert model.allocated == MIB, "not freed in the middle"
            with pytest.raises(RuntimeError, match="re-entered"):
                tracker.serve(model.malloc, MIB)
            return "served"

        assert tracker.serve(serving) == "served" and model.allocated == 0


def test_the_allocator_limit_releases_the_cache_and_retries_before_running_out():
    """Under a cap the model releases cached segments and retries (num_alloc_retries), and past it answers a
    CUDA out-of-memory (the RLIMIT_DATA half of the cap runs in the probe's child: tests/test_cuda_probe_double.py)."""
    with use(GPU) as cuda:
        cuda._tracker_call(cuda.allocator.set_limit, 30 * MIB)  # the allocator half of set_per_process_memory_fraction
        a = torch.empty(12 * MIB, dtype=torch.uint8)          # a 12 MiB segment (kRoundLarge)
        del a                                                 # cached
        b = torch.empty(20 * MIB, dtype=torch.uint8)          # 12 + 20 > 30: frees the cache, retries
        assert cuda.memory_stats()["num_alloc_retries"] == 1 and cuda.memory_reserved() == 20 * MIB
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory \\(cuda test double\\)"):
            torch.empty(16 * MIB, dtype=torch.uint8)
        assert cuda.memory_allocated() == 20 * MIB
        del b


def test_nvml_memory_without_the_process_in_view_is_the_devices_growth(monkeypatch):
    """In a container NVML may not list this PID: the probe then takes the device's used memory minus what it
    was before CUDA started (advisor.runtime.probe._memory.CudaMemory.process_bytes)."""
    from advisor.runtime.probe._memory import CudaMemory

    with use(GPU) as cuda:
        mem = CudaMemory(0)  # before the first tensor: NVML's baseline is the GPU without this process
        x = torch.empty(3 * MIB, dtype=torch.uint8)
        assert mem.process_bytes() == 20 * MIB + CONTEXT_BYTES and mem.nvml_method.startswith("cuda test double")
        monkeypatch.setattr(cuda.nvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [])
        assert mem.process_bytes() == 20 * MIB + CONTEXT_BYTES and "minus used before" in mem.nvml_method
        mem.stop()
        del x
        # a device NVML cannot open: the allocator's counters remain, NVML's figure is None
        other = CudaMemory(1)
        other.start_sampler()
        assert other.process_bytes() is None and other.sample() is None and other.peak_allocated() >= 0
        other.stop()


def test_the_parent_stops_a_cuda_probe_whose_process_outgrows_the_budget(monkeypatch):
    """What the child reports each step is checked as it comes: NVML's whole-process memory over the budget
    ends the run as oom (a CUDA context that grows after the cap: lazy module loading, libraries' workspaces)."""
    from advisor.runtime.probe._request import ProbeRequest
    from advisor.runtime.probe._runner import _handle, _result

    monkeypatch.setenv(CUDA_DOUBLE_ENV, GPU)
    req = ProbeRequest(spec={}, plan={}, device="cuda", steps=2, warmup=0, memory_limit_bytes=800 * MIB)
    state = {"steps": [], "phase": "train", "result": None, "failed": None, "loaded": None}
    step = {"ev": "step", "i": 0, "time_s": 0.1, "loss": 6.0, "warmup": False, "peak": 100 * MIB,
            "reserved": 120 * MIB, "nvml": 900 * MIB}
    killed_for, message = _handle(step, state, req, None, "")
    assert killed_for == "oom" and message == ("whole-process GPU memory (NVML) of the cuda test double 900.00 MiB "
                                               "over the budget 800.00 MiB at step 0 (stopped early)"), message
    r = _result(req, state, killed_for, message, "killed by the parent (oom)", -9, Path("/nonexistent"), 1.0, "m")
    assert r.status == "oom" and r.test_double == GPU and r.nvml_peak_bytes == 900 * MIB and r.steps_done == 1


def test_an_idle_cuda_process_is_calibrated_through_the_double():
    """advisor calibrate's measurement (a fresh process: context, cuBLAS workspace) through the double."""
    from advisor.runtime.probe._memory import measure_overheads

    with use(GPU):
        m = measure_overheads()
    assert m["gpu"].endswith(CUDA_DOUBLE_SUFFIX) and m["test_double"] == GPU
    assert m["cuda_context_bytes"] == CONTEXT_BYTES  # NVML minus reserved
    assert m["cublas_workspace_bytes"] == 0  # the matmuls ran on the CPU: no cuBLAS workspace, and it says so
    assert m["process_bytes"] == m["reserved_bytes"] + CONTEXT_BYTES and m["reserved_bytes"] > 0
    assert "test double" in m["method"]


def test_calibration_made_through_the_double_never_mixes_with_the_real_gpus(tmp_path, monkeypatch):
    from advisor.core.plan import Plan
    from advisor.memory import calibration as memcal
    from advisor.runtime.simulate.tiny import tiny_spec
    from advisor.speed import calibration as speedcal
    from advisor.speed.throughput import predict_throughput

    monkeypatch.setenv(CUDA_DOUBLE_ENV, GPU)
    double, real = detect_gpu(), resolve_gpu(GPU)
    spec, plan = tiny_spec(), Plan(method="lora", seq_len=64)
    speedcal.record_probe(spec, plan, double, 300.0)
    assert speedcal.gpu_key(double) == double.name and speedcal.gpu_key(real) == GPU
    assert speedcal.for_gpu(real) is None and speedcal.for_gpu(double).probes == 1
    assert predict_throughput(spec, plan, double).source == "calibrated (1 probe)"
    assert predict_throughput(spec, plan, real).source == "predicted"
    result = {"status": "ok", "device": "cuda", "gpu_name": double.name, "nvml_peak_bytes": CONTEXT_BYTES + 4 * MIB,
              "peak_reserved_bytes": 4 * MIB, "peak_allocated_bytes": 3 * MIB, "model": spec.name,
              "plan": plan.to_dict(), "versions": {"torch": "2.13.0+cpu", "driver": DRIVER}}
    assert memcal.record_probe_result(result)
    assert memcal.calibration_for(real.name) is None
    assert memcal.calibration_for(double.name).cuda_context_bytes == CONTEXT_BYTES


def test_without_a_gpu_or_the_double_the_cuda_readers_say_so(monkeypatch, capsys):
    from advisor.integrations import cuda_current_reader, cuda_peak_reader
    from advisor.runtime.probe import _overheads

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.delenv(CUDA_DOUBLE_ENV, raising=False)
    assert cuda_peak_reader() is None and cuda_current_reader() is None
    from advisor.memory.inference import ServePlan
    from advisor.runtime.probe.inference import probe_generate
    from advisor.runtime.simulate.tiny import tiny_spec

    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        probe_generate(tiny_spec(), ServePlan(concurrency=1, context_len=64, max_new_tokens=4))
    assert _overheads.main() == 1  # advisor calibrate's child: one line of JSON naming the failure
    assert json.loads(capsys.readouterr().out) == {
        "error": "RuntimeError: no CUDA GPU: torch.cuda.is_available() is False"}


def test_a_budget_smaller_than_the_cuda_context_is_an_oom():
    from advisor.runtime.probe._classify import status_of_exception

    assert status_of_exception("BudgetTooSmall",
                               "the CUDA context alone takes 629,145,600 B of the 1 B budget") == "oom"


# ----------------------------------------------------------------------------- the Trainer callback

TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 4096}
SHORT, LONG = 32, 2048


class _Seqs(torch.utils.data.Dataset):
    def __init__(self, lengths):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(0, 512, (n,), generator=g) for n in lengths]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def _guarded_run(tmp_path, budget_bytes, *, evaluate=False):
    """A real Trainer run on the "GPU" of the double; the callback reads torch.cuda's counters (its own readers)."""
    import transformers

    from advisor.core.catalog import resolve_model
    from advisor.core.plan import Plan
    from advisor.integrations import MemoryGuardCallback

    d = tmp_path / "tiny"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY))
    spec = resolve_model(str(d))
    plan = Plan(method="full", precision="fp32", optimizer="adamw_torch", micro_batch=1, seq_len=SHORT)
    extra = dict(eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2, prediction_loss_only=True) \
        if evaluate else {}
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1,
                                          max_steps=4, report_to=[], use_cpu=True, save_strategy="no",
                                          logging_strategy="no", dataloader_num_workers=0, optim="adamw_torch",
                                          **extra)
    with use(GPU) as cuda:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY))  # "on the GPU"
        guard = MemoryGuardCallback(spec, plan, budget_bytes, longest_seq_len=SHORT if evaluate else LONG,
                                    first_seq_len=SHORT, eval_seq_len=SHORT, eval_samples=4, check_steps=2)
        assert guard.reader is not None and guard.current is not None, "the callback's CUDA readers are in use"
        trainer = transformers.Trainer(model=model, args=args, callbacks=[guard],
                                       train_dataset=_Seqs([SHORT, SHORT, LONG, SHORT] if not evaluate
                                                           else [SHORT] * 4),
                                       eval_dataset=_Seqs([SHORT] * 4) if evaluate else None)
        trainer.train()
        peak = cuda.max_memory_allocated()
    return guard, trainer.state.global_step, peak


def _predicted(seq_len):
    from advisor.memory.training import estimate_training
    from advisor.core.plan import Plan
    from advisor.runtime.simulate.tiny import tiny_spec

    spec = tiny_spec("qwen2", num_layers=2, vocab_size=512, intermediate_size=128)
    return estimate_training(spec, Plan(method="full", precision="fp32", seq_len=seq_len)).tensor_peak_bytes


@pytest.mark.slow
def test_the_callback_reads_the_double_and_stops_before_the_long_batch(tmp_path):
    budget = int((_predicted(SHORT) + _predicted(LONG)) / 2)  # the short batches fit, the long one does not
    guard, steps, _ = _guarded_run(tmp_path, budget)
    assert guard.measured_peak and guard.measured_peak > 64 * 512 * 4, "the weights count: they are on the GPU"
    assert guard.message and "longest batch" in guard.message and "seq 2,048" in guard.message
    assert steps == 2, "the run must stop before step 3, where the long batch comes"


def test_the_callback_projects_an_evaluation_from_the_doubles_counters(tmp_path):
    guard, steps, peak = _guarded_run(tmp_path, _predicted(LONG) * 4, evaluate=True)
    assert guard.message is None and steps == 4 and guard.evaluations == 2
    assert guard.projected_eval_peak and 0 < guard.measured_eval_peak <= peak


# ----------------------------------------------------------------------------- serving


def test_the_serving_probe_runs_through_the_double():
    from advisor.memory.inference import ServePlan
    from advisor.runtime.probe.inference import probe_generate
    from advisor.runtime.simulate.tiny import tiny_spec

    with use(GPU):
        got = probe_generate(tiny_spec("llama", num_layers=2, vocab_size=512),
                             ServePlan(concurrency=2, context_len=64, max_new_tokens=8))
    assert got.test_double == GPU and got.engine == "hf" and got.new_tokens == 8
    assert got.peak_reserved_bytes >= got.peak_allocated_bytes > 0 and got.tokens_per_s > 0
