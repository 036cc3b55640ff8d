"""The serving ledger: GQA-aware KV cache, whole blocks, weight formats, and the analytic transformers ledger
against the fake-tensor simulation at real sizes (validated against: advisor/runtime/simulate/inference.py)."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.memory.inference import (ServePlan, estimate_inference, kv_cache_bytes_per_token, kv_tokens,
                             serve_weight_bytes, vllm_memory_utilization)


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


# The new families against the simulated serving step (transformers' own model code and StaticCache on fake
# tensors): weights and the cache exactly, the prefill transient where the CPU runs the kernels a GPU runs.
# (model, batch, context, new tokens, transient tolerance or None where the CPU trace runs other kernels)
FAMILIES = [
    ("qwen3-30b-a3b", 2, 2048, 512, 0.01),  # routed experts (grouped_mm rows)
    ("mixtral-8x7b-v0.1", 2, 2048, 512, 0.01),
    ("olmoe-1b-7b-0924", 1, 4096, 512, 0.01),
    ("gpt-oss-20b", 2, 2048, 512, 0.02),  # sliding window + sinks under eager attention, routed experts with biases
    ("gemma-3-4b", 1, 8192, 1024, 0.02),  # sliding window (1,024) and full layers, two rotary embeddings
    # MLA: with d_qk != d_v the CPU's SDPA falls back to its math kernel, which materializes fp32 scores a GPU kernel
    # does not; the ledger models the GPU (its transient is below the trace's)
    ("deepseek-v2-lite", 2, 2048, 512, None),
]


def _sim(model, plan):
    from advisor.runtime.simulate.inference import trace_serving_extrapolated

    return trace_serving_extrapolated(model, plan)  # two depths a period of layer kinds apart, extended


@pytest.mark.parametrize("name,B,C,new,tol", FAMILIES)
def test_serving_ledger_of_each_family_matches_the_simulated_step(name, B, C, new, tol):
    m = resolve_model(name)
    plan = ServePlan(concurrency=B, context_len=C, max_new_tokens=new)
    est = estimate_inference(m, plan, engine="hf")
    sim = _sim(m, plan)
    # every expert resident, each layer's cache as transformers' StaticCache holds it: exact
    assert est.device["weights"] == pytest.approx(sim.decode.ledger["weights"], rel=1e-5)
    assert est.device["kv_cache"] == sim.decode.ledger["kv_cache"]
    transient = sim.prefill.ledger["transient"]
    err = (est.device["transient"] - transient) / transient
    print(f"{name}: weights {est.device['weights']:,} kv {est.device['kv_cache']:,} prefill transient "
          f"{est.device['transient']:,} vs {transient:,} ({err:+.2%}), in {est.extra['prefill_peak_in']}")
    if tol is None:
        assert est.device["transient"] < transient
        assert abs(est.tensor_peak_bytes - sim.peak_bytes) / sim.peak_bytes < 0.02
    else:
        assert abs(err) < tol
        assert abs(est.tensor_peak_bytes - sim.peak_bytes) / sim.peak_bytes < 0.005


def test_linear_attention_states_are_the_cache_of_qwen3_next():
    """Qwen3-Next (36 Gated DeltaNet layers, 12 full; 4 and 8 layers simulated and extended). Its recurrent states
    count once per sequence whatever the context; the prefill transient of the CPU trace is transformers' PyTorch
    reference of the chunked scan (fp32 chunk tensors), which flash-linear-attention's kernels do not allocate."""
    m = resolve_model("qwen3-next")
    plan = ServePlan(concurrency=2, context_len=2048, max_new_tokens=512)
    est = estimate_inference(m, plan, engine="hf")
    sim = _sim(m, plan)
    assert est.device["weights"] == pytest.approx(sim.decode.ledger["weights"], rel=1e-5)
    assert est.device["kv_cache"] == sim.decode.ledger["kv_cache"]
    assert est.device["transient"] < sim.prefill.ledger["transient"]
    assert abs(est.tensor_peak_bytes - sim.peak_bytes) / sim.peak_bytes < 0.005


def test_cache_by_layer_kind():
    from advisor.memory.inference import kv_cache_bytes_per_sequence

    short, long_ = ServePlan(context_len=4096), ServePlan(context_len=32768)
    # gpt-oss: 12 sliding layers keep a 128-token window (vLLM: window - 1 + one chunked-prefill step + a block),
    # 12 full layers grow with the context
    oss = resolve_model("gpt-oss-20b")
    per_layer = 2 * 8 * 64 * 2
    sliding = (-(-(127 + 2048) // 16) + 1) * 16 * per_layer
    assert kv_cache_bytes_per_sequence(oss, long_) == 12 * 32768 * per_layer + 12 * sliding
    assert kv_cache_bytes_per_sequence(oss, long_) < 0.6 * kv_cache_bytes_per_token(oss) * 32768
    # transformers' static cache holds the whole window
    assert kv_cache_bytes_per_sequence(oss, long_, "hf") == 12 * 32768 * per_layer + 12 * 128 * per_layer
    # Qwen3-Next: 36 recurrent states whatever the context, 12 full layers that grow
    nxt = resolve_model("qwen3-next")
    fixed = 36 * 2_162_688
    assert kv_cache_bytes_per_sequence(nxt, short) == fixed + 12 * 4096 * 2048
    assert kv_cache_bytes_per_sequence(nxt, long_) - kv_cache_bytes_per_sequence(nxt, short) == 12 * 28672 * 2048
    # an fp8 cache halves what grows, not the recurrent states (kept in their own dtype)
    fp8 = ServePlan(context_len=4096, kv_dtype="fp8")
    assert kv_cache_bytes_per_sequence(nxt, fp8) == fixed + 12 * 4096 * 1024
    # DeepSeek-V2-Lite caches the compressed latent: (512 + 64) x 2 B per layer and token, not 16 heads x (192 + 128)
    ds = resolve_model("deepseek-v2-lite")
    assert kv_cache_bytes_per_token(ds) == 27 * 576 * 2
    assert kv_cache_bytes_per_sequence(ds, short) == 27 * 4096 * 1152


def test_every_expert_is_resident_and_quantized_with_the_linears():
    moe = resolve_model("qwen3-30b-a3b")
    bf16, _ = serve_weight_bytes(moe, "bf16")
    i4, c4 = serve_weight_bytes(moe, "int4", 128)
    assert bf16 == 2 * moe.params_total  # 30.5B parameters resident, not the 3.3B active
    experts = moe.description.params_by_category["experts"]
    assert i4 < bf16 / 3 and i4 > experts * 0.5  # experts and attention at 4 bits, embeddings and head at 16
    # gpt-oss as its checkpoint ships: MXFP4 experts (4 bits + one 8-bit scale per 32), the rest bf16
    oss = resolve_model("gpt-oss-20b")
    w, c = serve_weight_bytes(oss, "mxfp4")
    assert (w + c) / 2**30 == pytest.approx(12.81, abs=0.02)  # reports/moe_findings.md: the checkpoint's 12.81 GiB
    with pytest.raises(AdvisorInputError, match="--weight-format"):
        serve_weight_bytes(moe, "mxfp4")


def test_mxfp4_is_offered_where_vllm_runs_it():
    from advisor.core.catalog import resolve_gpu
    from advisor.search.serve_grid import weight_formats
    from advisor.search.serve_space import load_serve_space

    space, oss = load_serve_space("inference"), resolve_model("gpt-oss-20b")
    assert weight_formats(oss, space, resolve_gpu("a100-80gb"))[0] == "mxfp4"  # Marlin MXFP4 MoE from sm80
    assert "mxfp4" not in weight_formats(oss, space, resolve_gpu("t4"))
    assert "mxfp4" not in weight_formats(resolve_model("qwen3-30b-a3b"), space, resolve_gpu("h100-sxm"))


def test_decode_reads_only_the_experts_a_step_picks():
    from advisor.core.catalog import resolve_gpu
    from advisor.speed.decode import decode_throughput

    moe, gpu = resolve_model("qwen3-30b-a3b"), resolve_gpu("h100-sxm")
    one = decode_throughput(moe, ServePlan(concurrency=1, context_len=2048), gpu)
    many = decode_throughput(moe, ServePlan(concurrency=64, context_len=2048), gpu)
    # one sequence reads 8 of 128 experts per layer: far less than the 61 GB of weights
    assert one.bytes_per_step < 0.2 * serve_weight_bytes(moe, "bf16")[0]
    assert many.bytes_per_step > 4 * one.bytes_per_step  # 64 sequences touch almost every expert
