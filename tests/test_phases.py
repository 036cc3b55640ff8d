"""The phases of a run (advisor.memory.phases): the simulated load, the closed forms, the CLI's phase table."""

from __future__ import annotations

import json

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.plan import Plan
from advisor.memory.phases import PHASES, load_estimate, run_phases
from advisor.memory.training import estimate_training

TINY = {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024, "tie_word_embeddings": False,
        "max_position_embeddings": 2048}
PLANS = {
    "qlora-nf4": Plan(method="qlora", quantization="nf4"),
    "qlora-nf4-dq": Plan(method="qlora", quantization="nf4", double_quant=True),
    "lora-int8": Plan(method="lora", quantization="int8"),
    "lora-bf16": Plan(method="lora"),
    "full-bf16": Plan(method="full"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY))
    return resolve_model(str(d))


@pytest.mark.parametrize("name", list(PLANS))
def test_simulated_load_equals_the_same_walk_on_real_tensors(tiny, name):
    pytest.importorskip("bitsandbytes")
    from advisor.runtime.simulate.load import simulate_load

    plan = PLANS[name]
    fake, real = simulate_load(tiny, plan), simulate_load(tiny, plan, fake=False)
    assert fake.live_peak_bytes == real.live_peak_bytes and fake.final_bytes == real.final_bytes
    assert fake.peak_tensor == real.peak_tensor


@pytest.mark.parametrize("name", list(PLANS))
def test_load_closed_form_within_1pct_of_the_simulation_on_a_7b(name):
    pytest.importorskip("bitsandbytes")
    from advisor.runtime.simulate.load import simulate_load

    spec, plan = resolve_model("qwen7b"), PLANS[name]
    sim = simulate_load(spec, plan)
    peak, final, _ = load_estimate(spec, plan)
    assert abs(peak / sim.live_peak_bytes - 1) < 0.01 and abs(final / sim.final_bytes - 1) < 0.01
    if plan.quantized:
        # the peak is a 16-bit tensor being quantized next to what is loaded: above the loaded model
        assert sim.live_peak_bytes > sim.final_bytes and "mlp" in sim.peak_tensor
    # the load sequence is there for the allocator: every allocation and free, balanced by the end
    assert sum(n for _, n in sim.events) == sim.final_bytes


def test_phases_of_a_qlora_run():
    spec = resolve_model("qwen7b")
    plan = Plan(method="qlora", quantization="nf4", gradient_checkpointing=True)
    ph = run_phases(spec, plan, None, estimate_training(spec, plan))
    assert set(ph.phases) == set(PHASES)
    for p in ph.phases.values():
        assert p.live_bytes <= p.reserved_bytes < p.peak_bytes
    assert ph.run_peak_phase == "train"
    assert not ph.phases["generate"].included  # no generation-based eval unless max_new_tokens
    # nor evaluation unless an eval batch is named (the exported configs do not evaluate): shown, not counted
    assert not ph.phases["eval"].included and "no evaluation in this run" in ph.phases["eval"].notes[0]
    # saving adapters copies them to the host: nothing above the resident state
    assert ph.phases["save"].live_bytes < ph.phases["eval"].live_bytes < ph.phases["train"].live_bytes


def test_a_large_eval_batch_sets_the_runs_peak():
    # 16 sequences x 1024 tokens x 152k vocabulary: bf16 logits, their fp32 copy and log_softmax (~25 GB)
    spec = resolve_model("qwen7b")
    plan = Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, eval_batch=16)
    ph = run_phases(spec, plan, None, estimate_training(spec, plan))
    assert ph.run_peak_phase == "eval" and ph.phases["eval"].included  # an eval batch was named
    logits = 16 * 1024 * spec.vocab_size * (2 + 4 + 4)
    assert ph.phases["eval"].live_bytes - ph.phases["save"].live_bytes >= logits
    # a run that does not evaluate is not decided by its eval phase
    assert run_phases(spec, plan, None, estimate_training(spec, plan), evaluates=False).run_peak_phase == "train"


def test_generation_holds_the_kv_cache():
    spec = resolve_model("qwen7b")
    plan = Plan(method="lora", eval_batch=8, max_new_tokens=1024, seq_len=2048)
    ph = run_phases(spec, plan, None, estimate_training(spec, plan))
    gen = ph.phases["generate"]
    assert gen.included
    kv = 57_344 * 8 * (2048 + 1024)  # DESIGN.md: 57,344 B per token in bf16 for Qwen2.5-7B
    assert gen.live_bytes - ph.phases["save"].live_bytes >= kv


def test_zero3_save_gathers_a_module_and_zero3_load_never_holds_the_model():
    spec = resolve_model("qwen7b")
    plan = Plan(method="full", gradient_checkpointing=True, offload="zero3_cpu")
    from advisor.runtime.backends import get_backend

    ph = run_phases(spec, plan, None, get_backend("estimate")(spec, plan, None))
    embedding = spec.vocab_size * spec.hidden_size * 2
    assert ph.phases["save"].live_bytes - ph.phases["eval"].live_bytes < embedding
    assert ph.phases["save"].live_bytes >= embedding
    assert ph.phases["load"].live_bytes < spec.params_total * 2 / 10


@pytest.mark.parametrize("backend", ["estimate", "simulate"])
def test_estimate_json_has_the_phases(backend, capsys):
    if backend == "simulate":
        pytest.importorskip("torch")
    from advisor.cli import main

    code = main(["estimate", "--model", "qwen7b", "--method", "qlora", "--gradient-checkpointing",
                 "--backend", backend, "--json"])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["phases"]) == set(PHASES)
    for p in d["phases"].values():
        assert p["peak_bytes"] > 0 and p["reserved_bytes"] > 0
    assert d["run_peak_phase"] in PHASES and d["peak_phase"] in ("loss", "backward", "backward-end",
                                                                    "backward-recompute", "forward", "optimizer")
    assert d["reserved_peak_bytes"] > 0
    assert d["run_peak_bytes"] == max(p["peak_bytes"] for p in d["phases"].values() if p["included"])
    assert d["phases"]["load"]["source"] == ("simulated" if backend == "simulate" else "estimated")


def test_phase_table_fits_80_columns(capsys):
    from advisor.cli import main

    code = main(["estimate", "--model", "qwen7b", "--method", "qlora", "--eval-batch", "8", "--max-new-tokens",
                 "256", "--gpu-budget", "24GB"])
    out = capsys.readouterr().out
    assert code == 0 and "Phases of the run" in out and "Run peak" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_bad_eval_batch_is_a_one_line_error(capsys):
    from advisor.cli import main

    with pytest.raises(SystemExit) as exited:  # the flag's own parse type rejects it, as for every plan flag
        main(["estimate", "--model", "qwen7b", "--eval-batch", "-2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--eval-batch" in err and "-2" in err and len(err.splitlines()) == 1
