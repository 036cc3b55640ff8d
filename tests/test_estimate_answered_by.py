"""`advisor estimate` on any architecture transformers knows: a local config.json of a model type the catalog has
never held answers, and the output says whether the closed form or the simulation answered (and why)."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.memory.closed_form import closed_form_describes

GRANITEMOE = {"model_type": "granitemoe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
              "vocab_size": 512, "max_position_embeddings": 2048, "tie_word_embeddings": True}
SMOLLM3 = {"model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048,
           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "sliding_window": 64,
          "max_position_embeddings": 2048}
QWEN3_5 = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                           "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 2,
                           "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                           "vocab_size": 512, "max_position_embeddings": 2048},
           "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                             "out_hidden_size": 64}}
"""A tiny synthetic Qwen3.5 (transformers qwen3_5: Gated DeltaNet layers, three of four, then gated attention),
not a checkpoint (the catalog holds the dense sizes' language models since issue 31; this is a local directory)."""


def _local(tmp_path, name, config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def _estimate(capsys, *args) -> dict:
    code = main(["estimate", *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_a_mixture_of_experts_never_in_the_catalog_is_answered_by_the_simulation(tmp_path, capsys):
    pytest.importorskip("torch")
    d = _estimate(capsys, "--model", _local(tmp_path, "tiny-granitemoe", GRANITEMOE), "--seq-len", "64",
                  "--gpu-budget", "8GB")
    assert d["answered_by"] == "simulation" and "mixture of experts" in d["answered_by_reason"]
    assert d["backend"] == "simulate" and d["model"]["source"] == "local" and d["peak_bytes"] > 0
    assert d["fits"] is True and d["ledger"]["weights"] > 0
    # the step-time model times routed experts (advisor/speed/experts.py): its speed is predicted all the same
    assert d["tokens_per_s"] > 0 and d["throughput"]["source"] == "predicted"


def test_qwen3_5s_hybrid_linear_attention_is_answered_by_the_simulation(tmp_path, capsys):
    pytest.importorskip("torch")
    spec = resolve_model(_local(tmp_path, "tiny-qwen3.5", QWEN3_5))
    assert [layer.attention for layer in spec.description.layers] == ["linear", "linear", "linear", "full"]
    d = _estimate(capsys, "--model", str(tmp_path / "tiny-qwen3.5"), "--method", "lora", "--seq-len", "64",
                  "--gpu-budget", "8GB")
    assert d["answered_by"] == "simulation" and "linear-attention layers (3 of 4" in d["answered_by_reason"]
    assert d["peak_bytes"] > 0 and d["fits"] is True


def test_a_dense_architecture_never_in_the_catalog_is_answered_by_the_closed_form(tmp_path, capsys):
    pytest.importorskip("torch")
    d = _estimate(capsys, "--model", _local(tmp_path, "tiny-smollm3", SMOLLM3), "--seq-len", "64")
    assert d["answered_by"] == "closed form" and d["backend"] == "estimate"


def test_a_sliding_window_past_the_sequence_is_still_the_closed_forms(tmp_path, capsys):
    pytest.importorskip("torch")
    model = _local(tmp_path, "tiny-gemma3", GEMMA3)
    short = _estimate(capsys, "--model", model, "--seq-len", "32")
    long = _estimate(capsys, "--model", model, "--seq-len", "128")
    # past the window the sliding layers' explicit masks are counted: the closed form answers both
    assert short["answered_by"] == long["answered_by"] == "closed form"
    assert long["tensor_peak_bytes"] > short["tensor_peak_bytes"]


def test_a_catalog_moe_and_the_human_output_say_who_answered(capsys):
    assert main(["estimate", "--model", "olmoe", "--seq-len", "128", "--gradient-checkpointing"]) == 0
    out = capsys.readouterr().out
    assert "answered by the closed form" in out and "mixture of experts" in out
    pytest.importorskip("torch")
    # a lever the mixture-of-experts closed form has no terms for: the simulation answers, and says why
    assert main(["estimate", "--model", "deepseek-v2-lite", "--seq-len", "128", "--gradient-checkpointing",
                 "--attn-impl", "eager"]) == 0
    out = capsys.readouterr().out
    assert "answered by the simulation" in out and "eager latent attention" in out


def test_the_closed_form_still_answers_the_dense_catalog(capsys):
    d = _estimate(capsys, "--model", "qwen7b")
    assert d["answered_by"] == "closed form" and d["backend"] == "estimate"
    simulated = _estimate(capsys, "--model", "qwen0.5b", "--backend", "simulate", "--seq-len", "64") \
        if _has_torch() else None
    if simulated is not None:
        assert simulated["answered_by"] == "simulation"


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("key,describes", [("qwen30b-a3b", True), ("qwen3-235b-a22b", True), ("gpt-oss-20b", True),
                                          ("gpt-oss-120b", True), ("deepseek-v2-lite", True), ("mixtral", True),
                                          ("olmoe", True), ("qwen3-next", False)])
def test_the_rule_answers_the_covered_moe_families_by_the_closed_form(key, describes):
    """The mixture-of-experts closed form (advisor.memory.experts) covers Qwen3-MoE, gpt-oss, DeepSeek-V2-Lite,
    Mixtral and OLMoE; Qwen3-Next's linear attention stays with the simulation."""
    got, why = closed_form_describes(resolve_model(key), Plan())
    assert got is describes and why
    if not describes:
        assert "qwen3_next" in why


@pytest.mark.parametrize("plan,word", [(Plan(method="full", optimizer="adalomo"), "AdaLomo"),
                                       (Plan(attn_impl="eager"), "eager latent attention")])
def test_levers_the_moe_closed_form_has_no_terms_for_go_to_the_simulation(plan, word):
    model = "deepseek-v2-lite" if plan.attn_impl == "eager" else "qwen30b-a3b"
    describes, why = closed_form_describes(resolve_model(model), plan)
    assert not describes and word in why


@pytest.mark.parametrize("plan", [Plan(optimizer="adafactor"), Plan(activation_offload=True),
                                  Plan(method="lora", quantization="int8"), Plan(offload="zero2_cpu"),
                                  Plan(loss="fused-linear"), Plan(method="lora", dora=True)])
def test_the_dense_levers_are_the_moe_closed_forms_too(plan):
    assert closed_form_describes(resolve_model("qwen30b-a3b"), plan)[0]


@pytest.mark.parametrize("key,seq", [("gemma-3-4b", 512), ("gemma-3-4b", 1024), ("gemma-2-9b", 2048),
                                     ("gemma-2-9b", 4096), ("llama-3.1-8b-instruct", 8192)])
def test_the_rule_on_dense_models(key, seq):
    """Sliding windows at any sequence, past the window too (their masks counted: training.sliding_mask_bytes)."""
    assert closed_form_describes(resolve_model(key), Plan(seq_len=seq))[0]


def test_the_rule_imports_no_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from advisor.core.catalog import resolve_model; from advisor.memory.closed_form import "
            "closed_form_describes; print(closed_form_describes(resolve_model('qwen30b-a3b'))[0], "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.stdout.split() == ["True", "False"]


def test_preflight_says_who_answered_its_memory_check(tmp_path):
    """`advisor preflight --backend estimate` on a config of a mixture of experts: the simulation answered."""
    pytest.importorskip("torch")
    from advisor.configs.export import export_plan
    from cli_run import advisor_json

    spec = resolve_model(_local(tmp_path, "tiny-granitemoe", GRANITEMOE))
    path = export_plan(spec, Plan(method="lora", seq_len=64, lora_dropout=0.0), tmp_path / "out",
                       formats=["advisor"])["advisor"]
    _, d, err = advisor_json("preflight", path, "--backend", "estimate", "--gpu-budget", "8GB", "--json")
    assert d["verdict"] == "GO" and d["answered_by"] == "simulation", err[-2000:]
    assert "mixture of experts" in d["answered_by_reason"]
