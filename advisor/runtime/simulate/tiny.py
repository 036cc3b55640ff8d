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
}


def tiny_spec(model_type: str = "qwen2", num_layers: int = 2, vocab_size: int = 512, **overrides) -> ModelSpec:
    """A small ModelSpec of ``model_type`` (a few layers, 64 wide): builds and steps in milliseconds."""
    config = dict(model_type=model_type, num_hidden_layers=num_layers, vocab_size=vocab_size,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", **TINY[model_type])
    config.update(overrides)
    return spec_from_config(f"tiny-{model_type}", f"tiny-{model_type}", config, "test", None, None)
