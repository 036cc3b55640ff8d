"""The serving simulation: fake tensors equal the same tracker over real CPU tensors on a tiny model, and the
layer extrapolation equals a full-depth trace."""

from __future__ import annotations

import pytest

from advisor.memory.inference import ServePlan


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fake_equals_real_cpu_tiny(arch):
    from advisor.runtime.simulate.inference import trace_serving
    from advisor.runtime.simulate.tiny import tiny_spec

    spec = tiny_spec(arch, num_layers=2)
    plan = ServePlan(concurrency=3, context_len=96, max_new_tokens=32)
    real = trace_serving(spec, plan, fake=False)
    fake = trace_serving(spec, plan, fake=True)
    for phase in ("prefill", "decode"):
        r, f = getattr(real, phase), getattr(fake, phase)
        assert abs(f.bytes - r.bytes) <= 0.01 * r.bytes, (phase, r, f)
        assert (f.ledger["kv_cache"] == r.ledger["kv_cache"]
                == 3 * 96 * spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 2)
    assert real.prefill.bytes > real.decode.bytes  # the prompt's activations are gone at decode


def test_extrapolation_equals_full_depth():
    from advisor.core.catalog import resolve_model
    from advisor.runtime.simulate.inference import trace_serving, trace_serving_extrapolated

    m = resolve_model("qwen2.5-0.5b-instruct")
    plan = ServePlan(concurrency=2, context_len=512, max_new_tokens=128)
    full = trace_serving(m, plan)
    ext = trace_serving_extrapolated(m, plan)
    assert abs(ext.prefill.bytes - full.prefill.bytes) <= 0.001 * full.prefill.bytes
    assert abs(ext.decode.bytes - full.decode.bytes) <= 0.001 * full.decode.bytes


@pytest.mark.parametrize("arch,layers", [("qwen3_moe", 2), ("gpt_oss", 2), ("deepseek_v2", 2), ("gemma3_text", 6),
                                         ("qwen3_next", 4), ("mixtral", 2)])
def test_fake_equals_real_cpu_tiny_new_families(arch, layers):
    """Routed experts, sliding windows, latent attention and linear attention: the fake trace equals the same
    tracker over real CPU tensors, and its cache is the serving ledger's (every layer's tensors: keys and values,
    latents, conv and recurrent states)."""
    from advisor.memory.inference import estimate_inference
    from advisor.runtime.simulate.inference import trace_serving
    from advisor.runtime.simulate.tiny import tiny_spec

    spec = tiny_spec(arch, num_layers=layers)
    plan = ServePlan(concurrency=2, context_len=96, max_new_tokens=32)
    real = trace_serving(spec, plan, fake=False)
    fake = trace_serving(spec, plan, fake=True)
    for phase in ("prefill", "decode"):
        assert getattr(fake, phase).ledger == getattr(real, phase).ledger, phase
    est = estimate_inference(spec, plan, engine="hf")
    assert real.decode.ledger["kv_cache"] == est.device["kv_cache"]
    # parameters as the tracker counts them: each storage in whole 512-byte blocks (tiny norms round up)
    assert real.decode.ledger["weights"] == pytest.approx(est.device["weights"], rel=0.05)


@pytest.mark.parametrize("name", ["gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite"])
def test_extrapolation_over_periods_of_layer_kinds_equals_full_depth(name):
    """Sliding/full alternation (Gemma-3's 5 + 1 with a remainder, gpt-oss's 1 + 1) and a dense first layer
    (DeepSeek-V2): two depths a period apart, both keeping the remainder, extend exactly."""
    from advisor.core.catalog import resolve_model
    from advisor.runtime.simulate.inference import trace_serving, trace_serving_extrapolated

    m = resolve_model(name)
    plan = ServePlan(concurrency=2, context_len=512, max_new_tokens=128)
    full = trace_serving(m, plan)
    ext = trace_serving_extrapolated(m, plan)
    assert ext.prefill.ledger == full.prefill.ledger and ext.decode.ledger == full.decode.ledger
