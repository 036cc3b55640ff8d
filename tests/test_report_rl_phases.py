"""The GRPO/DPO phase picture: its numbers (advisor.ui.phase_view: per phase the trainer's resident state, what vLLM
holds and what the phase adds; the peak phase; vLLM's pool) and the HTML report's rendering of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.core.units import format_bytes
from advisor.ui.phase_view import phase_picture, picture_of_plan

GRPO_VLLM = Plan(task="grpo", method="qlora", quantization="nf4", gradient_checkpointing=True, micro_batch=8,
                 num_generations=8, max_prompt_length=256, max_completion_length=256, generation="vllm-colocate",
                 vllm_gpu_memory_utilization=0.3, vllm_sleep=2)
GRPO_AWAKE = GRPO_VLLM.with_(vllm_sleep=0)
GRPO_GENERATE = GRPO_VLLM.with_(generation="transformers")
DPO = Plan(task="dpo", method="lora", seq_len=2048, gradient_checkpointing=True)


@pytest.fixture(scope="module")
def setting():
    return resolve_model("qwen7b"), resolve_gpu("rtx-4090")


@pytest.mark.parametrize("plan", [GRPO_VLLM, GRPO_AWAKE, GRPO_GENERATE, DPO],
                         ids=["sleep2", "awake", "generate", "dpo"])
def test_the_bars_add_up_and_the_peak_is_the_highest(plan, setting):
    pic = picture_of_plan(*setting[:1], plan.validate(), setting[1])
    assert pic is not None and pic.bars
    for bar in pic.bars:
        assert sum(bar.segments.values()) == bar.live_bytes, bar
        assert all(v >= 0 for v in bar.segments.values())
    top = max(pic.bars, key=lambda b: b.live_bytes)
    assert [b.name for b in pic.bars if b.peak] == [top.name] == [pic.step_peak_phase]
    if plan.task == "dpo":
        assert [b.name for b in pic.bars] == ["train"] and pic.vllm is None
    else:
        names = {b.name for b in pic.bars}
        assert {"generate", "train"} <= names
        # on-policy generate() without a reference scores nothing; vLLM's importance sampling needs old log-probs
        assert ("score" in names) == (plan.generation != "transformers")


def test_vllm_holds_its_pool_in_generation_and_what_sleep_leaves_in_training(setting):
    model, gpu = setting
    asleep = picture_of_plan(model, GRPO_VLLM.validate(), gpu)
    awake = picture_of_plan(model, GRPO_AWAKE.validate(), gpu)
    for pic in (asleep, awake):
        v = pic.vllm
        assert v.weights_bytes + v.kv_cache_bytes + v.reserve_bytes == pytest.approx(v.pool_bytes, rel=0.01)
        gen = next(b for b in pic.bars if b.name == "generate")
        assert gen.segments["vllm"] == v.pool_bytes  # the whole pool while it generates
    train = {p: next(b for b in pic.bars if b.name == "train") for p, pic in (("asleep", asleep), ("awake", awake))}
    assert asleep.vllm.asleep_while_training and not awake.vllm.asleep_while_training
    # asleep: only CUDA graphs and non-torch memory stay; awake: weights and KV cache too
    assert train["asleep"].segments["vllm"] < asleep.vllm.weights_bytes < train["awake"].segments["vllm"]
    assert picture_of_plan(model, GRPO_GENERATE.validate(), gpu).vllm is None  # generate(): no pool


def test_sft_has_no_picture(setting):
    model, gpu = setting
    assert picture_of_plan(model, Plan(method="lora"), gpu) is None


def test_the_html_report_draws_the_phases_and_vllm(setting):
    from advisor.ui.report._html import phases_section

    model, gpu = setting
    pic = picture_of_plan(model, GRPO_VLLM.validate(), gpu)
    d = SimpleNamespace(phases=pic, budget_bytes=gpu.memory_bytes, fmt=format_bytes)
    html = phases_section(d)
    assert "The GRPO step, phase by phase" in html
    for bar in pic.bars:
        assert f"<td>{bar.name}</td>" in html or f"<b>{bar.name} ◀ peak</b>" in html
    assert f"<b>{pic.step_peak_phase} ◀ peak</b>" in html
    assert "What vLLM holds" in html and f"{pic.vllm.kv_tokens:,} tokens" in html
    assert "asleep while the trainer scores and trains" in html
    assert phases_section(SimpleNamespace(phases=None, budget_bytes=1, fmt=format_bytes)) == ""


def test_phase_picture_of_an_sft_report_is_none(setting):
    from advisor.runtime.backends import get_backend
    from advisor.runtime.phases import with_phases

    model, gpu = setting
    plan = Plan(method="lora").validate()
    assert phase_picture(with_phases(model, plan, gpu, get_backend("estimate").measure(model, plan, gpu))) is None
