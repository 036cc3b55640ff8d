"""Tiny models of the catalog's architectures, for tests and proofs that run real tensors on a CPU."""

from __future__ import annotations

from advisor.core.catalog import ModelSpec, spec_from_config

TINY = {
    "qwen2": dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                  tie_word_embeddings=True),
    "llama": dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                  tie_word_embeddings=False),
    "qwen3": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, tie_word_embeddings=True),
    "mistral": dict(hidden_size=64, intermediate_size=192, num_attention_heads=8, num_key_value_heads=2,
                    tie_word_embeddings=False),
    # issue 24: mixtures of experts (stacked experts, grouped_mm), sliding windows, MLA, linear attention
    "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                      tie_word_embeddings=False),
    "gpt_oss": dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    num_local_experts=8, num_experts_per_tok=2, sliding_window=16, tie_word_embeddings=False),
    "deepseek_v2": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1, tie_word_embeddings=False),
    "qwen3_next": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       num_experts=8, num_experts_per_tok=2, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                       tie_word_embeddings=False),
    "gemma3_text": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, sliding_window=16, tie_word_embeddings=True,
                        hidden_activation="gelu_pytorch_tanh"),
    "olmoe": dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                  num_experts_per_tok=2, pad_token_id=0, eos_token_id=1, tie_word_embeddings=False),
    "mixtral": dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                    num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
}


def tiny_spec(model_type: str = "qwen2", num_layers: int = 2, vocab_size: int = 512, **overrides) -> ModelSpec:
    """A small ModelSpec of ``model_type`` (a few layers, 64 wide): builds and steps in milliseconds."""
    act = {} if "hidden_activation" in TINY[model_type] else {"hidden_act": "silu"}
    config = dict(model_type=model_type, num_hidden_layers=num_layers, vocab_size=vocab_size,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, **act, **TINY[model_type])
    config.update(overrides)
    return spec_from_config(f"tiny-{model_type}", f"tiny-{model_type}", config, "test", None, None)
