"""GPU-only: real transformers generation with a static cache (and vLLM when installed) against the ledger."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_static_cache_generation_peak_matches_ledger():
    from advisor.core.catalog import resolve_model
    from advisor.runtime.probe.inference import probe_generate
    from advisor.memory.inference import ServePlan, estimate_inference

    m = resolve_model("qwen2.5-0.5b-instruct")
    plan = ServePlan(concurrency=8, context_len=2048, max_new_tokens=64)
    got = probe_generate(m, plan)
    est = estimate_inference(m, plan, engine="hf")
    err = (got.peak_allocated_bytes - est.tensor_peak_bytes) / est.tensor_peak_bytes
    print(f"measured peak {got.peak_allocated_bytes} vs estimated {est.tensor_peak_bytes} ({err:+.2%}), "
          f"{got.tokens_per_s:.0f} tokens/s")
    assert abs(err) < 0.10
    assert got.tokens_per_s > 0


def test_vllm_runs_the_exported_plan():
    from advisor.runtime.probe.inference import probe_vllm, vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    from advisor.core.catalog import resolve_model
    from advisor.memory.inference import ServePlan

    m = resolve_model("qwen2.5-0.5b-instruct")
    got = probe_vllm(m, ServePlan(concurrency=8, context_len=2048), gpu_memory_utilization=0.3)
    assert got.tokens_per_s > 0
