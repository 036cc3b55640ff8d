"""The serving ledger: GQA-aware KV cache, whole blocks, weight formats, and the analytic transformers ledger
against the fake-tensor simulation at real sizes (validated against: advisor/runtime/simulate/inference.py)."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.memory.inference import (ServePlan, estimate_inference, kv_cache_bytes_per_token, kv_tokens, serve_weight_bytes,
                             vllm_memory_utilization)


def test_kv_per_token_qwen7b_gqa():
    m = resolve_model("qwen7b")
    assert kv_cache_bytes_per_token(m, "bf16") == 2 * 28 * 4 * 128 * 2 == 57_344
    assert kv_cache_bytes_per_token(m, "fp8") == 28_672


def test_vllm_kv_is_whole_blocks_and_hf_is_exact():
    p = ServePlan(context_len=1000, concurrency=3, block_size=32)
    assert kv_tokens(p, "vllm") == 3 * 1024
    assert kv_tokens(p, "hf") == 3000
    m = resolve_model("qwen7b")
    assert estimate_inference(m, p).device["kv_cache"] == 3 * 1024 * 57_344


def test_weight_formats_order_and_constants():
    m = resolve_model("qwen7b")
    bf16, _ = serve_weight_bytes(m, "bf16")
    fp8, c8 = serve_weight_bytes(m, "fp8")
    i4_128, c128 = serve_weight_bytes(m, "int4", 128)
    i4_32, c32 = serve_weight_bytes(m, "int4", 32)
    assert bf16 == 2 * 7_615_616_512
    assert i4_128 < fp8 < bf16 and i4_32 == i4_128 and c32 == 4 * c128 and c8 > 0


def test_memory_utilization_stays_within_budget():
    total = 24_564 * 2**20
    u = vllm_memory_utilization(24 * 10**9, total, 0.05)
    assert u * total <= 24 * 10**9 * 0.95 and u > 0.85
    assert vllm_memory_utilization(10**12, total, 0.0) == 0.98


@pytest.mark.parametrize("field,flag", [("context_len", "--context-len"), ("concurrency", "--concurrency"),
                                        ("block_size", "--block-size")])
def test_bad_plan_names_the_flag(field, flag):
    with pytest.raises(AdvisorInputError, match=flag):
        ServePlan(**{field: 0}).validate()


# (model, concurrency, context, new tokens): real architectures at real sizes
CASES = [("qwen7b", 4, 2048, 1024), ("llama-3.1-8b-instruct", 2, 4096, 512), ("qwen2.5-0.5b-instruct", 8, 1024, 256)]


@pytest.mark.parametrize("name,B,C,new", CASES)
def test_analytic_hf_ledger_matches_simulation(name, B, C, new):
    from advisor.runtime.simulate.inference import trace_serving_extrapolated

    m = resolve_model(name)
    plan = ServePlan(concurrency=B, context_len=C, max_new_tokens=new)
    est = estimate_inference(m, plan, engine="hf")
    sim = trace_serving_extrapolated(m, plan)
    # the static cache: exactly B x C tokens
    assert sim.prefill.ledger["kv_cache"] == est.device["kv_cache"] == B * C * kv_cache_bytes_per_token(m)
    total_err = (est.tensor_peak_bytes - sim.prefill.bytes) / sim.prefill.bytes
    transient_err = (est.device["transient"] - sim.prefill.ledger["transient"]) / sim.prefill.ledger["transient"]
    decode_err = (est.extra["decode_transient"] - sim.decode.ledger["transient"]) / sim.decode.ledger["transient"]
    print(f"{name} B={B} C={C}: peak {total_err:+.4%}, prefill transient {transient_err:+.3%}, "
          f"decode transient {decode_err:+.2%}")
    assert abs(total_err) < 0.01
    assert abs(transient_err) < 0.02
    assert abs(decode_err) < 0.05


def test_serving_uses_the_calibrated_cuda_context_as_training_does(tmp_path, monkeypatch):
    """The CUDA context and cuBLAS workspace of a calibrated GPU (advisor.memory.calibration) reach the serving
    ledger through the same rule as the training run's phases (advisor.memory.overhead.outside_allocator_bytes)."""
    from advisor.core.catalog import resolve_gpu
    from advisor.memory import calibration as cal
    from advisor.memory.overhead import outside_allocator_bytes

    mib = 1 << 20
    gpu, m, plan = resolve_gpu("h100-sxm"), resolve_model("qwen7b"), ServePlan()
    monkeypatch.setenv(cal.ENV, str(tmp_path / "none-yet.json"))
    before, outside_before = estimate_inference(m, plan, gpu), outside_allocator_bytes(gpu)
    probe = {"status": "ok", "device": "cuda", "model": m.name, "gpu_name": gpu.name,
             "versions": {"torch": "2.13.0", "cuda": "12.8", "driver": "570.86.15"},
             "plan": {"method": "lora", "seq_len": 512}, "peak_allocated_bytes": 2_400 * mib,
             "peak_reserved_bytes": 2_700 * mib, "nvml_peak_bytes": 3_600 * mib}  # a 900 MiB context
    monkeypatch.setenv(cal.ENV, str(tmp_path / "calibration.json"))
    cal.record([cal.OverheadProbe.from_probe(probe)], tmp_path / "calibration.json")
    after, outside_after = estimate_inference(m, plan, gpu), outside_allocator_bytes(gpu)
    assert outside_after - outside_before == 900 * mib - 550 * mib  # overheads.yaml h100-sxm: 550 MiB
    assert after.device["overhead"] - before.device["overhead"] == outside_after - outside_before
    assert after.peak_bytes - before.peak_bytes == outside_after - outside_before
