"""Every value of every lever the Plan declares with choices (method, quantization, compute_dtype, precision,
optimizer, attn_impl, offload, loss, and any lever added later) has its three terms, none borrowed from another
value: a memory term (the closed-form ledger moves the category the value acts on), a step-time term (the term
it acts on moves) and a quality entry. A new value, or a new enum lever, fails here until each is written down:
say below what it changes, and write the term that changes it.

The optimizer's expectations come from its declaration (advisor/data/optimizers.yaml): a stateful optimizer keeps
optimizer state, one with ``state: none`` keeps none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from advisor.core import dtypes
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import knob_of, lever_choices
from advisor.core.optimizers import optimizer, optimizer_aliases, optimizers, parse_optimizers
from advisor.core.plan import VISION_LEVER_KNOBS, Plan, has_vision_input
from advisor.memory.ledger import MemoryReport
from advisor.memory.phases import run_phases
from advisor.memory.rl import step_ledger as estimate_training
from advisor.search.quality import quality_data, quality_of
from advisor.speed.throughput import predict_throughput

ROOT = Path(__file__).resolve().parents[1]
MODEL = resolve_model("qwen0.5b")
GPU = resolve_gpu("a100-80gb")
BASES = (Plan(method="lora"), Plan(method="full"), Plan(method="qlora", quantization="nf4"),
         Plan(task="grpo", method="lora"), Plan(task="grpo", method="lora", generation="vllm-colocate"),
         Plan(task="dpo", method="lora"), Plan(method="lora", sp_degree=2, loss="fused-linear", seq_len=8192))
"""A value is tried on the first of these where its knob applies and the plan is valid (the GRPO and DPO levers
on the task's plans)."""
VISION_MODEL = resolve_model("qwen2-vl-2b")
"""The model a vision lever is tried on (with one image per sample): a text model has no tower."""


def model_for(plan: Plan):
    return VISION_MODEL if has_vision_input(plan) else MODEL


def plan_with(name: str, value) -> Plan:
    for base in BASES:
        if name in VISION_LEVER_KNOBS:
            base = base.with_(image_sizes=("448x448",))
        plan = base.with_(**{name: value})
        if knob_of(Plan, name).applies_to(vars(plan)) and not plan.problems():
            return plan
    raise AssertionError(f"no valid plan sets {name}={value!r}: add a base plan to BASES")


def memory(plan: Plan) -> MemoryReport:
    report = estimate_training(model_for(plan), plan, GPU)
    return report


def dev(report: MemoryReport, category: str) -> int:
    return report.device.get(category, 0)


def load_peak(plan: Plan) -> int:
    return run_phases(MODEL, plan, GPU, memory(plan)).phases["load"].peak_bytes


def terms(plan: Plan) -> dict[str, float]:
    return predict_throughput(model_for(plan), plan, GPU).terms


def gen(report: MemoryReport) -> dict:
    """The GRPO generation engine's memory (advisor.memory.rl.Generation) beside the step."""
    return report.extra["generation"]


def _stateful(plan: Plan, r: MemoryReport, ref: MemoryReport) -> bool:
    states = dev(r, "optimizer_states")  # depends on the memory branch for an optimizer memory does not know
    return states > 0 if optimizer(plan.optimizer).stateful else states == 0


# What each value does to the ledger: (plan, its report, the report of the knob's default) -> holds.
MEMORY = {
    "method": {
        "lora": lambda p, r, ref: dev(r, "adapter_weights") > 0 and dev(r, "quant_constants") == 0,
        "full": lambda p, r, ref: dev(r, "adapter_weights") == 0
        and dev(r, "optimizer_states") > 10 * dev(ref, "optimizer_states"),
        "qlora": lambda p, r, ref: dev(r, "adapter_weights") > 0 and dev(r, "quant_constants") > 0
        and dev(r, "weights") < dev(ref, "weights"),
    },
    "quantization": {
        "none": lambda p, r, ref: dev(r, "quant_constants") == 0,
        **{q: (lambda p, r, ref: dev(r, "quant_constants") > 0 and dev(r, "weights") < dev(ref, "weights"))
           for q in ("int8", "nf4", "fp4")},
    },
    "compute_dtype": {  # the 16-bit tensor being quantized at load, in the compute dtype
        "bf16": lambda p, r, ref: load_peak(p) > 0,
        "fp16": lambda p, r, ref: load_peak(p) == load_peak(p.with_(compute_dtype="bf16")),
        "fp32": lambda p, r, ref: load_peak(p) > load_peak(p.with_(compute_dtype="bf16")),
    },
    "precision": {
        "bf16": lambda p, r, ref: dev(r, "weights") > 0,
        "fp16": lambda p, r, ref: dev(r, "weights") == dev(ref, "weights"),
        "fp32": lambda p, r, ref: dev(r, "weights") > 1.9 * dev(ref, "weights")
        and dev(r, "activations") > dev(ref, "activations"),
        **{m: (lambda p, r, ref: dev(r, "weights") > 1.9 * dev(ref, "weights")
               and dev(r, "activations") == dev(ref, "activations")) for m in ("mixed_bf16", "mixed_fp16")},
    },
    "optimizer": {name: _stateful for name in optimizers()},
    "attn_impl": {
        "sdpa": lambda p, r, ref: dev(r, "activations") > 0,
        "flash_attention_2": lambda p, r, ref: dev(r, "activations") == dev(ref, "activations"),  # no scores either
        "flash_attention_3": lambda p, r, ref: dev(r, "activations") == dev(ref, "activations"),  # as FA2
        "eager": lambda p, r, ref: dev(r, "activations") > dev(ref, "activations"),  # seq x seq scores saved
    },
    "sp_backend": {  # one rank's shard either way; ring gathers the whole sequence's k/v in backward
        "ulysses": lambda p, r, ref: any("Ulysses" in n for n in r.notes) and dev(r, "activations") > 0,
        "ring": lambda p, r, ref: dev(r, "transient") > dev(ref, "transient"),
    },
    "offload": {
        "none": lambda p, r, ref: r.host_bytes == 0,
        "zero2_cpu": lambda p, r, ref: dev(r, "optimizer_states") == 0 and r.host.get("optimizer_states", 0) > 0,
        "zero3_cpu": lambda p, r, ref: dev(r, "optimizer_states") == 0 and r.host.get("weights", 0) > 0
        and dev(r, "weights") < dev(ref, "weights"),
        # FSDP's CPU offload: parameter, gradient and optimizer shards on the host, gathered units on the GPU
        "fsdp_cpu": lambda p, r, ref: dev(r, "optimizer_states") == 0 and r.host.get("weights", 0) > 0
        and r.host.get("gradients", 0) > 0 and dev(r, "weights") < dev(ref, "weights"),
    },
    # GRPO / DPO (advisor.memory.rl): what each value keeps on the training GPU during the training step
    "generation": {  # generate()'s cache lives in the generate phase only; a colocated vLLM stays awake by default
        "transformers": lambda p, r, ref: gen(r)["weights_bytes"] == 0 and gen(r)["kv_cache_bytes"] > 0
        and dev(r, "kv_cache") == 0 and dev(r, "vllm_weights") == 0,
        "vllm-colocate": lambda p, r, ref: dev(r, "vllm_weights") > 0 and dev(r, "kv_cache") > 0
        and dev(r, "vllm_reserve") > 0,
        "vllm-server": lambda p, r, ref: dev(r, "vllm_weights") == 0 and dev(r, "vllm_reserve") == 0
        and gen(r)["weights_bytes"] > 0 and gen(r)["kv_cache_bytes"] > 0,
    },
    "vllm_sleep": {
        0: lambda p, r, ref: dev(r, "vllm_weights") > 0 and dev(r, "kv_cache") > 0,
        1: lambda p, r, ref: dev(r, "vllm_weights") == 0 and dev(r, "kv_cache") == 0
        and r.host.get("vllm_weights", 0) == gen(r)["weights_bytes"] > 0,
        2: lambda p, r, ref: dev(r, "vllm_weights") == 0 and dev(r, "kv_cache") == 0
        and r.host.get("vllm_weights", 0) == 0 and dev(r, "vllm_reserve") > 0,
    },
    "reference": {
        "adapter": lambda p, r, ref: dev(r, "reference_weights") == 0
        and r.tensor_peak_bytes >= memory(p.with_(reference="precomputed")).tensor_peak_bytes,
        "copy": lambda p, r, ref: dev(r, "reference_weights") > dev(ref, "weights") / 2,
        "precomputed": lambda p, r, ref: (dev(r, "reference_weights") == 0
                                          and r.tensor_peak_bytes <= ref.tensor_peak_bytes),
    },
    "loss": {
        "plain": lambda p, r, ref: dev(r, "transient") > 0,
        "chunked": lambda p, r, ref: dev(r, "transient") < dev(ref, "transient"),
        "fused-linear": lambda p, r, ref: dev(r, "transient") < dev(ref, "transient"),
    },
    "vision_tower": {  # the tower's own part of the ledger (advisor.memory.vision)
        "frozen": lambda p, r, ref: vis(r, "weights") > 0 and vis(r, "saved_activations") == 0
        and vis(r, "gradients") == 0,
        "lora": lambda p, r, ref: vis(r, "adapter_weights") > 0 and vis(r, "saved_activations") > 0
        and dev(r, "adapter_weights") > dev(ref, "adapter_weights"),
        "full": lambda p, r, ref: vis(r, "gradients") > 0 and vis(r, "saved_activations") > 0
        and dev(r, "optimizer_states") > dev(ref, "optimizer_states"),
    },
}


def vis(report: MemoryReport, part: str) -> int:
    return report.extra["vision"][part]


# What each value does to the step time: (plan, its terms, the terms of the knob's default) -> holds.
SPEED = {
    "method": {
        "lora": lambda p, t, ref: t["lora"] > 0 and t["dequant"] == 0,
        "full": lambda p, t, ref: t["lora"] == 0 and t["optimizer"] > 10 * ref["optimizer"],
        "qlora": lambda p, t, ref: t["lora"] > 0 and t["dequant"] > 0,
    },
    "quantization": {"none": lambda p, t, ref: t["dequant"] == 0,
                     **{q: (lambda p, t, ref: t["dequant"] > 0) for q in ("int8", "nf4", "fp4")}},
    "compute_dtype": {  # the dequantized weight is written in the compute dtype
        "bf16": lambda p, t, ref: t["dequant"] > 0,
        "fp16": lambda p, t, ref: t["dequant"] == ref["dequant"],
        "fp32": lambda p, t, ref: t["dequant"] > ref["dequant"],
    },
    "precision": {
        "bf16": lambda p, t, ref: t["matmul"] > 0 and t["autocast_cast"] == 0,
        "fp16": lambda p, t, ref: t["matmul"] == ref["matmul"] and t["autocast_cast"] == 0,
        "fp32": lambda p, t, ref: t["matmul"] > ref["matmul"] and t["autocast_cast"] == 0,  # TF32
        **{m: (lambda p, t, ref: t["matmul"] == ref["matmul"] and t["autocast_cast"] > 0)
           for m in ("mixed_bf16", "mixed_fp16")},
    },
    "optimizer": {name: (lambda p, t, ref: t["optimizer"] > 0) for name in optimizers()},
    "attn_impl": {
        "sdpa": lambda p, t, ref: t["attention"] > 0,
        "flash_attention_2": lambda p, t, ref: t["attention"] > 0,
        "flash_attention_3": lambda p, t, ref: t["attention"] > 0,
        "eager": lambda p, t, ref: t["attention"] > ref["attention"],
    },
    "sp_backend": {  # the exchange: all-to-alls of q/k/v/output, or the whole sequence's k/v gathered
        "ulysses": lambda p, t, ref: t["sequence_parallel"] > 0,
        "ring": lambda p, t, ref: 0 < t["sequence_parallel"] != ref["sequence_parallel"],
    },
    "offload": {"none": lambda p, t, ref: t["offload"] == 0,
                **{o: (lambda p, t, ref: t["offload"] > 0 and t["optimizer"] == 0)
                   for o in ("zero2_cpu", "zero3_cpu", "fsdp_cpu")}},
    "generation": {
        "transformers": lambda p, t, ref: t["generate"] > 0 and t["sync"] == 0,
        "vllm-colocate": lambda p, t, ref: 0 < t["generate"] < ref["generate"] and t["sync"] > 0,
        "vllm-server": lambda p, t, ref: t["generate"] > 0 and t["sync"] > 0,
    },
    "vllm_sleep": {
        0: lambda p, t, ref: t["vllm_sleep"] == 0,
        1: lambda p, t, ref: t["vllm_sleep"] > 0,  # weights to host and back each generation
        2: lambda p, t, ref: 0 < t["vllm_sleep"] < terms(p.with_(vllm_sleep=1))["vllm_sleep"],
    },
    "reference": {
        "adapter": lambda p, t, ref: t["reference_forward"] > 0,
        "copy": lambda p, t, ref: t["reference_forward"] == ref["reference_forward"],
        "precomputed": lambda p, t, ref: t["reference_forward"] == 0,
    },
    "loss": {
        "plain": lambda p, t, ref: t["loss"] > 0,
        "chunked": lambda p, t, ref: t["chunked_loss_recompute"] > 0,
        "fused-linear": lambda p, t, ref: t["loss"] < ref["loss"],
    },
    "vision_tower": {  # the tower's forward always; its backward only where it trains
        "frozen": lambda p, t, ref: t["vision"] > 0,
        "lora": lambda p, t, ref: t["vision"] > ref["vision"],
        "full": lambda p, t, ref: t["vision"] > ref["vision"],
    },
}

CASES = [(k.name, v) for k in lever_choices(Plan) for v in k.choices]


def test_every_enum_lever_and_value_is_listed_here():
    for k in lever_choices(Plan):
        for table in (MEMORY, SPEED):
            assert k.name in table, f"{k.flag}: say what each of its values does to memory and step time here"
            assert set(table[k.name]) == set(k.choices), f"{k.flag}: values {set(k.choices) ^ set(table[k.name])}"


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_the_value_has_its_memory_term(name, value):
    plan, ref = plan_with(name, value), plan_with(name, knob_of(Plan, name).default)
    report = memory(plan)
    assert report.peak_bytes > 0
    assert MEMORY[name][value](plan, report, memory(ref)), f"{name}={value}: no memory term of its own"


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_the_value_has_its_step_time_term(name, value):
    plan, ref = plan_with(name, value), plan_with(name, knob_of(Plan, name).default)
    t = terms(plan)
    assert sum(t.values()) > 0
    assert SPEED[name][value](plan, t, terms(ref)), f"{name}={value}: no step-time term of its own"


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_the_value_has_its_quality_entry(name, value):
    assert quality_data().entries[name].get(str(value)), f"{name}={value}: no entry in quality.yaml"
    effect = quality_of(plan_with(name, value))
    assert any(e.lever == name for e in effect.levers) or any(u.startswith(f"{name}=") for u in effect.uncovered)


def test_an_optimizer_no_one_declared_has_no_step_time_and_no_quality():
    plan = Plan(method="full", optimizer="adamw_9bit")  # not validated: as a caller that builds plans itself passes it
    with pytest.raises(AdvisorInputError, match="--optimizer: no step-time term"):
        terms(plan)
    assert any(u.startswith("optimizer=adamw_9bit") for u in quality_of(plan).uncovered)


# ------------------------------------------------------------------------------------------ the declarations


def test_an_optimizer_is_declared_once_and_everything_derives_from_it():
    from advisor.configs._base import OPTIM_ALIASES
    from advisor.core import plan as plan_module
    from advisor.runtime.build import low_rank_args

    declared = optimizers()
    assert plan_module.OPTIMIZERS == tuple(declared) == knob_of(Plan, "optimizer").choices
    assert set(plan_module.LOW_RANK_OPTIMIZERS) == {n for n, o in declared.items() if o.low_rank}
    assert set(plan_module.FUSED_BACKWARD_OPTIMIZERS) == {n for n, o in declared.items() if o.in_backward}
    assert set(plan_module.PAGED_OPTIMIZERS) == {n for n, o in declared.items() if o.paged}
    assert OPTIM_ALIASES == optimizer_aliases()
    assert OPTIM_ALIASES["adamw_bnb_8bit"] == "adamw_8bit" and OPTIM_ALIASES["adamw_hf"] == "adamw_torch"
    for name, o in declared.items():
        assert bool(low_rank_args(Plan(method="full", optimizer=name))) == o.low_rank
    with pytest.raises(AdvisorInputError, match="--optimizer: not declared"):
        optimizer("adamw_9bit")


def test_every_declared_optimizer_is_a_trainingarguments_name():
    from transformers.training_args import OptimizerNames

    names = {o.value for o in OptimizerNames}
    assert [n for n in optimizers() if n not in names] == []  # build.py builds it by this name


def test_bad_optimizer_declarations_are_errors_naming_the_key():
    with pytest.raises(Exception) as e:
        parse_optimizers({"a": {"state": "lots", "source": "x"}, "b": {"state": "none", "source": "x", "aliases": ["a"],
                                                                       "fused_backward": True, "warp": 1}})
    text = str(e.value)
    for where in ("a.state", "b.aliases", "b.fused_backward", "b.warp"):
        assert f"optimizers.yaml: {where}" in text, where


def test_the_own_backward_rule_reads_the_declaration():
    errs = Plan(method="lora", optimizer="adalomo", precision="fp16").problems()
    assert any("runs its own backward" in e.rule for e in errs)
    assert not Plan(method="lora", optimizer="adamw_torch", precision="fp16").problems()


def test_one_dtype_table():
    from advisor.core import plan as plan_module

    assert plan_module.DTYPE_BYTES is dtypes.DTYPE_BYTES and plan_module.DTYPES == dtypes.DTYPES
    assert knob_of(Plan, "compute_dtype").choices == dtypes.DTYPES
    for d in dtypes.TABLE:
        assert dtypes.dtype_bytes(d.name) == dtypes.dtype_bytes(d.torch_name) == dtypes.dtype_bytes(
            f"torch.{d.torch_name}") == d.bytes
    with pytest.raises(KeyError, match="float8_e4m3fn"):
        dtypes.dtype_bytes("float8_e4m3fn")
    from advisor.configs._base import TORCH_DTYPE

    assert TORCH_DTYPE == dtypes.TORCH_NAMES
    defined = [str(p.relative_to(ROOT)) for p in (ROOT / "advisor").rglob("*.py")
               if re.search(r"^DTYPE_BYTES\s*=", p.read_text(encoding="utf-8"), re.M)]
    assert defined == ["advisor/core/dtypes.py"]


# ------------------------------------------------------------------------------------------ workload vs levers


def test_the_workload_is_declared_on_its_knobs_and_the_space_reads_it():
    from advisor.search.space import fixed_knobs, load_space, plan_from_params

    assert set(fixed_knobs(Plan)) == {"seq_len", "doc_len", "eval_batch", "max_new_tokens", "task", "num_generations",
                                      "max_prompt_length", "max_completion_length", "beta", "image_sizes",
                                      "video_frames", "video_seconds", "rope_scaling"}
    assert all(knob_of(Plan, n).role == "workload" and knob_of(Plan, n).search is None for n in fixed_knobs(Plan))
    assert knob_of(Plan, "micro_batch").role == "lever"
    space = load_space("default", ["seq_len=2048", "max_new_tokens=64"])
    plan = plan_from_params(next(iter(space.grid())), space, MODEL.arch)
    assert (plan.seq_len, plan.max_new_tokens, plan.eval_batch) == (2048, 64, 0)
    with pytest.raises(AdvisorInputError, match="fixed.max_new_tokens: must be a whole number of at least 0"):
        load_space("default", ["max_new_tokens=-3"])
