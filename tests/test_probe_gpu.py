"""GPU probes (skipped without a CUDA GPU): the budget is enforced by the caching allocator's cap."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.runtime.probe import run_probe
from advisor.runtime.probe._classify import essence, status_of_exception


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


gpu = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_cuda_probe_measures_allocator_and_nvml():
    spec = resolve_model("qwen2.5-0.5b")
    r = run_probe(spec, Plan(method="qlora", quantization="nf4", seq_len=512, gradient_checkpointing=True),
                  device="cuda", steps=2, warmup=1, timeout=300)
    assert r.status == "ok", r.message
    assert r.gpu_name and r.versions["cuda"]
    assert r.peak_reserved_bytes >= r.peak_allocated_bytes > 0
    assert r.nvml_peak_bytes > r.peak_allocated_bytes  # the CUDA context is outside the allocator
    assert r.tokens_per_s > 0
    assert isinstance(r.alloc_retries, int) and r.alloc_retries >= 0


@pytest.mark.gpu
@gpu
def test_cuda_budget_is_enforced_and_the_next_probe_runs():
    spec = resolve_model("qwen2.5-1.5b")
    r = run_probe(spec, Plan(method="full", seq_len=1024, micro_batch=4), device="cuda", steps=1, warmup=0,
                  timeout=300, memory_limit_bytes=4 * 2**30)
    assert r.status == "oom", r
    after = run_probe(spec, Plan(method="lora", seq_len=256), device="cuda", steps=1, warmup=0, timeout=300,
                      memory_limit_bytes=16 * 2**30)
    assert after.status == "ok", after.message
    assert after.nvml_peak_bytes <= 16 * 2**30


def test_failure_messages_are_classified():  # runs everywhere: the classifier the GPU path relies on
    assert status_of_exception("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB") == "oom"
    assert status_of_exception("RuntimeError", "CUDA error: an illegal memory access was encountered") == "crash"
    assert status_of_exception("RuntimeError", "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate") == "oom"
    assert status_of_exception("MemoryError", "") == "oom"
    assert status_of_exception("ValueError", "bad shape") == "error"
    assert essence("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. Of the allocated memory 7 GiB"
                   " is allocated by PyTorch\nmore") == ("OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                                         "2.00 GiB.")
