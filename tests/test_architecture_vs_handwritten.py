"""The derived description (advisor/core/architecture.py) against the hand-written one it replaced, for every dense
catalog model: every figure the ledger reads is the same.

Until issue 24 the ledger's description of a model was ``architectures.yaml`` (one entry per model type: linear
modules by dimension name, bias rules, norms per layer, q/k norms, activation, soft-capping, LoRA target sets) and
the formulas of ``catalog.ModelSpec``. Both are kept here, verbatim, as the reference the derivation must reproduce
(``HANDWRITTEN`` is the file as it was at commit e3cc795)."""

from __future__ import annotations

import pytest
import yaml

from advisor.core.catalog import model_catalog, resolve_model

HANDWRITTEN = yaml.safe_load("""
llama:
  linear_modules: {q_proj: [hidden, q_dim], k_proj: [hidden, kv_dim], v_proj: [hidden, kv_dim],
                   o_proj: [q_dim, hidden], gate_proj: [hidden, intermediate],
                   up_proj: [hidden, intermediate], down_proj: [intermediate, hidden]}
  attention_bias: false
  o_bias: from_attention_bias
  norms_per_layer: 2
  qk_norm: false
  mlp_activation: silu
  logit_softcap: false
  lora_target_sets: {attention: [q_proj, k_proj, v_proj, o_proj], mlp: [gate_proj, up_proj, down_proj]}
mistral:
  linear_modules: {q_proj: [hidden, q_dim], k_proj: [hidden, kv_dim], v_proj: [hidden, kv_dim],
                   o_proj: [q_dim, hidden], gate_proj: [hidden, intermediate],
                   up_proj: [hidden, intermediate], down_proj: [intermediate, hidden]}
  attention_bias: false
  o_bias: false
  norms_per_layer: 2
  qk_norm: false
  mlp_activation: silu
  logit_softcap: false
  lora_target_sets: {attention: [q_proj, k_proj, v_proj, o_proj], mlp: [gate_proj, up_proj, down_proj]}
qwen2:
  linear_modules: {q_proj: [hidden, q_dim], k_proj: [hidden, kv_dim], v_proj: [hidden, kv_dim],
                   o_proj: [q_dim, hidden], gate_proj: [hidden, intermediate],
                   up_proj: [hidden, intermediate], down_proj: [intermediate, hidden]}
  attention_bias: true
  o_bias: false
  norms_per_layer: 2
  qk_norm: false
  mlp_activation: silu
  logit_softcap: false
  lora_target_sets: {attention: [q_proj, k_proj, v_proj, o_proj], mlp: [gate_proj, up_proj, down_proj]}
qwen3:
  linear_modules: {q_proj: [hidden, q_dim], k_proj: [hidden, kv_dim], v_proj: [hidden, kv_dim],
                   o_proj: [q_dim, hidden], gate_proj: [hidden, intermediate],
                   up_proj: [hidden, intermediate], down_proj: [intermediate, hidden]}
  attention_bias: false
  o_bias: from_attention_bias
  norms_per_layer: 2
  qk_norm: true
  mlp_activation: silu
  logit_softcap: false
  lora_target_sets: {attention: [q_proj, k_proj, v_proj, o_proj], mlp: [gate_proj, up_proj, down_proj]}
gemma2:
  linear_modules: {q_proj: [hidden, q_dim], k_proj: [hidden, kv_dim], v_proj: [hidden, kv_dim],
                   o_proj: [q_dim, hidden], gate_proj: [hidden, intermediate],
                   up_proj: [hidden, intermediate], down_proj: [intermediate, hidden]}
  attention_bias: false
  o_bias: from_attention_bias
  norms_per_layer: 4
  qk_norm: false
  mlp_activation: gelu_pytorch_tanh
  logit_softcap: true
  lora_target_sets: {attention: [q_proj, k_proj, v_proj, o_proj], mlp: [gate_proj, up_proj, down_proj]}
phi3:
  linear_modules: {qkv_proj: [hidden, qkv_dim], o_proj: [q_dim, hidden],
                   gate_up_proj: [hidden, gate_up], down_proj: [intermediate, hidden]}
  attention_bias: false
  o_bias: false
  norms_per_layer: 2
  qk_norm: false
  mlp_activation: silu
  logit_softcap: false
  lora_target_sets: {attention: [qkv_proj, o_proj], mlp: [gate_up_proj, down_proj]}
""")


class Handwritten:
    """``catalog.ModelSpec``'s formulas before issue 24, over the config.json fields and ``HANDWRITTEN``."""

    def __init__(self, config: dict):
        c = config
        self.arch = HANDWRITTEN[c["model_type"]]
        self.config = c
        self.hidden = int(c["hidden_size"])
        self.intermediate = int(c["intermediate_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        self.head_dim = int(c.get("head_dim") or self.hidden // self.heads)
        self.vocab = int(c["vocab_size"])
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.max_pos = int(c.get("max_position_embeddings") or 0)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dims = {"hidden": self.hidden, "intermediate": self.intermediate, "q_dim": q, "kv_dim": kv,
                "qkv_dim": q + 2 * kv, "gate_up": 2 * self.intermediate}
        return {name: (dims[i], dims[o]) for name, (i, o) in self.arch["linear_modules"].items()}

    @property
    def qkv_bias(self) -> bool:
        return bool(self.config.get("attention_bias", self.arch.get("attention_bias", False)))

    @property
    def o_bias(self) -> bool:
        rule = self.arch.get("o_bias", False)
        return self.qkv_bias if rule == "from_attention_bias" else bool(rule)

    def layer_bias_params(self) -> dict[str, int]:
        out = {}
        for name, (_, o) in self.linear_shapes().items():
            if name in ("q_proj", "k_proj", "v_proj", "qkv_proj") and self.qkv_bias:
                out[name] = o
            elif name == "o_proj" and self.o_bias:
                out[name] = o
        return out

    def layer_norm_params(self) -> int:
        n = self.arch.get("norms_per_layer", 2) * self.hidden
        if self.arch.get("qk_norm"):
            n += 2 * self.head_dim
        return n

    def layer_linear_params(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def layer_params(self) -> int:
        return self.layer_linear_params() + sum(self.layer_bias_params().values()) + self.layer_norm_params()

    def count_params(self) -> int:
        emb = self.vocab * self.hidden
        return emb + self.layers * self.layer_params() + self.hidden + (0 if self.tied else emb)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


DENSE = [k for k, e in model_catalog().items() if e["config"]["model_type"] in HANDWRITTEN]


def test_every_dense_catalog_model_is_compared():
    assert len(DENSE) == 23  # Qwen2-7B-Instruct (the GRPO notebook's model) among them


@pytest.mark.parametrize("key", DENSE)
def test_derived_description_equals_the_handwritten_one(key):
    old = Handwritten(model_catalog()[key]["config"])
    new = resolve_model(key)
    assert new.description.homogeneous and not new.is_moe
    # the spec's fields
    assert (new.hidden_size, new.intermediate_size, new.num_layers, new.num_heads, new.num_kv_heads, new.head_dim,
            new.vocab_size, new.tie_word_embeddings, new.max_position_embeddings) == (
        old.hidden, old.intermediate, old.layers, old.heads, old.kv_heads, old.head_dim, old.vocab, old.tied,
        old.max_pos)
    # the shapes, in the same order (exports list LoRA targets in this order)
    assert list(new.linear_shapes().items()) == list(old.linear_shapes().items())
    assert new.layer_bias_params() == old.layer_bias_params()
    assert (new.qkv_bias, new.o_bias) == (old.qkv_bias, old.o_bias)
    assert new.layer_norm_params() == old.layer_norm_params()
    assert new.layer_linear_params() == old.layer_linear_params()
    assert new.layer_params() == old.layer_params()
    assert new.count_params() == old.count_params() == new.params_total
    assert new.embedding_params == old.vocab * old.hidden
    assert new.lm_head_params == (0 if old.tied else old.vocab * old.hidden)
    # what the ledger and the search read by architecture
    for fact in ("norms_per_layer", "qk_norm", "mlp_activation", "logit_softcap", "lora_target_sets"):
        assert new.arch[fact] == old.arch[fact], fact
    # the cache per token: every layer's growth, as the dense formula 2 x L x kv heads x head dim x 2 B
    assert new.description.kv_bytes_per_token_uncapped() == old.kv_bytes_per_token()
    from advisor.memory.inference import kv_cache_bytes_per_token

    assert kv_cache_bytes_per_token(new) == old.kv_bytes_per_token()
