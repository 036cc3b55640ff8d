"""Measured quality (advisor.search.finalists, advisor.search.measured): the finalists train a short run each from
real weights on the user's documents, for the same tokens, and the held-out loss replaces the quality prior.

The real weights are the tiny byte-level model trained for seconds on the shipped texts (the fidelity test's
fixture, advisor.runtime.probe._tiny); the documents are templated sentences a model learns within a few
thousand tokens, so that adapter capacity shows: LoRA r1 on q,v falls behind r16 on q,k,v,o by far more than
the run-to-run noise (measured here: 0.037 vs a noise of 0.004 nats at 4,096 tokens).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from advisor.cli import main
from advisor.core.catalog import CUDA_DOUBLE_ENV, resolve_model
from advisor.core.errors import AdvisorInputError
from advisor.core.plan import Plan
from advisor.runtime.probe._tiny import tiny_model_dir
from advisor.search.finalists import (check_weights, choose_finalists, learning_rate, measure_finalists,
                                      split_documents, steps_for, training_tokens,
                                      why_not_measured)
from advisor.search.measured import (ATTR, FinalistRun, QualityMeasurement, apply_measured, measured_lines,
                                     prior_line, stored_measurement)
from advisor.search.select import TrialRecord, select

SEQ = 64
TOKENS = 4096  # the finalists' runs: r1 falls behind r16 by 0.037 nats, noise 0.004 (0.015 and 0.003 at 2,048)
# two LoRA plans of the tiny model that differ only in adapter capacity (the study's search picks among them)
SPACE = ["seq_len=64", "global_batch=2", "micro_batch=[2]", "method=lora", "quantization=none", "double_quant=false",
         "lora_r=[1,16]", "lora_targets=attention", "gradient_checkpointing=false", "activation_offload=false",
         "optimizer=adamw_torch", "offload=none", "loss=plain", "optimizer_in_backward=false",
         "expandable_segments=false", "packing=false"]


def documents(n: int = 120, seed: int = 0) -> list[str]:
    """Documents of five templated sentences (about 300 bytes each: the longest batch fills seq_len 64)."""
    rng = random.Random(seed)
    days = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
    colors = "red blue green yellow black white grey brown".split()
    animals = "fox bird cat dog horse goat sheep crow".split()
    places = "harbour station kitchen garden river market bridge field".split()
    verbs = "met saw followed found watched called".split()
    return [" ".join(f"On {rng.choice(days)} the {rng.choice(colors)} {rng.choice(animals)} {rng.choice(verbs)} "
                     f"{rng.randint(2, 9)} {rng.choice(colors)} {rng.choice(animals)}s at the {rng.choice(places)}."
                     for _ in range(5)) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_dir()
    return path, resolve_model(str(path))


@pytest.fixture
def data(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents()))
    return f


def record(number: int, plan: Plan, *, tps: float = 1000.0, accuracy: float = 0.0, ladder: str = "",
           state: str = "complete", duplicate_of: int | None = None, peak: int = 2**30) -> TrialRecord:
    return TrialRecord(number=number, state=state, plan=plan.to_dict(), plan_short=plan.short(), peak_bytes=peak,
                       tokens_per_s=tps, accuracy_loss=accuracy, accuracy_source="prior", ladder=ladder,
                       duplicate_of=duplicate_of, source="measured")


def run(number: int, loss: float | None, *, status: str = "ok", tokens: int = 4096) -> FinalistRun:
    return FinalistRun(number=number, plan_short=f"plan {number}", status=status, tokens=tokens, steps=32,
                       held_out_loss=loss, message="" if status == "ok" else "out of memory")


def measurement(**changes) -> QualityMeasurement:
    m = QualityMeasurement(tokens=4096, held_out_tokens=3640, held_out_documents=12, train_documents=108,
                           eval_window=64, reference=0, reference_why="the usual recipe", reference_accuracy=0.01,
                           runs=(run(3, 2.50), run(0, 2.53), run(5, 2.60), run(7, None, status="oom")),
                           noise=0.004, noise_run=replace(run(0, 2.534), seed=1),
                           priors={3: 0.02, 0: 0.01, 5: 0.0, 7: 0.0})
    return replace(m, **changes)


# ------------------------------------------------------------------------------------------ the arithmetic


def test_every_finalist_trains_the_same_tokens_in_whole_steps():
    big, small, odd = (Plan(method="lora", seq_len=SEQ, micro_batch=4, grad_accum=2),
                       Plan(method="lora", seq_len=SEQ, micro_batch=1, grad_accum=1),
                       Plan(method="lora", seq_len=48, micro_batch=1, grad_accum=1))
    assert training_tokens([big, small], steps=30) == 30 * 8 * SEQ  # 30 steps of the largest, 240 of the smallest
    assert training_tokens([big, small], tokens=1000) == 1024  # rounded up to whole steps of every plan
    total = training_tokens([big, small, odd], tokens=4096)
    assert all(total % p.tokens_per_step == 0 for p in (big, small, odd)) and total >= 4096
    # steps with no common measure (sequence lengths 1000 and 1024): each reaches the target within one step
    a, b = Plan(method="lora", seq_len=1000, micro_batch=8), Plan(method="lora", seq_len=1024, micro_batch=8)
    total = training_tokens([a, b], steps=30)
    assert total == 30 * 8192
    assert [steps_for(p, total) for p in (a, b)] == [31, 30]  # 248,000 and 245,760 tokens


def test_held_out_documents_are_a_fixed_tenth_never_trained_on():
    docs = documents(50)
    train, held = split_documents(docs)
    assert len(held) == 5 and len(train) == 45 and not set(held) & set(train)
    assert train == [d for d in docs if d not in held]  # the rest in file order
    shuffled = list(reversed(docs))
    assert sorted(split_documents(shuffled)[1]) == sorted(held)  # chosen by content, not by position
    train, held = split_documents(["first paragraph\n\nsecond paragraph\n\nthird"])  # one text: its paragraphs
    assert len(train) == 2 and len(held) == 1
    with pytest.raises(AdvisorInputError, match="--data"):
        split_documents(["a single paragraph"])


def test_the_learning_rate_is_the_one_an_export_trains_with():
    assert learning_rate(Plan(method="lora")) == 2e-4
    assert learning_rate(Plan(method="qlora", quantization="nf4")) == 2e-4
    assert learning_rate(Plan(method="full")) == 2e-5
    assert learning_rate(Plan(method="full", optimizer="sgd")) == 3e-2  # the dynamics optimizer's own source


def test_finalists_follow_the_selection_and_add_the_usual_recipe():
    lora, r1, full = (Plan(method="lora", lora_r=16), Plan(method="lora", lora_r=1, lora_targets=("q_proj",)),
                      Plan(method="full"))
    records = [record(0, full, tps=500), record(1, lora, tps=900), record(2, r1, tps=1000),
               record(3, Plan(method="lora", lora_r=32), tps=950),
               record(4, Plan(method="lora", lora_r=8), tps=300, ladder="usual recipe"),
               record(5, lora, tps=900, duplicate_of=1),
               record(6, Plan(method="qlora", quantization="nf4"), tps=2000, state="pruned")]
    best_of = lambda rs: select(rs, 24 * 2**30, 0.05, 0.05).best  # noqa: E731
    chosen, recipe = choose_finalists(records, best_of, lambda r: True)
    # the selection's answer (#2 and #3 keep alpha 32 at r1 and r32, a scale that changes the dynamics
    # (quality.yaml lora_alpha), so #1 while it fits), then the answer of the same selection over what is left
    assert chosen[0].number == best_of(records).number == 1
    assert chosen[1].number == best_of([r for r in records if r.number != 1]).number
    assert recipe.number == 4 and chosen[-1].number == 4 and len(chosen) == 4
    # a recipe proposed again points to the trial that evaluated it; one that does not fit is not trained
    records[4] = record(4, lora, tps=900, ladder="usual recipe", duplicate_of=1)
    chosen, recipe = choose_finalists(records, best_of, lambda r: True)
    assert recipe.number == 1 and len(chosen) == 3 and chosen[0].number == 1  # the recipe is already a finalist
    chosen, recipe = choose_finalists(records, best_of, lambda r: r.number != 1)
    assert recipe is None


def test_the_measured_accuracy_loss_is_the_difference_from_the_reference_plus_its_own():
    m = measurement()
    # reference #0 keeps its own 0.01; #5 lost 0.07 more; #3 beat it by 0.03: floored at 0, never credited
    assert m.measured() == pytest.approx({0: 0.01, 5: 0.08, 3: 0.0})
    assert m.accuracy_loss(7) is None  # its run failed: it keeps its prior
    assert QualityMeasurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert m.to_dict()["source"] == "measured"
    assert replace(m, runs=(run(0, None, status="timeout"), run(5, 2.6))).measured() == {}


def test_records_carry_the_measurement_and_old_records_are_untouched():
    plans = {n: Plan(method="lora", lora_r=r) for n, r in ((0, 16), (3, 32), (5, 1), (7, 64), (9, 8))}
    records = [record(n, p, accuracy=0.005) for n, p in plans.items()] + [record(11, plans[5], duplicate_of=5)]
    attrs = {ATTR: measurement().to_dict()}
    out = {r.number: r for r in apply_measured(records, attrs)}
    assert out[5].accuracy_source == "measured" and out[5].accuracy_loss == pytest.approx(0.08)
    assert "quality measured over 4,096 tokens" in out[5].note and "+0.0700 vs #0" in out[5].note
    assert "noise ±0.0040" in out[5].note
    assert out[11].accuracy_loss == pytest.approx(0.08)  # a repeat proposal shows its original's figure
    assert out[7].accuracy_source == "prior" and "ended oom" in out[7].note
    assert out[9] == records[4]  # not a finalist
    assert apply_measured(records, {}) == records
    assert apply_measured(records, {ATTR: {"runs": "garbage"}}) == records  # another version's: priors kept
    assert stored_measurement({ATTR: measurement().to_dict()}) == measurement()


def test_the_explanation_says_measured_over_n_tokens_or_prior():
    m = measurement()
    lines = measured_lines(m, record(5, Plan(method="lora", lora_r=1), accuracy=0.08))
    assert lines[0].startswith("Quality of #5: accuracy loss 0.080 measured over 4,096 tokens")
    assert "prior 0.000" in lines[0]
    assert "#5 2.6000 (+0.0700)" in lines[1] and "#7 oom" in lines[1] and "noise ±0.0040" in lines[1]
    assert "reference: the usual recipe" in lines[1]
    assert prior_line("no --weights") == "Quality: priors, not measured: no --weights."
    unmeasured = measured_lines(m, record(7, Plan(method="lora", lora_r=64), accuracy=0.002))
    assert unmeasured[0] == "Quality of #7: accuracy loss 0.002 (prior, not measured: its quality run ended oom)."
    failed = measured_lines(replace(m, reference=None, runs=(run(0, None, status="crash"),)), None)
    assert failed == ["Quality measurement failed (#0 crash): the finalists keep their priors."]


def test_quality_is_measured_only_with_real_runs_weights_and_text():
    text = type("Profile", (), {"how": "measured"})()
    lengths = type("Profile", (), {"how": "given"})()
    assert why_not_measured("cuda", "/w", text) == "" and why_not_measured("cpu", "/w", text) == ""
    assert "estimate backend" in why_not_measured("estimate", "/w", text)
    assert "simulate backend" in why_not_measured("simulate", "/w", text)
    assert "no --weights" in why_not_measured("cuda", None, text)
    assert "no --data" in why_not_measured("cuda", "/w", None)
    assert "token lengths" in why_not_measured("cuda", "/w", lengths)


def test_weights_must_be_a_directory_of_weights(tmp_path, tiny):
    with pytest.raises(AdvisorInputError, match="no such directory"):
        check_weights(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text("{}")  # a config alone is no weights
    with pytest.raises(AdvisorInputError, match="no weight files"):
        check_weights(str(tmp_path))
    assert check_weights(str(tiny[0])) == str(tiny[0].resolve())


def test_tune_flags_weights_errors_in_one_line(tmp_path, capsys, tiny, data):
    code = main(["tune", "--model", str(tiny[0]), "--gpu-budget", "2GB", "--backend", "estimate", "--weights",
                 str(tmp_path / "nowhere"), "--reports-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "--weights" in err and "no such directory" in err and "Traceback" not in err
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"text": "only one document"}) + "\n")
    code = main(["tune", "--model", str(tiny[0]), "--gpu-budget", "2GB", "--backend", "cpu", "--weights",
                 str(tiny[0]), "--data", str(one), "--reports-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "--data" in err and "hold one out" in err  # said before the study, not after it


def test_without_real_runs_the_answer_says_its_quality_is_a_prior(tmp_path, capsys, tiny, data):
    code = main(["tune", "--model", str(tiny[0]), "--gpu-budget", "2GB", "--gpu", "rtx-4090", "--backend", "estimate",
                 "--weights", str(tiny[0]), "--data", str(data), "--trials", "2", "--json",
                 "--reports-dir", str(tmp_path / "r"), *SPACE])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["quality"]["source"] == "prior" and "estimate backend" in d["quality"]["why"]
    assert d["explanation"][1].startswith("Quality: priors") and "estimate backend" in d["explanation"][1]
    assert all(t["accuracy_source"] != "measured" for t in d["trials"])
    from advisor.ui.report._data import gather
    from advisor.ui.report._load import open_study

    assert gather(open_study(d["storage"], d["study"], None)).selection.explanation == d["explanation"]


def test_the_study_description_keeps_the_weights_and_old_studies_load():
    from advisor.core.catalog import resolve_gpu
    from advisor.core.units import Budget
    from advisor.search.description import StudyDescription
    from advisor.search.space import load_space

    d = StudyDescription(model=resolve_model("qwen0.5b"), gpu=resolve_gpu("rtx-4090"),
                         budget=Budget(2**34, "GiB", "16GiB"), space=load_space("default", []), backend="cuda",
                         weights="/models/qwen")
    stored = d.to_dict()
    assert StudyDescription.from_dict(stored).weights == "/models/qwen"
    del stored["weights"]
    assert StudyDescription.from_dict(stored).weights is None


def test_a_probe_trains_at_the_learning_rate_asked_for():
    import torch

    from advisor.runtime.probe import run_probe
    from advisor.runtime.probe._worker import set_learning_rate

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW([{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}], lr=5e-5)
    assert "on 2 parameter groups" in set_learning_rate(opt, Plan(method="full"), 2e-5)
    assert [g["lr"] for g in opt.param_groups] == [2e-5, 2e-5]
    assert "not applied" in set_learning_rate(opt, Plan(method="full", optimizer="lomo"), 1e-3)
    with pytest.raises(AdvisorInputError, match="learning rate"):
        run_probe(resolve_model("qwen0.5b"), Plan(method="lora"), learning_rate=2.0)


def test_evaluating_keeps_4bit_layers_trainable_on_the_cpu(tiny):
    """bitsandbytes repacks a 4-bit weight for CPU inference on an eval-mode forward (AVX512-BF16 CPUs), after
    which no gradient flows through it: the fidelity pass must not leave the probe's model that way."""
    bnb_functional = pytest.importorskip("bitsandbytes.functional")
    if not getattr(bnb_functional, "has_avx512bf16", lambda: False)():
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never repacks here")
    import torch

    from advisor.runtime.build import build_training_setup
    from advisor.runtime.probe._fidelity import evaluate

    path, spec = tiny
    plan = Plan(method="qlora", quantization="nf4", seq_len=SEQ, micro_batch=1)
    ids = torch.randint(0, 256, (1, 2 * SEQ), generator=torch.Generator().manual_seed(0))

    def packed(model) -> list[bool]:
        return [bool(getattr(m.weight.quant_state, "packing_format_for_cpu", False)) for m in model.modules()
                if hasattr(m, "support_avx512bf16_for_cpu")]

    setup = build_training_setup(spec, plan, device="cpu", weights_dir=str(path))
    assert packed(setup.model) and not any(packed(setup.model))
    evaluate(setup.model, ids, SEQ, "cpu", plan)
    assert not any(packed(setup.model))
    setup.model.eval()  # what the fix prevents: bitsandbytes' own eval-mode forward repacks every 4-bit layer
    with torch.no_grad():
        setup.model(input_ids=ids[:, :SEQ])
    assert all(packed(setup.model))


# ------------------------------------------------------------------------------------------ real runs (slow)


@pytest.mark.slow
@pytest.mark.timeout(900)  # four probes: 84 s on a shared 2-core machine, 147 s under load
def test_finalists_for_the_same_tokens_separate_a_plan_that_hurts(tiny, data):
    path, spec = tiny
    usual = Plan(method="lora", seq_len=SEQ, micro_batch=2, lora_r=16)  # r16 on q,k,v,o
    narrow = Plan(method="lora", seq_len=SEQ, micro_batch=2, lora_r=1, lora_targets=("q_proj", "v_proj"))
    small_step = Plan(method="lora", seq_len=SEQ, micro_batch=1, lora_r=16)  # half the tokens per step
    recipe = record(0, usual, ladder="usual recipe")
    m = measure_finalists(spec, [record(1, narrow), record(2, small_step), recipe], recipe, device="cpu",
                          weights=str(path), data=str(data), tokens=TOKENS)
    runs = {r.number: r for r in m.runs}
    assert all(r.ok for r in runs.values()), [r.message for r in runs.values()]
    assert {r.tokens for r in runs.values()} == {TOKENS} and m.tokens == TOKENS
    steps = TOKENS // (2 * SEQ)
    assert (runs[0].steps, runs[1].steps, runs[2].steps) == (steps, steps, 2 * steps)  # a smaller step takes more
    assert {r.learning_rate for r in runs.values()} == {2e-4}
    assert {r.held_out_loss_before for r in runs.values()} == {runs[0].held_out_loss_before}  # same start, same text
    assert all(r.held_out_loss < r.held_out_loss_before for r in runs.values())  # every run learned
    assert m.reference == 0 and m.reference_why == "the usual recipe" and m.eval_window == SEQ
    assert m.held_out_documents == 12 and m.held_out_tokens > 3000
    # the noise: the recipe again with another seed and document order
    assert m.noise_run.ok and m.noise_run.seed == 1 and m.noise is not None
    gap = m.delta(1)
    print(f"\nr1[q,v] - r16[q,k,v,o] after {TOKENS:,} tokens: {gap:+.4f} nats; noise {m.noise:.4f}")
    assert gap > max(3 * m.noise, 0.01), (gap, m.noise)
    assert m.measured()[1] == pytest.approx(gap) and m.measured()[0] == 0.0
    # why the held-out loss and not the last steps' training loss: the latter moves far more between the two runs
    last = lambda r: sum(r.train_losses[-5:]) / 5  # noqa: E731
    train_noise = abs(last(m.noise_run) - last(runs[0]))
    print(f"noise of the held-out loss {m.noise:.4f}, of the mean training loss of the last 5 steps {train_noise:.4f}")
    assert m.noise < train_noise


def tune(tmp_path, capsys, model, *argv):
    code = main(["tune", "--model", str(model), "--gpu-budget", "2GB", "--gpu", "rtx-4090", "--probe-steps", "1",
                 "--json", "--reports-dir", str(tmp_path / "reports"), *argv, *SPACE])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.timeout(900)  # two trials' probes and three quality runs: 82 s, 101 s under load
def test_tune_on_the_cpu_measures_the_finalists_end_to_end(tmp_path, capsys, tiny, data, monkeypatch):
    path, _ = tiny
    argv = ["--backend", "cpu", "--weights", str(path), "--data", str(data), "--quality-tokens", "2048",
            "--trials", "2"]
    code, d = tune(tmp_path, capsys, path, *argv)
    assert code == 0, d["explanation"]
    q = d["quality"]
    assert q["source"] == "measured" and q["device"] == "cpu" and q["tokens"] == 2048
    assert q["reference"] is not None and q["noise"] is not None
    measured = [t for t in d["trials"] if t["accuracy_source"] == "measured"]
    assert {t["number"] for t in measured if t["duplicate_of"] is None} == {int(n) for n in q["measured"]}
    assert all("quality measured over 2,048 tokens" in t["note"] for t in measured)
    assert d["best"]["accuracy_source"] == "measured"
    assert any(line.startswith(f"Quality of #{d['best']['number']}") and "measured over 2,048 tokens" in line
               for line in d["explanation"])
    # the narrow adapter measures worse than the wide one, as it did outside the study
    by_rank = {t["plan"]["lora_r"]: t["accuracy_loss"] for t in measured}
    assert by_rank[1] > by_rank[16]
    # `advisor report` reads the same figures from the study
    from advisor.ui.report._load import open_study

    snap = open_study(d["storage"], d["study"], None)
    assert {r.number: r.accuracy_source for r in snap.records if r.number in {t["number"] for t in measured}} \
        == {t["number"]: "measured" for t in measured}
    from advisor.ui.report._data import gather

    assert gather(snap).selection.explanation == d["explanation"]  # the same quality lines as tune printed
    # the same command again: the study's measurement is reused, nothing is trained
    def no_probe(*a, **k):
        raise AssertionError("the finalists were trained again")

    monkeypatch.setattr("advisor.runtime.probe.run_probe", no_probe)
    code, again = tune(tmp_path, capsys, path, *argv)
    assert code == 0 and again["quality"] == q


@pytest.mark.slow
def test_tune_through_the_cuda_double_measures_the_finalists(tmp_path, capsys, tiny, data, monkeypatch):
    monkeypatch.setenv(CUDA_DOUBLE_ENV, "rtx-4090")  # the GPU path, its children running on the CPU
    path, _ = tiny
    code, d = tune(tmp_path, capsys, path, "--backend", "cuda", "--weights", str(path), "--data", str(data),
                   "--quality-tokens", "1024", "--trials", "1")
    assert code == 0, d["explanation"]
    q = d["quality"]
    assert q["source"] == "measured" and q["device"] == "cuda" and q["tokens"] == 1024
    assert all(r["status"] == "ok" for r in q["runs"]) and q["noise_run"]["status"] == "ok"
    assert d["best"]["accuracy_source"] == "measured" and d["best"]["number"] == q["reference"]
