"""The step-time model (advisor/speed): each term moves the way its citation says."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.speed.inputs import StepInputs, constant_entries, lever_row_problems
from advisor.speed.kernels import attention_seconds, gemm_seconds
from advisor.speed.terms import TERMS
from advisor.speed.throughput import ThroughputPrediction, predict_throughput, step_flops

QWEN = resolve_model("qwen2.5-7b-instruct")
A100 = resolve_gpu("a100-80gb")


def terms(plan: Plan, model=QWEN, gpu=A100, **kw) -> dict[str, float]:
    return predict_throughput(model, plan, gpu, **kw).terms


def s_of(plan: Plan, model=QWEN, gpu=A100) -> StepInputs:
    return StepInputs(model, plan, gpu)


def test_terms_add_up_and_existing_fields_stay():
    plan = Plan(method="lora", micro_batch=2, seq_len=1024, grad_accum=4, gradient_checkpointing=True)
    tp = predict_throughput(QWEN, plan, A100)
    assert isinstance(tp, ThroughputPrediction)
    assert sum(tp.terms.values()) == pytest.approx(tp.step_seconds)
    assert tp.tokens_per_s == pytest.approx(plan.tokens_per_step / tp.step_seconds)
    assert set(tp.terms) == {t.name for t in TERMS}
    for f in ("compute_seconds", "memory_seconds", "dequant_seconds", "optimizer_seconds", "offload_seconds",
              "comm_seconds", "flops_per_step"):
        assert getattr(tp, f) >= 0
    assert tp.source == "predicted" and tp.gpu == A100.name
    json.dumps(tp.to_dict())
    two = predict_throughput(QWEN, plan, A100, gpus=2, sharding="ddp")
    assert two.tokens_per_s == pytest.approx(2 * plan.tokens_per_step / two.step_seconds)


def test_small_m_reaches_less_of_the_peak():
    # NVIDIA matmul guide: a small dimension leaves tiles idle; seconds per FLOP rise as M shrinks
    s = s_of(Plan())
    per_flop = {m: gemm_seconds(s, m, 4096, 4096) / (2 * m * 4096 * 4096) for m in (64, 256, 4096)}
    assert per_flop[64] > per_flop[256] > per_flop[4096]


def test_narrow_lora_matmul_reaches_far_less_of_the_peak():
    s = s_of(Plan())
    M, K, r = 8192, 4096, 16
    t = gemm_seconds(s, M, r, K)
    assert t >= 2 * (M * K + K * r + M * r) / s.mem_bw  # at least the time to read its M x K input
    assert t / (2 * M * r * K) > 5 * gemm_seconds(s, M, K, K) / (2 * M * K * K)


def test_checkpointing_adds_recompute():
    base = Plan(method="lora", seq_len=1024, micro_batch=4)
    off, on = terms(base), terms(base.with_(gradient_checkpointing=True))
    assert off["recompute"] == 0 and on["recompute"] > 0
    # Chen et al.: one more forward of every layer, i.e. less than the forward + backward matmuls
    assert on["recompute"] < on["matmul"]
    assert step_flops(QWEN, base.with_(gradient_checkpointing=True)) > step_flops(QWEN, base)


def test_partial_checkpointing_recomputes_a_share():
    half = QWEN.num_layers // 2
    full = terms(Plan(gradient_checkpointing=True))["recompute"]
    part = terms(Plan(gradient_checkpointing=True, checkpoint_layers=half))["recompute"]
    assert part == pytest.approx(full * half / QWEN.num_layers)


def test_fused_optimizer_cheaper_than_foreach_and_8bit_cheaper_still():
    full = Plan(method="full", seq_len=512)
    foreach = terms(full)["optimizer"]
    fused = terms(full.with_(optimizer="adamw_torch_fused"))["optimizer"]
    eight = terms(full.with_(optimizer="adamw_8bit"))["optimizer"]
    assert fused < foreach and eight < foreach
    # foreach AdamW moves ~20 bytes per 2-byte trainable value, fused 7 (torch adamw.py)
    assert foreach / fused == pytest.approx((20 + 3) / (7 + 3), rel=0.05)


def test_an_optimizer_without_a_row_is_an_error_not_adamws_speed():
    full = Plan(method="full", seq_len=512)
    with pytest.raises(AdvisorInputError, match="--optimizer: no step-time term"):
        terms(full.with_(optimizer="some_new_optimizer"))
    with pytest.raises(AdvisorInputError, match="--attn-impl: no step-time term"):
        attention_seconds(s_of(Plan(attn_impl="flex_attention")))


def test_every_value_of_a_lever_table_has_its_own_row_when_throughput_yaml_loads():
    entries = copy.deepcopy(constant_entries())
    assert lever_row_problems(entries) == []
    del entries["optimizer_bytes_per_param"]["value"]["lomo"]
    entries["attention_efficiency"]["value"]["flex_attention"] = {"forward": 0.5, "backward": 0.5}
    assert [e.where for e in lever_row_problems(entries)] == [
        "throughput.yaml: optimizer_bytes_per_param.lomo", "throughput.yaml: attention_efficiency.flex_attention"]


def test_attention_by_implementation_and_sequence():
    short, long_ = Plan(seq_len=1024), Plan(seq_len=8192)
    f_short, f_long = (sum(attention_seconds(s_of(p))) for p in (short, long_))
    # s^2 FLOPs (x64), each FLOP cheaper at long sequences (Dao 2023 fig. 4): between 32x and 64x
    assert 32 < f_long / f_short < 64
    eager = sum(attention_seconds(s_of(long_.with_(attn_impl="eager"))))
    assert eager > 2 * f_long  # no causal skipping, scores through memory
    assert sum(attention_seconds(s_of(long_.with_(attn_impl="flash_attention_2")))) == pytest.approx(f_long)


def test_loss_scales_with_the_vocabulary():
    plan = Plan(seq_len=1024, micro_batch=4)
    small = replace(QWEN, vocab_size=QWEN.vocab_size // 4)
    assert terms(plan)["loss"] == pytest.approx(4 * terms(plan, model=small)["loss"])


def test_dequantization_only_for_quantized_bases():
    lora = Plan(method="lora", seq_len=1024)
    assert terms(lora)["dequant"] == 0
    assert terms(lora.with_(method="qlora", quantization="nf4"))["dequant"] > 0
    assert terms(lora.with_(quantization="int8"))["dequant"] > 0


def test_4bit_dequantization_is_paid_per_micro_batch_not_per_token():
    # bitsandbytes MatMul4Bit dequantizes each whole weight once per pass, whatever the rows
    qlora = Plan(method="qlora", quantization="nf4", seq_len=512, micro_batch=1, grad_accum=4)
    short, long_ = terms(qlora), terms(qlora.with_(seq_len=4096, micro_batch=2))
    assert short["dequant"] > 0 and short["dequant"] == pytest.approx(long_["dequant"])
    s = s_of(qlora)
    per_pass = sum(i * o for i, o in s.shapes.values()) * (0.5 + 4 / 64 + 2)  # packed + fp32 absmax + bf16 write
    expected = 2 * QWEN.num_layers * per_pass / (A100.mem_bw_gbs * 1e9 * s.k["dequant_4bit_bandwidth_efficiency"])
    assert short["dequant"] == pytest.approx(qlora.grad_accum * expected)


def test_qlora_gap_closes_as_a_micro_batch_holds_more_tokens():
    lora = Plan(method="lora", gradient_checkpointing=True, grad_accum=4)
    qlora = lora.with_(method="qlora", quantization="nf4", double_quant=True)

    def ratio(mb, seq):
        shape = dict(micro_batch=mb, seq_len=seq)
        return (predict_throughput(QWEN, qlora.with_(**shape), A100).tokens_per_s
                / predict_throughput(QWEN, lora.with_(**shape), A100).tokens_per_s)

    r = [ratio(1, 512), ratio(1, 2048), ratio(2, 4096), ratio(8, 2048)]
    assert r == sorted(r) and r[0] < 0.5 and r[-1] > 0.9


def test_checkpointing_dequantizes_once_more_and_double_quant_moves_more_bytes():
    qlora = Plan(method="qlora", quantization="nf4", seq_len=1024)
    plain, ckpt = terms(qlora), terms(qlora.with_(gradient_checkpointing=True))
    lora_ckpt = terms(qlora.with_(method="lora", quantization="none", gradient_checkpointing=True))
    assert ckpt["dequant"] == pytest.approx(plain["dequant"])
    # the recomputed forward of a 4-bit layer is its bf16 forward plus one dequantization pass
    assert ckpt["recompute"] - lora_ckpt["recompute"] == pytest.approx(ckpt["dequant"] / 2, rel=0.02)
    assert terms(qlora.with_(double_quant=True))["dequant"] > plain["dequant"]
    assert terms(qlora.with_(quantization="fp4"))["dequant"] == pytest.approx(plain["dequant"])


def test_4bit_dequantization_is_slower_on_a_card_with_less_bandwidth():
    qlora = Plan(method="qlora", quantization="nf4", seq_len=1024)
    t4 = resolve_gpu("t4")
    assert terms(qlora, gpu=t4)["dequant"] == pytest.approx(
        terms(qlora)["dequant"] * A100.mem_bw_gbs / t4.mem_bw_gbs)


def test_launch_overhead_dominates_short_micro_batches():
    tiny, big = Plan(seq_len=128, micro_batch=1), Plan(seq_len=2048, micro_batch=4)
    t_tiny, t_big = terms(tiny), terms(big)
    assert t_tiny["launch_overhead"] == pytest.approx(t_big["launch_overhead"])  # per micro-batch, not per token
    assert t_tiny["launch_overhead"] / sum(t_tiny.values()) > t_big["launch_overhead"] / sum(t_big.values())
    assert predict_throughput(QWEN, tiny, A100).tokens_per_s < predict_throughput(QWEN, big, A100).tokens_per_s


def test_more_lora_targets_and_dropout_cost_time():
    few = Plan(method="lora", lora_targets=("q_proj", "v_proj"), lora_dropout=0.0, seq_len=1024)
    assert terms(few.with_(lora_targets="all-linear"))["lora"] > terms(few)["lora"]
    assert terms(few.with_(lora_dropout=0.1))["lora"] > terms(few)["lora"]


def test_gradient_accumulation_costs_per_extra_micro_batch():
    full = Plan(method="full", seq_len=512)
    assert terms(full)["grad_accumulation"] == 0
    assert terms(full.with_(grad_accum=4))["grad_accumulation"] > 0


def test_offload_moves_the_update_to_the_host_link():
    full = Plan(method="full", seq_len=512)
    off = terms(full.with_(offload="zero2_cpu"))
    assert off["optimizer"] == 0 and off["offload"] > 0
    assert terms(full.with_(offload="zero3_cpu"))["offload"] > off["offload"]


def test_collectives_only_with_several_gpus():
    full = Plan(method="full", seq_len=512, micro_batch=4)
    assert terms(full)["collectives"] == 0
    z3 = terms(full, gpus=4, sharding="zero3")["collectives"]
    ddp = terms(full, gpus=4, sharding="ddp")["collectives"]
    assert z3 > ddp > 0  # parameters gathered every pass vs one gradient all-reduce per step


def test_power_limited_card_capped_at_its_sustained_rate():
    t4 = resolve_gpu("t4")
    if not getattr(t4, "sustained_tflops", None):
        pytest.skip("no sustained figure for the T4 in this catalog")
    s = StepInputs(QWEN, Plan(precision="fp16"), t4)
    assert s.matmul_flops <= t4.sustained_tflops * 1e12


def test_faster_gpu_is_faster():
    plan = Plan(method="lora", seq_len=2048, micro_batch=2)
    speeds = [predict_throughput(QWEN, plan, resolve_gpu(g)).tokens_per_s
              for g in ("t4", "l4", "a100-80gb", "h100-sxm")]
    assert speeds == sorted(speeds)


def test_newer_levers_cost_what_they_move():
    full = Plan(method="full", seq_len=512)
    base = terms(full)
    assert base["low_rank_projection"] == base["activation_offload"] == base["paged_spill"] == 0
    if "optim_rank" in Plan.__dataclass_fields__:
        galore = terms(full.with_(optimizer="galore_adamw"))
        assert galore["low_rank_projection"] > 0
    if "activation_offload" in Plan.__dataclass_fields__:
        ckpt = Plan(method="lora", seq_len=2048, micro_batch=4, gradient_checkpointing=True)
        assert terms(ckpt.with_(activation_offload=True))["activation_offload"] > 0
    if "optimizer_in_backward" in Plan.__dataclass_fields__:
        # no separate gradient-norm pass over the gradients
        assert terms(full.with_(optimizer_in_backward=True))["optimizer"] < base["optimizer"]


def test_dora_costs_more_than_lora():
    lora = Plan(method="lora", seq_len=1024, micro_batch=2, lora_dropout=0.0)
    assert terms(lora.with_(dora=True))["lora"] > terms(lora)["lora"]
    # with dropout peft runs the base matmul a second time
    assert terms(lora.with_(dora=True, lora_dropout=0.1))["lora"] > terms(lora.with_(dora=True))["lora"]


def test_every_gpu_and_constant_says_where_it_comes_from():
    from advisor.core.catalog import gpu_catalog
    from advisor.speed.inputs import constant_entries

    for key, entry in gpu_catalog().items():
        assert entry["source"] and "nvlink_gbs" in entry and "tdp_w" in entry, key
        if entry.get("sustained_tflops"):
            assert entry["sustained_source"] and entry["sustained_tflops"] < entry["fp16_tflops"], key
    for name, entry in constant_entries().items():
        assert set(entry) == {"value", "fitted", "source"} and len(entry["source"]) > 20, name
    assert {n for n, e in constant_entries().items() if e["fitted"]} == {
        "matmul_efficiency", "cpu_seconds_per_op", "dequant_4bit_bandwidth_efficiency"}


class _Profile:
    """A data profile as the tuner passes it (documents of known lengths)."""

    lengths = [100, 300, 500, 1000]

    def expected_padded(self, seq_len, micro_batch):
        return min(seq_len, 1000 if micro_batch > 1 else 475)

    def mean_tokens(self, seq_len):
        return sum(min(n, seq_len) for n in self.lengths) / len(self.lengths)


def test_a_data_profile_counts_real_tokens_and_packed_attention_per_document():
    plan = Plan(method="lora", micro_batch=4, seq_len=2048)
    padded = predict_throughput(QWEN, plan, A100, data=_Profile())
    assert padded.real_token_fraction == pytest.approx(475 / 1000)
    at_1000 = predict_throughput(QWEN, plan.with_(seq_len=1000), A100)
    assert padded.tokens_per_s == pytest.approx(at_1000.tokens_per_s * 475 / 1000)
    # flash varlen runs each document's own block; sdpa's block-diagonal mask costs the whole seq^2 (documents or not)
    flash = plan.with_(packing=True, attn_impl="flash_attention_2")
    packed = predict_throughput(QWEN, flash, A100, data=_Profile())
    plain = predict_throughput(QWEN, flash, A100)
    assert packed.terms["attention"] < plain.terms["attention"] and packed.real_token_fraction == 1.0
    sdpa = predict_throughput(QWEN, plan.with_(packing=True), A100, data=_Profile())
    assert sdpa.terms["attention"] == predict_throughput(QWEN, plan.with_(packing=True), A100).terms["attention"]


def test_mixed_precision_casts_every_fp32_weight_each_forward():
    """torch autocast casts each fp32 linear weight to bf16 when its matmul runs (read 4 B, write 2); the
    recomputation of checkpointed layers casts again; DeepSpeed and FSDP hold the weights in bf16 already."""
    lora = Plan(method="lora", seq_len=1024)
    mixed = terms(lora.with_(precision="mixed_bf16"))
    assert terms(lora)["autocast_cast"] == 0 and mixed["matmul"] == terms(lora)["matmul"]
    s = s_of(lora.with_(precision="mixed_bf16"))
    weights = (sum(QWEN.num_layers * i * o for i, o in QWEN.linear_shapes().values())
               + QWEN.vocab_size * QWEN.hidden_size)
    assert mixed["autocast_cast"] == pytest.approx(weights * 6 / s.mem_bw, rel=0.02)
    ckpt = terms(lora.with_(precision="mixed_bf16", gradient_checkpointing=True))
    assert ckpt["recompute"] > terms(lora.with_(gradient_checkpointing=True))["recompute"]
    sharded = terms(Plan(method="full", precision="mixed_bf16"), gpus=2, sharding="zero3")
    assert sharded["autocast_cast"] == 0
    assert terms(Plan(method="full", precision="mixed_bf16"), gpus=2, sharding="ddp")["autocast_cast"] > 0
