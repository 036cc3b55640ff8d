"""One rule for what runs on a card (advisor/core/card_rules.py, advisor/data/card_rules.yaml).

Each rule on the cards it concerns, the catalog's card facts, the model side (attention implementations
read from transformers' classes), and the rule used everywhere: the search space's `auto`, the tuner's
Conditions, estimate, pre-flight and the exports. The end-to-end checks: on every catalog GPU the tuner's
answer gets GO from pre-flight on its own export, and the issue's T4 command.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from advisor.cli import main
from advisor.core.card_rules import (AUTO, CARD_DECIDED, Card, bf16_runs, card_precision, card_problems, card_rules,
                                     default_attention, model_facts, not_card_rules)
from advisor.core.catalog import gpu_catalog, resolve_gpu, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.knobs import knob_of
from advisor.core.plan import Plan, knobs
from advisor.search.space import load_space, model_rules, plan_from_params
from matrix import matrix_params  # tests/matrix.py

QLORA = Plan(method="qlora", quantization="nf4", double_quant=True)
T4, A100, V100, H100, RTX5090 = (resolve_gpu(k) for k in ("t4", "a100-80gb", "v100-16gb", "h100-sxm", "rtx-5090"))
RTX2080TI = replace(T4, key="rtx-2080-ti", name="NVIDIA GeForce RTX 2080 Ti", sm=75)  # Turing, as a detected card
P100 = replace(V100, key="p100", name="Tesla P100-PCIE-16GB", sm=60)
MAXWELL = replace(V100, key="m40", name="Tesla M40", sm=52)


def _refused(plan, gpu, model=None):
    return {(e.where, e.value) for e in card_problems(plan, gpu, model)}


# --------------------------------------------------------------------------- card facts


@pytest.mark.parametrize("key", list(gpu_catalog()))
def test_every_catalog_gpu_has_a_compute_capability_that_agrees_with_its_bf16_flag(key):
    entry, gpu = gpu_catalog()[key], resolve_gpu(key)
    assert isinstance(gpu.sm, int) and 70 <= gpu.sm <= 120 and "cuda-gpus" in entry["sm_source"]
    assert gpu.bf16 == bf16_runs(gpu) == (gpu.sm >= 80), f"{key}: bf16 flag disagrees with sm{gpu.sm} and the bf16 rule"


def test_known_compute_capabilities():
    assert (T4.sm, V100.sm, A100.sm, H100.sm, RTX5090.sm) == (75, 70, 80, 90, 120)
    assert resolve_gpu("rtx-3090").sm == 86 and resolve_gpu("l4").sm == resolve_gpu("rtx-4090").sm == 89


def test_a_card_of_unknown_compute_capability_is_judged_by_its_bf16_flag_only():
    old_t4 = replace(T4, sm=None)  # a study stored before the field
    assert _refused(Plan(), old_t4) == {("--precision", "bf16")}
    assert _refused(Plan(attn_impl="flash_attention_2"), replace(A100, sm=None)) == set()


# --------------------------------------------------------------------------- each rule


def test_t4_refuses_bf16_and_flash_attention_2_naming_flag_value_and_fix():
    errors = card_problems(QLORA.with_(attn_impl="flash_attention_2"), T4)
    assert {(e.where, e.value) for e in errors} == {("--precision", "bf16"), ("--compute-dtype", "bf16"),
                                                    ("--attn-impl", "flash_attention_2")}
    precision = next(e for e in errors if e.where == "--precision")
    assert str(precision).startswith("--precision: the Tesla T4 (sm75) has no bf16 tensor cores; use fp16 (mixed "
                                     "precision with loss scaling)")
    assert "\n" not in str(precision)
    assert "sdpa" in next(e for e in errors if e.where == "--attn-impl").rule


def test_turing_and_volta_cards_refuse_what_needs_ampere_and_take_the_rest():
    for gpu in (RTX2080TI, V100):
        assert _refused(Plan(precision="mixed_bf16"), gpu) == {("--precision", "mixed_bf16")}
        assert _refused(Plan(precision="fp16", attn_impl="flash_attention_2"), gpu) == {
            ("--attn-impl", "flash_attention_2")}
        # Triton (Liger's fused loss, torchao's low-bit AdamW) and bitsandbytes run from sm70 / sm60
        assert _refused(Plan(precision="fp16", loss="fused-linear", optimizer="adamw_torch_4bit"), gpu) == set()
        assert _refused(QLORA.with_(precision="fp16", compute_dtype="fp16", optimizer="paged_adamw_8bit"), gpu) == set()


def test_ampere_hopper_and_blackwell_take_bf16_and_flash_attention_2():
    plan = QLORA.with_(attn_impl="flash_attention_2", loss="fused-linear", optimizer="adamw_torch_8bit")
    for gpu in (A100, H100, RTX5090, resolve_gpu("rtx-3090")):
        assert card_problems(plan, gpu) == [] and Card.of(gpu).notes(plan) == []


def test_flash_attention_3_runs_on_hopper_only_and_its_refusal_names_the_flag():
    """FlashAttention-3 is built for sm90 (flash-attn README, hopper/): refused on Ada, Ampere, Blackwell (B200 sm100,
    RTX 5090 sm120) and older cards with one line naming --attn-impl; every Hopper card of the catalog takes it."""
    fa3 = Plan(attn_impl="flash_attention_3")
    for key in ("rtx-4090", "a100-80gb", "b200", "rtx-5090", "t4"):
        [error] = card_problems(fa3.with_(precision="fp16") if key == "t4" else fa3, resolve_gpu(key))
        assert (error.where, error.value) == ("--attn-impl", "flash_attention_3") and "\n" not in str(error)
        assert str(error).startswith("--attn-impl: the ") and "Hopper" in error.rule
        assert "flash_attention_2" in error.rule
    hopper = [k for k in gpu_catalog() if resolve_gpu(k).sm == 90]
    assert {"h100-sxm", "h200"} <= set(hopper)
    for key in hopper:
        assert card_problems(fa3, resolve_gpu(key)) == [] and Card.of(resolve_gpu(key)).notes(fa3) == []
    assert card_problems(fa3, replace(H100, sm=None)) == []  # unknown capability, bf16: may be Hopper
    assert _refused(fa3, replace(T4, sm=None)) == {("--attn-impl", "flash_attention_3"), ("--precision", "bf16")}
    assert main(["estimate", "--model", "qwen0.5b", "--gpu", "a100-80gb", "--attn-impl", "flash_attention_3"]) == 2


def test_older_cards_lose_triton_then_bitsandbytes():
    triton = Plan(precision="fp16", loss="fused-linear", optimizer="adamw_torch_8bit")
    assert _refused(triton, P100) == {("--loss", "fused-linear"), ("--optimizer", "adamw_torch_8bit")}
    assert _refused(QLORA.with_(precision="fp16", compute_dtype="fp16"), P100) == set()
    assert _refused(QLORA.with_(precision="fp16", compute_dtype="fp16"), MAXWELL) == {("--quantization", "nf4")}
    assert _refused(Plan(precision="fp16", optimizer="paged_adamw_8bit"), MAXWELL) == {
        ("--optimizer", "paged_adamw_8bit")}


def test_what_runs_by_a_slower_path_is_a_note_never_a_refusal():
    int8 = Plan(precision="fp16", quantization="int8")
    assert card_problems(int8, V100) == []
    assert [n.id for n in Card.of(V100).notes(int8)] == ["int8-slow-matmul"]
    assert Card.of(T4).notes(int8) == []  # sm75 has int8 tensor cores
    fp16 = Plan(precision="fp16")
    assert card_problems(fp16, A100) == [] and [n.id for n in Card.of(A100).notes(fp16)] == ["fp16-on-bf16-gpu"]
    assert Card.of(T4).notes(fp16) == []


def test_a_mixture_of_experts_before_ampere_gets_the_grouped_mm_note():
    moe = resolve_model("qwen30b-a3b")  # the description is derived from the config: a real mixture of experts
    assert [n.id for n in Card.of(V100, moe).notes(Plan(precision="fp16"))] == ["experts-grouped-mm-fallback"]
    assert Card.of(A100, moe).notes(Plan()) == []


def test_no_card_refuses_nothing_for_a_card():
    assert card_problems(QLORA.with_(attn_impl="flash_attention_2"), None) == []


def test_the_4bit_compute_dtype_counts_only_on_a_4bit_base():
    assert _refused(Plan(precision="fp16", compute_dtype="bf16"), T4) == set()  # lora: compute_dtype is inert
    assert _refused(QLORA.with_(precision="fp16", compute_dtype="bf16"), T4) == {("--compute-dtype", "bf16")}


def test_card_precision():
    assert card_precision(T4) == card_precision(V100, "qlora") == "fp16"
    assert card_precision(T4, "full") == "mixed_fp16"
    assert card_precision(A100) == card_precision(A100, "full") == card_precision(None) == "bf16"
    for gpu in (T4, V100, A100, H100):
        for method, quant in (("lora", "none"), ("qlora", "nf4"), ("full", "none")):
            p = card_precision(gpu, method)
            plan = Plan(method=method, quantization=quant, precision=p, compute_dtype=p.removeprefix("mixed_"))
            assert plan.problems() == [] and card_problems(plan, gpu) == [], (gpu.key, method)


# --------------------------------------------------------------------------- the data file


def test_every_lever_value_with_code_of_its_own_is_under_a_rule_or_checked_without_one():
    covered: dict[str, set] = {}
    for entry in [r.when for r in card_rules()] + [n["values"] for n in not_card_rules()]:
        for knob, values in entry.items():
            covered.setdefault(knob, set()).update(values if isinstance(values, (list, tuple)) else [values])
    for knob in ("precision", "compute_dtype", "attn_impl", "optimizer", "loss", "quantization", "offload"):
        missing = set(knob_of(Plan, knob).choices) - covered.get(knob, set())
        assert not missing, f"{knob}: {sorted(missing)} neither under a card rule nor in not_card_rules"
    names = {k.name for k in knobs(Plan)} | {"experts"}
    for knob, values in covered.items():  # no typo: every knob and value is real
        assert knob in names, knob
        if knob != "experts":
            assert values <= set(knob_of(Plan, knob).choices), (knob, values - set(knob_of(Plan, knob).choices))
    for r in card_rules():
        assert r.source and r.lacks and r.instead and r.fix and r.effect in ("refuse", "note")
        assert [r.sm_below, r.sm_from, r.sm_not_in or None].count(None) == 2, r.id  # one kind of bound
    assert all(n["source"] and n["why"] for n in not_card_rules())


# --------------------------------------------------------------------------- the model side


def test_attention_implementations_are_read_from_the_model_class():
    gemma, qwen = model_facts(resolve_model("gemma-2-9b")), model_facts(resolve_model("qwen7b"))
    flash = {"flash_attention_2", "flash_attention_3"}  # one class attribute, _supports_flash_attn, for both
    assert gemma.class_name == "Gemma2ForCausalLM" and gemma.attention == {"eager", *flash}
    assert qwen.class_name == "Qwen2ForCausalLM" and qwen.attention == {"eager", "sdpa", *flash}
    assert default_attention(gemma) == "eager" and default_attention(qwen) == "sdpa"
    [error] = card_problems(Plan(attn_impl="sdpa"), None, resolve_model("gemma-2-9b"))
    assert error.where == "--attn-impl" and error.value == "sdpa" and "Gemma2ForCausalLM" in error.rule
    assert card_problems(Plan(attn_impl="eager", precision="fp16"), T4, resolve_model("gemma-2-9b")) == []


@pytest.mark.slow
def test_the_model_facts_agree_with_the_classes_transformers_imports():
    """The description's attention facts (read from the class by the meta-device build) against the real class
    attributes, for every catalog model type."""
    from transformers import AutoModelForCausalLM, AutoConfig  # noqa: F401
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    import importlib

    seen = set()
    for name in ("qwen7b", "qwen3-8b", "llama8b", "mistral-7b-v0.3", "gemma-2-9b", "phi-3.5-mini-instruct"):
        spec = resolve_model(name)
        if spec.model_type in seen:
            continue
        seen.add(spec.model_type)
        cls_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[spec.model_type]
        module = importlib.import_module(f"transformers.models.{spec.model_type}.modeling_{spec.model_type}")
        cls = getattr(module, cls_name)
        # one class flag covers both flash-attention versions (modeling_utils.py _flash_attn_can_dispatch)
        real = {"eager"} | ({"sdpa"} if cls._supports_sdpa else set()) | (
            {"flash_attention_2", "flash_attention_3"} if cls._supports_flash_attn else set())
        facts = model_facts(spec)
        assert facts.class_name == cls_name and facts.attention == real, spec.model_type


# --------------------------------------------------------------------------- the search space


def test_auto_choices_become_the_cards():
    space = load_space("default")
    assert space.search["precision"] == [AUTO] and space.search["attn_impl"] == [AUTO]
    qwen, gemma = resolve_model("qwen7b"), resolve_model("gemma-2-9b")
    params = {"method": "lora", "quantization": "none", "precision": AUTO, "attn_impl": AUTO, "micro_batch": 1}
    assert plan_from_params(params, space, qwen.arch).precision == "bf16"  # no card: today's default
    on_t4 = space.on_card(Card.of(T4, gemma))
    plan = plan_from_params(params, on_t4, gemma.arch)
    assert (plan.precision, plan.compute_dtype, plan.attn_impl) == ("fp16", "fp16", "eager")
    assert plan_from_params({**params, "method": "full"}, on_t4, gemma.arch).precision == "mixed_fp16"
    assert plan_from_params(params, space.on_card(Card.of(A100, qwen)), qwen.arch).precision == "bf16"


def test_an_older_space_whose_only_precision_the_card_cannot_run_is_a_clear_error():
    space = load_space("default", ["precision=[bf16]", "attn_impl=[sdpa]"])  # the file before `auto`: still valid
    with pytest.raises(AdvisorInputError) as e:
        space.on_card(Card.of(T4, resolve_model("qwen7b")))
    assert e.value.where == "search.precision" and "Tesla T4 (sm75)" in e.value.rule and "auto" in e.value.rule
    space.on_card(Card.of(A100, resolve_model("qwen7b")))  # runs there
    with pytest.raises(AdvisorInputError) as e:  # the model's side: Gemma-2's class has no sdpa
        space.on_card(Card.of(A100, resolve_model("gemma-2-2b")))
    assert e.value.where == "search.attn_impl" and "Gemma2ForCausalLM" in e.value.rule


@pytest.mark.parametrize("name", ["default", "low-memory", "qlora", "throughput"])
def test_every_point_the_search_offers_on_a_t4_runs_there(name):
    import random

    qwen = resolve_model("qwen7b")
    space = load_space(name, ["precision=[auto, bf16, fp16]", "attn_impl=[auto, flash_attention_2]"])
    conditions = space.on_card(Card.of(T4, qwen)).conditions(qwen.arch, model_rules(qwen, T4))
    rng = random.Random(0)
    for _ in range(25):
        params = conditions.walk(lambda _n, _k, offered: rng.choice(offered))
        plan = plan_from_params(params, conditions.space, qwen.arch)
        assert card_problems(plan, T4, qwen) == [] and plan.precision in ("fp16", "mixed_fp16"), plan.short()
        assert plan.attn_impl == "sdpa"


def test_the_card_decided_knobs_are_searched_knobs():
    space = load_space("default")
    assert set(CARD_DECIDED) <= set(space.search)


# --------------------------------------------------------------------------- estimate


def test_estimate_takes_the_cards_precision_and_refuses_what_the_card_cannot_run(capsys):
    assert main(["estimate", "--model", "qwen7b", "--gpu", "t4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["precision"] == "fp16" and d["plan"]["attn_impl"] == "sdpa"
    assert main(["estimate", "--model", "qwen7b", "--gpu", "t4", "--method", "full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["precision"] == "mixed_fp16"
    assert main(["estimate", "--model", "gemma-2-2b", "--gpu", "a100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["plan"]["precision"], d["plan"]["attn_impl"]) == ("bf16", "eager")
    assert main(["estimate", "--model", "qwen7b", "--gpu", "t4", "--precision", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--precision" in err and "Tesla T4 (sm75)" in err and "'bf16'" in err


# --------------------------------------------------------------------------- the exports


def test_the_cards_fp16_is_written_with_loss_scaling_in_every_format(tmp_path):
    from transformers import TrainingArguments
    from deepspeed.runtime.config import DeepSpeedConfig

    from advisor.configs.export import export_plan

    qwen = resolve_model("qwen7b")
    lora = Plan(precision=card_precision(T4), offload="zero2_cpu")
    written = export_plan(qwen, lora, tmp_path / "lora", gpu=T4)
    cfg = yaml.safe_load(written["advisor"].read_text())
    assert cfg["model"]["torch_dtype"] == "float16" and cfg["model"]["attn_implementation"] == "sdpa"
    assert (cfg["training"]["fp16"], cfg["training"]["bf16"]) == (True, False)
    assert cfg["advisor"]["gpu"]["sm"] == 75
    ds = json.loads(written["deepspeed"].read_text())
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0 and not ds["bf16"]["enabled"]  # dynamic scaling
    assert DeepSpeedConfig(ds).float16_config.enabled
    t = dict(cfg["training"], output_dir=str(tmp_path / "o"), deepspeed=str(tmp_path / "lora" / "deepspeed.json"))
    assert TrainingArguments(**t, use_cpu=True).hf_deepspeed_config.mismatches == []
    for fmt in ("axolotl", "llamafactory", "trl"):
        d = yaml.safe_load(written[fmt].read_text())
        assert d["fp16"] is True and d["bf16"] is False, fmt
    qlora = QLORA.with_(precision=card_precision(T4, "qlora"), compute_dtype="fp16")
    cfg = yaml.safe_load(export_plan(qwen, qlora, tmp_path / "q", ["advisor"])["advisor"].read_text())
    assert cfg["quantization"]["bnb_4bit_compute_dtype"] == "float16" and cfg["training"]["fp16"] is True
    full = Plan(method="full", precision=card_precision(T4, "full"))
    cfg = yaml.safe_load(export_plan(qwen, full, tmp_path / "f", ["advisor"])["advisor"].read_text())
    assert cfg["model"]["torch_dtype"] == "float32" and cfg["training"]["fp16"] is True  # fp32 masters, GradScaler


# --------------------------------------------------------------------------- pre-flight


def test_preflight_judges_by_the_same_rule(tmp_path, capsys):
    from advisor.configs.export import export_plan

    qwen = resolve_model("qwen7b")
    bf16 = export_plan(qwen, QLORA.with_(attn_impl="flash_attention_2"), tmp_path / "bf16", ["advisor"])["advisor"]
    main(["preflight", str(bf16), "--gpu", "t4", "--backend", "estimate", "--json"])
    d = json.loads(capsys.readouterr().out)
    checks = {f["check"]: f for f in d["findings"]}
    assert d["verdict"] == "NO-GO" and checks["config.bf16-unsupported"]["severity"] == "error"
    assert "Tesla T4 (sm75)" in checks["config.bf16-unsupported"]["title"]
    assert checks["config.flash-attn-unsupported"]["fixes"] == ["use attn_implementation: sdpa"]
    # fp16 on a card with bf16: the tuner may answer it (a space listing fp16), so it is said, not RISKY
    fp16 = export_plan(qwen, Plan(precision="fp16"), tmp_path / "fp16", ["advisor"])["advisor"]
    main(["preflight", str(fp16), "--gpu", "a100", "--backend", "estimate", "--json"])
    d = json.loads(capsys.readouterr().out)
    note = next(f for f in d["findings"] if f["check"] == "config.fp16-on-bf16-gpu")
    assert note["severity"] == "info" and d["verdict"] == "GO", [f for f in d["findings"] if f["severity"] != "ok"]


# --------------------------------------------------------------------------- every answer passes its own pre-flight


def _non_ok(findings):
    return [f"{f['severity']} {f['check']}: {f['title']}" for f in findings if f["severity"] in ("warning", "error")]


def _tune_export_preflight(tmp_path, capsys, gpu_key, budget, model, *overrides, trials="8", backend="estimate"):
    out = tmp_path / gpu_key
    code = main(["tune", "--gpu-budget", budget, "--gpu", gpu_key, "--model", model, "--backend", "estimate",
                 "--trials", trials, "--json", "--reports-dir", str(out / "reports"), "--export", str(out / "export"),
                 *overrides])
    tuned = json.loads(capsys.readouterr().out)
    assert code == 0 and tuned["best"] is not None, gpu_key
    main(["preflight", str(out / "export" / "advisor.yaml"), "--gpu", gpu_key, "--gpu-budget", budget,
          "--backend", backend, "--json"])
    return tuned, json.loads(capsys.readouterr().out)


def _assert_go(gpu_key, tuned, checked):
    bad = _non_ok(checked["findings"])
    if checked["verdict"] != "GO" and bad and all(" env.host-ram:" in b for b in bad):
        # host memory is not yet a budget of the tuner (issue 23, another part): only that stands in the way
        pytest.xfail(f"{gpu_key}: {tuned['best']['plan_short']} fails pre-flight only on host RAM: {bad}")
    assert checked["verdict"] == "GO", f"{gpu_key}: {tuned['best']['plan_short']} -> {checked['verdict']}: {bad}"


def _compute_class(key: str) -> int:
    return resolve_gpu(key).sm


# one card per compute class by default (the card rules differ by class, not by name: the table check below holds
# every other card to its class's first), every catalog card with --full-matrix (tests/matrix.py)
@pytest.mark.slow
@pytest.mark.parametrize("gpu_key", matrix_params(list(gpu_catalog()), lambda k: [_compute_class(k)]))
def test_every_catalog_gpu_answer_passes_its_own_preflight(gpu_key, tmp_path, capsys):
    gpu = resolve_gpu(gpu_key)
    budget = f"{gpu.memory_bytes // 2**20}MiB"  # the card's whole memory
    tuned, checked = _tune_export_preflight(tmp_path, capsys, gpu_key, budget, "qwen7b")
    plan = tuned["best"]["plan"]
    assert plan["precision"] == card_precision(gpu, plan["method"]), gpu_key
    _assert_go(gpu_key, tuned, checked)


LEVER_PLANS = [Plan(), QLORA, Plan(precision="fp16"), Plan(precision="mixed_bf16", method="full"),
               Plan(attn_impl="flash_attention_2"), Plan(attn_impl="flash_attention_3"),
               Plan(loss="fused-linear", optimizer="adamw_torch_4bit"), QLORA.with_(optimizer="paged_adamw_8bit"),
               Plan(method="full", optimizer="adamw_torch_fused")]


@pytest.mark.parametrize("gpu_key", list(gpu_catalog()))
def test_a_card_is_ruled_as_the_first_of_its_compute_class(gpu_key):
    """What the per-class answers above stand for: each catalog card refuses and decides exactly what the first
    card of its compute class does (precision, attention, kernels and optimizers), whatever its name or memory."""
    first = next(k for k in gpu_catalog() if _compute_class(k) == _compute_class(gpu_key))
    card, same = resolve_gpu(gpu_key), resolve_gpu(first)
    assert card.bf16 == same.bf16
    for method in ("full", "lora", "qlora"):
        assert card_precision(card, method) == card_precision(same, method), method
    for plan in LEVER_PLANS:
        assert _refused(plan, card) == _refused(plan, same), plan.short()


@pytest.mark.slow
def test_gemma2_answers_run_on_its_classes_attention(tmp_path, capsys):
    """transformers 5 refuses sdpa for Gemma2ForCausalLM: the answer takes eager, and pre-flight agrees."""
    tuned, checked = _tune_export_preflight(tmp_path, capsys, "t4", "15GB", "gemma-2-2b")
    assert tuned["best"]["plan"]["attn_impl"] == "eager" and tuned["best"]["plan"]["precision"] == "fp16"
    _assert_go("t4", tuned, checked)


@pytest.mark.slow
def test_the_issues_t4_command_gets_go(tmp_path, capsys):
    """`advisor tune --gpu-budget 15GB --gpu t4 --model qwen7b seq_len=2048 --export out/`, then
    `advisor preflight out/advisor.yaml --gpu t4 --gpu-budget 15GB` (its default backend, simulate): GO."""
    tuned, checked = _tune_export_preflight(tmp_path, capsys, "t4", "15GB", "qwen7b", "seq_len=2048",
                                            trials="40", backend="simulate")
    assert tuned["best"]["plan"]["precision"] == "fp16"
    assert not [f for f in checked["findings"] if f["check"].startswith("config.")
                and f["severity"] in ("warning", "error")]
    _assert_go("t4", tuned, checked)


@pytest.mark.slow
def test_an_assumed_card_keeps_its_rules(tmp_path, capsys):
    """`advisor tune --model qwen3-8b --gpu-budget 16GB` with no GPU named or detected assumes the V100-16GB the
    budget matches: the answer keeps its rules (fp16, no bf16), as with `--gpu v100-16gb` (issue 41)."""
    code = main(["tune", "--gpu-budget", "16GB", "--model", "qwen3-8b", "--backend", "estimate", "--trials", "8",
                 "--json", "--reports-dir", str(tmp_path)])
    tuned = json.loads(capsys.readouterr().out)
    assert code == 0 and tuned["gpu"]["assumed"] and "V100" in tuned["gpu"]["name"], tuned["gpu"]
    assert tuned["best"]["plan"]["precision"] == "fp16"


# --------------------------------------------------------------------------- detection


def test_a_detected_card_outside_the_catalog_gets_its_compute_capability_and_bf16_from_nvml(monkeypatch):
    import sys
    from types import SimpleNamespace

    from advisor.core.catalog import detect_gpu

    class Nvml:  # pynvml's calls detect_gpu makes, for one device
        def __init__(self, name, cc):
            self.name, self.cc = name, cc

        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, handle): return self.name
        def nvmlDeviceGetMemoryInfo(self, handle): return SimpleNamespace(total=11 * 2**30)
        def nvmlDeviceGetCudaComputeCapability(self, handle): return self.cc

    monkeypatch.setitem(sys.modules, "pynvml", Nvml("NVIDIA GeForce RTX 2080 Ti", (7, 5)))
    turing = detect_gpu()
    assert turing.key == "detected" and turing.sm == 75 and turing.bf16 is False
    assert _refused(Plan(), turing) == {("--precision", "bf16")}
    monkeypatch.setitem(sys.modules, "pynvml", Nvml("NVIDIA RTX A6000", (8, 6)))
    assert detect_gpu().sm == 86 and detect_gpu().bf16 is True
    monkeypatch.setitem(sys.modules, "pynvml", Nvml("NVIDIA Tesla T4", (7, 5)))  # not the catalog's NVML name
    assert detect_gpu().sm == 75
