"""The step-time model on mixtures of experts and the new attention kinds (advisor/speed/experts.py, layers.py,
kernels.py): each term moves the way its citation says."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.speed.experts import (expected_max_load, expert_loads, experts_gemm_seconds, grouped_gemm_seconds,
                                   routed_rows)
from advisor.speed.inputs import StepInputs
from advisor.speed.kernels import attended_keys, attention_dims, attention_seconds, gemm_seconds
from advisor.speed.layers import describes, layer_kinds
from advisor.speed.throughput import predict_throughput, step_flops

A100, H100, T4 = resolve_gpu("a100-80gb"), resolve_gpu("h100-sxm"), resolve_gpu("t4")
QWEN_MOE = resolve_model("qwen3-30b-a3b")
LORA = Plan(method="lora", seq_len=2048, gradient_checkpointing=True)


def s_of(plan: Plan, model=QWEN_MOE, gpu=H100) -> StepInputs:
    return StepInputs(model, plan, gpu)


def test_layer_kinds_follow_the_description():
    kinds = layer_kinds(QWEN_MOE)
    assert len(kinds) == 1 and kinds[0].count == 48 and kinds[0].experts.num_experts == 128
    assert kinds[0].experts.top_k == 8 and kinds[0].mlp_width == 0
    assert [g.name for g in kinds[0].experts.gemms] == ["gate_up_proj", "down_proj"]
    ds = layer_kinds(resolve_model("deepseek-v2-lite"))  # dense first layer, then 26 routed ones with shared experts
    assert [(k.count, k.mlp_width, k.shared_width, k.is_moe) for k in ds] == [(1, 10944, 0, False), (26, 0, 2816, True)]
    assert ds[1].experts.router_bytes == 4  # the router is kept in fp32
    nxt = layer_kinds(resolve_model("qwen3-next"))
    assert [(k.attention, k.count) for k in nxt] == [("linear", 36), ("full", 12)]
    assert nxt[1].attention_gated and nxt[0].shared_gate
    gemma = layer_kinds(resolve_model("gemma-3-4b"))
    assert [(k.attention, k.window, k.count) for k in gemma] == [("sliding", 1024, 29), ("full", None, 5)]


def test_every_catalog_model_is_described_and_predicted():
    from advisor.core.catalog import model_catalog

    for key in model_catalog():
        m = resolve_model(key)
        ok, why = describes(m)
        assert ok, (key, why)
        plan = Plan(method="lora", lora_targets="all-linear", lora_dropout=0.0, seq_len=1024,
                    attn_impl="sdpa" if m.supports_attention("sdpa") else "eager")
        tp = predict_throughput(m, plan, A100)
        assert tp.tokens_per_s > 0 and math.isfinite(tp.step_seconds), key


def test_expert_loads_are_the_binomial_of_a_uniform_router():
    loads = expert_loads(2048 * 8, 128)  # 128 rows per expert on average (the figure)
    assert sum(loads) / len(loads) == pytest.approx(128, abs=1)
    sd = math.sqrt(2048 * 8 / 128 * (1 - 1 / 128))
    assert max(loads) - min(loads) == pytest.approx(2 * 2.15 * sd, rel=0.15)  # ~ the 1.6% and 98.4% quantiles
    few = expert_loads(64 * 2, 128)  # one row per expert on average: a third of the experts get none
    assert few.count(0) / len(few) == pytest.approx((1 - 1 / 128) ** 128, abs=0.04)
    # the busiest of 128 experts (expert parallelism waits for it): mean + sqrt(2 mean ln E) (Raab & Steger)
    assert expected_max_load(16384, 128) == pytest.approx(128 + math.sqrt(2 * 128 * math.log(128)))


def test_grouped_matmul_at_per_expert_rows_is_slower_than_one_large_matmul():
    # the same FLOPs as one 16,384-row GEMM, but each expert sees ~128 rows: the shape rule at small M (NVIDIA guide)
    s = s_of(LORA)
    R, E, n, k = 2048 * 8, 128, 1536, 2048
    grouped = grouped_gemm_seconds(s, R, E, n, k, "fwd")
    dense = gemm_seconds(s, R, n, k)
    assert grouped > 1.5 * dense
    # the sum over experts at their own loads, against every expert at the mean load
    mean_only = E * gemm_seconds(s, R / E, n, k)
    assert grouped == pytest.approx(mean_only, rel=0.05)


def test_imbalance_costs_where_experts_idle_or_run_in_lock_step():
    s = s_of(LORA)
    # few routed rows per expert: some experts get none and skip their matmul, so the expected time is below
    # every expert at the mean load (which would read every expert's weight)
    R, E = 64 * 10, 512
    assert grouped_gemm_seconds(s, R, E, 1024, 2048, "fwd") < E * gemm_seconds(s, R / E, 1024, 2048)
    # lock step (expert parallelism): the busiest expert's load over the mean grows with the expert count
    assert expected_max_load(16384, 128) / 128 > expected_max_load(16384, 8) / 2048


def test_flops_follow_the_routed_tokens_and_weights_all_experts():
    full = Plan(method="full", seq_len=2048)
    flops_per_token = step_flops(QWEN_MOE, full) / full.tokens_per_step
    # 6 x the active parameters (3.0B: attention, top-8 of 128 experts, router, head), not 6 x 30.5B, plus the
    # causal attention (2 s (d_qk + d_v) / 2 per head and layer forward, 2.5x that backward)
    active = QWEN_MOE.params_total - 48 * 120 * 3 * 2048 * 768 - QWEN_MOE.embedding_params
    attention = 48 * 2048 * 32 * (128 + 128) * (1 + 2.5)
    assert flops_per_token == pytest.approx(6 * active + attention, rel=0.01)
    assert flops_per_token < 0.2 * 6 * QWEN_MOE.params_total
    # the optimizer moves every expert's states: full fine-tuning's step costs more than LoRA's by far
    tp_full, tp_lora = (predict_throughput(QWEN_MOE, p, H100).terms["optimizer"] for p in (full, LORA))
    assert tp_full > 100 * tp_lora


def test_expert_weight_gradients_only_when_experts_train():
    lora, full = s_of(LORA), s_of(Plan(method="full", seq_len=2048))
    kind = lora.kinds[0]
    assert experts_gemm_seconds(lora, kind, "dw") == 0
    assert experts_gemm_seconds(full, kind, "dw") > 0.5 * experts_gemm_seconds(full, kind, "fwd")
    # below sm80 transformers' own loop computes them anyway (moe.py _grouped_mm_fallback_bwd)
    t4 = s_of(LORA.with_(precision="fp16"), gpu=T4)
    assert t4.experts_path == "transformers_loop" and experts_gemm_seconds(t4, t4.kinds[0], "dw") > 0


def test_the_card_decides_grouped_kernel_or_loop():
    assert s_of(LORA, gpu=H100).experts_path == "grouped"
    assert s_of(LORA, gpu=A100).experts_path == "loop"  # torch's _grouped_mm fallback below sm90
    assert s_of(Plan(method="full", precision="mixed_bf16"), gpu=H100).experts_path == "loop"  # fp32 experts
    # many small experts: the loop's launches show on an A100, not on the H100's one grouped kernel
    nxt = resolve_model("qwen3-next")
    a100, h100 = (predict_throughput(nxt, LORA.with_(lora_targets=("q_proj", "o_proj")), g) for g in (A100, H100))
    assert a100.terms["launch_overhead"] > 2 * h100.terms["launch_overhead"]


def test_fp32_experts_under_mixed_precision_run_without_tensor_cores():
    bf16 = s_of(Plan(method="full", seq_len=1024))
    mixed = s_of(Plan(method="full", seq_len=1024, precision="mixed_bf16"))
    assert mixed.expert_dtype == "fp32" and mixed.expert_rate_scale < 0.1
    k = bf16.kinds[0]
    assert experts_gemm_seconds(mixed, k, "fwd") > 5 * experts_gemm_seconds(bf16, k, "fwd")


def test_router_and_permutation_are_memory_traffic_per_routed_row():
    from advisor.speed.experts import experts_elementwise_bytes

    s1, s2 = s_of(LORA), s_of(LORA.with_(seq_len=4096))
    k = s1.kinds[0]
    assert experts_elementwise_bytes(s2, k) == pytest.approx(2 * experts_elementwise_bytes(s1, k))
    per_row = experts_elementwise_bytes(s1, k) / routed_rows(s1, k.experts)
    assert per_row > 7 * 2 * QWEN_MOE.hidden_size  # the permutation alone: 7 p h per routed row
    on = replace(QWEN_MOE.description.moe, output_router_logits=True)
    spec = replace(QWEN_MOE)
    spec.__dict__["description"] = replace(QWEN_MOE.description, moe=on)
    assert experts_elementwise_bytes(StepInputs(spec, LORA, H100), k) > experts_elementwise_bytes(s1, k)


def test_expert_lora_folds_the_stacks_and_takes_their_gradient():
    base = s_of(LORA)
    adapted = s_of(LORA)
    adapted.__dict__["expert_lora"] = True  # the LoRA-on-experts lever (peft target_parameters)
    from advisor.speed.terms import layer_lora_gemm_seconds

    k = base.kinds[0]
    assert layer_lora_gemm_seconds(adapted, "fwd", k) > layer_lora_gemm_seconds(base, "fwd", k)
    assert experts_gemm_seconds(adapted, k, "dw") > 0 == experts_gemm_seconds(base, k, "dw")


def test_sliding_window_attention_by_kernel():
    gemma = resolve_model("gemma-3-4b")
    sliding, full = layer_kinds(gemma)
    long_ = Plan(method="lora", seq_len=8192, attn_impl="flash_attention_2")
    s = StepInputs(gemma, long_, H100)
    # FlashAttention-2 skips the blocks outside the 1,024-token window: w(w+1)/2 + (s-w) w pairs
    assert attended_keys(s, sliding, "flash_attention_2") == pytest.approx(
        (1024 * 1025 / 2 + 7168 * 1024) / 8192 ** 2)
    assert sum(attention_seconds(s, sliding)) < 0.3 * sum(attention_seconds(s, full))
    # sdpa gets an explicit mask once the sequence reaches the window: every block, twice the causal half
    sd = StepInputs(gemma, long_.with_(attn_impl="sdpa"), H100)
    assert sum(attention_seconds(sd, sliding)) == pytest.approx(2 * sum(attention_seconds(sd, full)))
    # shorter than the window: the same as full attention
    short = StepInputs(gemma, long_.with_(seq_len=512), H100)
    assert attention_seconds(short, sliding) == attention_seconds(short, full)


def test_eager_attention_pays_the_whole_sequence_even_in_a_window():
    oss = resolve_model("gpt-oss-20b")
    s = StepInputs(oss, Plan(method="lora", seq_len=4096, attn_impl="eager"), H100)
    sliding, full = layer_kinds(oss)
    assert sliding.window == 128 and attention_seconds(s, sliding) == attention_seconds(s, full)


def test_latent_attention_uses_its_decompressed_widths():
    ds = resolve_model("deepseek-v2-lite")
    s = StepInputs(ds, Plan(method="lora", lora_targets="all-linear", lora_dropout=0.0, seq_len=4096), H100)
    heads, d_qk, d_v = attention_dims(s, s.kinds[0])
    assert (heads, d_qk, d_v) == (16, 192, 128)  # nope 128 + rope 64; the config's head_dim is the rope's 64
    assert ds.head_dim == 64
    # the latent projections are linears of the layer, counted as GEMMs
    names = s.kinds[0].names()
    assert "kv_a_proj_with_mqa" in names and "kv_b_proj" in names


def test_gated_deltanet_scan_grows_linearly_with_the_sequence():
    nxt = resolve_model("qwen3-next")
    lin, full = layer_kinds(nxt)
    t = {n: sum(attention_seconds(StepInputs(nxt, LORA.with_(seq_len=n), H100), lin)) for n in (2048, 8192)}
    f = {n: sum(attention_seconds(StepInputs(nxt, LORA.with_(seq_len=n), H100), full)) for n in (2048, 8192)}
    assert t[8192] / t[2048] == pytest.approx(4.0, rel=0.01)  # linear in tokens
    assert f[8192] / f[2048] > 8  # softmax attention: quadratic (its efficiency also rises with length)


def test_describes_refuses_what_it_has_no_term_for():
    pytest.importorskip("torch")
    from advisor.core.catalog import spec_from_config

    lfm2 = spec_from_config("tiny-lfm2", "tiny-lfm2", dict(
        model_type="lfm2", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
        layer_types=["conv", "full_attention", "conv", "full_attention"]), "test", None, None)
    ok, why = describes(lfm2)
    assert not ok and "not Gated DeltaNet" in why


def test_estimate_predicts_an_moe_and_keeps_what_it_cannot_time_unpredicted(tmp_path, capsys):
    import json

    from advisor.cli import main

    assert main(["estimate", "--model", "qwen3-30b-a3b", "--method", "qlora", "--gradient-checkpointing",
                 "--gpu", "h100-sxm", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens_per_s"] > 0 and d["throughput"]["source"] == "predicted" and "matmul" in d["step_terms"]
    pytest.importorskip("torch")
    cfg = dict(model_type="lfm2", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
               layer_types=["conv", "full_attention", "conv", "full_attention"])
    local = tmp_path / "tiny-lfm2"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(local), "--seq-len", "64", "--gpu", "a100-80gb", "--lora-targets",
                 "q_proj,v_proj", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens_per_s"] is None and d["throughput"]["source"].startswith("not predicted")
    assert "Gated DeltaNet" in d["throughput"]["source"]


def test_published_moe_speeds_are_shown_beside_the_nearest_plan_not_scored():
    from benchmark_modules import load_benchmark  # tests/benchmark_modules.py

    bench = load_benchmark("throughput_vs_published")
    rows, not_expressed = bench.moe_rows()
    by_id = {r["id"]: r for r in rows}
    # the same counting: tokens of one iteration over its GPUs and seconds
    assert by_id["swift-megatron-lora-moe-ep2"]["published"] == pytest.approx(16 * 2048 / 5.10 / 2)
    assert by_id["swift-zero3-full-moe"]["published"] == pytest.approx(16 * 8192 / 91.2 / 16)
    for r in rows:
        assert all(p["per_gpu"] > 0 for p in r["preds"].values())
        assert r["busiest_expert"] > 1.0  # the expected maximum of a multinomial load exceeds the mean
    lines = "\n".join(bench.moe_section(rows, not_expressed))
    assert "not scored" in lines and "expert parallelism" in lines and "axolotl-llama4-scout-qlora" in lines
    # the dense points keep their score (the goal: the median stays)
    dense = bench.summary(bench.evaluate(bench.load_points()))
    assert dense["n"] == 9 and dense["median"] == pytest.approx(0.144, abs=0.0005)
