"""Real serving probes on a GPU: transformers generation with a static cache (always), vLLM (when installed).

Protocol (nanoGPT bench.py style): build the model from its config with random weights (memory and speed
do not depend on the values), warm up with one generate call, reset the peak counters, synchronize, time
``generate`` of ``max_new_tokens`` tokens for ``concurrency`` sequences of ``prompt_len`` tokens,
synchronize; report torch's peak allocated bytes, the process's device memory from NVML when available,
and decode tokens/s. Without CUDA these functions raise; their tests skip.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from advisor.core.catalog import ModelSpec
from advisor.memory.inference import ServePlan


@dataclass(frozen=True)
class ServeProbe:
    engine: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    tokens_per_s: float
    seconds: float
    new_tokens: int
    source: str = "measured"
    test_double: str | None = None
    """The catalog GPU the CUDA test double stood for (the run was on the CPU); None on a GPU."""

    def to_dict(self) -> dict:
        return asdict(self)


def probe_generate(spec: ModelSpec, plan: ServePlan, *, num_layers: int | None = None,
                   new_tokens: int | None = None) -> ServeProbe:
    """Measure transformers ``generate`` with ``cache_implementation="static"`` on the GPU (bf16).

    In this process: the CUDA test double answers it when switched on (advisor.runtime.cuda_double.use)."""
    import torch

    from advisor.runtime import cuda_boundary
    from advisor.runtime.simulate.inference import serving_model

    cuda = cuda_boundary.cuda()
    if not cuda.is_available():
        raise RuntimeError("probe_generate needs a CUDA GPU")
    plan.validate()
    n_new = new_tokens or plan.new_tokens
    on = cuda_boundary.tensor_device("cuda")
    with torch.device(on):
        model, _ = serving_model(spec, num_layers)
    ids = torch.randint(0, spec.vocab_size, (plan.concurrency, plan.prompt_len), device=on)
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, cache_implementation="static",
              pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        cuda.synchronize()
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        cuda.synchronize()
        dt = time.perf_counter() - t0
    double = cuda_boundary.double()
    return ServeProbe("hf", cuda.max_memory_allocated(), cuda.max_memory_reserved(),
                      plan.concurrency * n_new / dt, dt, n_new, test_double=double.key if double is not None else None)


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def probe_vllm(spec: ModelSpec, plan: ServePlan, gpu_memory_utilization: float, new_tokens: int = 64) -> ServeProbe:
    """Run vLLM offline with the exported engine arguments and dummy weights; measure throughput."""
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec.hf_id, load_format="dummy", gpu_memory_utilization=gpu_memory_utilization,
              max_model_len=plan.context_len, max_num_seqs=plan.concurrency, block_size=plan.block_size,
              kv_cache_dtype="fp8" if plan.kv_dtype == "fp8" else "auto",
              max_num_batched_tokens=plan.batched_tokens, dtype="bfloat16")
    prompts = [{"prompt_token_ids": [1] * min(plan.prompt_len, 256)} for _ in range(plan.concurrency)]
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    return ServeProbe("vllm", torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
                      plan.concurrency * new_tokens / dt, dt, new_tokens)
