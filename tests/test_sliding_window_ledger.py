"""The closed form of sliding-window layers at sequences their window reaches (Gemma-3's local/global attention):
the explicit mask each sliding layer saves under sdpa, none under eager, and Gemma's fp32 norm products, held to the
simulation within 3% on every Gemma-3 of the catalog.

The real-size checks trace six decoder layers of each model at its real width (five sliding, one global: Gemma-3's
pattern) with its real vocabulary, twelve for a full fine-tune (with six, the tied 262k x 5,376 embedding's gradient
at the end of backward outweighs the layers of Gemma-3-27B: -3.9% there, -1.6% with twelve), so that each
simulation takes seconds; the closed form is asked about the same shallow model."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model, spec_from_config
from advisor.core.plan import Plan
from advisor.memory.closed_form import closed_form_describes
from advisor.memory.training import estimate_training, layer_terms, param_breakdown
from matrix import matrix_params  # tests/matrix.py

GEMMA3 = ("gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b")


def shallow(name: str, layers: int = 6):
    """The catalog model ``name`` with ``layers`` decoder layers (its width, vocabulary and layer pattern)."""
    spec = resolve_model(name)
    config = dict(spec.config, num_hidden_layers=layers)
    return spec_from_config(f"{name}-{layers}-layers", spec.hf_id, config, "test", None, None)


@pytest.mark.parametrize("name", GEMMA3)
def test_every_gemma3_is_described_past_its_window(name):
    spec = resolve_model(name)
    window = max(layer.sliding_window or 0 for layer in spec.description.layers)
    for impl in ("sdpa", "eager"):
        assert closed_form_describes(spec, Plan(seq_len=2 * window, attn_impl=impl))[0]


def test_a_sliding_layer_saves_its_mask_bias_under_sdpa_only():
    spec = shallow("gemma-3-1b")
    kinds = [layer.attention for layer in spec.description.layers]
    assert kinds == ["sliding"] * 5 + ["full"]
    for seq, impl, extra in ((2048, "sdpa", 2 * 2048 * 2048), (2048, "eager", 0), (256, "sdpa", 0)):
        plan = Plan(method="lora", seq_len=seq, attn_impl=impl)
        saved = layer_terms(spec, plan, param_breakdown(spec, plan)).saved
        assert saved[0] - saved[5] == extra, (seq, impl)  # b x 1 x s x s in bf16, sliding minus global


PLANS = {
    "lora": Plan(method="lora", seq_len=2048),
    "lora-eager": Plan(method="lora", seq_len=2048, attn_impl="eager"),
    "qlora-ckpt-b2": Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, micro_batch=2,
                          seq_len=4096),
    "full": Plan(method="full", seq_len=2048, optimizer="adamw_torch_fused"),
}


# every model and every plan by default (each model once), the whole product with --full-matrix (tests/matrix.py)
@pytest.mark.slow
@pytest.mark.parametrize("name,plan_name", matrix_params([(m, p) for p in sorted(PLANS) for m in GEMMA3],
                                                         lambda c: [("model", c[0]), ("plan", c[1])],
                                                         ids=lambda c: f"{c[1]}-{c[0]}"))
def test_sliding_window_closed_form_within_3_percent(name, plan_name):
    pytest.importorskip("torch")
    from advisor.runtime.simulate.extrapolate import simulate

    plan = PLANS[plan_name]
    spec = shallow(name, 12 if plan.method == "full" else 6)
    assert closed_form_describes(spec, plan)[0]
    sim = simulate(spec, plan, layers="full").peak_bytes
    est = estimate_training(spec, plan).tensor_peak_bytes
    err = (est - sim) / sim
    assert abs(err) < 0.03, f"{name} {plan_name}: estimated {est / 2**30:.3f} GiB, simulated {sim / 2**30:.3f} GiB " \
        f"({err:+.2%})"


# Gemma-2: every other layer slides over 4,096 tokens, and the class cannot run sdpa (soft-capped scores): eager, as
# transformers picks it, with the tanh of the capped scores and logits saved (real size: seconds each)
GEMMA2 = [("gemma-2-2b", Plan(method="lora")),
          ("gemma-2-2b", Plan(method="full", optimizer="adamw_8bit")),
          ("gemma-2-9b", Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, seq_len=2048)),
          ("gemma-2-9b", Plan(method="lora", gradient_checkpointing=True, seq_len=4096))]


@pytest.mark.slow
@pytest.mark.parametrize("name,plan", GEMMA2, ids=lambda x: x if isinstance(x, str) else x.short())
def test_gemma2_closed_form_within_3_percent(name, plan):
    pytest.importorskip("torch")
    from advisor.runtime.simulate.extrapolate import simulate

    spec = resolve_model(name)
    assert closed_form_describes(spec, plan)[0]
    sim = simulate(spec, plan).peak_bytes
    est = estimate_training(spec, plan).tensor_peak_bytes
    assert abs(est - sim) / sim < 0.03, (f"{name} {plan.short()}: estimated {est / 2**30:.3f}, "
                                         f"simulated {sim / 2**30:.3f}")
