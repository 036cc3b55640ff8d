"""advisor.core.architecture: the ledger's model description derived from a meta-device build (issue 24).

Tiny configs of the new model classes (experts, sliding windows, MLA, Gated DeltaNet); the dense catalog models
against the hand-written description the derivation replaced are in tests/test_architecture_vs_handwritten.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from advisor.core.architecture import describe_architecture  # noqa: E402
from advisor.core.catalog import resolve_model  # noqa: E402
from advisor.core.errors import AdvisorInputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                 num_experts_per_tok=2, vocab_size=256)
GPT_OSS = dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, vocab_size=256,
               sliding_window=8, layer_types=["sliding_attention", "full_attention"])
DEEPSEEK_V2 = dict(model_type="deepseek_v2", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                   n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16,
                   q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, vocab_size=256,
                   n_group=1, topk_group=1)
QWEN3_NEXT = dict(model_type="qwen3_next", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, vocab_size=256,
                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4)
GEMMA3 = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, sliding_window=8)


def real_count(config: dict) -> int:
    """Parameters of the model built for real on the CPU (what the meta build must equal)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("config", [QWEN3_MOE, GPT_OSS, DEEPSEEK_V2, QWEN3_NEXT, GEMMA3],
                         ids=lambda c: c["model_type"])
def test_count_and_categories_add_up_to_the_real_model(config):
    d = describe_architecture(config)
    assert d.params_total == real_count(config)
    assert sum(d.params_by_category.values()) == d.params_total
    assert sum(layer.params for layer in d.layers) + d.embedding_params + d.lm_head_params + d.final_norm_params \
        == d.params_total


def test_qwen3_moe_experts_are_stacked_parameters_not_linears():
    d = describe_architecture(QWEN3_MOE)
    layer = d.layers[0]
    assert d.is_moe and layer.num_experts == 8 and layer.experts_per_token == 2
    # experts x 2*moe_intermediate x hidden, experts x hidden x moe_intermediate (Qwen3MoeExperts)
    assert {e.name: e.shape for e in layer.experts} == {"mlp.experts.gate_up_proj": (8, 64, 64),
                                                          "mlp.experts.down_proj": (8, 64, 32)}
    gate_up = next(e for e in layer.experts if e.name.endswith("gate_up_proj"))
    assert (gate_up.in_features, gate_up.out_features, gate_up.transposed) == (64, 64, False)
    assert layer.router_params == 8 * 64
    assert set(layer.linear_shapes()) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert all(m.quantized_by_bnb and m.role == "attention" for m in layer.linears)
    assert layer.norm_count == 4 and layer.norm_params == 2 * 64 + 2 * 16  # two RMSNorms + q/k norms
    assert layer.router_dtype == "bfloat16"
    assert d.experts_implementation == "grouped_mm"
    assert d.params_by_category["experts"] == 2 * (8 * 64 * 64 + 8 * 64 * 32)


def test_gpt_oss_sinks_biases_transposed_experts_and_alternating_window():
    d = describe_architecture(GPT_OSS)
    sliding, full = d.layers
    assert (sliding.attention, sliding.sliding_window, full.attention) == ("sliding", 8, "full")
    assert ("self_attn.sinks", (4,)) in sliding.other_params
    gate_up = next(e for e in sliding.experts if e.name.endswith("gate_up_proj"))
    # GptOssExperts stores (experts, hidden, 2 * intermediate): transposed
    assert gate_up.transposed and (gate_up.in_features, gate_up.out_features) == (64, 64)
    assert any(e.name.endswith("gate_up_proj_bias") and e.shape == (4, 64) for e in sliding.experts)
    assert sliding.router_params == 4 * 64 + 4  # weight and bias
    assert all(m.bias for m in sliding.linears)
    assert d.attn_implementation == "eager"
    # the window layer keeps window - 1 tokens (DynamicSlidingWindowLayer); K and V, 2 heads x 16, bf16
    assert sliding.cache.max_tokens == 7 and sliding.cache.bytes_per_token == 2 * 2 * 16 * 2
    assert d.kv_cache_bytes(100) == 128 * 7 + 128 * 100


def test_deepseek_v2_mla_caches_the_compressed_latent():
    d = describe_architecture(DEEPSEEK_V2)
    dense, moe = d.layers
    assert dense.attention == moe.attention == "mla"
    assert dense.num_experts == 0 and moe.num_experts == 8
    assert {m.short for m in dense.linears} >= {"kv_a_proj_with_mqa", "kv_b_proj", "gate_proj"}
    assert {m.role for m in moe.linears if "shared_experts" in m.name} == {"shared_experts"}
    # kv_lora_rank + qk_rope_head_dim per token, not heads x (k + v) dims
    assert moe.cache.bytes_per_token == (16 + 8) * 2


def test_qwen3_next_linear_attention_has_a_fixed_state_and_conv_is_not_an_expert():
    d = describe_architecture(QWEN3_NEXT)
    kinds = [layer.attention for layer in d.layers]
    assert kinds == ["linear", "linear", "linear", "full"]
    linear = d.layers[0]
    assert linear.cache.bytes_per_token == 0 and linear.cache.fixed_bytes > 0
    assert [e.name for e in linear.experts] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    assert any(name == "linear_attn.conv1d.weight" for name, _ in linear.other_params)
    assert any(m.name == "mlp.shared_expert_gate" and m.role == "router" for m in linear.linears)
    assert d.layers[3].cache.bytes_per_token == 2 * 2 * 16 * 2


def test_gemma3_sliding_window_caps_the_cache():
    d = describe_architecture(GEMMA3)
    assert [layer.attention for layer in d.layers] == ["sliding"] * 5 + ["full"]
    assert d.tie_word_embeddings and d.lm_head_params == 0
    per = 2 * 2 * 16 * 2
    assert d.kv_bytes_per_token_uncapped() == 6 * per
    assert d.kv_cache_bytes(1000) == 5 * per * 7 + per * 1000


def test_linears_in_the_order_the_forward_calls_them():
    """Phi-3 registers o_proj before qkv_proj; the description lists them as data flows (the order exports list
    LoRA targets in, as architectures.yaml did)."""
    d = describe_architecture(dict(model_type="phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=256, pad_token_id=0))
    assert [m.short for m in d.layers[0].linears] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def test_norms_by_place_and_the_class_facts():
    d = describe_architecture(GEMMA3)
    layer = d.layers[0]
    assert [n.name for n in layer.norms if n.is_qk_norm] == ["self_attn.q_norm", "self_attn.k_norm"]
    assert sum(1 for n in layer.norms if not n.is_qk_norm) == 4
    assert d.supports_sdpa and d.hidden_act == "gelu_pytorch_tanh"
    gpt = describe_architecture(GPT_OSS)
    assert not gpt.supports_sdpa and gpt.supports_attention("eager") and gpt.supports_flash_attn


def test_layer_kinds_group_the_layers_that_are_the_same():
    d = describe_architecture(QWEN3_NEXT)
    kinds = d.layer_kinds()
    assert [ix for _, ix in kinds] == [(0, 1, 2), (3,)]
    assert not d.homogeneous and d.moe.num_experts == 8 and d.linear_attention.conv_kernel == 4
    assert describe_architecture(GEMMA3).homogeneous  # sliding and full layers hold the same modules


@pytest.mark.parametrize("config", [QWEN3_MOE, GPT_OSS, DEEPSEEK_V2, QWEN3_NEXT, GEMMA3], ids=lambda c: c["model_type"])
def test_stored_form_round_trips(config):
    from advisor.core.architecture import ArchitectureDescription

    d = describe_architecture(config)
    back = ArchitectureDescription.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back == d and back.layers == d.layers and back.moe == d.moe


@pytest.mark.slow
def test_gemma2_alternating_window_is_found_though_the_yaml_does_not_say_it():
    d = describe_architecture(resolve_model("gemma-2-9b").config)
    assert [layer.attention for layer in d.layers[:2]] == ["sliding", "full"]
    assert d.layers[0].sliding_window == 4096
    assert d.kv_cache_bytes(8192) < 8192 * d.kv_bytes_per_token_uncapped()


@pytest.mark.slow
def test_real_size_qwen3_30b_a3b_count():
    """The published total of Qwen3-30B-A3B (30.5B) from its config.json fields, on the meta device."""
    config = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                  num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                  num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False)
    d = describe_architecture(config)
    assert d.params_total == 30_532_122_624
    assert d.params_by_category["experts"] == 48 * 128 * 3 * 2048 * 768
    assert d.kv_bytes_per_token_uncapped() == 48 * 2 * 4 * 128 * 2


def test_unknown_model_type_is_a_clear_input_error():
    with pytest.raises(AdvisorInputError, match="--model"):
        describe_architecture({"model_type": "no-such-model", "hidden_size": 8})
    with pytest.raises(AdvisorInputError, match="model_type"):
        describe_architecture({"hidden_size": 8})


def test_description_is_json_serialisable():
    d = describe_architecture(QWEN3_MOE)
    data = json.loads(json.dumps(d.to_dict()))
    assert data["params_total"] == d.params_total and data["layer_pattern"] == [0, 0]


def test_importing_the_module_imports_no_torch():
    code = "import sys; import advisor.core.architecture; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("config", [QWEN3_MOE, GEMMA3, DEEPSEEK_V2], ids=lambda c: c["model_type"])
def test_keys_not_converted_equal_transformers_own(config):
    from transformers.quantizers.base import get_keys_to_not_convert

    from advisor.core.architecture import build_meta_model, keys_not_converted

    model = build_meta_model(config)
    assert keys_not_converted(model) == set(get_keys_to_not_convert(model))
