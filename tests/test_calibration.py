"""The calibration file: probes recorded per GPU and torch/driver version, read back, used and named."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.memory import calibration as cal
from advisor.memory.overhead import overhead_of as overhead

MiB = 1 << 20

# two CUDA probe results as ProbeResult.to_dict() writes them (the fields calibration reads), one
# idle-process measurement as `advisor calibrate` records it
H100 = "NVIDIA H100 80GB HBM3"
VERSIONS = {"torch": "2.13.0", "cuda": "12.8", "driver": "570.86.15"}
PROBE_RESULTS = [
    {"status": "ok", "device": "cuda", "model": "qwen2.5-0.5b-instruct", "gpu_name": H100, "versions": VERSIONS,
     "plan": {"method": "lora", "seq_len": 512}, "peak_allocated_bytes": 2_400 * MiB,
     "peak_reserved_bytes": 2_700 * MiB, "nvml_peak_bytes": 3_230 * MiB},
    {"status": "ok", "device": "cuda", "model": "qwen2.5-0.5b-instruct", "gpu_name": H100, "versions": VERSIONS,
     "plan": {"method": "qlora", "seq_len": 1024}, "peak_allocated_bytes": 1_800 * MiB,
     "peak_reserved_bytes": 2_000 * MiB, "nvml_peak_bytes": 2_510 * MiB},
]


def test_probe_results_round_trip_through_the_file(tmp_path):
    path = tmp_path / "calibration.json"
    probes = [cal.OverheadProbe.from_probe(r) for r in PROBE_RESULTS]
    assert probes[0].cuda_context_bytes == 530 * MiB     # NVML minus reserved
    assert probes[0].driver == "570.86.15" and probes[0].torch == "2.13.0"
    cal.record(probes, path)
    cal.record([cal.OverheadProbe(gpu=H100, cuda_context_bytes=520 * MiB, cublas_workspace_bytes=32 * MiB,
                                  **VERSIONS)], path)
    assert json.loads(path.read_text())["version"] == cal.VERSION
    back = cal.load(path)
    assert back[:2] == probes and len(back) == 3
    c = cal.calibration_for(H100, torch_version="2.13.0", path=path)
    assert c.probes == 3 and c.label == f"calibrated on {H100} (3 probes)"
    assert c.cuda_context_bytes == 520 * MiB                   # median of 530, 510, 520
    assert c.cublas_workspace_bytes == 32 * MiB
    assert c.reserved_over_allocated == pytest.approx((2700 / 2400 + 2000 / 1800) / 2)
    assert cal.calibration_for("NVIDIA A100-SXM4-80GB", path=path) is None


def test_other_torch_versions_are_used_only_when_none_match(tmp_path):
    path = tmp_path / "c.json"
    cal.record([cal.OverheadProbe(gpu=H100, cuda_context_bytes=400 * MiB, torch="2.5.0"),
                cal.OverheadProbe(gpu=H100, cuda_context_bytes=600 * MiB, torch="2.13.0")], path)
    assert cal.calibration_for(H100, torch_version="2.13.0", path=path).cuda_context_bytes == 600 * MiB
    assert cal.calibration_for(H100, torch_version="2.9.0", path=path).probes == 2


def test_cpu_probes_and_failed_measurements_are_not_calibration():
    assert cal.OverheadProbe.from_probe({**PROBE_RESULTS[0], "device": "cpu"}) is None
    assert cal.OverheadProbe.from_probe({**PROBE_RESULTS[0], "nvml_peak_bytes": None}) is None


def test_a_broken_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("not json")
    with pytest.raises(AdvisorInputError, match="not a calibration file"):
        cal.load(path)


def test_predictions_on_a_calibrated_gpu_use_and_name_it(tmp_path, monkeypatch):
    from advisor.runtime.backends import get_backend

    gpu, spec = resolve_gpu("h100-sxm"), resolve_model("qwen0.5b")
    plan = Plan(method="lora", seq_len=512)
    monkeypatch.setenv(cal.ENV, str(tmp_path / "none-yet.json"))
    before = overhead(10 * 2**30, gpu)
    assert before.source.startswith("estimated")
    est_before = get_backend("estimate")(spec, plan, gpu)

    monkeypatch.setenv(cal.ENV, str(tmp_path / "calibration.json"))
    cal.record([cal.OverheadProbe.from_probe(r) for r in PROBE_RESULTS], tmp_path / "calibration.json")
    after = overhead(10 * 2**30, gpu)
    assert after.source == f"calibrated on {H100} (2 probes)"
    assert after.parts["cuda_context"] == 520 * MiB            # median of 530 and 510
    assert after.parts["fragmentation"] == before.parts["fragmentation"]
    est = get_backend("estimate")(spec, plan, gpu)
    assert est.peak_bytes - est_before.peak_bytes == 520 * MiB - before.parts["cuda_context"]
    assert any(f"calibrated on {H100} (2 probes)" in n for n in est.notes)
    # another GPU keeps the file's figures
    assert overhead(10 * 2**30, resolve_gpu("a100-80gb")).source.startswith("estimated")


def test_calibrate_without_a_gpu_is_a_one_line_error(capsys):
    from advisor.cli import main
    from advisor.core.catalog import detect_gpu

    if detect_gpu() is not None:
        pytest.skip("this machine has a GPU: advisor calibrate would run")
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs an NVIDIA GPU" in err


def test_a_cuda_probe_result_is_recorded_and_a_failed_one_is_not(tmp_path):
    path = tmp_path / "c.json"
    assert cal.record_probe_result(PROBE_RESULTS[0], path)
    assert not cal.record_probe_result({**PROBE_RESULTS[1], "status": "oom"}, path)
    assert not cal.record_probe_result({**PROBE_RESULTS[1], "device": "cpu"}, path)
    assert [p.workload for p in cal.load(path)] == ["probe qwen2.5-0.5b-instruct lora seq 512"]
