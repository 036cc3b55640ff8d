"""`advisor tune` on a GPU, through the CUDA test double ($ADVISOR_CUDA_DOUBLE): cuda is the default backend
where a GPU is detected, and every trial's probe takes the tuner's cuda branches: the budget enforced in the
child, the measured tokens/s replacing the prediction, the GPU's speed and memory calibration refitted from
the probe, and feasibility decided on the measured peak. The issue this guards: `advisor tune --gpu-budget
24GB --model qwen7b` on any GPU crashed at the first probe (the tuner called ``.get`` on BackendOptions)."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.core.catalog import CUDA_DOUBLE_ENV, MIB, detect_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.runtime.cuda_double import CONTEXT_BYTES

pytestmark = pytest.mark.slow  # each trial probes in a child process (about 10 s)
GPU = "rtx-4090"
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 4096}
# a small space of quick plans: LoRA on attention, two micro-batches, with and without expandable segments
SPACE = ["seq_len=64", "global_batch=2", "micro_batch=[1,2]", "method=lora", "quantization=none", "double_quant=false",
         "lora_r=8", "lora_targets=attention", "gradient_checkpointing=false", "activation_offload=false",
         "optimizer=adamw_torch", "offload=none", "loss=plain", "optimizer_in_backward=false"]


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(CUDA_DOUBLE_ENV, GPU)  # the double, for this process and every probe it starts
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def tune(tmp_path, capsys, model, *argv):
    code = main(["tune", "--model", str(model), "--probe-steps", "1", "--json", "--reports-dir",
                 str(tmp_path / "reports"), *argv, *SPACE])
    return code, json.loads(capsys.readouterr().out)


def test_tune_on_the_gpu_reaches_a_measured_calibrated_answer(tiny_dir, tmp_path, capsys):
    from advisor.memory.calibration import calibration_for
    from advisor.memory.overhead import overhead_of
    from advisor.speed import calibration as speedcal
    from advisor.speed.throughput import predict_throughput

    gpu = detect_gpu()
    assert predict_throughput(resolve_model(str(tiny_dir)), Plan(method="lora"), gpu).source == "predicted"
    code, d = tune(tmp_path, capsys, tiny_dir, "--gpu-budget", "2GB", "--trials", "2")  # --backend auto
    assert code == 0 and d["backend"] == "cuda" and d["gpu"]["name"] == gpu.name
    probed = [t for t in d["trials"] if t["stage"] == "probe" and t["state"] == "complete"]
    assert len(probed) == 2, d["trials"]
    for t in probed:
        assert t["source"] == "measured" and t["tokens_per_s_source"] == "measured" and t["tokens_per_s"] > 0
        assert len(t["losses"]) == 2  # warm-up + 1 measured step, from the probe
        assert CONTEXT_BYTES < t["peak_bytes"] < 2 * 2**30  # the whole process as NVML sees it
    best = d["best"]
    assert best["tokens_per_s_source"] == "measured" and best["source"] == "measured"
    # the probes refitted this GPU's step-time scales (the isolated $ADVISOR_SPEED_CALIBRATION) ...
    data = json.loads(speedcal.calibration_path().read_text())
    assert list(data) == [gpu.name] and len(data[gpu.name]["points"]) == 2, "keyed apart from a real RTX 4090"
    assert speedcal.for_gpu(gpu).probes == 2
    # ... so later predictions on it say so; and its memory overheads are the measured ones
    later = predict_throughput(resolve_model(str(tiny_dir)), Plan.from_dict(best["plan"]), gpu)
    assert later.source == "calibrated (2 probes)"
    assert calibration_for(gpu.name).probes == 2
    assert overhead_of(MIB, gpu).parts["cuda_context"] == CONTEXT_BYTES


def test_a_measured_peak_over_the_headroom_is_not_an_answer(tiny_dir, tmp_path, capsys, monkeypatch):
    # 1 GiB less 45% leaves 563 MiB: the simulation (the 500 MiB prior of the CUDA context) fits it, the
    # probe's measured peak (NVML: a 600 MiB context) does not, though it ran within the budget
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("ADVISOR_SPEED_CALIBRATION", str(blocked / "speed.json"))  # an unwritable cache never stops it
    code, d = tune(tmp_path, capsys, tiny_dir, "--gpu-budget", "1GiB", "--headroom", "0.45", "--trials", "1",
                   "--backend", "cuda")
    (trial,) = d["trials"]
    assert code == 1 and d["best"] is None and trial["state"] == "pruned" and trial["stage"] == "probe", trial
    assert trial["reason"].startswith("measured peak") and "leaves less than 45% of 1.00 GiB" in trial["reason"]
    assert trial["source"] == "measured" and trial["tokens_per_s_source"] == "measured"


def test_a_probe_that_runs_out_of_memory_is_pruned_with_its_status(tiny_dir, tmp_path, capsys):
    # 560 MiB: the simulation fits it (the CUDA context's 500 MiB prior), the GPU does not (its 600 MiB context)
    code, d = tune(tmp_path, capsys, tiny_dir, "--gpu-budget", "560MiB", "--headroom", "0", "--trials", "1")
    (trial,) = d["trials"]
    assert code == 1 and trial["state"] == "pruned" and trial["stage"] == "probe", trial
    assert trial["reason"].startswith("probe oom:") and "CUDA context alone" in trial["reason"]
