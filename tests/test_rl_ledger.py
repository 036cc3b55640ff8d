"""GRPO and DPO in the closed form (advisor.memory.rl): what each phase holds, and what stays resident across phases
by vLLM's sleep level and by the kind of reference; the Plan's GRPO/DPO rules as one-line errors naming the flag."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan, canonical, rl_problems
from advisor.memory.inference import kv_cache_bytes_per_token
from advisor.memory.rl import rl_run_phases
from advisor.memory.rl import fused_head_bytes, generation_of, step_plan
from advisor.memory.sharding import shard_report
from advisor.memory.rl import step_ledger as estimate_training

QWEN05 = resolve_model("qwen0.5b")
QWEN7 = resolve_model("qwen7b")
A100 = resolve_gpu("a100-80gb")
T4 = resolve_gpu("t4")
GRPO = Plan(task="grpo", method="lora", micro_batch=8, max_prompt_length=256, max_completion_length=512)
COLOCATE = GRPO.with_(generation="vllm-colocate", vllm_gpu_memory_utilization=0.4)
DPO = Plan(task="dpo", method="lora", seq_len=1024, micro_batch=2)


def phases(model, plan, gpu):
    return rl_run_phases(model, plan, gpu, estimate_training(model, plan, gpu)).phases


def dev(report, category):
    return report.device.get(category, 0)


# ------------------------------------------------------------------------------------------------ generation


def test_generate_holds_the_kv_cache_of_the_generation_batch_at_full_length():
    plan = GRPO.with_(grad_accum=2, steps_per_generation=2)
    gen = generation_of(QWEN7, plan, A100)
    per_token = kv_cache_bytes_per_token(QWEN7, "bf16")
    assert per_token == 57_344  # 2 x 28 layers x 4 kv heads x 128 x 2 B
    assert gen.sequences == 16  # micro_batch x steps_per_generation: the local generation batch
    assert gen.kv_cache_bytes == per_token * 16 * (256 + 512)
    ph = phases(QWEN7, plan, A100)
    report = estimate_training(QWEN7, plan, A100)
    # generate(): the cache exists only while generating; the training step does not hold it
    assert dev(report, "kv_cache") == 0
    assert ph["generate"].live_bytes >= gen.kv_cache_bytes + dev(report, "weights")
    assert not ph["sync"].included  # generate() samples from the policy itself


def test_vllm_pool_is_utilization_times_the_card_and_kv_is_what_is_left():
    gen = generation_of(QWEN7, COLOCATE, A100)
    assert gen.pool_bytes == int(0.4 * A100.memory_bytes)
    assert gen.kv_cache_bytes == gen.pool_bytes - gen.weights_bytes - gen.activation_bytes - gen.cuda_graph_bytes \
        - gen.non_torch_bytes
    assert gen.weights_bytes >= QWEN7.params_total * 2  # vLLM's own 16-bit copy, beside the trainer's
    assert gen.kv_tokens * gen.kv_bytes_per_token <= gen.kv_cache_bytes and gen.kv_tokens % 16 == 0
    assert gen.holds_batch and gen.starts
    assert gen.batch_tokens == 8 * 768  # one generation batch: 8 completions of prompt + completion


def test_a_pool_too_small_for_the_batch_preempts_and_says_so():
    plan = COLOCATE.with_(micro_batch=64, max_completion_length=4096, vllm_gpu_memory_utilization=0.25,
                          num_generations=8)
    gen = generation_of(QWEN7, plan, A100)
    assert gen.starts and not gen.holds_batch
    assert any("preempts" in n for n in gen.notes)
    tiny = generation_of(QWEN7, COLOCATE.with_(vllm_gpu_memory_utilization=0.15), A100)
    assert not tiny.starts and any("cannot start" in n for n in tiny.notes)


def test_qlora_policy_gives_vllm_4bit_weights():
    q = COLOCATE.with_(method="qlora", quantization="nf4")
    assert generation_of(QWEN7, q, A100).weights_bytes < 0.5 * generation_of(QWEN7, COLOCATE, A100).weights_bytes


# ------------------------------------------------------------------------------------------------ residency


@pytest.mark.parametrize("level", [0, 1, 2])
def test_sleep_levels_move_the_pool_off_the_gpu_during_training(level):
    plan = COLOCATE.with_(vllm_sleep=level)
    r = estimate_training(QWEN7, plan, A100)
    gen = generation_of(QWEN7, plan, A100)
    awake = level == 0
    assert (dev(r, "vllm_weights") == gen.weights_bytes) is awake and (dev(r, "vllm_weights") == 0) is not awake
    assert (dev(r, "kv_cache") == gen.kv_cache_bytes) is awake and (dev(r, "kv_cache") == 0) is not awake
    assert dev(r, "vllm_reserve") == gen.cuda_graph_bytes + gen.non_torch_bytes  # kept at every level
    assert r.host.get("vllm_weights", 0) == (gen.weights_bytes if level == 1 else 0)
    ph = phases(QWEN7, plan, A100)
    # generation wakes the whole pool whatever the level
    assert ph["generate"].live_bytes >= gen.pool_bytes + dev(r, "weights")


def test_sleeping_lowers_the_training_phase_and_not_generation():
    awake, asleep = (phases(QWEN7, COLOCATE.with_(vllm_sleep=s), A100) for s in (0, 2))
    assert asleep["train"].live_bytes < awake["train"].live_bytes
    assert asleep["score"].live_bytes < awake["score"].live_bytes
    assert asleep["generate"].live_bytes == awake["generate"].live_bytes


def test_vllm_server_holds_nothing_of_vllm_on_the_training_gpu():
    plan = GRPO.with_(generation="vllm-server", vllm_gpus=2)
    r = estimate_training(QWEN7, plan, A100)
    assert all(dev(r, c) == 0 for c in ("vllm_weights", "kv_cache", "vllm_reserve"))
    gen = generation_of(QWEN7, plan, A100)
    assert gen.gpus == 2 and gen.weights_bytes == generation_of(QWEN7, plan.with_(vllm_gpus=1), A100).weights_bytes // 2


def test_reference_kinds_move_the_reference_weights():
    beta = dict(beta=0.04)
    full = estimate_training(QWEN05, GRPO.with_(method="full", reference="copy", **beta), A100)
    assert dev(full, "reference_weights") == QWEN05.params_total * 2  # a frozen bf16 copy beside the policy
    lora = estimate_training(QWEN05, GRPO.with_(**beta), A100)
    assert dev(lora, "reference_weights") == 0  # the adapter disabled: the same weights
    none = estimate_training(QWEN05, GRPO, A100)  # beta 0: TRL loads no reference
    assert none.extra["reference"] is None
    ph = phases(QWEN05, GRPO.with_(**beta), A100)
    assert ph["score"].included and "reference" in ph["score"].what
    q = estimate_training(QWEN7, GRPO.with_(method="qlora", quantization="nf4", reference="adapter", **beta), A100)
    assert dev(q, "reference_weights") == 0


def test_dpo_reference_forward_inside_the_step_and_precomputed_log_probs():
    adapter = estimate_training(QWEN05, DPO, A100)
    pre = estimate_training(QWEN05, DPO.with_(reference="precomputed"), A100)
    copy = estimate_training(QWEN05, DPO.with_(reference="copy"), A100)
    assert adapter.extra["rows_per_forward"] == 4  # chosen and rejected of 2 pairs
    assert adapter.tensor_peak_bytes >= pre.tensor_peak_bytes
    assert dev(copy, "reference_weights") > 0 and dev(pre, "reference_weights") == 0
    assert phases(QWEN05, DPO.with_(reference="precomputed"), A100)["precompute"].included
    assert not phases(QWEN05, DPO, A100)["precompute"].included


def test_dpo_step_is_the_sft_step_of_chosen_and_rejected_with_trls_head():
    inner = step_plan(DPO)
    assert (inner.task, inner.micro_batch, inner.seq_len) == ("sft", 4, 1024)
    sft = estimate_training(QWEN05, inner.with_(reference="adapter"), A100)
    dpo = estimate_training(QWEN05, DPO.with_(reference="precomputed"), A100)
    # same weights, adapters and activations; TRL's fused head holds no full logits
    assert dev(dpo, "activations") == dev(sft, "activations")
    assert dpo.extra["loss_transient_bytes"] < sft.extra["loss_transient_bytes"] / 4


def test_fused_head_scores_the_completion_in_tiles():
    fwd, bwd = fused_head_bytes(QWEN7, GRPO, 8 * 512, grad=True)
    full_logits = 8 * 512 * QWEN7.vocab_size * 2
    assert fwd < full_logits / 4 and bwd < full_logits / 2
    # a full fine-tune's head weight trains: its fp32 gradient appears in backward
    _, bwd_full = fused_head_bytes(QWEN7, GRPO.with_(method="full"), 8 * 512, grad=True)
    assert bwd_full - bwd == QWEN7.vocab_size * QWEN7.hidden_size * 4


def test_old_log_probs_only_off_policy_or_with_vllm():
    on = phases(QWEN05, GRPO, A100)["score"]
    assert not on.included  # on-policy, generate(), beta 0: TRL runs no scoring pass
    off = phases(QWEN05, GRPO.with_(grad_accum=4, steps_per_generation=3, num_generations=4), A100)["score"]
    assert off.included and "old log-probs" in off.what
    vllm = phases(QWEN05, COLOCATE, A100)["score"]
    assert vllm.included and "old log-probs" in vllm.what


def test_zero3_divides_the_reference_copy():
    plan = DPO.with_(method="full", reference="copy")
    one = estimate_training(QWEN7, plan, A100)
    four = shard_report(one, QWEN7, plan, 4, "zero3", A100)
    assert dev(four, "reference_weights") == dev(one, "reference_weights") // 4


# ------------------------------------------------------------------------------------------------ the Plan


@pytest.mark.parametrize("plan, flag", [
    (GRPO.with_(reference="precomputed", beta=0.04), "--reference"),
    (GRPO.with_(method="full", beta=0.04), "--reference"),
    (GRPO.with_(reference="copy", beta=0.04), "--reference"),
    (DPO.with_(beta=0.0), "--beta"),
    (DPO.with_(padding_free=True), "--padding-free"),
    (GRPO.with_(generation="vllm-colocate", quantization="int8"), "--generation"),
    (GRPO.with_(num_generations=1), "--num-generations"),
    (GRPO.with_(vllm_gpu_memory_utilization=1.5, generation="vllm-colocate"), "--vllm-gpu-memory-utilization"),
    (GRPO.with_(generation="vllm-server", vllm_gpus=0), "--vllm-gpus"),
])
def test_rules_are_one_line_errors_naming_the_flag(plan, flag):
    errs = plan.problems()
    assert errs and all(flag in str(e) for e in errs[:1]) and "\n" not in str(errs[0]), errs


def test_the_generation_batch_holds_whole_groups():
    plan = GRPO.with_(micro_batch=3, num_generations=8)
    assert plan.problems() == []
    (err,) = rl_problems(plan, gpus=1)
    assert isinstance(err, AdvisorInputError) and str(err).startswith("--num-generations") and "\n" not in str(err)
    assert rl_problems(plan, gpus=8) == []  # 3 x 8 GPUs = 24 completions: 3 groups of 8
    assert rl_problems(plan.with_(grad_accum=8), gpus=1) == []  # steps_per_generation defaults to grad_accum


def test_the_task_keys_studies_and_the_grpo_knobs_do_not_apply_to_sft():
    shorts = {Plan(task=t).short() for t in ("sft", "grpo", "dpo")}
    assert len(shorts) == 3
    assert Plan().short() == "lora r16[q,k,v,o] bf16 adamw_torch b1x1 s1024"  # an SFT plan's key is unchanged
    sft = Plan(num_generations=4, generation="vllm-colocate", vllm_sleep=2, padding_free=True)
    assert canonical(sft) == Plan()
    assert canonical(Plan(task="grpo", loss="fused-linear")) == Plan(task="grpo")  # TRL's own head: no loss knob
