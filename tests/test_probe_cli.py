"""`advisor probe ... --json`, the cpu backend behind `advisor estimate --backend cpu`, DeepSpeed offload."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import resolve_model
from advisor.cli import main
from advisor.core.plan import Plan
from advisor.runtime.probe import ProbeResult, run_probe
from advisor.runtime.probe._tiny import tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir():
    return str(tiny_model_dir())


@pytest.mark.slow
def test_cli_probe_json_prints_the_result_object(tiny_dir, capsys):
    rc = main(["probe", "--model", tiny_dir, "--device", "cpu", "--method", "qlora", "--seq-len", "32",
               "--steps", "1", "--warmup", "1", "--json"])
    out = capsys.readouterr().out
    result = ProbeResult.from_dict(json.loads(out))
    assert rc == 0 and result.status == "ok" and result.device == "cpu"
    assert result.plan["method"] == "qlora" and result.plan["quantization"] == "nf4"
    assert result.peak_allocated_bytes > 0 and result.tokens_per_s > 0 and result.breakdown["quant_constants"] > 0


def test_cli_bad_input_is_one_line_exit_2(tiny_dir, capsys, tmp_path):
    rc = main(["probe", "--model", tiny_dir, "--device", "cpu", "--data", str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().count("\n") == 0 and "--data: no such file" in err


@pytest.mark.slow
def test_estimate_backend_cpu_is_measured(tiny_dir, capsys):
    rc = main(["estimate", "--model", tiny_dir, "--backend", "cpu", "--method", "lora", "--seq-len", "32", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["source"] == "measured" and out["backend"] == "cpu"
    assert out["tensor_peak_bytes"] == sum(v for k, v in out["device"].items() if k != "overhead") > 0
    assert out["device"]["adapter_weights"] > 0 and out["device"]["activations"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)  # above the probe's own 400 s: 240 s seen on CI's 2 cores (compiling cpu_adam on first use)
@pytest.mark.parametrize("offload", ["zero2_cpu", "zero3_cpu"])
def test_deepspeed_cpu_offload_runs_in_one_process_on_the_cpu(tiny_dir, offload):
    spec = resolve_model(tiny_dir)
    # first use compiles DeepSpeed's cpu_adam op (about two minutes, then cached): a long timeout
    r = run_probe(spec, Plan(method="lora", seq_len=32, offload=offload), device="cpu", steps=1, warmup=1,
                  timeout=400)
    assert r.status == "ok", r.message
    assert r.versions["deepspeed"] and any(f"DeepSpeed {offload}" in n for n in r.notes)
    assert len(r.losses) == 2 and all(0 < x < 20 for x in r.losses)
    assert r.peak_allocated_bytes > 0
