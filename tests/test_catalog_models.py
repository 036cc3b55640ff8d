"""Every model catalog entry loads, and its parameter count is exact (stored description == meta build == catalog),
the mixtures of experts and the new attention schemes of issue 24 included."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import model_catalog, resolve_model
from advisor.core.errors import AdvisorInputError

KEYS = list(model_catalog())
REQUIRED = [
    "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct", "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b", "google/gemma-2-9b",
    "google/gemma-2-27b", "microsoft/Phi-3.5-mini-instruct",
    # issue 24: mixtures of experts, sliding windows, MLA, linear attention
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-20b", "openai/gpt-oss-120b",
    "mistralai/Mixtral-8x7B-v0.1", "allenai/OLMoE-1B-7B-0924", "deepseek-ai/DeepSeek-V2-Lite", "google/gemma-3-1b-pt",
    "google/gemma-3-4b-pt", "google/gemma-3-12b-pt", "google/gemma-3-27b-pt", "Qwen/Qwen3-Next-80B-A3B-Instruct",
]


def test_catalog_has_every_required_model():
    ids = {e["hf_id"] for e in model_catalog().values()}
    assert set(REQUIRED) <= ids


def test_aliases_are_unique():
    seen = {}
    for key, entry in model_catalog().items():
        for name in [key, entry["hf_id"].lower(), *entry.get("hf_variants", []), *entry["aliases"]]:
            assert name.lower() not in seen, f"{name} names both {seen[name.lower()]} and {key}"
            seen[name.lower()] = key


BASE_AND_INSTRUCT = [  # (base, instruct) hub ids as published
    ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"), ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"), ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
    ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("google/gemma-2-2b", "google/gemma-2-2b-it"), ("google/gemma-2-9b", "google/gemma-2-9b-it"),
    ("Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B"),
    ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    ("allenai/OLMoE-1B-7B-0924", "allenai/OLMoE-1B-7B-0924-Instruct"),
    ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"),
    ("google/gemma-3-1b-pt", "google/gemma-3-1b-it"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"),
    # vision-language models (Gemma 3 4B-27B -it are catalogued as vision-language, their -pt as the text decoder)
    ("Qwen/Qwen2-VL-7B", "Qwen/Qwen2-VL-7B-Instruct"), ("Qwen/Qwen2-VL-2B", "Qwen/Qwen2-VL-2B-Instruct"),
    ("Qwen/Qwen3-VL-8B-Thinking", "Qwen/Qwen3-VL-8B-Instruct"),
    ("Qwen/Qwen3-VL-30B-A3B-Thinking", "Qwen/Qwen3-VL-30B-A3B-Instruct"),
    ("llava-hf/llava-onevision-qwen2-7b-si-hf", "llava-hf/llava-onevision-qwen2-7b-ov-hf"),
    ("mistralai/Mistral-Small-3.1-24B-Base-2503", "mistralai/Mistral-Small-3.1-24B-Instruct-2503"),
]


@pytest.mark.parametrize("base,instruct", BASE_AND_INSTRUCT)
def test_base_and_instruct_ids_resolve_to_one_architecture(base, instruct):
    b, i = resolve_model(base), resolve_model(instruct)
    assert (b.hf_id, i.hf_id) == (base, instruct), "each resolves to itself: exports load the checkpoint named"
    assert b.source == i.source == "catalog"
    for f in ("model_type", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "vocab_size", "tie_word_embeddings", "params_total"):
        assert getattr(b, f) == getattr(i, f), f
    assert resolve_model(base.lower()).hf_id == base  # hub ids are case-insensitive
    assert resolve_model(b.name).hf_id == base  # a study re-resolves its model by name


@pytest.mark.parametrize("key", KEYS)
def test_stored_description_count_matches_catalog(key):
    """The stored description (advisor/data/architectures_derived.json) adds up to the catalog's count, every layer
    and category included, without importing torch."""
    spec = resolve_model(key)
    d = spec.description
    assert spec.count_params() == d.params_total == spec.params_total == model_catalog()[key]["params_total"]
    assert sum(d.params_by_category.values()) == spec.params_total
    assert (d.num_layers, d.hidden_size, d.vocab_size) == (spec.num_layers, spec.hidden_size, spec.vocab_size)


# real-size meta builds: 0.1-1 s each once transformers is imported (the first pays its lazy imports)
@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_meta_device_build_matches_catalog(key):
    import torch

    from advisor.core.architecture import build_meta_model, build_meta_vl_model

    spec = resolve_model(key)
    model = build_meta_model(spec.config)
    decoder = model.get_decoder()
    if spec.is_vision_language:  # the language model's parameters; the tower and projector are the vision facts
        head = model.get_output_embeddings()
        unique = {id(p): p for p in [*decoder.parameters(), *head.parameters()]}
        assert sum(p.numel() for p in unique.values()) == spec.params_total
        whole = build_meta_vl_model(spec.config)
        assert sum(p.numel() for p in whole.parameters()) == spec.params_total + spec.vision.params
    else:
        assert sum(p.numel() for p in model.parameters()) == spec.params_total
    # every decoder layer's linear modules are the ones the description holds
    for layer, described in zip(decoder.layers, spec.description.layers):
        linear = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        assert set(linear) == {m.name for m in described.linears}
        for m in described.linears:
            assert (linear[m.name].in_features, linear[m.name].out_features) == (m.in_features, m.out_features)
        stacked = {n: tuple(p.shape) for n, p in layer.named_parameters() if p.dim() == 3 and "conv" not in n}
        assert stacked == {e.name: e.shape for e in described.experts if len(e.shape) == 3}


VISION_LANGUAGE = [k for k, e in model_catalog().items() if "vision_config" in e["config"]]


@pytest.mark.parametrize("key", VISION_LANGUAGE)
def test_vision_language_entry_has_its_tower_and_processor(key):
    """A vision-language entry's stored description holds its tower and projector (their count is the catalog's
    ``params_vision``) and the entry its image processor's settings."""
    entry = model_catalog()[key]
    spec = resolve_model(key)
    assert spec.is_vision_language and spec.vision.params == entry["params_vision"]
    assert spec.vision.depth > 0 and spec.vision.block_linears and spec.vision.projector_params > 0
    assert spec.processor["image"]["class"] and spec.processor == entry["processor"]
    text = entry["config"].get("text_config", entry["config"])
    assert spec.hidden_size == text["hidden_size"] and spec.num_layers == text["num_hidden_layers"]


def test_vision_language_published_totals():
    """The whole model (language model + tower + projector) adds up to the hub's published totals: Qwen2.5-VL-7B's
    8.29B, Qwen3-VL-8B's 8.77B, Gemma 3 4B's 4.30B (the model cards' figures, rounded)."""
    for name, total in (("Qwen/Qwen2.5-VL-7B-Instruct", 8_292_166_656), ("Qwen/Qwen3-VL-8B-Instruct", 8_767_123_696),
                        ("google/gemma-3-4b-it", 4_300_079_472)):
        spec = resolve_model(name)
        assert spec.params_total + spec.vision.params == total, name
    qwen = resolve_model("qwen2.5-vl-7b").vision
    assert qwen.full_attention_blocks == (7, 15, 23, 31) and qwen.window_size == 112 and qwen.patch_size == 14
    assert resolve_model("qwen3-vl-8b").vision.deepstack_layers == (8, 16, 24)
    assert resolve_model("gemma-3-12b-it").vision.tokens_per_image == 256
    assert resolve_model("google/gemma-3-12b-pt").vision is None  # the text decoder's entry stays text-only


def test_internvl3_5_is_qwen3_8b_with_internvit_300m():
    """InternVL3.5-8B-HF: its language model is Qwen3-8B's (the published llm_config), its tower InternVL3's
    InternViT-300M (a 4096-wide projector): 8,528,318,464 in all, about the 8.5B published for InternVL3.5-8B."""
    spec = resolve_model("OpenGVLab/InternVL3_5-8B-HF")
    assert spec.params_total == resolve_model("Qwen/Qwen3-8B").params_total
    assert spec.vision.tower_params == resolve_model("OpenGVLab/InternVL3-8B-hf").vision.tower_params
    assert spec.params_total + spec.vision.params == 8_528_318_464


def test_llava_onevision_adds_up_with_its_image_newline():
    """LLaVA-OneVision-7B: Qwen2-7B (vocab 152128) with a 26-layer SigLIP and a 2-layer projector, plus the
    image_newline vector the model holds outside its children (counted with the projector): 8,030,807,584 (8.0B)."""
    spec = resolve_model("llava-hf/llava-onevision-qwen2-7b-ov-hf")
    assert spec.params_total + spec.vision.params == 8_030_807_584
    assert spec.vision.depth == 26 and spec.vision.image_size == 384 and spec.vision.patch_size == 14
    assert resolve_model("llava-onevision-7b").hf_id == spec.hf_id


def test_mistral_small_3_1_is_untied_24b_with_pixtral():
    """Mistral Small 3.1: 24,011,361,280 parameters, the 24B published (an untied head: written false against
    Mistral3Config's true default), a 24-layer Pixtral tower with the 2x2 patch merger in its projector."""
    spec = resolve_model("mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    assert spec.params_total + spec.vision.params == 24_011_361_280
    assert not spec.tie_word_embeddings and spec.vision.depth == 24 and spec.vision.patch_size == 14
    assert {m.in_features for m in spec.vision.projector_linears} >= {4 * 1024, 1024, 5120}


def test_smolvlm2_adds_up_with_its_tower_and_connector():
    """SmolVLM2: the 2.2B is SmolLM2-1.7B (vocab 49280, untied head) with a 27-layer SigLIP so400m and a pixel-shuffle
    connector (Linear(1152 x 3^2, 2048), no bias): 2,246,784,880 (the 2.25B published); the 500M is SmolLM2-360M
    with a 12-layer SigLIP base at 512 pixels, 4^2 patches into each token: 507,482,304. The language model is
    SmolVLMModel's ``text_model``."""
    big, small = resolve_model("smolvlm2-2.2b"), resolve_model("HuggingFaceTB/SmolVLM2-500M-Video-Instruct")
    assert big.hf_id == "HuggingFaceTB/SmolVLM2-2.2B-Instruct" and resolve_model("smolvlm2-500m").hf_id == small.hf_id
    assert big.params_total + big.vision.params == 2_246_784_880
    assert small.params_total + small.vision.params == 507_482_304
    assert (big.vision.depth, big.vision.patch_size, small.vision.depth, small.vision.patch_size) == (27, 14, 12, 16)
    assert [(m.in_features, m.out_features, m.bias) for m in big.vision.projector_linears] == [(1152 * 9, 2048, False)]
    assert not big.tie_word_embeddings and big.vision.tower_path == "model.vision_model"


def test_smolvlm_with_an_image_is_answered_by_the_simulation():
    """The closed form's vision terms do not describe SmolVLM's tiles and pixel-shuffle connector: with an image the
    simulation answers (and builds its processor batch); without one the closed form counts its weights."""
    from advisor.core.plan import Plan
    from advisor.memory.closed_form import closed_form_describes
    from advisor.runtime.simulate.vision import simulation_gap

    spec = resolve_model("smolvlm2-2.2b")
    with_image = Plan(method="lora", image_sizes=("1024x768",))
    describes, why = closed_form_describes(spec, with_image)
    assert not describes and "pixel shuffle" in why
    assert closed_form_describes(spec, Plan(method="lora"))[0]
    assert simulation_gap(spec, with_image) == ""


def test_qwen7b_facts():
    spec = resolve_model("qwen7b")
    assert spec.hf_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.params_total == 7_615_616_512
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (
        28, 3584, 28, 4, 128)


@pytest.mark.parametrize("name", ["qwen7b", "QWEN7B", "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"])
def test_resolve_by_alias_id_or_key(name):
    assert resolve_model(name).name == "qwen2.5-7b-instruct"


def test_unknown_model_suggests_close_names():
    with pytest.raises(AdvisorInputError) as e:
        resolve_model("qwen7")
    assert "--model" in str(e.value) and "qwen7b" in str(e.value)


def _write_config(d, config):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_local_directory(tmp_path):
    cfg = dict(model_catalog()["qwen2.5-0.5b-instruct"]["config"])
    d = _write_config(tmp_path / "my-model", cfg)
    spec = resolve_model(str(d))
    assert spec.source == "local" and spec.params_total == 494_032_768


def test_hub_id_found_in_local_hf_cache(tmp_path, monkeypatch):
    cfg = dict(model_catalog()["llama-3.2-1b-instruct"]["config"])
    hub = tmp_path / "hf-home" / "hub" / "models--someone--tiny-llama" / "snapshots" / "abc123"
    _write_config(hub, cfg)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    spec = resolve_model("someone/tiny-llama")
    assert spec.source == "hf-cache" and spec.params_total == 1_235_814_400


def test_broken_config_json(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    with pytest.raises(AdvisorInputError, match="--model.*not valid JSON"):
        resolve_model(str(d))


def test_config_missing_field(tmp_path):
    d = _write_config(tmp_path / "partial", {"model_type": "llama", "hidden_size": 64})
    with pytest.raises(AdvisorInputError, match="lacks the field"):
        resolve_model(str(d))


def test_remote_code_needs_flag(tmp_path):
    d = _write_config(tmp_path / "custom", {"model_type": "my_custom_arch", "auto_map": {"AutoModelForCausalLM": "x.Y"},
                                            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                            "num_attention_heads": 4, "vocab_size": 100})
    (d / "x.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(AdvisorInputError, match="--trust-remote-code"):
        resolve_model(str(d))


def test_estimate_takes_a_base_model_id(capsys):
    from advisor.cli import main

    code = main(["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--gpu-budget", "8GB", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["model"]["hf_id"] == "Qwen/Qwen2.5-0.5B" and d["model"]["params_total"] == 494_032_768


# --------------------------------------------------------------------------- issue 24's entries


@pytest.mark.parametrize("name,key", [("qwen30b-a3b", "qwen3-30b-a3b"), ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
                                      ("gpt-oss-20b", "gpt-oss-20b"), ("openai/gpt-oss-20b", "gpt-oss-20b"),
                                      ("OPENAI/GPT-OSS-120B", "gpt-oss-120b"), ("mixtral", "mixtral-8x7b-v0.1"),
                                      ("olmoe", "olmoe-1b-7b-0924"), ("deepseek-v2-lite", "deepseek-v2-lite"),
                                      ("gemma3-27b", "gemma-3-27b"), ("qwen3-next", "qwen3-next-80b-a3b-instruct")])
def test_short_aliases_and_hub_ids_of_the_new_models(name, key):
    spec = resolve_model(name)
    assert spec.source == "catalog" and spec.name in (key, model_catalog()[key]["hf_id"])


def test_qwen3_30b_a3b_is_128_experts_top_8_in_every_layer():
    spec = resolve_model("qwen30b-a3b")
    moe = spec.moe
    assert spec.is_moe and (moe.num_experts, moe.experts_per_token, moe.moe_intermediate_size) == (128, 8, 768)
    assert moe.dense_layers == () and not moe.output_router_logits
    layer = spec.description.layers[0]
    assert {e.name: e.shape for e in layer.experts} == {"mlp.experts.gate_up_proj": (128, 1536, 2048),
                                                          "mlp.experts.down_proj": (128, 2048, 768)}
    # experts are 95% of the parameters; the linears (what bitsandbytes quantizes) are attention only
    assert spec.description.params_by_category["experts"] == 48 * 128 * 3 * 2048 * 768
    assert list(spec.linear_shapes()) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert spec.arch["lora_target_sets"] == {"attention": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def test_gpt_oss_sinks_windows_and_no_sdpa():
    spec = resolve_model("gpt-oss-20b")
    d = spec.description
    assert d.attention_kinds() == {"sliding(128)": 12, "full": 12}
    assert not spec.supports_attention("sdpa") and spec.supports_attention("eager")
    assert d.attn_implementation == "eager" and spec.vocab_size == 201_088
    assert ("self_attn.sinks", (64,)) in d.layers[0].other_params
    assert all(m.bias for m in d.layers[0].linears)
    assert spec.moe.num_experts == 32 and spec.moe.experts_per_token == 4


def test_gemma2_refuses_sdpa_and_gemma3_takes_it():
    assert not resolve_model("gemma-2-9b").supports_attention("sdpa")
    g3 = resolve_model("gemma-3-4b")
    assert g3.supports_attention("sdpa") and g3.vocab_size == 262_208 and g3.tie_word_embeddings
    assert g3.description.attention_kinds() == {"sliding(1024)": 29, "full": 5}
    assert g3.arch["qk_norm"] and g3.arch["norms_per_layer"] == 4


def test_deepseek_v2_lite_mla_dense_first_layer_and_fp32_router():
    spec = resolve_model("deepseek-v2-lite")
    d = spec.description
    assert set(d.attention_kinds()) == {"mla"} and d.mla.kv_lora_rank == 512 and d.mla.qk_rope_head_dim == 64
    assert spec.moe.dense_layers == (0,) and spec.moe.shared_expert_intermediate_size == 2 * 1408
    assert d.layers[1].router_dtype == "float32" and d.keep_in_fp32_modules == ("gate.weight",)
    # the cache holds the compressed latent: (512 + 64) x 2 B per token and layer
    assert d.layers[0].cache.bytes_per_token == (512 + 64) * 2


def test_qwen3_next_three_linear_attention_layers_then_one_full():
    spec = resolve_model("qwen3-next")
    d = spec.description
    assert [layer.attention for layer in d.layers[:4]] == ["linear", "linear", "linear", "full"]
    assert d.attention_kinds() == {"linear": 36, "full": 12}
    assert not d.homogeneous
    linear = d.layers[0].cache
    assert linear.bytes_per_token == 0 and linear.fixed_bytes > 0  # a recurrent state, not a growing cache
    assert spec.moe.num_experts == 512 and spec.moe.shared_expert_intermediate_size == 512


@pytest.mark.parametrize("name,key,layers,tied", [("Qwen/Qwen3.5-0.8B", "qwen3.5-0.8b", 24, True),
                                                  ("qwen35-4b", "qwen3.5-4b", 32, True),
                                                  ("qwen/qwen3.5-9b", "qwen3.5-9b", 32, False),
                                                  ("qwen3.5-27b-text", "qwen3.5-27b", 64, False)])
def test_qwen3_5_dense_sizes_are_qwen3_nexts_pattern_with_a_dense_mlp(name, key, layers, tied):
    """Qwen3.5's language model (issue 31): three Gated DeltaNet layers then one gated-attention layer, no experts,
    a 248,320-token vocabulary; the 0.8B and 4B tie their embeddings, the 9B and 27B do not."""
    spec = resolve_model(name)
    d = spec.description
    assert spec.source == "catalog" and spec.name == key and spec.model_type == "qwen3_5_text"
    assert [layer.attention for layer in d.layers[:4]] == ["linear", "linear", "linear", "full"]
    assert d.attention_kinds() == {"linear": layers * 3 // 4, "full": layers // 4}
    assert not spec.is_moe and spec.vocab_size == 248_320 and spec.tie_word_embeddings is tied
    assert d.layers[0].cache.bytes_per_token == 0 and d.layers[0].cache.fixed_bytes > 0


def test_qwen3_5_9b_layers_match_the_count_read_off_the_checkpoint():
    """The 9B's 32 decoder layers hold 6,919,561,728 parameters and each untied embedding 1,017,118,720 (a note read
    off the Qwen3.5-9B checkpoint, cited in models.yaml): the catalog's fields rebuild them exactly."""
    spec = resolve_model("qwen3.5-9b")
    assert spec.params_total == 6_919_561_728 + 2 * 1_017_118_720 + 4096  # + the final norm


def test_gemma3_multimodal_config_json_reads_its_text_decoder(tmp_path):
    """A Gemma-3 4B config.json as published (Gemma3ForConditionalGeneration, text_config without vocab_size) reads
    as the catalog's text decoder: the same description, answered from the stored one."""
    text = dict(model_catalog()["gemma-3-4b"]["config"])
    text.pop("vocab_size")
    d = _write_config(tmp_path / "gemma-3-4b-it", {"model_type": "gemma3",
                                                   "architectures": ["Gemma3ForConditionalGeneration"],
                                                   "text_config": text, "vision_config": {"hidden_size": 1152}})
    spec = resolve_model(str(d))
    assert spec.model_type == "gemma3_text" and spec.vocab_size == 262_208
    assert spec.params_total == model_catalog()["gemma-3-4b"]["params_total"]


def test_every_catalogued_vision_family_has_a_simulated_batch():
    """The simulation builds the processor batch of every vision-language family in the catalog (LLaVA-OneVision's
    and Mistral 3's included): no plan of theirs is a simulation gap; a loss it does not trace still is."""
    from advisor.core.plan import Plan
    from advisor.runtime.simulate.vision import simulation_gap

    plan = Plan(image_sizes=("1024x768",))
    for name in ("mistral-small-3.1", "llava-onevision-7b", "qwen2.5-vl-7b", "smolvlm2-2.2b"):
        assert simulation_gap(resolve_model(name), plan) == ""
    assert "loss" in simulation_gap(resolve_model("llava-onevision-7b"), plan.with_(loss="fused-linear"))
    assert simulation_gap(resolve_model("internvl3.5-8b"), plan) == ""
