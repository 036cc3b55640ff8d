"""What an export or a decision reads from a MemoryReport is a typed field, set where the report is made; ``extra``
holds diagnostics to show only: the vLLM export and pre-flight work with ``extra`` empty."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.memory.inference import ServePlan, kv_cache_bytes_per_sequence, kv_cache_bytes_per_token, kv_tokens
from advisor.memory.ledger import KvCache, MemoryReport, StepMeasurement

GPU = resolve_gpu("rtx-4090")


def test_the_serving_ledger_states_its_kv_cache_and_the_vllm_script_reads_it(tmp_path):
    from advisor.configs.export._vllm import vllm_script
    from advisor.search.serve_grid import score

    model = resolve_model("qwen7b")
    plan = ServePlan(context_len=4096, concurrency=4)
    cand = score(model, plan, GPU, GPU.memory_bytes, 0.9)
    kv = cand.report.kv_cache
    assert kv == KvCache(kv_cache_bytes_per_token(model, plan.kv_dtype),
                         kv_cache_bytes_per_sequence(model, plan, "vllm"), kv_tokens(plan, "vllm"))
    bare = replace(cand, report=replace(cand.report, extra={}))  # no decision or export reads the diagnostics
    script = vllm_script(model, bare)
    assert f"{kv.tokens_in_flight:,} tokens x {kv.bytes_per_token:,} B" in script
    assert ("kv_cache" not in cand.report.to_dict()
            and cand.report.to_dict()["extra"]["tokens_in_flight"] == kv.tokens_in_flight)


def test_a_probe_states_its_test_double_and_preflight_reads_it(monkeypatch):
    from advisor.diagnosis.preflight import _run
    from advisor.runtime import backends
    from advisor.runtime.backends._probe import report_from_result
    from advisor.runtime.probe._result import ProbeResult

    result = ProbeResult(status="ok", message="", device="cuda", model="qwen0.5b", plan=Plan().to_dict(), steps=2,
                         warmup=1, peak_allocated_bytes=2**30, test_double="h100-sxm")
    assert report_from_result(result).measured.test_double == "h100-sxm"

    report = MemoryReport(source="measured", backend="cuda", device={"weights": 2**30}, host={},
                          tensor_peak_bytes=2**30, peak_bytes=2**30, extra={},
                          measured=StepMeasurement(tokens_per_s=100.0, test_double="h100-sxm"))
    backend = SimpleNamespace(measure=lambda *a, **k: report)
    monkeypatch.setattr(backends, "get_backend", lambda name: backend)
    target = SimpleNamespace(detected=resolve_gpu("h100-sxm"), budget=None)
    [finding] = _run._probe(resolve_model("qwen0.5b"), Plan(), target, 0.1)
    assert "cuda test double (h100-sxm" in finding.title
